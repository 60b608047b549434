"""benchmarks/device_three.sh's end: its rows' records (one TSV line a timed row: row, shape,
round, seconds, exit code, CPU seconds of the source's, the destination's and this machine's CPU
sets, the runbook's compression and relay lines) into a table side by side (RATE | unshaped),
issue 47's targets, and one JSON document.

    python3 three_summary.py RECORDS OUT.json BYTES RATE SRC_CPUS DST_CPUS HERE_CPUS STREAMS ZSTD_T

stdlib only (it runs on the device's python3)."""

from __future__ import annotations

import json
import statistics
import sys

LABELS = {
    "nullN": (
        "null relay, {streams} streams side by side (zeros, aes128-gcm, each its own ssh pair)"
    ),
    "seed": "the seed's one-liner: ssh a 'tar cf -' | ssh b 'tar xf -' (default cipher)",
    "lz4": "hand: aes128-gcm + lz4 -1",
    "zstd": "hand: aes128-gcm + zstd -1 -T{zstd_t}",
    "zstd3t2": "hand, the runbook's stream: tar -b 256 | zstd -3 -T2, aes128-gcm",
    "zstd3t3": "hand, the runbook's stream: tar -b 256 | zstd -3 -T3, aes128-gcm",
    "zstd3t4": "hand, the runbook's stream: tar -b 256 | zstd -3 -T4, aes128-gcm",
    "cold": "runbook (compression auto, sha256, no checks), destination removed",
    "rerun": "runbook re-run, nothing changed",
}


def cpus_in(text: str) -> int:
    n = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def read(path: str) -> dict:
    rows: dict = {}
    for line in open(path, encoding="utf-8"):
        f = line.rstrip("\n").split("\t")
        if len(f) < 8:
            continue
        r = rows.setdefault((f[0], f[1]), {"seconds": [], "failed": [], "cpu": [], "notes": []})
        if f[4] != "0":
            r["failed"].append("round %s rc %s" % (f[2], f[4]))
            continue
        r["seconds"].append(float(f[3]))
        r["cpu"].append([float(f[5]), float(f[6]), float(f[7])])
        if len(f) > 8 and f[8]:
            r["notes"].append([x for x in f[8].split("|") if x])
    for r in rows.values():
        s = r["seconds"]
        r["median"] = round(statistics.median(s), 2) if s else None
        r["cpu_median"] = (
            [round(statistics.median(c[i] for c in r["cpu"]), 2) for i in range(3)]
            if r["cpu"]
            else None
        )
    return rows


def main(argv: list) -> int:
    records, out, nbytes, rate, src, dst, here, streams, zstd_t = argv[1:10]
    nbytes = int(nbytes)
    rows = read(records)
    names = ["seed", "lz4", "zstd", "zstd3t2", "zstd3t3", "zstd3t4", "cold", "rerun", "nullN"]
    cores = {"src": cpus_in(src), "dst": cpus_in(dst), "here": cpus_in(here)}

    def med(n: str, shape: str):
        return rows.get((n, shape), {}).get("median")

    def cell(n: str, shape: str) -> str:
        r = rows.get((n, shape))
        if r is None:
            return ""
        if r["median"] is None:
            return "FAILED " + "; ".join(r["failed"])
        return "%.2f (%s)%s" % (
            r["median"],
            " / ".join("%.2f" % x for x in r["seconds"]),
            " %d MB/s" % (nbytes / r["median"] / 1e6) if n != "rerun" else "",
        )

    print("| row | %s: s (rounds) | unshaped: s (rounds) |" % rate)
    print("| --- | --- | --- |")
    for n in names:
        if (n, "shaped") in rows or (n, "unshaped") in rows:
            print(
                "| %s | %s | %s |"
                % (
                    LABELS[n].format(streams=streams, zstd_t=zstd_t),
                    cell(n, "shaped"),
                    cell(n, "unshaped"),
                )
            )
    print()
    print(
        "CPU seconds (median) of the machines' CPU sets, src %s (%d) / dst %s (%d) / here %s "
        "(%d):" % (src, cores["src"], dst, cores["dst"], here, cores["here"])
    )
    for (n, shape), r in sorted(rows.items()):
        if r["cpu_median"] and r["median"]:
            busy = [
                c / (r["median"] * cores[k])
                for c, k in zip(r["cpu_median"], ("src", "dst", "here"))
            ]
            print(
                "  %s %s: %s (busy %s)"
                % (
                    shape,
                    n,
                    " / ".join("%.2f" % c for c in r["cpu_median"]),
                    " / ".join("%d%%" % round(100 * b) for b in busy),
                )
            )
    for (n, shape), r in sorted(rows.items()):
        for i, lines in enumerate(r["notes"]):
            for line in lines:
                print("  %s %s round %d: %s" % (shape, n, i + 1, line.strip()))

    def ratio(a, b):
        return round(a / b, 3) if a and b else None

    best_hand = min([x for x in (med("lz4", "shaped"), med("zstd", "shaped")) if x] or [0]) or None
    targets = {
        "%s: runbook / seed (<= 0.45)" % rate: ratio(med("cold", "shaped"), med("seed", "shaped")),
        "%s: runbook / the better hand pipeline (<= 0.9)" % rate: ratio(
            med("cold", "shaped"), best_hand
        ),
        "unshaped: the runbook's rate / the %s-stream null relay's (>= 0.8)" % streams: ratio(
            med("nullN", "unshaped"), med("cold", "unshaped")
        ),
        "unshaped: runbook / seed": ratio(med("cold", "unshaped"), med("seed", "unshaped")),
        "re-run / unshaped null relay": ratio(med("rerun", "unshaped"), med("nullN", "unshaped")),
    }
    print()
    for k, v in targets.items():
        print("%s: %s" % (k, v))
    doc = {
        "tar_stream_bytes": nbytes,
        "rate": rate,
        "cpus": {"src": src, "dst": dst, "here": here},
        "streams": int(streams),
        "zstd_threads": int(zstd_t),
        "targets": targets,
        "rows": {
            "%s/%s" % k: dict(v, label=LABELS[k[0]].format(streams=streams, zstd_t=zstd_t))
            for k, v in sorted(rows.items())
        },
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
