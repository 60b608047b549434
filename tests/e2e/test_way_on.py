"""Issue 45: every failure leaves a way on, and the terminal says only what is true. Each test
plants one fault (a disk that fills mid-stream, a Ctrl-C, a killed sshd, a step that cannot
apply) and asserts what the operator reads: the cause in words, what was kept, and the one
command that goes on, on the terminal and in report.json alike."""

from __future__ import annotations

import pytest

from tests.e2e.test_local_runbook import compile_and_run

pytestmark = pytest.mark.e2e


# -- a clean local run into `.venv` on a spec that declares a GPU this machine lacks ------------

@pytest.fixture(scope="module")
def gpu_run(payload_small, tmp_path_factory):
    """One local run into `d/.venv`, `gpu: {model: H100}` declared, the devices check allowed to
    skip (this machine has no GPU): (its folder, the finished process)."""
    tmp_path = tmp_path_factory.mktemp("gpu_run")
    r = compile_and_run(tmp_path, payload_small.venv, tmp_path / "d" / ".venv", policy="replace",
                        checks="  - imports: [rb_payload]\n  - devices: {allow_skip: true}\n",
                        extra="gpu: {model: H100}\n")
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp_path, r


def test_no_killed_line_after_a_run(gpu_run):
    """`line 1: NNNN Killed rb::witness "${fifo}"` after every run read like a crash."""
    _, r = gpu_run
    assert "Killed" not in r.stderr and "rb::witness" not in r.stderr, r.stderr[-1500:]


def test_the_staging_of_a_hidden_venv_has_one_dot(gpu_run):
    _, r = gpu_run
    assert "/d/.venv.rb-staging" in r.stderr, r.stderr[-3000:]
    assert "..venv" not in r.stderr


def test_report_html_headline_says_gpu_not_proven_as_the_terminal_does(gpu_run):
    tmp_path, r = gpu_run
    assert "GPU NOT PROVEN" in r.stderr
    html = (tmp_path / "run" / "report.html").read_text()
    head = html[html.index("<h1>"):html.index("</h1>")]
    assert "GPU NOT PROVEN" in head, head
    assert "GPU NOT PROVEN: the spec declares gpu:" in html
