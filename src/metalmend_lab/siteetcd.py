"""The lab's site etcd: a real 3-member etcd cluster whose members live on lab hosts, and
the design that declares it (the ``promenade/EtcdClusters/v1`` document metalmend's
remove-etcd and etcd health read, docs/teardown.md).

- ``metalmend lab up --hosts N`` (N >= 3) plans one member on each of the first three
  hosts (``plan``): the same upstream etcd build as the lab's control plane, on 127.0.0.1
  ports, each with its data directory on its host's OS drive
  (``.lab/drives/<host>/os/etcd``, ``lab.drives``): erasing that drive (destroy node)
  erases the member's data with it, so a wiped host's member cannot come back with stale
  data; its data drives are not touched. Logs stay in ``.lab/hardware/etcd/``.
- The hardware process runs each member bound to its host, as it runs the host's kubelet
  (``EtcdMember``, driven by the kubelet simulator's view of the power): the member runs
  while the host is on, booted and not hung; a power-off kills it (SIGKILL: power loss is
  not a clean shutdown); a hung kernel freezes it (SIGSTOP: its ports still accept
  connections but nothing answers, as a hung host looks to its peers); ``recover`` thaws
  it; a new boot starts it again from the same data directory. A member that was removed
  from its cluster refuses to start from its old data (etcd's own behaviour): it stays
  down, as on a real host, until someone adds it back. A member without data (its OS drive
  wiped) starts only once etcd's member list shows it added and not started, then joins
  the existing cluster (``decide_start``); only the founding members ``lab up`` flags on
  their OS drives start a new cluster.
- The lab serves the design documents over https on 127.0.0.1 (``lab.designserver``, a
  certificate of the lab's CA): ``design_url`` is the design reference to give remove-etcd,
  the health endpoint and decommission; ``lab status`` shows it. The lab's serve allows
  that URL (``design_prefix``) and trusts the lab's CA for it (``serve.design_ca_bundle``).
  The lab's etcd runs without TLS and without client authentication, on loopback only;
  the document therefore declares no credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import ssl
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import yaml

from metalmend.teardown.etcd.client import EtcdClient, EtcdError, Member
from metalmend_lab import drives
from metalmend_lab.controlplane import LOOPBACK, Component, free_port
from metalmend_lab.inventory import HostSpec
from metalmend_lab.osdrive import OsDrive
from metalmend_lab.pki import KeyPair

if TYPE_CHECKING:
    from metalmend_lab.kubeletsim import KubeletSim

log = logging.getLogger("metalmend_lab.siteetcd")

CLUSTER = "kubernetes"  # the cluster's identifier in the design
MEMBERS = 3
THRESHOLD = 2  # the site's minimum functionality: a quorum of 3
DESIGN_PATH = "/api/v1.0/revisions/1/rendered-documents"  # Deckhand's shape of URL


@dataclass
class MemberPlan:
    host: str
    client_port: int
    peer_port: int
    data_dir: str
    log_file: str = ""  # off the drive: a wipe must not take the evidence with it

    @property
    def client_url(self) -> str:
        return f"http://{LOOPBACK}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{LOOPBACK}:{self.peer_port}"

    @property
    def log_path(self) -> Path:
        if self.log_file:
            return Path(self.log_file)
        return Path(self.data_dir).parent / f"{self.host}.log"  # plans written before logs moved


@dataclass
class SitePlan:
    etcd: str  # the binary
    members: list[MemberPlan]
    design_port: int
    token: str = "metalmend-lab-site-etcd"

    @property
    def design_url(self) -> str:
        return f"https://{LOOPBACK}:{self.design_port}{DESIGN_PATH}"

    @property
    def design_prefix(self) -> str:
        """What the lab's serve allows (serve.design_url_prefixes): this server only."""
        return f"https://{LOOPBACK}:{self.design_port}/"

    @property
    def initial_cluster(self) -> str:
        return ",".join(f"{m.host}={m.peer_url}" for m in self.members)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def read(cls, path: Path) -> SitePlan | None:
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        members = [MemberPlan(**m) for m in data.pop("members")]
        return cls(members=members, **data)


def plan_path(lab_dir: Path) -> Path:
    return lab_dir / "hardware" / "siteetcd.json"


