"""A mini-cluster on this machine for the fan-out tests: N nodes, each a network namespace on one
bridge with its own hostname, its own mount namespace (a private /tmp) and its own sshd, so that
`clush -w node[01-08]` reaches real, separate machines and writes on node02 stay on node02.

Addresses: the bridge (this machine) 10.213.250.1/24, node i 10.213.250.(10+i). The lab's
`unreachable 10.213.0.0/16` guard route is installed first, so nothing in the range leaves this
machine. Nodes have no default route. Every command here has a timeout; every wait is bounded.

    with Cluster(8) as c:
        c.ssh_config            # Host node01 ... blocks, for clush -o "-F PATH" and ssh -F
        c.node_tmp("node03")    # that node's private /tmp, seen from here
        c.restart_node("node03", binds=[(wrapper_dir, "/usr/local/sbin")])   # plant a fault
        c.kill_node("node07")   # every process in its namespace (sshd and sessions), at once

Slurm (slurmctld/slurmd/munge) is not started here yet: see docs/fanout.md.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from typing import Optional, Sequence

from .errors import LabError
from .netlab import _kill_netns_processes, ensure_guard_route, list_netns, netns_pids

SUBNET = "10.213.250"
PREFIX = "rbfan"
_T = 20  # seconds for any one setup command


def _run(argv: Sequence[str], *, check: bool = True, timeout: float = _T,
         input: Optional[str] = None) -> subprocess.CompletedProcess:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, input=input)
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


def cleanup_stale() -> None:
    """Namespaces, bridges and dirs of an earlier cluster whose process is gone."""
    for ns in list_netns():
        if ns.startswith(PREFIX + "-"):
            runid = ns.split("-")[1]
            pidfile = Path(f"/var/tmp/{PREFIX}-{runid}/owner")
            alive = False
            with contextlib.suppress(OSError, ValueError):
                alive = Path(f"/proc/{int(pidfile.read_text())}").exists()
            if not alive:
                with contextlib.suppress(LabError):
                    _kill_netns_processes(ns)
                _run(["ip", "netns", "delete", ns], check=False)
                _run(["ip", "link", "delete", f"rbfb{runid}"], check=False)
                shutil.rmtree(f"/var/tmp/{PREFIX}-{runid}", ignore_errors=True)


class Cluster:
    def __init__(self, n: int = 8, *, ready_timeout_s: float = 20.0,
                 subnet: str = SUBNET) -> None:
        if not 1 <= n <= 64:
            raise ValueError("1..64 nodes")
        if not subnet.startswith("10.213.") or subnet.count(".") != 2:
            raise ValueError("a 10.213.X subnet: the lab's guard route covers 10.213.0.0/16")
        self.n = n
        self.subnet = subnet
        # shell commands run in each node's namespaces before its sshd starts ({name} and {addr}
        # are filled in): daemons such as slurmd that must share the node's mount namespace
        self.node_start: list[str] = []
        self.runid = secrets.token_hex(3)
        self.dir = Path(f"/var/tmp/{PREFIX}-{self.runid}")
        self.bridge = f"rbfb{self.runid}"
        self.names = [f"node{i:02d}" for i in range(1, n + 1)]
        self.ready_timeout_s = ready_timeout_s
        self.procs: dict[str, subprocess.Popen] = {}
        self.start_seconds = 0.0

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

    # -- lifecycle
    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "Cluster":
        t0 = time.monotonic()
        cleanup_stale()
        ensure_guard_route()
        used = _run(["ip", "-4", "-o", "addr"]).stdout
        if f" {self.subnet}." in used:
            raise LabError(f"{self.subnet}.0/24 is already in use on this machine (another cluster?)")
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "owner").write_text(str(os.getpid()))
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
                f"AuthorizedKeysFile {self.dir}/authorized_keys\nPermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
                "StrictModes no\nUseDNS no\nMaxStartups 100\nMaxSessions 100\n"
                "Subsystem sftp /usr/lib/openssh/sftp-server\n"
                f"SetEnv HOME={d}/home\n")
            host_key = Path(f"{d}/host_key.pub").read_text().split()[:2]
            known.append(f"{name},{self.addr(name)} {' '.join(host_key)}")
            cfg.append(f"Host {name}\n  HostName {self.addr(name)}\n")
        (self.dir / "known_hosts").write_text("\n".join(known) + "\n")
        common = (f"  User root\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
                  f"  UserKnownHostsFile {self.dir}/known_hosts\n  GlobalKnownHostsFile /dev/null\n"
                  "  StrictHostKeyChecking yes\n  BatchMode yes\n  UpdateHostKeys no\n"
                  "  CheckHostIP no\n  AddressFamily inet\n  ConnectTimeout 5\n")
        self.ssh_config.write_text("".join(c + common for c in cfg) + "Host *\n" + common)
        for name in self.names:
            self._start_sshd(name)
        self.wait_ready(self.names)
        self.start_seconds = time.monotonic() - t0
        return self

    def _start_sshd(self, name: str, binds: Sequence[tuple[str, str]] = ()) -> None:
        d = self.node_dir(name)
        # the planted binds first: their sources may live under this machine's /tmp
        mounts = [f"mount --bind {a} {b}" for a, b in binds] + [f"mount --bind {d}/tmp /tmp"]
        daemons = [c.format(name=name, addr=self.addr(name)) for c in self.node_start]
        script = f"hostname {name} && " + " && ".join(mounts + daemons) + \
            f" && exec /usr/sbin/sshd -D -e -f {d}/sshd_config"
        log = open(d / "sshd.log", "ab")
        self.procs[name] = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.ns(name)}", "unshare", "-m", "-u",
             "--propagation", "private", "sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()

    def ssh(self, name: str, command: str, *, timeout: float = 30,
            check: bool = False) -> subprocess.CompletedProcess:
        return _run(["ssh", "-F", str(self.ssh_config), name, command], timeout=timeout,
                    check=check)

    def wait_ready(self, names: Sequence[str]) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        left = list(names)
        while left and time.monotonic() < deadline:
            left = [n for n in left if self.ssh(n, "true", timeout=8).returncode != 0]
            if left:
                time.sleep(0.2)
        if left:
            raise LabError(f"nodes not reachable over ssh: {left}")

    def kill_node(self, name: str) -> None:
        """Every process in the node's namespace, SIGKILL: a node that went away."""
        _kill_netns_processes(self.ns(name))

    def restart_node(self, name: str, binds: Sequence[tuple[str, str]] = ()) -> None:
        """Restart the node's sshd, with extra bind mounts inside its mount namespace only."""
        self.kill_node(name)
        self._start_sshd(name, binds)
        self.wait_ready([name])

    def stop(self) -> None:
        for name in self.names:
            ns = self.ns(name)
            if ns in list_netns():
                with contextlib.suppress(LabError):
                    _kill_netns_processes(ns)
                _run(["ip", "netns", "delete", ns], check=False)
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        _run(["ip", "link", "delete", self.bridge], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def pids(self, name: str) -> list[int]:
        return netns_pids(self.ns(name))
