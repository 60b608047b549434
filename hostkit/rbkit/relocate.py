"""Relocation: make a venv copied to a new path work there.

Rewrites, under bin/: plain shebangs (`#!/old/bin/python`), pip's `#!/bin/sh` + `'''exec'`
trampoline for long paths, `VIRTUAL_ENV` in the activate scripts, and any other text file naming the
old prefix; plus pyvenv.cfg's `command` line. A shebang longer than the kernel's limit (127 bytes on
Linux) is written in the trampoline form. Text elsewhere that still names the old prefix is counted
and reported, not rewritten (it is data: RECORD files, caches, direct_url.json).

Only regular files are read or rewritten, and no link is followed: `bin/` must be a directory of
the tree (not a link out of it), a script or pyvenv.cfg that is a link is left as it is, and a
rewrite is a new file made beside the old one with O_EXCL|O_NOFOLLOW and renamed over it
(rbkit.safefs), so a link the tree ships at any name the kit might use is never written through.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import threading
from typing import List, Optional, Tuple

from rbrules import launch

from . import safefs

SHEBANG_MAX = 127
SNIFF = 8192


def _pattern(old: str) -> re.Pattern:
    # the old prefix as a whole path: followed by '/', a quote, whitespace or the end.
    return re.compile(re.escape(old.encode()) + rb"(?=[/\"'\s:]|$)", re.MULTILINE)


def _is_text(head: bytes) -> bool:
    return b"\0" not in head


def _trampoline(interpreter: bytes, rest: bytes) -> bytes:
    return b"#!/bin/sh\n'''exec' \"" + interpreter + b'" "$0" "$@"\n\' \'\'\'\n' + rest


def _fix_long_shebang(data: bytes) -> bytes:
    first, nl, rest = data.partition(b"\n")
    if not first.startswith(b"#!") or len(first) <= SHEBANG_MAX:
        return data
    words = first[2:].strip().split()
    if len(words) != 1:
        return data  # interpreter with arguments: leave it, reported by check()
    return _trampoline(words[0], rest)


# a path the kernel reads as one shebang word and sh as one word inside double quotes
PLAIN_PATH = re.compile(rb"^[A-Za-z0-9/._+-]+$")
PROGRAM = re.compile(rb"^[A-Za-z0-9._+-]+$")
TRAMPOLINE_TAIL = b'" "$0" "$@"'
# pip's own form for a path it cannot write into a shebang: the interpreter beside the script
BESIDE = b'"$(dirname -- "$(realpath -- "$0")")/'


def _fix_venv_shebang(data: bytes, new: str) -> Optional[bytes]:
    """A script whose interpreter is the new venv's own bin/NAME (a shebang, or pip's trampoline),
    where the new path holds anything but plain path characters (a space ends a shebang's path;
    `$`, backquotes or quotes would run inside the trampoline's double quotes): the trampoline that
    finds its interpreter beside the script, so the path is never written into it. None when the
    script is not such a one (a plain path too long for a shebang gets pip's trampoline naming it,
    _fix_long_shebang)."""
    first, _nl, rest = data.partition(b"\n")
    own = b"#!" + new.encode() + b"/bin/"
    tramp = b"'''exec' \"" + new.encode() + b"/bin/"
    if first.startswith(own) and PROGRAM.match(first[len(own) :]):
        name = first[len(own) :]
        if PLAIN_PATH.match(new.encode()):
            return None  # a plain path: as it is, or pip's trampoline naming it when too long
    elif first.strip() == b"#!/bin/sh" and rest.startswith(tramp):
        line, _nl2, after = rest.partition(b"\n")
        name, sep, tail = line[len(tramp) :].partition(b'"')
        if not sep or not PROGRAM.match(name) or (b'"' + tail) != TRAMPOLINE_TAIL:
            return None
        if PLAIN_PATH.match(new.encode()):
            return data
        rest = after
    else:
        return None
    if not rest.startswith(b"' '''"):
        rest = b"' '''\n" + rest
    return b"#!/bin/sh\n'''exec' " + BESIDE + name + TRAMPOLINE_TAIL + b"\n" + rest


def python_script(data: bytes, root: str) -> bool:
    """Whether `data` is a script the kernel starts with the venv at `root`'s own bin/python*,
    in one of the forms relocation writes: `#!ROOT/bin/pythonX`, pip's trampoline naming
    ROOT/bin/pythonX, or the trampoline that finds pythonX beside the script (no interpreter
    arguments: -I or -S would keep the post-swap proof's hook from running)."""
    first, _nl, rest = data.partition(b"\n")
    own = root.encode() + b"/bin/"
    if first.startswith(b"#!" + own):
        name = first[2 + len(own) :]
    elif first.strip() == b"#!/bin/sh" and rest.startswith(b"'''exec' "):
        line = rest.partition(b"\n")[0][len(b"'''exec' ") :]
        for lead in (b'"' + own, BESIDE):
            if line.startswith(lead):
                name, sep, tail = line[len(lead) :].partition(b'"')
                if not sep or (b'"' + tail) != TRAMPOLINE_TAIL:
                    return False
                break
        else:
            return False
    else:
        return False
    return bool(PROGRAM.match(name)) and name.startswith(b"python")


def rewrite_bytes(data: bytes, old: str, new: str) -> Optional[bytes]:
    """`data` with the old prefix replaced, if it is text that names it; else None."""
    if not _is_text(data[:SNIFF]):
        return None
    pat = _pattern(old)
    if not pat.search(data):
        return None
    out = pat.sub(new.encode().replace(b"\\", b"\\\\"), data)
    fixed = _fix_venv_shebang(out, new)
    return fixed if fixed is not None else _fix_long_shebang(out)


def rewrite_file(path: str, old: str, new: str) -> Optional[bytes]:
    """New content for `path` if it is a regular file (not a link) that names `old`, else None."""
    head, name = os.path.split(path)
    got = safefs.read_in(head or ".", name)
    return None if got is None else rewrite_bytes(got[0], old, new)


def _open_bin(root_fd: int) -> Optional[int]:
    """The tree's bin/ as a descriptor, or None when it is missing or not a directory (a link
    out of the tree is not followed)."""
    try:
        return os.open(
            "bin", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd
        )
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise


def _candidates(root_fd: int) -> List[Tuple[str, int, str]]:
    """(relative path, directory fd, name) of what relocation reads: every entry of bin/, and
    pyvenv.cfg. The caller closes the bin/ descriptor (the one that is not `root_fd`)."""
    out = []
    bin_fd = _open_bin(root_fd)
    if bin_fd is not None:
        out.extend((f"bin/{name}", bin_fd, name) for name in sorted(os.listdir(bin_fd)))
    out.append(("pyvenv.cfg", root_fd, "pyvenv.cfg"))
    return out


def _scan_bin(root: str, fn) -> None:
    """Call fn(rel, dir_fd, name, content, stat) for each regular file relocation reads."""
    root_fd = safefs.open_dir(root)
    try:
        cands = _candidates(root_fd)
        try:
            for rel, dir_fd, name in cands:
                got = safefs.read_at(dir_fd, name)
                if got is not None:
                    fn(rel, dir_fd, name, got[0], got[1])
        finally:
            for fd in {d for _r, d, _n in cands if d != root_fd}:
                os.close(fd)
    finally:
        os.close(root_fd)


ACTIVATE_PREFIX = re.compile(
    rb"""^[ \t]*(?:export[ \t]+)?VIRTUAL_ENV=(['"]?)(/[^'"\n]*?)\1[ \t]*$""", re.MULTILINE
)


def recorded_prefix(root: str) -> Optional[str]:
    """The path the venv was made at, as its bin/activate says (VIRTUAL_ENV=...): a venv copied
    with `cp -a` or reached through a link names that path in its scripts, not the one a spec
    gives. None when bin/activate is missing, not a regular file, or names no absolute path."""
    try:
        fd = os.open(
            os.path.join(root, "bin", "activate"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
        )
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, 65536)
    finally:
        os.close(fd)
    match = ACTIVATE_PREFIX.search(data)
    return os.fsdecode(match.group(2)).rstrip("/") if match else None


def old_prefixes(root: str, old: str, new: str) -> List[str]:
    """The prefixes relocation replaces in the venv at `root` (copied from `old`, to live at
    `new`): `old`, and the one its activate script records when that differs; [] when the venv
    stays where it was."""
    olds = [old.rstrip("/")]
    recorded = recorded_prefix(root)
    if recorded and recorded not in olds and recorded != new.rstrip("/"):
        olds.append(recorded)
    return [o for o in olds if o != new.rstrip("/")]


def relocate(root: str, old: str, new: str, *, scan_elsewhere: bool = True) -> dict:
    """Rewrite under `root` (a venv copied from `old`, to live at `new`). Returns a summary. The
    prefix the venv's own activate script records is rewritten too when it differs from `old`
    (a venv copied from elsewhere, or reached through a link): its scripts name that path.
    Without `scan_elsewhere`, "elsewhere" is None: the caller scans (`Elsewhere`, in a thread)."""
    rewritten: dict[str, dict] = {}
    olds = old_prefixes(root, old, new)
    if not olds:
        return {
            "same_path": True,
            "rewritten": {},
            "elsewhere": [],
            "remaining": [],
            "old_prefixes": [],
        }

    def rewrite(rel: str, dir_fd: int, name: str, data: bytes, st: os.stat_result) -> None:
        out = data
        for prefix in olds:
            out = rewrite_bytes(out, prefix, new) or out
        if out == data:
            return
        # the file's own mode and times (tar restored them; the manifest recorded them)
        safefs.write_at(
            dir_fd, name, out, stat.S_IMODE(st.st_mode), times_ns=(st.st_atime_ns, st.st_mtime_ns)
        )
        rewritten[rel] = {"s": len(out), "h_sha256": hashlib.sha256(out).hexdigest()}

    _scan_bin(root, rewrite)
    return {
        "same_path": False,
        "old_prefixes": olds,
        "rewritten": rewritten,
        "remaining": sorted({rel for prefix in olds for rel in check(root, prefix)}),
        "elsewhere": sorted({rel for prefix in olds for rel in elsewhere(root, prefix)})
        if scan_elsewhere
        else None,
    }


def check(root: str, old: str) -> list[str]:
    """Scripts under bin/ that still name the old prefix (must be empty after relocate)."""
    pat = _pattern(old)
    left: List[str] = []

    def look(rel: str, _fd: int, _name: str, data: bytes, _st: os.stat_result) -> None:
        if rel.startswith("bin/") and _is_text(data[:SNIFF]) and pat.search(data):
            left.append(rel)

    _scan_bin(root, look)
    return left


def elsewhere(root: str, old: str, limit: int = 20) -> list[str]:
    """Text files outside bin/ that name the old prefix (counted and reported, not rewritten)."""
    root_fd = safefs.open_dir(root)
    try:
        return elsewhere_at(root_fd, [old], limit)
    finally:
        os.close(root_fd)


ELSEWHERE_SUFFIXES = (".pth", ".json", ".txt", ".cfg", "RECORD", ".py", ".sh")


def elsewhere_at(root_fd: int, olds: List[str], limit: int = 20) -> list[str]:
    """`elsewhere` for any of `olds`, in the tree open at `root_fd` (the walk goes by descriptors:
    it finishes in the same tree when that tree is renamed meanwhile; links are not followed).
    What relocation rewrites (bin/, pyvenv.cfg) is not read: the scan may run before it."""
    pats = [_pattern(o) for o in olds]
    found: List[str] = []
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=root_fd):
        rel_dir = os.path.normpath(dirpath)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d != "bin"]
            filenames = [f for f in filenames if f != "pyvenv.cfg"]
        dirnames.sort()
        for name in sorted(filenames):
            if not name.endswith(ELSEWHERE_SUFFIXES):
                continue
            try:
                got = safefs.read_at(dir_fd, name, limit=4 << 20)
            except OSError:
                continue
            if got is None:
                continue
            data = got[0]
            if _is_text(data[:SNIFF]) and any(p.search(data) for p in pats):
                found.append(os.path.normpath(os.path.join(rel_dir, name)))
                if len(found) >= limit:
                    return found
    return found


