"""What an API server's refusal means, in words: the one place that reads status codes.

lightkube raises one exception, ``ApiError``, for every non-2xx answer, carrying the
Kubernetes ``Status`` (code, reason, message). Code elsewhere branches on what the answer
*means* for it (the object is gone, another writer won, we may not, try later), so it
asks here instead of comparing numbers: ``is_not_found(error)``, ``is_conflict(error)``,
or ``classify(error)`` where several outcomes are told apart (the controller runtime,
the informer). The codes are the Kubernetes API conventions' (``StatusReason`` in
k8s.io/apimachinery ``pkg/apis/meta/v1/types.go``).

These are functions over lightkube's exception rather than exception classes of our own
(as kopf's ``APINotFoundError``): every call site already catches ``ApiError`` from the
client, and a translation layer around every client call would be one more thing to
forget.
"""

from __future__ import annotations

import enum

from lightkube import ApiError

__all__ = [
    "ApiError",
    "Refusal",
    "classify",
    "code",
    "is_conflict",
    "is_gone",
    "is_not_found",
    "is_refused",
    "is_unavailable",
]


class Refusal(enum.StrEnum):
    """What an API error means. The values are used as metric labels and in logs."""

    BAD_REQUEST = "bad_request"  # 400: a malformed request (a bug of ours, or a bad patch)
    UNAUTHORIZED = "unauthorized"  # 401: our credentials were not accepted
    FORBIDDEN = "forbidden"  # 403: RBAC (or a namespace being terminated) says no
    NOT_FOUND = "not_found"  # 404: the object (or the kind) does not exist
    CONFLICT = "conflict"  # 409: another writer won (resourceVersion, or already exists)
    GONE = "gone"  # 410: the watch's resourceVersion is too old: list again
    INVALID = "invalid"  # 422: validation or an admission policy refused the object
    TOO_MANY_REQUESTS = "too_many_requests"  # 429: API priority and fairness: later
    SERVER_ERROR = "server_error"  # 5xx: the API server (or etcd) failed: later
    OTHER = "other"  # anything else, including a Status without a code


_BY_CODE = {
    400: Refusal.BAD_REQUEST,
    401: Refusal.UNAUTHORIZED,
    403: Refusal.FORBIDDEN,
    404: Refusal.NOT_FOUND,
    409: Refusal.CONFLICT,
    410: Refusal.GONE,
    422: Refusal.INVALID,
    429: Refusal.TOO_MANY_REQUESTS,
}


def code(error: ApiError) -> int:
    """The HTTP status code, for messages and metric labels (0 when the Status has none)."""
    return int(error.status.code or 0)


def classify(error: ApiError) -> Refusal:
    number = code(error)
    if number >= 500:
        return Refusal.SERVER_ERROR
    return _BY_CODE.get(number, Refusal.OTHER)


def is_not_found(error: ApiError) -> bool:
    return classify(error) is Refusal.NOT_FOUND


def is_conflict(error: ApiError) -> bool:
    return classify(error) is Refusal.CONFLICT


def is_gone(error: ApiError) -> bool:
    return classify(error) is Refusal.GONE


def is_refused(error: ApiError) -> bool:
    """RBAC or an admission policy said no to a write (403, 422): an answer about our
    permissions or the object, which retrying the same write will not change."""
    return classify(error) in (Refusal.FORBIDDEN, Refusal.INVALID)


def is_unavailable(error: ApiError) -> bool:
    """A passing API server problem (5xx, 429): weather, not an answer; retry later."""
    return classify(error) in (Refusal.SERVER_ERROR, Refusal.TOO_MANY_REQUESTS)
