"""Stage 1: read a spec file into plain data, keeping the line and column of every node.

`parse` reads one file; `load` reads a spec with the chain of specs it `extends:` (extends.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.constructor import DuplicateKeyError, RoundTripConstructor
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import SequenceNode
from ruamel.yaml.scalarbool import ScalarBoolean

from . import extends
from .errors import Problem, SpecError
from .source import APPEND_TAG, Loc, Source, dotted

__all__ = ["APPEND_TAG", "Loc", "Source", "dotted", "load", "parse", "plain", "yaml_rt"]


class _Constructor(RoundTripConstructor):
    """ruamel's round-trip constructor, plus `!append` (see extends.py) keeping positions."""

    def construct_append(self, node: Any) -> Any:
        if isinstance(node, SequenceNode):
            steps = self.construct_yaml_seq(node)
        else:  # a misplaced tag: kept on the node, reported by extends.py
            steps = self.construct_unknown(node)
        data = next(steps)
        data.yaml_set_ctag(node.ctag)
        yield data
        for _ in steps:
            pass


_Constructor.add_constructor(APPEND_TAG, _Constructor.construct_append)


def load(path: str | Path, *, allow_abstract: bool = False) -> Source:
    """Read a spec and everything it `extends:` into one Source; every problem is a SpecError.
    A base (`abstract: true`) is an error unless `allow_abstract` (then `.abstract` is True)."""
    return extends.load(str(path), parse, allow_abstract=allow_abstract)


def yaml_rt() -> YAML:
    """The round-trip YAML reader/writer specs are read with."""
    yaml = YAML(typ="rt")
    yaml.Constructor = _Constructor
    yaml.allow_duplicate_keys = False
    return yaml


def parse(path: str | Path) -> Source:
    """Parse one spec file; syntax errors and duplicate keys become a SpecError with a position."""
    shown = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise SpecError([Problem(shown, 0, 0, "", f"cannot read: {exc.strerror}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([Problem(shown, 0, 0, "", f"not UTF-8 text (byte {exc.start})")]) from None
    try:
        data = yaml_rt().load(text)
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
        if _tab_at(text, line, col):
            what = "YAML needs spaces, not tabs: replace the tab here with spaces"
        else:
            what = f"YAML syntax error: {what}"
        raise SpecError([Problem(shown, line, col, "", what)]) from None
    except YAMLError as exc:
        raise SpecError([Problem(shown, 0, 0, "", f"YAML error: {exc}")]) from None
    if data is None:
        raise SpecError([Problem(shown, 1, 1, "", "the spec is empty")])
    if not isinstance(data, CommentedMap):
        raise SpecError([Problem(shown, 1, 1, "", "the spec must be a mapping of keys to values")])
    digest = hashlib.sha256(raw).hexdigest()
    return Source(
        path=shown,
        text=text,
        data=data,
        sha256=digest,
        chain=(shown,),
        files=((shown, digest),),
        texts={shown: text},
    )


def _tab_at(text: str, line: int, col: int) -> bool:
    """Whether the character at `line`:`col` (1-based) is a tab: YAML refuses tabs in indentation
    and between tokens, and ruamel's message ("found character '\\t' that cannot start any token")
    does not say what to do."""
    lines = text.split("\n")
    return (
        0 < line <= len(lines)
        and 0 < col <= len(lines[line - 1])
        and lines[line - 1][col - 1] == "\t"
    )


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
