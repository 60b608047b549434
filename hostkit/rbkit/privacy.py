"""The destination's parent, private to the user the kit runs as, or refused (issue 33, N4).

Whatever the kit writes beside the destination (the lock, the staging, the backups a `--restore`
puts back, the env file) is only as safe as the directories along the way: whoever can write one
of them can rename, replace or plant an entry there between two of the kit's steps. The rule is
rbrules.private's walk (first_not_private: every component from / down, links followed, owned by
this user or root and not writable by others unless sticky; what is missing is not judged, the
kit makes it), the one the run directory and --report's directory also go through, and for the
parent itself rbrules.proven.why_shared (no other user may add entries to it, sticky or not: the
kit reads names there); here the refusal preflight fails with, naming the fixes and the spec key
that accepts such a parent. Not covered: ACLs and capabilities that grant writes beyond the mode
bits.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import os
import stat
from typing import Optional, Tuple

from rbrules import private, proven
from rbrules.owners import user_name
from rbrules.private import first_not_private

SPEC_KEY = "transfer.shared_parent"


def why_not_private(path: str, uid: int) -> Optional[str]:
    """Why `path`, where entries are made, is not private to the user `uid`, or None: the rule
    (rbrules.private, for a directory entries are made in)."""
    return private.why_not_private(path, uid, parent=True)


def refusal(dest: str, where: str, why: str, uid: int) -> str:
    """The preflight's refusal of `dest`, whose parent (or an ancestor of it) `where` is not
    private: what, why it matters, and the fixes."""
    runner = user_name(uid)
    parent = os.path.dirname(os.path.abspath(dest))
    example = ""
    try:
        if os.stat(where).st_mode & stat.S_ISVTX:
            # /tmp: chmod is not the fix; a directory of the runner's in it is private
            inside = os.path.join(where, "rb")
            example = " (in a sticky directory like %s: mkdir -m 755 %s, then install into %s)" % (
                where,
                inside,
                os.path.join(inside, os.path.basename(dest)),
            )
    except OSError:
        pass
    return (
        "refusing to install %s as %s: %s. The lock, the staging, the backups that --restore "
        "puts back and the env file live beside the destination, in %s; whoever can write "
        "there can swap them between two steps of this run, or put their own at those names "
        "before it. Fix: make %s %s's and not writable by others (chown %s %s && chmod "
        "go-w %s), or choose a destination under a parent only %s can write%s, or, to accept "
        "it, set %s: allow in the spec (each entry found there is then used only when it is "
        "proven %s's)"
        % (
            dest,
            runner,
            why,
            parent,
            where,
            runner,
            runner,
            where,
            where,
            runner,
            example,
            SPEC_KEY,
            runner,
        )
    )


def check_parent(dest: str, uid: int) -> Optional[Tuple[str, str]]:
    """(the component, why) when the parent of `dest` is not private to `uid`; else None. The
    directories above it by rbrules.private's walk (a sticky one passes for an entry of ours);
    the parent itself by rbrules.proven.why_shared: the kit reads names there it did not make
    in this run (the backups, the failed install, the lock, a staging, the journal), so one
    others can add entries to, sticky or not (/tmp), is not private for them."""
    parent = os.path.dirname(os.path.abspath(dest)) or "/"
    found = first_not_private(parent, uid)
    if found is not None:
        return found
    why = proven.why_shared(parent, uid)
    return (parent, why) if why else None
