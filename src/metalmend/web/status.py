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
from typing import Any

from metalmend import errors as domain
from metalmend.errors import SIMPLE, Message, MetalmendError, errors, notes

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


__all__ = ["SIMPLE", "Message", "StatusError", "body", "errors", "notes", "status_of"]


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


# The domain's errors (metalmend.errors), each kind to one HTTP status: the only place
# where a domain error becomes HTTP.
CODES: tuple[tuple[type[MetalmendError], int], ...] = (
    (domain.NotFound, 404),
    (domain.Conflict, 409),
    (domain.Refused, 403),
    (domain.Invalid, 400),
    (domain.Unavailable, 503),
    (domain.Failed, 500),
)


def status_of(error: MetalmendError) -> StatusError:
    """The Status answer of a domain error: its kind's code, its reason, message and lines."""
    code = next((c for kind, c in CODES if isinstance(error, kind)), 500)
    return StatusError(code, error.reason, error.message, error.lines)


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
