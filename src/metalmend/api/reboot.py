"""Reboot annotation values: a JSON map with ``mode`` hard or soft, as metal3's reboot
interface design defines them (and the reboot annotation page of metal3's user guide,
https://book.metal3.io/bmo/reboot_annotation.html, repeats).

The examples in both write ``{'mode':'hard'}`` with single quotes, which is not JSON;
it is accepted. An empty value means the default, soft. Anything else is malformed: the
caller reports it and uses the default, so one bad value never stops a reboot.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from metalmend.api.names import REBOOT, REBOOT_PREFIX

Mode = Literal["soft", "hard"]


@dataclass(frozen=True)
class RebootRequest:
    key: str  # the full annotation key
    mode: Mode
    problem: str | None = None  # why the value was not understood (then mode is soft)

    @property
    def keyed(self) -> bool:
        return self.key != REBOOT


def is_reboot_annotation(key: str) -> bool:
    return key == REBOOT or (key.startswith(REBOOT_PREFIX) and len(key) > len(REBOOT_PREFIX))


def parse_value(key: str, value: str) -> RebootRequest:
    text = value.strip()
    if not text:
        return RebootRequest(key, "soft")
    # RecursionError: nesting deeper than the json module allows ("[[[[..."), which any
    # annotation writer can send; it is just another value that is not a JSON map.
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        try:
            data = json.loads(text.replace("'", '"'))
        except (ValueError, RecursionError):
            return RebootRequest(key, "soft", f"{text[:80]!r} is not a JSON map")
    if not isinstance(data, dict):
        return RebootRequest(key, "soft", f"{text!r} is not a JSON map")
    mode = data.get("mode", "soft")
    if mode not in ("soft", "hard"):
        return RebootRequest(key, "soft", f"mode {mode!r} is neither 'hard' nor 'soft'")
    return RebootRequest(key, mode)


def reboot_requests(annotations: Mapping[str, str] | None) -> list[RebootRequest]:
    """Every reboot annotation, parsed, in key order."""
    return [
        parse_value(key, value)
        for key, value in sorted((annotations or {}).items())
        if is_reboot_annotation(key)
    ]
