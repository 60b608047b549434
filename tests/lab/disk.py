"""Scratch file systems for tests: a loop-mounted ext4 of a given size, and a small tmpfs.

This machine's root file system has no journal: writing tens of thousands of files right after
deleting a copy of them is slow there. Big test destinations go on an Ext4Mount instead. A
TmpfsMount of a few MiB is the "disk full" fault (ENOSPC), or with `inodes=` the "no inodes left"
one.

Mounts are made in this machine's mount namespace, so the lab's hosts (whose sshd shares it) see
them. Each mount point's name holds the pid of the process that made it; cleanup_stale_mounts()
removes the ones whose process is gone (a killed test run).
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from .errors import LabError

SCRATCH_DIR = Path("/var/tmp")
_STALE_RE = re.compile(r"^rb-(ext4|tmpfs)-(\d+)-[A-Za-z0-9_]+$")


def _run(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    try:
        res = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"timed out after {timeout}s: {' '.join(argv)}") from exc
    if res.returncode != 0:
        raise LabError(f"failed (rc={res.returncode}): {' '.join(argv)}\n{res.stderr.strip()}")
    return res


def _mounted(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == target for line in f)


def _umount(path: Path) -> None:
    """Unmount, retrying briefly while busy (bounded: 20 x 0.1 s), then lazily."""
    for _ in range(20):
        if not _mounted(path):
            return
        if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode == 0:
            return
        time.sleep(0.1)
    if _mounted(path):
        _run(["umount", "-l", str(path)])


class _Mount:
    kind = ""

    def __init__(self, mountpoint: Path | None, parent: Path) -> None:
        self._given = mountpoint is not None
        self.parent = parent
        self.path: Path = mountpoint if mountpoint is not None else Path()
        self.mounted = False

    def _make_mountpoint(self) -> None:
        if self._given:
            self.path.mkdir(parents=True, exist_ok=True)
        else:
            self.path = Path(
                tempfile.mkdtemp(prefix=f"rb-{self.kind}-{os.getpid()}-", dir=self.parent)
            )

    def __enter__(self):
        return self.mount()

    def __exit__(self, *exc: object) -> None:
        self.unmount()

    def __fspath__(self) -> str:
        return str(self.path)

    def mount(self):
        raise NotImplementedError

    def unmount(self) -> None:
        """Unmount and remove the mount point (and image); idempotent."""
        if not self.mounted:
            return
        _umount(self.path)
        self.mounted = False
        if not self._given:
            shutil.rmtree(self.path, ignore_errors=True)
        self._remove_extra()
        atexit.unregister(self.unmount)

    def _remove_extra(self) -> None:
        pass

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize


class Ext4Mount(_Mount):
    """A sparse image file, mkfs.ext4 (journal on, no reserved blocks), mounted -o loop,noatime.

    with Ext4Mount(4096) as m:     # 4 GiB; m.path is the mount point
        ...
    """

    kind = "ext4"

    def __init__(
        self, size_mib: int, *, mountpoint: Path | None = None, parent: Path = SCRATCH_DIR
    ) -> None:
        super().__init__(mountpoint, parent)
        if size_mib < 8:
            raise LabError("an ext4 scratch needs at least 8 MiB")
        self.size_mib = size_mib
        self.image: Path | None = None

    def mount(self) -> Ext4Mount:
        if self.mounted:
            return self
        if os.geteuid() != 0:
            raise LabError("mounting an ext4 image needs root")
        self._make_mountpoint()
        self.image = self.path.with_name(self.path.name + ".img")
        try:
            with open(self.image, "wb") as f:
                f.truncate(self.size_mib * 1024 * 1024)
            _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-L", "rbscratch", str(self.image)])
            _run(["mount", "-o", "loop,noatime", str(self.image), str(self.path)])
        except BaseException:
            self.image.unlink(missing_ok=True)
            if not self._given:
                shutil.rmtree(self.path, ignore_errors=True)
            raise
        self.mounted = True
        atexit.register(self.unmount)
        return self

    def _remove_extra(self) -> None:
        if self.image is not None:
            self.image.unlink(missing_ok=True)


class TmpfsMount(_Mount):
    """A tmpfs of size_kib KiB (and at most `inodes` inodes when given): the "disk full" fault."""

    kind = "tmpfs"

    def __init__(
        self,
        size_kib: int,
        *,
        inodes: int | None = None,
        mountpoint: Path | None = None,
        parent: Path = SCRATCH_DIR,
    ) -> None:
        super().__init__(mountpoint, parent)
        if size_kib < 4:
            raise LabError("a tmpfs needs at least 4 KiB")
        self.size_kib = size_kib
        self.inodes = inodes

    def mount(self) -> TmpfsMount:
        if self.mounted:
            return self
        if os.geteuid() != 0:
            raise LabError("mounting a tmpfs needs root")
        self._make_mountpoint()
        opts = f"size={self.size_kib}k,mode=0755"
        if self.inodes is not None:
            opts += f",nr_inodes={self.inodes}"
        try:
            _run(["mount", "-t", "tmpfs", "-o", opts, "rbtmpfs", str(self.path)])
        except BaseException:
            if not self._given:
                shutil.rmtree(self.path, ignore_errors=True)
            raise
        self.mounted = True
        atexit.register(self.unmount)
        return self


def cleanup_stale_mounts(parent: Path = SCRATCH_DIR) -> list[Path]:
    """Unmount and remove rb-ext4-<pid>-* / rb-tmpfs-<pid>-* under parent whose pid is gone."""
    removed = []
    for p in sorted(parent.glob("rb-*-*-*")):
        m = _STALE_RE.match(p.name.removesuffix(".img"))
        if m is None or Path(f"/proc/{m.group(2)}").exists():
            continue
        if p.is_dir():
            _umount(p)
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed
