#!/usr/bin/env bash
# @generated from specs/b300.yaml (sha256 17341eb91c1d3e8c9c62374a3d4e7f60dabf278779332a5964dff3f7ae4653c8) by runbook-compiler 0.1.0 -- DO NOT EDIT.
# Edit the spec and recompile: compile specs/b300.yaml
# sha256 of this file with these 64 digits zeroed: 17fd68ae43398354a9a98859632aaeedb9ca086fb1e27e568b218aaa0b0c07e7
# Move the SGLang + DDTree venv from ct200 to the 8x B300 node and prove it works on sm_103.
#
# Usage: bash b300.sh [--list | --dry-run | --only STEP | --from STEP] [--report PATH] [--version]
#
# ShellCheck exclusions, for the whole file, each for a reason:
#   SC2016: scripts run by `sh -c` on a host (here or over ssh) are single-quoted on purpose, so that
#   `$1` in them expands there; their arguments travel quoted by rb::shq.
#   SC1003: spec values are single-quoted by the compiler (Python's shlex.quote), right by
#   construction; a value may hold a backslash, which this check takes for a mistyped escape.
# shellcheck disable=SC2016,SC1003
set -Eeuo pipefail
shopt -s inherit_errexit
if ((BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] < 404)); then
  echo "this runbook needs bash 4.4 or newer (found ${BASH_VERSION})" >&2
  exit 2
fi

#######################################
# Settings, from the spec. Every value is quoted by the compiler.
#######################################
# The runbook and its spec.
readonly RB_NAME=b300
readonly RB_SPEC=specs/b300.yaml
readonly RB_SPEC_SHA256=17341eb91c1d3e8c9c62374a3d4e7f60dabf278779332a5964dff3f7ae4653c8
readonly RB_COMPILER_VERSION=0.1.0
# The kit (hostkit/): .kit/<sha256>.tar beside this runbook, checked against this hash.
readonly RB_KIT_SHA256=a4de07cbd987d4f3c98092cdad4650e5d380a9992104b88b07c78457bd3f0482
readonly RB_KIT_FILE=.kit/a4de07cbd987d4f3c98092cdad4650e5d380a9992104b88b07c78457bd3f0482.tar
# AES-GCM first: the relay is CPU-bound.
readonly RB_SSH_CIPHERS=aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com
# transfer (specs/b300.yaml:7)
readonly RB_SRC_HOST=ct200
readonly RB_SRC_PATH=/opt/sglang/.venv
readonly RB_DST_HOST=b300
readonly RB_DST_PATH=/opt/sglang/.venv
readonly RB_ROUTE=relay
readonly RB_COMPRESSION=auto
readonly RB_VERIFY=sha256
readonly RB_ON_EXISTING=backup
readonly RB_RERUN=quick
# a re-run that finds changes sends only them (see docs/design.md)
readonly RB_INCREMENTAL=1
# hashing threads on each host (auto: one per CPU)
readonly RB_JOBS=auto
# cuda
readonly RB_CUDA_HOME=/usr/local/cuda-13.0
readonly RB_ENV_FILE=''
# on_failed_checks: what a failed check after the swap does
readonly RB_ON_FAILED_CHECKS=rollback
# The checks, as one JSON document for the probe on the target.
readonly RB_PROBE_CONFIG='{"checks":[{"allow_skip":false,"id":"relocation","params":{"old":"/opt/sglang/.venv"},"type":"relocation"},{"allow_skip":false,"id":"kernel_audit","params":{},"type":"kernel_audit"},{"allow_skip":false,"id":"torch","params":{"cuda":"13.0","version":"2.11.0"},"type":"torch"},{"allow_skip":false,"id":"devices","params":{},"type":"devices"},{"allow_skip":false,"id":"matmul","params":{"dtype":"bfloat16","every_device":true,"size":4096},"type":"matmul"},{"allow_skip":false,"id":"imports","params":{"modules":["sglang","flashinfer","sgl_kernel"]},"type":"imports"}],"cuda":{"home":"/usr/local/cuda-13.0","library_dirs":[],"library_path_first":["nvidia/cu13/lib"],"version":"13.0"},"gpu":{"arch":"sm_103","capability":"10.3","count":8,"model":"B300"},"host":"b300","schema":1,"venv":null}'
# Each file of the spec and its sha256: a run refuses to start when one changed.
readonly -a RB_SPEC_FILES=(specs/b300.yaml=17341eb91c1d3e8c9c62374a3d4e7f60dabf278779332a5964dff3f7ae4653c8)
# Hosts this runbook touches.
readonly -a RB_HOSTS=(ct200 b300)
readonly -a RB_STEPS=(preflight manifest transfer verify relocate swap exports probe)
# transfer.exclude
readonly -a RB_EXCLUDE_ARGS=(--exclude __pycache__ --exclude '*.pyc')
# cuda.library_path_first, relative to the venv's site-packages
readonly -a RB_LIB_FIRST=(nvidia/cu13/lib)
# env
readonly -a RB_ENV=()
# route direct/auto: ssh arguments the source uses to reach the destination
readonly -a RB_DIRECT_SSH=()
declare -rA RB_STEP_DOC=(
  [preflight]='Reach every host, ship the kit, check tools, source, destination and free space.'
  [manifest]='Hash every file of the source (in parallel) into a manifest; detect a re-run and what an incremental one must send.'
  [transfer]='Stream the source into a staging directory beside the destination.'
  [verify]='Check the staging copy against the manifest: every file, mode, link and digest.'
  [relocate]='Rewrite what names the old path (shebangs, activate scripts) for the new one.'
  [swap]='Put the verified copy in place in one rename; keep or remove what was there.'
  [exports]='Write the env file: CUDA_HOME, PATH, LD_LIBRARY_PATH with the venv'"'"'s libs first.'
  [probe]='Run the checks with the moved interpreter on the target; fetch the report.'
)
declare -rA RB_STEP_PREVIEW=(
  [preflight]='on ct200: connect; copy the kit to /tmp/rbkit-<id>; check tar and python3 >= 3.9
on b300: connect; copy the kit to /tmp/rbkit-<id>; check tar and python3 >= 3.9
on ct200: rbkit scan /opt/sglang/.venv --exclude __pycache__ --exclude '"'"'*.pyc'"'"'
on b300: rbkit scan /opt/sglang/.venv; rbkit free /opt/sglang/..venv.rb-staging
compression: zstd -1 if both ends have zstd, else none'
  [manifest]='on ct200: rbkit manifest build /opt/sglang/.venv --exclude __pycache__ --exclude '"'"'*.pyc'"'"' --algo sha256 --jobs auto
here: keep a copy in runs/b300/manifest.jsonl; send it to b300
on b300: if /opt/sglang/.venv/.rb-manifest.jsonl matches, skip the install
on b300: if it differs, rbkit stage: link unchanged files from /opt/sglang/.venv into /opt/sglang/..venv.rb-staging, send only the rest'
  [transfer]='on b300: rm -rf /opt/sglang/..venv.rb-staging && mkdir -p /opt/sglang/..venv.rb-staging
on ct200: tar -C /opt/sglang/.venv --null --no-recursion -T <manifest names> -cf - | <compress: zstd -1 if both ends have zstd, else none>
  | through this machine (relay) |
on b300: <decompress> | tar -C /opt/sglang/..venv.rb-staging -xf - --no-same-owner'
  [verify]='on b300: rbkit manifest verify /opt/sglang/..venv.rb-staging <manifest> --jobs auto'
  [relocate]='on b300: rbkit relocate /opt/sglang/..venv.rb-staging --old /opt/sglang/.venv --new /opt/sglang/.venv'
  [swap]='on b300: rbkit swap /opt/sglang/..venv.rb-staging /opt/sglang/.venv --policy backup
on b300: /opt/sglang/.venv/bin/python -c '"'"'import sys; print(sys.prefix)'"'"'; /opt/sglang/.venv/bin/pip --version'
  [exports]='on b300: write /opt/sglang/.venv.env.sh
  CUDA_HOME=/usr/local/cuda-13.0; LD_LIBRARY_PATH: nvidia/cu13/lib (in site-packages), then $CUDA_HOME/lib64'
  [probe]='on b300: source the env file; /opt/sglang/.venv/bin/python -m rbprobes run: torch, devices, matmul, imports
here: fetch the report to runs/b300/probe-b300.json'
)
declare -rA RB_STEP_HOST=(
  [preflight]='ct200->b300'
  [manifest]=ct200
  [transfer]='ct200->b300'
  [verify]=b300
  [relocate]=b300
  [swap]=b300
  [exports]=b300
  [probe]=b300
)

