"""The kit's file-system tools, on real trees: manifest, relocation, swap, exports.

Over 600 lines on purpose: the four tools act on the same trees (make_tree, used by other test
files too), one section each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rbkit import (
    exports,
    filehash,
    hostfs,
    linkstage,
    manifest,
    manifestfile,
    relocate,
    statwalk,
    swapfs,
)


def make_tree(root: Path, python: bool = False) -> None:
    """A small venv-shaped tree. `python`: with bin/python, a link to this interpreter's base
    (and pyvenv.cfg naming its home), so that the tree's interpreter runs as a venv's does."""
    (root / "bin").mkdir(parents=True)
    (root / "lib" / "python3.11" / "site-packages" / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "lib" / "python3.11" / "site-packages" / "pkg" / "__init__.py").write_text("x = 1\n")
    (root / "lib" / "python3.11" / "site-packages" / "pkg" / "__pycache__" / "a.pyc").write_bytes(
        b"\0"
    )
    (root / "lib" / "python3.11" / "site-packages" / "pkg" / "data.bin").write_bytes(
        os.urandom(3 << 20)
    )
    (root / "lib64").symlink_to("lib")
    (root / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.7\n")
    tool = root / "bin" / "tool"
    tool.write_text("#!/old/venv/bin/python\nimport sys\n")
    tool.chmod(0o755)
    if python:
        base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
        (root / "bin" / "python").symlink_to(base)
        (root / "pyvenv.cfg").write_text(
            f"home = {os.path.dirname(base)}\nversion = {sys.version.split()[0]}\n"
        )


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "venv"
    make_tree(root)
    return root


def test_manifest_excludes_like_tar_and_lists_links_and_modes(tree):
    m = manifest.build(str(tree), ["__pycache__", "*.pyc"], "sha256", jobs=2)
    paths = [e["p"] for e in m["entries"]]
    assert not any("__pycache__" in p or p.endswith(".pyc") for p in paths)
    link = next(e for e in m["entries"] if e["p"] == "lib64")
    assert link == {"p": "lib64", "t": "l", "l": "lib"}
    tool = next(e for e in m["entries"] if e["p"] == "bin/tool")
    assert tool["m"] == 0o755 and len(tool["h"]) == 64
    assert m["totals"]["files"] == 4


@pytest.mark.parametrize("algo", ["sha256", "blake2b"])
def test_verify_passes_on_an_exact_copy(tree, tmp_path, algo):
    m = manifest.build(str(tree), [], algo)
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(tree), str(copy)], check=True)
    result = manifest.verify(str(copy), m, jobs=2)
    assert result["ok"], manifest.describe(result)
    assert result["hashed"] == 5


def test_verify_names_every_kind_of_difference(tree, tmp_path):
    m = manifest.build(str(tree), [], "sha256")
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(tree), str(copy)], check=True)
    data = copy / "lib" / "python3.11" / "site-packages" / "pkg" / "data.bin"
    raw = bytearray(data.read_bytes())
    raw[12345] ^= 0x01  # one flipped bit, same size
    data.write_bytes(bytes(raw))
    (copy / "pyvenv.cfg").unlink()
    (copy / "bin" / "extra").write_text("x")
    (copy / "bin" / "tool").chmod(0o644)
    (copy / "lib64").unlink()
    (copy / "lib64").symlink_to("/usr/lib")
    result = manifest.verify(str(copy), m)
    assert not result["ok"]
    text = "\n".join(manifest.describe(result))
    assert "missing: pyvenv.cfg" in text
    assert "extra:   bin/extra" in text
    assert "differs: lib/python3.11/site-packages/pkg/data.bin (content" in text
    assert "differs: bin/tool (m:" in text
    assert "differs: lib64 (l: expected lib, found /usr/lib)" in text


def test_manifest_roundtrip_and_cli_exit_codes(tree, tmp_path):
    out = tmp_path / "m.jsonl"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "hostkit"))

    def run(*words):
        return subprocess.run(
            [sys.executable, "-m", "rbkit", *words], env=env, capture_output=True, text=True
        )

    r = run("manifest", "build", str(tree), "--out", str(out), "--exclude", "*.pyc")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["totals"]["files"] == 4
    assert manifestfile.load(str(out))["totals"]["files"] == 4
    assert run("manifest", "verify", str(tree), str(out)).returncode == 0  # excluded .pyc: fine
    (tree / "bin" / "new").write_text("not in the manifest")
    r = run("manifest", "verify", str(tree), str(out))
    assert r.returncode == 1 and "extra:   bin/new" in r.stderr
    (tree / "bin" / "new").unlink()
    assert run("manifest", "verify", str(tree), str(out)).returncode == 0


def test_truncated_manifest_is_refused(tree, tmp_path):
    out = tmp_path / "m.jsonl"
    with open(out, "w") as f:
        manifestfile.dump(manifest.build(str(tree)), f)
    lines = out.read_text().splitlines(True)
    out.write_text("".join(lines[:-1]))
    with pytest.raises(ValueError, match="not a complete manifest"):
        manifestfile.load(str(out))


def test_relocate_rewrites_shebangs_activate_and_trampolines(tmp_path):
    root = tmp_path / "v"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tool").write_text("#!/old/venv/bin/python3\nprint('/old/venv2 stays')\n")
    (root / "bin" / "long").write_text(
        "#!/bin/sh\n'''exec' \"/old/venv/bin/python\" \"$0\" \"$@\"\n' '''\nimport sys\n"
    )
    (root / "bin" / "activate").write_text('VIRTUAL_ENV="/old/venv"\nexport VIRTUAL_ENV\n')
    (root / "bin" / "python").symlink_to("/usr/bin/python3")
    (root / "bin" / "blob").write_bytes(b"\0/old/venv")
    (root / "pyvenv.cfg").write_text("command = /usr/bin/python3 -m venv /old/venv\n")
    result = relocate.relocate(str(root), "/old/venv", "/new/place")
    assert sorted(result["rewritten"]) == ["bin/activate", "bin/long", "bin/tool", "pyvenv.cfg"]
    assert (
        root / "bin" / "tool"
    ).read_text() == "#!/new/place/bin/python3\nprint('/old/venv2 stays')\n"
    assert '"/new/place/bin/python"' in (root / "bin" / "long").read_text()
    assert 'VIRTUAL_ENV="/new/place"' in (root / "bin" / "activate").read_text()
    assert (root / "bin" / "blob").read_bytes() == b"\0/old/venv", "binaries are left alone"
    assert result["remaining"] == []


def test_relocate_turns_a_too_long_shebang_into_a_trampoline(tmp_path):
    root = tmp_path / "v"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tool").write_text("#!/o/bin/python\nimport sys\nprint(sys.argv)\n")
    (root / "bin" / "tool").chmod(0o755)
    new = "/" + "deep/" * 30 + "venv"
    relocate.relocate(str(root), "/o", new)
    text = (root / "bin" / "tool").read_text()
    assert text.startswith("#!/bin/sh\n'''exec' \"" + new + '/bin/python"')
    assert os.stat(root / "bin" / "tool").st_mode & 0o777 == 0o755


def test_relocated_console_script_really_runs(tmp_path):
    src = tmp_path / "a" / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(src)], check=True)
    script = src / "bin" / "hello"
    script.write_text(f"#!{src}/bin/python\nimport sys\nprint(sys.prefix)\n")
    script.chmod(0o755)
    dst = tmp_path / "b" / "moved"
    dst.parent.mkdir()
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    relocate.relocate(str(dst), str(src), str(dst))
    out = subprocess.run([str(dst / "bin" / "hello")], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(dst)


def test_swap_refuse_backup_replace_and_restore(tmp_path):
    dest = tmp_path / "venv"

    def staged(tag):
        st = tmp_path / ".venv.rb-staging"
        st.mkdir()
        (st / "tag").write_text(tag)
        return st

    assert swapfs.swap(str(staged("one")), str(dest), "refuse")["previous"] == "none"
    with pytest.raises(FileExistsError):
        swapfs.swap(str(staged("two")), str(dest), "refuse")
    assert (dest / "tag").read_text() == "one", "refuse leaves the destination alone"
    result = swapfs.swap(str(tmp_path / ".venv.rb-staging"), str(dest), "backup")
    assert result["previous"].endswith("venv.rb-backup.1") and result["atomic"]
    assert (dest / "tag").read_text() == "two"
    swapfs.swap(str(staged("three")), str(dest), "backup")
    assert (tmp_path / "venv.rb-backup.2" / "tag").read_text() == "two"
    swapfs.restore(str(dest))
    assert (dest / "tag").read_text() == "two"
    # the install it replaced: the newest backup, under a new number (issue 34)
    assert (tmp_path / "venv.rb-backup.3" / "tag").read_text() == "three"
    swapfs.swap(str(staged("four")), str(dest), "replace")
    assert (dest / "tag").read_text() == "four"
    assert not (tmp_path / ".venv.rb-staging").exists()


def test_exports_put_venv_library_dirs_first(tmp_path):
    venv = tmp_path / "venv"
    lib = venv / "lib" / "python3.12" / "site-packages" / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    text, summary = exports.render(
        str(venv), "/usr/local/cuda-13.0", ["nvidia/cu13/lib"], {"NCCL_NVLS_ENABLE": "0"}, "test"
    )
    env_file = tmp_path / "env.sh"
    env_file.write_text(text)
    out = subprocess.run(
        [
            "bash",
            "-c",
            'LD_LIBRARY_PATH=/sys/lib; source "$1"; '
            'printf "%s\\n" "$LD_LIBRARY_PATH" "$CUDA_HOME" "$NCCL_NVLS_ENABLE"',
            "_",
            str(env_file),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out[0] == f"{lib}:/usr/local/cuda-13.0/lib64:/sys/lib"
    assert out[1:] == ["/usr/local/cuda-13.0", "0"]
    assert summary["missing_dirs"] == []
    _text, summary = exports.render(str(venv), "", ["nvidia/cu12/lib"], {}, "test")
    assert summary["missing_dirs"] == [str(venv / "lib/python3.12/site-packages/nvidia/cu12/lib")]


def test_kit_files_compile_under_python_3_9():
    py39 = Path("/root/.pyenv/versions/3.9.18/bin/python3")
    if not py39.exists():
        pytest.skip("python 3.9 is not installed here")
    kit = Path(__file__).resolve().parents[2] / "hostkit" / "rbkit"
    for f in sorted(kit.glob("*.py")):
        r = subprocess.run(
            [str(py39), "-c", "import ast,sys; ast.parse(open(sys.argv[1]).read())", str(f)],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, (f, r.stderr)


def test_caches_the_move_excluded_may_appear_at_the_destination(tree, tmp_path):
    m = manifest.build(str(tree), ["__pycache__", "*.pyc"], "sha256")
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(tree), str(copy)], check=True)
    (copy / "bin" / "__pycache__").mkdir()
    (copy / "bin" / "__pycache__" / "tool.cpython-311.pyc").write_bytes(b"\0")
    result = manifest.verify(str(copy), m)
    assert result["ok"], manifest.describe(result)
    (copy / "bin" / "new-script").write_text("x")
    assert not manifest.verify(str(copy), m)["ok"], "anything else extra is still caught"


def test_quick_check_spots_a_changed_source_or_destination_without_reading(tree, tmp_path):
    m = manifest.build(str(tree), ["*.pyc"], "sha256")
    installed = manifest.relocated(m, {}, manifestfile.fingerprint(m))
    dest = tmp_path / "dest"
    subprocess.run(["cp", "-a", str(tree), str(dest)], check=True)
    source_stat = hostfs.scan(str(tree), ["*.pyc"])["stat_fingerprint"]
    assert manifest.quick_check(str(dest), installed, source_stat)["ok"]
    tool = dest / "bin" / "tool"
    tool.write_text(tool.read_text() + "# edited on the destination\n")
    result = manifest.quick_check(str(dest), installed, source_stat)
    assert not result["ok"] and result["changed"] == ["bin/tool"]
    (tree / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.10\n")  # size changes
    source_stat = hostfs.scan(str(tree), ["*.pyc"])["stat_fingerprint"]
    assert "source changed" in manifest.quick_check(str(dest), installed, source_stat)["why"]


def test_digests_of_many_files_by_threads_are_each_files_in_order(tmp_path):
    """filehash.digests: threads taking paths from one iterator give each path its own file's
    digest, in the order asked (sizes around the read size, so one buffer is reused short and
    long); the first failure in that order is raised, after every thread stopped."""
    import hashlib
    import random

    rng = random.Random(7)
    rels = []
    for i in range(300):
        size = rng.choice((0, 1, 511, filehash.CHUNK - 1, filehash.CHUNK, filehash.CHUNK + 3))
        rel = f"d{i % 7}/f{i}"
        (tmp_path / f"d{i % 7}").mkdir(exist_ok=True)
        (tmp_path / rel).write_bytes(rng.randbytes(size))
        rels.append(rel)
    want = [hashlib.sha256((tmp_path / r).read_bytes()).hexdigest() for r in rels]
    for jobs in (1, 2, 5):
        assert filehash.digests(str(tmp_path), rels, "sha256", jobs) == want, jobs
    blake = [hashlib.blake2b((tmp_path / r).read_bytes(), digest_size=32).hexdigest() for r in rels]
    assert filehash.digests(str(tmp_path), rels, "blake2b", 3) == blake
    assert filehash.digests(str(tmp_path), [], "sha256", 4) == []
    # a link where a file was (O_NOFOLLOW) and a path gone: the earlier one in the list is raised
    os.symlink("f0", tmp_path / "d1" / "link")
    bad = rels[:100] + ["d1/link"] + rels[100:200] + ["gone"] + rels[200:]
    for jobs in (1, 4):
        with pytest.raises(OSError) as info:
            filehash.digests(str(tmp_path), bad, "sha256", jobs)
        assert info.value.filename.endswith("d1/link"), jobs


def test_a_build_from_the_scan_record_is_the_walked_build_and_only_for_that_walk(tree, tmp_path):
    """hostfs.scan writes, beside the names it lists for tar, their stat lines (the scan record);
    manifest.build(scanned=) takes its entries from there and gives the manifest a new walk would,
    stat fingerprint included. A record of another walk (other excludes, strip rule or root) is
    not used: the build walks."""
    excl = ["__pycache__", "*.pyc"]
    for odd in ("new\nline", "sep\u2028ara\u2029tor", "cr\rx"):  # one entry each, in any text
        (tree / "lib" / odd).write_text(odd)
    names = tmp_path / "run.names"
    info = hostfs.scan(str(tree), excl, str(names))
    record = tmp_path / ("run.names" + manifestfile.SCAN_SUFFIX)
    assert record.is_file() and oct(record.stat().st_mode & 0o777) == "0o600"
    walked = manifest.build(str(tree), excl, "sha256", jobs=2)
    got = manifest.build(str(tree), excl, "sha256", jobs=2, scanned=str(record))
    assert got["entries"] == walked["entries"] and got["header"] == walked["header"]
    assert got["header"]["stat_fingerprint"] == info["stat_fingerprint"]
    assert [e["p"].encode() for e in got["entries"]] == names.read_bytes().split(b"\0")[:-1]
    # the record is what is used: a file added after the scan is not in the manifest
    (tree / "bin" / "late").write_text("x")
    again = manifest.build(str(tree), excl, "sha256", 2, scanned=str(record))
    assert "bin/late" not in {e["p"] for e in again["entries"]}
    # another walk's record: walked again (the new file is there)
    for args, kw in (
        ((str(tree), [], "sha256", 2), {}),
        ((str(tree), excl, "sha256", 2), {"strip_special": True}),
        ((str(tree) + "/", excl, "sha256", 2), {}),
    ):
        other = manifest.build(*args, scanned=str(record), **kw)
        assert "bin/late" in {e["p"] for e in other["entries"]}, (args, kw)
    assert "bin/late" in {
        e["p"]
        for e in manifest.build(str(tree), excl, "sha256", 2, scanned=str(tmp_path / "none"))[
            "entries"
        ]
    }


def test_a_file_that_changed_size_since_the_scan_fails_the_build_by_name(tree, tmp_path):
    """A digest is never given to an entry whose file has grown or shrunk since it was seen: the
    build stops, naming the file (before: the manifest had the old size with the new content's
    digest, and the copy failed verify as a content mismatch at the destination)."""
    excl = ["__pycache__", "*.pyc"]
    hostfs.scan(str(tree), excl, str(tmp_path / "n"))
    init = tree / "lib" / "python3.11" / "site-packages" / "pkg" / "__init__.py"
    init.write_text("x = 1\ny = 2\n")
    with pytest.raises(filehash.Changed, match=r"__init__\.py: 12 bytes read, 6 when"):
        manifest.build(
            str(tree), excl, "sha256", 2, scanned=str(tmp_path / ("n" + manifestfile.SCAN_SUFFIX))
        )
    # the check itself, whatever gave the size: a digest of other bytes than seen is refused
    rel = "lib/python3.11/site-packages/pkg/__init__.py"
    with pytest.raises(filehash.Changed):
        filehash.digests(
            str(tree), ["pyvenv.cfg", rel], "sha256", 2, [(tree / "pyvenv.cfg").stat().st_size, 6]
        )
    # walked: the entry and the digest are of the same file
    m = manifest.build(str(tree), excl, "sha256", 2)
    assert {e["p"]: e.get("s") for e in m["entries"]}[rel] == 12


# -- incremental install: digests reused on the source, unchanged files linked into staging


def install(tree: Path, dest: Path) -> dict:
    """What a finished run leaves: a copy of `tree` at `dest` and its manifest."""
    subprocess.run(["cp", "-a", str(tree), str(dest)], check=True)
    return manifest.build(str(tree), ["__pycache__", "*.pyc"], "sha256", jobs=2)


def test_build_reuses_digests_of_unchanged_files_only(tree, tmp_path):
    before = manifest.build(str(tree), [], "sha256", jobs=2)
    pkg = tree / "lib" / "python3.11" / "site-packages" / "pkg"
    (pkg / "__init__.py").write_text("x = 22\n")
    poisoned = {
        "header": before["header"],
        "entries": [dict(e, h="0" * 64) if e.get("t") == "f" else e for e in before["entries"]],
        "totals": before["totals"],
    }
    again = manifest.build(str(tree), [], "sha256", jobs=2, reuse=poisoned)
    by = {e["p"]: e for e in again["entries"]}
    rel = "lib/python3.11/site-packages/pkg/"
    assert by[rel + "data.bin"]["h"] == "0" * 64  # unchanged: taken unread
    assert by[rel + "__init__.py"]["h"] != "0" * 64  # changed size: read
    assert by["pyvenv.cfg"]["h"] != "0" * 64  # relocatable: always read
    assert by["bin/tool"]["h"] != "0" * 64
    assert again["reused"] == 2  # data.bin and the .pyc
    other = dict(poisoned, header=dict(poisoned["header"], algo="blake2b"))
    assert manifest.build(str(tree), [], "sha256", jobs=2, reuse=other)["reused"] == 0


def test_stage_links_unchanged_files_and_lists_the_rest(tree, tmp_path):
    dest = tmp_path / "dest"
    installed = install(tree, dest)
    pkg = tree / "lib" / "python3.11" / "site-packages" / "pkg"
    (pkg / "__init__.py").write_text("x = 22\n")
    (pkg / "new.py").write_text("y = 1\n")
    new = manifest.build(str(tree), ["__pycache__", "*.pyc"], "sha256", jobs=2)
    dest_data = dest / "lib" / "python3.11" / "site-packages" / "pkg" / "data.bin"
    staging = tmp_path / ".dest.rb-staging"
    names = tmp_path / "names"
    info = linkstage.stage(str(dest), str(staging), new, installed, str(names))
    send = names.read_bytes().split(b"\0")[:-1]
    assert info["linked"] == 1 and info["send_files"] == 4  # __init__, new, tool, pyvenv.cfg
    staged = staging / "lib" / "python3.11" / "site-packages" / "pkg" / "data.bin"
    assert os.stat(staged).st_ino == os.stat(dest_data).st_ino
    assert b"lib/python3.11/site-packages/pkg/new.py" in send and b"bin/tool" in send
    assert b"lib64" in send and b"lib" in send  # links and dirs travel in tar
    # verify trusts the link by stat, and reads nothing it linked
    subprocess.run(
        [
            "tar",
            "-C",
            str(tree),
            "--null",
            "--no-recursion",
            "-T",
            str(names),
            "-cf",
            str(tmp_path / "d.tar"),
        ],
        check=True,
    )
    subprocess.run(["tar", "-C", str(staging), "-xf", str(tmp_path / "d.tar")], check=True)
    result = manifest.verify(str(staging), new, jobs=2, linked_from=str(dest))
    assert result["ok"] and result["linked"] == 1, result
    # a file changed at the destination since the install is not linked (a stat-level check,
    # like the quick re-run check: same size in the same second would pass, `rerun: digest` won't)
    dest_data.write_bytes(os.urandom((3 << 20) + 1))
    info = linkstage.stage(str(dest), str(staging), new, installed, str(names))
    assert info["linked"] == 0 and info["send_files"] == 5
    assert dest_data.exists() and not (staging / "bin" / "tool").exists()


def test_relocation_rewrites_the_prefix_the_venv_records_when_the_spec_names_another(tmp_path):
    """A venv copied with `cp -a` (or reached through a link) names the path it was made at in
    its scripts, not the path a spec gives: relocation rewrites both (the relocation proof found
    this: such an install ran its console scripts with the original venv's interpreter)."""
    made = tmp_path / "made" / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(made)], check=True)
    (made / "bin" / "tool").write_text(f"#!{made}/bin/python\nprint('hi')\n")
    (made / "bin" / "tool").chmod(0o755)
    copied = tmp_path / "copied"
    subprocess.run(["cp", "-a", str(made), str(copied)], check=True)
    new = tmp_path / "new" / "venv"
    assert relocate.recorded_prefix(str(copied)) == str(made)
    out = relocate.relocate(str(copied), str(copied), str(new))
    assert out["old_prefixes"] == [str(copied), str(made)]
    assert "bin/tool" in out["rewritten"] and "bin/activate" in out["rewritten"]
    assert (copied / "bin" / "tool").read_text().startswith(f"#!{new}/bin/python\n")
    assert str(made) not in (copied / "bin" / "activate").read_text()
    assert out["remaining"] == []


