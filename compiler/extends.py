"""Stage 1, continued: a spec that `extends:` another is read as one merged tree.

- `extends: base.yaml` names the base by a path relative to the extending file's folder; a base may
  extend another (a chain); a cycle is an error naming the chain.
- Mappings merge key by key and the extending spec wins; any other value (a list, a scalar, null)
  replaces the base's, except a list tagged `!append`, which is added after the base's list.
- `abstract: true` marks a base that is not a runbook by itself: `compile specs/` skips it.
- Every entry of the merged tree remembers its file (`Source.origins`), so a mistake is reported at
  the file, line and column where it was written, whichever file of the chain that is.
- `# TODO(change me)` (what `compile --new` writes) marks a value still to edit: the spec does not
  compile while one is left.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from typing import Any, Callable

from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarbool import ScalarBoolean

from .errors import Problem, SpecError
from .source import APPEND_TAG, Loc, Source, dotted

EXTENDS = "extends"
ABSTRACT = "abstract"
META_KEYS = (EXTENDS, ABSTRACT)  # read here, never seen by the spec model
MARKER = "TODO(change me)"


def load(path: str, parse: Callable[[str], Source], *, allow_abstract: bool = False) -> Source:
    """Read `path` and its chain of bases; merge them; SpecError listing every problem. A base
    (`abstract: true`) named here is an error unless `allow_abstract` (then `.abstract` is set).
    `parse` reads one file (loader.parse: this module never imports the loader)."""
    chain: list[Source] = []
    problems: list[Problem] = []
    seen: list[str] = []
    current = parse(path)
    if current.data.get(ABSTRACT) is True and not allow_abstract:
        problems.append(
            current.problem(
                (ABSTRACT,),
                "this spec is a base (abstract: true): it becomes a runbook only through "
                "the specs that extend it; compile one of those",
                key=True,
            )
        )
    while True:
        chain.append(current)
        seen.append(os.path.realpath(current.path))
        problems.extend(_tag_problems(current))
        target = _meta(current, problems)
        if target is None:
            break
        if os.path.realpath(target) in seen:
            names = [s.path for s in chain] + [target]
            problems.append(current.problem((EXTENDS,), "cycle: " + " -> ".join(names)))
            break
        if not os.path.isfile(target):
            problems.append(current.problem((EXTENDS,), _missing(target, current.data[EXTENDS])))
            break
        try:
            current = parse(target)
        except SpecError as exc:
            problems.extend(exc.problems)
            break
    if target is not None:  # the chain is incomplete: nothing to merge
        raise SpecError(problems)
    return _combine(chain, problems)


def _meta(source: Source, problems: list[Problem]) -> str | None:
    """Check the meta keys of one file; the path it extends, if any."""
    data = source.data
    flag = data.get(ABSTRACT, False)
    if not isinstance(flag, (bool, ScalarBoolean)):
        problems.append(source.problem((ABSTRACT,), "must be true or false"))
    source.abstract = bool(flag) if isinstance(flag, (bool, ScalarBoolean)) else False
    if EXTENDS not in data:
        return None
    value = data[EXTENDS]
    if not isinstance(value, str) or not value.strip():
        problems.append(
            source.problem(
                (EXTENDS,),
                "must be the path of the base spec, relative to this file, e.g. base.yaml",
            )
        )
        return None
    if value.startswith(("/", "~")):
        problems.append(
            source.problem(
                (EXTENDS,),
                f"{value!r} must be relative to this file's folder (e.g. base.yaml), so the "
                "spec compiles in every checkout",
            )
        )
        return None
    return posixpath.normpath(posixpath.join(posixpath.dirname(source.path), value))


def _missing(target: str, written: str) -> str:
    folder = os.path.dirname(target) or "."
    near = []
    if os.path.isdir(folder):
        names = sorted(n for n in os.listdir(folder) if n.endswith((".yaml", ".yml")))
        import difflib  # only a mistake needs it

        near = difflib.get_close_matches(os.path.basename(target), names, n=1, cutoff=0.6)
    hint = ""
    if near:
        hint = f"; did you mean {posixpath.join(posixpath.dirname(written), near[0])!r}?"
    return f"no such file: {target}{hint}"


def _tag_problems(source: Source) -> list[Problem]:
    out = []
    for loc, node in _nodes(source.data, ()):
        tag = getattr(getattr(node, "tag", None), "value", None)
        if tag is None or (tag == APPEND_TAG and isinstance(node, CommentedSeq)):
            continue
        if tag == APPEND_TAG:
            kind = "a mapping" if isinstance(node, CommentedMap) else "a single value"
            out.append(source.problem(loc, f"{APPEND_TAG} goes on a list, not on {kind}"))
        else:
            out.append(
                source.problem(
                    loc,
                    f"unknown tag {tag}: the only tag a spec may use is {APPEND_TAG} (on a list)",
                )
            )
    return out


def _nodes(node: Any, loc: Loc):
    yield loc, node
    if isinstance(node, CommentedMap):
        for key, value in node.items():
            yield from _nodes(value, loc + (key,))
    elif isinstance(node, CommentedSeq):
        for index, value in enumerate(node):
            yield from _nodes(value, loc + (index,))


# -- merging ------------------------------------------------------------------------------------


def _combine(chain: list[Source], problems: list[Problem]) -> Source:
    """chain[0] extends chain[1] extends ... -> one Source (positions kept per file); SpecError
    with `problems` and those of the merge, if any."""
    for source in chain:
        for key in META_KEYS:
            source.data.pop(key, None)
    top = chain[0]
    todo = [p for source in chain for p in markers(source)]
    if len(chain) == 1:
        if problems:
            raise SpecError(problems)
        top.markers = todo
        return top
    data, origins = chain[-1].data, {(): chain[-1].path}
    for child in reversed(chain[:-1]):
        merged_origins: dict[Loc, str] = {(): child.path}
        data = _merge(data, origins, child, child.data, (), merged_origins, problems)
        origins = merged_origins
    if problems:
        raise SpecError(problems)
    digest = hashlib.sha256("\n".join(s.sha256 for s in chain).encode()).hexdigest()
    return Source(
        path=top.path,
        text=top.text,
        data=data,
        sha256=digest,
        chain=tuple(s.path for s in chain),
        files=tuple(f for s in chain for f in s.files),
        origins=origins,
        abstract=top.abstract,
        markers=todo,
        texts={s.path: s.text for s in chain},
    )


def _merge(
    base: Any,
    base_origins: dict,
    child_src: Source,
    child: Any,
    loc: Loc,
    out: dict,
    problems: list[Problem],
) -> Any:
    """The merged value at `loc`; fills `out` with the origin of every entry below `loc`."""
    if isinstance(base, CommentedMap) and isinstance(child, CommentedMap):
        merged = CommentedMap()
        for key in list(base) + [k for k in child if k not in base]:
            here = loc + (key,)
            if key in child:
                merged[key] = (
                    _merge(base.get(key), base_origins, child_src, child[key], here, out, problems)
                    if key in base
                    else child[key]
                )
                merged.lc.add_kv_line_col(key, list(child.lc.data[key]))
                out[here] = child_src.path
            else:
                merged[key] = base[key]
                merged.lc.add_kv_line_col(key, list(base.lc.data[key]))
                _inherit(base_origins, here, out)
        return merged
    if _appends(child):
        if not isinstance(base, CommentedSeq):
            if base is not None:
                problems.append(
                    child_src.problem(
                        loc, f"{APPEND_TAG} adds to a list, but the base's value here is not a list"
                    )
                )
            return child
        merged = CommentedSeq()
        for base_index, item in enumerate(base):
            merged.append(item)
            merged.lc.add_idx_line_col(base_index, list(base.lc.data[base_index]))
            _inherit(base_origins, loc + (base_index,), out)
        for child_index, item in enumerate(child):
            merged.append(item)
            merged.lc.add_idx_line_col(len(base) + child_index, list(child.lc.data[child_index]))
            out[loc + (len(base) + child_index,)] = child_src.path
        return merged
    return child


def _appends(node: Any) -> bool:
    return isinstance(node, CommentedSeq) and getattr(node.tag, "value", None) == APPEND_TAG


def _inherit(base_origins: dict, loc: Loc, out: dict) -> None:
    """Copy the origins of the base's subtree at `loc` into `out`."""
    for depth in range(len(loc), -1, -1):
        if loc[:depth] in base_origins:
            out[loc] = base_origins[loc[:depth]]
            break
    depth = len(loc)
    for key, path in base_origins.items():
        if len(key) > depth and key[:depth] == loc:
            out[key] = path


