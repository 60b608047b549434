"""A Slurm mini-cluster on top of tests/lab/cluster.py: the same N namespace nodes, each also
running slurmd inside its own network, mount and UTS namespaces (so a task on node02 writes node02's
/tmp), slurmctld and a private munged in this machine's namespaces. Debian's slurm-wlm 22.05 and
munge.

    with SlurmCluster(8, subnet=subnets.subnet("fanout_slurm")) as c:   # tests/lab/subnets.py
        c.env                       # SLURM_CONF for salloc/srun/sbcast/scontrol
        c.salloc(["bash", "x.sh"])  # argv to run a command inside an allocation of every node
        c.kill_node("node07")       # slurmd, sshd and tasks of the node, at once
        c.restart_node("node07")    # back, and resumed

What it took (see docs/fanout.md): `SlurmctldHost` is this machine's real hostname with the
bridge's address; munged runs privately (its own key, socket, pid and log under the cluster's dir,
whose parents are world-executable); slurmd is started by `nsenter --net=NS unshare -m -u` (an `ip
netns exec` would hide the cgroup mount and slurmd would not start), after its spool dir exists;
`ProctrackType=proctrack/linuxproc`, `TaskPlugin=task/none`; `TreeWidth` small, so Slurm's
messages (and sbcast's file data) go through the nodes as a tree even with 8 nodes; short
`SlurmdTimeout`, so a node taken down is noticed in seconds, not minutes. After a job lost a node,
Slurm holds some of its other nodes `completing` for ~45 s: `settle()` ends that (down, resume), so
one test's dead node does not fail the next test's allocation.

Readiness: munged before anything (it daemonizes once its socket is up), slurmd in each node
before its sshd, then the nodes' sshds (Cluster.wait_ready), slurmctld's listening socket, and
`settle()` until every node is idle. Each wait is bounded by ready.budget (it stretches with the
load) and logged. A start that fails at any point stops what it made: stop() cancels the jobs when
slurmctld still answers, stops slurmctld and munged, then the nodes (Cluster.stop, which also kills
any process left that names the cluster's dir).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional, Sequence

from compiler.fanout import expand

from .cluster import Cluster, _run, cluster_unavailable_reason
from .errors import LabError
from .netlab import _attempt, _reap
from .ready import LOG, backoff, budget, listening, load_note, log_tail, sleep_until

SLURMD_PORT = 6818  # inside each node's own network namespace: no other cluster's there
_CTLD_READY_S = 30  # slurmctld listening (idle machine; budget() stretches it)
_START_SETTLE_S = 60  # every node idle after the start (likewise)
_SETTLE_S = 90  # settle()'s default (likewise)
_CLIENT_T = 20  # scontrol, sinfo, squeue, scancel


def free_port() -> int:
    """A TCP port no socket of this machine's namespace holds now (the kernel's pick for port 0):
    each cluster's slurmctld gets its own, so two clusters (or a real slurmctld on 6817) never
    share one, and the readiness wait never takes another slurmctld's socket for this one's."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def slurm_unavailable_reason() -> Optional[str]:
    reason = cluster_unavailable_reason()
    if reason:
        return reason
    for tool in ("salloc", "srun", "sbcast", "scontrol", "sinfo"):
        if not shutil.which(tool):
            return f"{tool} is not installed (make system-packages: slurm-client)"
    for daemon in ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged"):
        if not Path(daemon).exists():
            return f"{daemon} is not installed (make system-packages: slurmctld slurmd munge)"
    return None