def test_a_declared_gpu_that_no_check_proved_is_said_as_such(tmp_path):
    """Issue #16: a spec with gpu: whose GPU checks were skipped (allow_skip) does not read as a
    pass: report.json and the summary say the GPU was not proven."""
    from rbkit import report

    probe = tmp_path / "probe.json"
    probe.write_text(
        json.dumps(
            {
                "checks": [
                    {"id": "torch", "type": "torch", "status": "pass"},
                    {"id": "devices", "type": "devices", "status": "skip"},
                    {"id": "matmul", "type": "matmul", "status": "skip"},
                ],
                "summary": {"pass": 1, "fail": 0, "skip": 2},
            }
        )
    )
    doc = report.build(
        "x",
        "specs/x.yaml",
        "0" * 64,
        str(tmp_path / "none.tsv"),
        {"b300": str(probe)},
        "ok",
        gpu=True,
    )
    assert doc["gpu"] == {
        "declared": True,
        "proven": False,
        "unproven": ["b300: devices skipped", "b300: matmul skipped"],
    }
    assert "GPU NOT PROVEN" in report.table(doc)
    probe.write_text(
        json.dumps(
            {
                "checks": [{"id": "devices", "type": "devices", "status": "pass"}],
                "summary": {"pass": 1, "fail": 0, "skip": 0},
            }
        )
    )
    doc = report.build(
        "x",
        "specs/x.yaml",
        "0" * 64,
        str(tmp_path / "none.tsv"),
        {"b300": str(probe)},
        "ok",
        gpu=True,
    )
    assert doc["gpu"]["proven"] and "GPU NOT PROVEN" not in report.table(doc)
    assert "gpu" not in report.build("x", "s", "0", str(tmp_path / "none.tsv"), {}, "ok")


