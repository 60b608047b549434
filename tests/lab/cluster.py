"""A mini-cluster on this machine for the fan-out tests: N nodes, each a network namespace on one
bridge with its own hostname, its own mount namespace (a private /tmp) and its own sshd, so that
`clush -w node[01-08]` reaches real, separate machines and writes on node02 stay on node02.

Addresses: the bridge (this machine) 10.213.X.1/24, node i 10.213.X.(10+i), X the /24 of the
cluster's user (tests/lab/subnets.py: each test module or benchmark has its own). The lab's
`unreachable 10.213.0.0/16` guard route is installed first, so nothing in the range leaves this
machine. Nodes have no default route. Every command here has a timeout; every wait is bounded,
and the readiness waits stretch with the machine's load (tests/lab/ready.py).

A run holds an flock on /run/rblab/rbfan-RUNID.lock and names its pid in /var/tmp/rbfan-RUNID/owner
while it lives; `cleanup_stale()` (at every start, and once per test session) removes what runs
that died left: namespaces, processes naming their dir (slurmctld, munged), bridges, dirs.

    with Cluster(8, subnet=subnets.subnet("fanout")) as c:
        c.ssh_config            # Host node01 ... blocks, for clush -o "-F PATH" and ssh -F
        c.node_tmp("node03")    # that node's private /tmp, seen from here
        c.restart_node("node03", binds=[(wrapper_dir, "/usr/local/sbin")])   # plant a fault
        c.kill_node("node07")   # every process in its namespace (sshd and sessions), at once

Slurm (slurmctld/slurmd/munge) on top of these nodes: tests/lab/slurm.py.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator, Optional, Sequence

from . import subnets
from .errors import LabError
from .netlab import (
    LOCK_DIR,
    _attempt,
    _flock_free,
    _kill_netns_processes,
    _reap,
    ensure_guard_route,
    list_netns,
    netns_pids,
)
from .ready import LOG, SshdWait, backoff, budget, load_note, sleep_until, wait_sshds
from .rundirs import ensure_run_dirs

SUBNET = subnets.subnet("cluster")  # a cluster whose user has no /24 of its own (by hand)
PREFIX = "rbfan"
RUN_ROOT = Path("/var/tmp")  # a run's files: RUN_ROOT/rbfan-RUNID (named in daemons' argv)
_T = 20  # seconds for any one setup command
_RUNID = r"[0-9a-f]{6}"
_STARTING_S = 60  # a run dir younger than this without an owner file is starting


def _run(
    argv: Sequence[str], *, check: bool = True, timeout: float = _T, input: Optional[str] = None
) -> subprocess.CompletedProcess:
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, input=input)
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"timed out after {timeout} s ({load_note()}): {' '.join(argv)}") from exc
    if check and r.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def cluster_unavailable_reason() -> Optional[str]:
    if os.geteuid() != 0:
        return "needs root (network and mount namespaces)"
    for tool in ("clush", "ip", "nsenter", "unshare", "ssh", "ssh-keygen", "zstd"):
        if not shutil.which(tool):
            return f"{tool} is not installed (make system-packages)"
    if not Path("/usr/sbin/sshd").exists():
        return "sshd is not installed (openssh-server)"
    return None


def _run_dir(runid: str) -> Path:
    return RUN_ROOT / f"{PREFIX}-{runid}"


def _lock_path(runid: str) -> Path:
    return LOCK_DIR / f"{PREFIX}-{runid}.lock"


def _alive(runid: str) -> bool:
    """A cluster run lives while it holds its flock, or (a run of older code, which took none)
    while the process named in its owner file lives. A run dir without an owner file counts as
    alive for its first _STARTING_S seconds (it is being made)."""
    if not _flock_free(_lock_path(runid)):
        return True
    d = _run_dir(runid)
    try:
        return Path(f"/proc/{int((d / 'owner').read_text())}").exists()
    except (OSError, ValueError):
        pass
    with contextlib.suppress(OSError):
        return time.time() - d.stat().st_mtime < _STARTING_S
    return False


def _links() -> dict[str, str]:
    """Network interfaces in this machine's namespace: name -> kind (bridge, veth, ...)."""
    out = _run(["ip", "-o", "-d", "link", "show"], check=False).stdout
    links = {}
    for line in out.splitlines():
        m = re.match(r"^\d+: ([^:@ ]+)", line)
        if m:
            kind = re.search(r"\b(bridge|veth)\b", line)
            links[m.group(1)] = kind.group(1) if kind else ""
    return links


