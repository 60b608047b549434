"""The `compile` command: spec files -> linted runbooks in generated/. Errors are mapped to exit
codes here and nowhere else (see README: Exit codes)."""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NoReturn, Optional

from . import __version__, kit, lint, loader, plan, render, resolve, validate
from .errors import CompilerError, DriftError, Problem, SpecError, UsageError

KIT_LINE = re.compile(r"^readonly RB_KIT_FILE=(.*)$", re.M)
EXIT_OK = 0
EXIT_INTERNAL = 70


@dataclass
class Output:
    spec: str
    path: Path
    text: str
    warnings: list[Problem] = field(default_factory=list)
    kit: Optional[tuple[Path, bytes]] = None  # the pinned kit's file (generated/.kit/<sha>.tar)
    data: Optional[bytes] = None  # bytes to write instead of text (a kit file)


def shown_path(path: Path) -> str:
    """The spec's path as the header shows it: relative to the working directory when inside it."""
    rel = os.path.relpath(path.resolve(), Path.cwd())
    return path.as_posix() if rel.startswith("..") else Path(rel).as_posix()


def runbook_names(source: loader.Source, out_dir: Path) -> tuple[loader.Source, dict[str, str]]:
    """The spec's files as its runbook in out_dir names them, whatever directory compile ran in
    (errors and warnings name them from there): relative to the folder above out_dir (the
    project: specs/x.yaml for generated/x.sh) for a file inside it, else as given. And the path
    the runbook finds each by, from its own folder (../specs/x.yaml), for its seal: name -> path."""
    out = os.path.realpath(out_dir)
    root = os.path.dirname(out)
    names: dict[str, str] = {}
    from_runbook: dict[str, str] = {}
    for path, _sha in source.files:
        real = os.path.realpath(path)
        rel = os.path.relpath(real, root)
        name = path if rel == ".." or rel.startswith("../") else Path(rel).as_posix()
        names[path] = name
        from_runbook[name] = Path(os.path.relpath(real, out)).as_posix()
    return source.renamed(names), from_runbook


def compile_spec(
    spec_path: Path, out_dir: Path, *, explicit: bool = True, standalone: bool = False
) -> Optional[Output]:
    """The runbook of one spec; None for a base (`abstract: true`) found in a directory."""
    source = loader.load(shown_path(spec_path), allow_abstract=not explicit)
    if source.abstract:
        return None
    spec, warnings = validate.validate_with_warnings(source)
    script = out_dir / f"{spec_path.stem}.sh"
    shown = source.path
    source, from_runbook = runbook_names(source, out_dir)
    decided = resolve.resolve(
        spec, source, script_name=script.name, standalone=standalone, from_runbook=from_runbook
    )
    text = render.render(decided)
    # the runbook as written and, for the default form, with the runtime in place (what runs)
    lint.lint([text] if standalone else [text, render.render(plan.lint_view(decided))], kit.files())
    pinned = None
    if not standalone:
        sha, data = kit.pinned()
        pinned = (out_dir / plan.KIT_DIR / f"{sha}.tar", data)
    return Output(shown, script, text, warnings, pinned)


def kit_outputs(outputs: list[Output]) -> list[Output]:
    """The kit files the runbooks pin, each once, as outputs of their own."""
    seen: dict[Path, Output] = {}
    for output in outputs:
        if output.kit and output.kit[0] not in seen:
            seen[output.kit[0]] = Output(output.spec, output.kit[0], "", data=output.kit[1])
    return list(seen.values())


def referenced_kits(out_dir: Path) -> set[str]:
    """Names of the kit files that the runbooks in out_dir pin."""
    names = set()
    for script in out_dir.glob("*.sh"):
        found = KIT_LINE.search(script.read_text(encoding="utf-8", errors="replace"))
        if found:
            names.add(found.group(1).strip("'").rsplit("/", 1)[-1])
    return names


def is_standalone(script: Path) -> bool:
    """Whether an existing runbook carries its kit (compile --standalone): --check compares it
    with that form."""
    if not script.is_file():
        return False
    found = KIT_LINE.search(script.read_text(encoding="utf-8", errors="replace"))
    return found is not None and found.group(1) == "''"


def prune_kits(out_dir: Path) -> list[Path]:
    """Remove kit files in out_dir/.kit that no runbook there pins any more."""
    keep = referenced_kits(out_dir)
    removed = []
    for tar in sorted((out_dir / plan.KIT_DIR).glob("*.tar")):
        if tar.name not in keep:
            tar.unlink()
            removed.append(tar)
    return removed


