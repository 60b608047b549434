"""The source before anything is sent, in one process (`rbkit engine source`): the scan (a venv
after the excludes, what the threat model refuses; stream.scan_source) and the static checks
(rbprobes: `outside`, or `preflight` with the kernel audit for the target's arch), run in this
process instead of a second Python start; on a host with cores to spare (4 or more) and nothing
recorded to compare with yet, the static checks start in a child Python before the scan and run
beside it (EarlyAudit; on a big venv both take a second or more).

On a re-run the static checks are skipped when, and only when, the scan's stat fingerprint equals
`installed_stat`: the one the destination's install recorded for its source (the tree then was
this tree, file for file: path, type, mode, size, link, mtime), given by the runbook from the
destination's engine. The event says so.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from typing import Any, Dict, List, Optional, Tuple

from rbrules import cpus, launch

from . import runner, stream

AUDIT_TIMEOUT_S = 900

# rbprobes' table of checks (`check ...`, `outside   L0 ...`): not repeated in the log
TABLE_ROW = re.compile(r"^check |^[a-z_]* *L0 ")


def scan(
    ctx: runner.Context,
    root: str,
    excludes: List[str],
    names: Any,
    special_modes: str,
    outside_links: str,
    into: Dict[str, Any],
    begun: Any = None,
) -> runner.Result:
    try:
        detail, facts = stream.scan_source(
            root, excludes, names, special_modes, outside_links, begun
        )
    except stream.SourceRefused as exc:
        raise runner.StepError(str(exc)) from None
    into.update(facts)
    return runner.Result(detail, facts)


def library_dirs(
    ctx: runner.Context, root: str, excludes: List[str], wanted: List[str]
) -> runner.Result:
    """The library dirs the exports step will put first (cuda.library_path_first, relative to
    the venv's site-packages): which the source does not have, after the excludes
    (`library_missing`, comma-separated; empty: all there). Said before anything moves, in
    preflight and the plan: the exports step refuses them after the swap (issue 45)."""
    from . import exports, statwalk

    try:
        site = exports.site_packages(root)
    except FileNotFoundError:
        site = ""
    missing = []
    for lib_dir in wanted:
        rel = os.path.relpath(os.path.join(site, lib_dir), root) if site else lib_dir
        parts = rel.split("/")
        left_out = any(
            statwalk.excluded("/".join(parts[: i + 1]), excludes) for i in range(len(parts))
        )
        if (
            not site
            or left_out
            or not os.path.isdir(os.path.join(root, rel))
            or os.path.islink(os.path.join(root, rel))
        ):
            missing.append(lib_dir)
    where = os.path.relpath(site, root) if site else "lib/python3*/site-packages"
    if missing:
        return runner.Result(
            "the source has no %s under %s (after the excludes)" % (", ".join(missing), where),
            {"library_missing": ",".join(missing), "site_packages": where},
        )
    return runner.Result(
        "the library dirs are in the source: %s" % ", ".join(wanted), {"library_missing": ""}
    )


def failed_checks(doc: Dict[str, Any], keep_links: bool) -> List[str]:
    """The check types that failed in an rbprobes document; links that leave the tree are the
    spec's to allow (transfer.outside_links: keep)."""
    failed = set()
    for check in doc.get("checks") or [doc]:
        refs = (check.get("values") or {}).get("refs") or []
        if check.get("status") != "fail" or (
            check.get("type") == "outside"
            and keep_links
            and refs
            and all(r.get("kind") == "symlink" for r in refs)
        ):
            continue
        failed.add(check.get("type") or "?")
    return sorted(failed)


def spare_cores() -> bool:
    """Whether this host has cores for the static checks beside the scan (4 or more usable;
    RBKIT_AUDIT_BESIDE=1 or 0 decides instead: the tests take both ways on any host)."""
    forced = os.environ.get("RBKIT_AUDIT_BESIDE", "")
    if forced in ("0", "1"):
        return forced == "1"
    return cpus.count() >= 4


class EarlyAudit:
    """rbprobes ARGV in a child Python (this interpreter, this kit), begun before the scan; its
    output goes to unlinked temporary files, read when the scan is done."""

    def __init__(self, argv: List[str]) -> None:
        env = stream.child_env()
        self._out, self._err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        self._p: Optional[subprocess.Popen] = None
        try:
            self._p = subprocess.Popen(
                launch.argv(sys.executable, "rbprobes") + list(argv),
                stdin=subprocess.DEVNULL,
                stdout=self._out,
                stderr=self._err,
                cwd="/",
                env=env,
            )
        except OSError as exc:
            self._err.write(("could not start the static checks: %s\n" % exc.strerror).encode())

    def cancel(self) -> None:
        if self._p is not None and self._p.poll() is None:
            self._p.kill()
            self._p.wait()

    def result(self) -> Tuple[int, str, str]:
        """(exit code, stdout, stderr) as cli.main would leave them (124: past AUDIT_TIMEOUT_S)."""
        rc = 127
        if self._p is not None:
            try:
                rc = self._p.wait(AUDIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.cancel()
                rc = 124
        texts = []
        for fh in (self._out, self._err):
            fh.seek(0)
            texts.append(fh.read().decode("utf-8", "replace"))
            fh.close()
        return rc, texts[0], texts[1]


def _in_process(argv: List[str]) -> Tuple[int, str, str]:
    cli = importlib.import_module("rbprobes.cli")
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        rc = cli.main(argv)
    except SystemExit as exc:  # argparse: a usage error
        rc = exc.code if isinstance(exc.code, int) else 2
    finally:
        sys.stdout, sys.stderr = old
    return rc, out.getvalue(), err.getvalue()


def audit(
    ctx: runner.Context,
    argv: List[str],
    stat: str,
    installed_stat: str,
    outside_links: str,
    early: Optional[EarlyAudit] = None,
) -> runner.Result:
    """rbprobes ARGV (in this process, or `early`'s result): facts audit_rc (0 passed, 1 failed,
    else it could not run), audit_failed (the failed check types, space-separated). Its human
    lines go to the log: all of them when it could not run, the problems when it failed."""
    what = argv[0] if argv else ""
    if installed_stat and installed_stat == stat:
        if early is not None:
            early.cancel()
        return runner.Result(
            "skipped: the source is the tree the destination's install recorded (same stat "
            "fingerprint %s); the static checks are not repeated" % stat[:16],
            {"audit_rc": 0, "audit_skipped": 1, "audit_failed": "", "audit_what": what},
            status="skipped",
        )
    rc, out, err = early.result() if early is not None else _in_process(argv)
    failed: List[str] = []
    if rc == 1:
        doc: Dict[str, Any] = {}
        try:
            doc = json.loads(out)
            failed = failed_checks(doc, outside_links == "keep")
        except ValueError:
            rc = 2
            err += "the static checks' report is not JSON: %s\n" % out[:200]
        # the problems, each with its fix (not the table of checks); a single check (outside)
        # prints none: its reason says them
        lines = [ln for ln in err.splitlines() if not TABLE_ROW.match(ln)] or [
            "%s: %s" % (c.get("type"), c.get("reason"))
            for c in doc.get("checks") or [doc]
            if c.get("status") == "fail"
        ]
    else:
        lines = err.splitlines() if rc != 0 else []
    for line in lines:
        # a long fact (outside: N reference(s) leave ...) wrapped, each line the engine's prefix
        ctx.log(
            textwrap.fill(
                line,
                width=96,
                subsequent_indent="  ",
                break_long_words=False,
                break_on_hyphens=False,
            )
            if len(line) > 96
            else line
        )
    if rc == 0 or (rc == 1 and not failed):
        said = "passed"
    elif rc == 1:
        said = "failed: " + " ".join(failed)
    else:
        said = "could not run (exit %s)" % rc
    return runner.Result(
        "%s: %s" % (what, said),
        {"audit_rc": rc, "audit_skipped": 0, "audit_failed": " ".join(failed), "audit_what": what},
    )
