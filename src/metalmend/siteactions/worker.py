"""The action worker of ``metalmend serve``: runs the stored Shipyard actions step by step
(docs/site-actions.md, "How actions run").

Each action runs in one replica at a time under a lease (``db.leased``, as Drydock's
tasks). Its steps run in order; a step's state and record are stored as it goes, so a
replica that takes the action over (after a crash, or this one restarted) skips the steps
that succeeded and runs the one that was running again, from its saved record: every step
is written to be run again (``siteactions.steps``). After a failure the remaining steps are
not run (``upstream_failed``), except ``final`` ones (the site-action tag). A stop asked
for through the API takes effect at the running step's next pause (``StepContext.pause``:
where it waits for the site, a Drydock task, a host or a Node), or when it ends: the step
is then ``shutdown``, the rest not run but the final ones. What a step does between two
pauses (an apply, a drain, an etcd member add) is never cut in the middle. The replica
running the action hears of a stop at once when it is the one that took the request, and
otherwise at its next look at the database (``STOP_LOOK_SECONDS``).

An unexpected failure (the API server away, a bug) runs the step again from its stored
record, ``RETRY_SECONDS`` later; after ``FAILURES_BEFORE_GIVING_UP`` in a row the step
fails, saying so, rather than keep the action open for ever. The database away is not a
failure of the step: the action stops quietly (``metalmend.db`` says it once) and is taken
again, from its stored steps, once the database answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.db import DatabaseUnavailable
from metalmend.db.lease import LeaseLost
from metalmend.db.leased import LeasedWorker, in_thread
from metalmend.kube.impersonate import Who
from metalmend.log import fields
from metalmend.siteactions import metrics, model
from metalmend.siteactions.model import Note, StepState
from metalmend.siteactions.policy.actions import COMMITTED_ACTIONS, ActionLifecycle, ActionName
from metalmend.siteactions.steps import (
    Action,
    MissingPrecondition,
    Planned,
    SiteServices,
    StepContext,
    StepFailed,
    Stopped,
)
from metalmend.siteactions.store import ActionStore

log = logging.getLogger(__name__)

SCAN_SECONDS = 2.0
STOP_LOOK_SECONDS = 2.0  # a pausing step looks for a stop asked through another replica
FAILURES_BEFORE_GIVING_UP = 10
RETRY_SECONDS = 5.0

Plans = Mapping[str, Sequence[Planned]]


def plans() -> dict[str, tuple[Planned, ...]]:
    """Every action's steps, in order."""
    from metalmend.siteactions import deploysite as site
    from metalmend.siteactions import redeploy, relabel

    redeploy_steps = tuple(Planned(name, run) for name, run in redeploy.STEPS.items())
    return {
        ActionName.REDEPLOY_SERVER: redeploy_steps,
        ActionName.DEPLOY_SITE: site.PLAN,
        ActionName.UPDATE_SITE: site.PLAN,
        ActionName.RELABEL_NODES: relabel.PLAN,
    }


def step_view(action: model.Action) -> Action:
    """The action as its steps read it. A site action deploys the revision committed when
    it was created (relabel_nodes labels from it); redeploy_server the one its
    design_lookup found."""
    revision = action.revision
    if revision is None and action.name in COMMITTED_ACTIONS:
        revision = action.committed_rev_id
    return Action(
        id=action.id, name=action.name, parameters=action.parameters, user=action.user,
        context_marker=action.context_marker, revision=revision,
        allow_intermediate_commits=action.allow_intermediate_commits,
        states={s.name: str(s.state) for s in action.steps},
        caller=Who.from_wire(action.caller),
    )  # fmt: skip


