"""Small facts about paths on a host: what is there, how big, how much room, and the atomic swap."""

from __future__ import annotations

import ctypes
import hashlib
import errno
import os
import re
import shutil
from typing import Optional

from . import manifest, safefs

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


def scan(root: str, patterns, names_path: Optional[str] = None) -> dict:
    """Is `root` a venv, and how many files/bytes (apparent and on disk) after the excludes.
    With `names_path`, also write the entries as a NUL-separated list for `tar -T` (the same walk
    and order as a manifest's)."""
    out: dict = {"path": root, "exists": os.path.lexists(root)}
    if not out["exists"]:
        return out
    out["is_dir"] = os.path.isdir(root)
    cfg = os.path.join(root, "pyvenv.cfg")
    out["is_venv"] = os.path.isfile(cfg) and os.path.exists(os.path.join(root, "bin", "python"))
    if os.path.isfile(cfg):
        with open(cfg, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition("=")
                if key.strip() in ("version", "version_info", "home"):
                    out[f"pyvenv_{key.strip()}"] = value.strip()
    if out["is_dir"]:
        files = dirs = links = 0
        apparent = disk = 0
        names = [] if names_path else None
        stat_fp = hashlib.sha256()
        for rel, st in manifest.walk(root, patterns):
            stat_fp.update(manifest.stat_line(manifest.entry_of(root, rel, st)))
            if names is not None:
                names.append(rel.encode("utf-8", "surrogateescape") + b"\0")
            disk += getattr(st, "st_blocks", 0) * 512
            if os.path.stat.S_ISREG(st.st_mode):
                files += 1
                apparent += st.st_size
            elif os.path.stat.S_ISDIR(st.st_mode):
                dirs += 1
            elif os.path.stat.S_ISLNK(st.st_mode):
                links += 1
        if names is not None:       # a new temp file and a rename: never through a link
            safefs.write_file(names_path, b"".join(names), 0o600)
        out.update(files=files, dirs=dirs, links=links, bytes=apparent, disk_bytes=disk,
                   stat_fingerprint=stat_fp.hexdigest())
    out["installed_manifest"] = os.path.isfile(os.path.join(root, ".rb-manifest.jsonl"))
    return out


def free_bytes(path: str) -> dict:
    """Free bytes on the filesystem that holds `path` (or its nearest existing parent)."""
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    usage = shutil.disk_usage(probe)
    return {"path": path, "measured_at": probe, "free_bytes": usage.free, "total_bytes": usage.total}


def _renameat2(src: str, dst: str, flags: int) -> bool:
    """renameat2(2) through libc; False when the kernel or libc cannot do it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err), dst)


def backups(dest: str) -> list[tuple[int, str]]:
    parent, base = os.path.split(dest)
    pat = re.compile(re.escape(base) + r"\.rb-backup\.([0-9]+)$")
    found = []
    for name in os.listdir(parent or "."):
        m = pat.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(parent, name)))
    return sorted(found)


def swap(staging: str, dest: str, policy: str) -> dict:
    """Put `staging` at `dest` in one step; what was at `dest` is refused, kept or removed."""
    if not os.path.isdir(staging):
        raise FileNotFoundError(f"staging directory {staging} is missing")
    if not os.path.lexists(dest):
        if not _renameat2(staging, dest, RENAME_NOREPLACE):
            os.rename(staging, dest)
        return {"policy": policy, "previous": "none"}
    if policy == "refuse":
        raise FileExistsError(f"{dest} exists and on_existing is refuse")
    exchanged = _renameat2(staging, dest, RENAME_EXCHANGE)
    if exchanged:
        old_at = staging  # the previous destination now sits at the staging path
    else:
        old_at = f"{staging}.old"
        os.rename(dest, old_at)
        os.rename(staging, dest)
    result: dict = {"policy": policy, "atomic": exchanged}
    if policy == "backup":
        number = (backups(dest)[-1][0] + 1) if backups(dest) else 1
        target = f"{dest}.rb-backup.{number}"
        os.rename(old_at, target)
        result["previous"] = target
    else:
        shutil.rmtree(old_at)
        result["previous"] = "removed"
    return result


def restore(dest: str, number: Optional[int] = None) -> dict:
    """Put backup N (default: the newest) back at `dest`; the current one becomes a backup too."""
    found = dict(backups(dest))
    if not found:
        raise FileNotFoundError(f"no {dest}.rb-backup.N to restore")
    number = number if number is not None else max(found)
    if number not in found:
        raise FileNotFoundError(f"{dest}.rb-backup.{number} does not exist")
    source = found[number]
    if os.path.lexists(dest):
        if not _renameat2(source, dest, RENAME_EXCHANGE):
            os.rename(dest, f"{source}.swap")
            os.rename(source, dest)
            os.rename(f"{source}.swap", source)
        # what was installed is now kept under the backup's number
        return {"restored": source, "kept_current_as": source}
    os.rename(source, dest)
    return {"restored": source, "kept_current_as": None}


def stage(dest: str, staging: str, new: dict, installed: dict, names_path: str) -> dict:
    """An incremental install's staging: a fresh `staging` with every directory of `new`, and each
    unchanged file hard-linked from the previous install at `dest` (same digest, mode, size and
    mtime in both manifests, and the file at `dest` still has the recorded stat); writes the
    NUL-separated names tar must still send (changed and new files, relocatable files, every
    directory and symlink: tar restores their modes and targets). `dest` is never written."""
    if new["header"].get("algo") != installed["header"].get("algo") or new["header"]["algo"] == "none":
        raise ValueError("an incremental install needs digests of one algorithm in both manifests")
    before = {e["p"]: e for e in installed["entries"]}
    if os.path.lexists(staging):
        shutil.rmtree(staging)
    os.makedirs(staging)
    send: list[str] = []
    linked = linked_bytes = send_bytes = send_files = 0
    for e in new["entries"]:                       # parents come before their children
        rel = e["p"]
        target = os.path.join(staging, rel)
        if e["t"] == "d":
            os.makedirs(target, exist_ok=True)
            send.append(rel)
            continue
        old = before.get(rel)
        if manifest.linkable(old, e):
            src = os.path.join(dest, rel)
            try:
                st = os.lstat(src)
                if manifest.entry_of(dest, rel, st) == {k: v for k, v in old.items() if k != "h"}:
                    os.link(src, target)
                    linked += 1
                    linked_bytes += e["s"]
                    continue
            except OSError:
                pass                               # gone, another file system, not allowed: send
        send.append(rel)
        if e["t"] == "f":
            send_files += 1
            send_bytes += e["s"]
    buf = bytearray()
    for rel in send:
        buf += rel.encode("utf-8", "surrogateescape") + b"\0"
    safefs.write_file(names_path, bytes(buf), 0o600)
    return {"linked": linked, "linked_bytes": linked_bytes, "send_files": send_files,
            "send_bytes": send_bytes, "send_entries": len(send),
            "removed": len(set(before) - {e["p"] for e in new["entries"]})}
