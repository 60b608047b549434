"""What `--dry-run` prints for a step (RB_STEP_PREVIEW), made from data: each step is described
once as a tuple of `view.Action`s (steps.ACTIONS for the single-host install, fanout.ACTIONS for
the fan-out), and `preview` turns a step's actions and the decisions into its lines, the same way
for every step of either install.

An action says on which host it runs, its command words and a note in plain words. Each variable
part of them is a reference, `{NAME}`, to one decision, never a copy of it:

    {RB_SRC_PATH}          a row of the runbook's settings block (plan.values: the value the runbook
                           itself holds, for the runtime to read)
    {destination.staging}  a field of the decisions (view.Decisions) that no row holds
    {rules.tar_record}     a rule the kit states (rbrules), as RULES names it
    {compression}          what the install decides in words (Install.preview_words)
    {host.id}              the host an `each host` action is about (view.HostView)

A list of words is shown as shell words (quoted as one would type them), or, with `{NAME:list}`,
as a list in words ("a, b, c"), with `{NAME:count}` as its length. An empty value takes the space
before it along. `when`/`unless` show an action only when a decision has (has not) a value.
"""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING, Mapping, Optional

from rbrules import enginerules, launch, paths, streams

from . import plan
from .errors import CompilerBug
from .view import Action

if TYPE_CHECKING:
    from .view import Decisions, HostView

# the rules a preview names (each stated once, in rbrules)
RULES: dict[str, object] = {
    "tar_record": streams.TAR_RECORD,
    "streams_min_mb": streams.STREAMS_MIN_BYTES >> 20,
    "max_streams": streams.MAX_STREAMS,
    "prove_timeout": enginerules.PROVE_TIMEOUT,
    "installed_manifest": paths.INSTALLED_MANIFEST,
    "flags": launch.FLAGS,
    "site_flags": launch.SITE_FLAGS,
    "start": launch.START,
}
# where an action runs -> how its line starts
ON = {
    "src": "on {RB_SRC_HOST}: ",
    "dst": "on {RB_DST_HOST}: ",
    "here": "here: ",  # the machine that runs the runbook
    "each host": "on {host.id}: ",  # one line for each host the runbook touches
    "note": "",  # words about the step, on no host
    "more": "  ",  # the line before goes on
}
REFERENCE = re.compile(r"( ?)\{([A-Za-z_][A-Za-z0-9_.]*)(?::(list|count))?\}")


def named(decided: Decisions, ids: tuple[str, ...]) -> dict[str, object]:
    """What a preview may name besides the decisions' fields and the rules: the settings block's
    rows (of a runbook with the steps `ids`) and the install's own words."""
    return {**plan.values(decided, ids), **decided.install.preview_words(decided)}


def preview(
    actions: tuple[Action, ...], decided: Decisions, values: Mapping[str, object]
) -> list[str]:
    """A step's --dry-run lines: each of its actions that applies, its references filled in from
    `values` (`named`) and the decisions."""
    lines = []
    for action in actions:
        for host in decided.hosts if action.on == "each host" else (None,):
            if not _applies(action, decided, values, host):
                continue
            run, note = (_fill(text, decided, values, host) for text in (action.run, action.note))
            said = f"{run} ({note})" if run and note else run or note
            lines.append(_fill(ON[action.on], decided, values, host) + said)
    return lines


def references(action: Action) -> list[str]:
    """The names an action refers to (for the tests: each one names a decision)."""
    texts = (ON[action.on], action.run, action.note)
    named = [match.group(2) for text in texts for match in REFERENCE.finditer(text)]
    return named + [pair[0] for pair in (action.when, action.unless) if pair]


def _applies(
    action: Action, decided: Decisions, values: Mapping[str, object], host: Optional[HostView]
) -> bool:
    if action.when and _value(action.when[0], decided, values, host) != action.when[1]:
        return False
    return not (
        action.unless and _value(action.unless[0], decided, values, host) == action.unless[1]
    )


def _fill(
    text: str, decided: Decisions, values: Mapping[str, object], host: Optional[HostView]
) -> str:
    def shown(match: re.Match[str]) -> str:
        space, name, form = match.groups()
        value = _value(name, decided, values, host)
        if isinstance(value, (tuple, list)):
            if form == "count":
                value = str(len(value))
            elif form == "list":
                value = ", ".join(value) or "none"
            else:
                value = " ".join(shlex.quote(word) for word in value)
        value = str(value)
        return space + value if value else ""

    return REFERENCE.sub(shown, text)


def _value(
    name: str, decided: Decisions, values: Mapping[str, object], host: Optional[HostView]
) -> object:
    """The decision `name` refers to (see the module's docstring)."""
    if name in values:
        return values[name]
    head, _, rest = name.partition(".")
    if head == "rules" and rest in RULES:
        return RULES[rest]
    found: object = host if head == "host" else decided
    parts = rest.split(".") if head == "host" else name.split(".")
    for part in parts:
        if found is None or not hasattr(found, part):
            raise CompilerBug(f"a step's preview refers to {name!r}, which names no decision")
        found = getattr(found, part)
    return found
