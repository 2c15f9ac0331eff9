"""Watch bookmarks (kube.informer.bookmark_version): read as JSON, never decoded into the
resource's model, which refuses a bookmark Pod (its required fields are null). Seen in the
lab: a drain's Pod watch broken by a bookmark, the drain waiting 60 s for a re-list."""

from __future__ import annotations

import json

import msgspec
import pytest
from lightkube.core.generic_client import WatchDriver
from lightkube.resources.core_v1 import Pod

from metalmend.kube.informer import bookmark_version

BOOKMARK = json.dumps({
    "type": "BOOKMARK",
    "object": {"kind": "Pod", "apiVersion": "v1",
               "metadata": {"resourceVersion": "4711",
                            "annotations": {"k8s.io/initial-events-end": "true"}},
               "spec": {"containers": None}, "status": {}},
}, separators=(",", ":"))  # fmt: skip


def test_a_bookmark_is_read_without_decoding_the_object() -> None:
    assert bookmark_version(BOOKMARK) == "4711"


def test_lightkube_refuses_a_bookmark_pod_which_is_why() -> None:
    class Request:
        def __init__(self) -> None:
            self.params: dict[str, str] = {}
            self.response_type = Pod

    driver = WatchDriver(Request(), None)  # type: ignore[arg-type]
    with pytest.raises(msgspec.ValidationError, match=r"spec\.containers"):
        driver.process_one_line(BOOKMARK)


@pytest.mark.parametrize(
    "line",
    [
        json.dumps({"type": "ADDED", "object": {"kind": "Pod", "metadata": {"name": "BOOKMARK"}}}),
        '{"type":"BOOKMARK","object":{}}',
        '{"type":"BOOKMARK"',
        "",
    ],
)
def test_other_lines_are_not_bookmarks(line: str) -> None:
    assert bookmark_version(line) is None
