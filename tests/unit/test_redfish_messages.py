"""What the Redfish driver keeps of a BMC's words: the Redfish error message, its start,
on one line; and our power vocabulary in Redfish's."""

from __future__ import annotations

import json

import pytest

from metalmend.bmc.address import parse
from metalmend.bmc.driver import PowerAction
from metalmend.bmc.redfish import RESET_TYPES, Answer, RedfishDriver, redfish_message
from metalmend.bmc.settings import BmcSettings


def error_answer(error: object, status: int = 400) -> Answer:
    return Answer(status, json.dumps({"error": error}).encode(), True)


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        pytest.param(
            error_answer(
                {
                    "code": "Base.1.0.GeneralError",
                    "message": "A general error has occurred. See ExtendedInfo.",
                    "@Message.ExtendedInfo": [
                        {"MessageId": "Base.1.0.PropertyMissing", "Message": "ResetType is missing."},
                        {"MessageId": "Base.1.0.Other", "Message": "Try again."},
                    ],
                }
            ),
            "ResetType is missing.; Try again.",
            id="extended info first",
        ),
        pytest.param(
            error_answer({"message": "Fan 3 failed", "@Message.ExtendedInfo": [{"MessageId": "X"}]}),
            "Fan 3 failed",
            id="error.message when extended info has no text",
        ),
        pytest.param(
            error_answer({"message": 42}), '{"error": {"message": 42}}', id="wrong shape: raw text"
        ),
        pytest.param(Answer(500, b"  Internal Server Error\n", True), "Internal Server Error", id="plain text"),
        pytest.param(
            Answer(500, b'{"error": {"message": "cut her', False), '{"error": {"message": "cut her',
            id="cut at the cap: its start as text",
        ),
        pytest.param(Answer(502, b"", True), "", id="empty"),
    ],
)  # fmt: skip
def test_the_redfish_error_message_is_what_is_kept(answer: Answer, says: str) -> None:
    assert redfish_message(answer) == says


def test_bmc_text_is_cut_to_its_start_on_one_line() -> None:
    driver = RedfishDriver(
        parse("redfish://10.0.0.1/redfish/v1/Systems/1"),
        "operator",
        "p",
        True,
        BmcSettings(max_message_chars=120),
    )
    text = "Fan 3 failed\r\n2026-11-23 ERROR forged log line\u2028" + "more " * 10000
    message = driver._with_bmc_text("https://10.0.0.1/redfish/v1/Systems/1: HTTP 500: ", text)
    assert message.startswith("https://10.0.0.1/redfish/v1/Systems/1: HTTP 500: Fan 3 failed  2026")
    assert not any(c in message for c in "\r\n\u2028")
    assert "…" in message
    assert len(message) <= 120


def test_our_power_vocabulary_in_redfish() -> None:
    assert RESET_TYPES == {
        PowerAction.ON: "On",
        PowerAction.SOFT_OFF: "GracefulShutdown",
        PowerAction.HARD_OFF: "ForceOff",
    }
