"""`compile --new NAME [--from SPEC]`: start the spec of a new cluster from an existing one.

The new file is SPEC's own text (comments kept, `extends:` kept) with `name: NAME`, written beside
SPEC; without --from, the example that ships in the package (compiler/data/example.yaml), written
to specs/NAME.yaml. A spec without a `yaml-language-server` modeline gets one naming the JSON
Schema, which is written beside it (runbook-spec.schema.json) where it is not there yet: editors
find it with no checkout of this repository around. In a copy of a spec, the values that differ
from cluster to cluster (description, the destination host's address and key, the destination
path, the GPU model, the CUDA version and home) carry a `# TODO(change me)` comment. In a spec
made from the example, whose hosts and paths are no one's, each such value is a placeholder
instead (`ssh: <source host: CHANGE ME>`), which no real value can be mistaken for, and the
description carries the comment. A spec with a marker or a placeholder left does not compile:
`compile` lists each one with its line and column, so the first compile is the checklist. Nothing
existing is ever overwritten.
"""

from __future__ import annotations

import io
import os
from importlib import resources
from pathlib import Path
from typing import Any, Optional

from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.tokens import CommentToken

from . import extends, loader, schema, validate
from .errors import Problem, SpecError, UsageError
from .fields import NAME

MARKER = extends.MARKER
# (path in the spec, with "<dst>" for the destination host's id): the values a new cluster changes.
MARKED = (
    ("description",),
    ("hosts", "<dst>", "ssh"),
    ("hosts", "<dst>", "jump"),
    ("hosts", "<dst>", "identity_file"),
    ("transfer", "to"),
    ("gpu", "model"),
    ("cuda", "version"),
    ("cuda", "home"),
)
# In a spec made from the example: (path, with "<src>"/"<dst>" for the hosts' ids) -> the
# placeholder that stands for the value; HOST:PATH entries keep their host.
PLACEHOLDERS = (
    (("hosts", "<src>", "ssh"), "<source host, e.g. root@gpu-old.example.org: CHANGE ME>"),
    (("hosts", "<dst>", "ssh"), "<destination host, e.g. root@gpu-new.example.org: CHANGE ME>"),
    (("transfer", "from"), "<path of the venv on the source host: CHANGE ME>"),
    (("transfer", "to"), "<path to install the venv at on the destination: CHANGE ME>"),
    (("cuda", "version"), "<CUDA version on the destination, e.g. 13.0: CHANGE ME>"),
    (("cuda", "home"), "<CUDA directory on the destination, e.g. /usr/local/cuda-13.0: CHANGE ME>"),
    (("gpu", "model"), "<GPU model on the destination, e.g. H100: CHANGE ME>"),
    # the venv's own dirs, which no example can know: a default that cannot pass (the exports
    # step refused `nvidia/cu13/lib` after the swap, issue 45) is a placeholder too
    (
        ("cuda", "library_path_first"),
        "<dirs of site-packages whose libraries go first, e.g. "
        "nvidia/cu13/lib, or none: []: CHANGE ME>",
    ),
)
EXAMPLE_MARKED = (("description",),)

EXAMPLE = ("data", "example.yaml")
SCHEMA_FILE = "runbook-spec.schema.json"
MODELINE = "# yaml-language-server: $schema="


def create(name: str, from_path: Optional[Path]) -> tuple[Path, list[Problem]]:
    """Write the new spec; its path and the markers in it (the to-do list)."""
    if name.endswith((".yaml", ".yml")) or "/" in name or not NAME.match(name):
        raise UsageError(
            f"--new {name!r}: give a spec name (lower-case letters, digits, '.', '_', "
            "'-'), e.g. --new h100-b; the file is NAME.yaml beside the --from spec"
        )
    if from_path is None:
        return _from_example(name)
    if not from_path.is_file():
        raise UsageError(f"--from {from_path}: no such file")
    shown = str(from_path)
    source = loader.load(shown, allow_abstract=True)
    if source.abstract:
        children = _extending(from_path)
        hint = f", e.g. --from {children[0]}" if children else ""
        raise UsageError(
            f"--from {from_path}: a base (abstract: true) is not a cluster; start from a "
            f"spec that extends it{hint}"
        )
    spec = validate.validate(source)  # the copy starts from a spec that compiles
    target = from_path.parent / f"{name}.yaml"
    text = render(
        from_path.read_text(encoding="utf-8"), name, spec.transfer.target[0], str(from_path)
    )
    return _write(target, text)


def _from_example(name: str) -> tuple[Path, list[Problem]]:
    text = resources.files("compiler").joinpath(*EXAMPLE).read_text(encoding="utf-8")
    target = Path("specs") / f"{name}.yaml"
    target.parent.mkdir(parents=True, exist_ok=True)
    return _write(target, render(text, name, "new", "the packaged example", placeholders=True))


