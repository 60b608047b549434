"""The live plan on the lab's hosts (issue 36): `--plan` reaches src and dst read-only and says what
a run would change; `--apply PLAN` runs it, and refuses when either end moved since the plan."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.test_relay import build, snapshot, spec_text


def run(tmp_path: Path, script: Path, *args: str) -> subprocess.CompletedProcess:
    """A run in a directory of its own (runs/NAME/<UTC>-<pid>, as a user's)."""
    return subprocess.run(
        ["bash", str(script), *args], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )


def plan_dir(r: subprocess.CompletedProcess) -> Path:
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("plan: ")][-1]
    return Path(line.split()[1].rstrip(";,")).parent


def own_source(payload, tmp_path: Path) -> Path:
    src = tmp_path / "src"
    subprocess.run(["cp", "-a", str(payload.venv), str(src)], check=True)
    return src


def module(src: Path) -> Path:
    return next(src.glob("lib/python3*/site-packages/rb_payload/__init__.py"))


@pytest.mark.e2e
def test_plan_then_apply_a_first_move_then_a_rerun_with_one_file_changed(
    clean_lab, payload_small, tmp_path
):
    src = own_source(payload_small, tmp_path)
    parent = tmp_path / "dst"
    parent.mkdir()
    dst = parent / "venv"
    script = build(
        tmp_path,
        spec_text(
            clean_lab, src, dst, policy="replace", checks="checks:\n  - imports: [rb_payload]\n"
        ),
    )

    r = run(tmp_path, script, "--plan", "--markdown")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    out = r.stdout
    assert "hosts:       src, dst: reachable" in out
    assert "route:       relay through this machine" in out
    # compression: auto on the relay is measured, as preflight measures it (the plan said
    # `compression: ` with no choice nor reason, and planned none)
    assert "compression: " in out and "(auto, measured: link " in out
    assert "destination: does not exist yet" in out
    assert "to send:" in out and "the whole tree" in out and "enough room" in out
    assert "static:      passed" in out and "checks:      relocation (implied), imports" in out
    # read-only: nothing beside the destination (no lock, no staging), no kit left (conftest)
    assert list(parent.iterdir()) == []
    d = plan_dir(r)
    plan = json.loads((d / "plan.json").read_text())
    assert plan["changes"]["added"] > 10 and plan["changes"]["removed"] == 0
    assert plan["destination"]["exists"] is False and plan["blockers"] == []
    assert (d / "plan.md").read_text().startswith("# Live plan: relay")
    assert any(ln.endswith(" bin/python") for ln in (d / "changes.txt").read_text().splitlines())

    r = run(tmp_path, script, "--apply", str(d / "plan.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "the plan holds" in r.stderr
    assert (dst / "bin" / "payload-hello").exists()

    # a re-run: nothing to send; a plan holds no lock, so it waits for no run that holds one
    lock = tmp_path / "runs" / "relay" / ".run-lock"
    lock.mkdir()
    (lock / "holder").write_text(f"{os.getpid()} here\n")
    start = time.monotonic()
    r = run(tmp_path, script, "--plan")
    took = time.monotonic() - start
    assert r.returncode == 0, r.stderr[-3000:]
    assert "nothing to send: the destination already holds this exact tree" in r.stdout
    assert "waiting" not in r.stderr
    assert (
        "compression: not measured: dst holds an install (a re-run sends what changed); "
        in r.stdout
    )
    assert "static:      skipped: the source is the tree" in r.stdout
    assert (lock / "holder").exists()
    (lock / "holder").unlink()
    lock.rmdir()
    print(f"re-run plan, nothing to send: {took:.2f} s")

    # one file changed at the source: the plan shows exactly it
    with module(src).open("a") as f:
        f.write("# changed\n")
    r = run(tmp_path, script, "--plan")
    assert r.returncode == 0, r.stderr[-3000:]
    rel = str(module(src).relative_to(src))
    assert (plan_dir(r) / "changes.txt").read_text().splitlines() == [f">f.st...... {rel}"]
    assert "0 added (0 B), 1 changed (" in r.stdout
    # one sum, its two parts named as parts (issue 45: `14.9 KB, only the changes, and 14.9 KB
    # of bin/...` read as 29.8 KB)
    line = next(ln for ln in r.stdout.splitlines() if "to send:" in ln)
    assert ", in all: " in line and " of changes and " in line and "relocation rewrites" in line, (
        line
    )
    # the stream takes the plan's compression, whatever preflight measures now
    saved = plan_dir(r) / "plan.json"
    doc = json.loads(saved.read_text())
    doc["compression"] = "gzip"
    saved.write_text(json.dumps(doc))
    r = run(tmp_path, script, "--apply", str(saved))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "compression: gzip, as the plan chose" in r.stderr
    assert "relay, compression gzip, incremental" in r.stderr
    assert module(dst).read_text().endswith("# changed\n")


@pytest.mark.e2e
def test_apply_refuses_when_the_source_changed_since_the_plan(clean_lab, payload_small, tmp_path):
    src = own_source(payload_small, tmp_path)
    dst = tmp_path / "dst" / "venv"
    script = build(tmp_path, spec_text(clean_lab, src, dst, policy="replace"))
    assert run(tmp_path, script).returncode == 0
    r = run(tmp_path, script, "--plan")
    assert r.returncode == 0, r.stderr[-3000:]
    before = snapshot(dst.parent)
    (src / "lib" / "added-after-the-plan.txt").write_text("new\n")
    r = run(tmp_path, script, "--apply", str(plan_dir(r) / "plan.json"))
    assert r.returncode == 1, r.stderr[-3000:]
    assert (
        f"changed since the plan was made: the source src:{src}: 1 paths "
        "(lib/added-after-the-plan.txt (new))"
    ) in r.stderr
    assert "nothing was written at the destination" in r.stderr
    # what to do next is a new plan: going on --from a step would run what no plan showed
    assert "the plan no longer holds (above): make a new one, read it, and apply that" in r.stderr
    assert "--from" not in r.stderr
    assert snapshot(dst.parent) == before


@pytest.mark.e2e
def test_apply_refuses_when_the_destination_changed_since_the_plan(
    clean_lab, payload_small, tmp_path
):
    src = own_source(payload_small, tmp_path)
    dst = tmp_path / "dst" / "venv"
    script = build(tmp_path, spec_text(clean_lab, src, dst, policy="replace"))
    assert run(tmp_path, script).returncode == 0
    r = run(tmp_path, script, "--plan")
    assert "nothing to send" in r.stdout
    (dst / "bin" / "payload-hello").unlink()
    r = run(tmp_path, script, "--apply", str(plan_dir(r) / "plan.json"))
    assert r.returncode == 1, r.stderr[-3000:]
    assert f"the destination dst:{dst}: 1 paths (bin/payload-hello (gone))" in r.stderr
    assert not (dst / "bin" / "payload-hello").exists()


@pytest.mark.e2e
def test_plan_says_the_destination_has_no_room(clean_lab, payload_small, tmpfs_factory, tmp_path):
    disk = tmpfs_factory(64)  # 64 KiB: less than the tree takes (a 4 KiB block a file)
    src = own_source(payload_small, tmp_path)
    dst = Path(disk.path) / "venv"
    script = build(tmp_path, spec_text(clean_lab, src, dst))
    r = run(tmp_path, script, "--plan")
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    assert "NOT ENOUGH ROOM" in r.stdout
    assert f"BLOCKED:     not enough room at {disk.path}:" in r.stdout
    assert os.listdir(disk.path) in ([], ["lost+found"])
    plan = json.loads((plan_dir(r) / "plan.json").read_text())
    assert plan["disk"]["need"] > plan["disk"]["free"]
    # a blocked plan is not applied
    r = run(tmp_path, script, "--apply", str(plan_dir(r) / "plan.json"))
    assert r.returncode == 1 and "the plan is blocked: not enough room" in r.stderr


@pytest.mark.e2e
def test_plan_names_every_host_it_cannot_reach_at_once(clean_lab, payload_small, tmp_path):
    dst = tmp_path / "dst" / "venv"
    script = build(tmp_path, spec_text(clean_lab, payload_small.venv, dst))
    clean_lab.stop_sshd("src")
    clean_lab.stop_sshd("dst")
    r = run(tmp_path, script, "--plan")
    assert r.returncode == 1
    assert "cannot reach src, dst (each said why above); nothing was planned" in r.stderr
    # ssh's own words once for each host, with its name (the early connection's, rb::connected)
    for host in ("src", "dst"):
        said = [ln for ln in r.stderr.splitlines() if "Connection refused" in ln]
        assert len([ln for ln in said if f"] {host}: ssh: connect to host" in ln]) == 1, r.stderr


@pytest.mark.e2e
def test_plan_connects_while_the_run_directory_is_checked_and_closes_on_refusal(
    clean_lab, payload_small, tmp_path
):
    """A plan opens each host's ssh connection as it starts (rb::connect_early), once the kit is
    written here and beside the run directory's check, and prepares the host through it; when
    that check refuses, nothing was run on a host but `true`, and every connection is closed."""
    dst = tmp_path / "dst" / "venv"
    script = build(tmp_path, spec_text(clean_lab, payload_small.venv, dst))
    wrap = tmp_path / "bin"
    wrap.mkdir()
    log = tmp_path / "ssh.log"
    (wrap / "ssh").write_text(f'#!/bin/bash\nprintf "%s\\n" "$*" >>{log}\nexec /usr/bin/ssh "$@"\n')
    (wrap / "ssh").chmod(0o755)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    env = dict(os.environ, PATH=f"{wrap}:{os.environ['PATH']}", RB_RUN_DIR=str(shared / "run"))
    r = subprocess.run(
        ["bash", str(script), "--plan"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 2 and "refusing the run directory" in r.stderr, r.stderr[-2000:]
    calls = log.read_text().splitlines()
    for host in ("src", "dst"):
        addr = clean_lab.host(host).addr
        mine = [c for c in calls if f"root@{addr}" in c]
        # what ssh reads for the host judged first (ssh -G, which connects nowhere: issue 44)
        assert mine and mine[0].endswith(f"-G -- root@{addr}"), mine
        mine = [c for c in mine if not c.endswith(f"-G -- root@{addr}")]
        # the early connection ran `true` only (where it got that far before the refusal: on a
        # loaded machine the refusal may come first, and the connection is stopped before ssh
        # starts), then every connection was closed
        assert all("-O exit" in c or c.endswith(f"-- root@{addr} 'cd' '/' && 'true'") for c in mine)
        assert mine and "-O exit" in mine[-1], mine
    assert not list(shared.iterdir())

    # reachable and the run directory private: the plan goes through the early connections
    log.write_text("")
    env.pop("RB_RUN_DIR")
    r = subprocess.run(
        ["bash", str(script), "--plan"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "hosts:       src, dst: reachable" in r.stdout
    assert "ControlSocket" not in r.stderr


@pytest.mark.e2e
def test_a_plan_interrupted_while_it_connects_leaves_nothing_running(
    clean_lab, payload_small, tmp_path
):
    """Ctrl-C (SIGINT to the process group) while the plan's early connections are being made
    (ssh slowed by a wrapper): exit 130 within 5 s, no ssh of the run left running, nothing left
    on a host (the lab's leftover check)."""
    dst = tmp_path / "dst" / "venv"
    script = build(tmp_path, spec_text(clean_lab, payload_small.venv, dst))
    wrap = tmp_path / "bin"
    wrap.mkdir()
    (wrap / "ssh").write_text('#!/bin/bash\nsleep 3\nexec /usr/bin/ssh "$@"\n')
    (wrap / "ssh").chmod(0o755)
    env = dict(os.environ, PATH=f"{wrap}:{os.environ['PATH']}")
    p = subprocess.Popen(
        ["env", "--default-signal=HUP,INT,QUIT,TERM", "bash", str(script), "--plan"],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )
    time.sleep(1.0)
    assert p.poll() is None
    os.killpg(p.pid, signal.SIGINT)
    start = time.monotonic()
    try:
        _out, err = p.communicate(timeout=30)
    finally:
        left = subprocess.run(
            ["pgrep", "-f", f"ssh.*{clean_lab.host('src').addr}"], capture_output=True, text=True
        ).stdout.split()
    assert time.monotonic() - start < 5, err[-2000:]
    assert p.returncode == 130, err[-2000:]
    assert "interrupted" in err
    assert left == [], subprocess.run(
        ["ps", "-o", "pid,args", "-p", ",".join(left)], capture_output=True, text=True
    ).stdout
