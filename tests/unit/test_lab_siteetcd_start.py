"""How a lab site etcd member starts after a boot (lab.siteetcd.decide_start): from its
data; founding the cluster only with the genesis flag lab up seeds; a wiped member joins
(``existing``) only once the member list shows it added and unstarted; otherwise it waits,
never starting a cluster of its own."""

from __future__ import annotations

from pathlib import Path

from metalmend.teardown.etcd.client import Member
from metalmend_lab.siteetcd import MemberPlan, SitePlan, Start, Wait, decide_start, has_data


def site() -> SitePlan:
    members = [MemberPlan(h, 2379 + 10 * i, 2380 + 10 * i, f"/d/{h}") for i, h in enumerate("abc")]
    return SitePlan("/bin/etcd", members, 8080)


SITE = site()
A, B, C = SITE.members
STARTED = [Member(1, "a", (A.peer_url,), (A.client_url,)), Member(2, "b", (B.peer_url,), ())]


def test_a_member_with_data_starts_from_it() -> None:
    decision = decide_start(SITE, C, has_data=True, genesis=False, listed=None)
    assert isinstance(decision, Start)


def test_a_founding_member_starts_the_cluster() -> None:
    decision = decide_start(SITE, C, has_data=False, genesis=True, listed=None)
    assert decision == Start("new", SITE.initial_cluster, "founding the cluster")


def test_a_wiped_member_not_in_the_member_list_waits() -> None:
    decision = decide_start(SITE, C, has_data=False, genesis=False, listed=STARTED)
    assert isinstance(decision, Wait)
    assert f"waiting for a MemberAdd of {C.peer_url}" in decision.why


def test_a_wiped_member_waits_when_no_member_answers() -> None:
    assert isinstance(decide_start(SITE, C, has_data=False, genesis=False, listed=None), Wait)


def test_a_wiped_member_added_and_unstarted_joins_with_the_member_list() -> None:
    listed = [*STARTED, Member(7, "", (C.peer_url,), ())]
    decision = decide_start(SITE, C, has_data=False, genesis=False, listed=listed)
    assert decision == Start(
        "existing", f"a={A.peer_url},b={B.peer_url},c={C.peer_url}", "joining the cluster"
    )


def test_other_unstarted_members_are_named_from_the_plan_or_their_id() -> None:
    stranger = "http://127.0.0.1:9999"
    listed = [STARTED[0], Member(2, "", (B.peer_url,), ()), Member(7, "", (C.peer_url,), ()),
              Member(255, "", (stranger,), ())]  # fmt: skip
    decision = decide_start(SITE, C, has_data=False, genesis=False, listed=listed)
    assert isinstance(decision, Start)
    assert decision.initial_cluster == (
        f"a={A.peer_url},b={B.peer_url},c={C.peer_url},unstarted-ff={stranger}"
    )


def test_a_wiped_member_the_list_shows_started_waits() -> None:
    listed = [*STARTED, Member(7, "c", (C.peer_url,), ())]
    decision = decide_start(SITE, C, has_data=False, genesis=False, listed=listed)
    assert isinstance(decision, Wait)
    assert "removed and added again" in decision.why


def test_data_means_a_write_ahead_log(tmp_path: Path) -> None:
    assert not has_data(tmp_path / "etcd")
    wal = tmp_path / "etcd" / "member" / "wal"
    wal.mkdir(parents=True)
    assert not has_data(tmp_path / "etcd")
    (wal / "0000000000000000-0000000000000000.wal").write_bytes(b"x")
    assert has_data(tmp_path / "etcd")
