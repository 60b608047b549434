"""Putting a staging in place, and an earlier install back: swap, restore, backups, the journal.

Public through rbkit.hostfs (hostfs.swap, hostfs.restore, ...). One rename where the file system
can exchange two names (renameat2 RENAME_EXCHANGE); elsewhere (NFS) two renames, journaled beside
the destination first, so an interruption between them is finished or undone by the next run
(`recover_swap`, which swap, restore and prune_backups call first) instead of leaving the previous
install where the next run deletes it. A destination or staging that is a symlink is refused.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import re
import shutil
import stat
from typing import List, Optional

from rbrules.common import SWAP_ATOMIC

from . import exports, manifest, privacy, safefs

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
FICLONE = 0x40049409
FAILED_MARK = ".rb-failed"                     # in an install whose checks failed (manifest skips it)
INFO = ".rb-install.json"                      # what an install is: when, from what, its checks


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
    """(number, path) of every name `DEST.rb-backup.N` beside `dest`, oldest first (whatever they
    are: `backup_dirs` keeps the real directories)."""
    parent, base = os.path.split(dest)
    pat = re.compile(re.escape(base) + r"\.rb-backup\.([0-9]+)$")
    found = []
    for name in os.listdir(parent or "."):
        m = pat.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(parent, name)))
    return sorted(found)


def backup_dirs(dest: str) -> list[tuple[int, str]]:
    """The backups that are real directories of ours (a link named like one, or a directory
    another user made there, is not ours to use: `foreign_backups` says why)."""
    return [(n, p) for n, p in backups(dest) if _is_real_dir(p) and _not_ours(p) is None]


def _not_ours(path: str) -> Optional[str]:
    """Why the directory `path`, named like a backup, may have been planted by another user (None:
    it cannot have been). In a private parent (rbkit.privacy) only this user and root make
    entries, so every one is ours, whoever owns it (a previous install of another user, moved
    aside by a swap). In a parent others can write (transfer.shared_parent: allow), one owned by
    another user than this one or root, or writable by every user, is not ours: only root can
    give a directory another owner, so one planted there keeps its planter's. Group write is not
    judged: extraction keeps the source root's (umask 002)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if privacy.why_not_private(os.path.dirname(os.path.abspath(path)), os.geteuid()) is None:
        return None
    if st.st_uid not in (os.geteuid(), 0):
        return (f"{path} is owned by {privacy.owner(st)}, not by "
                f"{privacy.user_name(os.geteuid())}: not a "
                "backup this kit made (another user can make a directory of that name beside "
                "the destination); it is never restored, counted or removed: look at it and "
                "remove it")
    if stat.S_IMODE(st.st_mode) & 0o002:
        return (f"{path} is writable by every user (mode {stat.S_IMODE(st.st_mode):04o}): not a "
                "backup this kit made; it is never restored, counted or removed: look at it and "
                "remove it")
    return None


def foreign_backups(dest: str) -> list[str]:
    """Why each directory named like a backup of `dest` is not one of ours (`_not_ours`)."""
    return [why for _n, p in backups(dest) if _is_real_dir(p)
            for why in [_not_ours(p)] if why is not None]


def _is_real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _next_backup(dest: str) -> str:
    found = backups(dest)
    return f"{dest}.rb-backup.{(found[-1][0] + 1) if found else 1}"


def _refuse_link(path: str, what: str) -> None:
    if os.path.islink(path):
        raise OSError(errno.ELOOP, f"the {what} {path} is a symlink to {os.readlink(path)}: refusing "
                      "to replace a link with a directory (its target would be left behind, and the "
                      f"next steps would act on the link); name {os.path.realpath(path)} itself")


def failed_mark(path: str) -> Optional[str]:
    """Why the install at `path` was rolled back (its checks failed), or None."""
    got = safefs.read_in(path, FAILED_MARK, limit=64 << 10)
    return got[0].decode("utf-8", "replace").strip() if got is not None else None


def failed_path(dest: str) -> str:
    """Where the one install whose checks failed is kept apart: `DEST.rb-failed` (never a backup:
    never counted toward keep_backups, never restored without being named, replaced by the next
    failure)."""
    return os.path.abspath(dest) + ".rb-failed"


