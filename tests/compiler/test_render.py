"""The render guard: no value reaches the script unless a quoting filter marked it."""

from __future__ import annotations

import subprocess

import jinja2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler import render


def _render(source: str, **values) -> str:
    return render.environment().from_string(source).render(**values)


def test_unquoted_value_is_refused():
    with pytest.raises(render.RenderError, match="unquoted value"):
        _render("echo {{ x }}", x="$(reboot)")


def test_plain_filter_output_is_refused_because_marking_must_come_last():
    with pytest.raises(render.RenderError):
        _render("echo {{ x|sh|upper }}", x="a b")


def test_undefined_is_an_error():
    with pytest.raises(jinja2.UndefinedError):
        _render("echo {{ missing|sh }}")


@pytest.mark.parametrize("bad", ["a-b", "1x", "x y", "$(x)", ""])
def test_ident_refuses_non_identifiers(bad):
    with pytest.raises(render.RenderError):
        render.ident(bad)


def test_comment_refuses_newlines():
    with pytest.raises(render.RenderError):
        render.comment("one\nrm -rf /")


def test_body_takes_only_safe_text():
    with pytest.raises(render.RenderError):
        render.body("echo hi")
    assert render.body(render.Safe("x")) == "x"


@settings(max_examples=120, deadline=None)
@given(
    st.text(
        alphabet=st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=60
    )
)
def test_sh_quoted_words_come_back_unchanged_through_bash(value):
    script = "printf '%s' " + render.sh(value)
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True)
    assert out.stdout.decode("utf-8", "surrogateescape") == value


def test_sh_refuses_nul_and_non_strings():
    with pytest.raises(render.RenderError):
        render.sh("a\0b")
    with pytest.raises(render.RenderError):
        render.sh(None)
    with pytest.raises(render.RenderError):
        render.sh(True)


def test_tidy_keeps_heredoc_bodies_byte_for_byte():
    text = "a  \n\n\n\ncat <<'RB_PY_X'\nx = 1   \n\n\n\ny = 2\nRB_PY_X\n\n\nb\n"
    assert render.tidy(text) == "a\n\ncat <<'RB_PY_X'\nx = 1   \n\n\n\ny = 2\nRB_PY_X\n\nb\n"


def test_lint_cache_remembers_only_clean_scripts(tmp_path, monkeypatch):
    from compiler import lint

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    clean = "#!/usr/bin/env bash\necho 'hi'\n"
    dirty = "#!/usr/bin/env bash\necho $1\n"
    assert lint.shellcheck(clean) == []
    assert len(list((tmp_path / "runbook-compiler" / "shellcheck").iterdir())) == 1
    assert lint.shellcheck(dirty) != []
    assert lint.shellcheck(dirty) != [], "findings are never cached away"
    assert len(list((tmp_path / "runbook-compiler" / "shellcheck").iterdir())) == 1


