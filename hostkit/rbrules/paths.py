"""The names a run keeps beside a destination, one rule each, read by the kit (which makes them)
and by the compiler (which shows them in --dry-run, --plan and the settings): the staging
(`.NAME.rb-staging`, `.venv.rb-staging` for `.venv`, on the destination's file system, so the swap
is one rename), the lock (`.NAME.rb-lock`), the env file's default (`DEST.env.sh`), the backups
(`DEST.rb-backup.N`), the install whose checks failed kept apart (`DEST.rb-failed`), and the names
an install holds of its own (its manifest, its env file's copy, its record, the mark of a build
whose checks failed)."""

from __future__ import annotations

import posixpath
import re

# inside an install, written by the install itself: never compared, never sent
INSTALLED_MANIFEST = ".rb-manifest.jsonl"  # the install's own manifest
ENV_IN_INSTALL = ".rb-env.sh"  # the install's own copy of its env file
INSTALL_RECORD = ".rb-install.json"  # what an install is: when, from what, its checks
FAILED_MARK = ".rb-failed"  # in an install whose checks failed
IN_INSTALL = (INSTALLED_MANIFEST, ENV_IN_INSTALL, FAILED_MARK, INSTALL_RECORD)

BACKUP = ".rb-backup."  # DEST.rb-backup.N beside the destination
FAILED = ".rb-failed"  # DEST.rb-failed: the install whose checks failed, kept apart


def beside(dest: str, suffix: str) -> str:
    """`.<name><suffix>` in the destination's parent; a name that is hidden already keeps its
    one dot (`.venv` -> `.venv.rb-staging`, not `..venv.rb-staging`). `X` and `.X` in one parent
    then share the names: one lock (their runs take turns), and a staging whose mark names the
    destination it is for (a run for the other one never continues it)."""
    dest = dest.rstrip("/") or "/"
    head, tail = posixpath.split(dest)
    return posixpath.join(head, ("" if tail.startswith(".") else ".") + tail + suffix)


def staging(dest: str) -> str:
    return beside(dest, ".rb-staging")


def lock(dest: str) -> str:
    return beside(dest, ".rb-lock")


def env_file(dest: str, given: str = "") -> str:
    """The env file: the spec's cuda.env_file, else `DEST.env.sh`."""
    return given or (dest.rstrip("/") or "/") + ".env.sh"


def backup(dest: str, number: int) -> str:
    """`DEST.rb-backup.N`: the install that was in place before run N (1 the oldest kept)."""
    return "%s%s%d" % (dest, BACKUP, number)


def backup_number(base: str) -> str:
    """The regex text (not anchored) of the name `BASE.rb-backup.N` beside a destination named
    `base`, N its one group."""
    return re.escape(base) + re.escape(BACKUP) + "([0-9]+)"


def failed(dest: str) -> str:
    """`DEST.rb-failed`: where the one install whose checks failed is kept apart."""
    return dest + FAILED