def read_info(path: str) -> dict:
    """The install's own record (INFO, written by the engine: `installed` (UTC, ISO 8601),
    `origin` (the runbook and its spec), `source_fingerprint`, `checks` (passed, none, not run,
    failed: ...), `put_back_after`); {} when it has none or it is not one."""
    got = safefs.read_in(path, INFO, limit=64 << 10)
    try:
        doc = json.loads(got[0]) if got is not None else {}
    except ValueError:
        doc = {}
    return doc if isinstance(doc, dict) else {}


def write_info(path: str, **fields: object) -> dict:
    """Merge `fields` into the install's record (a None value removes the key)."""
    doc = read_info(path)
    doc.update(fields)
    doc = {k: v for k, v in doc.items() if v is not None}
    safefs.write_in(path, INFO, json.dumps(doc, sort_keys=True).encode() + b"\n", 0o644)
    return doc


def set_checks(path: str, passed: bool, why: str = "") -> None:
    """Record the checks' verdict on the install at `path`: passed (the failure mark removed), or
    failed (marked: FAILED_MARK says why)."""
    write_info(path, checks="passed" if passed else "failed: " + why)
    if passed:
        dir_fd = safefs.open_dir(path)
        try:
            os.unlink(FAILED_MARK, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        finally:
            os.close(dir_fd)
    else:
        safefs.write_in(path, FAILED_MARK, why.encode("utf-8") + b"\n", 0o644)


def _keep_failed(path: str, dest: str) -> str:
    """Move the install at `path` (its checks failed) to `failed_path(dest)`, replacing the one
    kept there before. Returns where it is."""
    target = failed_path(dest)
    if os.path.abspath(path) == target:
        return target                    # exchanged with the failed one: already there
    if os.path.lexists(target):
        remove(target)
    os.rename(path, target)
    _sync_parent(os.path.dirname(target))
    return target


def _size(path: str) -> int:
    total = 0
    for _rel, st in manifest.walk(path, ordered=False):
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
    return total


def list_installs(dest: str) -> List[dict]:
    """What `--list-backups` shows: each backup of `dest` (oldest first), the failed install kept
    apart, and the one in place, each with `path`, `number` (None: not a backup), `kind`
    (backup, failed, in place), its record (read_info), `failed` (failed_mark) and `size`."""
    rows = [(n, p, "backup") for n, p in backup_dirs(dest)]
    if _is_real_dir(failed_path(dest)):
        rows.append((None, failed_path(dest), "failed"))
    if _is_real_dir(dest):
        rows.append((None, os.path.abspath(dest), "in place"))
    out = []
    for number, path, kind in rows:
        info = read_info(path)
        out.append({"number": number, "path": path, "kind": kind, "info": info,
                    "failed": failed_mark(path), "size": _size(path)})
    return out


# -- the journal of a swap that is more than one rename ---------------------------------------


def journal_path(dest: str) -> str:
    """The journal of `dest`'s swap or restore in progress: beside it, `.NAME.rb-swap-journal`."""
    parent, base = os.path.split(os.path.abspath(dest))
    return os.path.join(parent, f".{base}.rb-swap-journal")


def _write_journal(dest: str, doc: dict) -> None:
    """The journal, made with O_EXCL|O_NOFOLLOW (0600) and fsync'd with its directory before the
    first rename it describes."""
    parent, name = os.path.split(journal_path(dest))
    dir_fd = safefs.open_dir(parent)
    try:
        fd = safefs.create_excl(dir_fd, name, 0o600)
        try:
            safefs.write_all(fd, json.dumps(doc, sort_keys=True).encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        safefs.fsync_dir(dir_fd)
    finally:
        os.close(dir_fd)


def _drop_journal(dest: str) -> None:
    parent = os.path.dirname(journal_path(dest))
    os.unlink(journal_path(dest))
    _sync_parent(parent)


def _sync_parent(parent: str) -> None:
    dir_fd = safefs.open_dir(parent)
    try:
        safefs.fsync_dir(dir_fd)
    finally:
        os.close(dir_fd)


def _read_journal(dest: str) -> Optional[dict]:
    """The journal, if any, checked: ours (a regular file of this user, not writable by others),
    and every name in it one of dest's own: its backups, `.NAME.rb-old`, `.NAME.rb-restore`, a
    staging beside it. Anything else is an error to look at, never a list of renames to obey."""
    path = journal_path(dest)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid()
                or stat.S_IMODE(st.st_mode) & 0o022 or st.st_size > 1 << 16):
            raise ValueError(f"swap journal {path} was not written by this kit (owner, mode or "
                             "size); look at it and remove it by hand")
        raw = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    base = re.escape(os.path.basename(os.path.abspath(dest)))
    names = re.compile(rf"^(?:{base}\.rb-backup\.[0-9]+|{base}\.rb-failed|\.{base}\.rb-(?:old|restore))$")
    try:
        doc = json.loads(raw)
        ok = (doc.get("v") == 1 and doc.get("op") in ("swap", "restore")
              and names.match(doc.get("old", "")) is not None
              and isinstance(doc.get("ino"), list) and len(doc["ino"]) == 2
              and (doc["op"] != "swap" or doc.get("policy") in ("backup", "replace"))
              and (doc["op"] != "restore" or names.match(doc.get("backup", "")) is not None)
              and "/" not in doc.get("staging", "") and doc.get("staging") not in (".", ".."))
    except (ValueError, AttributeError, TypeError):
        ok = False
    if not ok:
        raise ValueError(f"swap journal {path} does not describe a swap of {dest}; look at it and "
                         "remove it by hand")
    return doc


def _ino(path: str) -> Optional[list]:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino] if stat.S_ISDIR(st.st_mode) else None


