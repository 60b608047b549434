#!/usr/bin/env bash
# The relay on the device host (issue 37), all rows in one call, from the repository root:
#   bash benchmarks/device_relay.sh [RUNBOOK]        (default benchmarks/device/relay.sh, compiled
#   here just before: python -m compiler benchmarks/device/relay.yaml -o benchmarks/device --standalone)
# with benchmarks/device/debs/ carried (openssh, lz4, zstd, pv and their libraries, downloaded
# here by benchmarks/device/fetch_debs.sh). The device has no ssh, sshd, lz4, zstd or pv:
# benchmarks/device/common.sh unpacks the debs into one prefix, wraps each tool the machine lacks,
# and starts two sshd on 127.0.0.2:2222 (host a, the source) and 127.0.0.3:2222 (host b, the
# destination), each with its own config, host key and log; the runbook runs on the device itself,
# the relay's "this machine". Rows, ROUNDS rounds (3) alternating, medians: the null relay in one
# stream (aes128-gcm) and in N (8) streams, the seed's one-liner, the hand aes128-gcm + lz4 -1
# pipeline, the runbook cold (destination removed) and its re-run, and the live plan (--plan)
# before the cold run and after the re-run. A table on stdout, JSON and
# the runbook's logs and report.json in $OUT (or ./device-relay-out).
# Environment: SRC (/opt/torch/.venv) and DST (/opt/rb-relay/.venv) as compiled into RUNBOOK;
# TMPFS=0 leaves DST's parent as it is (else a tmpfs is mounted there); FORCE_PREFIX=1 uses the
# prefix's tools even where the machine has its own (to test the device's path elsewhere);
# DEADLINE (s, 450): no row starts after it; ROWS: the rows to run, in order (default all);
# PROFILE=1: CPU time by process kind during each cold run, in $OUT/cpu-cold-ROUND.txt;
# XTRACE=1: the plans traced with a clock on every line ($OUT/plan-cold.log, plan-rerun.log). Everything lives under /tmp/rb-device; the sshd
# are stopped at exit.
set -Eeuo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
runbook=$(realpath "${1:-${here}/device/relay.sh}")
src=${SRC:-/opt/torch/.venv}
dst=${DST:-/opt/rb-relay/.venv}
rounds=${ROUNDS:-3}
streams=${STREAMS:-8}
deadline=${DEADLINE:-450}
out=${OUT:-${PWD}/device-relay-out}
top=/tmp/rb-device
mkdir -p "${out}"
log() { printf '%(%H:%M:%S)T %s\n' -1 "$*" >&2; }
t0=${SECONDS}

# the tools (the system's or the prefix's) and the two sshd (benchmarks/device/common.sh)
DEV_TOP=${top} DEV_HERE=${here} DEV_SRC=${src}
# shellcheck source=benchmarks/device/common.sh
source "${here}/device/common.sh"
finish() {
  local rc=$?
  dev_stop "${out}"
  exit "${rc}"
}
trap finish EXIT
dev_tools
dev_keys
dev_sshd a 127.0.0.2
dev_sshd b 127.0.0.3

