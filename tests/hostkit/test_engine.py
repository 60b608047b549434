"""The install engine (hostkit/rbkit/engine.py) on real trees, without hosts: the steps a
single-host runbook's destination and a fan-out node both run. What used to go wrong is tested
against the engine's own entry points: a node that installed a tree whose post-swap proof fails
(it kept it), a digest re-run that linked a corrupted file (M7), a staging that never passed
verify being swapped in (H2), a venv whose interpreter cannot run here being installed (M3).

Over 600 lines on purpose: one file for the one engine that both install modes run, its sections
(steps, fan-out nodes, the choices document, locks) sharing the trees and the bundle they build."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rbkit import (
    channel,
    engine,
    fanreports,
    filehash,
    hostfs,
    manifest,
    manifestfile,
    preflight,
    proof,
    receive,
    relocate,
    report,
    runner,
    sendside,
    serve,
    staging,
    statwalk,
    stream,
)
from rbkit.lock import Lock, Taken, lock_path
from rbrules import cpus, paths
from rbrules.choices import Choices, ChoicesError

from compiler import plan
from compiler.readback import read_settings
from tests.hostkit.test_fanout_delta import (
    PKG,
    bundle,
    change_one_file,
    first,  # noqa: F401
    node,
)
from tests.hostkit.test_kit import make_tree

KIT = Path(__file__).resolve().parents[2] / "hostkit"
ROOT = KIT.parent


def test_the_staging_is_beside_the_destination():
    assert runner.staging_path("/opt/x/venv") == "/opt/x/.venv.rb-staging"
    assert runner.staging_path("/a/b/venv/") == "/a/b/.venv.rb-staging"


# -- fan-out nodes: the same steps, the post-swap proof, the digest re-run ----------------------


def test_a_node_proves_the_install_after_the_swap_and_rolls_back_when_it_fails(tmp_path):
    """bin/pip that runs from the wrong place: the single-host runbook always failed the swap
    for it; a fan-out node used to install it and pass."""
    src = tmp_path / "src" / "venv"
    make_tree(src, python=True)
    dest = tmp_path / "node" / "venv"
    dest.parent.mkdir()
    rc, doc = node(bundle(tmp_path / "b1", src, manifest.build(str(src), [], "sha256")), dest)
    assert rc == 0 and doc["ok"], doc
    good = (dest / PKG / "__init__.py").read_text()
    pip = src / "bin" / "pip"
    pip.write_text(
        "#!/bin/sh\necho 'pip 24.0 from /somewhere/else/site-packages/pip (python 3.11)'\n"
    )
    pip.chmod(0o755)
    change_one_file(src)
    rc, doc = node(bundle(tmp_path / "b2", src, manifest.build(str(src), [], "sha256")), dest)
    assert rc == 1 and not doc["ok"]
    swap = next(s for s in doc["steps"] if s["id"] == "swap")
    assert not swap["ok"] and "bin/pip runs from the wrong place" in swap["error"][0], doc
    assert [s["id"] for s in doc["steps"]][-1] == "rollback"
    assert doc["rolled_back"]["kept_current_as"] is None  # replace: the failed one goes
    assert (dest / PKG / "__init__.py").read_text() == good  # what was there is back
    assert not (dest / "bin" / "pip").exists()
    assert not list(dest.parent.glob("venv.rb-backup.*"))


def test_a_node_proves_the_install_after_the_swap(first_install):
    src, m1, dest, tmp_path = first_install
    pip = src / "bin" / "pip"  # prints the path it runs from, as pip does
    pip.write_text('#!/bin/sh\necho "pip 24.0 from $(cd "$(dirname "$0")/.." && pwd)/lib"\n')
    pip.chmod(0o755)
    rc, doc = node(bundle(tmp_path / "b2", src, manifest.build(str(src), [], "sha256")), dest)
    assert rc == 0 and doc["ok"], doc
    assert [s["id"] for s in doc["steps"]] == [
        "stage",
        "receive",
        "verify",
        "relocate",
        "prove",
        "swap",
        "exports",
    ]


def test_a_venv_whose_interpreter_is_missing_here_is_refused_before_the_swap(first_install):
    src, m1, dest, tmp_path = first_install
    before = (dest / PKG / "__init__.py").read_text()
    (src / "bin" / "python").unlink()
    (src / "bin" / "python").symlink_to("/nonexistent/rb-base/bin/python3.11")
    change_one_file(src)
    rc, doc = node(bundle(tmp_path / "b2", src, manifest.build(str(src), [], "sha256")), dest)
    assert rc == 1
    prove = next(s for s in doc["steps"] if s["id"] == "prove")
    assert not prove["ok"] and "does not exist on this host" in prove["error"][0], doc
    assert "swap" not in [s["id"] for s in doc["steps"]]
    assert (dest / PKG / "__init__.py").read_text() == before  # the install is untouched


@pytest.fixture
def first_install(first, tmp_path):  # noqa: F811 (the fixture)
    """test_fanout_delta's first node install, and the test's folder."""
    return (*first, tmp_path)


def node_digest(d: Path, dest: Path) -> tuple[int, dict]:
    env = dict(os.environ, PYTHONPATH=str(d / "kit"), PYTHONDONTWRITEBYTECODE="1")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "rbkit.fanout",
            "node",
            "--dir",
            str(d),
            "--dest",
            str(dest),
            "--old",
            "/old/venv",
            "--choices",
            Choices(on_existing="replace", jobs=2, timeout=60, rerun="digest").to_json(),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    reports = fanreports.parse_reports(p.stdout.splitlines())
    assert len(reports) == 1, p.stdout + p.stderr
    return p.returncode, next(iter(reports.values()))


@pytest.mark.parametrize("source_changed", [False, True])
def test_a_digest_rerun_never_links_a_file_that_failed_its_digest(first_install, source_changed):
    """M7: the file is corrupted on the node with its size and mtime kept (what only a digest
    sees). The re-run's bundle carries what changed at the source only; the node must not link
    the corrupted file into the new install (it used to, and verify passed it as linked)."""
    src, m1, dest, tmp_path = first_install
    data = dest / PKG / "data.bin"
    st = data.stat()
    corrupt = bytearray(data.read_bytes())
    corrupt[100] ^= 0xFF
    data.write_bytes(bytes(corrupt))
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    if source_changed:
        change_one_file(src)
    m2 = manifest.build(str(src), [], "sha256", jobs=2, reuse=m1)
    rc, doc = node_digest(bundle(tmp_path / "b2", src, m2, base=m1), dest)
    assert rc == 3 and "data.bin" in doc["needs_full"], doc  # the bundle lacks it: send all
    assert data.read_bytes() == bytes(corrupt)  # nothing installed yet
    rc, doc = node_digest(bundle(tmp_path / "b3", src, m2), dest)  # the whole bundle
    assert rc == 0 and doc["ok"], doc
    assert data.read_bytes() == (src / PKG / "data.bin").read_bytes()


# -- the engine's stamp and lock (H2) ------------------------------------------------------------


def engine_run(
    dest: Path, *steps: str, manifest_path: Path, holder="test", wait=0.0, extra=()
) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(KIT), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "rbkit",
            "engine",
            "run",
            *steps,
            "--dest",
            str(dest),
            "--manifest",
            str(manifest_path),
            "--choices",
            Choices(on_existing="replace").to_json(),
            "--old",
            "/old/venv",
            "--holder",
            holder,
            "--lock-wait",
            str(wait),
            *extra,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def answers(out: str) -> list[dict]:
    return [
        json.loads(line.split("\t", 1)[1])
        for line in out.splitlines()
        if line.startswith("event\t")
    ]


def test_swap_and_relocate_refuse_a_staging_this_run_did_not_verify(tmp_path):
    src = tmp_path / "src" / "venv"
    make_tree(src, python=True)
    m = tmp_path / "m.jsonl"
    with open(m, "w", encoding="utf-8") as f:
        manifestfile.dump(manifest.build(str(src), [], "sha256"), f)
    dest = tmp_path / "d" / "venv"
    dest.mkdir(parents=True)
    (dest / "old-install").write_text("the working install\n")
    staging = Path(runner.staging_path(str(dest)))
    subprocess.run(["cp", "-a", str(src), str(staging)], check=True)
    (next(staging.rglob("data.bin"))).write_bytes(b"truncated")  # a copy that fails verify
    for steps in (["swap"], ["relocate", "prove", "swap"], ["prove", "swap"]):
        r = engine_run(dest, *steps, manifest_path=m)
        assert r.returncode == 1, r.stdout + r.stderr
        failed = [e for e in answers(r.stdout) if e["status"] == "failed"]
        assert failed and "was not verified in this run" in failed[0]["detail"], r.stdout
    r = engine_run(dest, "verify", "relocate", "prove", "swap", manifest_path=m)
    assert r.returncode == 1 and "differs: " in r.stderr
    assert (dest / "old-install").read_text() == "the working install\n"
    assert not (tmp_path / "d" / ".venv.rb-lock").exists()  # let go at the end


def test_a_staging_replaced_after_verify_is_refused(tmp_path):
    src = tmp_path / "src" / "venv"
    make_tree(src, python=True)
    mf = manifest.build(str(src), [], "sha256")
    dest = tmp_path / "d" / "venv"
    ctx = runner.Context(
        str(dest),
        Choices(on_existing="replace"),
        old=str(src),
        manifest=str(tmp_path / "m"),
        state=runner.make_state(str(tmp_path)),
    )
    with open(ctx.manifest, "w", encoding="utf-8") as f:
        manifestfile.dump(mf, f)
    ctx.locked = True
    assert runner.run(ctx, "stage", staging.stage)["status"] == "ok"
    subprocess.run(["cp", "-a", f"{src}/.", ctx.staging], check=True)
    assert runner.run(ctx, "verify", proof.verify)["status"] == "ok"
    os.rename(ctx.staging, ctx.staging + ".moved")  # another run's staging now
    subprocess.run(["cp", "-a", ctx.staging + ".moved", ctx.staging], check=True)
    event = runner.run(ctx, "relocate", engine.relocate_staging)
    assert (
        event["status"] == "failed"
        and "not the staging directory this run verified" in event["detail"]
    )


def test_a_second_run_is_refused_naming_the_holder(tmp_path):
    dest = tmp_path / "d" / "venv"
    first = Lock(str(dest), "runbook first on head (pid 4242)")  # noqa: F811
    first.acquire()
    try:
        with pytest.raises(Taken, match=r"locked by another run: runbook first on head"):
            Lock(str(dest), "runbook second").acquire()
        m = tmp_path / "m.jsonl"
        m.write_text("")
        r = engine_run(dest, "exports", manifest_path=m)
        assert r.returncode == 1 and "runbook first on head (pid 4242)" in r.stdout
    finally:
        first.release()
    assert not Path(lock_path(str(dest))).exists()
    assert not dest.parent.exists()  # the parent the lock made is gone again


def test_a_planted_lock_file_is_never_followed(tmp_path):
    dest = tmp_path / "venv"
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    Path(lock_path(str(dest))).symlink_to(victim)
    with pytest.raises(Taken, match="is a symlink"):
        Lock(str(dest), "x").acquire()
    Path(lock_path(str(dest))).unlink()
    os.link(victim, lock_path(str(dest)))
    with pytest.raises(Taken, match="not a lock file"):
        Lock(str(dest), "x").acquire()
    assert victim.read_text() == "precious\n"


def test_the_lock_is_the_kernels_and_goes_with_its_holder(tmp_path):
    dest = tmp_path / "venv"
    held = Lock(str(dest), "gone")
    held.acquire()
    os.close(held.fd)  # the process ends: its flock goes with it
    again = Lock(str(dest), "next")
    again.acquire()
    with open(lock_path(str(dest)), "rb") as f:
        with pytest.raises(BlockingIOError):
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    again.release()


# -- the source: a tree the excludes empty is refused (M3) --------------------------------------


@pytest.mark.parametrize(
    "excludes, why",
    [
        (["*"], "leaves out pyvenv.cfg"),
        (["bin"], "leaves out bin"),
        (["pyvenv.cfg"], "leaves out pyvenv.cfg"),
    ],
)
def test_a_source_the_excludes_empty_or_unvenv_is_refused(tmp_path, excludes, why):
    src = tmp_path / "venv"
    make_tree(src, python=True)
    with pytest.raises(stream.SourceRefused, match="is not a venv after the excludes") as got:
        stream.scan_source(str(src), excludes)
    assert why in str(got.value)


def test_the_engine_answers_in_lines_a_runbook_reads(tmp_path):
    src = tmp_path / "venv"
    make_tree(src, python=True)
    answer = channel.Answer(open(tmp_path / "out", "w", encoding="utf-8"))
    ctx = runner.Context(str(src), emit=answer.event)
    runner.run(ctx, "scan", lambda c: runner.Result(*stream.scan_source(str(src), [])))
    answer.done()
    answer.out.close()
    lines = (tmp_path / "out").read_text().splitlines()
    assert lines[-1].startswith("done\tok\t")
    assert "set\tfiles\t5" in lines
    event = json.loads(next(ln for ln in lines if ln.startswith("event\t")).split("\t", 1)[1])
    assert set(event) == {"step", "status", "detail", "facts", "duration_s"}


@pytest.mark.parametrize("compression", ["none", "gzip", "zstd"])
def test_the_stream_goes_through_the_one_compression_table(tmp_path, compression):
    """send (the source's end, here with a --remote command line taking the place of ssh: words
    after --remote are never the engine's, `--` included) and receive (into this run's staging)."""
    src = tmp_path / "venv"
    make_tree(src, python=True)
    names = tmp_path / "names"
    with open(names, "wb") as f:
        manifestfile.names(manifest.build(str(src), [], "none"), f)
    env = dict(os.environ, PYTHONPATH=str(KIT), PYTHONDONTWRITEBYTECODE="1")
    stream = tmp_path / "stream"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "rbkit",
            "engine",
            "send",
            str(src),
            str(names),
            "--compression",
            compression,
            "--remote",
            "sh",
            "-c",
            'cat >"$2"',
            "--",
            "rb",
            str(stream),
        ],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    dest = tmp_path / "d" / "venv"
    ctx = runner.Context(str(dest), compression=compression, state=runner.make_state(str(tmp_path)))
    ctx.locked = True
    assert runner.run(ctx, "stage", staging.stage)["status"] == "ok"
    event = runner.run(ctx, "receive", receive.receive, producer=["cat", str(stream)])
    assert event["status"] == "ok", event
    assert (Path(ctx.staging) / PKG / "data.bin").read_bytes() == (
        src / PKG / "data.bin"
    ).read_bytes()
    # what came packed: the decompressor's bytes read (its own start reads a few KB more)
    packed = stream.stat().st_size
    if compression == "none":
        assert "packed_bytes" not in event["facts"]
    else:
        assert packed <= event["facts"]["packed_bytes"] < packed + (64 << 10), (packed, event)
        words = report.moved_words(dict(event["facts"], bytes=10 << 20, files=5, mb_s=3))
        ratio = event["facts"]["stream_bytes"] / event["facts"]["packed_bytes"]
        assert words.endswith(" on the wire (%.2fx)" % ratio), words


def test_what_a_step_moved_is_said_alike_in_the_terminal_and_the_page():
    facts = {"bytes": 7_200_000_000, "files": 49421, "mb_s": 240}
    assert report.moved_words(facts) == "7.2 GB in 49421 files, 240 MB/s"
    facts.update(stream_bytes=7_300_000_000, packed_bytes=3_200_000_000)
    words = report.moved_words(facts)
    assert words == "7.2 GB in 49421 files, 240 MB/s, 3.2 GB on the wire (2.28x)"
    assert report.moved_words({"files": 3}) == ""
    doc = {
        "steps": [
            {
                "id": "transfer",
                "host": "a",
                "status": "ok",
                "duration_s": 30.0,
                "detail": "relay, compression zstd-3-T3",
                "facts": facts,
            }
        ],
        "checks": {"pass": 0, "fail": 0, "skip": 0},
        "outcome": "ok",
    }
    assert words + "; relay, compression zstd-3-T3" in report.table(doc)
    from rbview import page
    from rbview.svg import esc

    assert esc(words + "; relay, compression zstd-3-T3") in page.page(doc, [], None)


def test_a_nodes_report_carries_its_checks(first_install):
    src, m1, dest, tmp_path = first_install
    config = {
        "schema": 1,
        "host": "n",
        "venv": None,
        "gpu": None,
        "cuda": None,
        "checks": [{"id": "python", "type": "python", "params": {}, "allow_skip": False}],
    }
    d = bundle(tmp_path / "b2", src, m1)
    env = dict(os.environ, PYTHONPATH=str(d / "kit"), PYTHONDONTWRITEBYTECODE="1")
    (d / "kit" / "rbprobes").symlink_to(KIT / "rbprobes")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "rbkit.fanout",
            "node",
            "--dir",
            str(d),
            "--dest",
            str(tmp_path / "n2" / "venv"),
            "--old",
            "/old/venv",
            "--choices",
            Choices(on_existing="replace", jobs=2, timeout=60).to_json(),
            "--probe-config",
            json.dumps(config),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    doc = next(iter(fanreports.parse_reports(p.stdout.splitlines()).values()))
    assert [s["id"] for s in doc["steps"]][-1] == "probe"
    assert doc["probe"] and doc["probe"]["checks"][0]["id"] == "python", doc


def test_prove_refuses_an_interpreter_of_another_python_version(first_install):
    """bin/python runs here, but it is not the Python the venv was made with: its packages
    (lib/pythonX.Y) would not be seen; refused before the swap."""
    src, m1, dest, tmp_path = first_install
    cfg = src / "pyvenv.cfg"
    cfg.write_text(
        cfg.read_text().replace(f"version = {sys.version.split()[0]}", "version = 2.7.18")
    )
    before = (dest / PKG / "__init__.py").read_text()
    change_one_file(src)
    rc, doc = node(bundle(tmp_path / "b2", src, manifest.build(str(src), [], "sha256")), dest)
    prove = next(s for s in doc["steps"] if s["id"] == "prove")
    assert rc == 1 and not prove["ok"] and "the venv was made with 2.7.18" in prove["error"][0]
    assert (dest / PKG / "__init__.py").read_text() == before


SLOW_SERVER = r"""
import sys, time
from rbkit import runner, serve
serve.PING_S = 0.1
def slow(ctx):
    time.sleep(0.6)
    return runner.Result("slept")
