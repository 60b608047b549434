"""`python -m rbview report ...`: the run's report from its event log, and its pictures, on the
machine that runs the runbook (the controller-only entry: a host's kit has no rbview, and its
`rbkit` command line names nothing that is not there).

    report --events E --out R --name N --spec S --sha H --outcome O [...] [--pictures DIR]

writes R (report.json, a new file renamed over it), prints the summary table on stderr and, with
--pictures, draws the run's pictures into DIR in the same process (one Python start less at the
end of every run): `drawn PATH` for each on stdout. A drawing that fails is said on stderr and by
no `drawn` line, never the report's outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import List, Optional

from rbkit import report


def parser() -> argparse.ArgumentParser:
    rp = argparse.ArgumentParser(
        prog="rbview report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rp.add_argument("--name", required=True)
    rp.add_argument("--spec", required=True)
    rp.add_argument("--sha", required=True)
    rp.add_argument("--events", required=True)
    rp.add_argument("--probe", action="append", default=[])
    rp.add_argument("--outcome", required=True)
    rp.add_argument("--where", default="", help="where a run that did not pass stopped")
    rp.add_argument(
        "--gpu", action="store_true", help="the spec declares gpu: say whether it was proven"
    )
    rp.add_argument("--out", required=True)
    rp.add_argument(
        "--pictures", default="", help="also draw the run's pictures into this directory"
    )
    rp.add_argument("--fanout", default="", help="with --pictures: the fan-out's fanout.json")
    return rp


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        probes = dict(item.split("=", 1) for item in args.probe)
        doc = report.build(
            args.name,
            args.spec,
            args.sha,
            args.events,
            probes,
            args.outcome,
            gpu=args.gpu,
            where=args.where,
        )
        # a new file of its own name beside the report (O_EXCL, never a name another user could
        # have pointed elsewhere), renamed over it
        fd, tmp = tempfile.mkstemp(
            prefix=".report.", suffix=".tmp", dir=os.path.dirname(args.out) or "."
        )
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(doc, fh, indent=2, sort_keys=True)
                fh.write("\n")
            os.replace(tmp, args.out)
        except BaseException:
            os.unlink(tmp)
            raise
    except (OSError, ValueError) as exc:
        print(f"rbview report: {exc}", file=sys.stderr)
        return 1
    print(report.table(doc), file=sys.stderr)
    if args.pictures:
        try:
            from . import draw

            for path in draw.draw(doc, args.events, args.pictures, args.fanout):
                print("drawn %s" % path)
        except Exception as exc:  # noqa: BLE001 - the pictures are a view; the report stands
            print(
                "rbview report: could not draw the pictures: %s: %s" % (type(exc).__name__, exc),
                file=sys.stderr,
            )
    return 0