def recover_swap(dest: str) -> Optional[dict]:
    """Finish or undo a swap (or restore) of `dest` that was interrupted between its renames
    (a file system without RENAME_EXCHANGE, e.g. NFS, takes two; the move of the previous install
    to its backup name is one more). The journal names where each install was going and the
    previous install's inode, so this finds it wherever the interruption left it:

    - at `dest` with nothing else done: nothing to do;
    - in the staging (the exchange happened, its backup name was not given yet): moved to its
      backup name (policy backup) or removed (replace);
    - at its backup or `.NAME.rb-old` name with `dest` missing: put back at `dest` (undone);
    - there, with the new install at `dest`: `.rb-old` removed (finished).
    Returns what it did ({"action", "detail"}), or None when there was no journal."""
    doc = _read_journal(dest)
    if doc is None:
        return None
    parent = os.path.dirname(os.path.abspath(dest))
    old_at = os.path.join(parent, doc["old"])
    ino = doc["ino"]
    if doc["op"] == "restore":
        return _recover_restore(dest, doc, parent, old_at)
    staging = os.path.join(parent, doc["staging"]) if doc.get("staging") else None
    if _ino(dest) == ino:
        action, detail = "nothing", "the swap had not started; the previous install is in place"
    elif staging and _ino(staging) == ino:
        if doc["policy"] == "backup":
            target = old_at if not os.path.lexists(old_at) else _next_backup(dest)
            os.rename(staging, target)
            action, detail = "finished", f"the previous install moved to {target}"
        else:
            shutil.rmtree(staging)
            action, detail = "finished", "the previous install removed (policy replace)"
    elif _ino(old_at) == ino and not os.path.lexists(dest):
        os.rename(old_at, dest)
        action, detail = "undone", f"the previous install is back at {dest}"
    elif _ino(old_at) == ino:
        if doc["policy"] == "replace":
            shutil.rmtree(old_at)
            action, detail = "finished", "the previous install removed (policy replace)"
        else:
            action, detail = "finished", f"the previous install is kept at {old_at}"
    else:
        action, detail = "nothing", "the previous install is not where the journal says"
    _sync_parent(parent)
    _drop_journal(dest)
    return {"action": action, "detail": detail}


def _recover_restore(dest: str, doc: dict, parent: str, old_at: str) -> dict:
    """A restore without RENAME_EXCHANGE: dest -> .NAME.rb-restore, backup -> dest,
    .NAME.rb-restore -> backup's name. `ino` is the install that was current."""
    backup = os.path.join(parent, doc["backup"])
    ino = doc["ino"]
    if _ino(old_at) == ino and not os.path.lexists(dest):
        os.rename(old_at, dest)
        action, detail = "undone", f"the install that was current is back at {dest}"
    elif _ino(old_at) == ino:
        os.rename(old_at, backup if not os.path.lexists(backup) else _next_backup(dest))
        action, detail = "finished", "the restored install is in place"
    else:
        action, detail = "nothing", "the restore had not started, or had finished"
    _sync_parent(parent)
    _drop_journal(dest)
    return {"action": action, "detail": detail}