serve.REQUESTS["verify"] = (slow, {})
sys.exit(serve.main(sys.argv[1:]))
"""


def test_the_engine_pings_while_a_step_works_and_answers_one_request_at_a_time(tmp_path):
    """The runbook reads each answer with a bound between two lines (a dead link must not hang
    it): a long step still says it is alive. The lock is held from the first answer to the end
    of stdin, and let go then."""
    dest = tmp_path / "d" / "venv"
    env = dict(os.environ, PYTHONPATH=str(KIT), PYTHONDONTWRITEBYTECODE="1")
    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SLOW_SERVER,
            "serve",
            "--dest",
            str(dest),
            "--choices",
            "{}",
            "--holder",
            "test",
        ],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    first = p.stdout.readline().decode()  # noqa: F811
    while not first.startswith("done"):
        first = p.stdout.readline().decode()
    assert first.startswith("done\tok\tholding ") and Path(lock_path(str(dest))).exists()
    p.stdin.write(b"verify\0\0")
    p.stdin.flush()
    lines = []
    while not lines or not lines[-1].startswith("done"):
        lines.append(p.stdout.readline().decode())
    assert lines[-1] == "done\tok\tslept\n"
    assert sum(ln == "ping\n" for ln in lines) >= 3, lines
    p.stdin.close()
    p.wait(timeout=30)
    assert p.returncode == 0 and not Path(lock_path(str(dest))).exists()


# -- digests from the stream (#17): verify reads no file that the stream's digest proves ---------


def received_staging(tmp_path: Path, cut=None, flip=None):
    """A source tree, its manifest, its tar stream (`cut`/`flip`: what happened to the stream on
    the way: bytes(stream) -> bytes), and an engine context that staged and received it."""
    src = tmp_path / "src" / "venv"
    make_tree(src, python=True)
    m = manifest.build(str(src), [], "sha256", jobs=2)
    mpath = tmp_path / "manifest.jsonl"
    manifestfile.save(m, str(mpath))
    names = tmp_path / "names"
    with open(names, "wb") as f:
        manifestfile.names(m, f)
    data = subprocess.run(
        ["tar", "-C", str(src), "--null", "--no-recursion", "-T", str(names), "-cf", "-"],
        check=True,
        capture_output=True,
    ).stdout
    for change in (cut, flip):
        if change is not None:
            data = change(data)
    (tmp_path / "stream").write_bytes(data)
    ctx = runner.Context(
        str(tmp_path / "d" / "venv"),
        Choices(jobs=2),
        manifest=str(mpath),
        state=runner.make_state(str(tmp_path)),
    )
    ctx.locked = True
    assert runner.run(ctx, "stage", staging.stage)["status"] == "ok"
    event = runner.run(ctx, "receive", receive.receive, producer=["cat", str(tmp_path / "stream")])
    return src, ctx, event


TRICKLE = (
    "import sys, time; d = open(sys.argv[1], 'rb').read(); o = sys.stdout.buffer; "
    "o.write(d[:len(d) // 2]); o.flush(); time.sleep(1.0); o.write(d[len(d) // 2:])"
)


@pytest.mark.parametrize("algo", ["sha256", "none"])
def test_receive_says_how_much_of_the_stream_its_tar_has_read(tmp_path, algo):
    """`--progress S` (the runbook's progress lines, pv's job before): every S seconds the bytes
    the unpacking tar has read so far (its rchar: no copy of the stream is made to count it),
    never more than it was sent; at the end the stream's whole size where the digest reader
    counted it (not with verify: none, whose receive has none)."""
    _src, ctx, _event = received_staging(tmp_path)
    data = (tmp_path / "stream").read_bytes()
    said = []
    ctx.choices = dataclasses.replace(ctx.choices, verify=algo)
    ctx.progress = (0.05, said.append)
    assert runner.run(ctx, "stage", staging.stage)["status"] == "ok"
    event = runner.run(
        ctx,
        "receive",
        receive.receive,
        producer=[sys.executable, "-c", TRICKLE, str(tmp_path / "stream")],
    )
    assert event["status"] == "ok", event
    # samples while the producer waits, half the stream sent: at most that half (and tar's own
    # few reads of files such as /etc/localtime)
    during = said[:-1] if algo != "none" else said
    assert len(during) >= 5, said
    assert during == sorted(during) and 0 < during[0] <= len(data) // 2 + 65536, (said, len(data))
    if algo != "none":
        assert said[-1] == len(data)


def offset_of(data: bytes, rel: str) -> int:
    """Where the data of member `rel` starts in the tar stream `data`."""
    import io
    import tarfile

    return next(
        t.offset_data for t in tarfile.open(fileobj=io.BytesIO(data)).getmembers() if t.name == rel
    )


DATA_BIN = PKG + "/data.bin"


def test_verify_takes_each_files_digest_from_the_stream_and_reads_none(tmp_path, monkeypatch):
    _src, ctx, event = received_staging(tmp_path)
    assert event["status"] == "ok" and event["facts"]["streamed"] == 5, event

    def no_reading(*args):
        raise AssertionError("verify read a file the stream's digest proves")

    monkeypatch.setattr(filehash, "digest", no_reading)
    monkeypatch.setattr(filehash, "digest", no_reading)  # what filehash.digests calls
    event = runner.run(ctx, "verify", proof.verify)
    assert event["status"] == "ok", event
    assert event["facts"]["streamed"] == 5 and event["facts"]["hashed"] == 0
    assert "5 files checked by the stream's sha256" in event["detail"]
    assert "hashed again" not in event["detail"]


def test_a_byte_flipped_between_the_ends_fails_verify_by_the_streams_digest(tmp_path):
    def flip(data: bytes) -> bytes:
        raw = bytearray(data)
        raw[offset_of(data, DATA_BIN) + 4321] ^= 0x01
        return bytes(raw)

    src, ctx, event = received_staging(tmp_path, flip=flip)
    assert event["status"] == "ok", event  # tar has no checksum over file data
    event = runner.run(ctx, "verify", proof.verify)
    assert event["status"] == "failed"
    assert any(line.startswith("differs: %s (content" % DATA_BIN) for line in event["error"])
    assert event["facts"]["hashed"] == 0  # found from the stream, nothing read
    assert not os.path.exists(os.path.join(ctx.dest, "bin"))  # nothing installed


def _rewrite(p: Path) -> None:
    raw = bytearray(p.read_bytes())
    raw[10] ^= 0xFF
    with open(p, "r+b") as f:  # in place: the same inode, the same size
        f.write(bytes(raw))


def _replace(p: Path) -> None:
    other = p.with_name("other")
    other.write_bytes(bytes(len(p.read_bytes())))  # a new inode, the same size
    os.rename(other, p)


@pytest.mark.parametrize(
    "change, line",
    [
        (_rewrite, "differs: %s (content" % DATA_BIN),
        (_replace, "differs: %s (content" % DATA_BIN),
        (lambda p: p.write_bytes(p.read_bytes() + b"x"), "differs: %s (s:" % DATA_BIN),
        (lambda p: p.chmod(0o600), "differs: %s (m:" % DATA_BIN),
        (lambda p: p.unlink(), "missing: %s" % DATA_BIN),
        (lambda p: p.with_name("planted.so").write_bytes(b"x"), "extra:   %s/planted.so" % PKG),
    ],
)
def test_a_staging_changed_after_receive_fails_verify(tmp_path, change, line):
    """With the stream's digests verify reads no file whose inode, ctime and size are still what
    tar left: a file changed after receive (a new ctime, another inode) is read again; size, mode,
    missing and extra files are the stat walk's."""
    _src, ctx, event = received_staging(tmp_path)
    assert event["status"] == "ok", event
    time.sleep(0.05)  # a change within the file system's timestamp tick of tar's is not seen
    change(Path(ctx.staging) / DATA_BIN)
    event = runner.run(ctx, "verify", proof.verify)
    assert event["status"] == "failed"
    assert any(e.startswith(line) for e in event["error"]), event["error"]
    if "content" in line:
        assert event["facts"]["hashed"] == 1  # only the file that changed was read
    assert runner.read_stamp(ctx) is None  # nothing to relocate or swap


