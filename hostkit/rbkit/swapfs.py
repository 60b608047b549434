"""Putting a staging in place, and an earlier install back: swap, restore, pruning the backups,
the journal. What the installs beside a destination are (backups, the failed one, their records)
is rbkit.installs.

Public through rbkit.hostfs (swapfs.swap, swapfs.restore, ...). One rename where the file system
can exchange two names (renameat2 RENAME_EXCHANGE); elsewhere (NFS) two renames, journaled beside
the destination first, so an interruption between them is finished or undone by the next run
(`recover_swap`, which swap, restore and prune_backups call first) instead of leaving the previous
install where the next run deletes it. A destination or staging that is a symlink is refused.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import stat
from typing import List, Optional

from rbrules import paths, proven
from rbrules.choices import SWAP_ATOMIC

from . import exports, safefs
from .installs import (
    backup_dirs,
    describe_install,
    failed_mark,
    failed_path,
    foreign_backups,
    is_real_dir,
    next_backup,
    not_ours,
    read_info,
    remove,
    unshare_backup,
)

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


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


def _refuse_link(path: str, what: str) -> None:
    if os.path.islink(path):
        raise OSError(
            errno.ELOOP,
            f"the {what} {path} is a symlink to {os.readlink(path)}: refusing "
            "to replace a link with a directory (its target would be left behind, and the "
            f"next steps would act on the link); name {os.path.realpath(path)} itself",
        )


def _keep_failed(path: str, dest: str) -> str:
    """Move the install at `path` (its checks failed) to `failed_path(dest)`, replacing the one
    kept there before. Returns where it is."""
    target = failed_path(dest)
    if os.path.abspath(path) == target:
        return target  # exchanged with the failed one: already there
    if os.path.lexists(target):
        remove(target)
    os.rename(path, target)
    _sync_parent(os.path.dirname(target))
    return target


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
        got = proven.read_ours(path, limit=1 << 16)
    except proven.NotOurs as exc:
        raise ValueError(
            f"swap journal {path} was not written by this kit ({exc.why}); look at "
            "it and remove it by hand"
        ) from None
    if got is None:
        return None
    raw, st = got
    if st.st_uid != os.geteuid():
        raise ValueError(
            f"swap journal {path} was not written by this kit (owner uid "
            f"{st.st_uid}); look at it and remove it by hand"
        )
    name = os.path.basename(os.path.abspath(dest))
    base, failed = re.escape(name), re.escape(paths.failed(name))
    names = re.compile(rf"^(?:{paths.backup_number(name)}|{failed}|\.{base}\.rb-(?:old|restore))$")
    try:
        doc = json.loads(raw)
        ok = (
            doc.get("v") == 1
            and doc.get("op") in ("swap", "restore")
            and names.match(doc.get("old", "")) is not None
            and isinstance(doc.get("ino"), list)
            and len(doc["ino"]) == 2
            and (doc["op"] != "swap" or doc.get("policy") in ("backup", "replace"))
            and (doc["op"] != "restore" or names.match(doc.get("backup", "")) is not None)
            and "/" not in doc.get("staging", "")
            and doc.get("staging") not in (".", "..")
        )
    except (ValueError, AttributeError, TypeError):
        ok = False
    if not ok:
        raise ValueError(
            f"swap journal {path} does not describe a swap of {dest}; look at it and "
            "remove it by hand"
        )
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
            target = old_at if not os.path.lexists(old_at) else next_backup(dest)
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
        os.rename(old_at, backup if not os.path.lexists(backup) else next_backup(dest))
        action, detail = "finished", "the restored install is in place"
    else:
        action, detail = "nothing", "the restore had not started, or had finished"
    _sync_parent(parent)
    _drop_journal(dest)
    return {"action": action, "detail": detail}


# -- swap, restore, backups ----------------------------------------------------------------------


def swap(
    staging: str,
    dest: str,
    policy: str,
    *,
    swap_atomic: str = "allow",
    keep_backups: Optional[int] = None,
    unshare: bool = True,
) -> dict:
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
    if os.path.lexists(dest) and not is_real_dir(dest):
        raise FileExistsError(f"the destination {dest} exists and is not a directory")
    if not is_real_dir(staging):
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
    old_at = (
        (failed_path(dest) if was_failed else next_backup(dest))
        if policy == "backup"
        else os.path.join(parent, "." + os.path.basename(os.path.abspath(dest)) + ".rb-old")
    )
    if (policy != "backup" or was_failed) and os.path.lexists(old_at):
        remove(old_at)  # debris of an earlier replace (its journal is gone), an older failure
    journal = {
        "v": 1,
        "op": "swap",
        "policy": policy,
        "old": os.path.basename(old_at),
        "staging": os.path.basename(os.path.abspath(staging)),
        "ino": _ino(dest),
    }
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
            raise OSError(
                errno.EOPNOTSUPP,
                f"this file system cannot swap {dest} in one rename "
                "(no RENAME_EXCHANGE, e.g. NFS) and transfer.swap_atomic is require",
            )
        os.rename(dest, old_at)
        _sync_parent(parent)
        os.rename(staging, dest)
        result["note"] = (
            "no RENAME_EXCHANGE here (NFS?): swapped with two renames, journaled in "
            f"{journal_path(dest)} until done"
        )
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


def prune_backups(dest: str, keep: int) -> List[str]:
    """Remove all but the `keep` newest good backups of `dest` (transfer.keep_backups, at least 1:
    the newest is what a rollback puts back). A backup marked as failed its checks (left by an
    interrupted rollback, or an older kit) is neither counted nor removed, so it never evicts a
    good one; nor is a link named like a backup. Returns the paths removed. The engine calls it
    only once the new install passed its checks."""
    if keep < 1:
        raise ValueError(
            "keep_backups must be at least 1: the newest backup is what a rollback puts back"
        )
    recover_swap(dest)
    good = [(n, p) for n, p in backup_dirs(dest) if failed_mark(p) is None]
    removed = []
    for _n, path in good[:-keep]:
        shutil.rmtree(path)
        removed.append(path)
    return removed


def restore(
    dest: str,
    number: Optional[int] = None,
    *,
    env_file: Optional[str] = None,
    failed: Optional[str] = None,
    swap_atomic: str = "allow",
    from_failed: bool = False,
    known: Optional[list] = None,
) -> dict:
    """Put backup N (default: the newest whose checks did not fail) back at `dest`.

    What was in place goes apart as `DEST.rb-failed` when its checks failed (`failed` given: a
    rollback, which marks it; or marked by an earlier probe), else it becomes the newest backup
    (a new number, never the name of the one restored). An interrupted swap is finished or undone
    first; when that already put the previous install back, nothing more moves. With `env_file`,
    the restored install's own env file (`DEST/.rb-env.sh`, see exports.write) is put back there.
    The result says which backup was chosen and why (`why`, `skipped`), where the replaced install
    is (`kept_current_as`), and what is at `dest` now (`installed`: its record, a stat check).
    `from_failed` (a rollback whose swap moved an install that had failed its checks apart): that
    install, at `DEST.rb-failed`, is what goes back; the one replacing it there is `failed`.

    Nothing is put back that is not proven ours: every entry of the install chosen, itself
    included, is owned by this user or root and writable by no other (rbrules.proven), or the
    restore is refused naming the first that is not; `known` (a rollback): the identity
    [st_dev, st_ino] of the install this run's swap moved aside, which goes back as it was."""
    if swap_atomic not in SWAP_ATOMIC:
        raise ValueError(f"swap_atomic must be one of {SWAP_ATOMIC}, not {swap_atomic!r}")
    recovered = recover_swap(dest)
    _refuse_link(dest, "destination")
    result: dict = {"recovered": recovered, "atomic": True}
    if recovered and recovered["action"] == "undone":
        result.update(restored=None, kept_current_as=None, why=recovered["detail"], skipped=[])
    else:
        result.update(_restore_backup(dest, number, failed, swap_atomic, from_failed, known))
    result["env_file"] = exports.restore_env(dest, env_file) if env_file else None
    result["installed"] = describe_install(dest)
    return result