def design_path(lab_dir: Path) -> Path:
    return lab_dir / "hardware" / "design.yaml"


def plan(lab_dir: Path, hosts: list[HostSpec], etcd: Path) -> SitePlan | None:
    """One member on each of the first three hosts; None with fewer than three hosts (a
    cluster that can lose a member needs three). Writes the plan and the design."""
    if len(hosts) < MEMBERS:
        return None
    site = SitePlan(
        etcd=str(etcd),
        members=[
            MemberPlan(
                h.name,
                free_port(),
                free_port(),
                data_dir=str(drives.os_drive_dir(lab_dir, h.name) / "etcd"),
                log_file=str(lab_dir / "hardware" / "etcd" / f"{h.name}.log"),
            )
            for h in hosts[:MEMBERS]
        ],
        design_port=free_port(),
    )
    for member in site.members:
        # These members found the cluster; a member whose OS drive is wiped loses the flag
        # with its data, and waits to be added back instead (decide_start).
        OsDrive.of(lab_dir, member.host).mark_etcd_genesis()
    site.write(plan_path(lab_dir))
    design_path(lab_dir).write_text(design_documents(site))
    return site


def design_documents(site: SitePlan) -> str:
    """The site's design as the lab serves it: one EtcdClusters document."""
    return yaml.safe_dump_all([design_document(site)], sort_keys=False)


def design_document(site: SitePlan) -> dict[str, Any]:
    """The site's ``promenade/EtcdClusters/v1`` document."""
    return {
        "schema": "promenade/EtcdClusters/v1",
        "metadata": {
            "schema": "metadata/Document/v1",
            "name": "etcd-clusters",
            "layeringDefinition": {"abstract": False, "layer": "site"},
            "storagePolicy": "cleartext",
        },
        "data": {
            "clusters": [
                {
                    "name": CLUSTER,
                    # no credentials: the lab's etcd takes plain http on loopback
                    "minimum_functionality": {"healthy_members": THRESHOLD},
                    "members": [
                        {
                            "node": m.host,
                            "name": m.host,
                            "client_urls": [m.client_url],
                            "peer_urls": [m.peer_url],
                        }
                        for m in site.members
                    ],
                }
            ]
        },
    }


# ---- how a member starts (pure) ------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """Start etcd with these bootstrap flags (etcd ignores them once it has data)."""

    cluster_state: str  # --initial-cluster-state: new or existing
    initial_cluster: str
    why: str


@dataclass(frozen=True)
class Wait:
    """Do not start: ``why`` says what would let it start."""

    why: str


def decide_start(
    site: SitePlan,
    member: MemberPlan,
    has_data: bool,
    genesis: bool,
    listed: Sequence[Member] | None,
) -> Start | Wait:
    """How the member on a host that has just booted starts, if at all.

    With data it restarts from it. Without, only a founding member (``genesis``: seeded by
    ``lab up``) starts a new cluster; any other, a wiped server's, joins the cluster
    (``existing``) only once the cluster's member list (``listed``; None: no member
    answered) shows it added and not started, as etcd's runtime reconfiguration asks (a
    MemberAdd with its peer URL, which metalmend's redeploy_server does). Never a new
    cluster of its own: that would be a second cluster under the same name."""
    if has_data:
        return Start("new", site.initial_cluster, "from its data directory")
    if genesis:
        return Start("new", site.initial_cluster, "founding the cluster")
    if listed is None:
        return Wait("empty data directory; no member of the cluster answers its member list")
    me = next((m for m in listed if member.peer_url in m.peer_urls), None)
    if me is None:
        return Wait(
            f"empty data directory and not in the cluster's member list: waiting for a"
            f" MemberAdd of {member.peer_url}"
        )
    if me.name:
        return Wait(
            f"empty data directory, but the member list has member {me.name} started with"
            f" {member.peer_url}: it must be removed and added again"
        )
    return Start("existing", joining_cluster(site, member, listed), "joining the cluster")