def test_a_stream_cut_between_two_members_fails_receive(tmp_path):
    """GNU tar ends without a word (exit 0) at a member boundary: the cut used to pass receive
    (and, cut after the last member, verify too)."""
    import io
    import tarfile

    def cut(data: bytes) -> bytes:
        members = tarfile.open(fileobj=io.BytesIO(data)).getmembers()
        return data[: members[len(members) // 2].offset]

    def no_end(data: bytes) -> bytes:
        last = tarfile.open(fileobj=io.BytesIO(data)).getmembers()[-1]
        return data[: last.offset_data + -(-last.size // 512) * 512]

    for how in (cut, no_end):
        _src, ctx, event = received_staging(tmp_path / how.__name__, cut=how)
        assert event["status"] == "failed", event
        assert "before the end of the tar archive" in event["detail"], event


def test_a_stream_with_a_broken_header_fails_receive_naming_it(tmp_path):
    def flip(data: bytes) -> bytes:
        raw = bytearray(data)
        raw[offset_of(data, DATA_BIN) - 512 + 3] ^= 0x01  # data.bin's header, its name
        return bytes(raw)

    _src, ctx, event = received_staging(tmp_path, flip=flip)
    assert event["status"] == "failed"
    assert "fails its checksum" in event["detail"], event


def test_a_node_verifies_by_the_streams_digests_and_a_delta_links_by_stat(first_install):
    """The fan-out node goes through the same receive and verify: nothing of a whole bundle is
    read again, and in a re-run's bundle the linked files keep the stat rule."""
    src, m1, dest, tmp_path = first_install
    change_one_file(src)
    m2 = manifest.build(str(src), [], "sha256", jobs=2, reuse=m1)
    rc, doc = node(bundle(tmp_path / "b2", src, m2, base=m1), dest)
    assert rc == 0 and doc["ok"], doc
    assert doc["verify"]["hashed"] == 0 and doc["verify"]["linked"] >= 1, doc


# -- work that overlaps: the early quick check, relocate's background scan ----------------------


def test_the_quick_check_walks_the_destination_as_soon_as_the_lock_is_held(
    first_install, monkeypatch
):
    """The walk that the quick re-run check needs starts when the engine holds the lock (while
    the runbook scans the source); `current` takes its result and walks nothing itself."""
    src, _m1, dest, tmp_path = first_install
    installed = manifestfile.load(str(dest / paths.INSTALLED_MANIFEST))
    source_stat = installed["header"]["source_stat_fingerprint"]
    ctx = runner.Context(str(dest), state=runner.make_state(str(tmp_path)))
    ctx.locked = True
    preflight.begin_early_check(ctx)
    assert ctx.early is not None
    ctx.early.take()  # the walk is done before current asks

    def no_walk(*args, **kw):
        raise AssertionError("current walked the destination again")

    monkeypatch.setattr(manifest, "check_tree", no_walk)
    event = runner.run(ctx, "current", engine.current, mode="quick", source_stat=source_stat)
    assert event["status"] == "ok" and event["facts"]["up_to_date"] == 1, event
    assert ctx.early is None  # taken once
    monkeypatch.undo()
    # a file changed at the destination before the walk: not up to date, and named
    change_one_file(dest)
    ctx2 = runner.Context(str(dest), state=runner.make_state(str(tmp_path)))
    ctx2.locked = True
    preflight.begin_early_check(ctx2)
    event = runner.run(ctx2, "current", engine.current, mode="quick", source_stat=source_stat)
    assert event["facts"]["up_to_date"] == 0, event
    # another source: the walk alone never makes it up to date
    ctx3 = runner.Context(str(dest), state=runner.make_state(str(tmp_path)))
    ctx3.locked = True
    preflight.begin_early_check(ctx3)
    event = runner.run(ctx3, "current", engine.current, mode="quick", source_stat="0" * 64)
    assert event["facts"]["up_to_date"] == 0 and "source changed" in event["facts"]["why"]


def test_the_early_check_proves_an_unchanged_install_without_reading_its_manifest(
    first_install, monkeypatch
):
    """The install recorded its tree's stat fingerprint (manifest.INSTALLED_STAT): the early
    walk's lines matching it, the manifest's entries are never read; a link planted there since
    makes it read them and compare (the link named)."""
    _src, _m1, dest, tmp_path = first_install
    head = manifestfile.read_header(str(dest / paths.INSTALLED_MANIFEST))
    assert head[manifest.INSTALLED_STAT]

    def unread(*args, **kw):
        raise AssertionError("the install's manifest was read")

    def checked(locked=True):
        ctx = runner.Context(str(dest), state=runner.make_state(str(tmp_path)))
        ctx.locked = locked
        preflight.begin_early_check(ctx)
        return runner.run(
            ctx,
            "current",
            engine.current,
            mode="quick",
            source_stat=head["source_stat_fingerprint"],
        )

    real_load = manifestfile.load
    monkeypatch.setattr(manifestfile, "load", unread)
    event = checked()
    assert event["status"] == "ok" and event["facts"]["up_to_date"] == 1, event
    monkeypatch.setattr(manifestfile, "load", real_load)
    os.symlink("/etc", dest / "lib" / "planted")
    event = checked()
    assert event["facts"]["up_to_date"] == 0, event
    assert "1 entries changed at the destination" in event["facts"]["why"], event


def test_the_early_checks_walk_forks_its_workers_as_it_begins(tmp_path, monkeypatch):
    """Where the host has the cores, the walk's workers are forked by the thread that begins
    the check (the process has one thread then); a file edited there is still found."""
    dest = tmp_path / "venv"
    for a in range(3):
        for b in range(8):
            d = dest / "lib" / f"p{a}" / f"m{b}"
            d.mkdir(parents=True)
            (d / "f.py").write_text("x" * b)
    m = manifest.build(str(dest), [], "sha256", jobs=1)
    manifestfile.save(
        manifest.relocated(m, {}, manifestfile.fingerprint(m)), str(dest / paths.INSTALLED_MANIFEST)
    )
    head = manifestfile.read_header(str(dest / paths.INSTALLED_MANIFEST))
    forked = []
    real_fork = statwalk._fork
    monkeypatch.setattr(statwalk, "walk_workers", lambda cpus: 3)
    monkeypatch.setattr(statwalk, "_fork", lambda *a: forked.append(len(a[1])) or real_fork(*a))

    def checked():
        ctx = runner.Context(str(dest), state=runner.make_state(str(tmp_path)))
        ctx.locked = True
        preflight.begin_early_check(ctx)
        assert forked, "no worker forked as the check began"
        return runner.run(
            ctx,
            "current",
            engine.current,
            mode="quick",
            source_stat=head["source_stat_fingerprint"],
        )

    assert checked()["facts"]["up_to_date"] == 1
    (dest / "lib" / "p2" / "m7" / "f.py").write_text("edited")
    event = checked()
    assert event["facts"]["up_to_date"] == 0 and "1 entries changed" in event["facts"]["why"]


def test_no_early_walk_without_the_lock_an_install_or_a_quick_check(first_install):
    _src, _m1, dest, tmp_path = first_install
    ctx = runner.Context(str(dest), state=runner.make_state(str(tmp_path)))
    preflight.begin_early_check(ctx)  # not locked
    assert ctx.early is None
    ctx = runner.Context(str(dest), Choices(rerun="digest"), state=runner.make_state(str(tmp_path)))
    ctx.locked = True
    preflight.begin_early_check(ctx)
    assert ctx.early is None
    ctx = runner.Context(str(tmp_path / "nothing" / "venv"), state=runner.make_state(str(tmp_path)))
    ctx.locked = True
    preflight.begin_early_check(ctx)
    assert ctx.early is None


@pytest.mark.parametrize("kind", ["Elsewhere", "ElsewhereChild"])
def test_relocates_scan_of_data_files_finishes_in_the_tree_after_its_rename(tmp_path, kind):
    """The scan runs by descriptors (in a thread, or a child Python given one): the swap renames
    the staging while it may still run. What relocation rewrites (bin/, pyvenv.cfg) is not read:
    the child's scan starts with verify, before relocation."""
    from rbkit import relocate

    tree = tmp_path / "staging"
    (tree / "lib" / "pkg").mkdir(parents=True)
    (tree / "bin").mkdir()
    (tree / "lib" / "pkg" / "paths.txt").write_text("/old/venv/lib\n")
    (tree / "lib" / "pkg" / "other.py").write_text("x = 1\n")
    (tree / "bin" / "tool.py").write_text("#!/old/venv/bin/python\n")  # bin/: relocate's own
    (tree / "lib" / "link.txt").symlink_to(tmp_path / "outside.txt")
    (tmp_path / "outside.txt").write_text("/old/venv\n")  # not followed
    (tree / "pyvenv.cfg").write_text("command = /usr/bin/python3 -m venv /old/venv\n")
    scan = getattr(relocate, kind)(str(tree), ["/old/venv"])
    os.rename(tree, tmp_path / "installed")
    assert scan.result() == (["lib/pkg/paths.txt"], "")
    assert relocate.elsewhere(str(tmp_path / "installed"), "/old/venv") == ["lib/pkg/paths.txt"]


def test_the_swap_reports_what_relocates_scan_found(tmp_path):
    src, ctx, event = received_staging(tmp_path)
    assert event["status"] == "ok"
    (Path(ctx.staging) / "notes.txt").write_text("made at %s\n" % src)  # data naming the source
    m = manifest.build(str(ctx.staging), [], "sha256", jobs=2)
    manifestfile.save(m, ctx.manifest)
    ctx._manifest_cache = None
    ctx.old = str(src)
    ctx.policy = "replace"
    logged = []
    ctx.log = logged.append
    steps = {
        "verify": proof.verify,
        "relocate": engine.relocate_staging,
        "prove": proof.prove,
        "swap": engine.swap,
    }
    for step, fn in steps.items():
        event = runner.run(ctx, step, fn)
        assert event["status"] == "ok", event
        if step == "relocate":
            assert "elsewhere" not in event["facts"]
    assert event["facts"]["elsewhere"] == 1, event
    assert any("outside bin/" in line and "notes.txt" in line for line in logged), logged


# -- a re-run whose source is unchanged (#17): nothing hashed at the source ------------------------


def rerun_ctx(tmp_path: Path, dest: Path, mpath: Path) -> runner.Context:
    ctx = runner.Context(
        str(dest),
        Choices(on_existing="replace", jobs=2),
        old="/old/venv",
        manifest=str(mpath),
        state=runner.make_state(str(tmp_path)),
    )
    ctx.locked = True
    return ctx


def install_sent(ctx: runner.Context, src: Path, names: str, tmp_path: Path) -> dict:
    """The rest of the install: the names the stage listed, streamed from `src`; receive ..
    swap. Returns verify's event."""
    payload = tmp_path / "sent.tar"
    subprocess.run(
        ["tar", "-C", str(src), "--null", "--no-recursion", "-T", names, "-cf", str(payload)],
        check=True,
    )
    events = {}
    for sid, fn, kw in (
        ("receive", receive.receive, {"producer": ["cat", str(payload)]}),
        ("verify", proof.verify, {}),
        ("relocate", engine.relocate_staging, {}),
        ("prove", proof.prove, {}),
        ("swap", engine.swap, {}),
    ):
        events[sid] = runner.run(ctx, sid, fn, **kw)
        assert events[sid]["status"] == "ok", events[sid]
    return events["verify"]


def corrupt_keeping_stat(path: Path) -> None:
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_an_unchanged_source_is_not_hashed_and_what_changed_here_is_sent(first_install):
    """The install's manifest records its source's (the entries relocation rewrote, as they
    were): with the source's stat fingerprint unchanged, stage rebuilds the source's manifest
    from it (checked by its fingerprint) and the source is only read by the stream. A file
    changed at the destination is sent and verified against the source's digest."""
    src, m1, dest, tmp_path = first_install
    installed = manifestfile.load(str(dest / paths.INSTALLED_MANIFEST))
    assert installed["header"]["source_entries"], "relocation rewrote bin/tool"
    source_stat = hostfs.scan(str(src), [])["stat_fingerprint"]  # preflight's figure
    assert source_stat == installed["header"]["source_stat_fingerprint"]
    (dest / PKG / "__init__.py").write_text("x = 'changed at the destination'\n")
    away = src.with_name("away")
    src.rename(away)  # the source is nowhere while the engine plans the re-run
    mpath = tmp_path / "no-kept-manifest.jsonl"
    ctx = rerun_ctx(tmp_path, dest, mpath)
    assert (
        runner.run(ctx, "current", engine.current, "quick", source_stat)["facts"]["up_to_date"] == 0
    )
    event = runner.run(
        ctx, "stage", staging.stage, delta=True, source_stat=source_stat, algo="sha256", exclude=[]
    )
    assert event["status"] == "ok" and event["facts"]["kept"] == 1, event
    assert event["facts"]["rebuilt"] == 1
    assert manifestfile.load(str(mpath))["entries"] == m1["entries"]  # the source's, bin/tool too
    sent = manifestfile.read_names(event["facts"]["names"])
    assert f"{PKG}/__init__.py" in sent and "bin/tool" in sent and f"{PKG}/data.bin" not in sent
    away.rename(src)
    verify = install_sent(ctx, src, event["facts"]["names"], tmp_path)
    assert verify["facts"]["linked"] >= 1 and verify["facts"]["hashed"] == 0, verify
    assert (dest / PKG / "__init__.py").read_text() == (src / PKG / "__init__.py").read_text()
    again = manifestfile.load(str(dest / paths.INSTALLED_MANIFEST))["header"]
    assert again["source_fingerprint"] == manifestfile.fingerprint(m1)


def test_a_kept_manifest_never_links_a_file_that_failed_its_digest(first_install):
    """The source manifest kept from the last run stands for the unchanged source (nothing
    rebuilt, nothing hashed there); with `rerun: digest`, a file corrupted here with its size
    and mtime kept fails its digest and is sent, never linked."""
    src, m1, dest, tmp_path = first_install
    mpath = tmp_path / "kept.jsonl"
    manifestfile.save(m1, str(mpath))
    data = dest / PKG / "data.bin"
    corrupt_keeping_stat(data)
    source_stat = hostfs.scan(str(src), [])["stat_fingerprint"]
    ctx = rerun_ctx(tmp_path, dest, mpath)
    cur = runner.run(ctx, "current", engine.current, "digest", linking=True)
    assert cur["facts"]["up_to_date"] == 0 and f"{PKG}/data.bin" in ctx.unlinkable, cur
    event = runner.run(
        ctx, "stage", staging.stage, delta=True, source_stat=source_stat, algo="sha256", exclude=[]
    )
    assert event["facts"]["kept"] == 1 and event["facts"]["rebuilt"] == 0, event
    assert not (Path(ctx.staging) / PKG / "data.bin").exists()
    assert f"{PKG}/data.bin" in manifestfile.read_names(event["facts"]["names"])
    install_sent(ctx, src, event["facts"]["names"], tmp_path)
    assert data.read_bytes() == (src / PKG / "data.bin").read_bytes()


def test_a_delta_reads_the_install_manifest_once_and_verify_knows_the_inodes_it_linked(
    first_install, monkeypatch
):
    """The quick check's read of the install's manifest serves the stage (one read per version
    of the file); the rebuilt source manifest carries its stat fingerprint for relocate; verify
    takes a linked file by the inode stage linked, so a file put in the staging's place after
    the stage, with the size, mode and mtime kept but other bytes, is read and fails."""
    src, m1, dest, tmp_path = first_install
    source_stat = hostfs.scan(str(src), [])["stat_fingerprint"]
    change_one_file(dest)
    mpath = tmp_path / "rebuilt.jsonl"
    ctx = rerun_ctx(tmp_path, dest, mpath)
    preflight.begin_early_check(ctx)
    assert (
        runner.run(ctx, "current", engine.current, "quick", source_stat)["facts"]["up_to_date"] == 0
    )
    reads = []
    real_load = manifestfile.load
    monkeypatch.setattr(manifestfile, "load", lambda p: reads.append(p) or real_load(p))
    event = runner.run(
        ctx, "stage", staging.stage, delta=True, source_stat=source_stat, algo="sha256", exclude=[]
    )
    assert event["status"] == "ok" and event["facts"]["rebuilt"] == 1, event
    assert reads == [], "stage read the install's manifest again"
    monkeypatch.undo()
    assert manifestfile.load(str(mpath))["header"]["stat_fingerprint"] == source_stat
    # the install's manifest changed since the quick check read it: read again
    m = manifestfile.load(str(dest / paths.INSTALLED_MANIFEST))
    manifestfile.save(m, str(dest / paths.INSTALLED_MANIFEST))
    cached = ctx._installed_cache
    assert ctx.installed() is not cached[1] and ctx._installed_cache[0] != cached[0]
    # a linked file of the staging swapped for a copy with other bytes and the same stat
    linked = Path(ctx.staging) / PKG / "data.bin"
    assert linked.stat().st_ino == (dest / PKG / "data.bin").stat().st_ino
    planted = linked.with_name("planted")
    planted.write_bytes(linked.read_bytes())
    corrupt_keeping_stat(planted)
    os.utime(planted, ns=(linked.stat().st_atime_ns, linked.stat().st_mtime_ns))
    os.chmod(planted, linked.stat().st_mode & 0o7777)
    os.replace(planted, linked)
    payload = tmp_path / "sent.tar"
    subprocess.run(
        [
            "tar",
            "-C",
            str(src),
            "--null",
            "--no-recursion",
            "-T",
            event["facts"]["names"],
            "-cf",
            str(payload),
        ],
        check=True,
    )
    assert (
        runner.run(ctx, "receive", receive.receive, producer=["cat", str(payload)])["status"]
        == "ok"
    )
    ver = runner.run(ctx, "verify", proof.verify)
    assert ver["status"] == "failed" and f"{PKG}/data.bin" in str(ver), ver
    assert (dest / PKG / "data.bin").read_bytes() == (src / PKG / "data.bin").read_bytes()


@pytest.mark.parametrize("what", ["source changed", "other excludes", "forged record"])
def test_a_source_manifest_that_cannot_stand_for_the_source_stages_nothing(first_install, what):
    src, m1, dest, tmp_path = first_install
    source_stat = hostfs.scan(str(src), [])["stat_fingerprint"]
    exclude: list = []
    if what == "source changed":
        change_one_file(src)
        source_stat = hostfs.scan(str(src), [])["stat_fingerprint"]
    elif what == "other excludes":
        exclude = ["*.pyc"]
    else:  # the recorded entry of bin/tool is not what the source had
        m = manifestfile.load(str(dest / paths.INSTALLED_MANIFEST))
        m["header"]["source_entries"][0]["h"] = "0" * 64
        manifestfile.save(m, str(dest / paths.INSTALLED_MANIFEST))
    before = (dest / PKG / "__init__.py").read_text()
    ctx = rerun_ctx(tmp_path, dest, tmp_path / "m.jsonl")
    event = runner.run(
        ctx,
        "stage",
        staging.stage,
        delta=True,
        source_stat=source_stat,
        algo="sha256",
        exclude=exclude,
    )
    assert event["status"] == "skipped" and event["facts"]["kept"] == 0, event
    assert not os.path.lexists(ctx.staging) and runner.read_stamp(ctx) is None
    assert not (tmp_path / "m.jsonl").exists() or what == "other excludes"
    assert (dest / PKG / "__init__.py").read_text() == before


# -- the post-swap proof: every console script started by the kernel, none of its code run ------


def _script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def test_the_post_swap_proof_starts_each_console_script_without_running_its_code(tmp_path):
    dest = tmp_path / "venv"
    make_tree(dest, python=True)
    ran = tmp_path / "ran"
    code = f"open({str(ran)!r}, 'a').write(__file__ + '\\n')\n"
    _script(dest / "bin" / "tool", f"#!{dest}/bin/python\n{code}")
    _script(
        dest / "bin" / "pip",
        f"#!/bin/sh\n'''exec' \"{dest}/bin/python\" \"$0\" \"$@\"\n' '''\n{code}",
    )
    _script(dest / "bin" / "other", f"#!/usr/bin/env python3\n{code}")  # not the venv's own
    proven, failed = proof.prove_scripts(str(dest), ["bin/tool", "bin/other", "pyvenv.cfg"])
    assert (proven, failed) == (["bin/pip", "bin/tool"], [])
    assert not ran.exists()  # the hook ended each interpreter before the script


def test_the_post_swap_proof_fails_a_console_script_whose_interpreter_lives_elsewhere(tmp_path):
    dest, other = tmp_path / "venv", tmp_path / "other"
    make_tree(dest, python=True)
    make_tree(other, python=True)
    # the venv's python3 is a wrapper that starts another venv's interpreter
    _script(dest / "bin" / "python3", f'#!/bin/sh\nexec {other}/bin/python "$@"\n')
    _script(dest / "bin" / "tool", f"#!{dest}/bin/python3\nimport sys\n")
    proven, failed = proof.prove_scripts(str(dest), ["bin/tool"])
    assert proven == []
    assert failed == [
        f"console script bin/tool runs from the wrong place: sys.prefix {other}, {other}/bin/python"
    ], failed


def test_the_post_swap_proof_starts_one_script_of_each_interpreter_line(tmp_path, monkeypatch):
    dest = tmp_path / "venv"
    make_tree(dest, python=True)
    for name in ("a", "b", "c"):
        _script(dest / "bin" / name, f"#!{dest}/bin/python\nimport sys\n")
    _script(dest / "bin" / "d", f"#!/bin/sh\n'''exec' \"{dest}/bin/python\" \"$0\" \"$@\"\n' '''\n")
    started = []
    real = proof.run_quiet
    monkeypatch.setattr(
        proof, "run_quiet", lambda argv, *a: started.append(argv[0]) or real(argv, *a)
    )
    proven, failed = proof.prove_scripts(str(dest), ["bin/a", "bin/b", "bin/c", "bin/d"])
    assert (proven, failed) == (["bin/a", "bin/b", "bin/c", "bin/d"], [])
    assert sorted(started) == [f"{dest}/bin/a", f"{dest}/bin/d"]


def test_the_post_swap_proof_follows_a_trampoline_to_the_interpreter_beside_it(tmp_path):
    # dest reached through a link: the trampoline that finds its python beside the script runs
    # it by its real path, which is still the venv's own bin/
    real = tmp_path / "real venv"
    make_tree(real, python=True)
    dest = tmp_path / "venv"
    dest.symlink_to(real)
    _script(
        real / "bin" / "tool",
        "#!/bin/sh\n'''exec' "
        + relocate.BESIDE.decode()
        + 'python" "$0" "$@"\n\' \'\'\'\nimport sys\n',
    )
    assert proof.prove_scripts(str(dest), ["bin/tool"]) == (["bin/tool"], [])


def test_a_system_error_in_a_step_is_said_in_words_and_its_traceback_goes_to_the_log(tmp_path):
    """Issue 36: no exception text is a step's detail: who cannot do what where, the errno's
    name and meaning; the traceback goes to ctx.trace (the runbook's run.log only)."""
    import errno as errno_

    traced: list = []
    logged: list = []
    ctx = runner.Context(str(tmp_path / "venv"), log=logged.append, trace=traced.append)

    def step(c):
        raise PermissionError(errno_.EPERM, "Operation not permitted", str(tmp_path / "x"))

    event = runner.run(ctx, "stage", step)
    who = runner.user_name()
    assert event["status"] == "failed"
    assert event["detail"] == (
        f"{who} cannot use {tmp_path / 'x'}: operation not permitted (EPERM: the system does not "
        f"permit it to {who}: an immutable or append-only attribute (lsattr -d), or a capability "
        f"{who} lacks)"
    )
    assert "Errno" not in event["detail"] and "PermissionError" not in event["detail"]
    assert not logged and len(traced) == 1 and "Traceback (most recent call last)" in traced[0]
    assert "PermissionError: [Errno 1]" in traced[0]


def test_an_oserror_the_kit_raised_with_its_own_words_keeps_them():
    exc = PermissionError("refusing to restore backup 7: it is owned by nobody, not by root")
    assert runner.os_error_words(exc) == str(exc)
    exc = OSError(40, "the staging /x is a symlink to /y: refusing to follow it")
    assert runner.os_error_words(exc) == exc.strerror


# -- the engine's choices: one document, read once (issue 35) ------------------------------------


def _choices_of(runbook: Path) -> str:
    """The value of RB_ENGINE_CHOICES: one key a line (compiler.plan.keyed), so it spans lines."""
    value = read_settings(runbook.read_text()).get("RB_ENGINE_CHOICES")
    assert isinstance(value, str), f"{runbook}: no RB_ENGINE_CHOICES"
    return value


@pytest.mark.parametrize(
    "runbook",
    sorted((ROOT / "generated").glob("*.sh"))
    + sorted((ROOT / "tests" / "cases" / "valid").glob("*.sh")),
    ids=lambda p: p.name,
)
def test_every_runbook_holds_one_choices_document_the_engine_reads_whole(runbook):
    """What the compiler writes (compiler/engineconf.py) is what the kit reads (Choices), key for
    key; no choice of the engine travels as an argument of its own."""
    text = _choices_of(runbook)
    assert plan.keyed(Choices.from_json(text).to_json()) == text
    words = runbook.read_text() + (ROOT / "tests" / "cases" / "runtime.sh").read_text()
    # the engine's argument lists: serve's (the runtime), receive's (transfer), a node's
    blocks = re.findall(
        r'(?:args|recv)=\((?:"\$\{RB_KIT_ARGV\[@\]\}" engine receive )?'
        r"--dest .*?\)\n",
        words,
        re.S,
    )
    # serve's and receive's (the runtime), a fan-out's node's (the runbook)
    assert len(blocks) == (3 if "\nreadonly RB_FAN_ENGINE=" in words else 2), blocks
    for block in blocks:
        assert '--choices "${RB_ENGINE_CHOICES}"' in block
        assert set(re.findall(r"--[a-z-]+", block)) <= {
            "--dest",
            "--old",
            "--choices",
            "--manifest",
            "--compression",
            "--probe-config",
            "--holder",
            "--state",
            "--progress",
            "--need",
        }, block


@pytest.mark.parametrize(
    "doc, said",
    [
        (
            {"on_existing": "overwrite"},
            "on_existing is 'overwrite', not one of refuse, backup, replace",
        ),
        ({"special_modes": "drop"}, "special_modes is 'drop', not one of refuse, strip, keep"),
        ({"keep_backup": 2}, "keys this kit does not know: keep_backup"),
        ({"keep_backups": 0}, "keep_backups is 0, not a whole number above 0"),
        ({"jobs": "8"}, "jobs is '8', not a whole number above 0"),
        ({"env": {"A": 1}}, "env is {'A': 1}, not an object of strings"),
        ({"schema": 2}, "schema 2; this kit reads schema 1"),
        ({"timeout": True}, "timeout is True, not a number of seconds"),
    ],
)
def test_a_choices_document_the_kit_cannot_read_is_refused_naming_the_key(doc, said):
    with pytest.raises(ChoicesError, match=re.escape(said)):
        Choices.from_json(json.dumps(doc))
    with pytest.raises(ChoicesError, match="not a JSON object"):
        Choices.from_json("[]")


def test_the_engine_refuses_a_bad_document_before_it_writes_anything(tmp_path):
    dest = tmp_path / "d" / "venv"
    dest.parent.mkdir()
    env = dict(os.environ, PYTHONPATH=str(KIT), PYTHONDONTWRITEBYTECODE="1")
    for argv in (
        ["engine", "serve", "--dest", str(dest), "--holder", "t"],
        ["engine", "receive", "--dest", str(dest), "--state", str(tmp_path)],
        ["rbkit.fanout", "node", "--dir", str(tmp_path), "--dest", str(dest)],
    ):
        head = ["-m", "rbkit"] + argv if argv[0] == "engine" else ["-m"] + argv
        p = subprocess.run(
            [sys.executable, *head, "--choices", '{"on_existing": "overwrite"}'],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert p.returncode == 2, p.stderr
        assert "argument --choices: the engine's choice on_existing is 'overwrite'" in p.stderr
    assert list(dest.parent.iterdir()) == []  # no lock, no staging


def test_a_rerun_skips_the_same_steps_whoever_asks(tmp_path):
    """The skip rule is the engine's (engine.step): serve's requests and a node's install skip
    the same steps when the destination already holds the tree."""
    ctx = runner.Context(str(tmp_path / "venv"), state=runner.make_state(str(tmp_path)))
    ctx.locked, ctx.up_to_date = True, "up to date (quick check)"
    for name in ("stage", "verify", "relocate", "prove", "swap"):
        serve.handle(ctx, [name])
    assert [(e["step"], e["status"]) for e in ctx.events] == [
        (n, "skipped") for n in ("stage", "verify", "relocate", "prove", "swap")
    ]
    assert set(engine.SKIPPED_WHEN_CURRENT) == {
        "stage",
        "receive",
        "verify",
        "relocate",
        "prove",
        "swap",
    }
    assert not hasattr(serve, "INSTALL")


def test_the_source_hash_beside_the_stream_takes_the_cores_the_stream_leaves(monkeypatch):
    """Beside the stream (`engine hash --beside-stream`) the source is hashed by the cores tar,
    the compressor and sshd leave: one process on two CPUs (no forked workers: CPU the stream's
    processes need there), --jobs where the host has cores to spare."""
    from rbkit import serve

    # the CPUs this process may use (rbrules.cpus), not the machine's
    monkeypatch.setattr(cpus, "count", lambda root="/": 2)
    assert sendside.hash_jobs("2", True) == 1 and sendside.hash_jobs("2", False) == 2
    assert sendside.hash_jobs("auto", True) == 1
    monkeypatch.setattr(cpus, "count", lambda root="/": 16)
    assert sendside.hash_jobs("8", True) == 8 and sendside.hash_jobs("auto", True) == 14
    a = serve.parser().parse_args(["hash", "/r", "--out", "/o", "--beside-stream"])
    assert a.beside_stream and a.fn is sendside.cmd_hash
