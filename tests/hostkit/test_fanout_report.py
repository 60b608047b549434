"""The node report's wire format and the comparison, without a cluster: chunks from several nodes
interleaved the way srun can forward them, prefixes of every engine, a lost chunk."""

from __future__ import annotations

import io
import json
import random

from rbkit import fanout, fanreports


def lines_of(doc: dict) -> list[str]:
    buf = io.StringIO()
    fanreports.emit(doc, buf)
    return buf.getvalue().splitlines()


def report(node: str, ok: bool = True, pad: int = 5000) -> dict:
    return {
        "node": node,
        "ok": ok,
        "steps": [{"id": "extract", "ok": True, "rc": 0}],
        "probe": {
            "checks": [
                {"id": "imports", "status": "pass", "values": {"blob": "x" * pad, "node": "same"}}
            ]
        },
    }


def test_every_line_fits_one_slurm_io_message():
    for line in lines_of(report("node01", pad=20000)):
        assert len(line.encode()) < 1024


def test_interleaved_prefixed_chunks_are_put_back_together_per_node():
    docs = {f"node{i:02d}": report(f"node{i:02d}", pad=3000 + i * 777) for i in range(1, 9)}
    lines = []
    for i, (name, doc) in enumerate(docs.items()):
        prefix = [f"{name}: ", f"{i}: ", ""][i % 3]  # clush, srun --label, bare
        lines += [prefix + ln for ln in lines_of(doc)]
    random.Random(7).shuffle(lines)
    lines.insert(3, "srun: error: node09: task 8: Killed")
    assert fanreports.parse_reports(lines) == docs


def test_a_report_with_a_lost_or_garbled_chunk_is_no_report():
    a, b = lines_of(report("node01")), lines_of(report("node02"))
    assert len(a) > 2
    got = fanreports.parse_reports(a[:1] + a[2:] + b[:-1] + [b[-1][:-3]])  # cut short: not JSON
    assert got == {}
    assert fanreports.parse_reports(lines_of({"node": "n1", "ok": True})) == {
        "n1": {"node": "n1", "ok": True}
    }


def test_a_chunk_claiming_another_node_is_not_mixed_in():
    a = lines_of(report("node01"))
    forged = [ln.replace("RBFAN node01", "RBFAN node02") for ln in a]
    assert set(fanreports.parse_reports(a + forged)) == {"node01"}


def test_compare_folds_equal_rows_and_names_odd_and_missing():
    reports = {n: report(n) for n in ("n1", "n2", "n3")}
    reports["n3"]["probe"]["checks"][0]["values"]["node"] = "other"
    result = fanout.compare(
        ["n1", "n2", "n3", "n4"], reports, ["srun: error: n4: task 3: Killed"], "3"
    )
    assert result["groups"] == [["n1", "n2"], ["n3"]]
    assert "check:imports.node" in result["odd"]["n3"][0]
    assert result["missing"]["n4"] == ["srun: error: n4: task 3: Killed"]
    assert result["passed"]
    assert "3/4 nodes passed" in fanout.table(result)
    json.dumps(result)


def test_fold_names():
    assert fanreports.fold(["node01", "node02", "node03", "node05"]) == "node[01-03,05]"
    assert fanreports.fold(["a1", "b2"]) == "a1,b2"


def test_a_node_that_reports_its_full_hostname_is_matched_to_the_spec_name():
    reports = {
        "node01.cluster.example": report("node01.cluster.example"),
        "node02": report("node02"),
        "stranger": report("stranger"),
    }
    got = fanreports.match_nodes(["node01", "node02"], reports)
    assert set(got) == {"node01", "node02"} and got["node01"]["node"] == "node01"


def _grow(path, chunks):
    """A fake clock and sleep that append the next chunk of engine output at each sleep."""
    state = {"t": 0.0, "i": 0}

    def clock():
        return state["t"]

    def sleep(s):
        state["t"] += s
        if state["i"] < len(chunks):
            with open(path, "a") as f:
                f.write(chunks[state["i"]])
            state["i"] += 1

    return clock, sleep


