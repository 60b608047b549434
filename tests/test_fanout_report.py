"""The node report's wire format and the comparison, without a cluster: chunks from several nodes
interleaved the way srun can forward them, prefixes of every engine, a lost chunk."""

from __future__ import annotations

import io
import json
import random

from rbkit import fanout


def lines_of(doc: dict) -> list[str]:
    buf = io.StringIO()
    fanout.emit(doc, buf)
    return buf.getvalue().splitlines()


def report(node: str, ok: bool = True, pad: int = 5000) -> dict:
    return {"node": node, "ok": ok, "steps": [{"id": "extract", "ok": True, "rc": 0}],
            "probe": {"checks": [{"id": "imports", "status": "pass",
                                  "values": {"blob": "x" * pad, "node": "same"}}]}}


def test_every_line_fits_one_slurm_io_message():
    for line in lines_of(report("node01", pad=20000)):
        assert len(line.encode()) < 1024


def test_interleaved_prefixed_chunks_are_put_back_together_per_node():
    docs = {f"node{i:02d}": report(f"node{i:02d}", pad=3000 + i * 777) for i in range(1, 9)}
    lines = []
    for i, (name, doc) in enumerate(docs.items()):
        prefix = [f"{name}: ", f"{i}: ", ""][i % 3]        # clush, srun --label, bare
        lines += [prefix + ln for ln in lines_of(doc)]
    random.Random(7).shuffle(lines)
    lines.insert(3, "srun: error: node09: task 8: Killed")
    assert fanout.parse_reports(lines) == docs


def test_a_report_with_a_lost_or_garbled_chunk_is_no_report():
    a, b = lines_of(report("node01")), lines_of(report("node02"))
    assert len(a) > 2
    got = fanout.parse_reports(a[:1] + a[2:] + b[:-1] + [b[-1][:-3]])   # cut short: not JSON
    assert got == {}
    assert fanout.parse_reports(lines_of({"node": "n1", "ok": True})) == {
        "n1": {"node": "n1", "ok": True}}


def test_a_chunk_claiming_another_node_is_not_mixed_in():
    a = lines_of(report("node01"))
    forged = [ln.replace("RBFAN node01", "RBFAN node02") for ln in a]
    assert set(fanout.parse_reports(a + forged)) == {"node01"}


def test_compare_folds_equal_rows_and_names_odd_and_missing():
    reports = {n: report(n) for n in ("n1", "n2", "n3")}
    reports["n3"]["probe"]["checks"][0]["values"]["node"] = "other"
    result = fanout.compare(["n1", "n2", "n3", "n4"], reports,
                            ["srun: error: n4: task 3: Killed"], "3")
    assert result["groups"] == [["n1", "n2"], ["n3"]]
    assert "check:imports.node" in result["odd"]["n3"][0]
    assert result["missing"]["n4"] == ["srun: error: n4: task 3: Killed"]
    assert result["passed"]
    assert "3/4 nodes passed" in fanout.table(result)
    json.dumps(result)


def test_fold_names():
    assert fanout.fold(["node01", "node02", "node03", "node05"]) == "node[01-03,05]"
    assert fanout.fold(["a1", "b2"]) == "a1,b2"


def test_a_node_that_reports_its_full_hostname_is_matched_to_the_spec_name():
    reports = {"node01.cluster.example": report("node01.cluster.example"), "node02": report("node02"),
               "stranger": report("stranger")}
    got = fanout.match_nodes(["node01", "node02"], reports)
    assert set(got) == {"node01", "node02"} and got["node01"]["node"] == "node01"
