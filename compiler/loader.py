"""Stage 1: read a spec file into plain data, keeping the line and column of every node.

`parse` reads one file; `load` reads a spec with the chain of specs it `extends:` (extends.py)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.constructor import DuplicateKeyError, RoundTripConstructor
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import SequenceNode
from ruamel.yaml.scalarbool import ScalarBoolean

from .errors import Problem, SpecError

Loc = tuple  # a pydantic-style location: ("transfer", "exclude", 2)
APPEND_TAG = "!append"  # on a list in a spec that extends another: add to the base's list
PLAIN_SCALAR = re.compile(r"[^\s,\[\]{}#'\"]+")  # a number or word as written, up to a flow separator


@dataclass
class Source:
    """A loaded spec: its data (ruamel containers, which remember positions), text and digest.

    A spec that `extends:` others is one merged tree (see extends.py): `chain` names its files, top
    first, `origins` says which file each entry of the tree came from (the deepest listed location
    wins; absent: `path`), and `sha256` covers the bytes of every file in the chain.
    """

    path: str
    text: str
    data: Any
    sha256: str = field(default="")
    chain: tuple[str, ...] = field(default=())
    files: tuple[tuple[str, str], ...] = field(default=())  # (path, sha256 of its bytes), top first
    origins: dict[Loc, str] = field(default_factory=dict)
    abstract: bool = False
    markers: list[Problem] = field(default_factory=list)  # fields still marked TODO(change me)
    texts: dict[str, str] = field(default_factory=dict)  # path -> text, of every file in the chain

    def locate(self, loc: Loc, *, key: bool = False) -> tuple[str, int, int]:
        """File, line and column (1-based) of the node at `loc`, or of its nearest existing parent.

        With `key=True` a mapping entry is located at its key (for unknown-key errors), else at its
        value.
        """
        where = (self.path, 1, 1)
        for depth, (line, col) in self._walk(loc, key):
            where = (self.origin(loc[:depth]), line, col)
        return where

    def position(self, loc: Loc, *, key: bool = False) -> tuple[int, int]:
        """Line and column in `path` itself: of `loc`, or of its nearest parent written there (what
        a `(specs/x.yaml:14)` pointer in the runbook may name)."""
        best = (1, 1)
        for depth, pos in self._walk(loc, key):
            if self.origin(loc[:depth]) == self.path:
                best = pos
        return best

    def origin(self, loc: Loc) -> str:
        """The file the entry at `loc` came from."""
        for depth in range(len(loc), -1, -1):
            found = self.origins.get(tuple(loc[:depth]))
            if found is not None:
                return found
        return self.path

    def _walk(self, loc: Loc, key: bool):
        node: Any = self.data
        for depth, part in enumerate(loc, 1):
            last = depth == len(loc)
            if isinstance(node, CommentedMap) and part in node and node.lc.data:
                line, col = node.lc.key(part) if (key and last) else node.lc.value(part)
            elif (isinstance(node, CommentedSeq) and isinstance(part, int) and 0 <= part < len(node)
                  and node.lc.data):
                line, col = node.lc.item(part)
            else:
                return
            yield depth, (line + 1, col + 1)
            node = node[part]

    def written(self, loc: Loc) -> Optional[str]:
        """The plain scalar at `loc` as the file spells it (`12.10`, where the data holds the float
        12.1); None when `loc` is not written in a file of the chain or is not a plain scalar."""
        if not any(depth == len(loc) for depth, _pos in self._walk(loc, False)):
            return None
        path, line, col = self.locate(loc)
        lines = self.texts.get(path, self.text if path == self.path else "").splitlines()
        if not 0 < line <= len(lines):
            return None
        found = PLAIN_SCALAR.match(lines[line - 1], col - 1)
        return found.group(0) if found else None

    def problem(self, loc: Loc, message: str, *, key: bool = False) -> Problem:
        path, line, col = self.locate(loc, key=key)
        return Problem(path, line, col, dotted(loc), message)


def dotted(loc: Loc) -> str:
    """("transfer", "exclude", 2) -> "transfer.exclude[2]"."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


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
    from . import extends

    return extends.load(str(path), allow_abstract=allow_abstract)


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
    return Source(path=shown, text=text, data=data, sha256=hashlib.sha256(raw).hexdigest(),
                  chain=(shown,), files=((shown, hashlib.sha256(raw).hexdigest()),),
                  texts={shown: text})


def _tab_at(text: str, line: int, col: int) -> bool:
    """Whether the character at `line`:`col` (1-based) is a tab: YAML refuses tabs in indentation
    and between tokens, and ruamel's message ("found character '\\t' that cannot start any token")
    does not say what to do."""
    lines = text.split("\n")
    return 0 < line <= len(lines) and 0 < col <= len(lines[line - 1]) \
        and lines[line - 1][col - 1] == "\t"


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