class ElsewhereChild:
    """`elsewhere_at` in a child Python (`python -S -m rbkit elsewhere`), given a descriptor of
    the tree opened now: it reads every text file outside bin/ while the engine's own walks (verify)
    hold this process's interpreter, and finishes in the same tree when it is renamed. The same
    `result()` as Elsewhere; `cancel()` ends it."""

    def __init__(self, root: str, olds: List[str]) -> None:
        self._out = tempfile.TemporaryFile()
        self._p: Optional[subprocess.Popen] = None
        self._error = ""
        fd = safefs.open_dir(root)
        try:
            env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "HOME")}
            argv = launch.argv(sys.executable, "rbkit") + ["elsewhere", "--fd", str(fd)]
            for old in olds:
                argv += ["--old", old]
            self._p = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=self._out,
                stderr=subprocess.STDOUT,
                cwd="/",
                env=env,
                pass_fds=(fd,),
            )
        except OSError as exc:
            self._error = "could not start the scan: %s" % exc.strerror
        finally:
            os.close(fd)

    def cancel(self) -> None:
        if self._p is not None and self._p.poll() is None:
            self._p.kill()
            self._p.wait()

    def result(self, timeout: float = 120.0) -> Tuple[List[str], str]:
        if self._p is None:
            return [], self._error
        try:
            rc = self._p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.cancel()
            return [], "still scanning after %.0f s" % timeout
        self._out.seek(0)
        text = self._out.read().decode("utf-8", "replace")
        try:
            found = json.loads(text) if rc == 0 else None
        except ValueError:
            found = None
        if not isinstance(found, list):
            return [], "the scan exited %s: %s" % (rc, text.strip()[-300:] or "no output")
        return [str(f) for f in found], ""


class Elsewhere:
    """`elsewhere_at` in a thread of its own, over a descriptor of the tree opened now: the
    engine starts it at relocate and takes `result()` after the swap's rename, while the console
    scripts are proved (the scan only reports, it never changes what is installed)."""

    def __init__(self, root: str, olds: List[str]) -> None:
        self._found: List[str] = []
        self._error = ""
        self._fd = safefs.open_dir(root)
        self._thread = threading.Thread(target=self._run, args=(olds,), daemon=True)
        self._thread.start()

    def _run(self, olds: List[str]) -> None:
        try:
            self._found = elsewhere_at(self._fd, olds) if olds else []
        except OSError as exc:
            self._error = str(exc)
        finally:
            os.close(self._fd)

    def result(self, timeout: float = 120.0) -> Tuple[List[str], str]:
        """(paths found, why the scan did not finish: "" when it did)."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            return [], "still scanning after %.0f s" % timeout
        return self._found, self._error