def joining_cluster(site: SitePlan, member: MemberPlan, listed: Sequence[Member]) -> str:
    """``--initial-cluster`` for a member joining: every member of the list, by name, with
    every peer URL (etcd checks them against the cluster's). A member not started yet has
    no name: it is this one, or one the plan knows by its peer URL, or named by its id."""
    planned = {m.peer_url: m.host for m in site.members}
    entries = []
    for found in listed:
        name = found.name
        if not name:
            known = (planned.get(u) for u in found.peer_urls)
            name = next((n for n in known if n), f"unstarted-{found.id:x}")
            if member.peer_url in found.peer_urls:
                name = member.host
        entries += [f"{name}={url}" for url in found.peer_urls]
    return ",".join(entries)


def has_data(data_dir: Path) -> bool:
    """etcd's own test: a write-ahead log in the data directory."""
    return any((data_dir / "member" / "wal").glob("*.wal"))


# ---- a member, bound to its host (runs in the hardware process) ---------------------------


class EtcdMember:
    """One etcd member on one lab host, following the host's kubelet simulator's view of
    the power: running while ``running``, frozen while ``hung``, killed while ``off`` or
    while its OS is gone; started, at each boot, as ``decide_start`` says."""

    def __init__(self, site: SitePlan, member: MemberPlan, kubelet: KubeletSim) -> None:
        self.site = site
        self.member = member
        self.kubelet = kubelet
        # The data directory is on the host's OS drive (plan): so is the genesis flag.
        self.os_drive = OsDrive(Path(member.data_dir).parent)
        self.component: Component | None = None
        self.boot: int | None = None  # the boot this member's process was started in
        self.state = "off"  # off, waiting, running, frozen, exited
        self.frozen = False
        self.waiting = ""  # why it is not started (logged once per reason)

    def argv(self, start: Start | None = None) -> list[str]:
        m = self.member
        start = start or Start("new", self.site.initial_cluster, "")
        return [
            self.site.etcd,
            f"--name={m.host}",
            f"--data-dir={m.data_dir}",
            f"--listen-client-urls={m.client_url}",
            f"--advertise-client-urls={m.client_url}",
            f"--listen-peer-urls={m.peer_url}",
            f"--initial-advertise-peer-urls={m.peer_url}",
            f"--initial-cluster={start.initial_cluster}",
            f"--initial-cluster-state={start.cluster_state}",  # ignored once it has data
            f"--initial-cluster-token={self.site.token}",
            "--unsafe-no-fsync",  # a lab cluster trades durability for speed
            "--log-level=warn",
        ]

    def _signal(self, sig: signal.Signals) -> None:
        process = self.component.process if self.component else None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(sig)

    def _kill(self) -> None:
        if self.component is not None:
            self._signal(signal.SIGKILL)
            if self.component.process is not None:
                self.component.process.wait()
            self.component.stop()
            self.component = None
        self.frozen = False

    def beat(self, listed: Sequence[Member] | None = None) -> None:
        """Bring the process in line with the host (called every heartbeat); ``listed``:
        the cluster's member list, when a start needs it (``wants_member_list``)."""
        state, boot = self.kubelet.state, self.kubelet.boot
        if state in ("off", "no-os") or (self.boot is not None and boot != self.boot):
            if self.component is not None:
                log.info("etcd member %s: host powered off, member killed", self.member.host)
            self._kill()
            self.boot = None
            self.state = "off" if state in ("off", "booting", "no-os") else self.state
        if state == "hung":
            if self.component is not None and not self.frozen:
                self._signal(signal.SIGSTOP)
                self.frozen = True
                log.info("etcd member %s: host hung, member frozen", self.member.host)
            self.state = "frozen" if self.component is not None else self.state
            return
        if state != "running":
            return
        if self.frozen:
            self._signal(signal.SIGCONT)
            self.frozen = False
        if self.component is None and self.boot is None:
            self._start(boot, listed)
        if self.component is not None and not self.component.running():
            # e.g. removed from the cluster: etcd will not start from its old data
            log.warning(
                "etcd member %s exited with %s; not restarted before the next boot",
                self.member.host, self.component.exit_code,
            )  # fmt: skip
            self.component.stop()
            self.component = None
        if self.component is not None and has_data(Path(self.member.data_dir)):
            self.os_drive.clear_etcd_genesis()  # founded or joined: never again "new"
        if self.component is not None:
            self.state = "running"
        elif self.boot is not None:
            self.state = "exited"

    def _start(self, boot: int | None, listed: Sequence[Member] | None) -> None:
        data_dir = Path(self.member.data_dir)
        decision = decide_start(
            self.site, self.member, has_data(data_dir), self.os_drive.etcd_genesis, listed
        )
        if isinstance(decision, Wait):
            if decision.why != self.waiting:
                log.info("etcd member %s not started: %s", self.member.host, decision.why)
                self.waiting = decision.why
            self.state = "waiting"
            return
        self.waiting = ""
        self.boot = boot
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        log_path = self.member.log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.component = Component(f"etcd-{self.member.host}", self.argv(decision), log_path)
        self.component.start()
        log.info(
            "etcd member %s started (boot %s, %s, --initial-cluster-state %s)",
            self.member.host, boot, decision.why, decision.cluster_state,
        )  # fmt: skip

    def wants_member_list(self) -> bool:
        """About to start without data and without the genesis flag: only the cluster's
        member list says whether it may (decide_start)."""
        return (
            self.component is None
            and self.boot is None
            and self.kubelet.state == "running"
            and not has_data(Path(self.member.data_dir))
            and not self.os_drive.etcd_genesis
        )

    async def member_list(self, etcd: EtcdClient) -> list[Member] | None:
        """The cluster's member list from the first other member that gives it."""
        for other in self.site.members:
            if other.host == self.member.host:
                continue
            with contextlib.suppress(EtcdError):
                return await etcd.member_list(other.client_url)
        return None

    async def run(self) -> None:
        async with EtcdClient(deadline=1.0) as etcd:
            try:
                while True:
                    listed = await self.member_list(etcd) if self.wants_member_list() else None
                    await asyncio.to_thread(self.beat, listed)
                    await asyncio.sleep(0.2)
            finally:
                self._kill()


