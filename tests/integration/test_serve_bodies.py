"""Hostile request bodies against a running ``metalmend serve`` (a real process, so that
a crash is seen: libyaml's C composer killed it with SIGSEGV on a nesting bomb), with the
ServiceAccount and ClusterRoles of deploy/rbac/serve.yaml; each caller holds the narrowest
role that reaches the route. Every body is answered 400 or 413 with a message saying
which limit, and the process still answers afterwards (docs/design-store.md, "Limits";
docs/security.md, "Request bodies and YAML")."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from lightkube import Client, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule
from lightkube.resources.rbac_authorization_v1 import ClusterRole

from metalmend_lab.controlplane import ControlPlane, free_port
from tests.integration.test_serve_promenade import bearer, token
from tests.support import answers, started

SERVE_RBAC = Path(__file__).resolve().parents[2] / "deploy" / "rbac" / "serve.yaml"
DECKHAND = "/deckhand/api/v1.0"
SHIPYARD = "/shipyard/api/v1.0"
YAML = {"Content-Type": "application/x-yaml"}
LIMIT = 1 << 20  # serve.max_body_bytes for these tests: 1 MiB


def doc(name: str, extra: str = "") -> str:
    return f"---\nschema: a/B/v1\nmetadata: {{schema: metadata/Document/v1, name: {name}{extra}}}\ndata: {{}}\n"


def nesting(levels: int) -> str:
    return "[" * levels + "]" * levels


def billion_laughs() -> str:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in "bcdefghi":
        previous = chr(ord(level) - 1)
        lines.append(f"{level}: &{level} [{', '.join([f'*{previous}'] * 9)}]")
    return "\n".join(lines) + "\n"


@dataclass
class Serve:
    process: subprocess.Popen[str]
    base: str
    port: int

    def alive(self) -> None:
        assert self.process.poll() is None, (
            f"metalmend serve ended with {self.process.returncode}: "
            + self.process.communicate(timeout=10)[1][-3000:]
        )


@pytest.fixture
def serve(control_plane: ControlPlane, kube: Client, tmp_path: Path) -> Iterator[Serve]:
    for obj in codecs.load_all_yaml(SERVE_RBAC.read_text()):
        kube.apply(obj, force=True)
    account = control_plane.service_account_kubeconfig("metalmend-system", "metalmend-serve")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "metalmend", "serve", "--kubeconfig", str(account),
         "--port", str(port), "--database-url", f"sqlite:///{tmp_path / 'serve.sqlite'}",
         "--max-body-bytes", str(LIMIT)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    running = Serve(process, f"http://127.0.0.1:{port}", port)
    url = f"{running.base}{DECKHAND}/revisions"
    # any answer (401 without a token) means it serves
    started(answers(url, ok=lambda _: True), f"metalmend serve to answer {url}", process)
    yield running
    process.terminate()
    process.wait(20)


def role(kube: Client, name: str, rule: PolicyRule) -> str:
    kube.apply(ClusterRole(metadata=ObjectMeta(name=name), rules=[rule]), force=True)
    return name


@pytest.fixture
def editor(control_plane: ControlPlane, kube: Client, namespace: str) -> dict[str, str]:
    return bearer(token(control_plane, kube, namespace, "editor", "metalmend-deckhand-editor"))


def configdocs_role(kube: Client, names: list[str] | None = None) -> str:
    """Only ``create configdocs`` (no shipped role is narrower than the Shipyard admin),
    on the collections ``names`` when given."""
    suffix = f"-{len(names[0])}" if names else ""
    rule = PolicyRule(apiGroups=["shipyard.metalmend.dev"], resources=["configdocs"],
                      verbs=["create"], resourceNames=names)  # fmt: skip
    return role(kube, f"test-configdocs-creator{suffix}", rule)


def refused(answer: httpx.Response, code: int, *expected: str) -> dict[str, Any]:
    assert answer.status_code == code, answer.text
    status: dict[str, Any] = yaml.safe_load(answer.text)  # JSON, or YAML on Deckhand's API
    text = " ".join([status["message"], *(m["message"] for m in status["details"]["messageList"])])
    for part in expected:
        assert part in text, text
    return status


def raw(serve: Serve, head: str, parts: list[bytes]) -> tuple[int, dict[str, Any]]:
    """One request written by hand (``head`` without the blank line, then ``parts``), its
    answer read whole: for bodies that a client library would not send as they are."""
    with socket.create_connection(("127.0.0.1", serve.port), timeout=60) as sock:
        sock.sendall(head.encode() + b"\r\n\r\n")
        for part in parts:
            sock.sendall(part)
        answer = b""
        while True:
            header, _, content = answer.partition(b"\r\n\r\n")
            length = [int(line.split(b":")[1]) for line in header.lower().split(b"\r\n")
                      if line.startswith(b"content-length:")]  # fmt: skip
            if length and len(content) >= length[0]:
                break
            data = sock.recv(65536)
            assert data, f"the connection closed before the answer was whole: {answer!r}"
            answer += data
    return int(header.split()[1]), yaml.safe_load(content)  # JSON, or YAML on Deckhand's API


def put(serve: Serve, who: dict[str, str], body: str, bucket: str = "site") -> httpx.Response:
    return httpx.put(f"{serve.base}{DECKHAND}/buckets/{bucket}/documents", content=body,
                     headers={**who, **YAML}, timeout=120)  # fmt: skip


def test_yaml_bombs_are_refused_and_the_service_lives(
    serve: Serve, editor: dict[str, str], control_plane: ControlPlane, kube: Client,
    namespace: str,
) -> None:  # fmt: skip
    deep = "nested deeper than 100 levels"
    for levels in (32_000, 200_000):
        refused(put(serve, editor, nesting(levels)), 400, deep, "line 1, column 101")
        serve.alive()
    refused(put(serve, editor, "- " * 32_000 + "x\n"), 400, deep)
    refused(put(serve, editor, "{a: " * 32_000 + "1" + "}" * 32_000), 400, deep)
    refused(put(serve, editor, billion_laughs()), 400, "once YAML aliases are expanded")
    refused(put(serve, editor, "a: &a [*a]\n"), 400, "contains itself")
    serve.alive()
    many = "".join(doc(f"d{i}") for i in range(10_000))  # 0.7 MB: within the byte limit
    refused(put(serve, editor, many), 400, "more than 5000 documents in one body")

    tags = f"{serve.base}{DECKHAND}/revisions/1/tags/t"
    assert put(serve, editor, doc("a")).status_code == 200
    answer = httpx.post(tags, content=nesting(32_000), headers={**editor, **YAML})
    refused(answer, 400, "the tag's data", deep)

    creator = bearer(token(control_plane, kube, namespace, "creator", configdocs_role(kube)))
    answer = httpx.post(f"{serve.base}{SHIPYARD}/configdocs/site", content=nesting(32_000),
                        headers={**creator, **YAML}, timeout=60)  # fmt: skip
    refused(answer, 400, deep)

    # Promenade's design reference: a small body, the bomb fits in it (64,000 bytes).
    etcd = bearer(token(control_plane, kube, namespace, "etcd", "metalmend-promenade-etcd"))
    answer = httpx.post(f"{serve.base}/promenade/api/v1.0/nodes/n1/remove-etcd",
                        content=nesting(32_000), headers=etcd, timeout=60)  # fmt: skip
    refused(answer, 400, deep)
    serve.alive()
    assert put(serve, editor, doc("a") + doc("b")).status_code == 200


def test_an_oversized_body_is_413_naming_the_limit_on_every_route(
    serve: Serve, editor: dict[str, str], control_plane: ControlPlane, kube: Client,
    namespace: str,
) -> None:  # fmt: skip
    limit = f"at most {LIMIT} bytes (1 MiB; serve.max_body_bytes)"
    put_head = (
        f"PUT {DECKHAND}/buckets/site/documents HTTP/1.1\r\nHost: serve\r\n"
        f"Authorization: {editor['Authorization']}\r\nContent-Type: application/x-yaml"
    )
    # Announced: answered at once, nothing of the body sent.
    code, status = raw(serve, f"{put_head}\r\nContent-Length: {100 * LIMIT}", [])
    assert (code, status["reason"]) == (413, "RequestEntityTooLarge"), status
    assert limit in status["message"], status
    # Not announced (chunked): counted as it comes, refused past the limit.
    chunk = b"# " + b"x" * (64 * 1024 - 3) + b"\n"
    chunks = [b"%x\r\n%s\r\n" % (len(chunk), chunk)] * (LIMIT // len(chunk) + 1)
    code, status = raw(serve, f"{put_head}\r\nTransfer-Encoding: chunked", chunks)
    assert (code, status["reason"]) == (413, "RequestEntityTooLarge"), status
    assert limit in status["message"], status

    small = "at most 65536 bytes (64 KiB)"
    callers = {
        "drydock": bearer(token(control_plane, kube, namespace, "dd", "metalmend-drydock-admin")),
        "redeployer": bearer(
            token(control_plane, kube, namespace, "rd", "metalmend-shipyard-redeployer")
        ),
        "etcd": bearer(token(control_plane, kube, namespace, "pe", "metalmend-promenade-etcd")),
    }
    routes = [
        ("POST", "/drydock/api/v1.0/tasks", "drydock", small),
        ("POST", f"{SHIPYARD}/actions", "redeployer", small),
        ("POST", "/promenade/api/v1.0/nodes/n1/remove-etcd", "etcd", small),
        ("POST", f"{DECKHAND}/revisions/1/tags/t", "editor", small),
    ]
    callers["editor"] = editor
    for method, path, who, expected in routes:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: serve\r\n"
            f"Authorization: {callers[who]['Authorization']}\r\nContent-Length: 100000"
        )
        code, status = raw(serve, head, [])
        assert (code, status["reason"]) == (413, "RequestEntityTooLarge"), (path, status)
        assert expected in status["message"], (path, status)
    serve.alive()


def test_configdocs_are_authorized_with_the_name_they_are_written_under(
    serve: Serve, control_plane: ControlPlane, kube: Client, namespace: str
) -> None:
    name = "c" * 255
    # A role for the first 253 characters only: a different collection.
    short = bearer(
        token(control_plane, kube, namespace, "short", configdocs_role(kube, [name[:253]]))
    )
    url = f"{serve.base}{SHIPYARD}/configdocs/{name}"
    answer = httpx.post(url, content=doc("a"), headers={**short, **YAML}, timeout=60)
    refused(answer, 403, f"on {name}")
    exact = bearer(token(control_plane, kube, namespace, "exact", configdocs_role(kube, [name])))
    answer = httpx.post(url, content=doc("a"), headers={**exact, **YAML}, timeout=60)
    assert answer.status_code == 201, answer.text
    longer = f"{serve.base}{SHIPYARD}/configdocs/{'c' * 256}"
    admin = bearer(token(control_plane, kube, namespace, "sa", "metalmend-shipyard-admin"))
    answer = httpx.post(longer, content=doc("a"), headers={**admin, **YAML}, timeout=60)
    refused(answer, 400, "at most 255 characters")


def test_encrypted_documents_are_refused_naming_them(serve: Serve, editor: dict[str, str]) -> None:
    body = doc("a") + doc("password", ", storagePolicy: encrypted")
    status = refused(put(serve, editor, body), 400, "document 2", "name 'password'",
                     "storagePolicy is encrypted")  # fmt: skip
    assert status["details"]["errorCount"] == 1
    answer = httpx.get(f"{serve.base}{DECKHAND}/revisions", headers=editor)
    assert "count: 0" in answer.text, answer.text
