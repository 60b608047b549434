"""Child processes with a deadline, and the environment every GPU process gets."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Dict, List, NamedTuple, Optional

# NVLink multicast (NVLS) can take a shared host's GPUs out of service; no probe uses it.
SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

TAIL_CHARS = 4000


def apply_safe_env(env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Set the SAFE_ENV variables in `env` (default: this process's os.environ) unless they are
    already set; returns the mapping."""
    target = os.environ if env is None else env
    for key, value in SAFE_ENV.items():
        target.setdefault(key, value)
    return target


def child_env() -> Dict[str, str]:
    """This process's environment with the SAFE_ENV defaults, for a child (started isolated:
    rbrules.launch)."""
    return apply_safe_env(dict(os.environ))


class Finished(NamedTuple):
    returncode: Optional[int]  # None when it was killed at the deadline
    output: str  # the tail of stdout and stderr together
    stdout: str
    timed_out: bool
    duration_s: float


def tail(text: str, limit: int = TAIL_CHARS) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def run_bounded(
    argv: List[str], timeout_s: float, env: Optional[Dict[str, str]] = None, cwd: str = "/"
) -> Finished:
    """Run argv in its own process group, from `cwd` (default /: no other user can write there);
    at the deadline kill the whole group."""
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc)
        out, err = proc.communicate()
    stdout = out.decode("utf-8", "replace")
    both = stdout + err.decode("utf-8", "replace")
    return Finished(
        None if timed_out else proc.returncode,
        tail(both),
        stdout,
        timed_out,
        time.monotonic() - start,
    )


def kill_group(proc: "subprocess.Popen") -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass
