"""Several streams side by side (#17): where the sending end starts the receiving ends (both on one
host, or the direct route), `rbkit engine send` splits the scan's list and runs one tar pair per
part, each receiving end hashing its own stream; verify takes every stream's digests. And the
source's manifest hashed by forked workers, biggest files first (threads of one Python did not
scale on the H100 host)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rbkit import hostfs, manifest, manifestfile, proof, runner, sender, serve, staging
from rbrules import compression, streams, units
from rbrules.choices import Choices

from compiler import kit
from tests.hostkit.test_kit import make_tree

KIT = Path(__file__).resolve().parents[2] / "hostkit"


def big_tree(root: Path) -> None:
    """make_tree's venv with files of several sizes in a few directories, one inode under two
    names (a hard link) and a link to a directory."""
    make_tree(root, python=True)
    for d in ("a", "a/b", "c"):
        (root / "lib" / d).mkdir(parents=True, exist_ok=True)
    for i, size in enumerate((900_000, 700_000, 500_000, 300_000, 200_000, 100_000, 10, 0)):
        (root / "lib" / ("a", "a/b", "c")[i % 3] / f"f{i}.bin").write_bytes(bytes([i]) * size)
    os.link(root / "lib" / "a" / "f0.bin", root / "lib" / "c" / "same-as-f0.bin")
    (root / "lib" / "to-a").symlink_to("a")


def scanned(tmp_path: Path) -> tuple:
    src = tmp_path / "src" / "venv"
    big_tree(src)
    names = tmp_path / "names"
    out = hostfs.scan(str(src), [], str(names))
    assert not out["refusal"], out
    return src, names


def read_list(path: str) -> list:
    data = Path(path).read_bytes()
    assert data.endswith(b"\0")
    return data[:-1].decode().split("\0")


def test_the_split_puts_every_directory_in_every_list_and_each_file_in_one(tmp_path):
    src, names = scanned(tmp_path)
    listed = read_list(str(names))
    dirs = [p for p in listed if (src / p).is_dir() and not (src / p).is_symlink()]
    others = [p for p in listed if p not in dirs]
    (tmp_path / "parts").mkdir()
    parts = sender.split_names(str(names), 3, str(tmp_path / "parts"))
    assert parts and len(parts) == 3
    lists = [read_list(p) for p in parts]
    seen = []
    for got in lists:
        # the scan's order (parents before what is in them), every directory in each list
        assert got == [p for p in listed if p in set(got)]
        assert [p for p in got if p in dirs] == dirs
        seen += [p for p in got if p not in dirs]
    assert sorted(seen) == sorted(others)  # each other entry once
    # the two names of one inode in one list: tar sends the second as a link to the first
    assert any({"lib/a/f0.bin", "lib/c/same-as-f0.bin"} <= set(got) for got in lists)
    # the biggest first into the emptiest list: no list holds two of the three biggest files
    biggest = {"lib/python3.11/site-packages/pkg/data.bin", "lib/a/f0.bin", "lib/a/b/f1.bin"}
    for got in lists:
        assert len(biggest & set(got)) == 1


def test_the_scan_counts_the_data_of_a_hard_link_once_and_records_its_names(tmp_path):
    """What the stream carries: tar sends a second name of an inode as a link, no data; the
    transfer's progress runs to 100% of the scan's bytes (it stopped at 75% with a 100 MB file
    under two names)."""
    src, names = scanned(tmp_path)
    out = hostfs.scan(str(src), [], str(names))
    sizes = sum(p.stat().st_size for p in src.rglob("*") if p.is_file() and not p.is_symlink())
    assert out["bytes"] == sizes - (src / "lib" / "a" / "f0.bin").stat().st_size
    listed = read_list(str(names))
    linked = [
        json.loads(line)
        for line in Path(str(names) + manifestfile.LINKS_SUFFIX).read_text().splitlines()
    ]
    assert sorted(listed[i] for i, _dev, _ino in linked) == ["lib/a/f0.bin", "lib/c/same-as-f0.bin"]
    assert len({(dev, ino) for _i, dev, ino in linked}) == 1


def test_the_split_is_one_stream_without_the_scans_record_or_below_its_bytes(tmp_path):
    _src, names = scanned(tmp_path)
    (tmp_path / "parts").mkdir()
    into = str(tmp_path / "parts")
    assert sender.split_names(str(names), 2, into, min_bytes=1 << 30) is None
    assert sender.split_names(str(names), 500, into) is None  # more lists than files
    (tmp_path / "src" / "venv" / "lib" / "c").chmod(0o555)
    hostfs.scan(str(tmp_path / "src" / "venv"), [], str(names))
    assert sender.split_names(str(names), 2, into) is None  # a directory u-w
    (tmp_path / "src" / "venv" / "lib" / "c").chmod(0o755)
    hostfs.scan(str(tmp_path / "src" / "venv"), [], str(names))
    assert sender.split_names(str(names), 2, into) is not None
    for name in os.listdir(into):
        os.unlink(os.path.join(into, name))
    record = Path(str(names) + manifestfile.SCAN_SUFFIX)
    lines = record.read_bytes().split(b"\n")
    record.write_bytes(b"\n".join(lines[:1] + lines[2:]))  # one line short
    assert sender.split_names(str(names), 2, into) is None
    record.unlink()
    assert sender.split_names(str(names), 2, into) is None
    assert os.listdir(into) == []


def test_stream_count_is_one_per_two_jobs_at_most_eight():
    assert [streams.stream_count(j) for j in (1, 2, 3, 4, 8, 16, 64)] == [1, 1, 1, 2, 4, 8, 8]


def test_each_receiving_end_is_told_its_part():
    ssh = ["ssh", "-o", "BatchMode=yes", "dst", "env PYTHONPATH=/k python3 -m rbkit engine receive"]
    assert sender.part_argv(ssh, True, 1, 4)[-1].endswith("engine receive --part 1/4")
    assert sender.part_argv(ssh, True, 1, 4)[:-1] == ssh[:-1]
    assert sender.part_argv(["python3", "-m", "rbkit"], False, 0, 2) == [
        "python3",
        "-m",
        "rbkit",
        "--part",
        "0/2",
    ]


def test_send_takes_every_word_after_local_as_the_receiving_ends_command(monkeypatch):
    got = {}

    def fake(root, names, compression, remote=None, local=None, jobs=1):
        got.update(root=root, names=names, remote=remote, local=local, jobs=jobs)
        return 0

    monkeypatch.setattr(sender, "send", fake)
    assert (
        serve.main(
            [
                "send",
                "/r",
                "/n",
                "--compression",
                "none",
                "--jobs",
                "6",
                "--local",
                "python3",
                "-m",
                "rbkit",
                "engine",
                "receive",
                "--remote",
                "x",
            ]
        )
        == 0
    )
    assert got == {
        "root": "/r",
        "names": "/n",
        "remote": None,
        "jobs": 6,
        "local": ["python3", "-m", "rbkit", "engine", "receive", "--remote", "x"],
    }
    assert serve.main(["send", "/r", "/n", "--remote", "ssh", "h", "--local"]) == 0
    assert got["remote"] == ["ssh", "h", "--local"] and got["local"] is None and got["jobs"] == 1


def staged(tmp_path: Path, src: Path) -> runner.Context:
    m = manifest.build(str(src), [], "sha256", jobs=2)
    mpath = tmp_path / "manifest.jsonl"
    manifestfile.save(m, str(mpath))
    ctx = runner.Context(
        str(tmp_path / "d" / "venv"),
        Choices(jobs=4),
        manifest=str(mpath),
        state=runner.make_state(str(tmp_path)),
    )
    ctx.locked = True
    # a record of an earlier try at this destination: the stage forgets it with the rest
    Path(ctx.state, "received.7.json").write_text("{}")
    assert runner.run(ctx, "stage", staging.stage)["status"] == "ok"
    assert not Path(ctx.state, "received.7.json").exists()
    return ctx


def receiver(ctx: runner.Context) -> list:
    return [
        sys.executable,
        "-m",
        "rbkit",
        "engine",
        "receive",
        "--dest",
        ctx.dest,
        "--state",
        ctx.state,
        "--choices",
        ctx.choices.to_json(),
        "--progress",
        "0.05",
    ]


def test_two_streams_land_whole_and_verify_takes_both_streams_digests(
    tmp_path, monkeypatch, capsys
):
    src, names = scanned(tmp_path)
    ctx = staged(tmp_path, src)
    monkeypatch.setenv("PYTHONPATH", str(KIT))
    monkeypatch.setattr(sender, "STREAMS_MIN_BYTES", 0)
    assert sender.send(str(src), str(names), "none", local=receiver(ctx), jobs=4) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith(
        "done\tok\tunpacked into %s in 2 streams side by side" % ctx.staging
    )
    event = json.loads(next(ln for ln in lines if ln.startswith("event\t")).split("\t", 1)[1])
    files = sum(1 for e in manifestfile.load(ctx.manifest)["entries"] if e["t"] == "f")
    assert event["facts"]["streams"] == 2 and event["facts"]["streamed"] == files
    assert "set\tstreams\t2" in lines
    assert sorted(os.listdir(ctx.state)) >= ["received.0.json", "received.1.json"]
    staging = Path(ctx.staging)
    assert os.path.samefile(staging / "lib/a/f0.bin", staging / "lib/c/same-as-f0.bin")
    assert (staging / "lib" / "to-a").is_symlink()
    got = runner.run(ctx, "verify", proof.verify)
    assert got["status"] == "ok", got
    assert got["facts"]["streamed"] == files and got["facts"]["hashed"] == 0


def test_a_stream_that_fails_fails_the_send_naming_it(tmp_path, monkeypatch, capsys):
    src, names = scanned(tmp_path)
    ctx = staged(tmp_path, src)
    monkeypatch.setenv("PYTHONPATH", str(KIT))
    monkeypatch.setattr(sender, "STREAMS_MIN_BYTES", 0)
    # the second receiving end fails as soon as it starts; the first may finish or be stopped
    wrapper = [
        "sh",
        "-c",
        'case "$*" in *"--part 1/2"*) echo broken >&2; exit 3;; esac; exec "$@"',
        "sh",
        *receiver(ctx),
    ]
    rc = sender.send(str(src), str(names), "none", local=wrapper, jobs=4)
    assert rc != 0
    captured = capsys.readouterr()
    last = captured.out.splitlines()[-1]
    assert last.startswith("done\tfailed\tstream 2 of 2: "), captured.out
    assert "stream 2/2: receive exited 3" in captured.err
    assert runner.run(ctx, "verify", proof.verify)["status"] == "failed"


def test_a_stream_stopped_because_another_failed_is_not_the_cause(tmp_path, monkeypatch, capsys):
    """Issue 45: the one-host move in 4 streams failed `exited 247`: a stream killed here because
    another had failed (SIGKILL: -9, 247 as an exit status) was taken for the cause, being first
    in the list. The status is the failed stream's; the stopped one is said so."""
    src, names = scanned(tmp_path)
    ctx = staged(tmp_path, src)
    monkeypatch.setenv("PYTHONPATH", str(KIT))
    monkeypatch.setattr(sender, "STREAMS_MIN_BYTES", 0)
    # the first receiving end waits (it is stopped), the second fails at once
    wrapper = [
        "sh",
        "-c",
        'case "$*" in *"--part 1/2"*) echo broken >&2; exit 3;; '
        '*"--part 0/2"*) exec sleep 30;; esac; exec "$@"',
        "sh",
        *receiver(ctx),
    ]
    rc = sender.send(str(src), str(names), "none", local=wrapper, jobs=4)
    assert rc == 3, rc
    err = capsys.readouterr().err
    assert "stream 2/2: receive exited 3" in err, err
    assert "stream 1/2: stopped (another stream failed)" in err, err
    assert "-9" not in err and "signal 9" not in err, err


def test_stripping_beside_a_tar_that_swaps_its_placeholders_for_links_never_fails(tmp_path):
    """Issue 45: each stream strips the whole staging once its own tar ends, while another's tar
    may still run; tar makes a placeholder file for each symlink it delays (a target with `..`
    or absolute) and swaps it for the link at its end. The walk beside that found names gone
    (ENOENT) and failed the stream. Entries gone while walked are the other stream's to strip."""
    src = tmp_path / "src"
    for d in range(4):
        (src / f"d{d}").mkdir(parents=True)
        for k in range(800):
            (src / f"d{d}" / f"l{k:04d}").symlink_to(f"../x{k}")
    archive = tmp_path / "a.tar"
    subprocess.run(["tar", "-C", str(src), "-cf", str(archive), "."], check=True)
    walks = 0
    # in memory where there is /dev/shm: tar swaps its placeholders in a burst there
    scratch = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else tmp_path))
    try:
        for _ in range(10):
            dst = scratch / "dst"
            subprocess.run(["rm", "-rf", str(dst)], check=True)
            dst.mkdir()
            tar = subprocess.Popen(["tar", "-C", str(dst), "-xf", str(archive)])
            try:
                while tar.poll() is None:
                    hostfs.strip_special(str(dst), racing=True)
                    walks += 1
            finally:
                tar.wait()
    finally:
        subprocess.run(["rm", "-rf", str(scratch)], check=True)
    assert walks


