#!/usr/bin/env bash
# The relay on three machines of one device host (issue 47), every row in one call, from the
# repository root:
#   bash benchmarks/device_three.sh [RUNBOOK]      (default benchmarks/device/relay.sh)
# with benchmarks/device/debs and the runbook carried (both git-ignored; made here by
# benchmarks/device/fetch_debs.sh). The three machines are CPU sets of the device: the source's
# sshd (host a, 127.0.0.2:2222) pinned with taskset to SRC_CPUS (0-3), the destination's (host b,
# 127.0.0.3:2222) to DST_CPUS (4-7), this script and all it starts (the relay: the runbook, the
# hand pipelines' ssh clients) to HERE_CPUS (8-11); each sshd's sessions inherit its CPUs. Both
# relay legs are shaped with tc htb on lo: one class of RATE (1gbit) for what leaves
# 127.0.0.2:2222 (the source's leg) and one for what goes to 127.0.0.3:2222 (the destination's),
# nothing else shaped (unclassified packets pass htb unqueued). In a network namespace of its
# own (NETNS=1: unshare -n, its own lo; 0: the machine's lo).
#
# Rows, ROUNDS (2) rounds, at RATE then unshaped (the next round the other way round), medians:
# the seed's one-liner (`ssh a "tar cf - -C SRC ." | ssh b "tar xf - -C DIR"`, ssh's default
# cipher, no compression), the hand aes128-gcm + lz4 -1 pipeline, the hand aes128-gcm + zstd -1
# -T${ZSTD_T} (4) pipeline, the runbook cold (destination removed, compression auto) and its
# re-run (nothing changed); unshaped also the null relay in STREAMS (8) streams (zeros, the same
# bytes). Each row's wall time and the CPU seconds each machine's CPU set spent meanwhile (/proc/
# stat, per CPU) are printed as they come; the runbook's compression and relay lines and its steps'
# times after each of its runs. At the end the table side by side (RATE | unshaped), issue 47's
# targets, and in $OUT (OUT, else ./device-three-out) device_three.json, three-rows.tsv (a line a
# timed row), runbook.log (every run's terminal output and its run.log) and sshd.log.
#
# Environment: SRC (/opt/torch/.venv) and DST (/opt/rb-relay/.venv), as compiled into RUNBOOK;
# ROWS: the rows to run, of `seed lz4 zstd cold rerun` (all; unshaped the null relay too) and
# zstd3t2, zstd3t3, zstd3t4 (the runbook's one stream by hand, zstd -3 with -T2..4);
# BUSY=1: benchmarks/device/busy.py beside each row (its busiest threads in $OUT/busy.log);
# SHAPE=0: unshaped rows only, SHAPE=only: shaped rows only (where tc cannot shape, said and
# done so: unshaped only); DEADLINE (s, 540
# after the start): no row starts that would end past it by its last time; ROW_TIMEOUT (s, 240):
# a row still running then is killed and counted failed; FORCE_PREFIX=1, TMPFS=0: as in
# benchmarks/device/common.sh. Everything lives under /tmp/rb-device; the sshd are stopped at exit.
set -Eeuo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ "${NETNS:-1}" == 1 && -z "${RB3_NETNS:-}" ]]; then
  if unshare -n true 2>/dev/null; then
    exec unshare -n -- env RB3_NETNS=1 bash "${BASH_SOURCE[0]}" "$@"
  fi
  printf 'no network namespace of our own (unshare -n fails): on this machine'"'"'s lo\n' >&2
fi
runbook=$(realpath "${1:-${here}/device/relay.sh}")
src=${SRC:-/opt/torch/.venv}
dst=${DST:-/opt/rb-relay/.venv}
src_cpus=${SRC_CPUS:-0-3}
dst_cpus=${DST_CPUS:-4-7}
here_cpus=${HERE_CPUS:-8-11}
rate=${RATE:-1gbit}
rounds=${ROUNDS:-2}
streams=${STREAMS:-8}
deadline=${DEADLINE:-540}
row_timeout=${ROW_TIMEOUT:-240}
out=${OUT:-${PWD}/device-three-out}
top=/tmp/rb-device
records=${out}/three-rows.tsv
logs=/tmp/rb-three-logs      # the runbook's and the sshd's logs, one file each in $OUT at the end
mkdir -p "${out}"
rm -rf "${logs}"
mkdir -p "${logs}"
: >"${records}"
log() { printf '%(%H:%M:%S)T %s\n' -1 "$*" >&2; }
t0=${SECONDS}

