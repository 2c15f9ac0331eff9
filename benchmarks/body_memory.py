"""Memory of ``metalmend serve`` for the largest bodies it accepts (docs/design-store.md,
"Limits"): a real ``metalmend serve`` process with its default limits (4 MiB design
bodies, 5,000 documents, 500,000 values; 64 KiB for everything else), against a real
API server (a caller with the Deckhand editor role), on SQLite.

A fresh process per body: started, warmed up with one small put, then its RSS read
(VmRSS), the body sent ROUNDS times, and its peak RSS (VmHWM, the kernel's high-water mark
of the whole process) read. The bodies:

- the largest realistic design: 5,000 documents of the design of benchmarks/design_store.py
  (the document limit; ~3.3 MB);
- dense YAML: 5 documents of 99,980 short strings each, half a million values in 1.5 MB
  (the values limit), the densest a put can be;
- two of those dense puts at once (designs are read one at a time: the peak stays that of
  one);
- refused bodies: a 32,000-level nesting bomb, a billion laughs, a 4 MiB + 1 byte body;
- the largest JSON body, 64 KiB (a Shipyard action, refused after it is read and parsed).

Prints the numbers and the speed of reading the 2,000-document design with today's
loader (the guarded composer) against libyaml's C composer, which recursion kills.
Asserts only that every request got the answer expected.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import yaml
from lightkube import Client, KubeConfig, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import RoleRef, Subject
from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding

from benchmarks import design_store
from metalmend import yamlsafe
from metalmend_lab.controlplane import ControlPlane, ControlPlaneConfig, free_port

SERVE_RBAC = Path(__file__).resolve().parents[1] / "deploy" / "rbac" / "serve.yaml"
DECKHAND = "/deckhand/api/v1.0"
ROUNDS = 3
MiB = 1 << 20


def realistic(documents: int) -> str:
    """``documents`` documents of benchmarks/design_store.py's site design."""
    kept, design_store.DOCUMENTS = design_store.DOCUMENTS, documents
    try:
        return design_store.site(0)
    finally:
        design_store.DOCUMENTS = kept


def dense(prefix: str = "d") -> str:
    values = ",".join(["ab"] * 99_980)
    return "".join(
        f"---\nschema: a/B/v1\nmetadata: {{schema: metadata/Document/v1, name: {prefix}{i}}}\n"
        f"data: [{values}]\n"
        for i in range(5)
    )


def laughs() -> str:
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, 9):
        name, previous = chr(ord("a") + i), chr(ord("a") + i - 1)
        lines.append(f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]")
    return "\n".join(lines)


def memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MiB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0]) / 1024
    return found["VmRSS"], found["VmHWM"]


def token(plane: ControlPlane, kube: Client, name: str, role: str) -> str:
    path = plane.service_account_kubeconfig("default", name)
    kube.create(
        ClusterRoleBinding(
            metadata=ObjectMeta(name=f"bench-{name}"),
            roleRef=RoleRef(apiGroup="rbac.authorization.k8s.io", kind="ClusterRole", name=role),
            subjects=[Subject(kind="ServiceAccount", name=name, namespace="default")],
        )
    )
    value: str = yaml.safe_load(path.read_text())["users"][0]["user"]["token"]
    return value


Send = Callable[[str, dict[str, str]], list[int]]  # base URL, headers -> status codes


def put(*bodies: str) -> Send:
    """Each body into a bucket of its own, all sent at once."""

    def send(base: str, headers: dict[str, str]) -> list[int]:
        async def all_at_once() -> list[int]:
            async with httpx.AsyncClient(base_url=base, timeout=600) as client:
                answers = await asyncio.gather(
                    *(
                        client.put(
                            f"{DECKHAND}/buckets/b{i}/documents",
                            content=body,
                            headers={**headers, "Content-Type": "application/x-yaml"},
                        )
                        for i, body in enumerate(bodies)
                    )
                )
            return [a.status_code for a in answers]

        return asyncio.run(all_at_once())

    return send


def post_json(path: str, body: bytes) -> Send:
    def send(base: str, headers: dict[str, str]) -> list[int]:
        answer = httpx.post(f"{base}{path}", content=body, timeout=600,
                            headers={**headers, "Content-Type": "application/json"})  # fmt: skip
        return [answer.status_code]

    return send