# ---------------------------------------------------------------- the payload and the rows
DEV_EXCLUDE=1 dev_payload "${dst}"     # `hand`, `bytes`; the rows: benchmarks/device/common.sh
row_cold() {
  local -a prof=()
  # PROFILE=1: CPU seconds by process kind during the cold run (benchmarks/cpu_sample.py)
  [[ "${PROFILE:-0}" == 1 ]] && prof=(python3 "${here}/cpu_sample.py" "${out}/cpu-cold-${r}.txt" --)
  RB_RUN_DIR=${top}/run "${prof[@]}" bash "${runbook}" 2>"${out}/runbook-cold.log" >&2
}
row_rerun() { RB_RUN_DIR=${top}/rerun bash "${runbook}" 2>"${out}/runbook-rerun.log" >&2; }
# the live plan (issue 36): before a first move (destination removed) and on a re-run's state
row_plancold() { plan_run plancold plan-cold; }   # the destination removed before the clock (below)
row_planre() { plan_run planre plan-rerun; }
# the live plan into run directory $1, its screen and log as $2.txt, $2.log; XTRACE=1: traced, each
# trace line stamped as it arrives (bash takes no PS4 from the environment as root)
plan_run() {
  if [[ "${XTRACE:-0}" != 1 ]]; then
    RB_RUN_DIR=${top}/$1 bash "${runbook}" --plan >"${out}/$2.txt" 2>"${out}/$2.log"
    return
  fi
  RB_RUN_DIR=${top}/$1 bash -x "${runbook}" --plan >"${out}/$2.txt" 2> >(python3 -u -c '
import sys, time
for line in sys.stdin:
    sys.stdout.write("%.4f %s" % (time.time(), line))' >"${out}/$2.log")
}
declare -A secs=() steps=() fails=()
names=(null1 nullN seed lz4 plancold cold rerun planre)
if [[ -n "${ROWS:-}" ]]; then read -r -a names <<<"${ROWS}"; fi   # e.g. ROWS="cold rerun"
declare -A label=([null1]="null relay, 1 stream, aes128-gcm, 1 MiB pipe"
  [nullN]="null relay, ${streams} streams side by side, aes128-gcm, each its own ssh pair"
  [seed]="seed one-liner: ssh a 'tar c', piped into ssh b 'tar x' (default cipher)"
  [lz4]="hand aes128-gcm + lz4 -1" [cold]="runbook relay (auto, sha256, no checks), cold"
  [rerun]="runbook re-run (nothing changed)"
  [plancold]="runbook --plan, no destination (first move)" [planre]="runbook --plan after the run (nothing to send)")
for ((r = 1; r <= rounds; r++)); do
  order=("${names[@]}")
  ((r % 2 == 0)) && [[ -z "${ROWS:-}" ]] && order=(seed lz4 nullN null1 plancold cold rerun planre)   # the runbook's pair stays in order
  for n in "${order[@]}"; do
    if ((SECONDS - t0 > deadline)); then log "round ${r} ${n}: skipped (past ${deadline} s)"; continue; fi
    [[ "${n}" == seed || "${n}" == lz4 ]] && prep
    # a first move: no destination (removed before the clock: 54k entries take a while)
    if [[ "${n}" == plancold || "${n}" == cold ]]; then rm -rf "${dst}" "${top}/run"; sync; fi
    s=$(date +%s.%N)
    if "row_${n}"; then rc=0; else rc=$?; fi
    e=$(date +%s.%N)
    took=$(python3 -c 'import sys; print("%.2f" % (float(sys.argv[2]) - float(sys.argv[1])))' "${s}" "${e}")
    if ((rc != 0)); then fails[${n}]+="round ${r} rc ${rc}; "; log "round ${r} ${n}: FAILED rc ${rc}"; continue; fi
    secs[${n}]+="${took} "
    detail=''
    if [[ "${n}" == cold || "${n}" == rerun ]]; then
      d=${top}/run
      [[ "${n}" == cold ]] || d=${top}/rerun
      detail=$(python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
print(" ".join("%s=%.2f" % (s["id"], s["duration_s"]) for s in d["steps"]))' "${d}/report.json" 2>/dev/null || true)
      steps[${n}]+="${detail};"
      cp -f "${d}/report.json" "${out}/report-${n}-round${r}.json" 2>/dev/null || true
    fi
    log "round ${r} ${n}: ${took} s ${detail}"
  done
done
rm -rf "${hand}"
grep -h "compression:\|relay:\|transfer" "${out}/runbook-cold.log" >&2 || true

for n in "${names[@]}"; do
  export "S_${n}=${secs[${n}]:-}" "L_${n}=${label[${n}]}" "T_${n}=${steps[${n}]:-}" "F_${n}=${fails[${n}]:-}"
done
python3 - "${out}/device_relay.json" "${bytes}" "${streams}" "$(nproc)" "${names[@]}" <<'PY'
import json, os, statistics, sys
path, nbytes, streams, cores, names = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
env = os.environ
rows = {}
for n in names:
    s = [float(x) for x in env.get("S_" + n, "").split()]
    rows[n] = {"label": env.get("L_" + n, n), "seconds": s,
               "median": round(statistics.median(s), 2) if s else None,
               "steps": [x for x in env.get("T_" + n, "").split(";") if x],
               "failed": env.get("F_" + n, "")}
doc = {"tar_stream_bytes": nbytes, "streams": int(streams), "nproc": int(cores), "rows": rows}
m = {n: r["median"] for n, r in rows.items()}
def ratio(a, b):
    return round(m[a] / m[b], 2) if m.get(a) and m.get(b) else None
doc["ratios"] = {"null1 / runbook (>= 2 wanted)": ratio("null1", "cold"),
                 "nullN / runbook (>= 0.8 wanted)": ratio("nullN", "cold"),
                 "seed / runbook": ratio("seed", "cold"), "lz4 / runbook": ratio("lz4", "cold")}
json.dump(doc, open(path, "w"), indent=1)
print("| row | median s | rounds | MB/s | runbook x faster |")
print("| --- | --- | --- | --- | --- |")
for n, r in rows.items():
    med = r["median"]
    print("| %s | %s | %s | %s | %s |" % (
        r["label"], "%.2f" % med if med else "FAILED " + r["failed"],
        " ".join("%.2f" % x for x in r["seconds"]), int(nbytes / med / 1e6) if med else "",
        "%.2f" % (med / m["cold"]) if med and m.get("cold") and n != "cold" else ""))
for k, v in doc["ratios"].items():
    print("%s: %s" % (k, v))
PY