@pytest.mark.parametrize("odd", ["x y", "$(touch CANARY)", "a'b\"c", "`touch CANARY`"])
def test_a_destination_path_no_shebang_can_hold_gets_the_trampoline_that_names_no_path(
    odd, tmp_path
):
    """A space ends a shebang's path, and `$(...)` or backquotes would run inside a trampoline's
    double quotes: the rewritten script finds its interpreter
    beside itself (pip's form), runs, and the relocation proof reads it (the always-on check found
    the broken shebang at a destination with a space)."""
    from rbprobes import checks_venv

    new = tmp_path / odd / "venv"
    (new / "bin").mkdir(parents=True)
    (new / "bin" / "python").symlink_to(sys.executable)
    for src in (
        b"#!/old/venv/bin/python\nimport sys; print(sys.executable)\n",
        b"#!/bin/sh\n'''exec' \"/old/venv/bin/python\" \"$0\" \"$@\"\n' '''\n"
        b"import sys; print(sys.executable)\n",
    ):
        out = relocate.rewrite_bytes(src, "/old/venv", str(new))
        assert out.startswith(
            b'#!/bin/sh\n\'\'\'exec\' "$(dirname -- "$(realpath -- "$0")")/python"'
        )
        assert out.count(b"' '''") == 1
        script = new / "bin" / "tool"
        script.write_bytes(out)
        script.chmod(0o755)
        r = subprocess.run([str(script)], capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 0 and r.stdout.strip() == str(new / "bin" / "python"), r
        assert not (tmp_path / "CANARY").exists()
        info, problem = checks_venv._judge_interpreter(str(script), out, str(new), "/usr/bin")
        assert problem is None and info["interpreter"] == str(new / "bin" / "python")
    plain = relocate.rewrite_bytes(b"#!/old/venv/bin/python\n", "/old/venv", "/opt/venv")
    assert plain == b"#!/opt/venv/bin/python\n"  # a plain short path keeps its shebang


def test_excludes_match_a_path_or_any_of_its_tails_as_fnmatch_would():
    """statwalk.excluded (a name set and suffixes for `NAME` and `*TEXT` patterns, one regex for
    the rest); the rule it must keep: a pattern matches the path, or the path from any of its
    components on, by fnmatch (where * crosses "/"). Fixed lists, then random ones."""
    import fnmatch
    import random

    def reference(rel, patterns):
        parts = rel.split("/")
        return any(
            fnmatch.fnmatchcase("/".join(parts[i:]), p) for p in patterns for i in range(len(parts))
        )

    rnd = random.Random(17)
    comps = [
        "a",
        "b",
        "__pycache__",
        "x.pyc",
        "lib",
        "t.py",
        "[x]",
        "a.b",
        "cu13",
        ".git",
        "c d",
        "é",
        "*",
        "?q",
        "a\nb",
    ]
    for patterns in (
        ["__pycache__", "*.pyc"],
        ["lib/*.py"],
        ["a/b"],
        ["*/cu13/*"],
        ["[ab]"],
        ["?"],
        ["*"],
        [".git", "t.py"],
        ["\\*"],
        ["a*b"],
        ["**/x.pyc"],
        ["[!a]"],
        ["x.pyc/"],
        ["/a"],
        ["a\nb"],
        ["__pycache__", "*.pyc", "a*b"],
        ["*x.pyc", "b"],
        ["*é", "c d"],
        ["*\nb"],
        [""],
        ["*", "a"],
        ["*.b", "lib/*.py"],
        ["*[x]"],
        ["pyc"],
        ["*.pyc", "*b"],
    ):
        for _ in range(600):
            rel = "/".join(rnd.choice(comps) for _ in range(rnd.randint(1, 6)))
            assert statwalk.excluded(rel, patterns) == reference(rel, patterns), (rel, patterns)
    alphabet = ["a", "b", ".", "/", "*", "?", "[", "]", "!", "é", "\n", "\\", "pyc", "x.pyc"]
    for _ in range(1500):
        patterns = [
            "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 5)))
            for _ in range(rnd.randint(1, 3))
        ]
        for _ in range(20):
            rel = "/".join(rnd.choice(comps) for _ in range(rnd.randint(1, 5)))
            assert statwalk.excluded(rel, patterns) == reference(rel, patterns), (rel, patterns)
    assert not statwalk.excluded("a/b", [])


def test_a_stat_line_is_the_json_modules_bytes(tree):
    """stat_line writes the JSON itself for str/int/None values: the stat fingerprints it makes
    must stay those of earlier installs, so it is held to json.dumps byte for byte."""
    import random

    def reference(e):
        return (
            json.dumps([e.get(k) for k in manifestfile.STAT_KEYS], ensure_ascii=False).encode()
            + b"\n"
        )

    for e in manifest.build(str(tree), [], "none")["entries"]:
        assert manifestfile.stat_line(e) == reference(e)
    rnd = random.Random(5)
    alpha = ["a", '"', "\\", "\n", "\x00", "\x1f", "é", "\u2028", "😀", "/", " ", "\x7f", "\t"]
    for _ in range(3000):
        e = {
            "p": "".join(rnd.choice(alpha) for _ in range(rnd.randint(0, 8))),
            "t": rnd.choice("fdl?"),
            "m": rnd.choice([0, 420, 0o7777, None]),
            "s": rnd.choice([0, 1, 2**40, None, -1]),
            "l": rnd.choice([None, 'x"y', "é/\n"]),
            "mt": rnd.choice([None, 0, 1700000000, True, 1.5]),
        }
        if rnd.random() < 0.2:
            del e["m"]
        assert manifestfile.stat_line(e) == reference(e), e


def test_an_entry_line_is_the_json_modules_text(tree):
    """entry_line writes a hashed file's line itself: a manifest's fingerprint (what a re-run and
    the kept manifest compare) must stay the one json.dumps(sort_keys) gives, byte for byte, and
    dump/fingerprint must hash the same lines as before."""
    import hashlib
    import io
    import random

    def reference(e):
        return json.dumps(e, sort_keys=True, ensure_ascii=False)

    m = manifest.build(str(tree), [], "sha256")
    assert any(e["t"] == "f" for e in m["entries"])
    for e in m["entries"]:
        assert manifestfile.entry_line(e) == reference(e)
    rnd = random.Random(7)
    alpha = ["a", '"', "\\", "\n", "\x00", "\x1f", "é", "\u2028", "😀", "/", " ", "\x7f"]
    for _ in range(3000):
        e = {
            "p": "".join(rnd.choice(alpha) for _ in range(rnd.randint(0, 8))),
            "t": rnd.choice("ffd"),
            "m": rnd.choice([0, 420, 0o7777, True, 1.0]),
            "s": rnd.choice([0, 2**40, -1, None]),
            "mt": rnd.choice([0, -86401, 1700000000, False]),
            "h": rnd.choice(["ab" * 32, 'x"\\é', 5]),
        }
        if rnd.random() < 0.1:
            e["l"] = "x"
        if rnd.random() < 0.1:
            del e["h"]
        assert manifestfile.entry_line(e) == reference(e), e
    buf = io.StringIO()
    fp = manifestfile.dump(m, buf)
    lines = buf.getvalue().split("\n")  # not splitlines: a path may hold U+2028
    body = "".join(line + "\n" for line in lines[1:-2])
    assert fp == hashlib.sha256(body.encode()).hexdigest() == manifestfile.fingerprint(m)
    assert manifestfile.dump(dict(m, entries=[]), io.StringIO()) == hashlib.sha256(b"").hexdigest()


@pytest.mark.parametrize("strip", [False, True])
def test_a_scans_stat_values_are_those_of_its_entries(tree, strip):
    """hostfs.scan and check_tree take each entry's stat values without making the entry
    (stat_values, values_line): the same bytes as stat_line(entry_of(...)), for every kind of
    entry, odd names, special bits kept or stripped, an mtime before 1970; so the scan's
    fingerprint is the one a manifest of the same tree has."""
    odd = tree / 'a "q\\ é\u2028\ttab'
    odd.write_text("x")
    os.utime(odd, (0, -86400.5))
    (tree / "setuid").write_text("s")
    (tree / "setuid").chmod(0o4755)
    (tree / "open").mkdir(mode=0o777)
    (tree / "open").chmod(0o1777)
    os.mkfifo(tree / "fifo")
    (tree / "dangling").symlink_to('no/"where"')
    root = str(tree)
    walked = list(statwalk.walk(root, []))
    assert {st.st_mode >> 12 for _, st in walked} >= {0o10, 0o4, 0o12, 0o1}
    entries = []
    for rel, st in walked:
        e = manifestfile.entry_of(root, rel, st)
        e = manifestfile.without_special(e) if strip else e
        v = manifestfile.stat_values(root, rel, st, strip)
        mode = st.st_mode & 0o7777 & ~(manifestfile.SPECIAL_BITS if strip else 0)
        if os.path.islink(os.path.join(root, rel)):
            want = (rel, "l", None, None, os.readlink(os.path.join(root, rel)), None)
        elif os.path.isfile(os.path.join(root, rel)):
            want = (rel, "f", mode, st.st_size, None, int(st.st_mtime))
        else:
            want = (
                rel,
                "d" if os.path.isdir(os.path.join(root, rel)) else "?",
                mode,
                None,
                None,
                None,
            )
        assert v == want == tuple(e.get(k) for k in manifestfile.STAT_KEYS), rel
        assert manifestfile.values_line(v) == manifestfile.stat_line(e), rel
        entries.append(e)
    got = hostfs.scan(root, [], special_modes="strip" if strip else "keep")
    assert got["stat_fingerprint"] == manifestfile.stat_fingerprint(entries)


def test_a_name_that_is_not_utf8_is_refused_by_the_scan_and_named(tree):
    """A manifest records paths as UTF-8 text: a source entry whose name (or link target) is
    other bytes is refused before anything is sent, named with those bytes shown as \\xNN, not a
    UnicodeEncodeError from the fingerprint; left out by an exclude, the tree scans."""
    from rbkit import stream

    os.close(os.open(os.fsencode(tree) + b"/lib/caf\xe9.txt", os.O_CREAT | os.O_WRONLY, 0o644))
    os.symlink(b"to-\xff", os.fsencode(tree) + b"/odd-link")
    out = hostfs.scan(str(tree), [])
    assert "2 entries whose name or link target is not UTF-8" in out["refusal"]
    assert "lib/caf\\xe9.txt" in out["refusal"] and "odd-link" in out["refusal"]
    (tree / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tree / "bin" / "python").symlink_to(sys.executable)
    with pytest.raises(stream.SourceRefused, match="not UTF-8"):
        stream.scan_source(str(tree), [])
    assert hostfs.scan(str(tree), ["caf*", "odd-link"])["refusal"] == ""


def test_stage_never_links_through_a_link_planted_in_the_install(tree, tmp_path):
    """The install's pkg/ replaced by a link to a look-alike tree elsewhere (same names, sizes,
    modes and mtimes): stage reaches each directory without following a link, so nothing is
    linked from the look-alike; a file replaced by a link is not linked either."""
    dest = tmp_path / "dest"
    installed = install(tree, dest)
    new = manifest.build(str(tree), ["__pycache__", "*.pyc"], "sha256", jobs=2)
    site = dest / "lib" / "python3.11" / "site-packages"
    elsewhere = tmp_path / "elsewhere"
    (site / "pkg").rename(elsewhere)
    (site / "pkg").symlink_to(elsewhere)
    staging = tmp_path / ".dest.rb-staging"
    info = linkstage.stage(str(dest), str(staging), new, installed, str(tmp_path / "names"))
    assert info["linked"] == 0, info
    staged = staging / "lib" / "python3.11" / "site-packages" / "pkg"
    assert staged.is_dir() and not staged.is_symlink() and not list(staged.iterdir())
    # a file of the install that is a link now, to a file with the recorded stat
    (site / "pkg").unlink()
    (elsewhere).rename(site / "pkg")
    data = site / "pkg" / "data.bin"
    data.rename(tmp_path / "data.bin")
    data.symlink_to(tmp_path / "data.bin")
    info = linkstage.stage(str(dest), str(staging), new, installed, str(tmp_path / "names"))
    assert not (staged / "data.bin").exists(), info
    sent = (tmp_path / "names").read_bytes().split(b"\0")
    assert b"lib/python3.11/site-packages/pkg/data.bin" in sent


def test_a_loaded_manifests_fingerprint_is_that_of_its_entries(tree, tmp_path):
    """The engine takes a manifest's fingerprint from its lines as written (no entry encoded
    again): for what `save` wrote that is `fingerprint`; another writing of the same entries
    (keys in another order) gets another fingerprint, never a false equal."""
    m = manifest.build(str(tree), [], "sha256", jobs=2)
    path = tmp_path / "m.jsonl"
    saved = manifestfile.save(m, str(path))
    loaded, fp = manifestfile.load_fingerprinted(str(path))
    assert fp == saved == manifestfile.fingerprint(loaded) == manifestfile.fingerprint(m)
    lines = path.read_text().splitlines()
    lines[2] = json.dumps(json.loads(lines[2]), sort_keys=False, indent=None, separators=(",", ":"))
    path.write_text("\n".join(lines) + "\n")
    again, fp2 = manifestfile.load_fingerprinted(str(path))
    assert again["entries"] == loaded["entries"] and fp2 != fp


@pytest.mark.parametrize("standalone", [False, True], ids=["pinned", "standalone"])
def test_the_tar_sent_to_hosts_has_no_pictures(tmp_path, standalone):
    """rbview (the pictures, drawn only on the machine that runs the runbook) is in this machine's
    kit and not in the tar the runbook sends to its hosts (issue 35)."""
    import subprocess
    import tarfile

    from compiler import cli, kit

    out = tmp_path / "out"
    root = Path(__file__).resolve().parents[2]
    assert (
        cli.main(
            [str(root / "specs" / "local.yaml"), "-o", str(out)] + ["--standalone"] * standalone
        )
        == 0
    )
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run(
        [
            "bash",
            "-c",
            'source "$1" && RB_WORK=$2 && rb::kit_write "$2/kit"',
            "_",
            str(out / "local.sh"),
            str(work),
        ],
        check=True,
        timeout=60,
    )
    with tarfile.open(work / "kit.tar") as tar:
        names = tar.getnames()
    sent = {n.split("/", 1)[0] for n in names}
    assert sent == set(kit.HOST_PACKAGES), sent
    assert not [n for n in names if "pictures" in n or "rbview" in n], names
    assert sorted(p.name for p in (work / "kit").iterdir() if p.is_dir()) == sorted(kit.PACKAGES)
    assert (work / "kit" / "rbview" / "draw.py").is_file()


ODD_FILES = {
    "rbkit/zz_no_final_newline.py": "x = 1",
    "rbkit/zz_empty.py": "",
    "rbkit/zz_blank_lines_at_the_end.py": "x = 1\n\n\n",
    "rbkit/zz_odd_bytes.py": (
        "a = '\x01\x7f\u00e9\u2028'\r\nb = 2 \t\x0c\n\\\n'$(x)' '`y`' '${z}'\n"
    ),
    # lines that start as the files' separator and as heredoc delimiters do: another is chosen
    "rbview/zz_separator.py": "RB_KIT_FILE rbkit/x.py\nRB_KIT_FILE\nRB_PY_0\nPY\n",
}


def test_the_embedded_kit_is_written_byte_for_byte_by_one_process(tmp_path, monkeypatch):
    """compile --standalone: every file of the kit in one heredoc, written by one Python start
    (not a `cat` each), each file the bytes hostkit has: one without a final newline, an empty
    one, one ending in blank lines, odd bytes, a line that looks like the separator; the tar sent
    to hosts is compile's own deterministic tar of the host packages, byte for byte."""
    import hashlib
    import subprocess

    from compiler import kit, render, resolve

    real = kit.files()
    odd = [kit.KitFile(p, t) for p, t in ODD_FILES.items()]
    monkeypatch.setattr(kit, "_all_files", lambda: tuple(real + odd))
    root = Path(__file__).resolve().parents[2]
    from compiler import cli, loader, validate

    source = loader.load(cli.shown_path(root / "specs" / "local.yaml"))
    decided = resolve.resolve(validate.validate(source), source, "local.sh", standalone=True)
    assert decided.kit.separator == "RB_KIT_FILE_1"
    text = render.render(decided)
    start = text.index("rb::kit_embedded_write() {")
    assert "cat " not in text[start : text.index("<<'PY'", start)]
    assert "\nRB_KIT_FILE_1 rbkit/zz_no_final_newline.py -n\nx = 1\nRB_KIT_FILE_1 " in text
    script = tmp_path / "local.sh"
    script.write_text(text)
    work = tmp_path / "work"
    work.mkdir()
    out = subprocess.run(
        [
            "bash",
            "-c",
            'source "$1" && RB_WORK=$2 && rb::kit_write "$2/kit" && echo "${RB_KIT_TAR_SHA256}"',
            "_",
            str(script),
            str(work),
        ],
        check=True,
        timeout=60,
        capture_output=True,
        text=True,
    ).stdout
    for f in real + odd:
        assert (work / "kit" / f.path).read_bytes() == f.text.encode("utf-8"), f.path
    tar = (work / "kit.tar").read_bytes()
    assert tar == kit.tar_bytes(kit.HOST_PACKAGES, runtime=False)
    assert out.strip() == hashlib.sha256(tar).hexdigest()


def test_no_host_package_imports_the_controller_only_one():
    """A host has no rbview: no module of the shipped packages names it. The run's report, which
    draws the pictures, has its own controller-only entry (`python -m rbview report`); before,
    it was rbkit's `report` command, and the host entry point imported rbview."""
    from compiler import kit

    named = [
        f.path
        for f in kit.files()
        if f.path.split("/", 1)[0] in kit.HOST_PACKAGES and "rbview" in f.text
    ]
    assert named == []