DEV_TOP=${top} DEV_HERE=${here} DEV_SRC=${src}
# shellcheck source=benchmarks/device/common.sh
source "${here}/device/common.sh"
# $OUT takes 8 files back at most: the logs go in two
finish() {
  local rc=$? f
  tc qdisc del dev lo root 2>/dev/null || true
  dev_stop "${logs}"
  for f in "${logs}"/runbook-*.log; do
    [[ -e "${f}" ]] && printf '===== %s\n' "${f##*/}" && cat "${f}"
  done >"${out}/runbook.log" 2>/dev/null || true
  for f in "${logs}"/busy-*.txt; do
    [[ -e "${f}" ]] && printf '===== %s\n' "${f##*/}" && cat "${f}"
  done >"${out}/busy.log" 2>/dev/null || true
  for f in "${logs}"/sshd-*.log "${logs}"/tc.err; do
    [[ -e "${f}" ]] && printf '===== %s\n' "${f##*/}" && cat "${f}"
  done >"${out}/sshd.log" 2>/dev/null || true
  exit "${rc}"
}
trap finish EXIT
dev_tools
[[ -z "${RB3_NETNS:-}" ]] || ip link set lo up
# this script and everything it starts on this machine's CPUs; the sshd on theirs
taskset -a -p -c "${here_cpus}" $$ >/dev/null
dev_keys
dev_sshd a 127.0.0.2 "${src_cpus}"
dev_sshd b 127.0.0.3 "${dst_cpus}"
log "CPUs: src ${src_cpus} (sshd a), dst ${dst_cpus} (sshd b), here ${here_cpus}; $(nproc --all) online"
dev_payload "${dst}"       # hand, bytes

# ---------------------------------------------------------------- shaping
shape_on() {
  local leg
  tc qdisc del dev lo root 2>/dev/null || true
  tc qdisc add dev lo root handle 1: htb || return 1
  for leg in 10 20; do
    tc class add dev lo parent 1: classid "1:${leg}" htb rate "${rate}" ceil "${rate}" \
      burst 1mb cburst 1mb quantum 200000 || return 1
  done
  # the source's leg: what sshd a sends; the destination's: what goes to sshd b
  tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip src 127.0.0.2/32 \
    match ip sport 2222 0xffff flowid 1:10 || return 1
  tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip dst 127.0.0.3/32 \
    match ip dport 2222 0xffff flowid 1:20 || return 1
  # the proof: 64 MB of zeros through one relay stream
  local s e
  s=${EPOCHREALTIME}
  { wide; on 127.0.0.2 "${AES}" "head -c 64000000 /dev/zero"; } | on 127.0.0.3 "${AES}" 'cat >/dev/null'
  e=${EPOCHREALTIME}
  log "shaped ${rate}: 64 MB relayed in $(awk -v s="${s}" -v e="${e}" 'BEGIN { printf "%.2f s, %d MB/s", e - s, 64 / (e - s) }')"
}
shape_off() { tc qdisc del dev lo root 2>/dev/null || true; }
shapes=(shaped unshaped)
if [[ "${SHAPE:-1}" == only ]]; then
  shapes=(shaped)
elif [[ "${SHAPE:-1}" != 1 ]]; then
  shapes=(unshaped)
elif ! shape_on 2>"${logs}/tc.err"; then
  log "no shaping here (tc: $(tail -n 1 "${logs}/tc.err")): unshaped rows only"
  shapes=(unshaped)
fi
shape_off