#######################################
# Runtime: logging, the step runner, host access. The same in every runbook.
#######################################
RB_STEP=''
RB_HOST=''
RB_LAST_CMD=''
RB_RUN_DIR=${RB_RUN_DIR:-}
RB_REPORT=${RB_REPORT:-}
RB_LOCAL_PY=python3
RB_WORK=''
RB_EVENTS=''
RB_STEP_START=0
RB_FINISHED=0
RB_DRY_RUN=0
RB_FAILED_STEP=''
RB_SRC_BYTES=0
RB_SRC_FILES=0
RB_COMPRESSION_USED=none
declare -a RB_BG_PIDS=()
RB_STEP_DETAIL=''
declare -a RB_HOST_SSH=()
RB_HOST_TARGET=''
declare -a RB_PROBE_REPORTS=()
declare -A RB_KIT_DIR=()
RB_KIT_TAR_SHA256=''
RB_ALLOW_EDITED=0
RB_EDITED=''
declare -A RB_PY=()
declare -A RB_J=()

# The sending end of every stream (a single-host transfer, a fan-out pack), run on the source:
# $1 directory, $2 NUL-separated names, $3 compression; with $4, the stream goes on through
# ssh with the arguments from $5 on, to $4 (the direct route), instead of stdout.
readonly RB_PACK_SCRIPT='set -o pipefail
pack() {
  case "$3" in
    zstd) tar -C "$1" --null --no-recursion -T "$2" -cf - | zstd -q -1 -T0 ;;
    lz4) tar -C "$1" --null --no-recursion -T "$2" -cf - | lz4 -q -1 -c ;;
    gzip) tar -C "$1" --null --no-recursion -T "$2" -cf - | gzip -1 ;;
    *) tar -C "$1" --null --no-recursion -T "$2" -cf - ;;
  esac
}
if [ "$#" -gt 3 ]; then
  src=$1 names=$2 comp=$3 remote=$4
  shift 4
  pack "${src}" "${names}" "${comp}" | ssh "$@" "${remote}"
else
  pack "$1" "$2" "$3"
fi'

#######################################
# Set RB_COMPRESSION_USED from the spec's compression and what the given hosts (the stream's ends)
# have: auto takes zstd where every end has it, else none; a named tool one end lacks fails.
#######################################
rb::choose_compression() {
  local want=${RB_COMPRESSION} tool host
  RB_COMPRESSION_USED=none
  case "${want}" in
    none) return 0 ;;
    auto) tool=zstd ;;
    *) tool=${want} ;;
  esac
  for host in "$@"; do
    if ! rb::on_host "${host}" sh -c 'command -v "$1" >/dev/null' rb "${tool}"; then
      if [[ "${want}" == auto ]]; then
        rb::log "compression: ${tool} missing on ${host}, sending uncompressed"
        return 0
      fi
      rb::fail "compression ${want} was asked for, but ${host} has no ${tool}"
    fi
  done
  RB_COMPRESSION_USED=${tool}
  rb::log "compression: ${tool} (every end has it)"
}

#######################################
# Log a line to stderr: time, runbook, step, message.
#######################################
rb::log() {
  printf '%(%H:%M:%S)T %s [%s] %s\n' -1 "${RB_NAME}" "${RB_STEP:-main}" "$*" >&2
}

#######################################
# Fail the current step with a message (the ERR trap reports it).
#######################################
rb::fail() {
  RB_LAST_CMD="$*"
  if [[ -n "${RB_WORK}" ]]; then
    printf '%s\n%s\n' "${RB_HOST}" "${RB_LAST_CMD}" >"${RB_WORK}/last-command"
  fi
  rb::log "ERROR: $*"
  return 1
}

#######################################
# Milliseconds since the epoch.
#######################################
rb::now_ms() {
  local t=${EPOCHREALTIME/[.,]/}
  printf '%s' "${t:0:13}"
}