def _proven_tree(path: str, known: Optional[list]) -> None:
    """Refuse to put `path` in place unless it is the install this run moved aside (`known`, its
    identity) or every entry of it is proven ours (rbrules.proven.not_ours_in_tree)."""
    if known is not None and _ino(path) == list(known):
        return
    found = proven.not_ours_in_tree(path, limit=4)
    if found:
        raise PermissionError(
            f"refusing to restore {path}: {'; '.join(found)}: a tree another "
            "user owns or can write is never installed; look at it, and move it "
            "back by hand if you mean to"
        )


def _restore_backup(
    dest: str,
    number: Optional[int],
    failed: Optional[str],
    swap_atomic: str,
    from_failed: bool = False,
    known: Optional[list] = None,
) -> dict:
    found = dict(backup_dirs(dest))
    foreign = foreign_backups(dest)
    if from_failed:
        if not is_real_dir(failed_path(dest)):
            raise FileNotFoundError(f"{failed_path(dest)} is not there to put back")
        why = not_ours(failed_path(dest))
        if why and (known is None or _ino(failed_path(dest)) != list(known)):
            raise PermissionError(f"refusing to put back {failed_path(dest)}: {why}")
        _proven_tree(failed_path(dest), known)
        return _exchange(
            dest,
            failed_path(dest),
            failed,
            swap_atomic,
            {
                "restored": failed_path(dest),
                "skipped": [],
                "ignored": foreign,
                "why": "the install this run replaced (its checks had failed before)",
            },
        )
    if number is not None and number not in found:
        named = paths.backup(dest, number)
        why = not_ours(named)
        if why and known is not None and _ino(named) == list(known):
            found[number] = named  # the install this run moved aside: it goes back
        elif why:
            raise PermissionError(f"refusing to restore backup {number}: {why}")
    apart = failed_path(dest)
    apart_note = (
        f"; the install whose checks failed is kept apart at {apart} and is never "
        "restored by --restore: move it back by hand if you mean to"
        if is_real_dir(apart)
        else ""
    )
    if not found:
        raise FileNotFoundError(
            f"no backup of {dest} to restore (no {paths.backup(dest, 1)[:-1]}N)"
            + apart_note
            + (f" ({'; '.join(foreign)})" if foreign else "")
        )
    skipped = [
        f"{found[n]} ({failed_mark(found[n])})"
        for n in sorted(found)
        if failed_mark(found[n]) is not None and n != number
    ]
    if number is None:
        usable = [n for n in sorted(found) if failed_mark(found[n]) is None]
        if not usable:
            raise FileNotFoundError(
                f"every backup of {dest} failed its checks "
                f"({', '.join(found[n] for n in sorted(found))});"
                " name one to put it back anyway: --restore N"
            )
        number = usable[-1]
        checks = read_info(found[number]).get("checks")
        why = (
            "the newest backup whose checks passed"
            if checks == "passed"
            else "the newest backup not marked as failed its checks (its checks: %s)"
            % (checks or "not recorded")
        )
    elif number in found:
        why = "named on the command line (--restore %d)" % number
        if failed_mark(found[number]) is not None:
            why += "; its checks had failed: %s" % failed_mark(found[number])
    if number not in found:
        raise FileNotFoundError(
            f"{paths.backup(dest, number)} does not exist (backups: "
            f"{', '.join(str(n) for n in sorted(found))})"
        )
    _proven_tree(found[number], known)
    return _exchange(
        dest,
        found[number],
        failed,
        swap_atomic,
        {"restored": found[number], "why": why, "skipped": skipped, "ignored": foreign},
    )