def measure(
    account: Path, editor: dict[str, str], who: dict[str, str], send: Send
) -> tuple[float, float, float, float, list[int]]:
    with tempfile.TemporaryDirectory(prefix="metalmend-bench-") as scratch:
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "metalmend", "serve", "--kubeconfig", str(account),
             "--port", str(port), "--database-url", f"sqlite:///{scratch}/serve.sqlite",
             "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                assert process.poll() is None, "metalmend serve ended"
                try:
                    httpx.get(f"{base}{DECKHAND}/revisions", timeout=2)
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline, "metalmend serve did not answer"
                    time.sleep(0.2)
            assert put(realistic(20))(base, editor) == [200]  # warm: imports, database, caches
            rest, _ = memory_mib(process.pid)
            codes: list[int] = []
            began = time.perf_counter()
            for _ in range(ROUNDS):
                codes += send(base, who)
            seconds = (time.perf_counter() - began) / ROUNDS
            assert process.poll() is None, "metalmend serve ended"
            after, peak = memory_mib(process.pid)
            return rest, peak, after, seconds, sorted(set(codes))
        finally:
            process.terminate()
            process.wait(30)


def loader_speed() -> tuple[float, float]:
    """CPU seconds to read the 2,000-document design: guarded composer, C composer."""
    text = realistic(2000)

    def c_composer() -> None:
        loader = yaml.CSafeLoader(text)
        while loader.check_node():
            loader.construct_document(loader.get_node())

    times: dict[str, list[float]] = {"guarded": [], "c": []}
    for _ in range(5):
        began = time.process_time()
        yamlsafe.load_all(text)
        times["guarded"].append(time.process_time() - began)
        began = time.process_time()
        c_composer()
        times["c"].append(time.process_time() - began)
    return statistics.median(times["guarded"]), statistics.median(times["c"])


def main() -> None:
    guarded, c = loader_speed()
    print("Request bodies (metalmend serve, default limits): RSS per body, a fresh process each")
    print(
        f"  reading the 2,000-document design (1.3 MB), CPU: guarded composer {guarded:.2f} s,"
        f" libyaml's C composer {c:.2f} s ({guarded / c:.2f}x)"
    )
    with tempfile.TemporaryDirectory(prefix="metalmend-bench-") as workdir:
        plane = ControlPlane(ControlPlaneConfig(workdir=Path(workdir)))
        plane.start()
        try:
            kube = Client(KubeConfig.from_file(plane.kubeconfig), field_manager="bench")
            for obj in codecs.load_all_yaml(SERVE_RBAC.read_text()):
                kube.apply(obj, force=True)
            account = plane.service_account_kubeconfig("metalmend-system", "metalmend-serve")
            editor = {
                "Authorization": f"Bearer {token(plane, kube, 'editor', 'metalmend-deckhand-editor')}"
            }
            redeployer = token(plane, kube, "redeployer", "metalmend-shipyard-redeployer")
            big = realistic(5000)
            action = b'{"name": "no_such_action", "pad": "' + b"x" * (64 * 1024 - 40) + b'"}'
            cases = [
                (f"5,000-document design ({len(big) / MiB:.1f} MiB)", editor, put(big)),
                (f"500,000 dense values ({len(dense()) / MiB:.1f} MiB)", editor, put(dense())),
                ("two dense puts at once", editor, put(dense("x"), dense("y"))),
                ("nesting bomb, 32,000 levels", editor, put("[" * 32_000 + "]" * 32_000)),
                ("billion laughs", editor, put(laughs())),
                ("4 MiB + 1 byte", editor, put("#" * (4 * MiB) + "\n")),
                (
                    f"JSON action, {len(action) // 1024} KiB",
                    {"Authorization": f"Bearer {redeployer}"},
                    post_json("/shipyard/api/v1.0/actions", action),
                ),
            ]
            print(f"  {'body':40}{'answer':>8}{'at rest':>10}{'peak':>8}{'growth':>8}{'s/req':>8}")
            for name, who, send in cases:
                rest, peak, _after, seconds, codes = measure(account, editor, who, send)
                answers = "/".join(str(code) for code in codes)
                print(
                    f"  {name:40}{answers:>8}{rest:9.0f}M{peak:7.0f}M{peak - rest:7.0f}M"
                    f"{seconds:8.2f}"
                )
        finally:
            plane.stop()


if __name__ == "__main__":
    main()
