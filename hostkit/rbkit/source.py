"""The source before anything is sent, in one process (`rbkit engine source`): the scan (a venv
after the excludes, what the threat model refuses; stream.scan_source) and the static checks
(rbprobes: `outside`, or `preflight` with the kernel audit for the target's arch), run in this
process instead of a second Python start.

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
import re
import sys
from typing import Any, Dict, List

from . import engine, stream

# rbprobes' table of checks (`check ...`, `outside   L0 ...`): not repeated in the log
TABLE_ROW = re.compile(r"^check |^[a-z_]* *L0 ")


def scan(ctx: engine.Context, root: str, excludes: List[str], names: Any, special_modes: str,
         outside_links: str, into: Dict[str, Any]) -> engine.Result:
    try:
        detail, facts = stream.scan_source(root, excludes, names, special_modes, outside_links)
    except stream.SourceRefused as exc:
        raise engine.StepError(str(exc)) from None
    into.update(facts)
    return engine.Result(detail, facts)


def failed_checks(doc: Dict[str, Any], keep_links: bool) -> List[str]:
    """The check types that failed in an rbprobes document; links that leave the tree are the
    spec's to allow (transfer.outside_links: keep)."""
    failed = set()
    for c in doc.get("checks") or [doc]:
        refs = (c.get("values") or {}).get("refs") or []
        if c.get("status") != "fail" or (c.get("type") == "outside" and keep_links and refs and
                                         all(r.get("kind") == "symlink" for r in refs)):
            continue
        failed.add(c.get("type") or "?")
    return sorted(failed)


def audit(ctx: engine.Context, argv: List[str], stat: str, installed_stat: str,
          outside_links: str) -> engine.Result:
    """rbprobes ARGV in this process: facts audit_rc (0 passed, 1 failed, else it could not run),
    audit_failed (the failed check types, space-separated). Its human lines go to the log: all
    of them when it could not run, the problems when it failed."""
    what = argv[0] if argv else ""
    if installed_stat and installed_stat == stat:
        return engine.Result(
            "skipped: the source is the tree the destination's install recorded (same stat "
            "fingerprint %s); the static checks are not repeated" % stat[:16],
            {"audit_rc": 0, "audit_skipped": 1, "audit_failed": "", "audit_what": what},
            status="skipped")
    cli = importlib.import_module("rbprobes.cli")
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        rc = cli.main(argv)
    except SystemExit as exc:                       # argparse: a usage error
        rc = exc.code if isinstance(exc.code, int) else 2
    finally:
        sys.stdout, sys.stderr = old
    failed: List[str] = []
    if rc == 1:
        doc: Dict[str, Any] = {}
        try:
            doc = json.loads(out.getvalue())
            failed = failed_checks(doc, outside_links == "keep")
        except ValueError:
            rc = 2
            err.write("the static checks' report is not JSON: %s\n" % out.getvalue()[:200])
        # the problems, each with its fix (not the table of checks); a single check (outside)
        # prints none: its reason says them
        lines = [ln for ln in err.getvalue().splitlines() if not TABLE_ROW.match(ln)] or \
            ["%s: %s" % (c.get("type"), c.get("reason")) for c in doc.get("checks") or [doc]
             if c.get("status") == "fail"]
    else:
        lines = err.getvalue().splitlines() if rc != 0 else []
    for line in lines:
        sys.stderr.write(line + "\n")
    sys.stderr.flush()
    if rc == 0 or (rc == 1 and not failed):
        said = "passed"
    elif rc == 1:
        said = "failed: " + " ".join(failed)
    else:
        said = "could not run (exit %s)" % rc
    return engine.Result("%s: %s" % (what, said),
                         {"audit_rc": rc, "audit_skipped": 0, "audit_failed": " ".join(failed),
                          "audit_what": what})

