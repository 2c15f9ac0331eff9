"""Airship's ``X-Context-Marker`` (airship-in-a-bottle ``doc/source/api-conventions.rst``,
"Headers"): a UUID naming one request across the services it passes through.

A caller may send one; it must be a UUID (``8-4-4-4-12`` hex digits, any version), else
the answer is 400 BadRequest (a Status body) before anything else is looked at: a marker
that cannot be carried would break the caller's trail without telling it (Shipyard
silently replaces such a marker; metalmend says so instead). Without one, metalmend makes
one (a random UUID). Either way the marker is echoed in the ``X-Context-Marker`` header of
every answer, and every log line written while the request is handled carries
``context_marker=<uuid>``, so an operator finds all that one request did in the log.
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from metalmend.log import bound, fields
from metalmend.web import conventions, status

log = logging.getLogger(__name__)

HEADER = "X-Context-Marker"
FIELD = "context_marker"  # in log lines, and in ``request.state``


# A UUID in its hyphenated form, any case (uuid.UUID would also take braces, a
# ``urn:uuid:`` prefix, 32 bare digits or hyphens anywhere, which no Airship service sends).
UUID_FORM = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")


def is_marker(value: str) -> bool:
    return UUID_FORM.fullmatch(value) is not None


def of(scope: Scope) -> str | None:
    """The marker of the request being answered (None outside a request)."""
    marker: str | None = (scope.get("state") or {}).get(FIELD)
    return marker


class ContextMarker:
    """ASGI middleware: check, make, echo and log the marker of every HTTP request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = Headers(scope=scope).getlist(HEADER)
        refused = bool(given) and not (len(given) == 1 and is_marker(given[0]))
        # Echoed as given (the caller matches it as it sent it), else a new one.
        marker = given[0] if given and not refused else str(uuid.uuid4())
        # Starlette keeps request.state in scope["state"]: the answer's builders read it
        # there, even the failure handler that runs outside this middleware.
        scope.setdefault("state", {})[FIELD] = marker

        async def send_with_marker(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[HEADER] = marker
            await send(message)

        with bound(**{FIELD: marker}):
            if refused:
                await self._refuse(scope, receive, send_with_marker, given)
                return
            await self.app(scope, receive, send_with_marker)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, given: list[str]) -> None:
        # The caller's value is not repeated: it may be anything, of any length.
        text = (
            f"{HEADER} must be one UUID (8-4-4-4-12 hexadecimal digits)"
            if len(given) == 1
            else f"{HEADER} given {len(given)} times: give one UUID"
        )
        log.info("request refused", extra=fields(path=scope.get("path", ""), problem=text))
        path = scope.get("path", "")
        answer: dict[str, Any] = conventions.shaped(
            path, status.body(400, "BadRequest", text, status.errors(text))
        )
        await conventions.status_answer(path, answer, 400)(scope, receive, send)
