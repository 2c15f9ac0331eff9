"""What the teardown endpoints share (Promenade's steps, remove-etcd, decommission): the
teardown claim taken for the request's caller before a step changes anything."""

from __future__ import annotations

from fastapi import Request

from metalmend.teardown.interlock import Interlock
from metalmend.web import deps
from metalmend.web.auth import caller_of


async def claim_for(request: Request, node: str, step: str) -> None:
    """Claim Node ``node``'s hosts for ``step`` of this request (``Interlock.claim``)."""
    claims = deps.of(request, Interlock)
    await claims.claim(node, step, caller_of(request))
