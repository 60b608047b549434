"""Medians, min/max and ratios from one run's records; the tables; docs/benchmarks.md."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

GROUPS = {
    "limit": (
        "The limit (null relays move N zero bytes, N = the payload's tar stream; "
        "nothing is written)"
    ),
    "runbook": "Our runbook, whole run (torch payload, destination on ext4, no checks step)",
    "peers": "Peers: what users would type instead (torch payload)",
    "rerun": "Re-run cost (torch payload; the destination already holds a copy)",
    "verify": "Verification and hashing (torch payload's files, in the page cache)",
    "many": "Many small files (the `many` payload)",
    "compile": "Compile latency (each row runs 1-2 times per round)",
}
STEP_COLS = ("preflight", "manifest", "transfer", "verify")
_LABELS: dict[str, str] = {}
REST = ("relocate", "swap", "exports", "probe")


def stats(rec: dict) -> dict:
    ok = [s["seconds"] for s in rec["samples"] if s["ok"]]
    failed = [s["error"] for s in rec["samples"] + rec["warmup"] if not s["ok"]]
    out = {"n": len(ok), "runs": len(rec["samples"]), "failed": failed}
    if ok:
        out.update(median=statistics.median(ok), min=min(ok), max=max(ok))
    return out


def step_stats(rec: dict, step: str) -> dict | None:
    vals = []
    for s in rec["samples"]:
        if not s["ok"]:
            continue
        if step == "rest":
            vals.append(sum(s["steps"].get(k, 0.0) for k in REST))
        elif step == "total":
            vals.append(s["seconds"])
        elif step in s["steps"]:
            vals.append(s["steps"][step])
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _t(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def _range(st: dict) -> str:
    return f"{_t(st['min'])}–{_t(st['max'])}"


def speed(rec: dict) -> float | None:
    st = stats(rec)
    if not rec["bytes"] or "median" not in st or st["median"] <= 0:
        return None
    return rec["bytes"] / st["median"] / 1e6


def index(result: dict) -> dict[str, dict]:
    return {r["id"]: r for r in result["records"]}


def _labels() -> dict[str, str]:
    """Row labels of the current catalogue: a stored run is shown with today's wording."""
    try:
        from .rows import catalogue

        return {r.id: r.label for r in catalogue()}
    except Exception:  # a stored result must render even if the catalogue cannot be built
        return {}


def label(rec: dict) -> str:
    return _cell(_LABELS.get(rec["id"], rec["label"]))


def ratio(rec: dict, recs: dict[str, dict]) -> float | None:
    """This row's speed as a fraction of its limit's speed (1.0 = at the limit)."""
    lim = recs.get(rec.get("limit") or "")
    mine = speed(rec)
    theirs = speed(lim) if lim else None
    if mine is None or not theirs:
        return None
    return mine / theirs


def correct(rec: dict) -> str:
    if rec["skipped"]:
        return f"skipped: {rec['skipped']}"
    st = stats(rec)
    if not rec["samples"] and not st["failed"]:
        return "not timed: the run's time budget ran out first"
    parts = []
    timed = [v for v in rec["verdicts"] if not v["warmup"]] or rec["verdicts"]
    if timed:
        bad = [v for v in timed if not v["ok"]]
        parts.append(bad[0]["text"] if bad else timed[-1]["text"])
        if bad and len(timed) > 1:
            parts[-1] += f" ({len(bad)} of {len(timed)} runs)"
    elif st["n"]:
        parts.append("n/a")
    if st["failed"]:
        parts.append(f"FAILED {len(st['failed'])}x: {st['failed'][0][:220]}")
    parts += [n if len(n) <= 160 else n[:157] + "..." for n in rec["notes"]]
    return _cell("; ".join(parts))


