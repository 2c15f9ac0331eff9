"""Small helpers shared by the tests."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import inspect
import os
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

import httpx
import httpx2
from lightkube import ApiError, AsyncClient, Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule, RoleRef, Subject
from lightkube.resources.core_v1 import Node
from lightkube.resources.rbac_authorization_v1 import Role, RoleBinding

# ---- the suite's two lengths ---------------------------------------------------------------
#
# `make test` (and CI) runs the short form of the randomised tests: the chaos tests kill
# metalmend fewer times, the property tests draw fewer cases, always the same ones
# (tests/conftest.py). `make test-thorough` (METALMEND_TESTS=thorough) runs the long form:
# more kills, several times the cases, fresh ones each run. Worth a run before a release
# and after a change to a state machine.
THOROUGH = os.environ.get("METALMEND_TESTS") == "thorough"


def thorough(short: int, long: int) -> int:
    """``long`` in a thorough run, else ``short``."""
    return long if THOROUGH else short


def reconciles(controller: str) -> float:
    """``controller``'s reconciles so far in this process, every outcome (its /metrics)."""
    from prometheus_client import REGISTRY

    return sum(
        sample.value
        for metric in REGISTRY.collect()
        if metric.name == "metalmend_reconcile"
        for sample in metric.samples
        if sample.name == "metalmend_reconcile_total"
        and sample.labels.get("controller") == controller
    )


# ---- deadlines that follow the machine's load --------------------------------------------
#
# A deadline a test names (``within=60``) is how long the awaited thing takes on an idle
# machine, with room to spare. On a busy one (a 2-core CI runner beside two labs, load 13)
# every step takes several times as long, and a fixed number fails there for no fault of
# the code. So every wait in the suite (``until``, ``wait``, ``started`` and the ``Deadline``
# they share) stretches its deadline by the machine's measured slowness while it waits:
# the one-minute load average per core, the highest seen during the wait, between 1 and
# ``SLOWEST`` times (``METALMEND_TEST_SLOWNESS`` sets it, for a machine whose load says
# little, a container's say). pytest-timeout's per-test limit is stretched the same way
# (tests/conftest.py). A condition that holds ends the wait at once, so a long deadline
# costs nothing but the time a failing test takes to say so, and the failure says what
# was awaited, how long (stretched how much) and what was last seen.

SLOWEST = 5.0


def slowness() -> float:
    """How many times slower than an idle machine this one runs now (see above)."""
    forced = os.environ.get("METALMEND_TEST_SLOWNESS")
    if forced:
        return max(1.0, float(forced))
    per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    return min(SLOWEST, max(1.0, per_core))


class Deadline:
    """``within`` seconds of an idle machine, stretched by the highest ``slowness`` seen
    since it was set (each look at it measures again)."""

    def __init__(self, within: float) -> None:
        self.within = within
        self.began = time.monotonic()
        self.factor = slowness()

    def left(self) -> float:
        self.factor = max(self.factor, slowness())
        return self.began + self.within * self.factor - time.monotonic()

    def expired(self) -> bool:
        return self.left() <= 0

    def __str__(self) -> str:
        spent = time.monotonic() - self.began
        if self.factor <= 1.0:
            return f"{spent:.0f}s"
        return f"{spent:.0f}s ({self.within:.0f}s stretched x{self.factor:.1f} by the load)"


def described(check: Callable[..., object]) -> str:
    """What a check waits for, when its caller did not say: its name, or a lambda's line."""
    name = getattr(check, "__name__", repr(check))
    if name != "<lambda>":
        return f"{name}()"
    try:
        return inspect.getsource(check).strip()
    except (OSError, TypeError):
        return "a lambda"


def wait(
    check: Callable[[], object],
    within: float,
    what: str = "",
    *,
    state: Callable[[], object] | None = None,
    tolerate: tuple[type[Exception], ...] = (),
    every: float = 0.1,
) -> None:
    """Until ``check()`` is true, for ``within`` seconds stretched by the load (``Deadline``);
    else fail saying ``what`` was awaited and what was last seen: ``state()`` if given,
    else the error ``check`` last raised (``tolerate``: errors that mean "not yet", an API
    server restarting, an object being replaced) or its last answer."""
    deadline = Deadline(within)
    last: object = None
    while True:
        try:
            last = check()
            if last:
                return
        except tolerate as error:
            last = f"{type(error).__name__}: {error}"
        if deadline.expired():
            break
        time.sleep(every)
    seen = last
    if state is not None:
        try:
            seen = state()
        except Exception as error:
            seen = f"(state unreadable: {type(error).__name__}: {error})"
    raise AssertionError(f"not within {deadline}: {what or described(check)}; last seen: {seen}")


# The least any ``until`` waits before failing (stretched by the load, as every wait): a
# condition that holds ends the wait at once, so a generous floor costs nothing.
GENEROUS = 180.0


