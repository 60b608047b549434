"""One hierarchy for every error a user can cause; the CLI maps them to exit codes in one place."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One mistake in one input file, located at a line and column (1-based; 0 = unknown)."""

    path: str
    line: int
    column: int
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}:{self.column}" if self.line else self.path
        field = f" {self.field}:" if self.field else ""
        return f"{where}:{field} {self.message}"


class CompilerError(Exception):
    """Base of everything the CLI reports without a traceback."""

    exit_code = 1

    def lines(self) -> list[str]:
        return [str(self)]


class SpecError(CompilerError):
    """The spec is wrong; carries every problem found, not just the first."""

    exit_code = 2

    def __init__(self, problems: list[Problem]):
        self.problems = sorted(problems, key=lambda p: (p.path, p.line, p.column, p.field))
        super().__init__("\n".join(str(p) for p in self.problems))

    def lines(self) -> list[str]:
        return [str(p) for p in self.problems]


class CompilerBug(CompilerError):
    """A bug of the compiler (or its templates), never of the spec: nothing is written. Every
    kind of it exits with the one code."""

    exit_code = 3


class LintError(CompilerBug):
    """The generated runbook failed shellcheck or an embedded Python file does not compile."""


class RenderError(CompilerBug):
    """A template used a value without a quoting filter, or a filter got a value it refuses
    (render.py)."""


class DriftError(CompilerError):
    """`compile --check`: generated/ no longer matches specs/."""

    exit_code = 4


class UsageError(CompilerError):
    """Bad command line (missing file, conflicting flags)."""

    exit_code = 64
