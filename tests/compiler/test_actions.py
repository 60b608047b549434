"""The --dry-run previews are derived from data (issue 46): each step is a tuple of actions
(steps.ACTIONS, fanout.ACTIONS) whose variable parts name the decisions, and one generic function
(actions.preview) makes every step's lines; no code writes a step's preview by its name."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
from pathlib import Path

import pytest

from compiler import actions, cli, fanout, loader, resolve, steps, validate, view

ROOT = Path(__file__).resolve().parents[2]
CASES = sorted((ROOT / "tests" / "cases" / "valid").glob("*.yaml"))
STEP_IDS = set(steps.SINGLE_HOST) | set(steps.FANOUT)


def build(path: Path) -> view.Plan:
    source = loader.load(cli.shown_path(path))
    return resolve.resolve(validate.validate(source), source, f"{path.stem}.sh")


@pytest.fixture(scope="module")
def plans() -> list[view.Plan]:
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        return [build(path) for path in CASES]
    finally:
        os.chdir(here)


def test_every_step_has_its_actions_and_nothing_else_does():
    assert set(steps.ACTIONS) == set(steps.SINGLE_HOST)
    assert set(fanout.ACTIONS) == set(fanout.FANOUT)
    for table in (steps.ACTIONS, fanout.ACTIONS):
        for step, acts in table.items():
            assert acts and all(isinstance(a, view.Action) for a in acts), step
            assert all(a.on in actions.ON for a in acts), step
    # each install reads its steps' actions from its table
    assert steps.SingleHost.actions is steps.ACTIONS
    assert fanout.FanOut.actions is fanout.ACTIONS


def test_no_code_writes_a_preview_by_the_steps_name():
    """The previews come from one function: it names no step, and neither install has a
    per-step preview of its own any more."""
    for install in (steps.SingleHost, fanout.FanOut):
        assert not hasattr(install, "preview"), install
    tree = ast.parse(inspect.getsource(actions))
    named = {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    assert not named & STEP_IDS, named & STEP_IDS
    compared = [node for node in ast.walk(tree) if isinstance(node, ast.Compare)]
    for node in compared:
        words = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        assert not words & {"step", "sid", "step_id"}, ast.unparse(node)


def test_every_reference_names_a_decision(plans):
    """Each `{NAME}` of every action resolves for some case of its install (a settings row, a
    rule, a field of the decisions), and every RB_ name is a row of the settings block."""
    unresolved = []
    for table, kind in ((steps.ACTIONS, steps.SingleHost), (fanout.ACTIONS, fanout.FanOut)):
        mine = [p for p in plans if isinstance(p.install, kind)]
        assert mine, kind
        for step, acts in table.items():
            for action in acts:
                for name in actions.references(action):
                    if not any(_resolves(name, p) for p in mine):
                        unresolved.append(f"{step}: {name}")
    assert not unresolved


def _resolves(name: str, p: view.Plan) -> bool:
    held = actions.named(p, tuple(s.id for s in p.steps))
    if name.startswith("RB_"):
        return name in held
    try:
        actions._value(name, p, held, p.hosts[0])
    except Exception:
        return False
    return True


def test_the_preview_shows_the_settings_blocks_values(plans):
    """A preview's variable parts are the values the runbook's settings block holds: change the
    source path in the decisions and every step that names it says the new one."""
    p = next(p for p in plans if isinstance(p.install, steps.SingleHost))
    moved = dataclasses.replace(p.transfer, src_path="/elsewhere/v env")
    changed = dataclasses.replace(p, transfer=moved)
    held = actions.named(changed, tuple(s.id for s in p.steps))
    assert held["RB_SRC_PATH"] == "/elsewhere/v env"
    lines = actions.preview(steps.ACTIONS["manifest"], changed, held)
    assert lines[0].startswith(f"on {p.transfer.src_host}: rbkit engine hash /elsewhere/v env ")


def test_a_reference_to_no_decision_is_a_compiler_bug(plans):
    from compiler.errors import CompilerBug

    p = plans[0]
    with pytest.raises(CompilerBug, match="no_such"):
        actions.preview((view.Action("here", "{no_such.thing}"),), p, {})


def test_an_empty_list_takes_its_space_along(plans):
    p = plans[0]
    lines = actions.preview(
        (view.Action("here", "scan {RB_X} --then {RB_Y:list} {RB_Y:count}"),),
        p,
        {"RB_X": (), "RB_Y": ("a b", "c")},
    )
    assert lines == ["here: scan --then a b, c 2"]
