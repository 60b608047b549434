"""Waits that stretch on a busy machine: the readiness wait every lab shares, and its budget.

A fixed short wait passed on an idle machine and failed on a loaded one (issue #13: eight sshds,
`ssh NODE true` one node after the other, 20 s). Here every wait is bounded by a budget that grows
with the load (`budget()`), and ends early when it can never succeed (the daemon exited), so a long
budget costs a good run nothing and a broken one only its own failure.

    wait_sshds([SshdWait(name, netns, lambda: proc, log, argv_fn), ...], base_s=30, label="rblab-x")

waits in two phases, for all daemons at once: (1) each sshd's listening socket, read from
/proc/PID/net/tcp of its own process (the namespace's view, no process started per poll); (2) the
real `ssh NAME true`, all nodes in parallel, retried with backoff. It logs per node how long each
phase took (logger `tests.lab`, INFO: pytest shows it under "Captured log" when a test fails).
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .errors import LabError

LOG = logging.getLogger("tests.lab")
LOG.setLevel(logging.INFO)  # pytest's handlers take INFO only when the logger passes it on

READY_CAP_S = float(os.environ.get("RB_LAB_READY_CAP_S", "120"))
_TCP_LISTEN = "0A"  # state column of /proc/net/tcp


def cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_factor() -> float:
    """The 1-minute load average per core, at least 1."""
    try:
        return max(1.0, os.getloadavg()[0] / cores())
    except OSError:
        return 1.0


def load_note() -> str:
    try:
        load = f"{os.getloadavg()[0]:.1f}"
    except OSError:
        load = "?"
    return f"load {load} on {cores()} cores"


def budget(base_s: float, *, cap_s: float | None = None) -> float:
    """Seconds for a wait that takes base_s on an idle machine: base_s times the load per core,
    at most cap_s (default READY_CAP_S: 120, or $RB_LAB_READY_CAP_S), never less than base_s.
    The load average lags a sudden load by a minute or so: base_s must be generous on its own."""
    cap = READY_CAP_S if cap_s is None else cap_s
    return max(base_s, min(cap, base_s * load_factor()))


def backoff(first: float, most: float, factor: float = 2.0) -> Iterator[float]:
    """first, first*factor, ... up to most, then most forever (callers bound it by a deadline)."""
    pause = first
    while True:
        yield pause
        pause = min(most, pause * factor)


def sleep_until(deadline: float, pause: float) -> None:
    time.sleep(max(0.0, min(pause, deadline - time.monotonic())))


def _ns_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def listening(pid: int, port: int, netns: str | None = None) -> bool:
    """True when the network namespace of process pid has a TCP socket listening on port.
    With netns (a name under /run/netns), only when pid already lives in that namespace: a
    process that has not entered it yet (nsenter before setns) sees this machine's sockets."""
    if netns is not None:
        want = _ns_id(f"/run/netns/{netns}")
        if want is None or _ns_id(f"/proc/{pid}/ns/net") != want:
            return False
    hexport = f"{port:04X}"
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 3 and cols[1].endswith(f":{hexport}") and cols[3] == _TCP_LISTEN:
                return True
    return False


def log_tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


@dataclass
class SshdWait:
    """One sshd to wait for."""

    name: str
    netns: str  # under /run/netns
    proc: Callable[[], subprocess.Popen | None]  # its process now (None: not spawned yet)
    log: Path  # its log, quoted when it fails
    ssh_argv: Callable[[int], list[str]]  # `ssh ... NAME true`, ConnectTimeout given
    port: int = 22


def _exited(w: SshdWait, label: str) -> None:
    proc = w.proc()
    if proc is not None and proc.poll() is not None:
        raise LabError(
            f"{label}: sshd of {w.name} exited rc={proc.returncode} "
            f"({load_note()}):\n{log_tail(w.log)}"
        )


def _is_listening(w: SshdWait) -> bool:
    proc = w.proc()
    return proc is not None and listening(proc.pid, w.port, w.netns)