def main_table(result: dict) -> str:
    recs = index(result)
    out = []
    for group, title in GROUPS.items():
        rows = [r for r in result["records"] if r["group"] == group]
        if not rows:
            continue
        out += [
            f"#### {title}",
            "",
            "| row | n | median s | min–max s | MB/s | × limit | correct? |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for r in rows:
            st = stats(r)
            if "median" not in st:
                out.append(f"| {label(r)} | 0 | – | – | – | – | {correct(r)} |")
                continue
            sp = speed(r) if group not in ("rerun",) else None
            ra = ratio(r, recs) if group not in ("rerun",) else None
            out.append(
                f"| {label(r)} | {st['n']} | {_t(st['median'])} | {_range(st)} | "
                f"{'' if sp is None else f'{sp:.0f}'} | {'' if ra is None else f'{ra:.2f}'} | "
                f"{correct(r)} |"
            )
        out.append("")
    return "\n".join(out)


def steps_table(result: dict) -> str:
    recs = index(result)
    rows = [
        r
        for r in result["records"]
        if r["id"].split(".")[0] in ("runbook", "rerun", "many")
        and ".runbook." in f".{r['id']}."
        and stats(r)["n"]
    ]
    if not rows:
        return ""
    out = [
        "| runbook row | total s | preflight | manifest | transfer | verify "
        "| relocate+swap+exports | transfer MB/s | transfer × limit (pre-opened) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cells = []
        for step in ("total", *STEP_COLS, "rest"):
            st = step_stats(r, step)
            cells.append("–" if st is None else f"{_t(st['median'])} ({_range(st)})")
        tr = step_stats(r, "transfer")
        skipped = any(s["steps"].get("transfer_skipped") for s in r["samples"] if s["ok"])
        lim = recs.get(plumbing_limit(r, recs) or "")
        if r["id"].startswith("rerun.") and not skipped:
            cells += ["(only changed files)", ""]  # the payload's size is not what was sent
        elif tr and tr["median"] > 0.05 and not skipped:
            mbs = r["bytes"] / tr["median"] / 1e6
            lsp = speed(lim) if lim else None
            cells += [f"{mbs:.0f}", "" if not lsp else f"{mbs / lsp:.2f}"]
        else:
            cells += ["(skipped)" if skipped else "–", ""]
        name = label(r) if r["group"] != "many" else "[many files] " + label(r)
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out) + (
        "\n\nCells: median (min–max) seconds of the step as report.json times it. The transfer "
        "step streams through ssh connections the runbook opened earlier (multiplexed), so its "
        "ratio is against the null relay with that same plumbing, connections opened before the "
        "clock (`limit.relay.plumbing`; its `many.` twin), where the run has it.\n"
    )


def plumbing_limit(rec: dict, recs: dict) -> str | None:
    """The limit for a runbook's transfer step: the pre-opened, multiplexed null relay of the same
    payload when this run has it, else the row's own limit."""
    pid = ("many." if rec.get("payload") == "many" else "") + "limit.relay.plumbing"
    return (
        pid
        if stats(recs.get(pid, {"samples": [], "warmup": []})).get("median")
        else rec.get("limit")
    )


def _med(recs: dict, rid: str, step: str | None = None) -> float | None:
    r = recs.get(rid)
    if not r:
        return None
    if step:
        st = step_stats(r, step)
        return st["median"] if st else None
    return stats(r).get("median")


# The targets of issue #17 measured in the lab, each as a ratio of two rows of the same run:
# (what, our row, the row it is measured against, the target, "max" (ratio at most) or "min").
TARGETS = (
    (
        "whole runbook (verify sha256, no checks, compression auto) ÷ best hand pipeline "
        "(seed, aes128-gcm + lz4)",
        "runbook.relay.auto",
        "peer.seed.aes.lz4",
        1.25,
        "max",
    ),
    (
        "whole runbook (verify sha256, no checks, compression none) ÷ best hand pipeline",
        "runbook.relay.none",
        "peer.seed.aes.lz4",
        1.25,
        "max",
    ),
    (
        "null relay ÷ whole runbook (compression auto): the runbook's speed as a fraction of "
        "the limit",
        "limit.relay.aes",
        "runbook.relay.auto",
        0.6,
        "min",
    ),
    ("re-run, nothing changed ÷ null relay", "rerun.runbook.same", "limit.relay.aes", 0.3, "max"),
    (
        "re-run after one small file changed ÷ rsync's incremental two hops",
        "rerun.runbook.one",
        "rerun.rsync.one",
        1.0,
        "max",
    ),
)
# The targets of issue 37 (the relay at the speed of the link), by the run's link shaping: the
# whole verified move against the hand pipelines over the same link, and auto against none.
RELAY_TARGETS = {
    "1gbit": (
        (
            "whole runbook (auto) ÷ the seed's one-liner: 1.5x faster",
            "runbook.relay.auto",
            "peer.seed",
            0.667,
            "max",
        ),
        (
            "whole runbook (auto) ÷ hand aes128-gcm + lz4 -1",
            "runbook.relay.auto",
            "peer.seed.aes.lz4",
            1.15,
            "max",
        ),
    ),
    "200mbit": (
        (
            "whole runbook (auto) ÷ whole runbook (none): the choice beats none",
            "runbook.relay.auto",
            "runbook.relay.none",
            1.0,
            "max",
        ),
    ),
    "": (
        (
            "whole runbook (auto) ÷ whole runbook (none): not 5% slower",
            "runbook.relay.auto",
            "runbook.relay.none",
            1.05,
            "max",
        ),
    ),
}
COMPILE_TARGETS = (
    ("compile one spec (specs/b300.yaml, lint cache warm), s", "compile.b300.warm", 0.3),
    ("compile all specs (specs/, lint cache warm), s", "compile.all.warm", 1.0),
)


def targets_table(result: dict) -> str:
    """Each target of issue #17, and of issue 37 for the run's link shaping, with this run's
    ratio (medians) and whether it is met."""
    recs = index(result)
    out = [
        "| target | ours s | against s | ratio | target | met? |",
        "|---|---:|---:|---:|---:|---|",
    ]
    relay = RELAY_TARGETS.get((result.get("shape") or "").split(",")[0], ())
    for what, mine, theirs, goal, how in (
        *((f"(issue #17) {t[0]}",) + t[1:] for t in TARGETS),
        *((f"(issue 37) {t[0]}",) + t[1:] for t in relay),
    ):
        a, b = _med(recs, mine), _med(recs, theirs)
        if a is None or b is None or b <= 0:
            continue
        r = a / b
        ok = r <= goal if how == "max" else r >= goal
        out.append(
            f"| {_cell(what)} | {_t(a)} | {_t(b)} | {r:.2f} | "
            f"{'≤' if how == 'max' else '≥'} {goal:g} | {'yes' if ok else '**no**'} |"
        )
    for what, rid, goal in COMPILE_TARGETS:
        a = _med(recs, rid)
        if a is not None:
            met = "yes" if a <= goal else "**no**"
            out.append(f"| {_cell(what)} | {_t(a)} | | | ≤ {goal:g} s | {met} |")
    return "\n".join(out) + "\n" if len(out) > 2 else ""


def findings(result: dict) -> list[str]:
    """Sentences computed from the numbers of this run (only those whose rows ran)."""
    recs = index(result)
    out = []
    lim = recs.get("limit.relay.aes")
    lim_s, lim_sp = _med(recs, "limit.relay.aes"), speed(lim) if lim else None
    if lim_s and lim_sp:
        s = (
            f"The limit: a null relay of {lim['bytes'] / 1e6:.0f} MB took {_t(lim_s)} s "
            f"({lim_sp:.0f} MB/s) with aes128-gcm"
        )
        d = recs.get("limit.relay.default")
        if d and speed(d):
            s += f"; with OpenSSH's default cipher {speed(d):.0f} MB/s ({speed(d) / lim_sp:.2f}×)"
        one = recs.get("limit.link.aes")
        if one and speed(one):
            s += f". One link alone: {speed(one):.0f} MB/s"
        out.append(s + ".")
        p = recs.get("limit.relay.plumbing")
        if p and speed(p):
            out.append(
                "The same relay through multiplexed ssh masters and a 1 MiB pipe (how the "
                f"runbook's stream travels): {speed(p):.0f} MB/s, {speed(p) / lim_sp:.2f}× "
                "the limit."
            )
        lt = recs.get("limit.local-tar")
        if lt and speed(lt):
            out.append(
                f"tar c | tar x on this machine with no ssh at all: {speed(lt):.0f} MB/s "
                f"({speed(lt) / lim_sp:.2f}× the limit): packing and unpacking share the same "
                "2 cores."
            )
    rb_total = _med(recs, "runbook.relay.none")
    rb_tr = _med(recs, "runbook.relay.none", "transfer")
    if rb_total and rb_tr and lim_s:
        m = _med(recs, "runbook.relay.none", "manifest") or 0
        v = _med(recs, "runbook.relay.none", "verify") or 0
        pre = _med(recs, "runbook.relay.none", "preflight") or 0
        rest = _med(recs, "runbook.relay.none", "rest") or 0
        pl = _med(recs, "limit.relay.plumbing")
        deferred = any(
            "deferred" in s.get("details", {}).get("manifest", "")
            for s in recs["runbook.relay.none"]["samples"]
        )
        out.append(
            f"Our runbook (relay, no compression, sha256): the transfer step took {_t(rb_tr)} s = "
            f"{lim_s / rb_tr:.2f}× the limit's speed"
            + (f" ({pl / rb_tr:.2f}× the pre-opened relay's)" if pl else "")
            + f"; the whole run {_t(rb_total)} s = {lim_s / rb_total:.2f}×. Around the stream: "
            f"preflight {_t(pre)} s, manifest {_t(m)} s "
            + (
                "(deferred: the source is hashed while the stream runs)"
                if deferred
                else "(before the first byte moves)"
            )
            + f", verify {_t(v)} s, relocate+swap+exports {_t(rest)} s."
        )
        best = min(
            (r for r in result["records"] if r["group"] == "runbook" and stats(r).get("median")),
            key=lambda r: step_stats(r, "transfer")["median"] if step_stats(r, "transfer") else 1e9,
            default=None,
        )
        if best is not None and step_stats(best, "transfer"):
            out.append(
                f"Fastest transfer step: {label(best)} "
                f"({_t(step_stats(best, 'transfer')['median'])} s)."
            )
    comp = [(c, _med(recs, f"runbook.relay.{c}", "transfer")) for c in ("none", "lz4", "zstd")]
    comp = [(c, x) for c, x in comp if x]
    if len(comp) > 1:
        out.append(
            "Compression, the runbook's transfer step: "
            + ", ".join(f"{c} {_t(x)} s" for c, x in comp)
            + "."
            + (f" The limit moves the uncompressed bytes in {_t(lim_s)} s." if lim_s else "")
        )
    direct = _med(recs, "runbook.direct.none", "transfer")
    if direct and rb_tr:
        out.append(
            f"Direct route (src streams to dst itself): transfer step {_t(direct)} s against "
            f"{_t(rb_tr)} s relayed. In this lab every host shares this machine's CPUs, so this "
            f"mostly shows what this machine's two ssh clients cost the relay."
        )
    seed = _med(recs, "peer.seed")
    if seed and rb_total:
        s = (
            f"The hand-typed seed pipeline took {_t(seed)} s"
            + (f" ({lim_s / seed:.2f}× the limit)" if lim_s else "")
            + f"; our whole runbook takes {rb_total / seed:.2f}× as long"
        )
        if rb_tr:
            s += f", its transfer step alone {rb_tr / seed:.2f}×"
        out.append(s + " (the runbook also hashes, verifies, relocates and swaps atomically).")
        for rid, what in (
            ("peer.seed.aes", "with -c aes128-gcm"),
            ("peer.seed.aes.lz4", "with aes128-gcm and lz4"),
        ):
            x = _med(recs, rid)
            if x:
                out.append(
                    f"Seed {what}: {_t(x)} s"
                    + (f" ({lim_s / x:.2f}× the limit)." if lim_s else ".")
                )
    rs = _med(recs, "peer.rsync")
    if rs and rb_total:
        out.append(
            f"rsync in two hops: {_t(rs)} s = {rs / rb_total:.2f}× our whole runbook's time"
            + (f", {rs / seed:.2f}× the seed pipeline." if seed else ".")
        )
    sc = recs.get("peer.scp")
    if sc and rb_total:
        st = stats(sc)
        if st.get("median"):
            out.append(
                f"scp -3 -r: {_t(st['median'])} s = {st['median'] / rb_total:.1f}× our whole "
                f"runbook; copy right? {correct(sc)}."
            )
        elif st["failed"]:
            out.append(f"scp -3 -r did not finish: {st['failed'][0][:200]}")
    same = _med(recs, "rerun.runbook.same")
    if same:
        how = next(
            (
                s["details"].get("manifest", "")
                for s in recs["rerun.runbook.same"]["samples"]
                if s["ok"] and s.get("details")
            ),
            "",
        )
        s = f"Re-run on an unchanged destination: our runbook {_t(same)} s, sending nothing" + (
            f" (manifest step: {how})" if how else ""
        )
        dg = _med(recs, "rerun.runbook.digest")
        if dg:
            s += f"; with `rerun: digest` {_t(dg)} s"
        for rid, what in (
            ("rerun.rsync.one", "rsync two hops with one small file changed"),
            ("rerun.seed.one", "the tar relay, which re-sends everything"),
            (
                "rerun.runbook.one",
                "our runbook with one small file changed (sends the changed file, bin/ and "
                "pyvenv.cfg; links the rest)",
            ),
        ):
            x = _med(recs, rid)
            if x:
                s += f"; {what}: {_t(x)} s"
        out.append(s + ".")
    mh = {a: _med(recs, f"verify.manifest.{a}") for a in ("sha256", "blake2b", "none")}
    if mh["sha256"] and lim_s:
        s = (
            f"Manifest build on the source (kit CLI, 2 jobs): sha256 {_t(mh['sha256'])} s"
            + (f", blake2b {_t(mh['blake2b'])} s" if mh["blake2b"] else "")
            + (f", no digests {_t(mh['none'])} s" if mh["none"] else "")
            + f"; the stream itself (limit) {_t(lim_s)} s."
        )
        vv = _med(recs, "verify.verify.sha256")
        if vv:
            s += f" Verify of a copy: {_t(vv)} s."
        out.append(s)
    hs = []
    for rid, name in (
        ("hash.hashlib.sha256", "hashlib sha256"),
        ("hash.hashlib.blake2b", "hashlib blake2b"),
        ("hash.sha256sum", "sha256sum"),
        ("hash.b3sum", "b3sum"),
        ("hash.xxh128sum", "xxh128sum"),
    ):
        r = recs.get(rid)
        if r and speed(r):
            hs.append(f"{name} {_t(stats(r)['median'])} s ({speed(r):.0f} MB/s)")
    if hs:
        out.append("Hashing every file once: " + ", ".join(hs) + ".")
    mrb, mseed, mrs = (
        _med(recs, k) for k in ("many.runbook.relay.none", "many.peer.seed", "many.peer.rsync")
    )
    mlim = _med(recs, "many.limit.relay.aes")
    if mrb and mseed:
        out.append(
            f"Many small files: our runbook {_t(mrb)} s, the seed pipeline {_t(mseed)} s"
            + (f", rsync two hops {_t(mrs)} s" if mrs else "")
            + (f"; a null relay of the same bytes {_t(mlim)} s." if mlim else ".")
        )
    cold, warm = _med(recs, "compile.b300.cold"), _med(recs, "compile.b300.warm")
    sc2 = _med(recs, "compile.shellcheck")
    if cold:
        out.append(
            f"Compiling specs/b300.yaml: {_t(cold)} s with shellcheck running"
            + (f" (shellcheck alone {_t(sc2)} s, {100 * sc2 / cold:.0f}% of it)" if sc2 else "")
            + (f"; {_t(warm)} s when the lint cache already holds the result." if warm else ".")
        )
    out += _streams_findings(recs, result)
    return out


def _streams_findings(recs: dict, result: dict) -> list[str]:
    """The relay in streams side by side (issue 37), where its rows ran."""
    ones = [
        (n, _med(recs, rid, "transfer"), _med(recs, rid))
        for n, rid in (
            (1, "runbook.relay.none"),
            (2, "runbook.relay.streams2"),
            (4, "runbook.relay.streams4"),
        )
    ]
    ones = [(n, t, w) for n, t, w in ones if t and w]
    nulls = [
        (n, _med(recs, rid))
        for n, rid in (
            (1, "limit.relay.aes"),
            (2, "limit.relay.streams2"),
            (4, "limit.relay.streams4"),
        )
    ]
    nulls = [(n, t) for n, t in nulls if t]
    if len(ones) < 2 or ones[0][0] != 1:
        return []
    base_t = ones[0][1]
    out = [
        "The relay in streams side by side (issue 37), transfer step (whole run): "
        + ", ".join(
            f"{n} stream{'s' if n > 1 else ''} {_t(t)} s ({_t(w)} s), "
            f"{base_t / t:.2f}× one stream's speed"
            for n, t, w in ones
        )
        + "."
    ]
    if len(nulls) > 1 and nulls[0][0] == 1:
        out.append(
            "The null relay in as many pairs of fresh connections: "
            + ", ".join(
                f"{n} pair{'s' if n > 1 else ''} {_t(t)} s ({nulls[0][1] / t:.2f}×)"
                for n, t in nulls
            )
            + "."
        )
    seed = _med(recs, "peer.seed.aes")
    if seed:
        best = min(ones, key=lambda x: x[2])
        out.append(
            f"The hand pipeline (seed, aes128-gcm) {_t(seed)} s: the runbook's whole run in "
            f"{best[0]} stream{'s' if best[0] > 1 else ''} {_t(best[2])} s "
            f"({seed / best[2]:.2f}× the hand pipeline's speed, with verify and relocation)."
        )
    cores = result.get("machine", {}).get("nproc")
    out.append(
        f"This machine has {cores} cores for both sshds, every ssh client, tar and the "
        "hashing: streams cannot add ciphers here, the figures are one round each and noisy. "
        "Where the relay's machine has cores to spare (the H100 host's 16), each stream adds "
        "two ssh ciphers: measuring it there needs the lab on that host (root, openssh-server, "
        "network namespaces: tests.lab.Lab, as `python -m benchmarks` builds it) and the "
        "7.2 GB venv as the payload, with `--only 'limit.relay.*,runbook.relay.none,"
        "runbook.relay.streams*,peer.seed.aes'`; not run."
    )
    return out


def render_result(result: dict) -> str:
    if not _LABELS:
        _LABELS.update(_labels())
    m = result["machine"]
    lines = [
        f"Run `{result['command']}` on {m['date']}; took {result['run']['seconds'] / 60:.1f} min"
        f" ({sum(1 for r in result['run']['rounds'] if r['round'] > 0)} of {result['repeat']} "
        "timed round(s) after a warm-up"
        + (f"; {result['run']['stopped']}" if result["run"]["stopped"] else "")
        + ").",
        "",
        "| machine | |",
        "|---|---|",
        f"| CPU | {m['nproc']} × {m['cpu']} (flags: {m['cpu_flags']}) |",
        f"| memory | {m['mem_gib']} GiB |",
        f"| kernel | {m['kernel']} |",
        f"| ssh | {m['ssh']} |",
        f"| tools | {m['tools']}, Python {m['python']} |",
        f"| code measured | commit {m['git']} |",
        f"| disks | source: the cached payload on the root fs ({m['root_fs']}); "
        f"destinations: loop-mounted ext4 (journal on, noatime), {result['scratch']} |",
        f"| load average (1/5/15 min) | start {' '.join(map(str, result['load_start']))}; "
        f"end {' '.join(map(str, result['load_end']))}; highest 1-min seen at a round start "
        f"{max(r['load_start'][0] for r in result['run']['rounds']):.2f} |",
        f"| link shaping | {result['shape'] or 'none (veth pairs, CPU-bound)'} |",
        "",
    ]
    for p in result["payloads"].values():
        lines.append(
            f"Payload `{p['kind']}`: {p['files']:,} files, {p['links']} symlinks, "
            f"{p['file_bytes'] / 1e6:.0f} MB in files, {p['stream_bytes'] / 1e6:.0f} MB as a tar "
            f"stream."
        )
    targets = targets_table(result)
    if targets:
        lines += [
            "",
            "#### The targets (issues #17 and 37), ratios of this run's medians",
            "",
            targets,
        ]
    lines += [
        "",
        main_table(result),
        "#### Our runbook, step by step (from its report.json)",
        "",
        steps_table(result),
        "#### What this run shows",
        "",
    ]
    lines += [f"- {s}" for s in findings(result)]
    return "\n".join(lines) + "\n"


def write_doc(results_dir: Path, doc: Path, head: str, closing: str) -> None:
    """docs/benchmarks.md: the method, then every stored run (full first), then the analysis."""
    order = sorted(
        results_dir.glob("*.json"),
        key=lambda p: (not p.stem.startswith("full"), "-" in p.stem, p.stem),
    )
    parts = [head]
    for p in order:
        result = json.loads(p.read_text())
        parts.append(f"## Run: {p.stem}\n\n" + render_result(result))
    parts.append(closing)
    doc.write_text("\n".join(parts))
