"""Real test hosts on this machine: one network namespace per host, each running Debian's sshd.
(Over 600 lines on purpose: the namespaces, bridges, sshd, link shaping and teardown share one
Lab's state, and splitting them would spread one lifecycle over several files.)

    with Lab(("src", "dst")) as lab:
        lab.ssh("src", "hostname -I")            # -> CompletedProcess, stdout "10.213.S.2 \n"
        subprocess.run(["ssh", "-F", lab.ssh_config, "dst", "true"])

Layout (S is a /24 slot picked per run, so parallel runs never clash):
    host i       <-> this machine: veth pair, host 10.213.S.(4i+2)/30,
                     this machine 10.213.S.(4i+1)/30
    allow(a, b)  :  veth pair a <-> b, link k: a 10.213.S.(128+4k+1)/30, b 10.213.S.(128+4k+2)/30
A host has no default route and this machine does not forward (per-interface forwarding=0 on our
veths), so a host reaches only this machine's end of its own link (and its direct links). This
machine reaches every host. Only these addresses are ever contacted; `unreachable 10.213.0.0/16`
(left in place) keeps a lab address that no live link covers from taking this machine's default
route.

Each sshd runs as

    nsenter --net=/run/netns/NS unshare --uts sh -c 'hostname NAME; exec sshd -D -e'

nsenter (not `ip netns exec`) keeps the sshd in this machine's mount namespace: `ip netns exec`
makes a private copy of the mounts, so a loop mount made after the host started would be invisible
to it. Hosts therefore share this machine's file system exactly, and `hostname` inside a host
prints its name.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import subnets
from .errors import LabError
from .ready import LOG, SshdWait, backoff, budget, load_note, sleep_until, wait_sshds
from .rundirs import LAB_LOCKS, ensure_run_dirs

SSHD = "/usr/sbin/sshd"
NET_PREFIX = subnets.NET_PREFIX  # the only range the lab assigns or contacts
LOCK_DIR = Path(
    LAB_LOCKS.path
)  # per-run lock files (a held flock = a live run), the allocation lock
MAX_HOSTS = 32  # host links use 10.213.S.0-127 in /30s
MAX_DIRECT = 32  # direct links use 10.213.S.128-255 in /30s
_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{1,7}$")

_KILL_WAIT_S = 10.0  # killed processes gone (idle machine; budget() stretches it)
_EXIT_WAIT_S = 5.0  # an sshd's exit after SIGTERM/SIGKILL (likewise)
_CMD_TIMEOUT_S = 30


def _run(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout: float = _CMD_TIMEOUT_S,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a lab command, capture its output; raise LabError naming it when check and it fails."""
    try:
        res = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"timed out after {timeout}s: {shlex.join(argv)}") from exc
    if check and res.returncode != 0:
        raise LabError(f"failed (rc={res.returncode}): {shlex.join(argv)}\n{res.stderr.strip()}")
    return res


def _write_sysctl(
    path: str, value: str, *, netns: str | None = None, required: bool = True
) -> None:
    """Write a /proc/sys value, in a namespace when netns is given (/proc/sys/net is per netns)."""
    if netns is None:
        try:
            Path(path).write_text(value)
        except OSError as exc:
            if required:
                raise LabError(f"cannot write {value} to {path}: {exc}") from exc
        return
    res = _run(
        [
            "nsenter",
            f"--net=/run/netns/{netns}",
            "/bin/sh",
            "-c",
            'printf %s "$1" > "$2"',
            "sh",
            value,
            path,
        ],
        check=False,
    )
    if required and res.returncode != 0:
        raise LabError(f"cannot write {value} to {path} in {netns}: {res.stderr.strip()}")


def list_netns() -> list[str]:
    """Names of this machine's named network namespaces."""
    out = _run(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def netns_pids(netns: str) -> list[int]:
    """Pids of the processes living in a named network namespace."""
    res = _run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in res.stdout.split() if p.isdigit()]


def _kill_netns_processes(netns: str, sig: int = signal.SIGKILL) -> None:
    """Signal every process in the namespace, again and again until none is left; bounded by
    budget(_KILL_WAIT_S), a namespace that does not exist has none."""
    deadline = time.monotonic() + budget(_KILL_WAIT_S)
    pause = backoff(0.02, 0.5)
    while True:
        pids = netns_pids(netns)
        if not pids:
            return
        if time.monotonic() >= deadline:
            raise LabError(f"processes {pids} in {netns} survived signal {sig} ({load_note()})")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        sleep_until(deadline, next(pause))


