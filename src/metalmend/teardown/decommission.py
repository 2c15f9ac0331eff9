"""decommission (docs/teardown.md): drain, clear labels, remove etcd members, wait for etcd
to be stable, shut the kubelet down, each with the request's timeouts. Which step runs
next and what the answer is are ``metalmend.teardown.policy.decommission``'s rules; each
step is the very step its own endpoint runs. Nothing is remembered between requests: a
decommission interrupted anywhere is finished by asking again, every step finding its
work done or continuing it.

The step machine only: its endpoint, ``POST /promenade/api/v1.0/nodes/{node_id}/decommission``
with the design reference as body, is in ``metalmend.teardown.routes`` beside the other
steps' (and ``redeploy_server`` runs it in-process, ``metalmend.siteactions.redeploy``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from dataclasses import dataclass

import httpx2
from lightkube import ApiError, AsyncClient

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.errors import Failed, MetalmendError
from metalmend.kube import errors
from metalmend.log import fields
from metalmend.teardown import drain as nodes
from metalmend.teardown import interlock, params, removal
from metalmend.teardown.etcd import access, members
from metalmend.teardown.etcd.design import Design
from metalmend.teardown.policy import decommission as policy
from metalmend.teardown.policy.settings import TeardownSettings
from metalmend.teardown.shutdown import KubeletShutdown

log = logging.getLogger(__name__)


@dataclass
class Decommission:
    """One decommission request's steps, over the services the other endpoints use."""

    client: AsyncClient
    drainer: nodes.Drainer
    kubelet: KubeletShutdown
    settings: TeardownSettings
    design: Design
    node: str
    request: params.DecommissionRequest
    clock: Clock = SYSTEM_CLOCK
    # The teardown claim, taken again before each step with that step's name (an operator
    # reading the host sees how far the decommission is); None: not claimed (tests).
    claims: interlock.Interlock | None = None
    by: str = ""
    # Reads the credentials Secret of a cluster that declares one (teardown.etcd.access's reader:
    # labelled and bound Secrets only); None: such clusters are unreachable.
    secrets: access.SecretReader | None = None

    async def run(self) -> policy.Verdict:
        done: list[policy.StepResult] = []
        while (step := policy.next_step(done)) is not None:
            log.info("decommission step", extra=fields(node=self.node, step=str(step)))
            done.append(await self.attempt(step))
        return policy.verdict(self.node, done)

    async def attempt(self, step: policy.Step) -> policy.StepResult:
        """Run ``step``; its failure, whatever raised it, is that step's result."""
        try:
            return policy.StepResult(step, True, await self.perform(step))
        except MetalmendError as error:
            detail = "; ".join(error.problems)
            text = f"{error.reason}: {error.message}" + (f": {detail}" if detail else "")
        except ApiError as error:
            text = f"the API server answered {errors.code(error)} {error.status.message}"
        except (httpx2.HTTPError, OSError) as error:
            text = f"cannot reach the API server: {error}"
        except Exception as error:  # still one message per step, as the spec asks
            # Logged with its traceback for the operator; the caller gets no internals.
            log.exception("decommission step %s failed", step)
            text = f"metalmend serve failed: {type(error).__name__}"
        return policy.StepResult(step, False, text)

    async def perform(self, step: policy.Step) -> str:
        if self.claims is not None:  # a remediation holding the host: this step's 409
            await self.claims.claim(self.node, f"decommission: {step}", self.by)
        match step:
            case policy.Step.DRAIN:
                drained = await self.drainer.drain(self.node, self.request.drain)
                evicted = sum(
                    1 for m in drained if m.message.startswith("pod ") and " evicted" in m.message
                )
                return f"Node {self.node} drained ({evicted} pod(s) evicted by this request)"
            case policy.Step.CLEAR_LABELS:
                cleared = await removal.clear_labels(
                    self.client, self.node, self.request.clear_labels
                )
                removed = sum(1 for m in cleared if m.message.startswith("label "))
                return f"Node {self.node} labels cleared ({removed} removed)"
            case policy.Step.REMOVE_ETCD:
                return await self.remove_etcd()
            case policy.Step.ETCD_READY:
                return await self.etcd_ready()
            case policy.Step.SHUTDOWN_KUBELET:
                stopped = await self.kubelet.shutdown(self.node)
                return stopped[-1].message

    async def remove_etcd(self) -> str:
        timeout = self.request.remove_etcd_timeout
        outcomes = await members.remove_member(
            self.design, self.node, timeout=timeout, secrets=self.secrets
        )
        if not outcomes:
            return f"Node {self.node} holds no etcd member of the design's clusters"
        said = "; ".join(line for o in outcomes for line in o.lines) or ", ".join(
            f"cluster {o.cluster}: {o.result}" for o in outcomes
        )
        if all(o.ok for o in outcomes):
            return said
        reason = "EtcdNotAccessible" if any(
            o.result is members.Result.UNREACHABLE for o in outcomes
        ) else "RemoveEtcdError"  # fmt: skip
        raise Failed(f"etcd member on {self.node} not removed: {said}", reason=reason)

    async def etcd_ready(self) -> str:
        deadline = self.clock.now() + dt.timedelta(seconds=self.request.etcd_ready_timeout)
        while True:
            report = await members.cluster_health(
                self.design, ignore_node=self.node, secrets=self.secrets
            )
            states = [
                policy.ClusterState(
                    c.cluster, c.state is members.State.HEALTHY, c.detail or c.state
                )
                for c in report
            ]
            now = self.clock.now()
            ready = policy.etcd_ready(states, now, deadline, self.settings.etcd_poll_interval)
            if ready.done and ready.stable:
                return ready.summary
            if ready.done:
                raise Failed(ready.summary, reason="EtcdNotStable")
            assert ready.look_again_at is not None
            await asyncio.sleep(max(0.0, (ready.look_again_at - now).total_seconds()))
