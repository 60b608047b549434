"""The installs kept beside a destination, and what each one is: its backups (`DEST.rb-backup.N`),
the install whose checks failed kept apart (`DEST.rb-failed`), the record each install holds
(paths.INSTALL_RECORD) and its failure mark (paths.FAILED_MARK); listed, described, made independent
of the live install (`unshare_backup`), removed. Nothing here moves an install into place:
rbkit.swapfs does (swap, restore, prune_backups, the journal). Public through rbkit.hostfs.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import stat
from typing import List, Optional

from rbrules import owners, paths, proven

from . import manifest, safefs, statwalk

FICLONE = 0x40049409


def backups(dest: str) -> list[tuple[int, str]]:
    """(number, path) of every name `DEST.rb-backup.N` beside `dest`, oldest first (whatever they
    are: `backup_dirs` keeps the real directories)."""
    parent, base = os.path.split(dest)
    pat = re.compile(paths.backup_number(base) + "$")
    found = []
    for name in os.listdir(parent or "."):
        match = pat.match(name)
        if match:
            found.append((int(match.group(1)), os.path.join(parent, name)))
    return sorted(found)


def backup_dirs(dest: str) -> list[tuple[int, str]]:
    """The backups that are real directories of ours (a link named like one, or a directory
    another user made there, is not ours to use: `foreign_backups` says why)."""
    return [(n, p) for n, p in backups(dest) if is_real_dir(p) and not_ours(p) is None]


def not_ours(path: str) -> Optional[str]:
    """Why the directory `path`, named like a backup, is not proven ours (None: it is): owned by
    another user than this one or root, or writable by another (rbrules.proven.why_not_ours).
    Where it lies proves nothing: in a parent others can add entries to (transfer.shared_parent:
    allow), anyone can make one of that name; in a private one, an install another user owns is
    theirs to change (a previous install of theirs, kept by a swap as it was), and root never
    restores it. Only root can give a directory another owner, so one planted keeps its
    planter's. What lies inside is judged before a restore (rbkit.swapfs: every entry)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    why = owners.why_not_ours(path, st)
    if why is None:
        return None
    return (
        f"{why}: not a backup this kit made (another user can make, or change, a "
        "directory of that name); it is never restored, counted or removed: look at it and "
        "remove it, or move it back by hand if you mean to"
    )


def why_not_ours_install(path: str) -> Optional[str]:
    """Why the install at `path` is not proven ours (None: it is): the directory itself
    (rbrules.proven, an install's entry) and each record it keeps beside its files (its
    manifest, env file, failure mark, record: each a file read on its own). Its files are judged
    where they are used (the quick check, the links of an incremental staging, a restore)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    why = owners.why_not_ours(path, st)
    if why:
        return why
    dir_fd = safefs.open_dir(path)
    try:
        for name in paths.IN_INSTALL:
            try:
                fd, _st = proven.open_ours(name, dir_fd, shown=os.path.join(path, name))
            except FileNotFoundError:
                continue
            except proven.NotOurs as exc:
                return exc.why
            os.close(fd)
    finally:
        os.close(dir_fd)
    return None


def _read_record(path: str, name: str, limit: int) -> Optional[bytes]:
    """The record `name` of the install at `path`: None when it is not there; NotOurs when it is
    and is not proven ours."""
    try:
        dir_fd = safefs.open_dir(path)
    except OSError:
        return None
    try:
        got = proven.read_ours(name, dir_fd, limit, shown=os.path.join(path, name))
    finally:
        os.close(dir_fd)
    return got[0] if got is not None else None


def foreign_backups(dest: str) -> list[str]:
    """Why each directory named like a backup of `dest` is not one of ours (`not_ours`)."""
    return [
        why for _n, p in backups(dest) if is_real_dir(p) for why in [not_ours(p)] if why is not None
    ]


def is_real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def next_backup(dest: str) -> str:
    found = backups(dest)
    return paths.backup(dest, (found[-1][0] + 1) if found else 1)


def failed_mark(path: str) -> Optional[str]:
    """Why the install at `path` was rolled back (its checks failed), or None. A mark that is
    not proven ours counts as failed (never restored without being named, never counted)."""
    try:
        got = _read_record(path, paths.FAILED_MARK, 64 << 10)
    except proven.NotOurs as exc:
        return f"its failure mark is not ours ({exc.why})"
    return got.decode("utf-8", "replace").strip() if got is not None else None


def failed_path(dest: str) -> str:
    """Where the one install whose checks failed is kept apart: `DEST.rb-failed` (never a backup:
    never counted toward keep_backups, never restored without being named, replaced by the next
    failure)."""
    return paths.failed(os.path.abspath(dest))


def read_info(path: str) -> dict:
    """The install's own record (paths.INSTALL_RECORD, written by the engine: `installed` (UTC, ISO
    8601), `origin` (the runbook and its spec), `source_fingerprint`, `checks` (passed, none, not
    run, failed: ...), `put_back_after`); {} when it has none or it is not one."""
    try:
        got = _read_record(path, paths.INSTALL_RECORD, 64 << 10)
        doc = json.loads(got) if got is not None else {}
    except (ValueError, proven.NotOurs):
        doc = {}
    return doc if isinstance(doc, dict) else {}


def write_info(path: str, **fields: object) -> dict:
    """Merge `fields` into the install's record (a None value removes the key)."""
    doc = read_info(path)
    doc.update(fields)
    doc = {k: v for k, v in doc.items() if v is not None}
    safefs.write_in(
        path, paths.INSTALL_RECORD, json.dumps(doc, sort_keys=True).encode() + b"\n", 0o644
    )
    return doc