def _write(target: Path, text: str) -> tuple[Path, list[Problem]]:
    modeline = MODELINE not in text
    if modeline:
        text = f"{MODELINE}{SCHEMA_FILE}\n{text}"
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise UsageError(
            f"{target} exists; refusing to overwrite it (choose another name, or "
            "delete the file first)"
        ) from None
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    schema_path = target.parent / SCHEMA_FILE
    if modeline and not schema_path.exists():
        schema_path.write_text(schema.text(), encoding="utf-8")
    written = loader.parse(str(target))
    todo = extends.markers(written) + validate.placeholders(written)
    return target, sorted(todo, key=lambda p: (p.line, p.column))


def render(text: str, name: str, dst_host: str, origin: str, *, placeholders: bool = False) -> str:
    """The new spec's text: `text` with the new name and the markers; with `placeholders` (the
    example), a placeholder in place of each value that is the example's own."""
    yaml = loader.yaml_rt()
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 4096
    yaml.preserve_quotes = True
    data = yaml.load(text)
    if "name" in data:
        data["name"] = name
    else:
        data.insert(1 if extends.EXTENDS in data else 0, "name", name)
    marked = 0
    if placeholders:
        src_host = str(data["transfer"]["from"]).partition(":")[0]
        for path, text in PLACEHOLDERS:
            ids = {"<src>": src_host, "<dst>": dst_host}
            marked += _replace(data, tuple(ids.get(part, part) for part in path), text)
    for path in EXAMPLE_MARKED if placeholders else MARKED:
        path = tuple(dst_host if part == "<dst>" else part for part in path)
        marked += _mark(data, path)
    if not marked:  # a copy that changes nothing would move to the old cluster: say so
        _mark(data, ("name",), note="a copy of " + origin + ": change what differs")
    out = io.StringIO()
    yaml.dump(data, out)
    head = (
        f"# Made by `compile --new {name} --from {origin}`. Edit each value marked with the TODO\n"
        "# comment and delete the marker: compile refuses this spec while one is left.\n"
    )
    if placeholders:
        head = (
            f"# Made by `compile --new {name}` from {origin}. Write this spec's value in place\n"
            "# of each <...: CHANGE ME> placeholder, edit the value marked with the TODO comment\n"
            "# and delete the marker: compile refuses this spec while one is left.\n"
        )
    return head + out.getvalue()


def _parents(data: Any, path: tuple) -> Optional[list]:
    """The mappings from the top down to the one that holds the entry at `path`; None when this
    file does not have them."""
    parents = [data]
    for part in path[:-1]:
        node = parents[-1].get(part) if isinstance(parents[-1], CommentedMap) else None
        if not isinstance(node, CommentedMap):
            return None
        parents.append(node)
    return parents


def _block_style(parents: list) -> None:
    """One key a line in every mapping on the way to an entry changed (a flow mapping would hide
    the marker)."""
    for node in parents[1:]:
        node.fa.set_block_style()


def _mark(data: Any, path: tuple, note: str = "") -> int:
    """Put the marker on the entry at `path` if this file has it (block style, one key a line)."""
    parents = _parents(data, path)
    if parents is None:
        return 0
    owner, key = parents[-1], path[-1]
    if key not in owner or isinstance(owner[key], CommentedMap):
        return 0
    _block_style(parents)
    comment = f"{MARKER}" + (f": {note}" if note else "")
    entry = owner.ca.items.get(key)
    old = entry[2] if entry and len(entry) > 2 and isinstance(entry[2], CommentToken) else None
    if old is not None:
        first, newline, rest = old.value.partition("\n")
        old.value = f"# {comment} -- {first.lstrip('#').strip()}{newline}{rest}"
    else:
        owner.yaml_add_eol_comment(comment, key)
    return 1


def _replace(data: Any, path: tuple, text: str) -> int:
    """Put the placeholder `text` in place of the value at `path` if this file has it (a HOST:PATH
    entry keeps its host); its mapping is written in block style, one key a line."""
    parents = _parents(data, path)
    if parents is None:
        return 0
    owner, key = parents[-1], path[-1]
    if isinstance(owner.get(key), list):
        _block_style(parents)
        owner[key] = [text]  # a list: the placeholder is its one item
        return 1
    if not isinstance(owner.get(key), str):
        return 0
    _block_style(parents)
    host, sep, _path = owner[key].partition(":")
    owner[key] = f"{host}:{text}" if path[0] == "transfer" and sep else text
    return 1


def _extending(base: Path) -> list[str]:
    """Specs beside `base` that extend it (for the hint when --from names a base)."""
    out = []
    for path in sorted(base.parent.glob("*.yaml")):
        if path == base:
            continue
        try:
            data = loader.parse(str(path)).data
        except SpecError:
            continue
        value = data.get(extends.EXTENDS)
        if isinstance(value, str) and (path.parent / value).resolve() == base.resolve():
            out.append(str(path))
    return out
