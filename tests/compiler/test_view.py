"""The view model is typed (issue #14): resolve returns a frozen view.Plan for every spec, with no
untyped dict or list left in it, templates read it by attribute and fail on a name it lacks, and a
Safe word stays Safe on its way to the template."""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from pathlib import Path

import jinja2
import pytest

from compiler import cli, fanout, loader, render, resolve, steps, validate, view
from compiler.render import Safe

ROOT = Path(__file__).resolve().parents[2]
SPECS = [
    p
    for p in sorted((ROOT / "specs").glob("*.yaml"))
    if not loader.load(os.path.relpath(p), allow_abstract=True).abstract
]


def build(path: Path, *, standalone: bool = False) -> view.Plan:
    source = loader.load(cli.shown_path(path))
    return resolve.resolve(
        validate.validate(source), source, f"{path.stem}.sh", standalone=standalone
    )


def walk(value: object, where: str):
    """Every value inside a plan, with where it sits (`plan.hosts[0].ssh_words[2]`)."""
    yield where, value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from walk(getattr(value, f.name), f"{where}.{f.name}")
    elif isinstance(value, tuple):
        for i, item in enumerate(value):
            yield from walk(item, f"{where}[{i}]")


def hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls, vars(view))


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_there_are_specs():
    assert len(SPECS) >= 5


@pytest.mark.parametrize("standalone", [False, True], ids=["pinned", "standalone"])
@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_the_plan_of_every_spec_is_a_typed_frozen_dataclass(spec, standalone):
    p = build(spec, standalone=standalone)
    assert type(p) is view.Plan
    for where, value in walk(p, "plan"):
        assert isinstance(value, (str, int, bool, tuple, type(None))) or (
            dataclasses.is_dataclass(value)
        ), f"{where} is a {type(value).__name__}"
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.runbook.name = "x"  # type: ignore[misc]
    assert (p.fanout is not None) == (p.transfer.route is None) == (p.transfer.direct_ssh is None)


def test_every_field_of_the_view_model_is_typed_without_any_or_dict():
    """The types say what each value is: no `Any`, no `dict`, no bare `list` anywhere inside."""
    seen, todo = set(), [view.Plan]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls
        for name, hint in hints(cls).items():
            parts, stack = [], [hint]
            while stack:
                h = stack.pop()
                parts.append(h)
                stack.extend(typing.get_args(h))
            assert typing.Any not in parts, f"{cls.__name__}.{name}: {hint}"
            assert not any(
                typing.get_origin(h) in (dict, list) or h in (dict, list) for h in parts
            ), f"{cls.__name__}.{name}: {hint}"
            todo.extend(h for h in parts if dataclasses.is_dataclass(h))
    assert {c.__name__ for c in seen} >= {
        "Plan",
        "Identity",
        "Kit",
        "KitFile",
        "Transfer",
        "Destination",
        "Checks",
        "Fanout",
        "HostView",
        "StepView",
        "Setting",
        "Array",
        "Map",
        "Gpu",
        "Check",
    }


def test_the_settings_rows_come_from_the_groups():
    p = build(ROOT / "specs" / "cluster8.yaml")
    settings = {s.name: s.value for s in p.settings}
    arrays = {a.name: a.words for a in p.arrays}
    assert settings["RB_SRC_HOST"] == p.transfer.src_host
    assert settings["RB_FAN_NODES"] == p.fanout.nodes
    # one key a line, the same document (plan.keyed)
    assert json.loads(settings["RB_PROBE_CONFIG"]) == json.loads(p.checks.config)
    assert arrays["RB_FAN_NODE_LIST"] == p.fanout.node_list
    assert "RB_ROUTE" not in settings and "RB_DIRECT_SSH" not in arrays
    maps = {m.name: dict(m.entries) for m in p.maps}
    assert [s.id for s in p.steps] == list(maps["RB_STEP_DOC"]) == list(arrays["RB_STEPS"])
    assert all(maps["RB_STEP_PREVIEW"][s.id] == s.preview for s in p.steps)


def test_a_word_that_expands_at_run_time_stays_safe():
    """`~/` in an identity file is a Safe word (bash expands it); the typed model keeps it Safe."""
    p = build(ROOT / "specs" / "b300.yaml")
    words = [w for h in p.hosts for w in h.ssh_words if w.startswith('"${HOME}"/')]
    assert words and all(isinstance(w, Safe) for w in words)
    assert all(
        isinstance(f.text, Safe)
        for f in build(ROOT / "specs" / "local.yaml", standalone=True).kit.files
    )


def names(p: view.Plan) -> dict[str, object]:
    return {f.name: getattr(p, f.name) for f in dataclasses.fields(p)}


@pytest.mark.parametrize(
    "template",
    [
        "{{ runbook.no_such_field|comment }}",  # a field the group lacks
        "{% for h in hosts %}{{ h.nope|sh }}{% endfor %}",
        "{{ kit_partial|sh }}",  # a name the templates read before the groups
        "{{ spec_path|comment }}",
    ],
)
def test_a_name_the_plan_lacks_fails_the_render(template):
    p = build(ROOT / "specs" / "b300.yaml")
    with pytest.raises(jinja2.UndefinedError):
        render.environment().from_string(template).render(names(p))


def test_a_group_field_without_a_quoting_filter_is_refused():
    p = build(ROOT / "specs" / "b300.yaml")
    with pytest.raises(render.RenderError):
        render.environment().from_string("{{ transfer.src_path }}").render(names(p))


def test_fanout_group_only_for_fanout_specs():
    for spec in SPECS:
        p = build(spec)
        validated = validate.validate(loader.load(cli.shown_path(spec)))
        if validated.fanout:
            assert p.fanout is not None and p.install == fanout.FanOut(
                p.fanout, fanout.ENGINES[p.fanout.engine]
            )
            assert p.fanout.node_list == tuple(fanout.expand(validated.fanout.nodes))
        else:
            assert p.fanout is None and p.transfer.route is not None
            assert p.install == steps.SingleHost()
