"""python -m rbkit (on hosts) / python -m rbkit (from the repo). See docs/design.md.

    manifest build ROOT --out F [...]     a manifest of a tree (JSON summary on stdout)
    manifest verify ROOT MANIFEST [...]    a tree against a manifest (differences on stderr)
    relocate ROOT --old OLD --new NEW      rewrite what names OLD in a venv's bin/ (by hand)
    elsewhere --fd N --old OLD...          text files outside bin/ naming OLD (relocate's report)
    measure ROOT --tool T...               how fast each compressor packs a sample of the tree
    measure-link                           the link's rate: times the zeros coming on stdin
    engine ...                             the install engine (serve.py): every step of a move
    liveplan ...                           the live plan (--plan, --apply): liveplan.py

The steps of a move (scan, stage, receive, verify, relocate, prove, swap, exports, probe,
restore) are the engine's only: `python -m rbkit engine run STEP... --dest DEST` runs them by hand.
The run's report is written on the machine that runs the runbook, by the entry of the pictures'
package (controller-only: never on a host, and named nowhere in the host packages).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from rbrules import cpus, linkrate
from rbrules.cpus import jobs  # --jobs N, or auto: the CPUs this process may use


def _print(doc) -> None:
    print(json.dumps(doc, sort_keys=True))


def cmd_manifest_build(args) -> int:
    from . import manifest, manifestfile

    mf = manifest.build(
        args.root,
        args.exclude,
        args.algo,
        args.jobs,
        manifestfile.load(args.reuse) if args.reuse else None,
    )
    manifestfile.save(mf, args.out)
    if args.names:
        with open(args.names, "wb") as fh:
            manifestfile.names(mf, fh)
    _print(
        {
            "totals": mf["totals"],
            "fingerprint": manifestfile.fingerprint(mf),
            "reused": mf["reused"],
        }
    )
    return 0


def cmd_manifest_verify(args) -> int:
    from . import manifest, manifestfile

    result = manifest.verify(
        args.root, manifestfile.load(args.manifest), args.jobs, linked_from=args.linked_from
    )
    for line in manifest.describe(result):
        print(line, file=sys.stderr)
    _print({k: result[k] for k in ("ok", "algo", "checked", "hashed", "linked", "counts")})
    return 0 if result["ok"] else 1


def cmd_relocate(args) -> int:
    from . import relocate

    result = relocate.relocate(args.root, args.old, args.new)
    for rel in result["remaining"]:
        print(f"still names {args.old}: {rel}", file=sys.stderr)
    _print(
        {
            "rewritten": sorted(result["rewritten"]),
            "count": len(result["rewritten"]),
            "remaining": result["remaining"],
            "elsewhere": result["elsewhere"],
            "same_path": result["same_path"],
        }
    )
    return 1 if result["remaining"] else 0


def cmd_elsewhere(args) -> int:
    """The tree open at descriptor --fd (inherited): its text files outside bin/ that name any
    --old prefix, as a JSON list (relocate.ElsewhereChild)."""
    from . import relocate

    try:
        found = relocate.elsewhere_at(args.fd, args.old)
    finally:
        os.close(args.fd)
    _print(found)
    return 0


def cmd_measure(args) -> int:
    from . import measure

    seen: dict = {}
    link, why, seconds = 0, "", None
    if args.link == "-" and args.shared_cpu:
        # one kernel: the link was measured first, alone on the CPUs
        link, seconds, why, seen = measure.read_link(sys.stdin.readline())
    if link > 0 and measure.spare_cpu(link, seen) is False:
        doc: dict = {"tools": {}}  # no CPU to spare: no compressor is tried
    else:
        doc = measure.measure(
            args.root, args.tool, args.exclude, args.bytes, args.seconds, args.scanned
        )
    if args.link is None:
        _print(doc)
        return 0
    if args.link == "-" and not args.shared_cpu:
        link, seconds, why, seen = measure.read_link(sys.stdin.readline())
    elif args.link != "-":
        link = int(args.link)
    if seconds is not None:
        doc["link_seconds"] = seconds
    ends = measure.ends_of(args.here_cpus, seen.get("dst_cpus", ""))
    print(
        "\n".join(
            measure.main_lines(
                doc, link, args.shared_cpu, args.jobs, why or "no link rate", seen, ends
            )
        )
    )
    return 0


def cmd_measure_link(args) -> int:
    from . import measure

    got = measure.receive_link(watch=measure.watched(args.watch))
    if "error" in got:
        print("error %s" % got["error"])
        return 1
    idle = got.get("idle_cpus")
    cpu = " %d %d %d %d" % got["cpu"] if "cpu" in got else ""
    print(
        "%d %s %s %d %s%s"
        % (
            got["rate"],
            got["seconds"],
            "-" if idle is None else idle,
            got["bytes"],
            cpus.token(cpus.usable()),
            cpu,
        )
    )
    return 0


def cmd_cpus(args) -> int:
    """The CPUs this process may use, as one word (rbrules.cpus.token), and why in words."""
    usable = cpus.usable()
    print(cpus.token(usable) if args.token else usable.why)
    return 0


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rbkit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    mf = sub.add_parser("manifest").add_subparsers(dest="mcmd", required=True)
    build = mf.add_parser("build")
    build.add_argument("root")
    build.add_argument("--exclude", action="append", default=[])
    build.add_argument("--algo", choices=("sha256", "blake2b", "none"), default="sha256")
    build.add_argument("--jobs", type=jobs, default="auto")
    build.add_argument("--out", required=True)
    build.add_argument("--names")
    build.add_argument(
        "--reuse", help="an earlier install's manifest: unchanged files keep its digest"
    )
    build.set_defaults(fn=cmd_manifest_build)
    verify = mf.add_parser("verify")
    verify.add_argument("root")
    verify.add_argument("manifest")
    verify.add_argument("--jobs", type=jobs, default="auto")
    verify.add_argument("--linked-from", help="files hard-linked from here are checked by stat")
    verify.set_defaults(fn=cmd_manifest_verify)
    relocate = sub.add_parser("relocate")
    relocate.add_argument("root")
    relocate.add_argument("--old", required=True)
    relocate.add_argument("--new", required=True)
    relocate.set_defaults(fn=cmd_relocate)
    elsewhere = sub.add_parser(
        "elsewhere", help="text files outside bin/ naming an old prefix (JSON)"
    )
    elsewhere.add_argument(
        "--fd", type=int, required=True, help="an inherited descriptor of the tree"
    )
    elsewhere.add_argument("--old", action="append", required=True)
    elsewhere.set_defaults(fn=cmd_elsewhere)
    sub.add_parser("engine", help="the install engine: python -m rbkit engine --help")
    ms = sub.add_parser("measure", help="how fast each compressor packs a sample of the tree")
    ms.add_argument("root")
    ms.add_argument("--tool", action="append", default=[])
    ms.add_argument("--exclude", action="append", default=[])
    ms.add_argument("--bytes", type=int, default=linkrate.MEASURE_SAMPLE)
    ms.add_argument("--seconds", type=float, default=5.0)
    ms.add_argument(
        "--link",
        help="the link's rate (bytes/s; -: a line on stdin once the tools "
        "are measured): print the choice",
    )
    ms.add_argument(
        "--shared-cpu",
        action="store_true",
        help="the compressor and the link share CPUs (one kernel): the link's line "
        "first, the tools only where it left CPU to spare",
    )
    ms.add_argument("--scanned", help="this run's scan record (NAMES.stat): the sample's files")
    ms.add_argument(
        "--jobs",
        default="1",
        help="the run's jobs word (auto: the CPUs each machine may use): the relay's streams",
    )
    ms.add_argument(
        "--here-cpus",
        default="",
        metavar="TOKEN",
        help="the CPUs this machine of the relay may use (`rbkit cpus --token` there)",
    )
    ms.set_defaults(fn=cmd_measure)
    ml = sub.add_parser("measure-link", help="the link's rate: times the zeros coming on stdin")
    ml.add_argument(
        "--watch",
        action="append",
        default=[],
        metavar="PID:START",
        help="the link's processes on this kernel (ssh masters): their CPU is read",
    )
    ml.set_defaults(fn=cmd_measure_link)
    cp = sub.add_parser("cpus", help="the CPUs this process may use (affinity, cgroup quota)")
    cp.add_argument("--token", action="store_true", help="as one word: COUNT:SHARE:LIST:ONLINE")
    cp.set_defaults(fn=cmd_cpus)
    return parser


def main(argv=None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # the run's Ctrl-C: the runbook says where it stopped; no traceback on its terminal
        return 130


def _main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["engine"]:
        from . import serve  # the install engine's own command line (serve.py)

        return serve.main(argv[1:])
    if argv[:1] == ["liveplan"]:
        from . import liveplan  # the live plan's own command line (--plan, --apply)

        return liveplan.main(argv[1:])
    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except (OSError, ValueError) as exc:
        print(f"rbkit {args.cmd}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
