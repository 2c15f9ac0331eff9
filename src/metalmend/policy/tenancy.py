"""The action every controller that follows a Machine to a host or a Node shares: telling
the Machine that a link was refused, or no longer is (api/links.py; docs/security.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SetLinkCondition:
    """Make the Machine's tenancy condition ``type`` (``HostLinkValid``, ``NodeLinkValid``,
    ``NodeFencingAllowed``) say ``refusal``; "" = nothing refused: back to True if it was
    False, nothing written otherwise (so a Machine never refused carries no condition). The
    executor writes it with controllers.tenancy.report: once per refusal, with one Warning
    Event and one log line."""

    machine: str  # "namespace/name"
    type: str
    refusal: str
    reason: str