# -- swap, restore, backups ----------------------------------------------------------------------


def swap(staging: str, dest: str, policy: str, *, swap_atomic: str = "allow",
         keep_backups: Optional[int] = None, unshare: bool = True) -> dict:
    """Put `staging` at `dest` in one step; what was at `dest` is refused, kept or removed.

    A swap interrupted earlier is finished or undone first (`recover_swap`). `dest` or `staging`
    being a symlink is refused, naming its target. Where the file system cannot exchange two
    names in one rename (RENAME_EXCHANGE, missing on NFS), `swap_atomic: require` refuses before
    anything moves; `allow` swaps with two renames, journaled, and says so (`atomic: false`).
    With policy backup, the backup is made independent of the new install (`unshare_backup`:
    an incremental install linked its unchanged files from it), and with `keep_backups` N only the
    N newest backups are kept (`prune_backups`)."""
    if swap_atomic not in SWAP_ATOMIC:
        raise ValueError(f"swap_atomic must be one of {SWAP_ATOMIC}, not {swap_atomic!r}")
    recovered = recover_swap(dest)
    _refuse_link(dest, "destination")
    _refuse_link(staging, "staging directory")
    if os.path.lexists(dest) and not _is_real_dir(dest):
        raise FileExistsError(f"the destination {dest} exists and is not a directory")
    if not _is_real_dir(staging):
        raise FileNotFoundError(f"staging directory {staging} is missing")
    parent = os.path.dirname(os.path.abspath(dest))
    if os.path.dirname(os.path.abspath(staging)) != parent:
        raise ValueError(f"staging {staging} must be beside the destination {dest}")
    result: dict = {"policy": policy, "swap_atomic": swap_atomic}
    if recovered:
        result["recovered"] = recovered
    if not os.path.lexists(dest):
        if not _renameat2(staging, dest, RENAME_NOREPLACE):
            os.rename(staging, dest)
        result.update(previous="none", atomic=True)
        return _after_swap(result, dest, keep_backups)
    if policy == "refuse":
        raise FileExistsError(f"{dest} exists and on_existing is refuse")
    # an install whose checks failed (on_failed_checks: keep) is kept apart, never as a backup
    was_failed = policy == "backup" and failed_mark(dest) is not None
    old_at = (failed_path(dest) if was_failed else _next_backup(dest)) if policy == "backup" \
        else os.path.join(parent, "." + os.path.basename(os.path.abspath(dest)) + ".rb-old")
    if (policy != "backup" or was_failed) and os.path.lexists(old_at):
        remove(old_at)       # debris of an earlier replace (its journal is gone), an older failure
    journal = {"v": 1, "op": "swap", "policy": policy, "old": os.path.basename(old_at),
               "staging": os.path.basename(os.path.abspath(staging)), "ino": _ino(dest)}
    # the journal before the exchange too: its previous install sits at the staging's name until
    # it is renamed to its backup name, and a re-run starts by removing the staging
    _write_journal(dest, journal)
    exchanged = _renameat2(staging, dest, RENAME_EXCHANGE)
    if exchanged:
        _sync_parent(parent)
        os.rename(staging, old_at)
    else:
        if swap_atomic == "require":
            _drop_journal(dest)
            raise OSError(errno.EOPNOTSUPP, f"this file system cannot swap {dest} in one rename "
                          "(no RENAME_EXCHANGE, e.g. NFS) and transfer.swap_atomic is require")
        os.rename(dest, old_at)
        _sync_parent(parent)
        os.rename(staging, dest)
        result["note"] = ("no RENAME_EXCHANGE here (NFS?): swapped with two renames, journaled in "
                          f"{journal_path(dest)} until done")
    _sync_parent(parent)
    result["atomic"] = exchanged
    if policy == "backup":
        result["previous"] = old_at
        result["previous_failed"] = was_failed
    else:
        shutil.rmtree(old_at)
        result["previous"] = "removed"
    _drop_journal(dest)
    if policy == "backup" and unshare:
        result["unshared"] = unshare_backup(old_at, dest)
    return _after_swap(result, dest, keep_backups)


