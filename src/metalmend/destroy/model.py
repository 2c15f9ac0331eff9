"""Drydock's task, as metalmend stores and answers it (docs/destroy.md).

Drydock's task API (airship-drydock ``doc/source/task.rst``): ``POST /tasks`` with
``action``, ``design_ref`` and ``node_filter``; the task answered has ``task_id``,
``status`` (requested, queued, running, complete) and ``result`` (a Status whose
``status`` is incomplete, success, partial_success or failure, with ``successes``,
``failures`` and per-node messages: ``context_type: node``, ``context``, ``ts``).

Only ``destroy_nodes`` is served, for nodes named by the filter (``node_names``).
``preserve-local-storage`` is metalmend's extension (upstream Drydock had no such option
and its tasks no options field): a top-level boolean of the request and the task.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from metalmend.api.stamps import stamp
from metalmend.destroy.policy.destroy import NodeState, ResultStatus, TaskStatus, task_result

DESTROY_NODES = "destroy_nodes"
DRYDOCK_ACTIONS = frozenset(
    {"validate_design", "verify_site", "prepare_site", "verify_nodes", "prepare_nodes",
     "deploy_nodes", "destroy_nodes", "relabel_nodes"}
)  # fmt: skip
PRESERVE = "preserve-local-storage"
MAX_NODES = 256  # one request; a site's worth of servers destroyed at once is a mistake
# A Node name: a DNS subdomain (what the API server accepts).
NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
FILTER_KEYS = frozenset({"filter_type", "node_names", "node_tags", "node_labels", "rack_names"})


class RequestProblem(ValueError):
    """A task request metalmend will not run; the message says why (a 400)."""


@dataclass(frozen=True)
class TaskRequest:
    action: str
    design_ref: str
    nodes: tuple[str, ...]
    node_filter: Any  # as given (answered back in the task)
    preserve_local_storage: bool


def read_request(body: Any) -> TaskRequest:
    """A ``POST /tasks`` body, checked; RequestProblem naming the field otherwise."""
    if not isinstance(body, Mapping):
        raise RequestProblem("the body must be a JSON object")
    unknown = sorted(set(body) - {"action", "design_ref", "node_filter", PRESERVE})
    if unknown:
        raise RequestProblem(f"unknown field(s): {', '.join(map(str, unknown))}")
    action = body.get("action")
    if action != DESTROY_NODES:
        if isinstance(action, str) and action in DRYDOCK_ACTIONS:
            raise RequestProblem(f"action {action} is not served: only {DESTROY_NODES} is")
        raise RequestProblem(f"action must be {DESTROY_NODES}")
    design_ref = body.get("design_ref")
    if not isinstance(design_ref, str) or not design_ref.strip() or len(design_ref) > 2048:
        raise RequestProblem("design_ref must be a URL (at most 2048 characters)")
    try:
        userinfo = "@" in urlsplit(design_ref.strip()).netloc
    except ValueError:
        raise RequestProblem("design_ref must be a URL (at most 2048 characters)") from None
    if userinfo:  # kept with the task and shown to its readers: never a password
        raise RequestProblem("design_ref must not carry a user name or password")
    preserve = body.get(PRESERVE, False)
    if not isinstance(preserve, bool):
        raise RequestProblem(f"{PRESERVE} must be true or false")
    node_filter = body.get("node_filter")
    return TaskRequest(action, design_ref, node_names(node_filter), node_filter, preserve)


def node_names(node_filter: Any) -> tuple[str, ...]:
    """The nodes Drydock's node filter names. Only ``node_names`` is supported; a filter
    that would select every node of the design (null, or no node_names) is refused:
    destroying a whole site by leaving a field out is not a risk worth taking."""
    if node_filter is None:
        raise RequestProblem(
            "node_filter is required: a null filter would select every node of the design,"
            " which destroy_nodes refuses; name the nodes in node_filter.filter_set[].node_names"
        )
    if not isinstance(node_filter, Mapping):
        raise RequestProblem("node_filter must be an object")
    set_type = node_filter.get("filter_set_type", "union")
    if set_type not in ("union", "intersection"):
        raise RequestProblem("node_filter.filter_set_type must be union or intersection")
    sets = node_filter.get("filter_set")
    if not isinstance(sets, list) or not sets:
        raise RequestProblem("node_filter.filter_set must be a non-empty list")
    chosen = [_filter_names(i, one) for i, one in enumerate(sets)]
    if set_type == "union":
        names = list(dict.fromkeys(n for group in chosen for n in group))
    else:
        names = [n for n in chosen[0] if all(n in group for group in chosen[1:])]
    if not names:
        raise RequestProblem("node_filter selects no node")
    if len(names) > MAX_NODES:
        raise RequestProblem(f"node_filter selects {len(names)} nodes; at most {MAX_NODES}")
    return tuple(names)


def _filter_names(index: int, one: Any) -> list[str]:
    where = f"node_filter.filter_set[{index}]"
    if not isinstance(one, Mapping):
        raise RequestProblem(f"{where} must be an object")
    unknown = sorted(set(one) - FILTER_KEYS)
    if unknown:
        raise RequestProblem(f"{where}: unknown field(s) {', '.join(map(str, unknown))}")
    if one.get("filter_type", "union") not in ("union", "intersection"):
        raise RequestProblem(f"{where}.filter_type must be union or intersection")
    others = [k for k in ("node_tags", "node_labels", "rack_names") if one.get(k)]
    if others:
        raise RequestProblem(
            f"{where}: {', '.join(others)} not supported: metalmend selects nodes by"
            " node_names only"
        )
    names = one.get("node_names")
    if not isinstance(names, list) or not names:
        raise RequestProblem(f"{where}.node_names must be a non-empty list of Node names")
    for name in names:
        if not isinstance(name, str) or len(name) > 253 or not NODE_NAME.fullmatch(name):
            shown = repr(name)[:80]
            raise RequestProblem(f"{where}.node_names: {shown} is not a valid Node name")
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class Task:
    task_id: str
    action: str
    design_ref: str
    node_filter: Any
    preserve_local_storage: bool
    status: TaskStatus
    created: dt.datetime
    created_by: str
    updated: dt.datetime
    context_marker: str | None
    nodes: Mapping[str, NodeState] = field(default_factory=dict)  # in the request's order

    def to_wire(self) -> dict[str, Any]:
        """Drydock's Task document, with the result of its nodes."""
        return {
            "kind": "Task",
            "apiVersion": "v1.0",
            "task_id": self.task_id,
            "action": self.action,
            "design_ref": self.design_ref,
            "parent_task_id": None,
            "subtask_id_list": [],
            "status": str(self.status),
            "node_filter": self.node_filter,
            PRESERVE: self.preserve_local_storage,
            "created": stamp(self.created),
            "created_by": self.created_by,
            "updated": stamp(self.updated),
            "terminated": None,
            "terminated_by": None,
            "context_marker": self.context_marker,
            "result": result_of(self.nodes),
            "nodes": {name: _progress(state) for name, state in self.nodes.items()},
        }


