"""What can go wrong talking to a BMC, typed so the host controller can report it as
upstream metal3 does (``status.errorType``).

Secrets never enter a message: drivers build their texts from the address, the error's
kind and what the BMC or the protocol library said, never from the credentials (neither
libcurl, under the Redfish driver, nor pyghmi puts the password into an error text; pyghmi's
login errors are fixed phrases such as "Incorrect password provided", and the password
crosses to the IPMI worker process only inside its request, never back). So nothing has
to be scrubbed afterwards: replacing every occurrence of a password text mangled messages
when the password was short (a password ``p`` turned ``http`` into ``htt***``) and
revealed where it occurred. What a BMC says is its own text, and is capped (``cap``)
before it is kept anywhere: a BMC answering a 3 MB message must not make a 3 MB status,
Event or log line.
"""

from __future__ import annotations

REGISTRATION_ERROR = "registration error"
POWER_MANAGEMENT_ERROR = "power management error"


class BmcError(Exception):
    """A BMC command failed. ``error_type`` is the BareMetalHost errorType to report."""

    error_type = POWER_MANAGEMENT_ERROR


class BadAddress(BmcError):
    """The BMC address cannot be used (unknown scheme, malformed, no such system)."""

    error_type = REGISTRATION_ERROR


class CredentialsError(BmcError):
    """The credentials Secret is missing, elsewhere, or lacks username/password."""

    error_type = REGISTRATION_ERROR


class AuthenticationFailed(BmcError):
    """The BMC refused the credentials."""

    error_type = REGISTRATION_ERROR


class Unreachable(BmcError):
    """No answer at the network level: refused, reset, no route."""


class TimedOut(BmcError):
    """The BMC did not answer within the timeout."""


class Unsupported(BmcError):
    """The BMC does not offer the requested power action."""


CUT_MARKER = "… [cut: {dropped} more characters]"


def cap(text: str, limit: int) -> str:
    """The start of ``text`` (what went wrong comes first in a message, the detail after),
    at most ``limit`` characters in all, with a visible marker saying how much was cut."""
    if len(text) <= limit:
        return text
    keep = limit - len(CUT_MARKER.format(dropped=len(text)))
    if keep < limit // 2:  # a limit too small for the marker: one character says it
        return text[: max(limit - 1, 0)] + "…"
    return text[:keep] + CUT_MARKER.format(dropped=len(text) - keep)


class Refused(BmcError):
    """metalmend's own policy refuses to talk to this address (cleartext HTTP, a network
    outside the allowed BMC networks). Nothing was sent."""

    error_type = REGISTRATION_ERROR


class Busy(Exception):
    """The host's BMC (or its tenant's share of BMC slots) is busy with other calls right
    now. Not a BMC failure and not counted as one: the caller tries again after
    ``retry_after`` seconds instead of waiting, so a busy BMC never blocks a worker that
    could serve another BMC."""

    def __init__(self, message: str, retry_after: float, others: int = 0) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.others = others
        """Calls of other namespaces the call waits behind at its BMC endpoint (the one
        under way and one per namespace in line before it): 0 when it waits for its own
        namespace only, or for a share of slots."""