#######################################
# Append a record to the event log (tab-separated; tabs and newlines folded to spaces).
#######################################
rb::event() {
  local IFS=$'\t' fields=() f
  for f in "$@"; do
    f=${f//$'\t'/ }
    fields+=("${f//$'\n'/ }")
  done
  if [[ -n "${RB_EVENTS}" ]]; then
    printf '%s\n' "${fields[*]}" >>"${RB_EVENTS}"
  fi
}

#######################################
# Record a measured fact of the current step (shown in the summary and the report).
#######################################
rb::fact() {
  rb::event fact "${RB_STEP}" "$1" "$2"
}

#######################################
# Quote words for a POSIX shell on the far side of ssh: 'a' 'b'\''c'.
#######################################
rb::shq() {
  local out='' word q="'" bs="\\"
  for word in "$@"; do
    out+="${q}${word//${q}/${q}${bs}${q}${q}}${q} "
  done
  printf '%s' "${out% }"
}

#######################################
# Is HOST this machine?
#######################################
rb::is_local() {
  "rb::host_$1"
  [[ -z "${RB_HOST_TARGET}" ]]
}

#######################################
# Run ARGV on HOST, stdin from /dev/null. Local hosts run it directly; ssh hosts through the
# shared (multiplexed) connection, with the argv quoted for the remote shell.
#######################################
rb::on_host() {
  rb::_on_host "$@" </dev/null
}

#######################################
# Like rb::on_host, but stdin is passed through (the receiving end of a stream).
#######################################
rb::pipe_on_host() {
  rb::_on_host "$@"
}

rb::_on_host() {
  local host=$1
  shift
  RB_HOST=${host}
  "rb::host_${host}"
  RB_LAST_CMD="on ${host}: $(rb::shq "$@")"
  # also on disk: a command inside $(...) runs in a subshell, whose variables the ERR trap never sees
  if [[ -n "${RB_WORK}" ]]; then
    printf '%s\n%s\n' "${host}" "${RB_LAST_CMD}" >"${RB_WORK}/last-command"
  fi
  if [[ -z "${RB_HOST_TARGET}" ]]; then
    "$@"
  else
    # the spec's options first: for ssh the first value of an option wins
    ssh "${RB_HOST_SSH[@]}" "${RB_SSH_COMMON[@]}" -- "${RB_HOST_TARGET}" "$(rb::shq "$@")"
  fi
}

#######################################
# The kit's directory on HOST (set by rb::kit_ship).
#######################################
rb::kit_dir() {
  printf '%s' "${RB_KIT_DIR[$1]}"
}

#######################################
# Run `python3 -m rbkit ARGS...` on HOST.
#######################################
rb::kit() {
  local host=$1
  shift
  rb::on_host "${host}" env PYTHONPATH="${RB_KIT_DIR[${host}]}" PYTHONDONTWRITEBYTECODE=1 \
    "${RB_PY[${host}]:-python3}" -m rbkit "$@"
}

#######################################
# Give HOST the kit: this machine uses the run directory's copy; an ssh host gets a private
# directory made for this run (mktemp -d: 0700, owned by the ssh user), into which the kit's tar
# is sent and checked against its sha256 there before it is unpacked. Nothing is reused from an
# earlier run, so nothing another user of the host planted is ever run. rb::cleanup removes it.
#######################################
rb::kit_ship() {
  local host=$1 dir
  if [[ -n "${RB_KIT_DIR[${host}]:-}" ]]; then
    return 0
  fi
  if rb::is_local "${host}"; then
    RB_KIT_DIR[${host}]="${RB_RUN_DIR}/kit"
    return 0
  fi
  dir=$(rb::on_host "${host}" sh -c 'umask 077 && mktemp -d /tmp/rbkit.XXXXXXXXXX') ||
    rb::fail "could not make a private directory for the kit on ${host}"
  RB_KIT_DIR[${host}]=${dir}
  rb::pipe_on_host "${host}" sh -c 'set -e
    cat >"$1/kit.tar"
    got=$(python3 -c "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], \"rb\").read()).hexdigest())" "$1/kit.tar")
    if [ "${got}" != "$2" ]; then echo "the kit arrived with sha256 ${got}, not $2" >&2; exit 1; fi
    tar -C "$1" -xf "$1/kit.tar" --no-same-owner --no-same-permissions
    rm -f "$1/kit.tar"' rbkit "${dir}" "${RB_KIT_TAR_SHA256}" <"${RB_WORK}/kit.tar" ||
    rb::fail "could not ship the kit to ${host}:${dir} (above)"
  if [[ "${host}" == "${RB_DST_HOST}" && -f "${RB_RUN_DIR}/manifest.jsonl" ]]; then
    # a --from/--only run goes on from the manifest this machine kept, never one left on the host
    rb::pipe_on_host "${host}" sh -c 'cat >"$1"' rb "${dir}/${RB_NAME}.manifest.jsonl" \
      <"${RB_RUN_DIR}/manifest.jsonl"
  fi
}

#######################################
# The sha256 of a file here (hashlib: coreutils' sha256sum is slower on some hosts).
#######################################
rb::sha256() {
  "${RB_LOCAL_PY}" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$1"
}

#######################################
# Name the failed stages of a pipeline and fail. Arguments: a label, one name per stage, then
# PIPESTATUS.
#######################################
rb::pipe_failed() {
  local label=$1 n i msg=''
  shift
  n=$(($# / 2))
  local -a names=("${@:1:n}") codes=("${@:n+1}")
  for ((i = 0; i < n; i++)); do
    if ((codes[i] != 0)); then
      msg+=" ${names[i]} exited ${codes[i]};"
    fi
  done
  rb::fail "${label} failed:${msg%;}"
}

#######################################
# Parse a JSON object ($1) into RB_J: nested keys dotted ("totals.files"), lists and objects kept
# as JSON text, true/false as True/False. One python3 start per document.
#######################################
rb::jparse() {
  local key value
  RB_J=()
  while IFS=$'\t' read -r key value; do
    RB_J[${key}]=${value}
  done < <("${RB_LOCAL_PY}" -c 'import json, sys
def walk(prefix, v):
    if isinstance(v, dict):
        for k, x in v.items():
            walk(prefix + [str(k)], x)
        if prefix:
            print(".".join(prefix) + "\t" + json.dumps(v))
    else:
        text = json.dumps(v) if isinstance(v, list) else ("" if v is None else str(v))
        print(".".join(prefix) + "\t" + text.replace("\t", " ").replace("\n", " "))
walk([], json.loads(sys.argv[1]))' "$1")
}

#######################################
# Bytes as a short human figure: 1234567 -> 1.2 MB.
#######################################
rb::human() {
  local n=$1 units=(B KB MB GB TB PB) i=0
  while ((n >= 1000000 && i < 4)); do
    n=$((n / 1000))
    i=$((i + 1))
  done
  if ((n >= 1000)); then
    printf '%d.%d %s' $((n / 1000)) $((n % 1000 / 100)) "${units[i + 1]}"
  else
    printf '%d %s' "${n}" "${units[i]}"
  fi
}

#######################################
# Make an absolute path of a spec path on HOST: relative paths (local hosts only) are taken from
# the directory the runbook runs in.
#######################################
rb::abspath() {
  local host=$1 path=$2
  if [[ "${path}" == /* ]]; then
    printf '%s' "${path}"
  elif rb::is_local "${host}"; then
    printf '%s/%s' "${PWD}" "${path}"
  else
    rb::fail "relative path ${path} on ssh host ${host}"
  fi
}

#######################################
# Refuse to run a runbook edited by hand (its sha256 line no longer matches its text) or one whose
# spec (any file of its extends chain, where it is reachable at the recorded path) changed since
# it was compiled. --allow-edited runs it anyway and says so in the log and the report.
# Sets RB_EDITED to what differs. Returns 1 to refuse.
#######################################
rb::check_sealed() {
  local out
  if ! out=$(python3 - "${BASH_SOURCE[0]}" "${RB_SPEC_FILES[@]}" <<'PY'
import hashlib
import re
import sys

data = open(sys.argv[1], "rb").read()
seal = re.search(rb"^# sha256 of this file with these 64 digits zeroed: ([0-9a-f]{64})$", data, re.M)
if not seal or hashlib.sha256(data[:seal.start(1)] + b"0" * 64 + data[seal.end(1):]).hexdigest() \
        != seal.group(1).decode():
    print("this runbook was edited after it was compiled")
for item in sys.argv[2:]:
    path, _, want = item.rpartition("=")
    try:
        with open(path, "rb") as f:
            got = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        continue  # not reachable from here: nothing to compare
    if got != want:
        print(f"{path} changed since this runbook was compiled")
PY
  ); then
    echo "could not check this runbook's own hash (python3 failed)" >&2
    return 1
  fi
  if [[ -z "${out}" ]]; then
    return 0
  fi
  RB_EDITED=${out//$'\n'/; }
  if ((RB_ALLOW_EDITED)); then
    return 0
  fi
  printf '%s\n' "${out}" >&2
  echo "refusing to run: compile ${RB_SPEC} again and review the new runbook (or run it anyway" \
    "with --allow-edited, which the log and the report record)" >&2
  return 1
}

#######################################
# --version: what wrote this runbook, from which spec, with which kit.
#######################################
rb::version() {
  echo "runbook ${RB_NAME}: compiled by runbook-compiler ${RB_COMPILER_VERSION} from ${RB_SPEC}" \
    "(sha256 ${RB_SPEC_SHA256}); kit sha256 ${RB_KIT_SHA256} (${RB_KIT_FILE:-embedded})"
}

#######################################
# Run one step: log it, time it, record it. A failure goes to rb::on_err through the ERR trap.
#######################################
rb::run_step() {
  local id=$1 detail
  RB_STEP=${id}
  RB_HOST=${RB_STEP_HOST[${id}]}
  RB_LAST_CMD=''
  RB_STEP_DETAIL=''
  rm -f "${RB_WORK}/last-command"
  rb::log "step ${id}: ${RB_STEP_DOC[${id}]}"
  RB_STEP_START=$(rb::now_ms)
  "step_${id}"
  detail=${RB_STEP_DETAIL}
  rb::event step "${id}" ok "${RB_STEP_START}" "$(rb::now_ms)" "${RB_STEP_HOST[${id}]}" "${detail}"
  rb::log "step ${id}: ok${detail:+ (${detail})}"
  RB_STEP=''
}

#######################################
# ERR trap: name the step, the host and the command, write the report, exit non-zero.
#######################################
rb::on_err() {
  local rc=$? line=$1
  trap - ERR
  set +e
  if [[ -z "${RB_LAST_CMD}" && -f "${RB_WORK}/last-command" ]]; then
    { read -r RB_HOST; read -r RB_LAST_CMD; } <"${RB_WORK}/last-command"
  fi
  rb::log "FAILED (rc=${rc}) in step ${RB_STEP:-main} on host ${RB_HOST:-this machine}, line ${line}"
  rb::log "  command: ${RB_LAST_CMD:-${BASH_COMMAND}}"
  RB_FAILED_STEP=${RB_STEP}
  if [[ -n "${RB_STEP}" ]]; then
    rb::event step "${RB_STEP}" failed "${RB_STEP_START}" "$(rb::now_ms)" "${RB_HOST}" \
      "rc=${rc}: ${RB_LAST_CMD:-${BASH_COMMAND}}"
  fi
  rb::finish failed
  exit "${rc}"
}

#######################################
# INT/TERM: the destination is only ever replaced by the swap step, so stopping is safe.
#######################################
rb::on_signal() {
  trap - ERR INT TERM
  set +e
  rb::log "interrupted in step ${RB_STEP:-main}; the destination was not replaced unless the swap step had finished"
  if [[ -n "${RB_STEP}" ]]; then
    rb::event step "${RB_STEP}" interrupted "${RB_STEP_START}" "$(rb::now_ms)" "${RB_HOST}" ""
  fi
  rb::finish interrupted
  exit 130
}

#######################################
# Write the JSON report and print the summary. Argument: the outcome.
#######################################
rb::finish() {
  local outcome=$1 probe
  local -a probe_args=()
  if ((RB_FINISHED)) || [[ -z "${RB_WORK}" ]] || ((RB_DRY_RUN)); then
    return 0
  fi
  RB_FINISHED=1
  for probe in "${RB_PROBE_REPORTS[@]}"; do
    probe_args+=(--probe "${probe}")
  done
  env PYTHONPATH="${RB_RUN_DIR}/kit" python3 -m rbkit report --name "${RB_NAME}" --spec "${RB_SPEC}" \
    --sha "${RB_SPEC_SHA256}" --events "${RB_EVENTS}" --outcome "${outcome}" \
    --out "${RB_REPORT}" "${probe_args[@]}" || rb::log "could not write the report"
  rb::pictures
  rb::log "report: ${RB_REPORT}; log: ${RB_RUN_DIR}/run.log"
  if [[ "${outcome}" != ok ]]; then
    rb::log "${outcome}: see the step named above; re-run with --from ${RB_FAILED_STEP:-<step>} after fixing it"
  fi
}

#######################################
# Draw the run beside its report: timeline.svg, nodes.svg (fan-out), report.html. A drawing that
# fails is said, never the run's outcome.
#######################################
rb::pictures() {
  local -a fan=()
  if [[ -f "${RB_RUN_DIR}/fanout/fanout.json" ]]; then
    fan=(--fanout "${RB_RUN_DIR}/fanout/fanout.json")
  fi
  if env PYTHONPATH="${RB_RUN_DIR}/kit" PYTHONDONTWRITEBYTECODE=1 "${RB_LOCAL_PY}" -m rbkit.pictures \
    --report "${RB_REPORT}" --events "${RB_EVENTS}" --out "$(dirname "${RB_REPORT}")" "${fan[@]}" \
    >/dev/null; then
    rb::log "pictures: $(dirname "${RB_REPORT}")/report.html (timeline.svg${fan[*]:+, nodes.svg})"
  else
    rb::log "could not draw the pictures of this run (above); the report is complete"
  fi
}

#######################################
# Print the usage.
#######################################
rb::usage() {
  cat <<USAGE
Usage: bash ${0##*/} [options]
Runbook ${RB_NAME}, compiled from ${RB_SPEC}.

  --list          list the steps with one-line descriptions
  --dry-run       print what each step would run on which host; run nothing
  --only STEP     run one step (with the preflight it needs)
  --from STEP     run from STEP to the end (with the preflight it needs)
  --report PATH   write the JSON report to PATH (default: runs/${RB_NAME}/report.json)
  --restore [N]   put backup N (default: the newest) of the destination back in place
  -h, --help      this text

Environment: RB_RUN_DIR (default runs/${RB_NAME}) holds the log, the manifest and the reports.
Exit status: 0 all steps and checks passed; 1 a step or check failed; 2 usage; 130 interrupted.
USAGE
}

#######################################
# --list and --dry-run.
#######################################
rb::list() {
  local id i=0
  for id in "${RB_STEPS[@]}"; do
    i=$((i + 1))
    printf '%2d. %-10s %s\n' "${i}" "${id}" "${RB_STEP_DOC[${id}]}"
  done
}

rb::dry_run() {
  local id i=0
  for id in "${RB_STEPS[@]}"; do
    i=$((i + 1))
    printf '%d. %s: %s\n' "${i}" "${id}" "${RB_STEP_DOC[${id}]}"
    printf '%s\n' "${RB_STEP_PREVIEW[${id}]}" | sed 's/^/     /'
  done
}

#######################################
# Host ct200 (specs/b300.yaml:5): root@ct200.lab.internal over ssh
# Sets RB_HOST_SSH to the ssh options from the spec and RB_HOST_TARGET to user@host (both empty:
# this machine).
#######################################
rb::host_ct200() {
  RB_HOST_SSH=(-o ConnectTimeout=10 -o StrictHostKeyChecking=yes)
  RB_HOST_TARGET=root@ct200.lab.internal
}

#######################################
# Host b300 (specs/b300.yaml:6): ubuntu@b300.lab.internal over ssh
# Sets RB_HOST_SSH to the ssh options from the spec and RB_HOST_TARGET to user@host (both empty:
# this machine).
#######################################
rb::host_b300() {
  RB_HOST_SSH=(-o ConnectTimeout=10 -o StrictHostKeyChecking=yes -p 22 -o IdentitiesOnly=yes -i "${HOME}"/.ssh/id_b300)
  RB_HOST_TARGET=ubuntu@b300.lab.internal
}

#######################################
# State of the single-host install (a fan-out runbook installs on its nodes instead and has
# templates/partials/fanout.sh.j2 in this place).
#######################################
RB_SKIP_INSTALL=0
RB_SRC_DISK=0
RB_ROUTE_USED=relay
RB_BACKUP_MADE=''
# the transfer hashes the source unless the manifest step already did in this run
RB_HASH_DURING_STREAM=1
RB_FINGERPRINT=''
# an incremental install: staging holds links to the unchanged files, the stream only the rest
RB_DELTA=0
RB_SEND_NAMES=''
RB_SRC_STAT=''
RB_STAGING=''
RB_ENV_OUT=''

#######################################
# Paths on the destination, once its absolute path is known: the staging beside it, the env file.
#######################################
rb::install_paths() {
  RB_STAGING="${RB_DST_ABS%/*}/.${RB_DST_ABS##*/}.rb-staging"
  RB_ENV_OUT=${RB_ENV_FILE:-${RB_DST_ABS}.env.sh}
}

#######################################
# The kit: Python tools this runbook runs on each host (hostkit/rbkit and hostkit/rbprobes),
# pinned by RB_KIT_SHA256 and read from RB_KIT_FILE beside this runbook (compile writes it;
# `compile --standalone` embeds the kit instead). A file whose hash differs is refused.
# Arguments: the directory to write them into.
#######################################
rb::kit_write() {
  local dir=$1 file got
  file="$(dirname "${BASH_SOURCE[0]}")/${RB_KIT_FILE}"
  if [[ ! -f "${file}" || -L "${file}" ]]; then
    rb::fail "the kit ${RB_KIT_FILE} is not beside this runbook (${file}): copy it along with" \
      "the runbook, or compile --standalone for a runbook that carries its kit"
  fi
  cp -- "${file}" "${RB_WORK}/kit.tar"
  got=$(rb::sha256 "${RB_WORK}/kit.tar")
  if [[ "${got}" != "${RB_KIT_SHA256}" ]]; then
    rb::fail "the kit ${file} has sha256 ${got}, not the ${RB_KIT_SHA256} this runbook pins;" \
      "recompile (compile writes the kit this runbook was reviewed with)"
  fi
  RB_KIT_TAR_SHA256=${got}
  mkdir -p "${dir}"
  tar -C "${dir}" -xf "${RB_WORK}/kit.tar" --no-same-owner --no-same-permissions
}

#######################################
# Step 1/8: preflight (specs/b300.yaml:4)
# Reach every host, ship the kit, check tools, source, destination and free space.
#######################################
step_preflight() {
  local host need free
  for host in "${RB_HOSTS[@]}"; do
    RB_PY[${host}]=$(rb::on_host "${host}" sh -c 'for t in tar python3; do command -v "$t" >/dev/null ||
      { echo "missing tool on this host: $t" >&2; exit 1; }; done
      exec python3 -c "import sys
if sys.version_info < (3, 9): sys.exit(\"python3 here is older than 3.9: \" + sys.version.split()[0])
print(sys.executable)"')
    rb::kit_ship "${host}"
  done
  rb::preflight_route
  rb::preflight_compression
  rb::jparse "$(rb::kit "${RB_SRC_HOST}" scan "${RB_SRC_ABS}" "${RB_EXCLUDE_ARGS[@]}" \
    --names "$(rb::kit_dir "${RB_SRC_HOST}")/${RB_NAME}.names")"
  if [[ "${RB_J[exists]}" != True ]]; then
    rb::fail "source ${RB_SRC_HOST}:${RB_SRC_ABS} does not exist"
  fi
  if [[ "${RB_J[is_venv]}" != True ]]; then
    rb::fail "source ${RB_SRC_HOST}:${RB_SRC_ABS} is not a venv (no pyvenv.cfg and bin/python)"
  fi
  RB_SRC_BYTES=${RB_J[bytes]}
  RB_SRC_DISK=${RB_J[disk_bytes]}
  RB_SRC_FILES=${RB_J[files]}
  RB_SRC_STAT=${RB_J[stat_fingerprint]}
  rb::log "source: ${RB_SRC_FILES} files, $(rb::human "${RB_SRC_BYTES}") apparent," \
    "$(rb::human "${RB_SRC_DISK}") on disk, after excludes"
  rb::fact files "${RB_SRC_FILES}"
  rb::fact bytes "${RB_SRC_BYTES}"
  rb::fact disk_bytes "${RB_SRC_DISK}"
  rb::jparse "$(rb::kit "${RB_DST_HOST}" scan "${RB_DST_ABS}")"
  if [[ "${RB_J[exists]}" == True ]]; then
    rb::log "destination ${RB_DST_HOST}:${RB_DST_ABS} exists (${RB_J[files]:-?} files);" \
      "on_existing is ${RB_ON_EXISTING}"
    if [[ "${RB_ON_EXISTING}" == refuse && "${RB_J[installed_manifest]}" != True ]]; then
      rb::fail "destination ${RB_DST_HOST}:${RB_DST_ABS} exists and on_existing is refuse;" \
        "move it away or set on_existing: backup"
    fi
  else
    rb::log "destination ${RB_DST_HOST}:${RB_DST_ABS} does not exist yet"
  fi
  rb::jparse "$(rb::kit "${RB_DST_HOST}" free "${RB_STAGING}")"
  free=${RB_J[free_bytes]}
  need=$((RB_SRC_DISK + RB_SRC_DISK / 10))
  rb::log "free on ${RB_DST_HOST} at ${RB_J[measured_at]}: $(rb::human "${free}");" \
    "staging needs about $(rb::human "${need}")"
  if ((free < need)); then
    rb::fail "not enough space on ${RB_DST_HOST} for staging: $(rb::human "${free}") free," \
      "$(rb::human "${need}") needed"
  fi
  RB_STEP_DETAIL="route ${RB_ROUTE_USED}, compression ${RB_COMPRESSION_USED}"
}

#######################################
# Decide the stream's compression: none when both ends are this machine (no link to save),
# else from the spec and what both ends have (rb::choose_compression).
#######################################
rb::preflight_compression() {
  if [[ "${RB_COMPRESSION}" == auto && "${RB_SRC_HOST}" == "${RB_DST_HOST}" ]] && rb::is_local "${RB_SRC_HOST}"; then
    RB_COMPRESSION_USED=none
    rb::log "compression: none (both ends are this machine: no link to save)"
    return 0
  fi
  rb::choose_compression "${RB_SRC_HOST}" "${RB_DST_HOST}"
}

#######################################
# Decide the route: relay through this machine, or direct (the source pushes to the destination).
#######################################
rb::preflight_route() {
  local why
  RB_ROUTE_USED=relay
  if [[ "${RB_ROUTE}" == relay ]]; then
    rb::log "route: relay through this machine"
    return 0
  fi
  if rb::on_host "${RB_SRC_HOST}" ssh -o BatchMode=yes "${RB_DIRECT_SSH[@]}" true \
    2>"${RB_WORK}/direct.err"; then
    RB_ROUTE_USED=direct
    rb::log "route: direct (${RB_SRC_HOST} reaches ${RB_DST_HOST} over ssh itself)"
    return 0
  fi
  why=$(tail -n 1 "${RB_WORK}/direct.err")
  if [[ "${RB_ROUTE}" == direct ]]; then
    rb::fail "route direct: ${RB_SRC_HOST} cannot reach ${RB_DST_HOST} over ssh: ${why}"
  fi
  rb::log "route: relay through this machine, because ${RB_SRC_HOST} cannot reach ${RB_DST_HOST}" \
    "(${why:-ssh failed})"
}

#######################################
# Step 2/8: manifest (specs/b300.yaml:13)
# Hash every file of the source (in parallel) into a manifest; detect a re-run and what an incremental one must send.
#######################################
step_manifest() {
  local installed
  RB_SKIP_INSTALL=0
  installed="${RB_DST_ABS}/.rb-manifest.jsonl"
  if ! rb::on_host "${RB_DST_HOST}" test -f "${installed}"; then
    # nothing to compare with: hash while the stream runs (each file is read once from disk)
    RB_HASH_DURING_STREAM=1
    rb::log "no earlier install at the destination: the source is hashed while the stream runs"
    RB_STEP_DETAIL='deferred: hashed during the transfer'
    return 0
  fi
  if [[ "${RB_RERUN}" == quick ]]; then
    if rb::kit "${RB_DST_HOST}" manifest quick-check "${RB_DST_ABS}" "${installed}" \
      --source-stat "${RB_SRC_STAT}" >"${RB_RUN_DIR}/quick-check.json"; then
      RB_SKIP_INSTALL=1
      rb::log "the destination already holds this exact tree (same source, nothing changed there:" \
        "quick check of sizes, modes and mtimes; rerun: digest re-hashes); nothing will be sent"
      RB_STEP_DETAIL='quick check: destination up to date'
      return 0
    fi
    rb::jparse "$(cat "${RB_RUN_DIR}/quick-check.json")"
    rb::log "quick check: ${RB_J[why]}"
    if ((RB_INCREMENTAL)); then
      # the source changed, or files at the destination did: send only what differs
      rb::delta_plan "${installed}"
      return 0
    fi
  fi
  rb::manifest_build
  rb::manifest_share
  RB_HASH_DURING_STREAM=0
  rb::jparse "$(rb::kit "${RB_DST_HOST}" manifest fingerprint "${installed}")"
  if [[ "${RB_J[source_fingerprint]}" != "${RB_FINGERPRINT}" ]]; then
    rb::log "the destination holds an install of a different source tree"
  elif rb::kit "${RB_DST_HOST}" manifest verify "${RB_DST_ABS}" "${installed}" --jobs "${RB_JOBS}" \
    >/dev/null; then
    RB_SKIP_INSTALL=1
    rb::log "the destination already holds this exact tree (verified); nothing will be sent"
  else
    rb::log "the destination was installed from this source but has changed since (listed above)"
  fi
  if ((RB_SKIP_INSTALL == 0)) && [[ "${RB_ON_EXISTING}" == refuse ]]; then
    rb::fail "destination ${RB_DST_HOST}:${RB_DST_ABS} holds a different install and" \
      "on_existing is refuse"
  fi
  RB_STEP_DETAIL="fingerprint ${RB_FINGERPRINT:0:16}"
}

#######################################
# The source or the destination changed since the destination was installed: send only what
# differs. The
# destination's manifest goes to the source, whose unchanged files (same mode, size and mtime)
# keep their recorded digests; the destination links its unchanged files into a new staging and
# names what the stream must still carry. $1: the installed manifest on the destination.
#######################################
rb::delta_plan() {
  local installed=$1 src_kit dst_kit
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  dst_kit=$(rb::kit_dir "${RB_DST_HOST}")
  rb::on_host "${RB_DST_HOST}" cat "${installed}" >"${RB_RUN_DIR}/installed.jsonl"
  rb::pipe_on_host "${RB_SRC_HOST}" sh -c 'cat >"$1"' rb "${src_kit}/${RB_NAME}.installed.jsonl" \
    <"${RB_RUN_DIR}/installed.jsonl"
  rb::manifest_build --reuse "${src_kit}/${RB_NAME}.installed.jsonl"
  rb::log "source hashed: ${RB_J[reused]} unchanged files kept the digest recorded at the install"
  rb::manifest_share
  RB_HASH_DURING_STREAM=0
  rb::jparse "$(rb::kit "${RB_DST_HOST}" stage "${RB_DST_ABS}" "${RB_STAGING}" \
    --manifest "${dst_kit}/${RB_NAME}.manifest.jsonl" --installed "${installed}" \
    --names-out "${dst_kit}/${RB_NAME}.send-names")"
  # through a file here: both ends may be one host and one kit directory
  rb::on_host "${RB_DST_HOST}" cat "${dst_kit}/${RB_NAME}.send-names" >"${RB_RUN_DIR}/send-names"
  rb::pipe_on_host "${RB_SRC_HOST}" sh -c 'cat >"$1"' rb "${src_kit}/${RB_NAME}.send-names" \
    <"${RB_RUN_DIR}/send-names"
  RB_DELTA=1
  RB_SEND_NAMES="${src_kit}/${RB_NAME}.send-names"
  RB_SRC_BYTES=${RB_J[send_bytes]}
  RB_SRC_FILES=${RB_J[send_files]}
  rb::fact linked_files "${RB_J[linked]}"
  rb::fact send_files "${RB_J[send_files]}"
  rb::log "incremental: ${RB_J[send_files]} files ($(rb::human "${RB_J[send_bytes]}")) to send;" \
    "${RB_J[linked]} unchanged files ($(rb::human "${RB_J[linked_bytes]}")) linked from the" \
    "current install into staging; ${RB_J[removed]} entries gone from the source"
  RB_STEP_DETAIL="source changed: ${RB_J[send_files]} files to send, ${RB_J[linked]} linked"
}

#######################################
# Hash the source into its manifest (on the source, in parallel). Sets RB_FINGERPRINT.
# Extra arguments go to `rbkit manifest build` (--reuse FILE).
#######################################
rb::manifest_build() {
  local src_kit
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  rb::jparse "$(rb::kit "${RB_SRC_HOST}" manifest build "${RB_SRC_ABS}" "${RB_EXCLUDE_ARGS[@]}" \
    --algo "${RB_VERIFY}" --jobs "${RB_JOBS}" --out "${src_kit}/${RB_NAME}.manifest.jsonl" "$@")"
  rb::manifest_facts
}

rb::manifest_facts() {
  RB_FINGERPRINT=${RB_J[fingerprint]}
  rb::fact manifest_files "${RB_J[totals.files]}"
  rb::log "manifest: ${RB_J[totals.files]} files, ${RB_J[totals.links]} symlinks," \
    "${RB_VERIFY} digests; fingerprint ${RB_FINGERPRINT:0:16}"
}

#######################################
# Copy the source's manifest here (runs/NAME/manifest.jsonl) and on to the destination.
#######################################
rb::manifest_share() {
  local src_kit dst_kit
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  dst_kit=$(rb::kit_dir "${RB_DST_HOST}")
  rb::on_host "${RB_SRC_HOST}" cat "${src_kit}/${RB_NAME}.manifest.jsonl" >"${RB_RUN_DIR}/manifest.jsonl"
  rb::pipe_on_host "${RB_DST_HOST}" sh -c 'cat >"$1"' rb "${dst_kit}/${RB_NAME}.manifest.jsonl" \
    <"${RB_RUN_DIR}/manifest.jsonl"
}

#######################################
# Step 3/8: transfer (specs/b300.yaml:7)
# Stream the source into a staging directory beside the destination.
#######################################
# The receiving end of the stream (RB_PACK_SCRIPT, the sending end, is in the runtime).
# $1: directory, $2: compression.
readonly RB_UNPACK_SCRIPT='set -o pipefail
case "$2" in
  zstd) zstd -q -d -c | tar -C "$1" -xf - --no-same-owner ;;
  lz4) lz4 -q -d -c | tar -C "$1" -xf - --no-same-owner ;;
  gzip) gzip -d -c | tar -C "$1" -xf - --no-same-owner ;;
  *) exec tar -C "$1" -xf - --no-same-owner ;;
esac'

step_transfer() {
  local src_kit start_ms ms bytes hash_pid='' names
  if ((RB_SKIP_INSTALL)); then
    RB_STEP_DETAIL='skipped: destination already matches the source manifest'
    return 0
  fi
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  names="${src_kit}/${RB_NAME}.names"
  if ((RB_DELTA)); then
    names=${RB_SEND_NAMES}      # staging already holds the unchanged files (the manifest step)
  else
    rb::on_host "${RB_DST_HOST}" sh -c 'rm -rf -- "$1" && mkdir -p -- "$1"' rb "${RB_STAGING}"
  fi
  if ((RB_HASH_DURING_STREAM)); then
    # a background job must not run the ERR trap (it would end the run from a subshell)
    (
      trap - ERR
      RB_WORK=''
      rb::kit "${RB_SRC_HOST}" manifest build "${RB_SRC_ABS}" "${RB_EXCLUDE_ARGS[@]}" \
        --algo "${RB_VERIFY}" --jobs "${RB_JOBS}" --out "${src_kit}/${RB_NAME}.manifest.jsonl"
    ) >"${RB_RUN_DIR}/manifest-build.json" 2>"${RB_RUN_DIR}/manifest-build.err" &
    hash_pid=$!
    RB_BG_PIDS+=("${hash_pid}")
  fi
  rb::log "streaming ${RB_SRC_HOST}:${RB_SRC_ABS} -> ${RB_DST_HOST}:${RB_STAGING} (${RB_ROUTE_USED}," \
    "compression ${RB_COMPRESSION_USED})"
  start_ms=$(rb::now_ms)
  if [[ "${RB_ROUTE_USED}" == direct ]]; then
    rb::on_host "${RB_SRC_HOST}" bash -c "${RB_PACK_SCRIPT}" rb "${RB_SRC_ABS}" \
      "${names}" "${RB_COMPRESSION_USED}" \
      "$(rb::shq bash -c "${RB_UNPACK_SCRIPT}" rb "${RB_STAGING}" "${RB_COMPRESSION_USED}")" \
      -o BatchMode=yes -c "${RB_SSH_CIPHERS}" "${RB_DIRECT_SSH[@]}"
  elif command -v pv >/dev/null; then
    rb::on_host "${RB_SRC_HOST}" bash -c "${RB_PACK_SCRIPT}" rb "${RB_SRC_ABS}" \
      "${names}" "${RB_COMPRESSION_USED}" |
      pv -f -i 10 -b -t -a 2> >(tr '\r' '\n' | sed -u '/^$/d; s/^/    progress: /' >&2) |
      rb::pipe_on_host "${RB_DST_HOST}" bash -c "${RB_UNPACK_SCRIPT}" rb "${RB_STAGING}" \
        "${RB_COMPRESSION_USED}" ||
      rb::pipe_failed "stream" "pack on ${RB_SRC_HOST}" "pv here" "unpack on ${RB_DST_HOST}" \
        "${PIPESTATUS[@]}"
  else
    rb::on_host "${RB_SRC_HOST}" bash -c "${RB_PACK_SCRIPT}" rb "${RB_SRC_ABS}" \
      "${names}" "${RB_COMPRESSION_USED}" |
      rb::pipe_on_host "${RB_DST_HOST}" bash -c "${RB_UNPACK_SCRIPT}" rb "${RB_STAGING}" \
        "${RB_COMPRESSION_USED}" ||
      rb::pipe_failed "stream" "pack on ${RB_SRC_HOST}" "unpack on ${RB_DST_HOST}" "${PIPESTATUS[@]}"
  fi
  ms=$(($(rb::now_ms) - start_ms))
  if [[ -n "${hash_pid}" ]]; then
    if ! wait "${hash_pid}"; then
      cat "${RB_RUN_DIR}/manifest-build.err" >&2
      rb::fail "hashing the source on ${RB_SRC_HOST} failed (above)"
    fi
    rb::jparse "$(cat "${RB_RUN_DIR}/manifest-build.json")"
    rb::manifest_facts
    rb::manifest_share
    rb::log "manifest ready $(($(rb::now_ms) - start_ms - ms)) ms after the stream ended"
  fi
  bytes=${RB_SRC_BYTES:-0}
  rb::fact bytes "${bytes}"
  rb::fact files "${RB_SRC_FILES:-0}"
  rb::fact seconds "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
  if ((ms > 0)); then
    rb::fact mb_s "$((bytes / ms / 1000))"
  fi
  RB_STEP_DETAIL="${RB_ROUTE_USED}, compression ${RB_COMPRESSION_USED}"
  if ((RB_DELTA)); then
    RB_STEP_DETAIL+=", incremental: only changed files sent"
  fi
}

#######################################
# Step 4/8: verify (specs/b300.yaml:13)
# Check the staging copy against the manifest: every file, mode, link and digest.
#######################################
step_verify() {
  local dst_kit info
  local -a linked=()
  if ((RB_SKIP_INSTALL)); then
    RB_STEP_DETAIL='skipped: nothing was sent'
    return 0
  fi
  dst_kit=$(rb::kit_dir "${RB_DST_HOST}")
  if ((RB_DELTA)); then
    # unchanged files are links of the current install, which the last run verified: stat only
    linked=(--linked-from "${RB_DST_ABS}")
  fi
  if ! info=$(rb::kit "${RB_DST_HOST}" manifest verify "${RB_STAGING}" \
    "${dst_kit}/${RB_NAME}.manifest.jsonl" --jobs "${RB_JOBS}" "${linked[@]}"); then
    rb::fail "the copy in ${RB_DST_HOST}:${RB_STAGING} differs from the source manifest (listed" \
      "above); the destination was not touched"
  fi
  rb::jparse "${info}"
  RB_STEP_DETAIL="${RB_J[checked]} entries match, ${RB_J[hashed]} files hashed (${RB_VERIFY})"
  if ((RB_DELTA)); then
    RB_STEP_DETAIL+=", ${RB_J[linked]} linked unchanged"
  fi
}

#######################################
# Step 5/8: relocate (specs/b300.yaml:9)
# Rewrite what names the old path (shebangs, activate scripts) for the new one.
#######################################
step_relocate() {
  local dst_kit
  if ((RB_SKIP_INSTALL)); then
    RB_STEP_DETAIL='skipped: nothing was sent'
    return 0
  fi
  dst_kit=$(rb::kit_dir "${RB_DST_HOST}")
  rb::jparse "$(rb::kit "${RB_DST_HOST}" relocate "${RB_STAGING}" --old "${RB_SRC_ABS}" \
    --new "${RB_DST_ABS}" --manifest "${dst_kit}/${RB_NAME}.manifest.jsonl" \
    --installed "${RB_STAGING}/.rb-manifest.jsonl")"
  rb::log "rewritten: ${RB_J[rewritten]}"
  if [[ "${RB_J[elsewhere]}" != '[]' ]]; then
    rb::log "still naming ${RB_SRC_ABS} outside bin/ (data, left as is): ${RB_J[elsewhere]}"
  fi
  rb::fact rewritten "${RB_J[count]}"
  RB_STEP_DETAIL="${RB_J[count]} files rewritten"
}

#######################################
# Step 6/8: swap (specs/b300.yaml:14)
# Put the verified copy in place in one rename; keep or remove what was there.
#######################################
step_swap() {
  local out previous
  if ((RB_SKIP_INSTALL)); then
    RB_STEP_DETAIL='skipped: destination already up to date'
    return 0
  fi
  rb::jparse "$(rb::kit "${RB_DST_HOST}" swap "${RB_STAGING}" "${RB_DST_ABS}" --policy "${RB_ON_EXISTING}")"
  previous=${RB_J[previous]}
  if [[ "${previous}" == *.rb-backup.* ]]; then
    RB_BACKUP_MADE=${previous}
    rb::log "the previous destination is kept at ${RB_BACKUP_MADE}; to put it back:" \
      "bash ${0##*/} --restore"
  fi
  out=$(rb::on_host "${RB_DST_HOST}" env PYTHONDONTWRITEBYTECODE=1 "${RB_DST_ABS}/bin/python" -c \
    'import sys; print(sys.prefix)')
  if [[ "${out}" != "${RB_DST_ABS}" ]]; then
    rb::fail "the moved interpreter reports sys.prefix ${out}, expected ${RB_DST_ABS}"
  fi
  if rb::on_host "${RB_DST_HOST}" test -x "${RB_DST_ABS}/bin/pip"; then
    out=$(rb::on_host "${RB_DST_HOST}" env PYTHONDONTWRITEBYTECODE=1 "${RB_DST_ABS}/bin/pip" --version)
    if [[ "${out}" != *"${RB_DST_ABS}/"* ]]; then
      rb::fail "console script bin/pip runs from the wrong place: ${out}"
    fi
    rb::log "console script runs: ${out}"
  fi
  RB_STEP_DETAIL="installed at ${RB_DST_ABS}; previous: ${previous}"
}

#######################################
# Step 7/8: exports (specs/b300.yaml:15)
# Write the env file: CUDA_HOME, PATH, LD_LIBRARY_PATH with the venv's libs first.
#######################################
step_exports() {
  local item
  local -a args=(--venv "${RB_DST_ABS}" --out "${RB_ENV_OUT}" --cuda-home "${RB_CUDA_HOME}"
    --origin "runbook ${RB_NAME} (${RB_SPEC})")
  for item in "${RB_LIB_FIRST[@]}"; do
    args+=(--first "${item}")
  done
  for item in "${RB_ENV[@]}"; do
    args+=(--env "${item}")
  done
  rb::jparse "$(rb::kit "${RB_DST_HOST}" exports "${args[@]}")"
  rb::log "env file ${RB_DST_HOST}:${RB_ENV_OUT}; LD_LIBRARY_PATH: ${RB_J[library_dirs]}"
  RB_STEP_DETAIL="${RB_ENV_OUT}"
}

#######################################
# Step 8/8: probe (specs/b300.yaml:20)
# Run the checks with the moved interpreter on the target; fetch the report.
#######################################
step_probe() {
  local dst_kit report rc=0
  dst_kit=$(rb::kit_dir "${RB_DST_HOST}")
  report="${dst_kit}/${RB_NAME}.probe-report.json"
  rb::on_host "${RB_DST_HOST}" bash -c 'source "$1" && export PYTHONPATH="$2" PYTHONDONTWRITEBYTECODE=1 &&
    exec "$3/bin/python" -m rbprobes run --config-json "$4" --report "$5"' rb \
    "${RB_ENV_OUT}" "${dst_kit}" "${RB_DST_ABS}" "${RB_PROBE_CONFIG}" "${report}" || rc=$?
  if rb::on_host "${RB_DST_HOST}" test -f "${report}"; then
    rb::on_host "${RB_DST_HOST}" cat "${report}" >"${RB_RUN_DIR}/probe-${RB_DST_HOST}.json"
    RB_PROBE_REPORTS+=("${RB_DST_HOST}=${RB_RUN_DIR}/probe-${RB_DST_HOST}.json")
  fi
  if ((rc != 0)) && [[ "${RB_ON_FAILED_CHECKS}" == rollback && -n "${RB_BACKUP_MADE}" ]]; then
    rb::log "checks failed: rolling back (on_failed_checks: rollback)"
    rb::jparse "$(rb::kit "${RB_DST_HOST}" restore "${RB_DST_ABS}")"
    rb::log "rolled back: the previous install is at ${RB_DST_ABS} again; the one that failed its" \
      "checks is kept at ${RB_J[kept_current_as]}"
  elif ((rc != 0)); then
    rb::log "checks failed; the new install stays in place (on_failed_checks: ${RB_ON_FAILED_CHECKS})"
  fi
  if ((rc != 0)); then
    rb::fail "checks failed on ${RB_DST_HOST} (table above; report ${RB_RUN_DIR}/probe-${RB_DST_HOST}.json)"
  fi
  rb::jparse "$(cat "${RB_RUN_DIR}/probe-${RB_DST_HOST}.json")"
  RB_STEP_DETAIL="${RB_J[summary.pass]} passed, ${RB_J[summary.skip]} skipped, ${RB_J[summary.fail]} failed on ${RB_DST_HOST}"
}

#######################################
# Set up this run: the run directory, the log, the kit, ssh multiplexing, absolute paths.
#######################################
rb::init() {
  RB_RUN_DIR=${RB_RUN_DIR:-runs/${RB_NAME}}
  mkdir -p "${RB_RUN_DIR}"
  RB_RUN_DIR=$(cd "${RB_RUN_DIR}" && pwd)
  RB_REPORT=${RB_REPORT:-${RB_RUN_DIR}/report.json}
  RB_EVENTS="${RB_RUN_DIR}/events.tsv"
  : >"${RB_EVENTS}"
  : >"${RB_RUN_DIR}/run.log"
  exec 2> >(tee -a "${RB_RUN_DIR}/run.log" >&2)
  RB_WORK=$(mktemp -d "${TMPDIR:-/tmp}/rb.XXXXXX")
  # the real interpreter behind `python3` (a version-manager shim can cost 0.2 s a start)
  RB_LOCAL_PY=$(python3 -c 'import sys; print(sys.executable)')
  # the kit's packages are rewritten every run; state files beside them (manifests) are kept
  rm -rf "${RB_RUN_DIR}/kit/rbkit" "${RB_RUN_DIR}/kit/rbprobes"
  rb::kit_write "${RB_RUN_DIR}/kit"
  RB_SSH_COMMON=(-o BatchMode=yes -o ControlMaster=auto -o "ControlPath=${RB_WORK}/ssh-%C"
    -o ControlPersist=300 -o ServerAliveInterval=15 -o ServerAliveCountMax=4
    -c "${RB_SSH_CIPHERS}")
  RB_SRC_ABS=$(rb::abspath "${RB_SRC_HOST}" "${RB_SRC_PATH}")
  RB_DST_ABS=$(rb::abspath "${RB_DST_HOST}" "${RB_DST_PATH}")
  rb::install_paths
  rb::log "runbook ${RB_NAME} from ${RB_SPEC} (sha256 ${RB_SPEC_SHA256:0:12}); run dir ${RB_RUN_DIR}"
  if ((RB_ALLOW_EDITED)); then
    rb::event fact main allow_edited "${RB_EDITED:-no}"
    rb::log "--allow-edited: ${RB_EDITED:-nothing was edited}"
  fi
}

#######################################
# On exit: close ssh connections, remove this run's scratch directory.
#######################################
rb::cleanup() {
  local host pid
  if [[ -z "${RB_WORK}" ]]; then
    return 0
  fi
  for pid in "${RB_BG_PIDS[@]}"; do
    kill "${pid}" 2>/dev/null || true
  done
  for host in "${!RB_KIT_DIR[@]}"; do
    if ! rb::is_local "${host}"; then
      rb::on_host "${host}" rm -rf -- "${RB_KIT_DIR[${host}]}" 2>/dev/null || true
    fi
  done
  for host in "${RB_HOSTS[@]}"; do
    "rb::host_${host}"
    if [[ -n "${RB_HOST_TARGET}" ]]; then
      ssh "${RB_HOST_SSH[@]}" "${RB_SSH_COMMON[@]}" -O exit -- "${RB_HOST_TARGET}" 2>/dev/null || true
    fi
  done
  rm -rf "${RB_WORK}"
}

#######################################
# --restore [N]: put backup N (default: the newest) back at the destination; the current install
# becomes a backup in its place.
#######################################
rb::restore() {
  local number=$1
  local -a args=()
  RB_STEP=restore
  if [[ "${number}" != latest ]]; then
    args=(--number "${number}")
  fi
  rb::kit_ship "${RB_DST_HOST}"
  rb::jparse "$(rb::kit "${RB_DST_HOST}" restore "${RB_DST_ABS}" "${args[@]}")"
  rb::log "restored ${RB_J[restored]} to ${RB_DST_HOST}:${RB_DST_ABS};" \
    "the install it replaced is kept at ${RB_J[kept_current_as]}"
  RB_FINISHED=1
}

#######################################
# Parse the command line, then run the chosen steps in order.
#######################################
main() {
  local only='' from='' id run=0 restore=
  while (($# > 0)); do
    case "$1" in
      --list) rb::list; return 0 ;;
      --version) rb::version; return 0 ;;
      --allow-edited) RB_ALLOW_EDITED=1 ;;
      --dry-run) RB_DRY_RUN=1 ;;
      --only) only=${2:?--only needs a step}; shift ;;
      --from) from=${2:?--from needs a step}; shift ;;
      --report) RB_REPORT=${2:?--report needs a path}; shift ;;
      --restore)
        restore=latest
        if [[ "${2:-}" =~ ^[0-9]+$ ]]; then
          restore=$2
          shift
        fi
        ;;
      -h | --help) rb::usage; return 0 ;;
      *) echo "unknown option: $1 (see --help)" >&2; return 2 ;;
    esac
    shift
  done
  for id in "${only}" "${from}"; do
    if [[ -n "${id}" && -z "${RB_STEP_DOC[${id}]:-}" ]]; then
      echo "unknown step: ${id} (steps: ${RB_STEPS[*]})" >&2
      return 2
    fi
  done
  if ((RB_DRY_RUN)); then
    rb::dry_run
    return 0
  fi
  if [[ -n "${RB_REPORT}" ]]; then
    mkdir -p "$(dirname "${RB_REPORT}")"
    RB_REPORT="$(cd "$(dirname "${RB_REPORT}")" && pwd)/${RB_REPORT##*/}"
  fi
  rb::check_sealed || return 2
  trap 'rb::on_err "${LINENO}"' ERR
  trap rb::on_signal INT TERM
  trap rb::cleanup EXIT
  rb::init
  if [[ -n "${restore}" ]]; then
    rb::restore "${restore}"
    return 0
  fi
  [[ -z "${from}" ]] && run=1
  for id in "${RB_STEPS[@]}"; do
    [[ "${id}" == "${from}" ]] && run=1
    # the first step (preflight, fan_preflight) always runs: it connects and sets what the rest use
    if [[ "${id}" == "${RB_STEPS[0]}" ]] || { [[ -z "${only}" ]] && ((run)); } || [[ "${id}" == "${only}" ]]; then
      rb::run_step "${id}"
    fi
  done
  rb::finish ok
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
