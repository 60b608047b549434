"""Is the destination the source? Which machine and which directory a path is, beyond its text.

A text comparison of the spec's two endpoints misses a symlink alias (`/opt/venv` and
`/data/opt/venv`), a relative path, a bind mount, and two host ids (or two addresses) for one
machine; the swap then replaces the source with its own copy. `identity(path)` runs on each end (as
`pathid.identity`) and says what the path is there; `same_or_nested(source, destination)`, a pure
function of the two results, says why they must not be used together, or None.

One machine: both ends report the same boot id (/proc/sys/kernel/random/boot_id: random per boot,
so never shared by two kernels, whereas cloned images share /etc/machine-id); without a boot id
(not Linux) the machine id decides. On one machine, paths are compared as text only within one
mount namespace (two containers may both have /opt/venv), and (st_dev, st_ino) always: equal, or
the source's directory in the destination's parent chain. Across machines, one network export
mounted on both (NFS, Lustre, ...) is compared by its path inside the export.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional

from rbrules import paths

NETWORK_FS = frozenset(
    (
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "glusterfs",
        "fuse.glusterfs",
        "fuse.sshfs",
        "fuse.beegfs",
        "fuse.juicefs",
        "9p",
        "afs",
        "orangefs",
        "wekafs",
        "virtiofs",
    )
)


def _read_id(path: str) -> Optional[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _under(child: str, parent: str) -> bool:
    """Whether `child` is strictly below `parent` (whole components)."""
    parent = parent.rstrip("/")
    if not parent:  # under "/": everything but "/" itself
        return child.startswith("/") and child != "/"
    return child.startswith(parent + "/")


def mount_of(path: str, mountinfo: str = "/proc/self/mountinfo") -> Optional[Dict[str, str]]:
    """The mount that holds `path` (an absolute, resolved path): its mount point, its root inside
    the file system, the file system type and source (e.g. `filer:/export`)."""
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    best: Optional[Dict[str, str]] = None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(" "), right.split(" ")
        if not sep or len(fields) < 5 or len(tail) < 2:
            continue
        point = _unescape(fields[4])
        if path == point or _under(path, point):
            if best is None or len(point) >= len(best["point"]):  # later mounts win
                best = {
                    "point": point,
                    "root": _unescape(fields[3]),
                    "fstype": tail[0],
                    "source": _unescape(tail[1]),
                }
    return best


def identity(path: str) -> Dict[str, Any]:
    """What `path` is on this host: its absolute and resolved forms, whether it is a link (and
    to what), (st_dev, st_ino) of it and of every existing directory above its resolved form
    (`chain`, nearest first), the machine (boot id, machine id, mount namespace) and the mount
    that holds it. JSON-ready; made on each end and compared with `same_or_nested`."""
    real = os.path.realpath(path)
    out: Dict[str, Any] = {
        "path": path,
        "abspath": os.path.abspath(path),
        "realpath": real,
        "exists": os.path.lexists(path),
        "is_link": os.path.islink(path),
    }
    if out["is_link"]:
        out["link_target"] = os.readlink(path)
    try:
        st = os.stat(path)
        out["dev_ino"] = [st.st_dev, st.st_ino]
    except OSError:
        out["dev_ino"] = None
    chain: List[List[int]] = []
    ancestor = real
    while True:
        try:
            ancestor_st = os.stat(ancestor)
            chain.append([ancestor_st.st_dev, ancestor_st.st_ino])
        except OSError:
            pass
        parent = os.path.dirname(ancestor)
        if parent == ancestor:
            break
        ancestor = parent
    out["chain"] = chain
    out["boot_id"] = _read_id("/proc/sys/kernel/random/boot_id")
    out["machine_id"] = _read_id("/etc/machine-id") or _read_id("/var/lib/dbus/machine-id")
    try:
        out["mnt_ns"] = os.readlink("/proc/self/ns/mnt")
    except OSError:
        out["mnt_ns"] = None
    out["hostname"] = os.uname().nodename
    out["mount"] = mount_of(real)
    return out


def same_machine(one: Dict[str, Any], other: Dict[str, Any]) -> bool:
    """One kernel: equal boot ids; where either lacks one, equal machine ids."""
    if one.get("boot_id") and other.get("boot_id"):
        return one["boot_id"] == other["boot_id"]
    return bool(one.get("machine_id")) and one.get("machine_id") == other.get("machine_id")


def _backup_or_staging_of(src: str, dest: str) -> bool:
    base = re.escape(os.path.basename(dest))
    return (
        os.path.dirname(src) == os.path.dirname(dest)
        and re.match(
            rf"^(?:{paths.backup_number(os.path.basename(dest))}|\.{base}\.rb-(?:staging|old|restore))$",
            os.path.basename(src),
        )
        is not None
    )


def _in_export(ident: Dict[str, Any]) -> Optional[str]:
    mount = ident.get("mount") or {}
    if mount.get("fstype") not in NETWORK_FS:
        return None
    rel = os.path.relpath(ident["realpath"], mount["point"])
    return os.path.normpath(os.path.join(mount.get("root") or "/", rel))


def same_or_nested(src: Dict[str, Any], dst: Dict[str, Any]) -> Optional[str]:
    """Why the destination `dst` must not be installed from the source `src` (both made by
    `identity`, each on its own host), or None when they are apart: one directory, one inside the
    other, or the source is the destination's backup or staging (the install moves or removes
    those)."""
    rs, rd = src["realpath"], dst["realpath"]
    if same_machine(src, dst):
        text = not (src.get("mnt_ns") and dst.get("mnt_ns")) or src["mnt_ns"] == dst["mnt_ns"]
        if text and rs == rd:
            return f"source and destination are one directory: {rs}"
        if text and _under(rd, rs):
            return f"the destination {rd} is inside the source {rs}"
        if text and _under(rs, rd):
            return f"the source {rs} is inside the destination {rd}"
        ids, idd = src.get("dev_ino"), dst.get("dev_ino")
        if ids and ids == idd:
            return (
                f"source and destination are the same directory under two names ({rs}, {rd}: "
                "one device and inode)"
            )
        if ids and ids in (dst.get("chain") or []):
            return (
                f"the destination {rd} is inside the source {rs} (one of its parent directories "
                "is the source's: a bind mount or another name for it)"
            )
        if idd and idd in (src.get("chain") or []):
            return (
                f"the source {rs} is inside the destination {rd} (one of its parent directories "
                "is the destination's: a bind mount or another name for it)"
            )
        if text and _backup_or_staging_of(rs, rd):
            return (
                f"the source {rs} is the destination's backup or staging: the install would move "
                "or remove it; copy it elsewhere first"
            )
    es, ed = _in_export(src), _in_export(dst)
    if es is not None and ed is not None:
        ms, md = src["mount"], dst["mount"]
        if ms["fstype"] == md["fstype"] and ms["source"].rstrip("/") == md["source"].rstrip("/"):
            where = f"on one network file system ({ms['source']}, {ms['fstype']})"
            if es == ed:
                return f"source {rs} and destination {rd} are one directory {where}"
            if _under(ed, es):
                return f"the destination {rd} is inside the source {rs} {where}"
            if _under(es, ed):
                return f"the source {rs} is inside the destination {rd} {where}"
    return None
