"""Design references (docs/teardown.md, "The design reference"): what a caller may name as
the design that locates the etcd clusters, checked before anything is read (no I/O here).

A design reference is caller input, and reading it is done with metalmend serve's own
network position and, for the credentials it names, its own identity. So it resolves to
one of two things only:

- **A revision of serve's own design store**, in the spec's form
  ``deckhand+https://HOST/.../revisions/N/rendered-documents`` (``deckhand+http://`` and
  ``.../documents`` too): revision N is read from serve's database, nothing is fetched.
  HOST is neither contacted nor compared: metalmend serve is the site's Deckhand, and a
  Shipyard or an operator writes whatever name it reaches Deckhand by. Deckhand's filters
  in the query (``schema=``, ``metadata.label=``...) apply as on the Deckhand endpoint.
- **An https URL an operator allowed**: one that starts with an entry of
  ``serve.design_url_prefixes`` (none by default): same host and port, a path under the
  prefix's path on a ``/`` boundary, no user name or password in the URL, no ``.`` or
  ``..`` segment and no encoded ``/``, ``\\`` or ``.`` in the path (a server could resolve
  them out of the prefix). It is fetched without following redirects.

Anything else is refused with 400 before a connection is opened. A reference is never
echoed as given: messages show ``shown``, which drops the user name, password and query
(where tokens travel).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import SplitResult, parse_qsl, quote, urlsplit

from metalmend.designs import rules
from metalmend.designs.documents import DocumentsRejected

MAX_LENGTH = 2048  # characters: a URL longer than this is not a design reference
STORE_SCHEMES = ("deckhand+https", "deckhand+http")
_REVISION_PATH = re.compile(r"(?:/.*)?/revisions/([0-9]{1,18})/(rendered-documents|documents)/?")
_ENCODED = re.compile(r"%(2f|5c|2e)", re.IGNORECASE)


class ReferenceRefused(ValueError):
    """The reference cannot be used; the message says why, without echoing secrets."""


@dataclass(frozen=True)
class DesignRef:
    """Where the design is: a revision of serve's store, or an allowed https URL."""

    shown: str  # for messages and logs: no user name, password or query
    revision: int | None = None  # serve's own design store
    rendered: bool = True  # rendered-documents (abstract documents left out)
    filters: tuple[tuple[str, str], ...] = ()  # Deckhand's query filters, as given
    url: str = ""  # an external https URL, fetched only when allowed


@dataclass(frozen=True)
class Prefix:
    """One entry of ``serve.design_url_prefixes``, parsed."""

    host: str
    port: int
    path: str  # "" or a path; a URL's path must equal it or continue it after a "/"

    def admits(self, parts: SplitResult) -> bool:
        if parts.hostname != self.host or _port(parts) != self.port:
            return False
        path = parts.path or "/"
        if not self.path or self.path == "/":
            return True
        base = self.path.rstrip("/")
        return path == base or path.startswith(base + "/")

    def __str__(self) -> str:
        return f"https://{self.host}:{self.port}{self.path}"


def shown(raw: str) -> str:
    """``raw`` safe to show: scheme, host, port and path; user info and query left out."""
    try:
        parts = urlsplit(raw.strip()[:MAX_LENGTH])
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(a design reference that is not a URL)"
    if not parts.scheme or not host:
        return "(a design reference that is not a URL)"
    if ":" in host:
        host = f"[{host}]"
    query = "?..." if parts.query else ""
    return f"{parts.scheme.lower()}://{host}{port}{_printable(parts.path)[:300]}{query}"


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() and not c.isspace() else "?" for c in text)


def _port(parts: SplitResult) -> int | None:
    try:
        return parts.port or 443
    except ValueError:
        return None