def _after_swap(result: dict, dest: str, keep_backups: Optional[int]) -> dict:
    if keep_backups is not None:
        result["pruned"] = prune_backups(dest, keep_backups)
    return result


def remove(path: str) -> None:
    """Remove a directory tree, or a link or file (never what a link points to)."""
    if _is_real_dir(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def prune_backups(dest: str, keep: int) -> List[str]:
    """Remove all but the `keep` newest good backups of `dest` (transfer.keep_backups, at least 1:
    the newest is what a rollback puts back). A backup marked as failed its checks (left by an
    interrupted rollback, or an older kit) is neither counted nor removed, so it never evicts a
    good one; nor is a link named like a backup. Returns the paths removed. The engine calls it
    only once the new install passed its checks."""
    if keep < 1:
        raise ValueError("keep_backups must be at least 1: the newest backup is what a rollback "
                         "puts back")
    recover_swap(dest)
    good = [(n, p) for n, p in backup_dirs(dest) if failed_mark(p) is None]
    removed = []
    for _n, path in good[:-keep]:
        shutil.rmtree(path)
        removed.append(path)
    return removed


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
                        n = os.sendfile(fd, src, offset, min(1 << 30, st.st_size - offset))
                        if n == 0:
                            break
                        offset += n
                os.fchown(fd, st.st_uid, st.st_gid)
                os.fchmod(fd, stat.S_IMODE(st.st_mode))          # after chown, which clears setuid
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
    for rel, st in manifest.walk(backup):
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
    got = safefs.read_in(path, ".rb-manifest.jsonl", limit=1 << 30)
    if got is None:
        out.update(source_fingerprint=None,
                   tree_check={"ok": None, "why": "no .rb-manifest.jsonl in this install"})
        return out
    try:
        lines = [json.loads(line) for line in got[0].decode("utf-8").splitlines() if line.strip()]
        m = {"header": lines[0], "entries": lines[1:-1], "totals": lines[-1]["totals"]}
    except (ValueError, KeyError, IndexError):
        out.update(source_fingerprint=None,
                   tree_check={"ok": False, "why": "its .rb-manifest.jsonl is not a manifest"})
        return out
    out["source_fingerprint"] = m["header"].get("source_fingerprint")
    out["tree_check"] = manifest.check_tree(path, m)
    return out


def restore(dest: str, number: Optional[int] = None, *, env_file: Optional[str] = None,
            failed: Optional[str] = None, swap_atomic: str = "allow",
            from_failed: bool = False) -> dict:
    """Put backup N (default: the newest whose checks did not fail) back at `dest`.

    What was in place goes apart as `DEST.rb-failed` when its checks failed (`failed` given: a
    rollback, which marks it; or marked by an earlier probe), else it becomes the newest backup
    (a new number, never the name of the one restored). An interrupted swap is finished or undone
    first; when that already put the previous install back, nothing more moves. With `env_file`,
    the restored install's own env file (`DEST/.rb-env.sh`, see exports.write) is put back there.
    The result says which backup was chosen and why (`why`, `skipped`), where the replaced install
    is (`kept_current_as`), and what is at `dest` now (`installed`: its record, a stat check).
    `from_failed` (a rollback whose swap moved an install that had failed its checks apart): that
    install, at `DEST.rb-failed`, is what goes back; the one replacing it there is `failed`."""
    if swap_atomic not in SWAP_ATOMIC:
        raise ValueError(f"swap_atomic must be one of {SWAP_ATOMIC}, not {swap_atomic!r}")
    recovered = recover_swap(dest)
    _refuse_link(dest, "destination")
    result: dict = {"recovered": recovered, "atomic": True}
    if recovered and recovered["action"] == "undone":
        result.update(restored=None, kept_current_as=None, why=recovered["detail"], skipped=[])
    else:
        result.update(_restore_backup(dest, number, failed, swap_atomic, from_failed))
    result["env_file"] = exports.restore_env(dest, env_file) if env_file else None
    result["installed"] = describe_install(dest)
    return result


def _restore_backup(dest: str, number: Optional[int], failed: Optional[str],
                    swap_atomic: str, from_failed: bool = False) -> dict:
    found = dict(backup_dirs(dest))
    foreign = foreign_backups(dest)
    if from_failed:
        if not _is_real_dir(failed_path(dest)):
            raise FileNotFoundError(f"{failed_path(dest)} is not there to put back")
        return _exchange(dest, failed_path(dest), failed, swap_atomic, {
            "restored": failed_path(dest), "skipped": [], "ignored": foreign,
            "why": "the install this run replaced (its checks had failed before)"})
    if number is not None and number not in found:
        why = _not_ours(f"{dest}.rb-backup.{number}")
        if why:
            raise PermissionError(f"refusing to restore backup {number}: {why}")
    apart = failed_path(dest)
    apart_note = (f"; the install whose checks failed is kept apart at {apart} and is never "
                  "restored by --restore: move it back by hand if you mean to"
                  if _is_real_dir(apart) else "")
    if not found:
        raise FileNotFoundError(f"no backup of {dest} to restore (no {dest}.rb-backup.N)"
                                + apart_note
                                + (f" ({'; '.join(foreign)})" if foreign else ""))
    skipped = [f"{found[n]} ({failed_mark(found[n])})" for n in sorted(found)
               if failed_mark(found[n]) is not None and n != number]
    if number is None:
        usable = [n for n in sorted(found) if failed_mark(found[n]) is None]
        if not usable:
            raise FileNotFoundError(
                f"every backup of {dest} failed its checks ({', '.join(found[n] for n in sorted(found))});"
                " name one to put it back anyway: --restore N")
        number = usable[-1]
        checks = read_info(found[number]).get("checks")
        why = ("the newest backup whose checks passed" if checks == "passed" else
               "the newest backup not marked as failed its checks (its checks: %s)"
               % (checks or "not recorded"))
    elif number in found:
        why = "named on the command line (--restore %d)" % number
        if failed_mark(found[number]) is not None:
            why += "; its checks had failed: %s" % failed_mark(found[number])
    if number not in found:
        raise FileNotFoundError(f"{dest}.rb-backup.{number} does not exist (backups: "
                                f"{', '.join(str(n) for n in sorted(found))})")
    return _exchange(dest, found[number], failed, swap_atomic,
                     {"restored": found[number], "why": why, "skipped": skipped,
                      "ignored": foreign})


def _exchange(dest: str, source: str, failed: Optional[str], swap_atomic: str,
              done: dict) -> dict:
    """The install at `source` (a backup, or the failed one) to `dest`; what was there to a new
    backup number, or apart as DEST.rb-failed when its checks failed."""
    if not os.path.lexists(dest):
        os.rename(source, dest)
        return dict(done, kept_current_as=None)
    current_failed = failed or failed_mark(dest)
    atomic = _renameat2(source, dest, RENAME_EXCHANGE)
    if not atomic:
        if swap_atomic == "require":
            raise OSError(errno.EOPNOTSUPP, f"this file system cannot swap {dest} in one rename "
                          "(no RENAME_EXCHANGE, e.g. NFS) and transfer.swap_atomic is require")
        parent, base = os.path.split(os.path.abspath(dest))
        aside = os.path.join(parent, f".{base}.rb-restore")
        if os.path.lexists(aside):
            remove(aside)
        _write_journal(dest, {"v": 1, "op": "restore", "old": os.path.basename(aside),
                              "backup": os.path.basename(source), "ino": _ino(dest)})
        os.rename(dest, aside)
        _sync_parent(parent)
        os.rename(source, dest)
        _sync_parent(parent)
        os.rename(aside, source)
        _sync_parent(parent)
        _drop_journal(dest)
    else:
        _sync_parent(os.path.dirname(os.path.abspath(dest)))
    # what was in place: apart when its checks failed, else the newest backup (a new number)
    if current_failed:
        if failed:
            safefs.write_in(source, FAILED_MARK, failed.encode("utf-8") + b"\n", 0o644)
        kept = _keep_failed(source, dest)
    else:
        kept = _next_backup(dest)
        os.rename(source, kept)
        _sync_parent(os.path.dirname(kept))
    return dict(done, kept_current_as=kept, kept_failed=bool(current_failed), atomic=atomic)
