"""What can go wrong talking to a BMC, typed so the host controller can report it as
upstream metal3 does (``status.errorType``), and scrubbed so a password never travels
inside a message."""

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


def scrub(text: str, *secrets: str) -> str:
    """``text`` with every non-empty secret replaced by ***."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text
