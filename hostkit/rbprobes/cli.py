"""Command line: `python -m rbprobes CHECK [options]` and `python -m rbprobes run ...`.

Exit status: 0 pass (or skip), 1 fail, 2 usage error. A standalone check prints its result as
JSON on stdout; `run` writes the report file and prints a table on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional

from rbrules.shown import printable, shown

from . import proc, report, runner
from .result import FAIL, Context

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own usage errors: exit 2, as documented
        self.print_usage(sys.stderr)
        sys.stderr.write("%s: error: %s\n" % (self.prog, message))
        sys.exit(EXIT_USAGE)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-skip",
        action="store_true",
        help="a missing precondition (no GPU, no torch) is a skip, not a failure",
    )
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="stop waiting for the check after this many seconds",
    )


def build_parser() -> argparse.ArgumentParser:
    prog = "python -m %s" % (__package__ or "rbprobes")
    parser = _Parser(prog=prog, description="Probe a Python/CUDA environment.")
    sub = parser.add_subparsers(dest="command", metavar="CHECK", parser_class=_Parser)
    sub.required = True

    cmd = sub.add_parser("run", help="run the checks of a config document, write a report")
    cmd.add_argument(
        "--config-json",
        required=True,
        help="the config document as a JSON string ('-': read it from stdin)",
    )
    cmd.add_argument("--report", required=True, help="where to write the report JSON")

    cmd = sub.add_parser("kernel_audit", help="L0: GPU code in a venv vs a target arch")
    cmd.add_argument("path", help="a venv (or any directory), or one .so/.cubin/.fatbin file")
    cmd.add_argument("--arch", required=True, help="target device, e.g. sm_103 or 10.3")
    cmd.add_argument(
        "--path",
        dest="paths",
        action="append",
        help="only this path (relative to PATH); repeatable",
    )
    cmd.add_argument(
        "--driver-ptx-max",
        help="newest PTX ISA the driver accepts, e.g. 9.0 ('none': do not check; "
        "default: this host's driver)",
    )
    cmd.add_argument(
        "--driver-cuda", help="the driver's CUDA version, e.g. 12.8 (instead of --driver-ptx-max)"
    )
    cmd.add_argument(
        "--partial-ok",
        dest="partial_ok",
        action="append",
        help="glob of files whose units may lack the target (vendor dispatch); "
        "repeatable; replaces the default nvidia/*",
    )
    cmd.add_argument(
        "--no-partial-ok",
        action="store_true",
        help="no file may have units without a path (partial_ok: [])",
    )
    cmd.add_argument("--strict", action="store_true", help="every unit counts, partial_ok ignored")
    _common(cmd)

    cmd = sub.add_parser("relocation", help="L0: a moved venv works where it lives")
    cmd.add_argument("venv")
    cmd.add_argument("--old", help="the prefix the venv was built at (searched for in bin/)")
    cmd.add_argument("--timeout-s", type=int, default=60, help="bound on starting bin/python")
    _common(cmd)

    cmd = sub.add_parser("outside", help="L0: references from the venv to paths outside it")
    cmd.add_argument("venv")
    _common(cmd)

    cmd = sub.add_parser(
        "preflight",
        help="source host, before a move: kernel_audit for the "
        "destination arch + outside (+ relocation with --old)",
    )
    cmd.add_argument("--venv", required=True)
    cmd.add_argument("--arch", required=True, help="the destination's arch, e.g. sm_103")
    cmd.add_argument("--old", help="also run the relocation check with this old prefix")
    cmd.add_argument(
        "--path",
        dest="paths",
        action="append",
        help="audit only this path (relative to the venv); repeatable",
    )
    cmd.add_argument("--driver-ptx-max", help="the destination driver's PTX ISA limit")
    cmd.add_argument("--driver-cuda", help="the destination driver's CUDA version, e.g. 13.0")
    cmd.add_argument("--partial-ok", dest="partial_ok", action="append")
    cmd.add_argument("--no-partial-ok", action="store_true")
    cmd.add_argument("--strict", action="store_true")

    cmd = sub.add_parser("libraries", help="L0/L1: CUDA libraries shipped and loaded")
    cmd.add_argument("--venv", help="the venv (default: this interpreter's prefix)")
    cmd.add_argument(
        "--expect-dir",
        dest="expect_dirs",
        action="append",
        default=[],
        help="another directory libraries may come from; repeatable",
    )
    cmd.add_argument(
        "--library-dir",
        dest="library_dirs",
        action="append",
        default=[],
        help="a cuda.library_dirs entry; repeatable",
    )
    cmd.add_argument("--cuda-home", help="cuda.home")
    cmd.add_argument(
        "--module",
        dest="modules",
        action="append",
        help="import this before reading the maps (default: torch); repeatable",
    )
    cmd.add_argument("--static-only", action="store_true", help="only scan the venv's files")
    _common(cmd)

    cmd = sub.add_parser("torch", help="L1: torch version, CUDA version, driver")
    cmd.add_argument("--version", dest="version")
    cmd.add_argument("--cuda")
    _common(cmd)

    cmd = sub.add_parser("devices", help="L1: device count, names, capability, torch arch list")
    cmd.add_argument("--count", type=int)
    cmd.add_argument("--capability", help="e.g. 10.3")
    cmd.add_argument("--name", dest="names", action="append")
    _common(cmd)

    cmd = sub.add_parser("imports", help="L1: import modules, report versions and files")
    cmd.add_argument("modules", nargs="+")
    _common(cmd)

    cmd = sub.add_parser("matmul", help="L2: matmul on every device vs a float64 reference")
    cmd.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    cmd.add_argument("--size", type=int, default=4096)
    cmd.add_argument("--first-device", action="store_true", help="only device 0")
    _common(cmd)

    cmd = sub.add_parser("nccl", help="L2: all-reduce across all local GPUs")
    cmd.add_argument("--timeout-s", type=int, default=180)
    _common(cmd)

    cmd = sub.add_parser("python", help="run a Python snippet with this interpreter")
    cmd.add_argument("code")
    cmd.add_argument("--name")
    cmd.add_argument("--timeout-s", type=int, default=300)
    _common(cmd)

    cmd = sub.add_parser("command", help="run a shell command with /bin/sh -c")
    cmd.add_argument("run")
    cmd.add_argument(
        "--venv", help="whose bin/ goes first in PATH (default: this interpreter's prefix)"
    )
    cmd.add_argument("--name")
    cmd.add_argument("--expect-exit", type=int, default=0)
    cmd.add_argument("--timeout-s", type=int, default=300)
    _common(cmd)
    return parser


def _standalone(args: argparse.Namespace) -> Dict[str, Any]:
    """The check dict and context a standalone command line stands for."""
    command = args.command
    params: Dict[str, Any] = {}
    venv: Optional[str] = None
    cuda: Dict[str, Any] = {}
    if command == "kernel_audit":
        venv = os.path.abspath(args.path)
        ptx_max = args.driver_ptx_max
        if not ptx_max and args.driver_cuda:
            from . import driver

            limit = driver.ptx_max_for_cuda(args.driver_cuda)
            ptx_max = "%d.%d" % limit if limit else "none"
        params = {
            "arch": args.arch,
            "paths": args.paths,
            "driver_ptx_max": ptx_max,
            "strict": args.strict or None,
            "partial_ok": [] if args.no_partial_ok else args.partial_ok,
        }
    elif command == "relocation":
        venv = os.path.abspath(args.venv)
        params = {"old": args.old, "timeout_s": args.timeout_s}
    elif command == "outside":
        venv = os.path.abspath(args.venv)
    elif command == "libraries":
        venv = os.path.abspath(args.venv) if args.venv else None
        params = {
            "expect_dirs": args.expect_dirs or None,
            "modules": args.modules,
            "runtime": False if args.static_only else None,
        }
        cuda = {"library_dirs": args.library_dirs, "home": args.cuda_home}
    elif command == "torch":
        params = {"version": args.version, "cuda": args.cuda}
    elif command == "devices":
        params = {"count": args.count, "capability": args.capability, "names": args.names}
    elif command == "imports":
        params = {"modules": args.modules}
    elif command == "matmul":
        params = {
            "dtype": args.dtype,
            "size": args.size,
            "every_device": False if args.first_device else None,
        }
    elif command == "nccl":
        params = {"timeout_s": args.timeout_s}
    elif command == "python":
        params = {"code": args.code, "name": args.name, "timeout_s": args.timeout_s}
    elif command == "command":
        venv = os.path.abspath(args.venv) if args.venv else None
        params = {
            "run": args.run,
            "name": args.name,
            "expect_exit": args.expect_exit,
            "timeout_s": args.timeout_s,
        }
    check = {
        "id": command,
        "type": command,
        "allow_skip": args.allow_skip,
        "params": {k: v for k, v in params.items() if v is not None},
    }
    if args.deadline_s:
        check["timeout_s"] = args.deadline_s
    return {"check": check, "ctx": Context(venv=venv, cuda=cuda or None)}


def _load_config(text: str) -> Dict[str, Any]:
    if text == "-":
        text = sys.stdin.read()
    try:
        return json.loads(text)
    except ValueError as exc:
        raise runner.ConfigError("--config-json is not valid JSON: %s" % exc) from None


def main(argv: Optional[List[str]] = None) -> int:
    proc.apply_safe_env()
    args = build_parser().parse_args(argv)
    if args.command == "run":
        warned = _keep_warnings()
        try:
            config = _load_config(args.config_json)
            doc, _stopped = runner.run_config(config)
        except runner.ConfigError as exc:
            sys.stderr.write("error: %s\n" % exc)
            return EXIT_USAGE
        if warned:
            doc["warnings"] = warned
        report.write(args.report, doc)
        sys.stderr.write(report.table(doc["checks"]) + "\n" + report.summary_line(doc) + "\n")
        code = EXIT_FAIL if doc["summary"].get("fail") else EXIT_OK
        # The report is written. Leave without the interpreter's teardown: a stuck check's
        # thread (_stopped) would be waited for, and with torch loaded the teardown alone is a
        # noticeable part of the probe step, for nothing.
        _hard_exit(code)
    if args.command == "preflight":
        return _preflight(args)
    job = _standalone(args)
    entry = runner.run_check(job["check"], job["ctx"])
    sys.stdout.write(json.dumps(entry, indent=2, default=str) + "\n")
    code = EXIT_FAIL if entry["status"] == FAIL else EXIT_OK
    if entry["values"].get("timed_out"):
        _hard_exit(code)
    return code


def _keep_warnings() -> List[str]:
    """Python warnings the checked packages raise while they are imported and used (torch's
    `Failed to initialize NumPy`) are kept for the report (and the runbook's log), not printed
    among the checks' lines: they are the package's, not a verdict."""
    import warnings

    kept: List[str] = []

    def keep(
        message: Any,
        category: Any,
        filename: str,
        lineno: int,
        file: Any = None,
        line: Optional[str] = None,
    ) -> None:
        kept.append(warnings.formatwarning(message, category, filename, lineno, line).strip())

    warnings.showwarning = keep
    return kept


def _preflight(args: argparse.Namespace) -> int:
    from . import preflight

    try:
        doc = preflight.run(
            args.venv,
            args.arch,
            args.old,
            args.driver_ptx_max,
            args.driver_cuda,
            [] if args.no_partial_ok else args.partial_ok,
            args.strict,
            args.paths,
        )
    except ValueError as exc:
        sys.stderr.write("error: %s\n" % exc)
        return EXIT_USAGE
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    sys.stderr.write(report.table(doc["checks"]) + "\n")
    for problem in doc["problems"]:
        # (the file is the source's: its name shown escaped, rbrules.shown)
        sys.stderr.write(
            printable(
                "%s: %s%s: %s"
                % (
                    problem["check"],
                    shown(problem["file"]),
                    " [%s]" % problem["package"] if problem.get("package") else "",
                    problem["what"],
                )
            )
            + "\n    fix: %s\n" % printable(problem["fix"])
        )
    return EXIT_OK if doc["ok"] else EXIT_FAIL


def _hard_exit(code: int) -> None:
    """Leave now, output flushed, without joining threads (a check stuck in a CUDA call, say)
    or running the interpreter's teardown."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