# ---------------------------------------------------------------- CPU seconds by CPU set
tick=$(getconf CLK_TCK)
# busy jiffies of each CPU (user nice system irq softirq steal) into the array named $1
# shellcheck disable=SC2034 # into: the caller's array
snap() {
  local -n into=$1
  local name u n s q sq st rest
  into=()
  while read -r name u n s _ _ q sq st rest; do
    [[ "${name}" =~ ^cpu([0-9]+)$ ]] || continue
    into[${BASH_REMATCH[1]}]=$((u + n + s + q + sq + st))
  done </proc/stat
}
# the CPU seconds the CPUs of list $1 spent between the snapshots named $2 and $3
spent() {
  local -n a=$2 b=$3
  local part lo hi c sum=0
  for part in ${1//,/ }; do
    lo=${part%-*} hi=${part#*-}
    for ((c = lo; c <= hi; c++)); do
      sum=$((sum + ${b[c]:-0} - ${a[c]:-0}))
    done
  done
  awk -v j="${sum}" -v t="${tick}" 'BEGIN { printf "%.2f", j / t }'
}

# ---------------------------------------------------------------- the runbook's form by hand
# the runbook's one stream by hand: its tar record, zstd -3 with 2, 3 or 4 threads (what bounds
# the one stream at RATE: its packers, or the wire)
row_zstd3() {
  on 127.0.0.2 "${AES}" "tar -b 256 -cf - -C '${src}' . | zstd -q -3 -T$1 -c" |
    on 127.0.0.3 "${AES}" "zstd -q -d -c | tar -b 256 -xf - -C '${hand}'"
}
row_zstd3t2() { row_zstd3 2; }
row_zstd3t3() { row_zstd3 3; }
row_zstd3t4() { row_zstd3 4; }

# ---------------------------------------------------------------- the runbook's rows
row_cold() { RB_RUN_DIR=${top}/run bash "${runbook}" 2>"${logs}/runbook-cold-${shape}-${r}.log" >&2; }
row_rerun() { RB_RUN_DIR=${top}/run bash "${runbook}" 2>"${logs}/runbook-rerun-${shape}-${r}.log" >&2; }
# a row's time before it ran once (round 1; after: its last): the shaped rows by the bytes they
# put on the link (the seed's all of them, lz4's about half, zstd's a third), the others 30 s
bps=$(awk -v r="${rate}" 'BEGIN { n = r + 0; u = tolower(r); sub(/^[0-9.]+/, "", u)
  m = (u ~ /^g/) ? 1e9 : (u ~ /^m/) ? 1e6 : (u ~ /^k/) ? 1e3 : 1; print int(n * m / 8) }')
guess() {
  case "${shape}/$1" in
    shaped/seed) echo $((bytes / bps)) ;;
    shaped/lz4) echo $((bytes / bps / 2)) ;;
    shaped/zstd* | shaped/cold) echo $((bytes / bps / 3)) ;;
    */rerun) echo 5 ;;
    *) echo 30 ;;
  esac
}
declare -A last=()
# run row $1 (row_$1) in the current shape, timed; its record into $records
timed() {
  local n=$1 s e took rc note='' key="$1/${shape}" pid dog cs cd ch busy=
  # shellcheck disable=SC2034 # filled by snap, read by spent
  local -a before=() after=()
  if ((SECONDS - t0 + ${last[${key}]:-$(guess "${n}")} > deadline)); then
    log "${shape} ${n}: skipped (it would end past ${deadline} s)"
    return 0
  fi
  case "${n}" in
    seed | lz4 | zstd*) prep ;;
    cold) rm -rf "${dst}" "${top}/run"; sync ;;
  esac
  if [[ "${BUSY:-0}" == 1 ]]; then
    python3 -I "${here}/device/busy.py" --set "src=${src_cpus}" --set "dst=${dst_cpus}" \
      --set "here=${here_cpus}" --most "${row_timeout}" >"${logs}/busy-${n}-${shape}-${r}.txt" &
    busy=$!
  fi
  snap before
  s=${EPOCHREALTIME}
  # the row in a process group of its own (job control), killed whole past ROW_TIMEOUT
  set -m
  "row_${n}" &
  pid=$!
  { sleep "${row_timeout}" && kill -TERM -- "-${pid}" 2>/dev/null; } &
  dog=$!
  set +m
  rc=0
  wait "${pid}" || rc=$?
  e=${EPOCHREALTIME}
  kill -- "-${dog}" 2>/dev/null || true
  wait "${dog}" 2>/dev/null || true
  snap after
  if [[ -n "${busy}" ]]; then
    kill -TERM "${busy}" 2>/dev/null || true
    wait "${busy}" 2>/dev/null || true
  fi
  took=$(awk -v s="${s}" -v e="${e}" 'BEGIN { printf "%.2f", e - s }')
  last[${key}]=${took%.*}
  if [[ "${n}" == cold || "${n}" == rerun ]]; then
    note=$({ grep -h -E "compression: |relay: [0-9]+ stream" "${logs}/runbook-${n}-${shape}-${r}.log"
      python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
print("steps: " + " ".join("%s=%.2f" % (s["id"], s["duration_s"]) for s in d["steps"]))' \
        "${top}/run/report.json"; } 2>/dev/null | tr '\t' ' ' | tr '\n' '|' || true)
    note=${note%|}
    # the run's own log (the model's every figure: `compression: ... every figure in run.log`)
    cp -- "${top}/run/run.log" "${logs}/runbook-${n}-${shape}-${r}.run.log" 2>/dev/null || true
  fi
  cs=$(spent "${src_cpus}" before after)
  cd=$(spent "${dst_cpus}" before after)
  ch=$(spent "${here_cpus}" before after)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "${n}" "${shape}" "${r}" "${took}" "${rc}" \
    "${cs}" "${cd}" "${ch}" "${note}" >>"${records}"
  log "${shape} ${n}: ${took} s$( ((rc == 0)) || printf ' FAILED (rc %d)' "${rc}"); CPU-s src ${cs}, dst ${cd}, here ${ch}"
  [[ -z "${note}" ]] || log "    ${note//|/$'\n'    }"
}

for ((r = 1; r <= rounds; r++)); do
  order=("${shapes[@]}")
  if ((r % 2 == 0 && ${#shapes[@]} == 2)); then
    order=(unshaped shaped)
  fi
  for shape in "${order[@]}"; do
    if [[ "${shape}" == shaped ]]; then shape_on; else shape_off; fi
    read -r -a rows <<<"${ROWS:-seed lz4 zstd cold rerun}"
    [[ "${shape}" == shaped ]] || rows=(nullN "${rows[@]}")
    for n in "${rows[@]}"; do
      timed "${n}"
    done
  done
done
shape_off
rm -rf "${hand}"
python3 "${here}/device/three_summary.py" "${records}" "${out}/device_three.json" "${bytes}" \
  "${rate}" "${src_cpus}" "${dst_cpus}" "${here_cpus}" "${streams}" "${ZSTD_T:-4}"
