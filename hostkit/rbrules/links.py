"""Whether a symbolic link in a venv leads outside it: one rule for the transfer's scan
(rbkit.hostfs, on the source: such a link is refused unless transfer.outside_links is keep) and
for the `outside` check (rbprobes.checks_venv, on the destination). Stdlib only; no I/O but
`tree_lookup`, the one view of a tree on disk both callers read it through.

    interpreter_link(rel)     the venv's own interpreter links (bin/python3 -> /usr/bin/python3.12):
                              outside the tree by design; the scan lets them through, the probe
                              leaves them to `relocation`
    leaves(rel, target, lookup, names)
                              the link `rel` (text `target`) resolved in the tree as the kernel
                              would: does it get out?
    tree_lookup(root)         the `lookup` of a tree on disk (lstat, readlink; never followed)
"""

from __future__ import annotations

import os
import re
import stat
from typing import Callable, Iterable, List, Optional

PYTHON_NAME = re.compile(r"^(python|pypy)[0-9.]*$")
MAX_HOPS = 40  # links followed while resolving one (the kernel's own limit)

# lookup("lib/x"): the text of the link at that path of the tree, "" for an entry that is not a
# link, None for nothing there (or a path through a file).
Lookup = Callable[[str], Optional[str]]


def tree_lookup(root: str) -> Lookup:
    """The Lookup of the tree `root` on disk: a link's text, "" for another entry, None for
    nothing there (a link gone between lstat and readlink too)."""

    def lookup(rel: str) -> Optional[str]:
        path = os.path.join(root, rel)
        try:
            if not stat.S_ISLNK(os.lstat(path).st_mode):
                return ""
            return os.readlink(path)
        except OSError:
            return None

    return lookup


def interpreter_link(rel: str) -> bool:
    """`bin/python`, `bin/python3.12`, `bin/pypy3`: a venv's interpreter names."""
    head, _, name = rel.rpartition("/")
    return head == "bin" and bool(PYTHON_NAME.match(name))


def _parts(path: str) -> List[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def _under(target: str, names: Iterable[str]) -> Optional[List[str]]:
    """The components of the absolute `target` below one of the tree's own absolute `names`,
    None when it names none of them (compared component by component, never normalised: `..`
    after a link is not lexical)."""
    parts = _parts(target)
    for name in names:
        root = _parts(name)
        if parts[: len(root)] == root:
            return parts[len(root) :]
    return None


def leaves(
    rel: str, target: str, lookup: Lookup, names: Iterable[str] = (), max_hops: int = MAX_HOPS
) -> bool:
    """Whether the link `rel` (relative to the tree, text `target`) leads outside the tree.
    It is resolved component by component against the tree, following the links it meets as the
    kernel would (`dot -> .` then `x -> dot/..` is the tree's parent, which a lexical normpath
    calls inside); a `..` above the top leaves. An absolute target leaves unless it lies under one
    of `names`, the tree's own absolute paths: the scan on the source passes none (at the
    destination such a link names the source's path), the probe on the destination passes the
    venv's path and its real path. A target that does not exist (yet) leads nowhere: False, and
    so does a loop (the kernel gives ELOOP)."""
    names = list(names)
    stack = _parts(rel)[:-1]
    todo = target.split("/")
    if target.startswith("/"):
        below = _under(target, names)
        if below is None:
            return True
        stack, todo = [], below
    hops = 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not stack:
                return True
            stack.pop()
            continue
        text = lookup("/".join(stack + [part]))
        if text is None:
            return False  # dangling (or through a file): resolves nowhere
        if text:
            hops += 1
            if hops > max_hops:
                return False
            if text.startswith("/"):
                below = _under(text, names)
                if below is None:
                    return True
                stack, todo = [], below + todo
            else:
                todo = text.split("/") + todo
            continue
        stack.append(part)
    return False
