"""hostfs.scan's walk forked over subtrees (ScanWalk, statwalk.ForkedWalk): the same answer and
the same records, byte for byte, as one process's walk, whatever the number of workers, and
from this process again where a worker failed."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import pytest
from rbkit import hostfs, manifestfile, statwalk

PATS = ["__pycache__", "*.pyc"]


def venv_tree(root: Path) -> Path:
    """A venv of 3 x 12 subtrees with what a scan reads apart: hard links within and across
    subtrees (one of them sparse), symlinks in the venv and leaving it, a name that is not
    UTF-8, excluded names, a setuid file and a world-writable directory."""
    for a in range(3):
        for b in range(12):
            d = root / "lib" / f"p{a}" / f"m{b:02d}"
            d.mkdir(parents=True)
            for c in range(3):
                (d / f"f{c}.py").write_text("x" * (c + 7 * b))
            (d / "__pycache__").mkdir()
            (d / "__pycache__" / "f0.pyc").write_text("c")
            (d / "g.pyc").write_text("c")
            os.symlink("f1.py", d / "ln")
    (root / "bin").mkdir()
    (root / "bin" / "python").write_text("")
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    lib = root / "lib"
    os.link(lib / "p0" / "m00" / "f2.py", lib / "p2" / "m11" / "same.py")  # across subtrees
    os.link(lib / "p1" / "m05" / "f1.py", lib / "p1" / "m05" / "twin.py")  # in one
    os.link(lib / "p1" / "m05" / "f1.py", root / "top.py")  # and the root
    with open(lib / "p2" / "m03" / "holes.bin", "wb") as f:  # sparse, 2 names
        f.truncate(1 << 20)
    os.link(lib / "p2" / "m03" / "holes.bin", lib / "p0" / "m09" / "holes2.bin")
    os.symlink("/etc/passwd", lib / "p1" / "m07" / "out")  # leaves the venv
    os.symlink("../../../../..", lib / "p0" / "m02" / "up")  # so does this
    os.symlink("../m01/f0.py", lib / "p2" / "m02" / "in")  # stays in it
    os.chmod(lib / "p1" / "m08" / "f0.py", 0o4755)
    os.chmod(lib / "p0" / "m04", 0o777)
    os.mkdir(os.path.join(os.fsencode(lib / "p2"), b"bad\xff"))
    (root / "x.pyc").write_text("c")
    return root


def scanned(root: Path, tmp: Path, workers: int, **kw) -> tuple:
    names = tmp / f"names-{workers}"
    out = hostfs.scan(str(root), PATS, str(names), workers=workers, **kw)
    records = tuple(
        Path(str(names) + sfx).read_bytes()
        for sfx in ("", manifestfile.SCAN_SUFFIX, manifestfile.LINKS_SUFFIX)
    )
    return out, records


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    return venv_tree(tmp_path_factory.mktemp("scan") / "venv")


@pytest.fixture()
def forks(monkeypatch) -> list:
    """The workers each walk forked (statwalk._fork's calls, in this process)."""
    seen: list = []
    real = statwalk._fork

    def counted(unit, units, workers, started):
        seen.append(workers)
        return real(unit, units, workers, started)

    monkeypatch.setattr(statwalk, "_fork", counted)
    return seen


def test_one_process_walk_is_the_walks_own_records(venv, tmp_path):
    """The reference: names, stat lines and multi-link records as the walk gives them."""
    out, (names, stat_rec, links_rec) = scanned(venv, tmp_path, 1)
    walked = list(statwalk.walk(str(venv), PATS))
    assert names == b"".join(r.encode("utf-8", "surrogateescape") + b"\0" for r, _ in walked)
    lines = []
    for rel, st in walked:
        try:
            lines.append(manifestfile.values_line(manifestfile.stat_values(str(venv), rel, st)))
        except UnicodeEncodeError:
            pass
    assert stat_rec.endswith(b"".join(lines))
    assert out["stat_fingerprint"] == hashlib.sha256(b"".join(lines)).hexdigest()
    multi = [json.loads(x) for x in links_rec.splitlines()]
    assert [walked[i][0] for i, _d, _n in multi] == [
        r for r, st in walked if st.st_nlink > 1 and not os.path.isdir(venv / r)
    ]
    seen: set = set()
    apparent = 0
    for rel, st in walked:
        if os.path.isfile(venv / rel) and not os.path.islink(venv / rel):
            if (st.st_dev, st.st_ino) not in seen:
                apparent += st.st_size
            seen.add((st.st_dev, st.st_ino))
    assert out["bytes"] == apparent
    assert out["sparse_files"] == ["lib/p0/m09/holes2.bin"]  # its first name in the walk
    assert [e["p"] for e in out["outside_links"]] == ["lib/p0/m02/up", "lib/p1/m07/out"]
    assert "bad\\xff" in out["refusal"] and out["special_modes_count"] == 2


@pytest.mark.parametrize("workers", [2, 3, 8])
def test_forked_scan_is_the_same_bytes(venv, tmp_path, forks, workers):
    alone = scanned(venv, tmp_path, 1)
    assert forks == []
    forked = scanned(venv, tmp_path, workers)
    assert forks and forks[0] > 1  # it did fork
    assert forked == alone


@pytest.mark.parametrize("mode", ["strip", "keep"])
def test_forked_scan_strip_and_keep(venv, tmp_path, mode):
    assert scanned(venv, tmp_path, 3, special_modes=mode, outside_links="keep") == scanned(
        venv, tmp_path, 1, special_modes=mode, outside_links="keep"
    )


def test_a_dead_worker_leaves_the_walk_to_this_process(venv, tmp_path, monkeypatch, forks):
    alone = scanned(venv, tmp_path, 1)

    def dies(*args):
        os._exit(3)

    monkeypatch.setattr(hostfs, "_walked", dies)
    assert scanned(venv, tmp_path, 4) == alone
    assert forks  # it had forked


def test_a_walk_begun_before_a_thread_is_the_scans(venv, tmp_path, forks):
    """`engine source` begins the walk, then starts its reader thread, then scans."""
    alone = scanned(venv, tmp_path, 1)
    begun = hostfs.ScanWalk(str(venv), PATS, False, True, workers=3)
    t = threading.Thread(target=threading.Event().wait, args=(0.5,))
    t.start()
    try:
        assert scanned(venv, tmp_path, 1, begun=begun) == alone
    finally:
        t.join()
    assert forks == [3]


def test_a_begun_walk_of_other_settings_is_closed(venv, tmp_path):
    alone = scanned(venv, tmp_path, 1)
    begun = hostfs.ScanWalk(str(venv), PATS, True, True, workers=3)  # strip: not this scan
    pids = list(begun._forked._started["pids"])
    assert len(pids) == 3
    assert scanned(venv, tmp_path, 1, begun=begun) == alone
    for pid in pids:  # its workers were ended and waited for
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
