"""A redeployed server's etcd member brought back into a real 3-member etcd cluster
(metalmend.teardown.etcd.members.add_member; docs/site-actions.md, "redeploy_server"), with the
process "killed" right after "member add requested" is recorded and again right after
the add: the restarted call finds the member by its peer URLs and never adds it twice.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from metalmend.teardown.etcd import members
from metalmend.teardown.etcd.client import EtcdClient
from metalmend.teardown.etcd.design import ClusterDesign, Design, MemberDesign
from metalmend_lab.assets import find_binaries
from metalmend_lab.controlplane import LOOPBACK, Component, free_port
from tests.support import Deadline

TOKEN = "metalmend-redeploy-rejoin"


class Member:
    def __init__(self, etcd: Path, name: str, workdir: Path) -> None:
        self.etcd, self.name = etcd, name
        self.client_url = f"http://{LOOPBACK}:{free_port()}"
        self.peer_url = f"http://{LOOPBACK}:{free_port()}"
        self.data = workdir / name
        self.log = workdir / f"{name}.log"
        self.process: Component | None = None

    def start(self, initial_cluster: str, state: str) -> None:
        argv = [
            str(self.etcd), f"--name={self.name}", f"--data-dir={self.data}",
            f"--listen-client-urls={self.client_url}", f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={self.peer_url}", f"--initial-advertise-peer-urls={self.peer_url}",
            f"--initial-cluster={initial_cluster}", f"--initial-cluster-state={state}",
            f"--initial-cluster-token={TOKEN}", "--unsafe-no-fsync", "--log-level=warn",
        ]  # fmt: skip
        self.process = Component(f"etcd-{self.name}", argv, self.log)
        self.process.start()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def healthy(self) -> bool:
        try:
            answer = httpx.get(f"{self.client_url}/health", timeout=1)
        except httpx.HTTPError:
            return False
        return answer.status_code == 200 and answer.json().get("health") == "true"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Member]]:
    etcd = find_binaries().etcd
    workdir = tmp_path_factory.mktemp("site-etcd")
    found = [Member(etcd, name, workdir) for name in ("a", "b", "c")]
    initial = ",".join(f"{m.name}={m.peer_url}" for m in found)
    for member in found:
        member.start(initial, "new")
    try:
        wait_for(lambda: all(m.healthy() for m in found), "the three members healthy")
        yield found
    finally:
        for member in found:
            member.stop()


def wait_for(check: object, what: str, within: float = 60.0) -> None:
    deadline = Deadline(within)
    while not check():  # type: ignore[operator]
        assert not deadline.expired(), f"timed out waiting for {what}"
        time.sleep(0.1)


def design_of(found: list[Member]) -> Design:
    return Design(
        "test",
        (
            ClusterDesign(
                "kubernetes",
                2,
                tuple(MemberDesign(m.name, m.name, (m.client_url,), (m.peer_url,)) for m in found),
            ),
        ),
    )


class Killed(Exception):
    """The process dies here (raised out of a hook, as a SIGKILL would end the call)."""


async def test_a_member_comes_back_once_across_two_kills(cluster: list[Member]) -> None:
    design = design_of(cluster)
    a, c = cluster[0], cluster[2]
    # The decommission of c's node: its member removed, the server wiped.
    [removed] = await members.remove_member(design, "c", timeout=30)
    assert removed.ok, removed.lines
    c.stop()
    shutil.rmtree(c.data)
    requested: list[str] = []

    async def recorded_then_killed(cluster_name: str) -> None:
        requested.append(cluster_name)
        raise Killed  # after the record, before the MemberAdd is sent

    async def quiet(line: str) -> None:
        del line

    with pytest.raises(Killed):
        await members.add_member(
            design, "c", members.AddHooks(recorded_then_killed, quiet), timeout=30, poll=0.2
        )

    async def recorded(cluster_name: str) -> None:
        requested.append(cluster_name)

    async def killed_once_added(line: str) -> None:
        if " added for c " in line:
            raise Killed  # the add went through; the process dies before anything else

    with pytest.raises(Killed):
        await members.add_member(
            design, "c", members.AddHooks(recorded, killed_once_added), timeout=30, poll=0.2
        )
    assert requested == ["kubernetes", "kubernetes"]

    # Restarted: the member is found by its peer URL (added, not started) and waited for
    # while the rejoining server starts it with an empty data dir.
    back = asyncio.create_task(
        members.add_member(design, "c", members.AddHooks(recorded, quiet), timeout=60, poll=0.2)
    )
    await asyncio.sleep(0.5)
    initial = ",".join(f"{m.name}={m.peer_url}" for m in cluster)
    c.start(initial, "existing")
    [outcome] = await back
    assert outcome.ok, outcome.lines
    assert requested == ["kubernetes", "kubernetes"]  # no third request: no second add
    async with EtcdClient() as client:
        listed = await client.member_list(a.client_url)
    assert sorted(m.name for m in listed) == ["a", "b", "c"]
    assert [m.peer_urls for m in listed].count((c.peer_url,)) == 1


async def test_a_member_added_and_never_started_is_withdrawn_when_the_wait_ends(
    cluster: list[Member], tmp_path: Path
) -> None:
    # A fourth server the design places a member on, which never boots: the member is
    # added (three healthy of four is still a quorum), then taken out again, so that the
    # cluster is not left needing every one of its three running members.
    ghost = Member(cluster[0].etcd, "d", tmp_path)
    design = design_of([*cluster, ghost])
    lines: list[str] = []

    async def recorded(cluster_name: str) -> None:
        del cluster_name

    async def heard(line: str) -> None:
        lines.append(line)

    # etcd refuses a MemberAdd (503 unhealthy cluster) for 5 s after a peer connected (c
    # just rejoined): asked again until then, as any add is.
    [outcome] = await members.add_member(
        design, "d", members.AddHooks(recorded, heard), timeout=8, poll=0.2
    )
    assert not outcome.ok
    assert any(" added for d " in line for line in lines), lines
    assert "removed again" in outcome.lines[-1]
    async with EtcdClient() as client:
        listed = await client.member_list(cluster[0].client_url)
    assert sorted(m.name for m in listed) == ["a", "b", "c"]
