"""Stage 1: read a spec file into plain data, keeping the line and column of every node."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.scalarbool import ScalarBoolean

from .errors import Problem, SpecError

Loc = tuple  # a pydantic-style location: ("transfer", "exclude", 2)


@dataclass
class Source:
    """A loaded spec: its data (ruamel containers, which remember positions), text and digest."""

    path: str
    text: str
    data: Any
    sha256: str = field(default="")

    def position(self, loc: Loc, *, key: bool = False) -> tuple[int, int]:
        """Line and column (1-based) of the node at `loc`, or of its nearest existing parent.

        With `key=True` a mapping entry is located at its key (for unknown-key errors), else at its
        value.
        """
        node: Any = self.data
        best = (1, 1)
        for depth, part in enumerate(loc):
            last = depth == len(loc) - 1
            if isinstance(node, CommentedMap) and part in node:
                line, col = node.lc.key(part) if (key and last) else node.lc.value(part)
                best = (line + 1, col + 1)
                node = node[part]
            elif isinstance(node, CommentedSeq) and isinstance(part, int) and 0 <= part < len(node):
                line, col = node.lc.item(part)
                best = (line + 1, col + 1)
                node = node[part]
            else:
                break
        return best

    def problem(self, loc: Loc, message: str, *, key: bool = False) -> Problem:
        line, col = self.position(loc, key=key)
        return Problem(self.path, line, col, dotted(loc), message)


def dotted(loc: Loc) -> str:
    """("transfer", "exclude", 2) -> "transfer.exclude[2]"."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def load(path: str | Path) -> Source:
    """Parse a spec file; syntax errors and duplicate keys become a SpecError with a position."""
    shown = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise SpecError([Problem(shown, 0, 0, "", f"cannot read: {exc.strerror}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([Problem(shown, 0, 0, "", f"not UTF-8 text (byte {exc.start})")]) from None
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    try:
        data = yaml.load(text)
    except DuplicateKeyError as exc:
        mark = exc.problem_mark
        key = _duplicate_key(exc)
        raise SpecError(
            [Problem(shown, mark.line + 1, mark.column + 1, "", f"duplicate key {key!r}")]
        ) from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = " ".join(x for x in (exc.context, exc.problem) if x)
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        raise SpecError([Problem(shown, line, col, "", f"YAML syntax error: {what}")]) from None
    except YAMLError as exc:
        raise SpecError([Problem(shown, 0, 0, "", f"YAML error: {exc}")]) from None
    if data is None:
        raise SpecError([Problem(shown, 1, 1, "", "the spec is empty")])
    if not isinstance(data, CommentedMap):
        raise SpecError([Problem(shown, 1, 1, "", "the spec must be a mapping of keys to values")])
    return Source(path=shown, text=text, data=data, sha256=hashlib.sha256(raw).hexdigest())


def _duplicate_key(exc: DuplicateKeyError) -> str:
    problem = exc.problem or ""
    if '"' in problem:
        return problem.split('"')[1]
    return problem


def plain(node: Any) -> Any:
    """ruamel containers and scalar subclasses -> plain dicts, lists and builtins."""
    if isinstance(node, CommentedMap):
        return {_scalar(k): plain(v) for k, v in node.items()}
    if isinstance(node, CommentedSeq):
        return [plain(v) for v in node]
    return _scalar(node)


def _scalar(node: Any) -> Any:
    if isinstance(node, (bool, ScalarBoolean)):
        return bool(node)
    for kind in (str, int, float):
        if isinstance(node, kind):
            return kind(node)
    return node
