"""Small helpers shared by the tests."""

from __future__ import annotations

import asyncio
import inspect
import ssl
import subprocess
import time
from collections.abc import Awaitable, Callable

import httpx
from lightkube import ApiError, Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule, RoleRef, Subject
from lightkube.resources.rbac_authorization_v1 import Role, RoleBinding


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


# The least any ``until`` waits before failing. What a test names (``within=15``) is how
# long the awaited thing takes on an idle machine with room to spare; on a busy one (CI
# beside another heavy job, load 15 on 2 cores) the same step took minutes. A condition
# that holds ends the wait at once, so a generous floor costs nothing but the time a
# failing test takes to say so.
GENEROUS = 180.0


async def until(
    check: Callable[[], bool | Awaitable[bool]], within: float = GENEROUS, *, exact: bool = False
) -> None:
    """Wait until ``check()`` is true (it may be async); fail after ``within`` seconds, or
    ``GENEROUS`` if that is longer (``exact``: ``within`` itself, for a wait whose running out
    is part of the test)."""
    if not exact:
        within = max(within, GENEROUS)

    async def poll() -> None:
        while True:
            outcome = check()
            if await outcome if inspect.isawaitable(outcome) else outcome:
                return
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), within)


# How long a process a test starts (metalmend run or serve, a BMC, an emulator) may take to
# answer: on a busy 2-core machine a cold Python start with its imports and the database's
# migrations takes tens of seconds. Minutes, not seconds: a healthy start ends the wait at
# once, and a failed one shows why (the process's exit and output), not a timeout.
STARTUP = 180.0


def started(
    ready: Callable[[], bool],
    what: str,
    process: subprocess.Popen[str] | subprocess.Popen[bytes] | None = None,
    within: float = STARTUP,
) -> None:
    """Wait until ``ready()``; fail naming ``what`` was waited for and for how long, or at
    once with its output when ``process`` exited meanwhile."""
    begun = time.monotonic()
    while not ready():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"waiting for {what}: the process exited ({process.returncode})"
                                 f"{_output(process)}")  # fmt: skip
        if time.monotonic() - begun > within:
            raise AssertionError(f"waited {within:.0f} s for {what}, in vain")
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