def _progress(state: NodeState) -> dict[str, Any]:
    """Where one node is (metalmend's addition: what the CLI shows while it runs)."""
    return {
        "step": str(state.step),
        "outcome": str(state.outcome),
        "host": state.host or None,
        "drives": [
            {"id": d.id, "name": d.name, "serial": d.serial,
             "role": str(d.role) if d.role else None, "erase": str(d.erase)}
            for d in state.drives
        ],
    }  # fmt: skip


def result_of(nodes: Mapping[str, NodeState]) -> dict[str, Any]:
    outcome = task_result(nodes)
    messages = [
        {
            "message": m.message,
            "error": m.error,
            "kind": "SimpleMessage",
            "context_type": "node",
            "context": name,
            "ts": stamp(m.ts),
        }
        for name, state in nodes.items()
        for m in state.messages
    ]
    messages.sort(key=lambda m: str(m["ts"]))
    return {
        "kind": "Status",
        "apiVersion": "v1.0",
        "metadata": {},
        "status": str(outcome.status),
        "message": _summary(outcome.status, outcome.successes, outcome.failures, len(nodes)),
        "reason": str(outcome.status),
        "successes": list(outcome.successes),
        "failures": list(outcome.failures),
        "details": {
            "errorCount": sum(1 for m in messages if m["error"]),
            "messageList": messages,
        },
    }


def _summary(
    status: ResultStatus, successes: Sequence[str], failures: Sequence[str], total: int
) -> str:
    if status is ResultStatus.INCOMPLETE:
        done = len(successes) + len(failures)
        return f"{done} of {total} node(s) finished"
    parts = []
    if successes:
        parts.append(f"destroyed: {', '.join(successes)}")
    if failures:
        parts.append(f"not destroyed: {', '.join(failures)}")
    return "; ".join(parts)