FORKED = """
import json, os, sys, threading
from rbkit import filehash, manifestfile
root = sys.argv[1]
rels = sorted(os.listdir(root))
sizes = [os.path.getsize(os.path.join(root, r)) for r in rels]
one = filehash.digests(root, rels, "sha256", 1, sizes)
forked = filehash.digests(root, rels, "sha256", 3, sizes)
stop = threading.Event(); t = threading.Thread(target=stop.wait); t.start()
threaded = filehash.digests(root, rels, "sha256", 3, sizes)
stop.set(); t.join()
errors = []
for jobs in (1, 3):
    bad = list(sizes); bad[2] += 1; bad[5] += 1      # two files "changed" since the walk
    try:
        filehash.digests(root, rels, "sha256", jobs, bad)
    except filehash.Changed as exc:
        errors.append(str(exc).split(":")[0])
print(json.dumps({"same": one == forked == threaded, "n": len(one), "errors": errors,
                  "third": os.path.join(root, rels[2])}))
"""


def test_digests_by_forked_workers_are_the_threads_and_raise_the_first_error(tmp_path):
    root = tmp_path / "files"
    root.mkdir()
    for i in range(12):
        (root / f"f{i:02d}").write_bytes(os.urandom(1000 * (12 - i) ** 2))
    done = subprocess.run(
        [sys.executable, "-c", FORKED, str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(KIT)),
    )
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout)
    assert r["same"] and r["n"] == 12
    assert r["errors"] == [r["third"], r["third"]]  # the first in the list's order, both ways


def test_a_byte_count_in_words_is_one_rule_for_the_kit_and_the_compiler():
    """rbrules.units.human, which the stream, the report and the compiler use: decimal units,
    and `-` for a size that was not measured (units.human said `None`)."""
    assert [units.human(n) for n in (0, 999, 1000, 786.4e6, 2.5e12, 7e15)] == [
        "0 B",
        "999 B",
        "1.0 KB",
        "786.4 MB",
        "2.5 TB",
        "7000.0 TB",
    ]
    assert units.human(None) == units.human("?") == units.human(True) == "-"


def test_which_compressions_a_host_has_is_one_rule():
    """The kit's (rbrules.compression.compressors) and the runbook's bash (`command -v` of each of
    COMPRESSOR_TOOLS, rendered from the same table) ask for the same tools."""
    assert compression.compressors(lambda tool: None) == ["none"]
    assert compression.compressors(lambda tool: tool == "lz4" or None) == ["lz4", "none"]
    assert set(compression.COMPRESSOR_TOOLS) == {
        c["tool"] for c in compression.COMPRESSION.values()
    } - {None}
    tools = " ".join(compression.COMPRESSOR_TOOLS)
    assert f'for t in {tools}; do if command -v "$t"' in kit.runtime_text()