def wait_listening(waits: Sequence[SshdWait], *, deadline: float, label: str) -> dict[str, float]:
    """Phase 1: poll every sshd's listening socket until all listen (seconds each took), or
    raise LabError at the deadline, or at once when one exited."""
    t0 = time.monotonic()
    took: dict[str, float] = {}
    pending = list(waits)
    pause = backoff(0.02, 0.5)
    while True:
        for w in list(pending):
            _exited(w, label)
            if _is_listening(w):
                took[w.name] = time.monotonic() - t0
                pending.remove(w)
        if not pending:
            return took
        if time.monotonic() >= deadline:
            tails = "\n".join(f"--- {w.name}:\n{log_tail(w.log, 600)}" for w in pending)
            raise LabError(
                f"{label}: sshd not listening after {time.monotonic() - t0:.1f} s on "
                f"{[w.name for w in pending]} ({load_note()})\n{tails}"
            )
        sleep_until(deadline, next(pause))


def _ssh_round(waits: Sequence[SshdWait], deadline: float) -> dict[str, tuple[int, str, float]]:
    """One `ssh NAME true` to each, in parallel; name -> (rc, stderr, when it ended). Bounded by
    the deadline. stderr goes to a file, so a chatty client can never block on a full pipe."""
    connect = int(min(30.0, max(5.0, deadline - time.monotonic())))
    procs: dict[str, tuple[subprocess.Popen[bytes], IO[bytes]]] = {}
    out: dict[str, tuple[int, str, float]] = {}
    try:
        for w in waits:
            err = tempfile.TemporaryFile()
            procs[w.name] = (
                subprocess.Popen(
                    w.ssh_argv(connect),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                ),
                err,
            )
        pause = backoff(0.01, 0.1)
        while len(out) < len(procs):
            for name, (p, err) in procs.items():
                if name not in out and p.poll() is not None:
                    err.seek(0)
                    out[name] = (
                        p.returncode,
                        err.read().decode(errors="replace").strip(),
                        time.monotonic(),
                    )
            if len(out) < len(procs):
                if time.monotonic() >= deadline:
                    break
                sleep_until(deadline, next(pause))
        for name in procs:
            out.setdefault(name, (-1, "no answer before the deadline", time.monotonic()))
    finally:
        for p, err in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
            err.close()
    return out


def _tries(n: int) -> str:
    return "1 try" if n == 1 else f"{n} tries"


def wait_sshds(
    waits: Sequence[SshdWait], *, base_s: float, label: str, ssh: bool = True
) -> dict[str, float]:
    """Wait until every sshd listens and (ssh=True) `ssh NAME true` works; returns name -> seconds
    until it was ready. Bounded by budget(base_s); fails at once when an sshd exited. Logs the
    times per node."""
    t0 = time.monotonic()
    limit = budget(base_s)
    deadline = t0 + limit
    heard = wait_listening(waits, deadline=deadline, label=label)
    ready: dict[str, float] = {}
    tries: dict[str, int] = {w.name: 0 for w in waits}
    last: dict[str, str] = {}
    if ssh:
        pending = list(waits)
        pause = backoff(0.2, 2.0)
        while pending and time.monotonic() < deadline:
            for name, (rc, err, ended) in _ssh_round(pending, deadline).items():
                tries[name] += 1
                if rc == 0:
                    ready[name] = ended - t0
                else:
                    last[name] = err[-300:]
            pending = [w for w in pending if w.name not in ready]
            for w in pending:
                _exited(w, label)
            if pending:
                sleep_until(deadline, next(pause))
        if pending:
            raise LabError(
                f"{label}: `ssh NAME true` still failing after {time.monotonic() - t0:.1f} s "
                f"(budget {limit:.0f} s, {load_note()}): "
                + "; ".join(
                    f"{w.name} ({_tries(tries[w.name])}): {last.get(w.name, '?')}" for w in pending
                )
            )
    else:
        ready = dict(heard)
    for w in waits:
        LOG.info(
            "%s %s: listening after %.2f s%s (budget %.0f s, %s)",
            label,
            w.name,
            heard[w.name],
            f", ssh ok after {ready[w.name]:.2f} s ({_tries(tries[w.name])})" if ssh else "",
            limit,
            load_note(),
        )
    return ready