def write_atomically(outputs: list[Output]) -> None:
    """Every file is written to a temp file beside it first; renames happen only when all exist."""
    staged = []
    try:
        for out in outputs:
            out.path.parent.mkdir(parents=True, exist_ok=True)
            if out.data is not None and out.path.exists() and out.path.read_bytes() == out.data:
                continue  # content-addressed: already there
            fd, tmp = tempfile.mkstemp(prefix=f".{out.path.name}.", dir=out.path.parent)
            with os.fdopen(fd, "wb") as handle:
                handle.write(out.text.encode("utf-8") if out.data is None else out.data)
            os.chmod(tmp, 0o755 if out.data is None else 0o644)
            staged.append((tmp, out.path))
        for tmp, final in staged:
            os.replace(tmp, final)
    finally:
        for tmp, _final in staged:
            if os.path.exists(tmp):
                os.unlink(tmp)


def collect(paths: list[str]) -> list[tuple[Path, bool]]:
    """(spec, named explicitly) for each file given and each *.yaml in each directory given."""
    specs: list[tuple[Path, bool]] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            specs.extend((f, False) for f in sorted([*path.glob("*.yaml"), *path.glob("*.yml")]))
        elif path.exists():
            specs.append((path, True))
        else:
            raise UsageError(f"{raw}: no such file or directory")
    if not specs:
        raise UsageError("no spec files given (e.g. compile specs/b300.yaml, or compile specs/)")
    return specs


def compile_all(
    specs: list[tuple[Path, bool]],
    out_dir: Path,
    *,
    standalone: Callable[[Path], bool] = lambda _script: False,
) -> list[Output]:
    """Every spec's runbook; warnings go to stderr; SpecError with every problem of every spec (a
    mistake in a shared base is reported once). `standalone(script)`: embed the kit in it."""
    outputs: list[Output] = []
    problems: list[Problem] = []
    other: list[CompilerError] = []
    for spec, explicit in specs:
        try:
            out = compile_spec(
                spec, out_dir, explicit=explicit, standalone=standalone(out_dir / f"{spec.stem}.sh")
            )
        except SpecError as exc:
            problems.extend(p for p in exc.problems if p not in problems)
            continue
        except CompilerError as exc:
            other.append(exc)
            continue
        if out is None:
            print(f"skipped {shown_path(spec)}: a base (abstract: true) for other specs")
            continue
        outputs.append(out)
        for warning in out.warnings:
            print(validate.warning_line(warning), file=sys.stderr)
    if problems:
        raise SpecError(problems)
    if other:
        raise other[0]
    return outputs


def check(specs: list[tuple[Path, bool]], out_dir: Path) -> tuple[list[str], int]:
    """Names of files in out_dir that differ from what their spec compiles to (or lack a spec), and
    how many runbooks were compared. A runbook in its --standalone form (kit embedded) is compared
    with that form."""
    outputs = compile_all(specs, out_dir, standalone=is_standalone)
    drift = []
    expected = {output.path.name for output in outputs}
    for output in outputs + kit_outputs(outputs):
        if not output.path.exists():
            drift.append(f"{output.path}: missing (compile {output.spec})")
        elif output.data is not None and output.path.read_bytes() != output.data:
            drift.append(
                f"{output.path}: differs from the kit it is named for (compile {output.spec})"
            )
        elif output.data is None and output.path.read_text(encoding="utf-8") != output.text:
            drift.append(f"{output.path}: differs from {output.spec} (compile {output.spec})")
    if out_dir.is_dir():
        for stray in sorted([*out_dir.glob("*.sh"), *(out_dir / plan.KIT_DIR).glob("*.tar")]):
            if stray.name not in expected and stray.name not in {
                output.kit[0].name for output in outputs if output.kit
            }:
                drift.append(f"{stray}: no spec in specs/ compiles to it (delete it)")
    return drift, len(outputs)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would exit 2, the code of spec errors
        raise UsageError(f"{self.prog}: {message} (see compile --help)")