@pytest.mark.parametrize("word", ["=", "=x", "a,b", "gw:2200,b@h"])
def test_array_words_shellcheck_would_misread_are_quoted_and_come_back_unchanged(word, tmp_path):
    """`=` at the start of an array word (SC2191) and commas (SC2054) lint-failed whole specs
    (exclude: ["="], a multi-hop jump:); they are single-quoted, and bash reads them back as is."""
    script = tmp_path / "a.sh"
    script.write_text(
        f"#!/usr/bin/env bash\na=({render.shwords(['--exclude', word])})\n"
        'printf "%s\\n" "${a[@]}"\n'
    )
    from compiler import lint

    r = subprocess.run([lint.shellcheck_binary(), str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True).stdout
    assert out == f"--exclude\n{word}\n"


def test_the_relays_pipe_between_its_two_ssh_clients_is_widened(tmp_path):
    """rb::wide_pipe, run first in the relay's sending stage: the pipe on its stdout (to the
    destination's ssh) holds 1 MiB after it (64 KiB made the two ssh clients take turns); where
    stdout is not a pipe it changes nothing and still succeeds."""
    import sys

    from compiler import kit

    runtime = tmp_path / "runtime.sh"
    runtime.write_text(kit.runtime_text())
    # what the runbook's state sets before the runtime runs (rbrules.launch's flags)
    head = f"source {runtime}; RB_LOCAL_PY={sys.executable}; RB_PY_FLAGS=(-I -S -B); "
    size = subprocess.run(
        [
            "bash",
            "-c",
            head + f"rb::wide_pipe | {sys.executable} -c "
            "'import fcntl; print(fcntl.fcntl(0, 1032))'",
        ],  # F_GETPIPE_SZ
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert int(size) == 1 << 20
    subprocess.run(["bash", "-c", head + f"rb::wide_pipe >{tmp_path / 'file'}"], check=True)
    assert (tmp_path / "file").read_bytes() == b""


def test_a_stage_ended_by_a_signal_is_handled_as_the_signal(tmp_path):
    """A pipeline stage or command that ended by SIGINT/SIGTERM/SIGHUP (130/143/129) while this
    shell's own trap has not run yet (the signal landed as the pipeline started) ends the run as
    that signal would: `interrupted ... (SIGINT)`, exit 130, not `FAILED`/exit 1. Any other
    status is a failure as before."""
    import sys

    from compiler import kit

    runtime = tmp_path / "runtime.sh"
    runtime.write_text(kit.runtime_text())
    head = (
        f"source {runtime}; RB_LOCAL_PY={sys.executable}; RB_STEP=transfer; "
        'rb::finish() { echo "finish $1" >&2; }; '
    )
    cases = [
        ("rb::pipe_failed stream send receive 0 130", 130, "(SIGINT)"),
        ("rb::pipe_failed stream send receive 143 0", 130, "(SIGTERM)"),
        ("(exit 129) || rb::on_err 7", 130, "(SIGHUP)"),
        ("rb::pipe_failed stream send receive 0 2", 1, "FAILED in step transfer"),
    ]
    for command, rc, said in cases:
        r = subprocess.run(
            ["bash", "-c", head + command], capture_output=True, text=True, timeout=30
        )
        assert r.returncode == rc, (command, r.stderr)
        assert said in r.stderr, (command, r.stderr)
        if rc == 130:
            assert "interrupted in step transfer" in r.stderr and "finish interrupted" in r.stderr
            assert "FAILED" not in r.stderr, r.stderr


def test_a_plans_hosts_are_let_go_while_it_composes(tmp_path):
    """rb::close_start (once a plan has its hosts' records): the kits' removal and the ssh
    masters' exit run in the background while the plan is composed; rb::close_wait (rb::plan_end)
    waits for them and then says what they left, after the compose's own output."""
    import sys

    from compiler import kit

    runtime = tmp_path / "runtime.sh"
    runtime.write_text(kit.runtime_text())
    work = tmp_path / "work"
    work.mkdir()
    head = (
        f"source {runtime}; RB_LOCAL_PY={sys.executable}; RB_WORK={work}; RB_CLOSING=''; "
        "RB_BG_PIDS=(); RB_NAME=t; "
        "rb::close_hosts() { sleep 1; RB_STEP=cleanup rb::log 'left on h1: K'; "
        "[[ -z \"${RB_WORK}\" ]] && echo 'work unset' >&2; }; "
    )
    command = (
        "t0=${EPOCHREALTIME}; rb::close_start; sleep 1; echo composed >&2; "
        'rb::close_wait; echo "closing ${RB_CLOSING} waited; ${t0} ${EPOCHREALTIME}" >&2'
    )
    r = subprocess.run(
        ["bash", "-c", head + command], capture_output=True, text=True, timeout=30, check=True
    )
    said = r.stderr.splitlines()
    assert said[0] == "composed", r.stderr
    assert said[1].endswith("[cleanup] left on h1: K") and said[2] == "work unset", r.stderr
    assert said[3].startswith("closing waited waited; ")
    t0, t1 = (float(x) for x in said[3].split("; ")[1].split())
    assert t1 - t0 < 1.7  # 1 s beside 1 s, not after it
    # one a signal ended before it was through is done again by the wait (or by rb::cleanup)
    head = (
        f"source {runtime}; RB_WORK={work}; RB_CLOSING=''; RB_NAME=t; "
        'rb::close_hosts() { if [[ -n "${RB_WORK}" ]]; then echo again >&2; '
        'else kill -TERM "${BASHPID}"; fi; }; '
    )
    r = subprocess.run(
        ["bash", "-c", head + "rb::close_start; rb::close_wait; echo end >&2"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert r.stderr.splitlines() == ["again", "end"], r.stderr


def test_a_render_error_is_a_compiler_bug_with_the_lints_exit_code(monkeypatch, tmp_path, capsys):
    """One error hierarchy (issue 46): a template that fails to render is a bug of the compiler,
    as a failed lint is: the same exit code, its words, no traceback, nothing written."""
    from compiler import cli, errors

    def refuse(*_args, **_kwargs):
        raise render.RenderError("unquoted value 'x' in a template")

    monkeypatch.setattr(render, "render", refuse)
    code = cli.main(["specs/local.yaml", "-o", str(tmp_path)])
    assert code == errors.LintError.exit_code == errors.RenderError.exit_code == 3
    assert "unquoted value 'x' in a template" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