def set_checks(path: str, passed: bool, why: str = "") -> None:
    """Record the checks' verdict on the install at `path`: passed (the failure mark removed), or
    failed (marked: paths.FAILED_MARK says why)."""
    write_info(path, checks="passed" if passed else "failed: " + why)
    if passed:
        dir_fd = safefs.open_dir(path)
        try:
            os.unlink(paths.FAILED_MARK, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        finally:
            os.close(dir_fd)
    else:
        safefs.write_in(path, paths.FAILED_MARK, why.encode("utf-8") + b"\n", 0o644)


def _size(path: str) -> int:
    total = 0
    for _rel, st in statwalk.walk(path, ordered=False):
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
    return total


def list_installs(dest: str) -> List[dict]:
    """What `--list-backups` shows: each backup of `dest` (oldest first), the failed install kept
    apart, and the one in place, each with `path`, `number` (None: not a backup), `kind`
    (backup, failed, in place), its record (read_info), `failed` (failed_mark) and `size`."""
    rows = [(n, p, "backup") for n, p in backup_dirs(dest)]
    if is_real_dir(failed_path(dest)):
        rows.append((None, failed_path(dest), "failed"))
    if is_real_dir(dest):
        rows.append((None, os.path.abspath(dest), "in place"))
    out = []
    for number, path, kind in rows:
        info = read_info(path)
        out.append(
            {
                "number": number,
                "path": path,
                "kind": kind,
                "info": info,
                "failed": failed_mark(path),
                "size": _size(path),
            }
        )
    return out


def remove(path: str) -> None:
    """Remove a directory tree, or a link or file (never what a link points to)."""
    if is_real_dir(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _copy_over(root: str, rel: str, st: os.stat_result) -> bool:
    """Replace `rel` in `root` with a copy of itself (a new inode, same content, mode, owner and
    times): a reflink where the file system has them (free), else an in-kernel copy. True when
    it was a reflink."""
    head, name = os.path.split(rel)
    dir_fd = safefs.open_dir(root, head)
    try:
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            if (os.fstat(src).st_ino, os.fstat(src).st_dev) != (st.st_ino, st.st_dev):
                raise OSError(errno.ESTALE, "changed while the tree was walked", rel)
            fd, tmp = safefs.make_temp(dir_fd, name, 0o600)
            try:
                try:
                    fcntl.ioctl(fd, FICLONE, src)
                    cloned = True
                except OSError:
                    cloned = False
                    offset = 0
                    while offset < st.st_size:
                        sent = os.sendfile(fd, src, offset, min(1 << 30, st.st_size - offset))
                        if sent == 0:
                            break
                        offset += sent
                os.fchown(fd, st.st_uid, st.st_gid)
                os.fchmod(fd, stat.S_IMODE(st.st_mode))  # after chown, which clears setuid
                os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except (OSError, UnboundLocalError):
                pass
            raise
        finally:
            os.close(src)
    finally:
        os.close(dir_fd)
    return cloned


def unshare_backup(backup: str, dest: str) -> dict:
    """Make `backup` independent of the live install at `dest`: each file of it that is the same
    inode as the same path in `dest` (an incremental install hard-links the unchanged files of
    the previous install into its staging) is replaced in the backup by a copy with the same
    content, mode, owner and times. Then a later in-place write to the live install (a tool that
    rewrites a file instead of replacing it) cannot change the backup a rollback would put back.
    The live install keeps its inodes. A reflink where the file system has them costs nothing;
    elsewhere it is a local copy of the unchanged bytes, made after the swap, so the new install
    is in place no later. Returns {"files", "bytes", "reflinked"}."""
    files = nbytes = reflinked = 0
    for rel, st in statwalk.walk(backup):
        if not stat.S_ISREG(st.st_mode) or st.st_nlink < 2:
            continue
        try:
            live = os.lstat(os.path.join(dest, rel))
        except OSError:
            continue
        if (live.st_dev, live.st_ino) != (st.st_dev, st.st_ino):
            continue
        reflinked += _copy_over(backup, rel, st)
        files += 1
        nbytes += st.st_size
    return {"files": files, "bytes": nbytes, "reflinked": reflinked}


def describe_install(path: str) -> dict:
    """What an install is, for a restore's report: where, the source it was made from, whether
    it was rolled back for failed checks, and a stat check of it against its own manifest (a file
    changed since it was installed, e.g. written in place, is named)."""
    out: dict = {"path": path, "failed": failed_mark(path), "info": read_info(path)}
    try:
        got = _read_record(path, paths.INSTALLED_MANIFEST, 1 << 30)
    except proven.NotOurs as exc:
        out.update(source_fingerprint=None, tree_check={"ok": False, "why": exc.why})
        return out
    if got is None:
        out.update(
            source_fingerprint=None,
            tree_check={"ok": None, "why": "no .rb-manifest.jsonl in this install"},
        )
        return out
    try:
        lines = [json.loads(line) for line in got.decode("utf-8").splitlines() if line.strip()]
        record = {"header": lines[0], "entries": lines[1:-1], "totals": lines[-1]["totals"]}
    except (ValueError, KeyError, IndexError):
        out.update(
            source_fingerprint=None,
            tree_check={"ok": False, "why": "its .rb-manifest.jsonl is not a manifest"},
        )
        return out
    out["source_fingerprint"] = record["header"].get("source_fingerprint")
    out["tree_check"] = manifest.check_tree(path, record)
    return out
