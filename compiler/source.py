"""A spec as read: its data (ruamel containers that remember positions), text, digests and where
each entry came from. Shared by the reader of one file (loader.py) and of a chain (extends.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from .errors import Problem

Loc = tuple  # a pydantic-style location: ("transfer", "exclude", 2)
APPEND_TAG = "!append"  # on a list in a spec that extends another: add to the base's list
PLAIN_SCALAR = re.compile(
    r"[^\s,\[\]{}#'\"]+"
)  # a number or word as written, up to a flow separator


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

    def renamed(self, names: dict[str, str]) -> "Source":
        """The same spec with its files named by `names` (old name -> new; absent: unchanged), for
        the runbook, whose names must not depend on the directory compile ran in."""

        def new(path: str) -> str:
            return names.get(path, path)

        return replace(
            self,
            path=new(self.path),
            chain=tuple(new(p) for p in self.chain),
            files=tuple((new(p), sha) for p, sha in self.files),
            origins={loc: new(p) for loc, p in self.origins.items()},
            texts={new(p): text for p, text in self.texts.items()},
        )

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
            elif (
                isinstance(node, CommentedSeq)
                and isinstance(part, int)
                and 0 <= part < len(node)
                and node.lc.data
            ):
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
