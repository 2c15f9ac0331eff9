"""The summaries of the sharding benchmark's real mode (benchmarks/sharding.py): a BMC
journal read back with each reset's sender, a reboot served twice or by two replicas, the
hosts that moved, hosts per replica, the CPU ratios and the report's failover lines. Pure:
no cluster, no files."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest
import yaml
from benchmarks.sharding import (
    Balance,
    Command,
    Contention,
    Results,
    canary_ms,
    counts_shares,
    cpu_pressure_us,
    cpu_ratios,
    handed_mid_reboot,
    handovers_in,
    memory,
    moved_hosts,
    node_events,
    p99,
    parse_journal,
    phases,
    report,
    served_twice_or_by_two,
    shares,
    simulate,
    together,
)

BY_PID = {101: "r0", 102: "r1"}


def test_a_journal_names_each_sender_by_its_replica() -> None:
    text = "10.5 hard off pid=101\n11.0 on pid=102\n12.0 on pid=None\n13.0 hard off\n"
    assert parse_journal(text, BY_PID) == [
        Command(10.5, "hard off", "r0"),
        Command(11.0, "on", "r1"),
        Command(12.0, "on", "?"),  # the BMC could not tell
        Command(13.0, "hard off", "?"),  # a journal without senders
    ]
    assert parse_journal("14.0 on pid=999\n", BY_PID) == [Command(14.0, "on", "?")]
    assert parse_journal("", BY_PID) == []


def commands(*entries: tuple[str, str]) -> list[Command]:
    return [Command(float(i), word, by) for i, (word, by) in enumerate(entries)]


@pytest.mark.parametrize(
    ("journal", "asked", "why"),
    [
        (commands(), 0, None),
        (commands(("hard off", "r0"), ("on", "r0")), 1, None),
        (commands(("hard off", "r0"), ("on", "r0"), ("hard off", "r1"), ("on", "r1")), 2, None),
        (commands(("soft off", "r0"), ("on", "r0")), 1, None),
        (commands(("hard off", "?"), ("on", "r1")), 1, None),  # an unknown sender is no one
        (
            commands(("hard off", "r0"), ("on", "r1")),
            1,
            "one reboot served by r0 and r1, with no hand-over by r0 between its power-off and"
            " the power-on",
        ),
        (
            commands(("hard off", "r0"), ("on", "r0"), ("hard off", "r1"), ("on", "r1")),
            1,
            "1 reboot(s) asked, the BMC got 'hard off on hard off on'",
        ),
        (
            commands(("hard off", "r0"), ("hard off", "r1"), ("on", "r1")),
            1,
            "1 reboot(s) asked, the BMC got 'hard off hard off on'",
        ),
        (commands(("hard off", "r0")), 1, "1 reboot(s) asked, the BMC got 'hard off'"),
        (commands(), 1, "1 reboot(s) asked, the BMC got ''"),
        (commands(("on", "r0")), 0, "0 reboot(s) asked, the BMC got 'on'"),
    ],
)
def test_a_reboot_served_twice_or_by_two_replicas_is_named(
    journal: list[Command], asked: int, why: str | None
) -> None:
    assert served_twice_or_by_two(journal, asked) == why


def test_the_hosts_that_moved_are_those_whose_owner_differs() -> None:
    before = {"a": "r0", "b": "r1", "c": "r2", "d": None}
    after = {"a": "r0", "b": "r3", "c": "r2", "d": "r3", "e": "r3"}
    assert moved_hosts(before, after) == {"b", "d", "e"}
    assert moved_hosts(before, before) == set()


def test_shares_list_every_replica_and_leave_unowned_hosts_out() -> None:
    owners = {"a": "r0", "b": "r0", "c": "r1", "d": None}
    assert shares(owners, ["r0", "r1", "r2"]) == {"r0": 2, "r1": 1, "r2": 0}


def test_cpu_ratios_are_against_one_nth_of_the_single_replica() -> None:
    assert cpu_ratios({"r0": 5.0, "r1": 6.0}, 10.0) == {"r0": 1.0, "r1": 1.2}
    assert cpu_ratios({}, 10.0) == {}
    assert math.isnan(cpu_ratios({"r0": 1.0}, 0.0)["r0"])


def test_p99_stays_within_the_samples() -> None:
    assert p99([15.0, 17.0, 21.0]) <= 21.0
    assert p99([float(i) for i in range(1, 61)]) == pytest.approx(59.41)
    assert p99([3.0]) == 3.0
    assert math.isnan(p99([]))


def test_the_report_says_the_failover_of_a_replica_and_of_the_leader_apart() -> None:
    """The leader's own failover (the sharder dies with it) on a line of its own, against
    the same target; none when no leader was killed."""
    results = Results(cpu={1: {"r0": 10.0}}, reboots={1: [100.0]})
    results.failover, results.trials = [16.0, 17.5], [("r1", 17.5)]
    results.leader_failover, results.leader_trials = [19.0, 24.0], [("r0", 24.0)]
    results.balance = {4: Balance.of({"r0": 1, "r1": 1}, "r0")}
    lines = report(2, results, argparse.Namespace(window=120.0))
    replica = next(line for line in lines if line.startswith("failover, kill -9"))
    leader = next(line for line in lines if line.startswith("failover of the leader"))
    assert "1 trials, 2 reboots" in replica
    assert replica.endswith(": met)")
    assert "1 trials, 2 reboots" in leader
    assert leader.endswith(": NOT met)")
    results.failover, results.trials = [], []
    assert any(
        line.endswith("not run (--trials 0)")
        for line in report(2, results, argparse.Namespace(window=120.0))
    )
    results.leader_failover, results.leader_trials = [], []
    assert not any(
        "of the leader" in line for line in report(2, results, argparse.Namespace(window=120.0))
    )


def test_the_leader_is_the_replica_with_a_share_count_not_one_that_declares_it() -> None:
    """Every replica's /metrics declares metalmend_shard_replicas_live (HELP, TYPE); only
    the leader's has a sample. Matching the name alone took the first replica for the
    leader whichever led."""
    declared = (
        "# HELP metalmend_shard_replicas_live Replicas of metalmend run whose shard Lease\n"
        "# TYPE metalmend_shard_replicas_live gauge\n"
        'metalmend_shard_hosts_other{replica="r1"} 3.0\n'
    )
    assert not counts_shares(declared)
    assert counts_shares(declared + "metalmend_shard_replicas_live 4.0\n")


def test_the_replicas_cpu_together_and_the_canary_are_set_beside_one_replicas() -> None:
    results = Results(
        cpu={1: {"r0": 40.0}, 4: {"r0": 14.0, "r1": 13.0, "r2": 12.0, "r3": 11.0}},
        canary={1: 10.0, 4: 12.5},
    )
    assert together(results) == [
        "at 1 replica(s): the replicas' CPU together 40.0 % of a core (1.00x one replica's);"
        " the canary, a fixed unit of work timed in the window, 10.00 ms of CPU (1.00x)",
        "at 4 replica(s): the replicas' CPU together 50.0 % of a core (1.25x one replica's);"
        " the canary, a fixed unit of work timed in the window, 12.50 ms of CPU (1.25x)",
    ]
    assert together(Results(cpu={2: {"r0": 1.0, "r1": 1.0}})) == []  # nothing to set beside


def test_the_replicas_memory_is_set_beside_1_n_of_one_replicas() -> None:
    results = Results(memory={1: {"r0": 400.0}, 4: {"r0": 200.0, "r1": 150.0}}, leaders={4: "r0"})
    assert memory(results) == [
        "memory at rest, 1 replica: 400 MiB resident",
        "memory at rest, 4 replicas: r0* 200 MiB (2.00x), r1 150 MiB (1.50x) beside 1/4 of one"
        " replica's, 100 MiB",
    ]
    assert memory(Results(memory={2: {"r0": 1.0}})) == []  # nothing to set beside


def test_the_leaders_node_heartbeats_are_read_from_its_metrics() -> None:
    text = (
        "# TYPE metalmend_informer_events_total counter\n"
        'metalmend_informer_events_total{resource="nodes",type="BOOKMARK"} 7.0\n'
        'metalmend_informer_events_total{resource="nodes",type="MODIFIED"} 10000.0\n'
    )
    assert node_events(text) == 10000.0
    assert node_events("") == 0.0  # a replica that does not watch the Nodes


def test_the_report_says_how_many_heartbeats_each_window_held() -> None:
    results = Results(cpu={1: {"r0": 10.0}}, reboots={1: [100.0]}, node_events={1: 5000.0})
    lines = report(2, results, argparse.Namespace(window=320.0))
    assert "Node heartbeats the leader received in each CPU window" in "\n".join(lines)


def test_the_canary_times_its_unit_in_cpu_of_this_thread() -> None:
    assert canary_ms(lambda: None) >= 0.0
    assert canary_ms() > 0.0


def test_the_wake_cost_report_sets_each_gap_beside_back_to_back() -> None:
    from benchmarks.wake_cost import report, unit_cpu_ms

    lines = report({0.0: [1.8, 2.0], 32.0: [2.2, 2.2], 500.0: [2.3, 2.4]})
    assert lines == [
        "a fixed unit of work, CPU per unit (median) after a sleep of:",
        "  back to back: 1.800, 2.000 ms (1.00x back to back)",
        "         32 ms: 2.200, 2.200 ms (1.16x back to back)",
        "        500 ms: 2.300, 2.400 ms (1.24x back to back)",
    ]
    ran: list[int] = []
    assert unit_cpu_ms(0.0, 3, lambda: ran.append(1)) >= 0.0
    assert ran == [1, 1, 1]


@pytest.mark.parametrize(("spread", "shortest", "longest"), [(False, 300, 310), (True, 150, 450)])
def test_the_labs_node_heartbeats_are_spread_over_the_cycle_when_asked(
    tmp_path: Path, spread: bool, shortest: int, longest: int
) -> None:
    """Spread: the same 5-minute mean, each gap from half to one and a half of it, so that
    Nodes initialised together do not heartbeat together (benchmarks.scale.kubelet_cadence)."""
    from benchmarks.scale import kubelet_cadence

    stage = tmp_path / "node-heartbeat-with-lease.yaml"
    stage.write_text(
        yaml.safe_dump({"metadata": {"name": "node-heartbeat-with-lease"}, "spec": {}})
    )
    (copy,) = kubelet_cadence([stage], tmp_path, spread)
    delay = yaml.safe_load(copy.read_text())["spec"]["delay"]
    assert delay == {
        "durationMilliseconds": shortest * 1000,
        "jitterDurationMilliseconds": longest * 1000,
    }


def test_balance_says_the_busiest_against_the_mean_and_against_its_fair_share() -> None:
    """The leader holds LEADER_WEIGHT of a share: the others more than the mean by design,
    each at its fair share when the ring hits its aim."""
    held = Balance.of({"r0": 300, "r1": 400, "r2": 400}, "r0")
    assert held.of_mean == pytest.approx(400 / (1100 / 3))
    assert held.of_share == pytest.approx(1.0)
    said = held.says(1100)
    assert (
        "the busiest holds 1.09x the mean (300..400 hosts, mean 367), 1.00x its fair share" in said
    )
    assert "the leader r0 at 0.75 of a share holds 300" in said
    assert "leader" not in Balance.of({"r1": 5, "r2": 5}, None).says(10)


def test_the_simulation_assigns_with_the_leader_lighter_and_reports_both_balances() -> None:
    lines = simulate(hosts=2000, replicas=(4,))
    assert any(line.startswith("balance at 4 replicas: the busiest holds") for line in lines)
    assert any("fair share" in line for line in lines)


def test_phases_split_each_reboot_and_the_leaders_hosts_from_the_others() -> None:
    sampled = [("a", 100.0, 50.0, 400.0), ("b", 20.0, 30.0, 150.0)]
    said = phases(sampled, {"a": "r0", "b": "r1"}, "r0")
    assert "request -> off p50 60 / p99 99 ms" in said
    assert "off -> on p50 175 / p99 248 ms" in said  # 250 and 100
    assert "on -> status seen p50 40 / p99 50 ms" in said
    assert "p99 of the leader's hosts 400 ms (1), of the others' 150 ms (1)" in said
    assert "leader" not in phases(sampled, {}, None)


def test_a_reboot_handed_over_between_its_power_off_and_on_is_one_replica_at_a_time() -> None:
    """r0 sent the power-off, logged letting the host go, then r1 sent the power-on: a
    hand-over. A hand-over logged after the power-on, or by the other replica, proves
    nothing: counted as two at once."""
    journal = [Command(10.0, "hard off", "r0"), Command(12.0, "on", "r1")]
    assert served_twice_or_by_two(journal, 1, {"r0": [11.0]}) is None
    assert handed_mid_reboot(journal, {"r0": [11.0]})
    for handed in ({"r0": [12.5]}, {"r1": [11.0]}, {"r0": [9.0]}, {}):
        assert served_twice_or_by_two(journal, 1, handed) is not None, handed
        assert not handed_mid_reboot(journal, handed)
    same = [Command(10.0, "hard off", "r0"), Command(12.0, "on", "r0")]
    assert served_twice_or_by_two(same, 1, {"r0": [11.0]}) is None
    assert not handed_mid_reboot(same, {"r0": [11.0]}), "one replica: no hand-over"


def test_hand_overs_are_read_from_a_replicas_log_with_their_time() -> None:
    import time

    log = (
        "2026-11-30T09:55:01.250 INFO metalmend.controllers.hostpower: host handed over"
        " host=bench/worker-7 replica=r1\n"
        "2026-11-30T09:55:02.000 INFO metalmend.controllers.hostpower: power off host=bench/worker-7\n"
        "2026-11-30T09:55:03.500 INFO metalmend.controllers.hostpower: host handed over"
        " host=bench/worker-7 replica=r1\n"
    )
    base = time.mktime(time.strptime("2026-11-30T09:55:01", "%Y-%m-%dT%H:%M:%S"))
    assert handovers_in(log) == {"bench/worker-7": [base + 0.25, base + 2.5]}
    assert handovers_in("") == {}


def test_cpu_pressure_is_the_some_total_and_none_without_psi() -> None:
    text = (
        "some avg10=19.48 avg60=26.33 avg300=34.90 total=15681548993\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    assert cpu_pressure_us(text) == 15681548993.0
    assert cpu_pressure_us("") is None


def test_contention_says_the_share_of_time_waited_and_each_replicas_wait_a_second() -> None:
    before = Contention(100.0, 1_000_000.0, {"r0": 1.0, "r1": 2.0})
    after = Contention(110.0, 4_000_000.0, {"r0": 1.5, "r1": 2.1})
    said = before.until(after)
    assert "some task waited for a core 30% of the time (PSI)" in said
    assert "each replica's wait for a core, ms a second: r0 50, r1 10" in said
    assert "no PSI" in Contention(0.0, None, {}).until(Contention(1.0, None, {}))
