"""What an API server's refusal means (kube/errors.py): the one reader of status codes."""

from __future__ import annotations

import pytest
from lightkube import ApiError
from lightkube.models.meta_v1 import Status

from metalmend.kube import errors
from metalmend.kube.errors import Refusal


def api_error(code: int | None) -> ApiError:
    return ApiError(status=Status(code=code, message=f"answered {code}"))


@pytest.mark.parametrize(
    ("code", "meaning"),
    [
        (400, Refusal.BAD_REQUEST),
        (401, Refusal.UNAUTHORIZED),
        (403, Refusal.FORBIDDEN),
        (404, Refusal.NOT_FOUND),
        (409, Refusal.CONFLICT),
        (410, Refusal.GONE),
        (422, Refusal.INVALID),
        (429, Refusal.TOO_MANY_REQUESTS),
        (500, Refusal.SERVER_ERROR),
        (503, Refusal.SERVER_ERROR),
        (504, Refusal.SERVER_ERROR),
        (418, Refusal.OTHER),
        (None, Refusal.OTHER),
    ],
    ids=lambda v: str(v),
)
def test_each_status_code_has_one_meaning(code: int | None, meaning: Refusal) -> None:
    assert errors.classify(api_error(code)) is meaning


@pytest.mark.parametrize(
    ("code", "not_found", "conflict", "gone", "refused", "unavailable"),
    [
        pytest.param(404, True, False, False, False, False, id="404 the object is gone"),
        pytest.param(409, False, True, False, False, False, id="409 another writer won"),
        pytest.param(410, False, False, True, False, False, id="410 list again"),
        pytest.param(403, False, False, False, True, False, id="403 RBAC refused the write"),
        pytest.param(422, False, False, False, True, False, id="422 admission refused it"),
        pytest.param(429, False, False, False, False, True, id="429 later"),
        pytest.param(500, False, False, False, False, True, id="500 later"),
        pytest.param(400, False, False, False, False, False, id="400 none of these"),
    ],
)
def test_the_questions_call_sites_ask(
    code: int, not_found: bool, conflict: bool, gone: bool, refused: bool, unavailable: bool
) -> None:
    error = api_error(code)
    assert errors.is_not_found(error) is not_found
    assert errors.is_conflict(error) is conflict
    assert errors.is_gone(error) is gone
    assert errors.is_refused(error) is refused
    assert errors.is_unavailable(error) is unavailable


def test_a_status_without_a_code_reads_as_zero() -> None:
    assert errors.code(api_error(None)) == 0
    assert errors.code(api_error(409)) == 409
