#!/usr/bin/env bash
# The verified move against raw `tar | tar`, in one call on a GPU host (issue #17): run from the
# repository root on the H200, with the runbooks compiled beforehand (no compiler needed there):
#   bash benchmarks/h200_move.sh generated/h200.sh [NOCHECKS_RUNBOOK] > results.json
# Times (seconds, wall) go to stdout as one JSON document; logs to stderr. Page cache: one untimed
# read of the source first, so every row reads it warm.
set -Eeuo pipefail
full=$1
bare=${2:-}
src=/opt/torch/.venv
raw=/opt/rb-raw-copy
now() { date +%s.%N; }
since() { python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))" "$1" "$(now)"; }
rows=()
add() { rows+=("\"$1\": $2"); echo "$1: $2 s" >&2; }

tar -C "${src}" -cf - . | cat >/dev/null                      # warm the page cache
rm -rf "${raw}"; mkdir -p "${raw}"; sync
t=$(now); tar -C "${src}" -cf - . | tar -C "${raw}" -xf -; add raw_tar_tar "$(since "${t}")"
rm -rf "${raw}"; sync
if [[ -n "${bare}" ]]; then
  rm -rf /opt/torch-moved; sync
  t=$(now); RB_RUN_DIR=/tmp/rb-bare bash "${bare}" >&2; add runbook_no_checks "$(since "${t}")"
  t=$(now); RB_RUN_DIR=/tmp/rb-bare bash "${bare}" >&2; add rerun_nothing_changed "$(since "${t}")"
  python3 -c "import json,sys; d=json.load(open('/tmp/rb-bare/report.json')); print(json.dumps({s['id']: s['duration_s'] for s in d['steps']}))" >&2
fi
rm -rf /opt/torch-moved; sync
t=$(now); RB_RUN_DIR=/tmp/rb-full bash "${full}" >&2; add runbook_with_checks "$(since "${t}")"
probe=$(python3 -c "import json; d=json.load(open('/tmp/rb-full/report.json')); print(next(s['duration_s'] for s in d['steps'] if s['id'] == 'probe'))")
add probe_step "${probe}"
python3 -c "import json; d=json.load(open('/tmp/rb-full/report.json')); print(json.dumps({s['id']: s['duration_s'] for s in d['steps']})); print(json.dumps(d['checks']))" >&2
if [[ -z "${KEEP_MOVED:-}" ]]; then     # KEEP_MOVED=1: leave the moved venv (to time its probe after)
  rm -rf /opt/torch-moved
fi
IFS=,; printf '{%s}\n' "${rows[*]}"