def parser() -> argparse.ArgumentParser:
    cli_parser = _Parser(
        prog="compile",
        description="Compile runbook specs (YAML) into linted bash runbooks.",
        epilog="Exit codes: 0 ok, 2 spec errors, 3 a compiler bug (lint or render), "
        "4 generated/ drift, "
        "64 usage, 70 internal error. Templating (extends, --new, --schema, --plan): "
        "docs/templating.md.",
    )
    cli_parser.add_argument(
        "specs", nargs="*", help="spec files or directories (default with --check: specs/)"
    )
    cli_parser.add_argument(
        "-o", "--output-dir", default="generated", help="where runbooks go (generated/)"
    )
    mode = cli_parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 4 naming every runbook that no longer matches its spec",
    )
    mode.add_argument(
        "--plan",
        metavar="SPEC",
        help="print what SPEC's runbook will do, as markdown for a PR; write nothing",
    )
    mode.add_argument(
        "--schema",
        action="store_true",
        help="print the JSON Schema of specs (docs/spec.schema.json)",
    )
    mode.add_argument(
        "--kit-diff",
        nargs=2,
        metavar=("OLD", "NEW"),
        help="print which kit files changed between two kits (sha256, a prefix, "
        "a tar's path, or `current`) and their diff",
    )
    mode.add_argument(
        "--new", metavar="NAME", help="write a new spec NAME.yaml beside the --from spec, to edit"
    )
    cli_parser.add_argument(
        "--from",
        dest="from_spec",
        metavar="SPEC",
        help="with --new: the spec to start from (default: the packaged example, "
        "written to specs/NAME.yaml)",
    )
    cli_parser.add_argument(
        "--standalone",
        action="store_true",
        help="embed the kit in the runbook (one self-contained file) instead of pinning "
        "generated/.kit/<sha256>.tar by its hash",
    )
    cli_parser.add_argument(
        "--version", action="version", version=f"runbook-compiler {__version__}"
    )
    cli_parser.add_argument(
        "--traceback", action="store_true", help="show Python tracebacks of crashes"
    )
    return cli_parser


def run(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    out_dir = Path(args.output_dir)
    if args.from_spec is not None and args.new is None:
        raise UsageError(
            "--from SPEC goes with --new NAME, e.g. compile --new h100-b --from specs/b300.yaml"
        )
    if (args.plan or args.schema or args.new or args.kit_diff) and args.specs:
        raise UsageError(
            f"--plan, --schema, --new and --kit-diff take no other spec arguments: {args.specs}"
        )
    if args.kit_diff:
        from . import kitdiff

        old, new = (kitdiff.load(ref, out_dir) for ref in args.kit_diff)
        print(kitdiff.diff(old, new), end="")
        return EXIT_OK
    if args.schema:
        from . import schema  # the modes below import what only they use: compile starts faster

        print(schema.text(), end="")
        return EXIT_OK
    if args.plan:
        return _plan(Path(args.plan), out_dir)
    if args.new:
        from . import newspec

        written, todo = newspec.create(args.new, Path(args.from_spec) if args.from_spec else None)
        print(
            f"wrote {written}; write this spec's values in place of the <...: CHANGE ME> "
            f"placeholders and delete the {newspec.MARKER} markers (compile {written} refuses "
            "it until then):"
        )
        for problem in todo:
            print(
                f"  {problem.path}:{problem.line}:{problem.column}: {problem.field or '(comment)'}"
            )
        return EXIT_OK
    if args.check:
        specs = collect(args.specs or ["specs"])
        drift, count = check(specs, out_dir)
        if drift:
            raise DriftError("generated/ does not match specs/:\n  " + "\n  ".join(drift))
        print(f"ok: {count} runbooks in {out_dir}/ match their specs")
        return EXIT_OK
    outputs = compile_all(collect(args.specs), out_dir, standalone=lambda _script: args.standalone)
    write_atomically(outputs + kit_outputs(outputs))
    for output in outputs:
        print(
            f"wrote {output.path} from {output.spec}"
            + (f" (kit {output.kit[0]})" if output.kit else "")
        )
    for tar in prune_kits(out_dir):
        print(f"removed {tar}: no runbook pins it any more")
    return EXIT_OK


def _plan(spec_path: Path, out_dir: Path) -> int:
    if not spec_path.is_file():
        raise UsageError(f"{spec_path}: no such file")
    source = loader.load(shown_path(spec_path))
    spec, warnings = validate.validate_with_warnings(source)
    for warning in warnings:
        print(validate.warning_line(warning), file=sys.stderr)
    from . import planmd

    script = out_dir / f"{spec_path.stem}.sh"
    decided = resolve.resolve(spec, source, script_name=script.name)
    from . import kitdiff

    print(
        planmd.markdown(decided, script, warnings) + kitdiff.plan_section(script, out_dir), end=""
    )
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return run(argv)
    except CompilerError as exc:
        for line in exc.lines():
            print(line, file=sys.stderr)
        if isinstance(exc, SpecError):
            count = len(exc.problems)
            print(
                f"{count} problem{'s' if count != 1 else ''}; nothing was written", file=sys.stderr
            )
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted; nothing was written", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place that turns crashes into a message
        if "--traceback" in argv:
            import traceback

            traceback.print_exc()
        else:
            print(
                f"internal error: {type(exc).__name__}: {exc} (re-run with --traceback)",
                file=sys.stderr,
            )
        return EXIT_INTERNAL