def parse(raw: str) -> DesignRef:
    """The reference ``raw`` names, or ReferenceRefused. Whether a URL is allowed is
    ``allowed``'s to say (it needs the settings)."""
    text = raw.strip()
    if len(text) > MAX_LENGTH:
        raise ReferenceRefused(f"the design reference is longer than {MAX_LENGTH} characters")
    where = shown(text)
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (raises ValueError for a port that is not one)
    except ValueError:
        raise ReferenceRefused(f"design reference {where} is not a URL") from None
    scheme = parts.scheme.lower()
    if not parts.hostname:
        raise ReferenceRefused(
            f"design reference {where} is not a URL: give deckhand+https://HOST/.../revisions/N"
            "/rendered-documents (a revision of metalmend serve's design store)"
        )
    if scheme in STORE_SCHEMES:
        found = _REVISION_PATH.fullmatch(parts.path)
        if found is None:
            raise ReferenceRefused(
                f"design reference {where} names no revision: a deckhand+https:// reference"
                " ends in /revisions/N/rendered-documents"
            )
        revision, rendered = int(found.group(1)), found.group(2) == "rendered-documents"
        filters = tuple(parse_qsl(parts.query, keep_blank_values=True))
        try:
            rules.document_query(filters, rendered)
        except DocumentsRejected as error:
            problems = "; ".join(error.problems)
            raise ReferenceRefused(f"design reference {where}: {problems}") from None
        return DesignRef(f"design revision {revision}", revision, rendered, filters)
    if scheme != "https":
        raise ReferenceRefused(
            f"design reference {where}: only deckhand+https://.../revisions/N/rendered-documents"
            " (metalmend serve's design store) or an https URL the operator allowed"
            " (serve.design_url_prefixes) is read"
        )
    if parts.username is not None or parts.password is not None:
        raise ReferenceRefused(
            f"design reference {where}: a user name or password in the URL is refused"
            " (it would be sent, and shown); the reference was not used"
        )
    segments = parts.path.split("/")
    if "." in segments or ".." in segments or _ENCODED.search(parts.path) or "\\" in parts.path:
        raise ReferenceRefused(
            f"design reference {where}: '.', '..' or an encoded '/', '\\' or '.' in the path"
            " is refused"
        )
    return DesignRef(where, url=parts._replace(fragment="").geturl())


def allowed(ref: DesignRef, prefixes: Sequence[Prefix]) -> None:
    """Raise ReferenceRefused unless ``ref`` is in the store or under an allowed prefix."""
    if ref.revision is not None:
        return
    parts = urlsplit(ref.url)
    if not any(p.admits(parts) for p in prefixes):
        raise ReferenceRefused(
            f"design reference {ref.shown} is not allowed: metalmend serve reads a design"
            " from its own design store (deckhand+https://.../revisions/N/rendered-documents)"
            " or from the https URLs the operator allowed in serve.design_url_prefixes"
            f" ({'none' if not prefixes else ', '.join(str(p) for p in prefixes)});"
            " nothing was fetched"
        )


def prefix(raw: str) -> Prefix:
    """A ``serve.design_url_prefixes`` entry: ``https://HOST[:PORT][/PATH]``, nothing else
    (ValueError naming what is wrong, for the settings check)."""
    text = raw.strip()
    try:
        parts = urlsplit(text)
    except ValueError:
        raise ValueError(f"{shown(text)} is not a URL https://HOST[:PORT][/PATH]") from None
    port = _port(parts)
    if port is None or not parts.hostname:
        raise ValueError(f"{shown(text)} is not a URL https://HOST[:PORT][/PATH]")
    if parts.scheme.lower() != "https":
        raise ValueError(f"{shown(text)} is not an https URL (a design is fetched over https)")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{shown(text)}: no user name or password in an allowed prefix")
    if parts.query or parts.fragment:
        raise ValueError(f"{shown(text)}: no query or fragment in an allowed prefix")
    segments = parts.path.split("/")
    if "." in segments or ".." in segments or _ENCODED.search(parts.path):
        raise ValueError(f"{shown(text)}: no '.', '..' or encoded characters in the path")
    return Prefix(parts.hostname, port, parts.path)


def redact_path(path: str) -> str:
    """A request's path and query as a log may show it: each ``design_ref`` value
    replaced by ``shown``'s form (no user name, password or query of its own)."""
    base, mark, query = path.partition("?")
    if not mark or "design_ref" not in query:
        return path
    pairs = parse_qsl(query, keep_blank_values=True)
    redacted = [(k, shown(v) if k == "design_ref" else v) for k, v in pairs]
    return base + "?" + "&".join(f"{quote(k, safe='')}={quote(v, safe='/:')}" for k, v in redacted)