def test_watch_says_each_node_as_it_finishes_and_stops_when_all_reported(tmp_path):
    """Fan-out progress (issue #18): nodes done / total as they finish, from the engine's output
    as it grows; a report cut mid-line counts only once its line is whole."""
    out_path = tmp_path / "install.out"
    out_path.write_text("")
    a = _lines({"node": "n1", "ok": True, "steps": []}, prefix="n1: ")
    b = _lines({"node": "n2", "ok": False, "steps": [{"id": "verify", "ok": False}]}, prefix="n2: ")
    text_b = "".join(b)
    chunks = ["noise from clush\n", "".join(a), text_b[:10], text_b[10:], "", ""]
    clock, sleep = _grow(out_path, chunks)
    said = io.StringIO()
    rc = fanout.watch(
        ["n1", "n2", "n3"],
        str(out_path),
        str(tmp_path / "ended"),
        every=10,
        limit=60,
        out=said,
        clock=clock,
        sleep=sleep,
    )
    assert rc == 0
    lines = said.getvalue().splitlines()
    assert lines[0].startswith("n1 ok: 1/3 nodes done, 2 running")
    assert lines[1].startswith("n2 failed in verify: 2/3 nodes done (1 not ok), 1 running")
    # n3 never reports: a line at least every 10 s, then the limit ends the watch
    assert any(line.startswith("2/3 nodes done (1 not ok), 1 running, ") for line in lines[2:])
    assert lines[-1].startswith("2/3 nodes done (1 not ok), 1 running when the round ended")


def test_a_node_verdict_names_the_failed_step_or_checks():
    assert fanout._verdict({"ok": True, "steps": []}) == "ok"
    assert fanout._verdict({"ok": True, "up_to_date": "same tree", "steps": []}) == "up to date"
    assert fanout._verdict({"needs_full": "x", "steps": []}) == "needs the whole bundle"
    probe = {"checks": [{"id": "imports", "status": "fail"}, {"id": "matmul", "status": "pass"}]}
    assert (
        fanout._verdict({"ok": False, "steps": [{"id": "probe", "ok": False}], "probe": probe})
        == "failed check imports"
    )
    assert (
        fanout._verdict({"ok": False, "steps": [{"id": "probe", "ok": True}], "probe": probe})
        == "failed check imports"
    )
    assert (
        fanout._verdict({"ok": False, "steps": [{"id": "swap", "ok": False}]}) == "failed in swap"
    )


def test_watch_ends_when_the_round_ends(tmp_path):
    out_path = tmp_path / "install.out"
    out_path.write_text("".join(_lines({"node": "n1", "ok": True, "steps": []})))
    (tmp_path / "ended").write_text("")
    said = io.StringIO()
    fanout.watch(
        ["n1", "n2"],
        str(out_path),
        str(tmp_path / "ended"),
        every=10,
        limit=60,
        out=said,
        clock=lambda: 0.0,
        sleep=lambda s: None,
    )
    assert said.getvalue().splitlines() == [
        "n1 ok: 1/2 nodes done, 1 running, 0 s",
        "1/2 nodes done, 1 running when the round ended, 0 s",
    ]


def _lines(doc: dict, prefix: str = "") -> list[str]:
    return [prefix + line + "\n" for line in lines_of(doc)]


def test_watch_ends_when_the_runbook_that_started_it_is_gone(tmp_path, monkeypatch):
    """A run stopped mid-round (^C, killed) leaves no watcher printing: it ends when its parent
    changes (the runbook's background job is gone)."""
    out_path = tmp_path / "install.out"
    out_path.write_text("")
    parents = iter([100, 100, 1])
    monkeypatch.setattr(fanout.os, "getppid", lambda: next(parents, 1))
    said = io.StringIO()
    naps = []
    rc = fanout.watch(
        ["n1", "n2"],
        str(out_path),
        str(tmp_path / "ended"),
        every=10,
        limit=3600,
        out=said,
        clock=lambda: 0.0,
        sleep=naps.append,
    )
    assert rc == 0 and len(naps) == 1 and said.getvalue() == ""
