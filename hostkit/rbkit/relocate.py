"""Relocation: make a venv copied to a new path work there.

Rewrites, under bin/: plain shebangs (`#!/old/bin/python`), pip's `#!/bin/sh` + `'''exec'` trampoline
for long paths, `VIRTUAL_ENV` in the activate scripts, and any other text file naming the old prefix;
plus pyvenv.cfg's `command` line. A shebang longer than the kernel's limit (127 bytes on Linux) is
written in the trampoline form. Text elsewhere that still names the old prefix is counted and
reported, not rewritten (it is data: RECORD files, caches, direct_url.json).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from typing import Optional

SHEBANG_MAX = 127
SNIFF = 8192


def _pattern(old: str) -> re.Pattern:
    # the old prefix as a whole path: followed by '/', a quote, whitespace or the end.
    return re.compile(re.escape(old.encode()) + rb"(?=[/\"'\s:]|$)", re.MULTILINE)


def _is_text(head: bytes) -> bool:
    return b"\0" not in head


def _trampoline(interpreter: bytes, rest: bytes) -> bytes:
    return (b"#!/bin/sh\n'''exec' \"" + interpreter + b"\" \"$0\" \"$@\"\n' '''\n" + rest)


def _fix_long_shebang(data: bytes) -> bytes:
    first, nl, rest = data.partition(b"\n")
    if not first.startswith(b"#!") or len(first) <= SHEBANG_MAX:
        return data
    words = first[2:].strip().split()
    if len(words) != 1:
        return data  # interpreter with arguments: leave it, reported by check()
    return _trampoline(words[0], rest)


def rewrite_file(path: str, old: str, new: str) -> Optional[bytes]:
    """New content for `path` if it names `old`, else None."""
    with open(path, "rb") as f:
        data = f.read()
    if not _is_text(data[:SNIFF]):
        return None
    pat = _pattern(old)
    if not pat.search(data):
        return None
    out = pat.sub(new.encode().replace(b"\\", b"\\\\"), data)
    return _fix_long_shebang(out)


def _write_keep_mode(path: str, data: bytes) -> None:
    st = os.lstat(path)
    tmp = f"{path}.rb-tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, stat.S_IMODE(st.st_mode))
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, path)


def relocate(root: str, old: str, new: str) -> dict:
    """Rewrite under `root` (a venv copied from `old`, to live at `new`). Returns a summary."""
    rewritten: dict[str, dict] = {}
    if old.rstrip("/") == new.rstrip("/"):
        return {"same_path": True, "rewritten": {}, "elsewhere": [], "remaining": []}
    candidates = []
    bindir = os.path.join(root, "bin")
    if os.path.isdir(bindir):
        for name in sorted(os.listdir(bindir)):
            full = os.path.join(bindir, name)
            if os.path.isfile(full) and not os.path.islink(full):
                candidates.append(f"bin/{name}")
    if os.path.isfile(os.path.join(root, "pyvenv.cfg")):
        candidates.append("pyvenv.cfg")
    for rel in candidates:
        full = os.path.join(root, rel)
        data = rewrite_file(full, old, new)
        if data is None:
            continue
        _write_keep_mode(full, data)
        st = os.lstat(full)
        rewritten[rel] = {"s": st.st_size, "h_sha256": hashlib.sha256(data).hexdigest()}
    return {
        "same_path": False,
        "rewritten": rewritten,
        "remaining": check(root, old),
        "elsewhere": elsewhere(root, old),
    }


def check(root: str, old: str) -> list[str]:
    """Scripts under bin/ that still name the old prefix (must be empty after relocate)."""
    pat = _pattern(old)
    left = []
    bindir = os.path.join(root, "bin")
    if not os.path.isdir(bindir):
        return left
    for name in sorted(os.listdir(bindir)):
        full = os.path.join(bindir, name)
        if os.path.isfile(full) and not os.path.islink(full):
            with open(full, "rb") as f:
                data = f.read()
            if _is_text(data[:SNIFF]) and pat.search(data):
                left.append(f"bin/{name}")
    return left


def elsewhere(root: str, old: str, limit: int = 20) -> list[str]:
    """Text files outside bin/ that name the old prefix (counted and reported, not rewritten)."""
    pat = _pattern(old)
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == "bin":
            dirnames[:] = []
            continue
        dirnames.sort()
        for name in sorted(filenames):
            if not name.endswith((".pth", ".json", ".txt", ".cfg", "RECORD", ".py", ".sh")):
                continue
            full = os.path.join(dirpath, name)
            try:
                if os.path.islink(full) or os.path.getsize(full) > 4 << 20:
                    continue
                with open(full, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            if _is_text(data[:SNIFF]) and pat.search(data):
                found.append(os.path.normpath(os.path.join(rel_dir, name)))
                if len(found) >= limit:
                    return found
    return found
