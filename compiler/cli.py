"""The `compile` command: spec files -> linted runbooks in generated/. Errors are mapped to exit
codes here and nowhere else (see README: Exit codes)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path

from . import lint, loader, plan, render, validate
from .errors import CompilerError, DriftError, SpecError, UsageError

EXIT_OK = 0
EXIT_INTERNAL = 70


@dataclass
class Output:
    spec: str
    path: Path
    text: str


def shown_path(path: Path) -> str:
    """The spec's path as the header shows it: relative to the working directory when inside it."""
    try:
        return Path(os.path.relpath(path.resolve(), Path.cwd())).as_posix() if not str(
            os.path.relpath(path.resolve(), Path.cwd())).startswith("..") else path.as_posix()
    except ValueError:
        return path.as_posix()


def compile_spec(spec_path: Path, out_dir: Path) -> Output:
    source = loader.load(shown_path(spec_path))
    spec = validate.validate(source)
    script = out_dir / f"{spec_path.stem}.sh"
    view = plan.build(spec, source, script_name=script.name)
    text = render.render(view)
    lint.lint(text, plan.kit_files())
    return Output(source.path, script, text)


def write_atomically(outputs: list[Output]) -> None:
    """Every file is written to a temp file beside it first; renames happen only when all exist."""
    staged = []
    try:
        for out in outputs:
            out.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{out.path.name}.", dir=out.path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(out.text)
            os.chmod(tmp, 0o755)
            staged.append((tmp, out.path))
        for tmp, final in staged:
            os.replace(tmp, final)
    finally:
        for tmp, _final in staged:
            if os.path.exists(tmp):
                os.unlink(tmp)


def collect(paths: list[str]) -> list[Path]:
    specs: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            specs.extend(sorted(p.glob("*.yaml")))
        elif p.exists():
            specs.append(p)
        else:
            raise UsageError(f"{raw}: no such file or directory")
    if not specs:
        raise UsageError("no spec files given (e.g. compile specs/b300.yaml, or compile specs/)")
    return specs


def compile_all(specs: list[Path], out_dir: Path) -> list[Output]:
    outputs, problems, other = [], [], []
    for spec in specs:
        try:
            outputs.append(compile_spec(spec, out_dir))
        except SpecError as exc:
            problems.extend(exc.problems)
        except CompilerError as exc:
            other.append(exc)
    if problems:
        raise SpecError(problems)
    if other:
        raise other[0]
    return outputs


def check(specs: list[Path], out_dir: Path) -> list[str]:
    """Names of files in out_dir that differ from what their spec compiles to (or lack a spec)."""
    outputs = compile_all(specs, out_dir)
    drift = []
    expected = {o.path.name for o in outputs}
    for o in outputs:
        if not o.path.exists():
            drift.append(f"{o.path}: missing (compile {o.spec})")
        elif o.path.read_text(encoding="utf-8") != o.text:
            drift.append(f"{o.path}: differs from {o.spec} (compile {o.spec})")
    if out_dir.is_dir():
        for stray in sorted(out_dir.glob("*.sh")):
            if stray.name not in expected:
                drift.append(f"{stray}: no spec in specs/ compiles to it (delete it)")
    return drift


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="compile",
        description="Compile runbook specs (YAML) into linted bash runbooks.",
        epilog="Exit codes: 0 ok, 2 spec errors, 3 lint failure (compiler bug), 4 generated/ drift, "
        "64 usage, 70 internal error.",
    )
    p.add_argument("specs", nargs="*", help="spec files or directories (default with --check: specs/)")
    p.add_argument("-o", "--output-dir", default="generated", help="where runbooks go (generated/)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 4 naming every runbook that no longer matches its spec")
    p.add_argument("--traceback", action="store_true", help="show Python tracebacks of crashes")
    return p


def run(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    out_dir = Path(args.output_dir)
    if args.check:
        specs = collect(args.specs or ["specs"])
        drift = check(specs, out_dir)
        if drift:
            raise DriftError("generated/ does not match specs/:\n  " + "\n  ".join(drift))
        print(f"ok: {len(specs)} runbooks in {out_dir}/ match their specs")
        return EXIT_OK
    outputs = compile_all(collect(args.specs), out_dir)
    write_atomically(outputs)
    for o in outputs:
        print(f"wrote {o.path} from {o.spec}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return run(argv)
    except CompilerError as exc:
        for line in exc.lines():
            print(line, file=sys.stderr)
        if isinstance(exc, SpecError):
            n = len(exc.problems)
            print(f"{n} problem{'s' if n != 1 else ''}; nothing was written", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted; nothing was written", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place that turns crashes into a message
        if "--traceback" in argv:
            traceback.print_exc()
        else:
            print(f"internal error: {type(exc).__name__}: {exc} (re-run with --traceback)",
                  file=sys.stderr)
        return EXIT_INTERNAL
