"""A runbook a reviewer reads in one sitting (issue 46): generated/b300.sh in at most 350 lines,
and a one-field change of a spec shows in its runbook as that field's lines only (besides the
header's spec sha256 and seal lines, and the settings that carry the spec's sha256)."""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

import pytest

from compiler import cli, plan

ROOT = Path(__file__).resolve().parents[2]
# a line of a changed pair longer than this is a line a reviewer cannot read as one field
READABLE = 200


def test_b300_is_at_most_350_lines():
    lines = (ROOT / "generated" / "b300.sh").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 350, f"generated/b300.sh: {len(lines)} lines"


def _runbook(tmp_path: Path, name: str, text: str, monkeypatch) -> str:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "specs").mkdir(exist_ok=True)
    spec = tmp_path / "specs" / f"{name}.yaml"
    spec.write_text(text, encoding="utf-8")
    out = cli.compile_spec(Path("specs") / f"{name}.yaml", tmp_path / "generated")
    assert out is not None
    return out.text


@pytest.mark.parametrize(
    "name, old, new, token",
    [
        ("h200", "jobs: 8", "jobs: 12", ("8", "12")),  # transfer.jobs
        ("b300", "size: 4096", "size: 8192", ("4096", "8192")),  # one check's value
        ("b300", '"*.pyc"]', '"*.pyo"]', ("pyc", "pyo")),  # one exclude entry
    ],
    ids=["transfer.jobs", "a check's value", "an exclude entry"],
)
def test_a_one_field_change_diffs_that_fields_lines_only(
    tmp_path, monkeypatch, name, old, new, token
):
    spec = (ROOT / "specs" / f"{name}.yaml").read_text(encoding="utf-8")
    assert spec.count(old) == 1
    before = _runbook(tmp_path, name, spec, monkeypatch).splitlines()
    after = _runbook(tmp_path, name, spec.replace(old, new), monkeypatch).splitlines()
    sha = re.search(r"^readonly RB_SPEC_SHA256=(\w+)$", "\n".join(after), re.M).group(1)
    changed = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=before, b=after).get_opcodes():
        if tag == "equal":
            continue
        assert tag == "replace" and i2 - i1 == j2 - j1, (before[i1:i2], after[j1:j2])
        for was, now in zip(before[i1:i2], after[j1:j2]):
            if sha in now or now.startswith("# sha256 of this file with these 64 digits zeroed"):
                continue  # the spec's sha256 (header, RB_SPEC_SHA256, RB_SPEC_FILES), the seal
            changed += 1
            # the field's value, nothing else on the line, and a line one reads as one field
            words = re.split(r"(\W)", was), re.split(r"(\W)", now)
            assert len(words[0]) == len(words[1]), (was, now)
            assert {pair for pair in zip(*words) if pair[0] != pair[1]} == {token}, (was, now)
            assert len(now) <= READABLE, f"{len(now)} characters changed for one field: {now}"
    assert changed > 0


def test_the_json_documents_are_one_key_a_line_and_the_same_document():
    document = json.dumps(
        {"b": 1, "checks": [{"id": "x", "params": {"size": 1}}, {"id": "y"}], "a": {"c": [1, 2]}},
        sort_keys=True,
        separators=(",", ":"),
    )
    keyed = plan.keyed(document)
    assert json.loads(keyed) == json.loads(document)
    assert keyed.splitlines() == [
        "{",
        '  "a":{"c":[1,2]},',
        '  "b":1,',
        '  "checks":[',
        '    {"id":"x","params":{"size":1}},',
        '    {"id":"y"}',
        "  ]",
        "}",
    ]
    assert plan.keyed(keyed) == keyed