def members_for(lab_dir: Path, kubelets: dict[str, KubeletSim]) -> list[EtcdMember]:
    """The members of the lab's plan, each bound to its host's kubelet (none planned: [])."""
    site = SitePlan.read(plan_path(lab_dir))
    if site is None:
        return []
    return [EtcdMember(site, m, kubelets[m.host]) for m in site.members if m.host in kubelets]


# ---- the lab supervisor's side -----------------------------------------------------------


def design_server_argv(lab_dir: Path, site: SitePlan, serving: KeyPair) -> list[str]:
    return [
        sys.executable, "-m", "metalmend_lab.designserver",
        str(design_path(lab_dir)), str(site.design_port), DESIGN_PATH,
        str(serving.cert), str(serving.key),
    ]  # fmt: skip


def design_served(site: SitePlan, ca: Path) -> bool:
    try:
        trusted = ssl.create_default_context(cafile=str(ca))
        return httpx.get(site.design_url, verify=trusted, timeout=1).status_code == 200
    except (httpx.HTTPError, OSError):
        return False


def member_healthy(member: MemberPlan, timeout: float = 1.0) -> bool:
    try:
        answer = httpx.get(f"{member.client_url}/health", timeout=timeout)
    except httpx.HTTPError:
        return False
    return answer.status_code == 200 and '"health":"true"' in answer.text


def wait_healthy(site: SitePlan, within: float = 60.0) -> None:
    """Return once every member answers healthy (the hosts boot, then the members elect)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if all(member_healthy(m) for m in site.members):
            return
        time.sleep(0.2)
    raise RuntimeError(
        f"the lab's site etcd was not healthy within {within:.0f}s"
        f" (logs: {site.members[0].log_path.parent})"
    )


@dataclass
class MemberStatus:
    host: str
    client_url: str
    process: str  # as the hardware process reports it: off, running, frozen, exited
    healthy: bool


@dataclass
class SiteStatus:
    design_ref: str
    cluster: str
    threshold: int
    members: list[MemberStatus]


def status(lab_dir: Path, hardware: dict[str, dict[str, Any]]) -> SiteStatus | None:
    """For ``lab status``: each member as the hardware reports it, and its own /health."""
    site = SitePlan.read(plan_path(lab_dir))
    if site is None:
        return None
    return SiteStatus(
        design_ref=site.design_url,
        cluster=CLUSTER,
        threshold=THRESHOLD,
        members=[
            MemberStatus(
                m.host,
                m.client_url,
                str(hardware.get(m.host, {}).get("etcd", "-")),
                member_healthy(m, 0.5),
            )
            for m in site.members
        ],
    )
