"""The UCP Status body: every answer of ``metalmend serve``, success or failure.

Airship's API conventions (airship-in-a-bottle ``doc/source/api-conventions.rst``,
"Status responses"): a customised Kubernetes Status,
``{"kind": "Status", "apiVersion": "v1.0", "metadata": {}, "status": "Success"|"Failure",
"message": ..., "reason": ..., "details": {"errorCount": N, "messageList": [...]},
"code": <HTTP status>}``, ``errorCount`` counting the messages with ``error: true``. A
message has ``message``, ``error`` and ``kind`` (``SimpleMessage`` unless it carries more).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SIMPLE = "SimpleMessage"

# HTTP status -> the reason of an answer that no endpoint chose itself (an unknown path,
# a method the path does not take, a failure of our own).
GENERIC_REASONS = {
    200: "Success",
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    429: "TooManyRequests",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    500: "InternalError",
    503: "ServiceUnavailable",
}


@dataclass(frozen=True)
class Message:
    message: str
    error: bool
    kind: str = SIMPLE

    def to_wire(self) -> dict[str, Any]:
        return {"message": self.message, "error": self.error, "kind": self.kind}


def errors(*lines: str) -> list[Message]:
    return [Message(line, True) for line in lines]


def notes(*lines: str) -> list[Message]:
    return [Message(line, False) for line in lines]


def body(code: int, reason: str, message: str, messages: Sequence[Message] = ()) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1.0",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "details": {
            "errorCount": sum(1 for m in messages if m.error),
            "messageList": [m.to_wire() for m in messages],
        },
        "code": code,
    }


class StatusError(Exception):
    """An answer other than success, raised anywhere below an endpoint."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        messages: Sequence[Message] = (),
        *,
        headers: Mapping[str, str] | None = None,  # e.g. 429's Retry-After
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.messages = list(messages)
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return body(self.code, self.reason, self.message, self.messages)


def reason_for(code: int) -> str:
    return GENERIC_REASONS.get(code, "Success" if code < 400 else "Failure")


COMMON_ANSWERS = ((400, "BadRequest"), (401, "Unauthorized"), (403, "Forbidden"))


def documented(*answers: tuple[int, str]) -> dict[int | str, dict[str, Any]]:
    """An endpoint's answers for OpenAPI: ``answers`` and the ones every endpoint may give
    (a bad request, no token, no permission), each a Status body with its reason."""
    return {
        code: {"description": f"Status body, reason {reason}", "content": {"application/json": {}}}
        for code, reason in [*answers, *COMMON_ANSWERS]
    }
