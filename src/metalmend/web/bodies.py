"""Request bodies: one bounded reader for every route of ``metalmend serve``.

A body is read only after the caller is authenticated and authorized (``auth.admit``),
and never past its route's limit: a ``Content-Length`` over the limit is answered at
once, without reading anything; a body without one (chunked) is counted as it arrives
and refused as soon as it passes the limit. Either way the answer is 413
RequestEntityTooLarge, naming the limit. The limits:

- design documents (Deckhand's document put, Shipyard's configdocs):
  ``serve.max_body_bytes`` (``BodyLimits.design_bytes``), read as YAML within
  ``BodyLimits.yaml`` (``metalmend.yamlsafe``);
- everything else (JSON requests of Drydock and Shipyard, Promenade's design references,
  a tag's data): ``SMALL_BODY``, fixed; they are a few hundred bytes.

Designs are read one at a time (``design_gate``): what a put holds in memory while
it is parsed, stored and answered is several times its body, and one at a time bounds it
to one such request whatever the number of callers (docs/design-store.md, "Limits").
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from metalmend.web import deps
from metalmend.web.status import StatusError, errors
from metalmend.yamlsafe import YamlLimits

SMALL_BODY = 64 * 1024  # bytes: a JSON request, a design reference, a tag's data
DESIGN_BYTES = 4 << 20  # the default of serve.max_body_bytes (ServeSettings says why)


@dataclass(frozen=True)
class BodyLimits:
    """The limits of design bodies (ServeSettings' "request bodies" block)."""

    design_bytes: int = DESIGN_BYTES
    yaml: YamlLimits = field(default_factory=YamlLimits)

    @classmethod
    def of(cls, design_bytes: int, documents: int, values: int) -> BodyLimits:
        limits = YamlLimits(documents=documents, values=values, characters=design_bytes)
        return cls(design_bytes, limits)


# A tag's data or a design reference: one small document, within a small body.
SMALL_YAML = YamlLimits(documents=1, values=SMALL_BODY, characters=SMALL_BODY)


def limits_of(request: Request) -> BodyLimits:
    return deps.find(request.app, BodyLimits) or BodyLimits()


def design_gate(request: Request) -> asyncio.Semaphore:
    """Held from parsing a design body to its answer: one design at a time."""
    return deps.of(request, asyncio.Semaphore)


def too_large(limit: int, setting: str = "") -> StatusError:
    text = f"the body is larger than this service takes here: at most {limit} bytes"
    size = f"{limit >> 20} MiB" if limit % (1 << 20) == 0 else f"{limit >> 10} KiB"
    text += f" ({size}; {setting})" if setting else f" ({size})"
    return StatusError(413, "RequestEntityTooLarge", text, errors(text))


async def read_bytes(request: Request, limit: int, setting: str = "") -> bytes:
    """The body, at most ``limit`` bytes: 413 past it (before reading, when the
    Content-Length says so), 400 for a Content-Length that is not a number; ``setting``:
    the setting that sets ``limit``, named in the refusal."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():  # the HTTP server refuses these first, normally
            raise StatusError(400, "BadRequest", "Content-Length is not a number")
        if int(declared) > limit:
            raise too_large(limit, setting)
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            raise too_large(limit, setting)
    return bytes(data)


async def read_design(request: Request) -> str:
    """A design body (Deckhand's put, Shipyard's configdocs) as text, within
    ``serve.max_body_bytes``."""
    return await read_text(request, limits_of(request).design_bytes, "serve.max_body_bytes")


async def read_text(request: Request, limit: int, setting: str = "") -> str:
    """The body as UTF-8 text, at most ``limit`` bytes."""
    data = await read_bytes(request, limit, setting)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise StatusError(
            400, "BadRequest", "the body is not UTF-8", errors(f"byte {error.start}: not UTF-8")
        ) from None


async def read_json(request: Request, limit: int = SMALL_BODY) -> Any:
    """The body as JSON, at most ``limit`` bytes; 400 when it is not JSON."""
    data = await read_bytes(request, limit)
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise StatusError(400, "BadRequest", "the body is not a JSON object") from None