async def until(
    check: Callable[[], bool | Awaitable[bool]],
    within: float = GENEROUS,
    *,
    exact: bool = False,
    what: str = "",
    state: Callable[[], object] | None = None,
) -> None:
    """Wait until ``check()`` is true (it may be async); fail after ``within`` seconds, or
    ``GENEROUS`` if that is longer, stretched by the load (``Deadline``), saying ``what``
    was awaited (else the check's source line) and ``state()`` (it may be async too).
    ``exact``: ``within`` itself, unstretched, raising TimeoutError, for a wait whose
    running out is part of the test."""
    if exact:

        async def poll() -> None:
            while True:
                outcome = check()
                if await outcome if inspect.isawaitable(outcome) else outcome:
                    return
                await asyncio.sleep(0.05)

        await asyncio.wait_for(poll(), within)
        return
    deadline = Deadline(max(within, GENEROUS))
    last: object = None
    while True:
        outcome = check()
        last = await outcome if inspect.isawaitable(outcome) else outcome
        if last:
            return
        if deadline.expired():
            break
        await asyncio.sleep(0.05)
    seen = state() if state is not None else last
    if inspect.isawaitable(seen):  # (an async state, as an async check)
        seen = await seen
    raise AssertionError(f"not within {deadline}: {what or described(check)}; last seen: {seen}")


# How long a process a test starts (metalmend run or serve, a BMC, an emulator) may take to
# answer on an idle machine, stretched by the load as every wait: a cold Python start with
# its imports and the database's migrations takes tens of seconds. Minutes, not seconds: a
# healthy start ends the wait at once, and a failed one shows why (the process's exit and
# output), not a timeout.
STARTUP = 180.0


def started(
    ready: Callable[[], bool],
    what: str,
    process: subprocess.Popen[str] | subprocess.Popen[bytes] | None = None,
    within: float = STARTUP,
) -> None:
    """Wait until ``ready()``; fail naming ``what`` was waited for and for how long, or at
    once with its output when ``process`` exited meanwhile."""
    deadline = Deadline(within)
    while not ready():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"waiting for {what}: the process exited ({process.returncode})"
                                 f"{_output(process)}")  # fmt: skip
        if deadline.expired():
            raise AssertionError(f"waited {deadline} for {what}, in vain")
        time.sleep(0.2)


def _output(process: subprocess.Popen[str] | subprocess.Popen[bytes]) -> str:
    if process.stderr is None:
        return ""
    try:
        _, err = process.communicate(timeout=5)
    except (subprocess.TimeoutExpired, ValueError):
        return ""
    text = err.decode(errors="replace") if isinstance(err, bytes) else (err or "")
    return f":\n{text}" if text else ""


def answers(
    url: str, verify: ssl.SSLContext | bool = True, ok: Callable[[int], bool] = lambda s: s == 200
) -> Callable[[], bool]:
    """A ``ready`` for ``started``: ``url`` answers with a status ``ok`` accepts."""

    def ready() -> bool:
        try:
            return ok(httpx.get(url, verify=verify, timeout=2).status_code)
        except httpx.HTTPError:
            return False

    return ready


def grant(
    kube: Client,
    namespace: str,
    name: str,
    subject: Subject,
    *,
    resources: list[str],
    verbs: list[str],
    group: str = "",
) -> None:
    """A Role with one rule, bound to ``subject``, in ``namespace``."""
    rule = PolicyRule(apiGroups=[group], resources=resources, verbs=verbs)
    kube.create(Role(metadata=ObjectMeta(name=name), rules=[rule]), namespace=namespace)
    kube.create(
        RoleBinding(
            metadata=ObjectMeta(name=name),
            roleRef=RoleRef(apiGroup="rbac.authorization.k8s.io", kind="Role", name=name),
            subjects=[subject],
        ),
        namespace=namespace,
    )


def bind_bmc_secrets(kube: Client, namespace: str) -> None:
    """What deploy/rbac/metalmend.yaml asks of every host namespace: a RoleBinding that
    lets metalmend's ServiceAccount list and watch the BMC Secrets there (and nowhere else).
    Run metalmend with ``--secret-namespaces`` naming the same namespaces. Idempotent."""
    binding = RoleBinding(
        metadata=ObjectMeta(name="metalmend-bmc-credentials"),
        roleRef=RoleRef(
            apiGroup="rbac.authorization.k8s.io",
            kind="ClusterRole",
            name="metalmend-bmc-credentials",
        ),
        subjects=[Subject(kind="ServiceAccount", name="metalmend", namespace="metalmend-system")],
    )
    try:
        kube.create(binding, namespace=namespace)
    except ApiError as error:
        if error.status.code != 409:  # already bound
            raise


# ---- Nodes kept Ready ----------------------------------------------------------------------

KUBELET_BEAT = 1.0  # seconds between two heartbeats (the session's grace is 6 s)


@contextlib.asynccontextmanager
async def kubelets(client: AsyncClient, names: Iterable[str]) -> AsyncIterator[None]:
    """The Nodes ``names`` kept Ready while the block runs, as their kubelets keep them: a
    status heartbeat (Ready True, ``lastHeartbeatTime`` now) every ``KUBELET_BEAT`` seconds
    for each that exists. The session's control plane marks a hand-made Node Unknown 6 s
    after its last heartbeat (tests/conftest.py), so without this a flow that takes longer
    on a busy machine waits for a Ready that cannot come. A Node not made yet, or a busy
    API server's error, waits for the next beat."""
    wanted = list(names)

    async def beat(name: str) -> None:
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "kubelet is posting ready status", "lastHeartbeatTime": now}  # fmt: skip
        with contextlib.suppress(ApiError, httpx2.HTTPError):
            await client.patch(Node.Status, name, {"status": {"conditions": [ready]}})

    async def run() -> None:
        while True:
            await asyncio.gather(*(beat(n) for n in wanted))
            await asyncio.sleep(KUBELET_BEAT)

    task = asyncio.create_task(run())
    try:
        yield
    finally:
        if task.done():
            task.result()  # (a bug in the heartbeat: said here)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