def _cmdlines() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, argv) of every process but this one."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            yield int(proc.name), (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue


def run_pids(runid: str) -> list[int]:
    """Processes (other than this one) whose command line names the run's dir: slurmctld and
    munged here, slurmd and sshd in the nodes, clients given its ssh_config."""
    mark = f"{_run_dir(runid)}/".encode()
    bare = str(_run_dir(runid)).encode()
    return [pid for pid, argv in _cmdlines() if any(mark in a or a == bare for a in argv)]


def _kill_run_processes(runid: str) -> None:
    """SIGKILL every process naming the run's dir, until none is left (bounded)."""
    deadline = time.monotonic() + budget(10)
    pause = backoff(0.02, 0.5)
    while pids := run_pids(runid):
        if time.monotonic() >= deadline:
            raise LabError(f"processes {pids} of cluster {runid} survived SIGKILL ({load_note()})")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        sleep_until(deadline, next(pause))


def _remove_run(runid: str, errors: list[str]) -> None:
    """Everything of cluster run `runid` that exists: its nodes' processes and namespaces, the
    processes naming its dir, its bridge (and any veth left), its dir; errors are noted."""
    errs = errors
    mine = re.compile(rf"^{PREFIX}-{runid}-")
    namespaces = [ns for ns in list_netns() if mine.match(ns)]
    for ns in namespaces:
        _attempt(errs, _kill_netns_processes, ns)
    _attempt(errs, _kill_run_processes, runid)
    # The links before the namespaces: a deleted namespace is freed (its veths with it) later, by
    # the kernel; deleting a veth's end here takes both ends away now.
    for link, kind in _links().items():
        if link == f"rbfb{runid}" or (kind == "veth" and re.fullmatch(rf"rbf{runid}\d+", link)):
            _attempt(errs, _run, ["ip", "link", "delete", link], check=False)
    for ns in namespaces:
        _attempt(errs, _run, ["ip", "netns", "delete", ns], check=False)
    shutil.rmtree(_run_dir(runid), ignore_errors=True)
    left = [ns for ns in list_netns() if mine.match(ns)]
    if left:
        errs.append(f"namespaces not deleted: {left}")


def cleanup_stale() -> list[str]:
    """Remove what earlier clusters left when their process died (or their teardown failed):
    node namespaces and their processes, slurmctld/munged naming the run's dir, the bridge, the
    dir and the lock file. A live run (see _alive) is never touched. Returns the removed runids."""
    runids = set()
    for ns in list_netns():
        m = re.match(rf"^{PREFIX}-({_RUNID})-", ns)
        if m:
            runids.add(m.group(1))
    for link in _links():
        m = re.fullmatch(rf"rbfb({_RUNID})", link)
        if m:
            runids.add(m.group(1))
    for d in RUN_ROOT.glob(f"{PREFIX}-*"):
        if re.fullmatch(rf"{PREFIX}-{_RUNID}", d.name):
            runids.add(d.name[len(PREFIX) + 1 :])
    dirs = re.compile(rf"{re.escape(str(RUN_ROOT))}/{PREFIX}-({_RUNID})(?:/|$)".encode())
    for _pid, argv in _cmdlines():  # daemons outliving their dir (slurmctld, munged)
        for a in argv:
            m = dirs.search(a)
            if m:
                runids.add(m.group(1).decode())
    for lock in LOCK_DIR.glob(f"{PREFIX}-*.lock"):
        if re.fullmatch(rf"{PREFIX}-{_RUNID}\.lock", lock.name):
            runids.add(lock.name[len(PREFIX) + 1 : -len(".lock")])
    removed = []
    for runid in sorted(runids):
        if _alive(runid):
            continue
        errors: list[str] = []
        _remove_run(runid, errors=errors)
        _lock_path(runid).unlink(missing_ok=True)
        if errors:
            LOG.warning("stale cluster %s: %s", runid, "; ".join(errors))
        removed.append(runid)
    return removed