class SlurmCluster(Cluster):
    def __init__(self, n: int = 8, *, tree_width: int = 2, slurmd_timeout: int = 10, **kw) -> None:
        super().__init__(n, **kw)
        self.tree_width = tree_width
        self.slurmd_timeout = slurmd_timeout
        self.ctld: Optional[subprocess.Popen] = None
        # slurmctld listens in this machine's namespace, beside other clusters' and a real one:
        # a port free here, picked when the configuration is written (free_port)
        self.ctld_port = 0

    # -- layout
    @property
    def conf(self) -> Path:
        return self.dir / "slurm" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.dir / "munge" / "munge.socket"

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ, SLURM_CONF=str(self.conf))

    def salloc(
        self, argv: Sequence[str], *, nodes: Optional[str] = None, immediate: Optional[int] = None
    ) -> list[str]:
        """argv that runs `argv` here inside an allocation of the nodes (all by default).
        --no-kill: a node that fails does not end the allocation (the others finish).
        immediate: seconds salloc waits for the nodes (default budget(20): longer under load)."""
        ns = nodes or self.nodeset
        if immediate is None:
            immediate = int(budget(20))
        return [
            "salloc",
            "-N",
            str(len(expand(ns))),
            "-w",
            ns,
            "--no-kill",
            f"--immediate={immediate}",
            "--time=30",
            "-J",
            "rbfan-test",
            *argv,
        ]

    # -- lifecycle (start(), stop() and the cleanup of a failed start: Cluster)
    def _start(self) -> None:
        self._claim()
        self._start_munge()
        self._write_conf()
        for name in self.names:
            (self.dir / "slurm" / name / "spool").mkdir(parents=True)
        self.node_start = [
            f"/usr/sbin/slurmd -f {self.conf} -N {{name}}"
        ]  # daemonizes; its log names the node
        super()._start()
        self._start_ctld()
        self._wait_ctld()
        took = self.settle(timeout=_START_SETTLE_S)
        LOG.info(
            "slurm %s: every node idle %.1f s after slurmctld listened (%s)",
            self.runid,
            took,
            load_note(),
        )

    def _start_munge(self) -> None:
        d = self.dir / "munge"
        d.mkdir(mode=0o755)
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        _run(
            [
                "/usr/sbin/munged",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={d}/munged.pid",
                f"--log-file={d}/munged.log",
                f"--seed-file={d}/munged.seed",
            ]
        )

    def _write_conf(self) -> None:
        d = self.dir / "slurm"
        (d / "state").mkdir(parents=True)
        host = socket.gethostname()
        self.ctld_port = free_port()
        nodes = "\n".join(
            f"NodeName={n} NodeAddr={self.addr(n)} CPUs=1 RealMemory=256 State=UNKNOWN"
            for n in self.names
        )
        self.conf.write_text(f"""# written by tests/lab/slurm.py
ClusterName=rbfan
SlurmctldHost={host}({self.head_addr})
SlurmctldPort={self.ctld_port}
SlurmdPort={SLURMD_PORT}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/%n/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/%n/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/%n/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/linear
ReturnToService=2
TreeWidth={self.tree_width}
SlurmdTimeout={self.slurmd_timeout}
SlurmctldTimeout=30
MessageTimeout=10
InactiveLimit=0
KillWait=5
MinJobAge=30
{nodes}
PartitionName=rb Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    def _start_ctld(self) -> None:
        with open(self.dir / "slurm" / "slurmctld.out", "ab") as log:
            self.ctld = subprocess.Popen(
                ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self.env,
            )

    def _wait_ctld(self) -> None:
        """Until slurmctld listens on self.ctld_port (bounded by budget(_CTLD_READY_S)); at once
        when it exited."""
        t0 = time.monotonic()
        deadline = t0 + budget(_CTLD_READY_S)
        pause = backoff(0.05, 0.5)
        while self.ctld is not None and not listening(self.ctld.pid, self.ctld_port):
            if self.ctld.poll() is not None:
                out = log_tail(self.dir / "slurm" / "slurmctld.out", 600)
                raise LabError(
                    f"slurmctld exited rc={self.ctld.returncode}: "
                    f"{self._tail('slurmctld.log')} {out}"
                )
            if time.monotonic() >= deadline:
                raise LabError(
                    f"slurmctld not listening on {self.ctld_port} after "
                    f"{time.monotonic() - t0:.1f} s ({load_note()}): " + self._tail("slurmctld.log")
                )
            sleep_until(deadline, next(pause))
        LOG.info("slurm %s: slurmctld listening after %.2f s", self.runid, time.monotonic() - t0)

    def _client(self, argv: Sequence[str]) -> subprocess.CompletedProcess:
        """A Slurm client command; a timeout (a busy machine, a slurmctld not answering yet) is
        an rc of 124, not an exception: the waits above retry until their own deadline."""
        try:
            return subprocess.run(
                list(argv), capture_output=True, text=True, timeout=_CLIENT_T, env=self.env
            )
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(
                list(argv), 124, "", f"timed out after {_CLIENT_T} s"
            )

    def scontrol(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        r = self._client(["scontrol", *args])
        if check and r.returncode != 0:
            raise LabError(f"scontrol {' '.join(args)}: {r.stderr.strip()}")
        return r

    def states(self) -> dict[str, str]:
        r = self._client(["sinfo", "-h", "-N", "-o", "%N %T"])
        out = {}
        for line in r.stdout.splitlines():
            name, _, state = line.partition(" ")
            out[name] = state.strip()
        return out

    def _tail(self, rel: str, lines: int = 15) -> str:
        p = self.dir / "slurm" / rel
        return " | ".join(p.read_text(errors="replace").splitlines()[-lines:]) if p.exists() else ""

    def restart_node(self, name: str, binds: Sequence[tuple[str, str]] = ()) -> None:
        """sshd and slurmd again (with binds in the node's mount namespace), then resumed."""
        super().restart_node(name, binds)
        self.settle([name])

    def jobs(self) -> list[str]:
        return self._client(["squeue", "-h", "-o", "%T"]).stdout.split()

    def settle(
        self, names: Optional[Sequence[str]] = None, *, timeout: float = _SETTLE_S, grace: float = 5
    ) -> float:
        """Wait until the nodes (all by default) are idle, resuming what is down or drained. After
        a job lost a node, Slurm keeps some of the job's other nodes `completing` for ~45 s here
        (its terminate messages go through the node tree, which ran through the dead node): a node
        still completing after `grace` seconds, when no job is running, is set down and resumed,
        which ends that at once. A node left so by one test would fail the next test's salloc.
        timeout is for an idle machine: the wait is bounded by budget(timeout). Returns the
        seconds it took."""
        names = list(names or self.names)
        t0 = time.monotonic()
        limit = budget(timeout)
        deadline = t0 + limit
        completing_since: dict[str, float] = {}
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            if self.ctld is not None and self.ctld.poll() is not None:
                raise LabError("slurmctld exited: " + self._tail("slurmctld.log"))
            states = {n: s.rstrip("*") for n, s in self.states().items() if n in names}
            if len(states) == len(names) and all(s == "idle" for s in states.values()):
                return time.monotonic() - t0
            now = time.monotonic()
            running = [j for j in self.jobs() if j != "COMPLETING"]
            for name, state in states.items():
                if "down" in state or "drain" in state:
                    self.scontrol("update", f"nodename={name}", "state=resume", check=False)
                elif state.startswith("completing") and not running:
                    since = completing_since.setdefault(name, now)
                    if now - since > grace:
                        self.scontrol(
                            "update",
                            f"nodename={name}",
                            "state=down",
                            "reason=lab-settle",
                            check=False,
                        )
                        self.scontrol("update", f"nodename={name}", "state=resume", check=False)
                        completing_since.pop(name)
            sleep_until(deadline, 0.3)
        raise LabError(
            f"slurm nodes not idle after {time.monotonic() - t0:.0f} s (budget "
            f"{limit:.0f} s, {load_note()}): {states}, jobs {self.jobs()}; "
            + self._tail("slurmctld.log")
        )

    def _teardown(self, errors: list[str]) -> None:
        """Jobs cancelled (while slurmctld lives), slurmctld and munged stopped, then the nodes
        and whatever else names the cluster's dir (Cluster._teardown). Each part is tried even
        when one before it failed, and skipped when it was never made."""
        if self.ctld is not None and self.ctld.poll() is None:
            self._client(["scancel", "--full", "-u", "root"])
            self.ctld.terminate()
            _attempt(errors, _reap, self.ctld, "slurmctld")
        if (self.dir / "munge" / "munged.pid").exists():
            _attempt(
                errors,
                _run,
                ["/usr/sbin/munged", "--stop", f"--socket={self.munge_socket}"],
                check=False,
            )
        super()._teardown(errors)