class ActionWorker:
    def __init__(
        self,
        store: ActionStore,
        services: SiteServices,
        lease_seconds: float,
        *,
        steps: Plans | None = None,
        clock: Clock = SYSTEM_CLOCK,
        owner: str | None = None,
        retry_seconds: float = RETRY_SECONDS,
    ) -> None:
        self.store, self.services, self.clock = store, services, clock
        self.plans: Plans = steps if steps is not None else plans()
        self.retry_seconds = retry_seconds
        self.jobs = LeasedWorker(
            "shipyard", store.leases, self.run, lease_seconds,
            scan_seconds=SCAN_SECONDS, clock=clock, owner=owner,
        )  # fmt: skip
        self.owner = self.jobs.owner
        self._stops: dict[str, asyncio.Event] = {}  # the actions running here

    def start(self) -> None:
        self.jobs.start()

    def wake(self) -> None:
        self.jobs.wake()

    def stopping(self, action_id: str) -> None:
        """A stop of ``action_id`` was just stored: its pausing step ends now if it runs
        here (elsewhere, at that replica's next look)."""
        found = self._stops.get(action_id)
        if found is not None:
            found.set()
        self.wake()

    async def stop(self) -> None:
        await self.jobs.stop()

    # ---- one action ---------------------------------------------------------------------

    async def run(self, action_id: str) -> None:
        self._stops[action_id] = asyncio.Event()
        try:
            await self._run(action_id)
        finally:
            self._stops.pop(action_id, None)

    async def _run(self, action_id: str) -> None:
        action = await self._read(action_id)
        plan = self.plans.get(action.name)
        if plan is None:  # stored by a newer version of metalmend: leave it to that one
            log.error("shipyard: no plan for action %s (%s)", action_id, action.name)
            return
        await self._lifecycle(action_id, ActionLifecycle.PROCESSING)
        failed = False
        for planned in plan:
            action = await self._read(action_id)
            step = action.step(planned.name)
            if step is None:
                continue
            if step.state in model.FINISHED_STEP:
                failed = failed or step.state is not StepState.SUCCESS
                continue
            if not planned.final and action.stop_requested and step.state is StepState.RUNNING:
                # Stopped, then this replica restarted (or another took over) before the
                # step's pause heard of it: the step ends here, it is not run again.
                await self._stopped(action, planned.name, "interrupted by a restart")
                failed = True
                continue
            if not planned.final and (failed or action.stop_requested):
                await self._not_run(action, planned.name)
                failed = True
                continue
            ran = metrics.timed_step(action.name, planned.name, self._step(action, planned))
            failed = not await ran or failed
        lifecycle = ActionLifecycle.FAILED if failed else ActionLifecycle.COMPLETE
        await self._lifecycle(action_id, lifecycle)
        metrics.action_finished(action.name, lifecycle, action.created, self.clock.now())
        log.info("shipyard: action finished", extra=fields(action=action_id, lifecycle=lifecycle))

    async def _read(self, action_id: str) -> model.Action:
        found = await in_thread(self.store.get, action_id)
        if found is None:
            raise LeaseLost(action_id)  # deleted under us: nothing left to run
        return found

    async def _not_run(self, action: model.Action, step: str) -> None:
        stopped = action.stop_requested
        why = f"action stopped by {stopped}" if stopped else "an earlier step failed"
        note = Note(self.clock.now(), f"not run: {why}")
        await self._update(action.id, step, {"state": str(StepState.NOT_RUN)}, note)

    async def _stopped(self, action: model.Action, step: str, how: str) -> None:
        found = await in_thread(self.store.stop_requested, action.id)
        values = {"state": str(StepState.STOPPED), "end_date": self.clock.now()}
        note = Note(self.clock.now(), f"stopped by {found or action.stop_requested}: {how}")
        await self._update(action.id, step, values, note)
        log.warning(
            "shipyard: step stopped", extra=fields(action=action.id, step=step, why=note.text)
        )

    async def _stop_stored(self, action_id: str) -> bool:
        try:
            return bool(await in_thread(self.store.stop_requested, action_id))
        except Exception as error:  # the database away: the step's own writes will say so
            log.warning(
                "shipyard: cannot look for a stop", extra=fields(action=action_id, error=error)
            )
            return False

    def _pause(self, action_id: str) -> Callable[[float], Awaitable[None]]:
        """``StepContext.pause`` for the steps of ``action_id``."""
        stop = self._stops.setdefault(action_id, asyncio.Event())

        async def pause(seconds: float) -> None:
            loop = asyncio.get_running_loop()
            end = loop.time() + max(0.0, seconds)
            while True:
                if stop.is_set():
                    raise Stopped(action_id)
                if await self._stop_stored(action_id):
                    stop.set()
                    raise Stopped(action_id)
                left = end - loop.time()
                if left <= 0:
                    return
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(left, STOP_LOOK_SECONDS)):
                        await stop.wait()

        return pause

    async def _step(self, action: model.Action, planned: Planned) -> bool:
        """Run one step to its end; True when it succeeded."""
        step = action.step(planned.name)
        assert step is not None
        now = self.clock.now()
        values = {
            "state": str(StepState.RUNNING), "try_number": step.try_number + 1,
            "start_date": step.start or now,
        }  # fmt: skip
        await self._update(action.id, planned.name, values)
        record: dict[str, Any] = dict(step.record)

        async def save(new: Mapping[str, Any]) -> None:
            await self._update(action.id, planned.name, {"record": dict(new)})
            record.clear()
            record.update(new)

        async def note(text: str) -> None:
            log.info(text, extra=fields(action=action.id, step=planned.name))
            await self._update(action.id, planned.name, None, Note(self.clock.now(), text))

        failures = 0
        while True:
            ctx = StepContext(
                step_view(action), planned.name, dict(record), save, note, self.services,
                pause=self._pause(action.id),
            )  # fmt: skip
            try:
                closing = await planned.run(ctx)
            except (LeaseLost, asyncio.CancelledError, DatabaseUnavailable):
                raise
            except Stopped:
                await self._stopped(action, planned.name, "interrupted while it waited")
                return False
            except MissingPrecondition as error:
                return await self._finish(action, planned.name, f"missing precondition: {error}")
            except StepFailed as error:
                return await self._finish(action, planned.name, str(error))
            except Exception as error:
                failures += 1
                log.exception(
                    "shipyard: step %s failed unexpectedly; trying again", planned.name,
                    extra=fields(action=action.id, failures=failures),
                )  # fmt: skip
                if failures >= FAILURES_BEFORE_GIVING_UP:
                    text = f"metalmend serve failed: {type(error).__name__} ({failures} times)"
                    return await self._finish(action, planned.name, text)
                try:
                    await ctx.pause(self.retry_seconds)
                except Stopped:
                    await self._stopped(action, planned.name, "interrupted while it waited")
                    return False
                continue
            await self._found_revision(action, record)
            return await self._finish(action, planned.name, closing, succeeded=True)

    async def _found_revision(self, action: model.Action, record: Mapping[str, Any]) -> None:
        """design_lookup's revision becomes the action's: every later step uses it."""
        found = record.get("revision")
        if action.revision is None and isinstance(found, int) and not isinstance(found, bool):
            await self._held(self.store.set_revision, action.id, self.owner, found)

    async def _finish(
        self, action: model.Action, step: str, text: str, *, succeeded: bool = False
    ) -> bool:
        state = StepState.SUCCESS if succeeded else StepState.FAILED
        values = {"state": str(state), "end_date": self.clock.now()}
        await self._update(action.id, step, values, Note(self.clock.now(), text))
        if not succeeded:
            log.warning(
                "shipyard: step %s of action %s failed: %s", step, action.id, text,
                extra=fields(action=action.id, step=step, why=text),
            )  # fmt: skip
        return succeeded

    # ---- writes, under the lease -----------------------------------------------------------

    async def _update(
        self, action_id: str, step: str, values: Mapping[str, Any] | None, note: Note | None = None
    ) -> None:
        now = self.clock.now()

        def write() -> bool:
            return self.store.update_step(
                action_id, self.owner, step, now, values=values, note=note
            )

        if not await in_thread(write):
            raise LeaseLost(action_id)

    async def _lifecycle(self, action_id: str, lifecycle: ActionLifecycle) -> None:
        now = self.clock.now()
        await self._held(self.store.set_lifecycle, action_id, self.owner, lifecycle, now)

    async def _held(self, write: Any, action_id: str, *args: Any) -> None:
        if not await in_thread(write, action_id, *args):
            raise LeaseLost(action_id)