def _tcp_open(addr: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return True
    except OSError:
        return False


def _flock_free(path: Path) -> bool:
    """True when nobody holds an flock on path (or it does not exist): the run it names is gone."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def ensure_guard_route() -> None:
    """`unreachable 10.213.0.0/16` in this machine's namespace, left in place on purpose.

    Longest prefix wins, so it only catches lab addresses that no live /30 covers: a host whose link
    to this machine was taken down on this side, a removed direct link, a lab already torn down.
    Those fail here at once ("No route to host") and never take the default route off this machine.
    """
    _run(["ip", "route", "replace", "unreachable", f"{NET_PREFIX}.0.0/16"])


def cleanup_stale(prefix: str = "rblab") -> list[str]:
    """Remove namespaces, temp dirs and lock files of dead lab runs with this prefix.

    A run is alive while it holds the flock on LOCK_DIR/<prefix>-<runid>.lock. Returns the removed
    namespace names.
    """
    pat = re.compile(rf"^{re.escape(prefix)}-([0-9a-f]{{6}})-")
    removed = []
    runids = set()
    for ns in list_netns():
        m = pat.match(ns)
        if m is None or not _flock_free(LOCK_DIR / f"{prefix}-{m.group(1)}.lock"):
            continue
        runids.add(m.group(1))
        with contextlib.suppress(LabError):
            _kill_netns_processes(ns)
        _run(["ip", "netns", "del", ns], check=False)
        removed.append(ns)
    for lock in LOCK_DIR.glob(f"{prefix}-*.lock"):
        runid = lock.stem[len(prefix) + 1 :]
        if _flock_free(lock):
            runids.add(runid)
            lock.unlink(missing_ok=True)
    tmp = Path(tempfile.gettempdir())
    for runid in runids:
        for d in tmp.glob(f"{prefix}-{runid}-*"):
            shutil.rmtree(d, ignore_errors=True)
    return removed


@dataclass
class Host:
    """One test host: a network namespace with its own sshd."""

    name: str
    index: int
    netns: str
    addr: str  # the host's address on its link to this machine (what `ssh NAME` reaches)
    gateway: str  # this machine's address on that link
    veth_root: str  # the link's end in this machine's namespace
    veth_host: str  # the link's end in the host's namespace
    dir: Path  # this host's files: host key, sshd_config, pid file, log
    proc: subprocess.Popen[bytes] | None = None
    direct: dict[str, str] = field(default_factory=dict)  # peer -> this host's address on that link

    @property
    def host_key(self) -> Path:
        return self.dir / "ssh_host_ed25519_key"

    @property
    def sshd_config(self) -> Path:
        return self.dir / "sshd_config"

    @property
    def pid_file(self) -> Path:
        return self.dir / "sshd.pid"

    @property
    def home(self) -> Path:
        """$HOME of ssh sessions on this host (sshd's SetEnv): empty, so no dotfile of this
        machine's root runs on a host, and hosts do not share ~/.cache and the like."""
        return self.dir / "home"

    @property
    def log(self) -> Path:
        return self.dir / "sshd.log"

    @property
    def addresses(self) -> list[str]:
        return [self.addr, *self.direct.values()]

    def host_key_line(self) -> str:
        """`TYPE BASE64` of the host's current public key."""
        return " ".join(Path(f"{self.host_key}.pub").read_text().split()[:2])


class Lab:
    """N test hosts reachable over real ssh from this machine. Use as a context manager or
    start()/stop(); stop() is idempotent and also runs at interpreter exit. A start() that fails
    halfway stops what it made before it raises.

    ready_timeout_s: how long the sshds may take to answer on an idle machine; the wait stretches
    with the load (ready.budget) and ends at once when an sshd exits."""

    def __init__(
        self,
        hosts: Iterable[str] = ("src", "dst"),
        *,
        prefix: str = "rblab",
        ready_timeout_s: float = 30.0,
    ) -> None:
        names = list(hosts)
        if not names or len(names) > MAX_HOSTS or len(set(names)) != len(names):
            raise LabError(f"need 1..{MAX_HOSTS} distinct host names, got {names}")
        for n in names:
            if not _NAME_RE.match(n):
                raise LabError(f"host name {n!r} must match {_NAME_RE.pattern}")
        if not _PREFIX_RE.match(prefix):
            raise LabError(f"prefix {prefix!r} must match {_PREFIX_RE.pattern}")
        self.prefix = prefix
        self.names = names
        self.ready_timeout_s = ready_timeout_s
        self.runid = secrets.token_hex(3)
        self.slot: int | None = None
        self.dir: Path | None = None
        self.hosts: dict[str, Host] = {}
        self.links: dict[tuple[str, str], int] = {}  # (a, b) -> direct link index
        self._lock_fd: int | None = None
        self._started = False
        self._stopped = False
        self._dirty: set[str] = set()  # hosts a fault method touched since reset()
        self.start_seconds: float | None = None
        self.ready_seconds: dict[str, float] = {}  # host -> seconds its last readiness wait took

    # ---------------------------------------------------------------- paths clients use
    @property
    def ssh_config(self) -> Path:
        return self._need_dir() / "ssh_config"

    @property
    def known_hosts(self) -> Path:
        return self._need_dir() / "known_hosts"

    @property
    def identity(self) -> Path:
        return self._need_dir() / "id_ed25519"

    @property
    def lock_file(self) -> Path:
        return LOCK_DIR / f"{self.prefix}-{self.runid}.lock"

    def _need_dir(self) -> Path:
        if self.dir is None:
            raise LabError("the lab is not started")
        return self.dir

    def host(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            raise LabError(f"no host {name!r} in this lab (hosts: {list(self.hosts)})") from None

    def ssh_options(self) -> list[str]:
        """`-o` options equivalent to the ssh_config, for `ssh OPTIONS root@ADDR` without -F."""
        return [
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"IdentityFile={self.identity}",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "User=root",
            "-o",
            "UpdateHostKeys=no",
            "-o",
            "ConnectTimeout=5",
        ]

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> Lab:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Lab:
        if self._started:
            return self
        t0 = time.monotonic()
        if os.geteuid() != 0:
            raise LabError("the lab needs root")
        self._started = True
        atexit.register(self.stop)
        try:
            self._start()
        except BaseException:
            try:
                self.stop()
            except Exception as exc:  # noqa: BLE001 - the start's own error is the one to raise
                LOG.warning("lab %s: teardown after a failed start: %s", self.runid, exc)
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def _start(self) -> None:
        ensure_run_dirs()  # /run/sshd (sshd's privilege separation dir), LOCK_DIR
        self._lock_fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.dir = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-{self.runid}-"))
        alloc = os.open(LOCK_DIR / "alloc.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(alloc, fcntl.LOCK_EX)  # one run at a time picks a slot and builds links
            cleanup_stale(self.prefix)
            ensure_guard_route()
            self.slot = self._free_slot()
            for i, name in enumerate(self.names):
                self._make_host(i, name)
        finally:
            os.close(alloc)
        self._keygen(self.identity, "rblab-client")
        (self.dir / "authorized_keys").write_text(Path(f"{self.identity}.pub").read_text())
        for h in self.hosts.values():
            self._write_sshd_config(h)
            self._keygen(h.host_key, f"rblab-{h.name}")
            os.link(h.host_key, h.dir / "ssh_host_ed25519_key.orig")
            os.link(f"{h.host_key}.pub", h.dir / "ssh_host_ed25519_key.orig.pub")
        self._write_known_hosts()
        self._write_ssh_config()
        for h in self.hosts.values():
            self._spawn_sshd(h)
        self._wait_ready(list(self.hosts.values()))

    def stop(self) -> None:
        """Kill every process in the hosts' namespaces, delete them (their veths go with them),
        remove the lab's files and release its lock. Safe to call more than once, and on a lab
        whose start() failed halfway: each step runs whatever the one before it did, and what
        was never made is skipped. Raises LabError naming what could not be removed."""
        if self._stopped or not self._started:
            return
        self._stopped = True
        errors: list[str] = []
        links = _run(["ip", "-o", "link", "show"], check=False).stdout
        for h in self.hosts.values():
            _attempt(errors, _kill_netns_processes, h.netns)
            if h.proc is not None:
                _attempt(errors, _reap, h.proc, h.name)
            # The veth first: a deleted namespace is freed (and its veths with it) later, by the
            # kernel; deleting this end takes both ends away now.
            if f": {h.veth_root}@" in links:
                _attempt(errors, _run, ["ip", "link", "del", h.veth_root], check=False)
            _attempt(errors, _run, ["ip", "netns", "del", h.netns], check=False)
        left = set(list_netns()) & {h.netns for h in self.hosts.values()}
        if left:
            errors.append(f"namespaces not deleted: {sorted(left)}")
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        if self._lock_fd is not None:
            self.lock_file.unlink(missing_ok=True)
            os.close(self._lock_fd)
            self._lock_fd = None
        atexit.unregister(self.stop)
        if errors:
            raise LabError("lab teardown: " + "; ".join(errors))

    # ---------------------------------------------------------------- building
    def _free_slot(self) -> int:
        """Lowest /24 of NET_PREFIX with no address on this machine (called under the alloc
        lock)."""
        out = _run(["ip", "-4", "-o", "addr", "show"]).stdout
        used = {
            int(m.group(1)) for m in re.finditer(rf"inet {re.escape(NET_PREFIX)}\.(\d+)\.", out)
        }
        for slot in range(1, subnets.FIRST_FIXED):  # above: the clusters' (tests/lab/subnets.py)
            if slot not in used:
                return slot
        raise LabError(f"no free /24 left in {NET_PREFIX}.0.0/16")

    def _addr(self, last: int) -> str:
        return f"{NET_PREFIX}.{self.slot}.{last}"

    def _make_host(self, i: int, name: str) -> Host:
        ns = f"{self.prefix}-{self.runid}-{name}"
        h = Host(
            name=name,
            index=i,
            netns=ns,
            addr=self._addr(4 * i + 2),
            gateway=self._addr(4 * i + 1),
            veth_root=f"rbl{self.runid}h{i}",
            veth_host="eth0",
            dir=self._need_dir() / name,
        )
        self.hosts[name] = h  # registered first: stop() removes a half-built host too
        h.dir.mkdir()
        h.home.mkdir()
        _run(["ip", "netns", "add", ns])
        # A new namespace: no forwarding, no IPv6 (only the addresses below ever carry traffic).
        _write_sysctl("/proc/sys/net/ipv4/ip_forward", "0", netns=ns)
        for key in ("all", "default"):
            _write_sysctl(
                f"/proc/sys/net/ipv6/conf/{key}/disable_ipv6", "1", netns=ns, required=False
            )
        _run(
            [
                "ip",
                "link",
                "add",
                h.veth_root,
                "type",
                "veth",
                "peer",
                "name",
                h.veth_host,
                "netns",
                ns,
            ]
        )
        _write_sysctl(f"/proc/sys/net/ipv4/conf/{h.veth_root}/forwarding", "0")
        _write_sysctl(f"/proc/sys/net/ipv6/conf/{h.veth_root}/disable_ipv6", "1", required=False)
        _run(["ip", "addr", "add", f"{h.gateway}/30", "dev", h.veth_root])
        _run(["ip", "link", "set", h.veth_root, "up"])
        _run(["ip", "-n", ns, "addr", "add", f"{h.addr}/30", "dev", h.veth_host])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(["ip", "-n", ns, "link", "set", h.veth_host, "up"])
        return h

    @staticmethod
    def _keygen(path: Path, comment: str) -> None:
        for p in (path, Path(f"{path}.pub")):
            p.unlink(missing_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])

    def _write_sshd_config(self, h: Host) -> None:
        # ListenAddress 0.0.0.0 is inside the host's own namespace: its link address, its direct
        # links' addresses and its loopback -- nothing else exists there.
        h.sshd_config.write_text(f"""\
# rblab sshd for host {h.name} ({h.addr}); generated, one per lab run
Port 22
ListenAddress 0.0.0.0
AddressFamily inet
HostKey {h.host_key}
PidFile {h.pid_file}
AuthorizedKeysFile {self._need_dir() / "authorized_keys"}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
PrintLastLog no
AcceptEnv LANG LC_*
MaxStartups 64:30:128
MaxSessions 64
LogLevel INFO
Subsystem sftp /usr/lib/openssh/sftp-server
SetEnv HOME={h.home}
""")

    def _write_known_hosts(self) -> None:
        lines = []
        for h in self.hosts.values():
            key = h.host_key_line()
            lines.append(f"{h.name},{h.addr} {key}")
            lines.extend(f"{a} {key}" for a in h.direct.values())
        _atomic_write(self.known_hosts, "\n".join(lines) + "\n")

    def _write_ssh_config(self) -> None:
        common = [
            "User root",
            "Port 22",
            f"IdentityFile {self.identity}",
            "IdentitiesOnly yes",
            f"UserKnownHostsFile {self.known_hosts}",
            "GlobalKnownHostsFile /dev/null",
            "StrictHostKeyChecking yes",
            "BatchMode yes",
            "UpdateHostKeys no",
            "CheckHostIP no",
            "AddressFamily inet",
            "ConnectTimeout 5",
        ]
        blocks = [f"# rblab run {self.runid}: hosts {', '.join(self.hosts)}; generated\n"]
        for h in self.hosts.values():
            blocks.append(
                "\n".join([f"Host {h.name}", f"  HostName {h.addr}", *(f"  {c}" for c in common)])
                + "\n"
            )
        # Any other address (a direct link's) gets the same options: `ssh -F CONFIG 10.213.S.T`.
        blocks.append("\n".join(["Host *", *(f"  {c}" for c in common)]) + "\n")
        _atomic_write(self.ssh_config, "\n".join(blocks))

    # ---------------------------------------------------------------- sshd
    def _spawn_sshd(self, h: Host) -> None:
        argv = [
            "nsenter",
            f"--net=/run/netns/{h.netns}",
            "unshare",
            "--uts",
            "/bin/sh",
            "-c",
            'hostname "$1" && exec "$2" -D -e -f "$3"',
            "sh",
            h.name,
            SSHD,
            str(h.sshd_config),
        ]
        with open(h.log, "ab") as log:
            h.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )

    def _sshd_wait(self, h: Host) -> SshdWait:
        return SshdWait(
            h.name,
            h.netns,
            lambda: h.proc,
            h.log,
            lambda connect: self.ssh_argv(h.name, "true", ["-o", f"ConnectTimeout={connect}"]),
        )

    def _wait_ready(self, hosts: Sequence[Host], *, ssh: bool = True) -> None:
        """Wait for the hosts' sshds at once: listening (their namespace's socket table), then
        `ssh NAME true` with backoff; bounded by budget(ready_timeout_s), at once on an exited
        sshd. Records and logs the seconds each host took."""
        took = wait_sshds(
            [self._sshd_wait(h) for h in hosts],
            base_s=self.ready_timeout_s,
            label=f"lab {self.prefix}-{self.runid}",
            ssh=ssh,
        )
        self.ready_seconds.update(took)

    def sshd_running(self, name: str) -> bool:
        h = self.host(name)
        return h.proc is not None and h.proc.poll() is None

    def start_sshd(self, name: str) -> None:
        """Start the host's sshd again (after kill_sshd/stop_sshd) and wait until ssh works."""
        h = self.host(name)
        if self.sshd_running(name):
            return
        self._spawn_sshd(h)
        self._wait_ready([h])

    def stop_sshd(self, name: str) -> None:
        """Gracefully stop the host's listening sshd (SIGTERM); open sessions go on."""
        h = self.host(name)
        self._dirty.add(name)
        if h.proc is not None and h.proc.poll() is None:
            h.proc.terminate()
            _reap(h.proc, name)

    def kill_sshd(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Fault injection: send sig (default kill -9) to every process in the host's namespace --
        its sshd, all its sessions and whatever they run -- and wait until they are gone."""
        h = self.host(name)
        self._dirty.add(name)
        _kill_netns_processes(h.netns, sig)
        if h.proc is not None:
            try:
                h.proc.wait(timeout=budget(_EXIT_WAIT_S))
            except subprocess.TimeoutExpired as exc:
                raise LabError(f"sshd of {name} did not exit after signal {sig}") from exc

    # ---------------------------------------------------------------- running things
    def ssh_argv(
        self, name_or_addr: str, remote: str | Sequence[str] = (), options: Sequence[str] = ()
    ) -> list[str]:
        """`ssh -F CONFIG [options] HOST -- REMOTE`; a list remote is quoted for the remote
        shell."""
        cmd = remote if isinstance(remote, str) else shlex.join(remote)
        return [
            "ssh",
            "-F",
            str(self.ssh_config),
            *options,
            name_or_addr,
            *(["--", cmd] if cmd else []),
        ]

    def ssh(
        self,
        name_or_addr: str,
        remote: str | Sequence[str],
        *,
        timeout: float = 60,
        options: Sequence[str] = (),
        input: str | None = None,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command on a host through real ssh from this machine (text, captured)."""
        argv = self.ssh_argv(name_or_addr, remote, options)
        try:
            res = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=timeout,
                input=input,
                stdin=None if input is not None else subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise LabError(f"timed out after {timeout}s: {shlex.join(argv)}") from exc
        if check and res.returncode != 0:
            raise LabError(f"ssh failed (rc={res.returncode}): {shlex.join(argv)}\n{res.stderr}")
        return res

    def netns_argv(self, name: str, argv: Sequence[str]) -> list[str]:
        """argv run inside the host's network (and, while its sshd lives, UTS) namespace."""
        h = self.host(name)
        pre = ["nsenter", f"--net=/run/netns/{h.netns}"]
        if self.sshd_running(name) and h.proc is not None:
            pre.append(f"--uts=/proc/{h.proc.pid}/ns/uts")
        return [*pre, *argv]

    def exec(
        self,
        name: str,
        argv: Sequence[str],
        *,
        timeout: float = 60,
        check: bool = False,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run argv inside a host without ssh (text, captured). Same file system as this machine."""
        full = self.netns_argv(name, argv)
        try:
            res = subprocess.run(
                full,
                capture_output=True,
                text=True,
                timeout=timeout,
                input=input,
                stdin=None if input is not None else subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise LabError(f"timed out after {timeout}s: {shlex.join(full)}") from exc
        if check and res.returncode != 0:
            raise LabError(
                f"failed in {name} (rc={res.returncode}): {shlex.join(argv)}\n{res.stderr}"
            )
        return res

    def can_connect(
        self, target: str, *, from_host: str | None = None, port: int = 22, timeout: float = 2.0
    ) -> bool:
        """One bounded TCP connect to a host name (its address) or an address, from this machine
        or from inside from_host."""
        addr = self.hosts[target].addr if target in self.hosts else target
        if not addr.startswith(f"{NET_PREFIX}.{self.slot}.") and addr != "127.0.0.1":
            raise LabError(f"refusing to contact {addr}: not an address of this lab")
        if from_host is None:
            return _tcp_open(addr, port, timeout)
        code = (
            "import socket,sys\ntry:\n socket.create_connection((sys.argv[1], int(sys.argv[2])),"
            " timeout=float(sys.argv[3])).close()\nexcept OSError as e:\n print(e); sys.exit(1)\n"
        )
        res = self.exec(
            from_host,
            [sys.executable, "-c", code, addr, str(port), str(timeout)],
            timeout=timeout + 10,
        )
        return res.returncode == 0

    # ---------------------------------------------------------------- faults and routes
    def link_down(self, name: str, side: str = "host") -> None:
        """Take the host's link to this machine down. side="host": its eth0 (this machine's end
        loses carrier: connects and open sessions hang until their timeouts, like a cut cable);
        side="root": this machine's end (its route goes: connects fail at once, ENETUNREACH)."""
        self._set_link(name, side, "down")

    def link_up(self, name: str, side: str = "host") -> None:
        self._set_link(name, side, "up")

    def _set_link(self, name: str, side: str, state: str) -> None:
        h = self.host(name)
        self._dirty.add(name)
        if side == "host":
            _run(["ip", "-n", h.netns, "link", "set", h.veth_host, state])
        elif side == "root":
            _run(["ip", "link", "set", h.veth_root, state])  # the route comes back with "up"
        else:
            raise LabError(f"side must be 'host' or 'root', not {side!r}")

    def replace_host_key(self, name: str, *, trust: bool = False) -> str:
        """Give the host a new host key and restart its sshd (open sessions go on). known_hosts
        keeps the old key unless trust=True, so strict clients refuse it. Returns `TYPE BASE64`."""
        h = self.host(name)
        self._dirty.add(name)
        self._keygen(h.host_key, f"rblab-{h.name}-new")
        self.stop_sshd(name)
        if trust:
            self._write_known_hosts()
        self._spawn_sshd(h)
        self._wait_ready([h], ssh=trust)  # an untrusted key: listening is all there is to see
        return h.host_key_line()

    def allow(self, a: str, b: str) -> str:
        """Let host a reach host b (and b reach a) over a direct veth pair between their namespaces.
        Returns b's address on that link; `ssh -F CONFIG ADDR` works from inside a (known_hosts and
        the `Host *` block of the ssh_config cover it)."""
        ha, hb = self.host(a), self.host(b)
        if a == b:
            raise LabError("allow(a, b) needs two different hosts")
        if (a, b) in self.links or (b, a) in self.links:
            return hb.direct[a]
        k = next(
            i for i in range(MAX_DIRECT + 1) if i == MAX_DIRECT or i not in self.links.values()
        )
        if k == MAX_DIRECT:
            raise LabError(f"at most {MAX_DIRECT} direct links")
        addr_a, addr_b = self._addr(128 + 4 * k + 1), self._addr(128 + 4 * k + 2)
        dev = f"rbd{k}"
        _run(
            [
                "ip",
                "link",
                "add",
                dev,
                "netns",
                ha.netns,
                "type",
                "veth",
                "peer",
                "name",
                dev,
                "netns",
                hb.netns,
            ]
        )
        for h, addr in ((ha, addr_a), (hb, addr_b)):
            _run(["ip", "-n", h.netns, "addr", "add", f"{addr}/30", "dev", dev])
            _run(["ip", "-n", h.netns, "link", "set", dev, "up"])
        self.links[(a, b)] = k
        ha.direct[b] = addr_a
        hb.direct[a] = addr_b
        self._write_known_hosts()
        return addr_b

    def disallow(self, a: str, b: str) -> None:
        """Remove the direct link between a and b (either order); no-op when there is none."""
        key = (a, b) if (a, b) in self.links else (b, a)
        k = self.links.pop(key, None)
        if k is None:
            return
        ha, hb = self.host(key[0]), self.host(key[1])
        _run(["ip", "-n", ha.netns, "link", "del", f"rbd{k}"], check=False)
        ha.direct.pop(hb.name, None)
        hb.direct.pop(ha.name, None)
        self._write_known_hosts()

    def reset(self) -> None:
        """Back to the state start() left: no direct links, and for every host a fault method
        touched since the last reset: links up, original host key, sshd running (its leftover
        sessions killed), ssh checked. For a shared (session) lab after a test injected faults;
        cheap when none did."""
        for a, b in list(self.links):
            self.disallow(a, b)
        dirty = [self.hosts[n] for n in sorted(self._dirty)]
        for h in dirty:
            _run(["ip", "link", "set", h.veth_root, "up"])
            _run(["ip", "-n", h.netns, "link", "set", h.veth_host, "up"])
            orig = h.dir / "ssh_host_ed25519_key.orig"
            if h.host_key_line() != " ".join(Path(f"{orig}.pub").read_text().split()[:2]):
                self.stop_sshd(h.name)
                for suffix in ("", ".pub"):
                    shutil.copyfile(f"{orig}{suffix}", f"{h.host_key}{suffix}")
                os.chmod(h.host_key, 0o600)
        self._write_known_hosts()
        for h in dirty:
            if not self.sshd_running(h.name):
                _kill_netns_processes(h.netns)  # sessions left by a stopped sshd
                self._spawn_sshd(h)
        if dirty:
            self._wait_ready(dirty)
        self._dirty.clear()

    def forwarding(self) -> dict[str, str]:
        """IPv4 forwarding flags that keep hosts apart: global and on each of our root-side
        veths."""
        out = {"ip_forward": Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()}
        for h in self.hosts.values():
            out[h.veth_root] = (
                Path(f"/proc/sys/net/ipv4/conf/{h.veth_root}/forwarding").read_text().strip()
            )
        return out


def _attempt(errors: list[str], fn, *args, **kw) -> None:
    """fn(*args, **kw) for a teardown: an error is noted in errors and the teardown goes on."""
    try:
        fn(*args, **kw)
    except (LabError, OSError, subprocess.SubprocessError) as exc:
        errors.append(str(exc))


def _reap(proc: subprocess.Popen, name: str) -> None:
    """Wait for a signalled process (bounded by budget(_EXIT_WAIT_S)); SIGKILL it when it
    lingers."""
    try:
        proc.wait(timeout=budget(_EXIT_WAIT_S))
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.wait(timeout=budget(_EXIT_WAIT_S))
        except subprocess.TimeoutExpired as exc:
            raise LabError(f"process {proc.pid} ({name}) did not exit after SIGKILL") from exc


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