class Cluster:
    """N sshd nodes on one bridge. A context manager, or start()/stop(); stop() is idempotent,
    runs at interpreter exit too, and start() runs it before it raises when it fails halfway.

    ready_timeout_s: how long the nodes' sshds may take on an idle machine; every readiness wait
    stretches with the load (ready.budget) and ends at once when a node's sshd exits."""

    def __init__(self, n: int = 8, *, ready_timeout_s: float = 60.0, subnet: str = SUBNET) -> None:
        if not 1 <= n <= 64:
            raise ValueError("1..64 nodes")
        if (
            subnet.rpartition(".")[0] != subnets.NET_PREFIX
            or not subnet.rpartition(".")[2].isdigit()
            or int(subnet.rpartition(".")[2]) < subnets.FIRST_FIXED
        ):
            raise ValueError(
                f"{subnet}: a subnet of tests/lab/subnets.py (subnets.subnet(USER)): "
                "the lab's guard route covers 10.213.0.0/16, and Labs take the "
                f"/24s below {subnets.NET_PREFIX}.{subnets.FIRST_FIXED}"
            )
        self.n = n
        self.subnet = subnet
        # shell commands run in each node's namespaces before its sshd starts ({name} and {addr}
        # are filled in): daemons such as slurmd that must share the node's mount namespace
        self.node_start: list[str] = []
        self.runid = secrets.token_hex(3)
        self.dir = _run_dir(self.runid)
        self.bridge = f"rbfb{self.runid}"
        self.names = [f"node{i:02d}" for i in range(1, n + 1)]
        self.ready_timeout_s = ready_timeout_s
        self.procs: dict[str, subprocess.Popen] = {}
        self.start_seconds = 0.0
        self.ready_seconds: dict[str, float] = {}  # node -> seconds its last readiness wait took
        self._lock_fd: Optional[int] = None
        self._started = False
        self._stopped = False

    # -- layout
    def ns(self, name: str) -> str:
        return f"{PREFIX}-{self.runid}-{name}"

    def addr(self, name: str) -> str:
        return f"{self.subnet}.{10 + self.names.index(name) + 1}"

    @property
    def head_addr(self) -> str:
        """This machine's address on the cluster's bridge."""
        return f"{self.subnet}.1"

    def node_dir(self, name: str) -> Path:
        return self.dir / name

    def node_tmp(self, name: str) -> Path:
        return self.node_dir(name) / "tmp"

    @property
    def ssh_config(self) -> Path:
        return self.dir / "ssh_config"

    @property
    def nodeset(self) -> str:
        return f"node[01-{self.n:02d}]" if self.n > 1 else "node01"

    @property
    def lock_file(self) -> Path:
        return _lock_path(self.runid)

    # -- lifecycle
    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "Cluster":
        if self._started:
            return self
        t0 = time.monotonic()
        cleanup_stale()
        self._started = True
        atexit.register(self.stop)
        try:
            self._start()
        except BaseException:
            try:
                self.stop()
            except Exception as exc:  # noqa: BLE001 - the start's own error is the one to raise
                LOG.warning("cluster %s: teardown after a failed start: %s", self.runid, exc)
            raise
        self.start_seconds = time.monotonic() - t0
        LOG.info(
            "cluster %s: %d nodes up in %.1f s (%s)",
            self.runid,
            self.n,
            self.start_seconds,
            load_note(),
        )
        return self

    def _claim(self) -> None:
        """The run's dir with its owner file, and its flock (held while the run lives: see
        _alive). Idempotent."""
        if self._lock_fd is not None:
            return
        ensure_run_dirs()  # LOCK_DIR, and /run/sshd for the nodes' sshds (issue 34)
        self._lock_fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "owner").write_text(str(os.getpid()))

    def _start(self) -> None:
        self._claim()
        ensure_guard_route()
        used = _run(["ip", "-4", "-o", "addr"]).stdout
        if f" {self.subnet}." in used:
            raise LabError(
                f"{self.subnet}.0/24 is already in use on this machine (another cluster?)"
            )
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        key = self.dir / "id_ed25519"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)])
        (self.dir / "authorized_keys").write_text(Path(f"{key}.pub").read_text())
        known, cfg = [], []
        for i, name in enumerate(self.names, 1):
            ns, veth = self.ns(name), f"rbf{self.runid}{i}"
            _run(["ip", "netns", "add", ns])
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
            _run(["ip", "link", "set", veth, "master", self.bridge, "up"])
            inside = ["ip", "netns", "exec", ns]
            _run(inside + ["ip", "link", "set", "lo", "up"])
            _run(inside + ["ip", "addr", "add", f"{self.addr(name)}/24", "dev", "eth0"])
            _run(inside + ["ip", "link", "set", "eth0", "up"])
            d = self.node_dir(name)
            for sub in ("tmp", "home"):
                (d / sub).mkdir(parents=True)
            (d / "tmp").chmod(0o1777)
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key")])
            (d / "sshd_config").write_text(
                f"Port 22\nListenAddress 0.0.0.0\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n"
                f"AuthorizedKeysFile {self.dir}/authorized_keys\n"
                "PermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
                "StrictModes no\nUseDNS no\nMaxStartups 100\nMaxSessions 100\n"
                "Subsystem sftp /usr/lib/openssh/sftp-server\n"
                f"SetEnv HOME={d}/home\n"
            )
            host_key = Path(f"{d}/host_key.pub").read_text().split()[:2]
            known.append(f"{name},{self.addr(name)} {' '.join(host_key)}")
            cfg.append(f"Host {name}\n  HostName {self.addr(name)}\n")
        (self.dir / "known_hosts").write_text("\n".join(known) + "\n")
        common = (
            f"  User root\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.dir}/known_hosts\n  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n  BatchMode yes\n  UpdateHostKeys no\n"
            "  CheckHostIP no\n  AddressFamily inet\n  ConnectTimeout 5\n"
        )
        self.ssh_config.write_text("".join(c + common for c in cfg) + "Host *\n" + common)
        for name in self.names:
            self._start_sshd(name)
        self.wait_ready(self.names)

    def _start_sshd(self, name: str, binds: Sequence[tuple[str, str]] = ()) -> None:
        d = self.node_dir(name)
        # the planted binds first: their sources may live under this machine's /tmp
        mounts = [f"mount --bind {a} {b}" for a, b in binds] + [f"mount --bind {d}/tmp /tmp"]
        daemons = [c.format(name=name, addr=self.addr(name)) for c in self.node_start]
        script = (
            f"hostname {name} && "
            + " && ".join(mounts + daemons)
            + f" && exec /usr/sbin/sshd -D -e -f {d}/sshd_config"
        )
        with open(d / "sshd.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                [
                    "nsenter",
                    f"--net=/run/netns/{self.ns(name)}",
                    "unshare",
                    "-m",
                    "-u",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    script,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )

    def ssh(
        self, name: str, command: str, *, timeout: float = 30, check: bool = False
    ) -> subprocess.CompletedProcess:
        return _run(
            ["ssh", "-F", str(self.ssh_config), name, command], timeout=timeout, check=check
        )

    def _sshd_wait(self, name: str) -> SshdWait:
        return SshdWait(
            name,
            self.ns(name),
            lambda: self.procs.get(name),
            self.node_dir(name) / "sshd.log",
            lambda connect: [
                "ssh",
                "-F",
                str(self.ssh_config),
                "-o",
                f"ConnectTimeout={connect}",
                name,
                "true",
            ],
        )

    def wait_ready(self, names: Sequence[str]) -> None:
        """Wait for the nodes' sshds, all at once: listening (each namespace's socket table),
        then `ssh NODE true` in parallel with backoff; bounded by budget(ready_timeout_s), at once
        when one exited. Records (ready_seconds) and logs how long each node took."""
        took = wait_sshds(
            [self._sshd_wait(n) for n in names],
            base_s=self.ready_timeout_s,
            label=f"cluster {self.runid}",
        )
        self.ready_seconds.update(took)

    def kill_node(self, name: str) -> None:
        """Every process in the node's namespace, SIGKILL: a node that went away."""
        _kill_netns_processes(self.ns(name))

    def restart_node(self, name: str, binds: Sequence[tuple[str, str]] = ()) -> None:
        """Restart the node's sshd, with extra bind mounts inside its mount namespace only."""
        self.kill_node(name)
        old = self.procs.get(name)
        if old is not None:
            _reap(old, name)
        self._start_sshd(name, binds)
        self.wait_ready([name])

    def stop(self) -> None:
        """Remove everything the cluster made, whatever part of it exists: nodes' processes and
        namespaces, daemons naming its dir, its bridge, its dir, its lock. Idempotent; raises
        LabError naming what could not be removed (after trying everything)."""
        if not self._started or self._stopped:
            return
        self._stopped = True
        errors: list[str] = []
        self._teardown(errors)
        atexit.unregister(self.stop)
        if errors:
            raise LabError(f"cluster {self.runid} teardown: " + "; ".join(errors))

    def _teardown(self, errors: list[str]) -> None:
        _remove_run(self.runid, errors)
        for name, p in self.procs.items():
            _attempt(errors, _reap, p, name)
        if self._lock_fd is not None:
            self.lock_file.unlink(missing_ok=True)
            os.close(self._lock_fd)
            self._lock_fd = None

    def pids(self, name: str) -> list[int]:
        return netns_pids(self.ns(name))
