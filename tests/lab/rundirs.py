"""The directories the labs need on file systems that a boot empties, made by the labs themselves.

`/run` is a tmpfs on most machines (emptied at every boot) and is where a system's services keep
their runtime dirs, which the services' own units (not the packages) make at start. The labs start
no system service, so nothing else makes them: each lab calls `ensure_run_dirs()` before it starts
a daemon, and never relies on a dir that an earlier run, another lab or an installer left (issue 34:
the fan-out clusters' sshds exited "Missing privilege separation directory: /run/sshd" on a freshly
booted machine, because only the two-host lab made that dir, and the fan-out tests ran first).

What the labs rely on under a boot-emptied file system, audited (Lab, Cluster, SlurmCluster):

- /run/sshd, made by `ensure_run_dirs()`: every sshd (Lab, Cluster and SlurmCluster nodes) needs
  it, its privilege separation (chroot) dir; sshd exits rc=255 without it, and refuses one not
  owned by root or writable by group/others.
- /run/rblab, made by `ensure_run_dirs()`: every lab's lock files (a held flock = a live run) and
  the Lab's slot allocation lock.
- /run/netns, made by iproute2 itself at the first `ip netns add`: `ip netns add` (and `nsenter
  --net=/run/netns/NS`).
- /run/munge, /run/slurm*: nothing needs them: the Slurm lab gives munged its socket, pid, seed
  and log, and slurmctld/slurmd their pid, spool and state under the cluster's dir
  (/var/tmp/rbfan-RUN).
- /dev/shm, /run/lock, /run/user: nothing needs them.

Everything else a lab writes lives under /tmp (made per run) or /var/tmp (kept across boots), and
is made by the run that uses it. tests/e2e/test_lab_fresh.py starts every lab with an empty /run
(`empty_run_argv`: a private mount namespace with a fresh tmpfs there) and asserts it comes up.
"""

from __future__ import annotations

import os
import shlex
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import LabError


@dataclass(frozen=True)
class RunDir:
    path: str  # absolute, on a boot-emptied file system
    mode: int  # owner root:root
    why: str


SSHD_PRIVSEP = RunDir(
    "/run/sshd", 0o755, "sshd's privilege separation dir (root-owned, not group/world writable)"
)
LAB_LOCKS = RunDir("/run/rblab", 0o755, "the labs' lock files and the Lab's slot allocation lock")
RUN_DIRS: tuple[RunDir, ...] = (SSHD_PRIVSEP, LAB_LOCKS)


def ensure_run_dirs(dirs: Iterable[RunDir] = RUN_DIRS, *, root: Path = Path("/")) -> list[Path]:
    """Make each dir (under `root`, "/" for real) that is missing, root:root with its mode, and put
    right one that exists with another owner or with write bits its mode does not have (sshd
    refuses its dir then). Idempotent; returns the dirs made or put right. Raises LabError naming
    the dir it could not make (a file in its place, a read-only /run)."""
    changed = []
    for d in dirs:
        path = root / d.path.lstrip("/")
        try:
            try:
                path.mkdir(parents=True, mode=d.mode)
                made = True
            except FileExistsError:
                made = False
            st = path.lstat()
            if not stat.S_ISDIR(st.st_mode):
                raise LabError(f"{path} ({d.why}) exists and is not a directory")
            if (
                made
                or st.st_uid != 0
                or st.st_gid != 0
                or stat.S_IMODE(st.st_mode) & ~d.mode & 0o022
            ):
                os.chown(path, 0, 0)
                os.chmod(path, d.mode)  # mkdir's mode went through the umask
                changed.append(path)
        except OSError as exc:
            raise LabError(f"cannot make {path} ({d.why}): {exc}") from exc
    return changed


def empty_run_argv(argv: Sequence[str], *, share: Sequence[str] = ()) -> list[str]:
    """argv that runs `argv` as on a freshly booted machine: in a private mount namespace with an
    empty tmpfs over /run (this machine's /run is untouched and stays in use by live labs). Each
    path of `share` (a dir under /run that must exist here) is bound back into the empty /run, so
    that locks held there stay visible both ways (e.g. /run/rblab: a Lab's slot allocation lock).
    Network namespaces made inside are seen only there, and go when the command ends. Root only."""
    if any(not p.startswith("/run/") for p in share):
        raise ValueError(f"share: paths under /run/ only, not {list(share)}")
    script = ["hold=$(mktemp -d /tmp/rb-emptyrun.XXXXXX)", "trap 'rmdir \"$hold\"' EXIT"]
    for i, p in enumerate(share):  # bound aside first: the tmpfs hides them
        script += [f'mkdir "$hold/{i}"', f'mount --bind {shlex.quote(p)} "$hold/{i}"']
    script.append("mount -t tmpfs -o mode=0755 rbfresh /run")
    for i, p in enumerate(share):
        script += [
            f"mkdir -p {shlex.quote(p)}",
            f'mount --move "$hold/{i}" {shlex.quote(p)}',
            f'rmdir "$hold/{i}"',
        ]
    script.append('"$@"')
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "/bin/sh",
        "-ec",
        "; ".join(script),
        "sh",
        *argv,
    ]
