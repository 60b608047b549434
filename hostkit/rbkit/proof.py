"""The proofs: `verify` (every entry of the staging against the source's manifest, taking the
digests the stream's receiving end computed), `prove` (the staged interpreter runs), the post-swap
proof of the console scripts (`prove_scripts`), the interpreter's own answer, and the scan of data
files that still name the old path (begun with verify, reported by swap).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import os
import shutil
import threading
from typing import Any, List, Tuple

from rbrules import cpus
from rbrules.enginerules import PROVE_TIMEOUT
from rbrules.proven import fresh_dir

from . import manifest, relocate, safefs
from .receive import load_received
from .runner import (
    Context,
    Result,
    StepError,
    identity_of,
    jobs,
    read_stamp,
    require_lock,
    require_stamp,
    write_stamp,
)
from .staging import chmod_dir, drop_mark, read_mark
from .stream import child_env, run_quiet, tail


def verify(ctx: Context) -> Result:
    """Every entry of the staging against the source's manifest, by a stat walk (type, mode, size,
    link target; every entry there, nothing extra). A file's content: by the digest receive took
    from the stream, when the file still has the inode and ctime tar left it with (RECEIVED);
    by stat when this run's stage linked it from the current install; else it is read and hashed.
    Leaves the stamp relocate and swap require."""
    require_lock(ctx)
    doc = read_stamp(ctx) or {}
    write_stamp(ctx, None)
    identity = identity_of(ctx.staging)
    linked = ctx.dest if doc.get("delta") and doc.get("identity") == identity else None
    new = ctx.new_manifest()
    received = load_received(ctx, identity, new["header"]["algo"])
    _scan_elsewhere(ctx)
    inodes = (
        ctx.linked_inodes[1]
        if linked and ctx.linked_inodes is not None and ctx.linked_inodes[0] == identity
        else None
    )
    result = manifest.verify(
        ctx.staging,
        new,
        jobs(ctx.choices.jobs),
        linked_from=linked,
        received=received,
        linked_inodes=inodes,
    )
    listed = manifest.describe(result)
    for line in listed:
        ctx.log(line)
    facts = {k: result[k] for k in ("checked", "hashed", "linked", "streamed")}
    if not result["ok"]:
        cancel_elsewhere(ctx)
        raise StepError(
            "the copy in %s differs from the source manifest (listed above); the "
            "destination was not touched" % ctx.staging,
            facts,
            listed,
        )
    if read_mark(ctx) is not None:
        # whole and verified: no longer what a cut stream left; the install's mode
        chmod_dir(ctx.staging, 0o755)
        drop_mark(ctx)
    write_stamp(
        ctx,
        {
            "stage": "verified",
            "identity": identity,
            "fingerprint": ctx.fingerprint(),
            "delta": bool(linked),
        },
    )
    if result["streamed"]:
        # the files whose digests the stream's receiving end computed are not read again
        detail = "%d entries match, %d files checked by the stream's %s" % (
            result["checked"],
            result["streamed"],
            result["algo"],
        )
        if result["hashed"]:
            detail += ", %d hashed again" % result["hashed"]
    else:
        detail = "%d entries match, %d files hashed (%s)" % (
            result["checked"],
            result["hashed"],
            result["algo"],
        )
    if linked:
        detail += ", %d linked unchanged" % result["linked"]
    return Result(detail, facts)


def _scan_elsewhere(ctx: Context) -> None:
    """Data files outside bin/ that name the old path are only reported (swap, report_elsewhere);
    that scan reads every .py, .txt, .json... of the staging, so it starts with verify, in a child
    Python beside verify's walk, on the prefixes relocate will replace (relocate starts it again
    in a thread if those differ)."""
    cancel_elsewhere(ctx)
    olds = relocate.old_prefixes(ctx.staging, ctx.old, ctx.dest) if ctx.old else []
    if olds:
        ctx.elsewhere = (relocate.ElsewhereChild(ctx.staging, olds), olds)


def stop_background(ctx: Context) -> None:
    """The run's engine ends: what it started beside its steps is stopped (the scan of data
    files, when no swap took its result)."""
    cancel_elsewhere(ctx)


def cancel_elsewhere(ctx: Context) -> None:
    scan, ctx.elsewhere = ctx.elsewhere, None
    if scan is not None and hasattr(scan[0], "cancel"):
        scan[0].cancel()


def report_elsewhere(ctx: Context, facts: dict) -> None:
    """What the scan begun at verify (or relocate) found: logged, counted in `facts`."""
    scan, ctx.elsewhere = ctx.elsewhere, None
    if scan is None:
        return
    found, why = scan[0].result()
    if why:
        ctx.log("the scan for data files that name %s did not finish: %s" % (ctx.old, why))
        return
    facts["elsewhere"] = len(found)
    if found:
        ctx.log("still naming %s outside bin/ (data, left as is): %s" % (ctx.old, ", ".join(found)))


def prove(ctx: Context) -> Result:
    """The staged interpreter runs here and knows where it is: bin/python -c 'sys.prefix' from
    the staging, within PROVE_TIMEOUT. A venv whose base interpreter this host lacks stops here,
    before anything is installed."""
    require_lock(ctx)
    doc = require_stamp(ctx, ("relocated",), "prove")
    python = os.path.join(ctx.staging, "bin", "python")
    try:
        prefix, version = interpreter_prefix(python, ctx.staging)
    except StepError as exc:
        raise StepError(
            "%s; refused before the swap: nothing was installed" % exc, lines=exc.lines
        ) from None
    if os.path.realpath(prefix) != os.path.realpath(ctx.staging):
        raise StepError(
            "the staged interpreter reports sys.prefix %s, not the staging %s"
            % (prefix, ctx.staging)
        )
    made = _cfg(ctx.staging, "version") or _cfg(ctx.staging, "version_info")
    if made and made.split(".")[:2] != version.split(".")[:2]:
        raise StepError(
            "bin/python here is Python %s, the venv was made with %s (pyvenv.cfg): its "
            "packages under lib/python%s are not seen; install Python %s here"
            % (version, made, ".".join(made.split(".")[:2]), ".".join(made.split(".")[:2]))
        )
    write_stamp(ctx, dict(doc, stage="proven"))
    return Result("bin/python %s runs from the staging" % version, {"python": version})


# the post-swap proof's hook: a console script's interpreter imports sitecustomize from
# PYTHONPATH at start-up (site), before the script; this one says where the interpreter runs
# from and ends it there, so no script's own code runs
EXEC_PROOF = "rb-exec-proof"
_PROOF_HOOK = (
    b"import os, sys\n"
    b"os.write(1, b'" + EXEC_PROOF.encode() + b" ' + os.fsencode(sys.prefix) + b'\\0'"
    b" + os.fsencode(sys.executable) + b'\\n')\n"
    b"os._exit(0)\n"
)


def _console_scripts(dest: str, rewritten: List[str]) -> List[Tuple[str, bytes]]:
    """(rel, header) for each executable regular file under bin/ that relocation rewrote, and
    bin/pip always: what the post-swap proof execs. `header`: the lines the kernel and the
    trampoline read to find the interpreter (the first two) when that is the venv's own python,
    else b"" (a script whose code would run if started)."""
    rels = sorted(
        {r for r in rewritten if r.startswith("bin/") and r.count("/") == 1} | {"bin/pip"}
    )
    out = []
    for rel in rels:
        got = safefs.read_in(dest, rel, limit=1 << 24)
        if got is None or not got[1].st_mode & 0o111:
            continue
        head = got[0][:4096]
        own = relocate.python_script(head, dest)
        out.append((rel, b"\n".join(head.split(b"\n", 2)[:2]) if own else b""))
    return out


def prove_scripts(
    dest: str, rewritten: List[str], timeout: float = PROVE_TIMEOUT
) -> Tuple[List[str], List[str]]:
    """Exec the console scripts of `dest` through the kernel (their shebangs), at once: each
    whose interpreter is the venv's own python must report, through the hook above, sys.prefix
    == dest, and no code of the script runs. Scripts whose interpreter lines are the same bytes
    (every script in bin/, the same directory) start the same way: one of each such group is
    started for all (bin/pip always for itself). A bin/pip started otherwise (a wrapper) runs
    `--version`, which must name dest; other such scripts are not started. Returns (the scripts
    proven, the failures)."""
    groups: dict = {}
    for rel, head in _console_scripts(dest, rewritten):
        if head or rel == "bin/pip":
            groups.setdefault(head if rel != "bin/pip" else b"pip", []).append(rel)
    if not groups:
        return [], []
    runs = list(groups.values())
    results: List[Any] = [None] * len(runs)
    hook = fresh_dir("rbkit-exec-proof.")  # 0700, this user's, not renamable
    try:
        fd = os.open(
            os.path.join(hook, "sitecustomize.py"),
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
            0o600,
        )
        with os.fdopen(fd, "wb") as fh:
            fh.write(_PROOF_HOOK)
        env = dict(child_env(), PYTHONPATH=hook, PYTHONDONTWRITEBYTECODE="1")

        def one(index: int) -> None:
            results[index] = run_quiet(
                [os.path.join(dest, runs[index][0]), "--version"], timeout, env
            )

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(runs))]
        width = max(1, min(16, cpus.count()))
        for first in range(0, len(threads), width):
            for thread in threads[first : first + width]:
                thread.start()
            for thread in threads[first : first + width]:
                thread.join()
    finally:
        shutil.rmtree(hook, ignore_errors=True)
    real = os.path.realpath(dest)
    proven, failed = [], []
    for rels, (rc, out, err) in zip(runs, results):
        line = out.split("\n", 1)[0]
        if line.startswith(EXEC_PROOF + " "):
            prefix, _, exe = line[len(EXEC_PROOF) + 1 :].partition("\0")
            # the interpreter in the venv's bin/, however reached (a trampoline beside
            # it runs it by its real path when dest is a link)
            ok = (
                rc == 0
                and os.path.realpath(prefix) == real
                and os.path.realpath(os.path.dirname(exe)) == os.path.join(real, "bin")
            )
            said = "sys.prefix %s, %s" % (prefix, exe)
        else:
            # no hook ran (not the venv's python, or one that skips site): what it printed
            ok = rc == 0 and dest + "/" in out
            said = out.strip() or err.strip() or "exit %s" % rc
        if ok:
            proven.extend(rels)
        else:
            same = (
                " (and %d more with its interpreter lines: %s)"
                % (len(rels) - 1, ", ".join(rels[1:]))
                if len(rels) > 1
                else ""
            )
            failed.append(
                "console script %s runs from the wrong place: %s%s" % (rels[0], said, same)
            )
    return sorted(proven), failed


# -- children ------------------------------------------------------------------------------------


def interpreter_prefix(python: str, root: str) -> tuple:
    """(sys.prefix, version) that `python` reports; fails naming what is missing."""
    if not os.path.lexists(python):
        raise StepError("%s has no bin/python: not a venv" % root)
    if not os.path.exists(python):
        target = os.readlink(python) if os.path.islink(python) else python
        raise StepError(
            "bin/python -> %s: that interpreter does not exist on this host (the "
            "venv's base interpreter%s must be installed here)" % (target, _home(root))
        )
    rc, out, err = run_quiet(
        [python, "-I", "-B", "-c", "import sys; print(sys.prefix); print(sys.version.split()[0])"],
        PROVE_TIMEOUT,
    )
    lines = out.splitlines()
    if rc != 0 or len(lines) < 2:
        raise StepError(
            "%s does not run here (exit %s): %s"
            % (python, rc, " | ".join(tail(err or out, 3)) or "no output"),
            lines=tail(err or out),
        )
    return lines[0], lines[1]


def _home(root: str) -> str:
    home = _cfg(root, "home")
    return ", pyvenv.cfg home = %s" % home if home else ""


def _cfg(root: str, key: str) -> str:
    """A value of the venv's pyvenv.cfg ('' when not there; a link there is not followed)."""
    try:
        got = safefs.read_in(root, "pyvenv.cfg", limit=1 << 20)
    except OSError:
        return ""
    for line in (got[0] if got else b"").decode("utf-8", "replace").splitlines():
        name, _, value = line.partition("=")
        if name.strip() == key:
            return value.strip()
    return ""
