"""Hostile spec strings: each is refused at compile time with a located message, or compiled into a
shellcheck-clean script that treats it as inert data (a canary hidden in it never runs)."""

from __future__ import annotations

import io
import os
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler import cli, lint, loader, validate
from compiler.errors import SpecError

NASTY = [
    "$(touch {c})",
    "`touch {c}`",
    "; touch {c}",
    "'; touch {c}; '",
    '"; touch {c}; "',
    "$(touch {c})'\"`",
    "\\'$(touch {c})",
    "${{IFS}}touch${{IFS}}{c}",
    "*",
    "?[a]*",
    "..x",
    "é漢字🙂",
    "a b\tc",
    "-rf",
    "--to-command=touch {c}",
    "x\ntouch {c}",
    "x\0y",
    "!!",
    "~root",
    "%(touch {c})s",
    "{{{{ x }}}}",
    "{{% include 'x' %}}",
    "<<EOF",
    "RB_PY_0000",
    "\\",
    "'",
    '"',
]
ALPHABET = st.sampled_from(list("$`'\"\\;|&<>(){}[]*?~!#%^=+,.:/- \t\néA0_") + ["$(", "${", "\\n"])


def compile_text(tmp_path: Path, text: str) -> tuple[int, str]:
    spec = tmp_path / "h.yaml"
    spec.write_text(text, encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main([str(spec), "-o", str(tmp_path / "gen")])
    return code, err.getvalue()


def spec_with(value: str, field: str, dst: str = "runs/h/venv") -> str:
    q = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    q = q.replace("\0", "\\0")
    exclude = f'"{q}"' if field == "exclude" else '"*.pyc"'
    desc = f'"{q}"' if field == "description" else '"ok"'
    env = f'{{HOSTILE: "{q}"}}' if field == "env" else "{}"
    to = f'"here:{q}"' if field == "to" else f"here:{dst}"
    mod = f'"{q}"' if field == "imports" else "json"
    return (
        f"name: h\ndescription: {desc}\nhosts:\n  here: {{local: true}}\ntransfer:\n"
        f"  from: here:.venv\n  to: {to}\n  exclude: [{exclude}]\nenv: {env}\n"
        f"checks:\n  - imports: [{mod}]\n"
    )


FIELDS = ["exclude", "description", "env", "to", "imports"]


def validates(tmp_path: Path, text: str) -> tuple[bool, str]:
    """Loader and models only (no lint): accepted, or the located error text."""
    spec = tmp_path / "v.yaml"
    spec.write_text(text, encoding="utf-8")
    try:
        validate.validate(loader.load(str(spec)))
    except SpecError as exc:
        return False, "\n".join(exc.lines())
    return True, ""


@pytest.mark.parametrize("template", NASTY)
def test_nasty_value_is_refused_with_a_location_or_compiles_clean(tmp_path, template):
    value = template.format(c=tmp_path / "CANARY")
    accepted = []
    for field in FIELDS:
        ok, err = validates(tmp_path, spec_with(value, field))
        if ok:
            accepted.append(field)
        else:
            assert err.startswith(str(tmp_path / "v.yaml") + ":"), err
            assert "Traceback" not in err
    # every field that took the value, at once: one compile (with shellcheck) and a dry run
    text = spec_with("*.pyc", "exclude")
    for field in accepted:
        text = merge(text, spec_with(value, field), field)
    code, err = compile_text(tmp_path, text)
    assert code == 0, err
    script = (tmp_path / "gen" / "h.sh").read_text()
    assert lint.shellcheck(script) == []
    r = subprocess.run(
        ["bash", str(tmp_path / "gen" / "h.sh"), "--dry-run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "CANARY").exists()


def merge(base: str, other: str, field: str) -> str:
    """Take `field`'s line from `other` into `base` (both made by spec_with)."""
    key = {
        "exclude": "  exclude:",
        "description": "description:",
        "env": "env:",
        "to": "  to:",
        "imports": "  - imports:",
    }[field]
    line = next(x for x in other.splitlines() if x.startswith(key))
    return "\n".join(line if x.startswith(key) else x for x in base.splitlines()) + "\n"


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    value=st.lists(ALPHABET, min_size=1, max_size=12).map("".join),
    field=st.sampled_from(["exclude", "description", "env", "to"]),
)
def test_generated_strings_never_break_out(tmp_path, value, field):
    code, err = compile_text(tmp_path, spec_with(value, field))
    assert code in (0, 2), err
    assert "Traceback" not in err
    if code == 0:
        r = subprocess.run(
            ["bash", str(tmp_path / "gen" / "h.sh"), "--dry-run"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr


EXEC_CASES = [
    "$(touch {c})",
    "`touch {c}`",
    "'; touch {c}; '",
    '"; touch {c}; "',
    "x y;touch {c}",
    "é漢字 $(touch {c}) *",
]


@pytest.mark.e2e
@pytest.mark.parametrize("template", EXEC_CASES)
def test_hostile_destination_and_values_are_inert_when_the_runbook_runs(
    payload_small, tmp_path, template
):
    canary = tmp_path / "CANARY"
    value = template.format(c=canary)
    dst = f"d/{value}/venv"
    q = lambda s: s.replace("\\", "\\\\").replace('"', '\\"')  # noqa: E731
    text = (
        f'name: h\ndescription: "{q(value)}"\nhosts:\n  here: {{local: true}}\n'
        f'transfer:\n  from: here:{payload_small.venv}\n  to: "here:{q(dst)}"\n'
        f'  exclude: ["{q(value)}", "*.pyc"]\n  jobs: 2\n'
        f'env: {{HOSTILE: "{q(value)}"}}\nchecks:\n  - imports: [rb_payload]\n'
    )
    code, err = compile_text(tmp_path, text)
    assert code == 0, err
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"))
    r = subprocess.run(
        ["bash", str(tmp_path / "gen" / "h.sh")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert not canary.exists(), "a command hidden in a spec value ran"
    moved = tmp_path / dst
    assert (moved / "bin" / "payload-hello").exists(), "the literal path is the destination"
    env_file = Path(f"{moved}.env.sh")
    out = subprocess.run(
        ["bash", "-c", 'source "$1"; printf "%s" "$HOSTILE"', "_", str(env_file)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == value and not canary.exists()