def _exchange(dest: str, source: str, failed: Optional[str], swap_atomic: str, done: dict) -> dict:
    """The install at `source` (a backup, or the failed one) to `dest`; what was there to a new
    backup number, or apart as DEST.rb-failed when its checks failed."""
    if not os.path.lexists(dest):
        os.rename(source, dest)
        return dict(done, kept_current_as=None)
    current_failed = failed or failed_mark(dest)
    atomic = _renameat2(source, dest, RENAME_EXCHANGE)
    if not atomic:
        if swap_atomic == "require":
            raise OSError(
                errno.EOPNOTSUPP,
                f"this file system cannot swap {dest} in one rename "
                "(no RENAME_EXCHANGE, e.g. NFS) and transfer.swap_atomic is require",
            )
        parent, base = os.path.split(os.path.abspath(dest))
        aside = os.path.join(parent, f".{base}.rb-restore")
        if os.path.lexists(aside):
            remove(aside)
        _write_journal(
            dest,
            {
                "v": 1,
                "op": "restore",
                "old": os.path.basename(aside),
                "backup": os.path.basename(source),
                "ino": _ino(dest),
            },
        )
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
            safefs.write_in(source, paths.FAILED_MARK, failed.encode("utf-8") + b"\n", 0o644)
        kept = _keep_failed(source, dest)
    else:
        kept = next_backup(dest)
        os.rename(source, kept)
        _sync_parent(os.path.dirname(kept))
    return dict(done, kept_current_as=kept, kept_failed=bool(current_failed), atomic=atomic)
