"""The site's etcd clusters, as its design declares them: the ``promenade/EtcdClusters/v1``
document that Airship's node teardown spec introduces ("identifiers, credentials, and
thresholds for minimum functionality"), found through the design reference: a revision of
metalmend serve's own design store, or an https URL the operator allowed
(``metalmend.designs.designref``).

The spec names the document but not its fields; metalmend reads this shape
(docs/teardown.md, "The EtcdClusters document")::

    schema: promenade/EtcdClusters/v1
    metadata: {schema: metadata/Document/v1, name: etcd-clusters, ...}
    data:
      clusters:
        - name: kubernetes                 # the identifier health reports use
          minimum_functionality:
            healthy_members: 2             # the site's threshold
          credentials:                     # optional: a Secret, by reference
            secret: {namespace: kube-system, name: etcd-client}
          members:
            - node: n1                     # the Node (host name) the member lives on
              name: n1                     # etcd's member name (default: node)
              client_urls: [https://10.0.0.1:2379]
              peer_urls: [https://10.0.0.1:2380]

The design is a network answer: fetched with a hard deadline and a size cap, parsed with
``yaml.safe_load_all`` (no object construction), and every field checked; a bad document
is a ``DesignError`` whose message names the document and the field.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from metalmend import yamlsafe
from metalmend.yamlsafe import YamlLimits

SCHEMA = "promenade/EtcdClusters/v1"
FETCH_DEADLINE = 30.0  # seconds for the whole fetch (Deckhand renders on request)
MAX_DESIGN = 16 << 20  # bytes: a whole site's rendered documents
# Read within the limits of a design body (docs/design-store.md, "Limits"), scaled to
# MAX_DESIGN: a nesting or alias bomb in a fetched design must not crash serve either.
YAML_LIMITS = YamlLimits(documents=20_000, values=2_000_000, characters=MAX_DESIGN)


class DesignError(Exception):
    """The design cannot be used. ``unavailable``: it could not be fetched (the design
    service's fault, 500); ``missing``: it declares no etcd cluster; otherwise its
    documents are wrong (the caller's, 400)."""

    def __init__(self, message: str, unavailable: bool = False, missing: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.unavailable = unavailable
        self.missing = missing


@dataclass(frozen=True)
class SecretRef:
    namespace: str
    name: str


@dataclass(frozen=True)
class MemberDesign:
    node: str
    name: str
    client_urls: tuple[str, ...]
    peer_urls: tuple[str, ...]


@dataclass(frozen=True)
class ClusterDesign:
    name: str
    threshold: int
    members: tuple[MemberDesign, ...]
    credentials: SecretRef | None = None

    def member_on(self, node: str) -> MemberDesign | None:
        return next((m for m in self.members if m.node == node), None)

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(url for m in self.members for url in m.client_urls)


@dataclass(frozen=True)
class Design:
    source: str  # the design reference, for messages
    clusters: tuple[ClusterDesign, ...]

    def clusters_on(self, node: str) -> list[ClusterDesign]:
        return [c for c in self.clusters if c.member_on(node) is not None]


# ---- fetching ------------------------------------------------------------------------------


async def fetch(url: str, http: httpx.AsyncClient | None = None, shown: str = "") -> str:
    """The design's YAML text, within FETCH_DEADLINE and MAX_DESIGN. Redirects are not
    followed (the URL was checked, where it points was not), and no part of an answer
    that is not the design reaches a message: only its HTTP code. ``shown``: the URL as
    messages may show it (no user name, password or query)."""
    where = shown or url
    owned = http is None
    client = http or httpx.AsyncClient(timeout=FETCH_DEADLINE, follow_redirects=False)
    try:
        async with asyncio.timeout(FETCH_DEADLINE):
            request = client.build_request(
                "GET", url, headers={"Accept": "application/x-yaml"}, timeout=FETCH_DEADLINE
            )
            response = await client.send(request, stream=True, follow_redirects=False)
            try:
                if response.status_code != 200:
                    moved = " (a redirect, not followed)" if response.is_redirect else ""
                    raise DesignError(
                        f"the design reference {where} answered HTTP {response.status_code}"
                        + moved,
                        unavailable=True,
                    )
                data = bytearray()
                async for chunk in response.aiter_bytes():
                    data += chunk
                    if len(data) > MAX_DESIGN:
                        raise DesignError(
                            f"the design at {where} is larger than {MAX_DESIGN} bytes",
                            unavailable=True,
                        )
            finally:
                await response.aclose()
    except TimeoutError:
        raise DesignError(
            f"the design reference {where} did not answer within {FETCH_DEADLINE:g}s",
            unavailable=True,
        ) from None
    except (httpx.HTTPError, OSError) as error:
        # The error's type only: its text may carry the URL as given.
        raise DesignError(
            f"cannot fetch the design reference {where}: {type(error).__name__}",
            unavailable=True,
        ) from None
    finally:
        if owned:
            await client.aclose()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise DesignError(f"the design at {where} is not UTF-8 text") from None


async def load(url: str, source: str = "", http: httpx.AsyncClient | None = None) -> Design:
    """Fetch and read the design at ``url`` (``source``: the reference as messages show
    it)."""
    return parse(await fetch(url, http, shown=source), source or url)


# ---- reading -------------------------------------------------------------------------------


def documents(text: str, source: str) -> list[Any]:
    try:
        return [d for d in yamlsafe.load_all(text, YAML_LIMITS) if d is not None]
    except yamlsafe.YamlRefused as error:
        raise DesignError(f"the design at {source} is past a limit: {error}") from None
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise DesignError(f"the design at {source} is not valid YAML{at}") from None
    except RecursionError:
        raise DesignError(f"the design at {source} nests too deeply") from None


def parse(text: str, source: str) -> Design:
    """Every cluster of every ``promenade/EtcdClusters/v1`` document in the design."""
    return from_documents(documents(text, source), source)


def from_documents(design: Iterable[Any], source: str) -> Design:
    """The same reading from documents already parsed (a design store revision read
    in-process: a site action passes its revision's documents, no HTTP round trip).
    ``source`` names the design in messages (``design revision 7``)."""
    clusters: list[ClusterDesign] = []
    found = False
    for document in design:
        if not isinstance(document, dict) or document.get("schema") != SCHEMA:
            continue
        found = True
        metadata = document.get("metadata")
        name = metadata.get("name") if isinstance(metadata, dict) else None
        where = f"{SCHEMA} {name if isinstance(name, str) else '(unnamed)'}"
        data = document.get("data")
        if not isinstance(data, dict) or not isinstance(data.get("clusters"), list):
            raise DesignError(f"{where}: data.clusters must be a list of clusters")
        for index, raw in enumerate(data["clusters"]):
            clusters.append(_cluster(raw, f"{where}: data.clusters[{index}]"))
    if not found:
        raise DesignError(f"the design at {source} has no {SCHEMA} document", missing=True)
    names = [c.name for c in clusters]
    if duplicates := sorted({n for n in names if names.count(n) > 1}):
        raise DesignError(f"etcd cluster(s) declared twice: {', '.join(duplicates)}")
    return Design(source, tuple(clusters))


def _text(raw: object, where: str, limit: int = 253) -> str:
    if not isinstance(raw, str) or not raw.strip() or len(raw) > limit:
        raise DesignError(f"{where} must be a non-empty string of at most {limit} characters")
    return raw.strip()


def _urls(raw: object, where: str, required: bool) -> tuple[str, ...]:
    if raw is None and not required:
        return ()
    if not isinstance(raw, list) or (required and not raw):
        raise DesignError(f"{where} must be a list of http(s) URLs")
    urls = []
    for url in raw:
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            raise DesignError(f"{where}: {str(url)[:100]!r} is not an http(s) URL")
        urls.append(url.rstrip("/"))
    return tuple(urls)


def _member(raw: object, where: str) -> MemberDesign:
    if not isinstance(raw, dict):
        raise DesignError(f"{where} must be a mapping")
    node = _text(raw.get("node"), f"{where}.node")
    return MemberDesign(
        node=node,
        name=_text(raw.get("name", node), f"{where}.name"),
        client_urls=_urls(raw.get("client_urls"), f"{where}.client_urls", required=True),
        peer_urls=_urls(raw.get("peer_urls"), f"{where}.peer_urls", required=False),
    )


def _cluster(raw: object, where: str) -> ClusterDesign:
    if not isinstance(raw, dict):
        raise DesignError(f"{where} must be a mapping")
    name = _text(raw.get("name"), f"{where}.name")
    where = f"{where} ({name})"
    members_raw = raw.get("members")
    if not isinstance(members_raw, list) or not members_raw:
        raise DesignError(f"{where}.members must be a non-empty list")
    members = tuple(_member(m, f"{where}.members[{i}]") for i, m in enumerate(members_raw))
    _unique((m.node for m in members), f"{where}: node(s) with two members")
    _unique((m.name for m in members), f"{where}: member name(s) used twice")
    functionality = raw.get("minimum_functionality")
    threshold = functionality.get("healthy_members") if isinstance(functionality, dict) else None
    if isinstance(threshold, bool) or not isinstance(threshold, int):
        raise DesignError(f"{where}.minimum_functionality.healthy_members must be a whole number")
    if not 1 <= threshold <= len(members):
        raise DesignError(
            f"{where}.minimum_functionality.healthy_members must be between 1 and the number"
            f" of members ({len(members)}), not {threshold}"
        )
    return ClusterDesign(name, threshold, members, _credentials(raw.get("credentials"), where))


def _credentials(raw: object, where: str) -> SecretRef | None:
    if raw is None:
        return None
    secret = raw.get("secret") if isinstance(raw, dict) else None
    if not isinstance(secret, dict):
        raise DesignError(f"{where}.credentials must be {{secret: {{namespace, name}}}}")
    return SecretRef(
        _text(secret.get("namespace"), f"{where}.credentials.secret.namespace", 63),
        _text(secret.get("name"), f"{where}.credentials.secret.name"),
    )


def _unique(values: Iterable[str], message: str) -> None:
    twice = sorted(v for v, count in Counter(values).items() if count > 1)
    if twice:
        raise DesignError(f"{message}: {', '.join(twice)}")
