"""The names a run keeps beside a destination, one rule each, read by the kit (which makes them)
and by the compiler (which shows them in --dry-run, --plan and the settings): the staging
(`.NAME.rb-staging`, `.venv.rb-staging` for `.venv`, on the destination's file system, so the swap is one rename), the lock
(`.NAME.rb-lock`) and the env file's default (`DEST.env.sh`)."""

from __future__ import annotations

import posixpath


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
