"""At rest, with the lab's hosts settled, metalmend reads no Secret and writes nothing
(issue 19: the BMC Secret was read from the API server on every reconcile, and each status
write woke its own key again, for another Secret read and another BMC read).

Counts, not timings: metalmend's own requests from the API server's audit log (its own
identity) over 20 s, with every controller the lab runs by default; its BMC reads stay
those of the power poll. benchmarks/at_rest.py prints the same counts for a minute, beside
the code before."""

from __future__ import annotations

from pathlib import Path

from benchmarks import at_rest

WINDOW = 20.0
POLL = 5.0  # --power-poll-interval of the lab's `metalmend run`


def test_settled_metalmend_reads_no_secret_and_writes_nothing(tmp_path: Path) -> None:
    measured = at_rest.measure("this tree", None, tmp_path, hosts=2, window=WINDOW)

    assert measured.settled_after is not None, "metalmend never stopped writing"
    secret_reads = {
        key: n for key, n in measured.requests.items() if key[1] == "secrets" and key[0] != "watch"
    }
    assert secret_reads == {}
    writes = {key: n for key, n in measured.requests.items() if key[0] in at_rest.AUDIT_WRITES}
    assert writes == {}
    # Every host is still polled, and only polled (a self-inflicted wake-up reads again).
    most = 2 * (int(WINDOW / POLL) + 1)
    assert 0 < measured.ipmi_reads <= most * measured.ipmi_hosts
    assert 0 < measured.redfish_requests <= most * measured.redfish_hosts