# -- TODO(change me) markers --------------------------------------------------------------------


def markers(source: Source) -> list[Problem]:
    out = []
    entries = list(_entries(source.data, ()))
    for number, line in enumerate(source.text.splitlines()):
        if MARKER not in line:
            continue
        hits = sorted((not scalar, col, loc) for loc, at, col, scalar in entries if at == number)
        loc, col = (hits[0][2], hits[0][1] + 1) if hits else ((), line.index(MARKER) + 1)
        out.append(
            Problem(
                source.path,
                number + 1,
                col,
                dotted(loc),
                f"marked {MARKER}: set the value for this spec, then delete the marker",
            )
        )
    return out


def _entries(node: Any, loc: Loc):
    """(loc, line, value column, value is a scalar) of every mapping entry and list item."""
    if isinstance(node, CommentedMap) and node.lc.data:
        items = [
            (key, value, node.lc.data[key][0], node.lc.data[key][3])
            for key, value in node.items()
            if key in node.lc.data
        ]
    elif isinstance(node, CommentedSeq) and node.lc.data:
        items = [(i, value, *node.lc.data[i][:2]) for i, value in enumerate(node)]
    else:
        return
    for part, value, line, col in items:
        yield loc + (part,), line, col, not isinstance(value, (CommentedMap, CommentedSeq))
        yield from _entries(value, loc + (part,))
