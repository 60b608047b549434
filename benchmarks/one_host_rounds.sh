#!/usr/bin/env bash
# The one-host move, N rounds in one call, failures counted (issue 45: the GPU host's 7.2 GB venv
# in 4 streams failed once in three rounds, `send and receive on here exited 247`). From the
# repository root on the device host, with the runbook compiled beforehand:
#   bash benchmarks/one_host_rounds.sh [RUNBOOK] [ROUNDS]   (generated/h200.sh, 10)
# Each round removes the destination (DST, /opt/torch-moved/.venv: what specs/h200.yaml moves to)
# and what a run keeps beside it, so that every round moves the whole tree, then runs the runbook
# with a run directory of its own. A table on stdout (round, exit status, seconds, the transfer's
# row); in $OUT (or ./one-host-rounds-out): rounds.txt (the table), and for each failed round one
# file (the first 6), failed-round-N.tar.gz: its terminal output, run.log, events.tsv and report.json. The
# exit status is the number of failed rounds (0: every round passed).
# Environment: DST (above); TIMEOUT (s, 300) bounds one round. Every step runs in each round
# (a spurious failure may be in any of them).
set -Eeuo pipefail
runbook=$(realpath "${1:-generated/h200.sh}")
rounds=${2:-10}
dst=${DST:-/opt/torch-moved/.venv}
out=${OUT:-${PWD}/one-host-rounds-out}
limit=${TIMEOUT:-300}
work=$(mktemp -d /tmp/rb-rounds.XXXXXX)
trap 'rm -rf "${work}"' EXIT
mkdir -p "${out}"
parent=$(dirname "${dst}")
name=$(basename "${dst}")
hidden=.${name#.}     # rbrules.paths.beside: a hidden name keeps its one dot
failed=0
printf '| round | exit | seconds | transfer |\n| --- | --- | --- | --- |\n' | tee "${out}/rounds.txt"
for ((i = 1; i <= rounds; i++)); do
  rm -rf -- "${dst}" "${parent}/${hidden}.rb-staging" "${parent}/${hidden}.rb-staging.incomplete"
  sync
  run="${work}/round-${i}"
  mkdir -p "${run}"
  start=${EPOCHREALTIME}
  rc=0
  RB_RUN_DIR="${run}/run" timeout "${limit}" bash "${runbook}" >"${run}/terminal.txt" 2>&1 || rc=$?
  secs=$(python3 -c 'import sys; print("%.2f" % (float(sys.argv[2]) - float(sys.argv[1])))' \
    "${start}" "${EPOCHREALTIME}")
  row=$(grep -E '^transfer ' "${run}/terminal.txt" | tail -n 1 | tr -s ' ' | cut -c1-160) || true
  printf '| %d | %d | %s | %s |\n' "${i}" "${rc}" "${secs}" "${row:-(no transfer row)}" |
    tee -a "${out}/rounds.txt"
  if ((rc != 0)); then
    failed=$((failed + 1))
    for f in run.log events.tsv report.json; do
      if [[ -f "${run}/run/${f}" ]]; then
        cp -- "${run}/run/${f}" "${run}/${f}"
      fi
    done
    rm -rf -- "${run}/run"
    if ((failed <= 6)); then      # what comes back from $OUT: at most 8 files
      tar -C "${work}" -czf "${out}/failed-round-${i}.tar.gz" "round-${i}"
    fi
    grep -E 'FAILED|exited|died of|stopped' "${run}/terminal.txt" | head -n 20 >&2 || true
  fi
  rm -rf -- "${run}"
done
printf '%d of %d rounds failed (%s, %s)\n' "${failed}" "${rounds}" "${runbook##*/}" "${dst}" |
  tee -a "${out}/rounds.txt"
rm -rf -- "${dst}"
exit "${failed}"
