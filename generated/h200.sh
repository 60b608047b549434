#!/usr/bin/env bash
# @generated from specs/h200.yaml (sha256 51665d1bd3efa80fae4b3b9f067d9addd2ac273046a116851e73fe8e549494ec) by runbook-compiler 0.1.0 -- DO NOT EDIT.
# Edit the spec and recompile: compile specs/h200.yaml
# sha256 of this file with these 64 digits zeroed: 14c3e6ab496a2268f080492a3bb2ee55aef88370e46b7cfda7ff7acbcc8d818e
# Move the H200 machine's torch venv to a new path on it and prove it on the GPU (sm_90).
#
# Usage: bash h200.sh [--list | --dry-run | --only STEP | --from STEP] [--report PATH] [--version]
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
readonly RB_NAME=h200
readonly RB_SPEC=specs/h200.yaml
readonly RB_SPEC_SHA256=51665d1bd3efa80fae4b3b9f067d9addd2ac273046a116851e73fe8e549494ec
readonly RB_COMPILER_VERSION=0.1.0
# The kit (hostkit/): .kit/<sha256>.tar beside this runbook, checked against this hash.
readonly RB_KIT_SHA256=80f287b1f0ea0b8ffc0013030c0d865c2644444c0f5018af3c91f755de53fba8
readonly RB_KIT_FILE=.kit/80f287b1f0ea0b8ffc0013030c0d865c2644444c0f5018af3c91f755de53fba8.tar
# AES-GCM first: the relay is CPU-bound.
readonly RB_SSH_CIPHERS=aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com
# transfer (specs/h200.yaml:9)
readonly RB_SRC_HOST=here
readonly RB_SRC_PATH=/opt/torch/.venv
readonly RB_DST_HOST=here
readonly RB_DST_PATH=/opt/torch-moved/.venv
readonly RB_ROUTE=relay
readonly RB_COMPRESSION=none
readonly RB_VERIFY=sha256
readonly RB_ON_EXISTING=replace
readonly RB_RERUN=quick
# the threat model's choices (docs/design.md): setuid/setgid/world-write entries, links that leave the tree, backups kept, a swap that cannot be one rename
readonly RB_SPECIAL_MODES=strip
readonly RB_OUTSIDE_LINKS=refuse
readonly RB_KEEP_BACKUPS=2
readonly RB_SWAP_ATOMIC=allow
# gpu: declared: the report says whether the checks proved it (a skip is not a pass)
readonly RB_GPU_DECLARED=1
# the static checks on the source before anything moves: the kernel audit for this arch (empty: no gpu:, or gpu.kernel_audit: false), and the references that leave the venv
readonly RB_AUDIT_ARCH=sm_90
# a re-run that finds changes sends only them (see docs/design.md)
readonly RB_INCREMENTAL=1
# hashing threads on each host (auto: one per CPU)
readonly RB_JOBS=8
# cuda
readonly RB_CUDA_HOME=/usr/local/cuda
readonly RB_ENV_FILE=''
# on_failed_checks: what a failed check after the swap does
readonly RB_ON_FAILED_CHECKS=keep
# The checks, as one JSON document for the probe on the target.
readonly RB_PROBE_CONFIG='{"checks":[{"allow_skip":false,"id":"relocation","params":{"old":"/opt/torch/.venv"},"type":"relocation"},{"allow_skip":false,"id":"kernel_audit","params":{"paths":["lib/python3.12/site-packages/torch/lib"],"strict":false},"type":"kernel_audit"},{"allow_skip":false,"id":"libraries","params":{"expect_dirs":[]},"type":"libraries"},{"allow_skip":false,"id":"torch","params":{"cuda":"13.0","version":"2.11"},"type":"torch"},{"allow_skip":false,"id":"devices","params":{},"type":"devices"},{"allow_skip":false,"id":"imports","params":{"modules":["torch","triton","numpy"]},"type":"imports"},{"allow_skip":false,"id":"matmul_5","params":{"dtype":"bfloat16","every_device":true,"size":8192},"type":"matmul"},{"allow_skip":false,"id":"matmul_6","params":{"dtype":"float32","every_device":true,"size":2048},"type":"matmul"},{"allow_skip":false,"id":"nccl","params":{},"type":"nccl"},{"allow_skip":false,"id":"command","params":{"expect_exit":0,"name":"console script","run":"torchrun --help >/dev/null","timeout_s":300},"type":"command"}],"cuda":{"home":"/usr/local/cuda","library_dirs":[],"library_path_first":["nvidia/cu13/lib"],"version":"13.0"},"gpu":{"arch":"sm_90","capability":"9.0","count":1,"model":"H200"},"host":"here","schema":1,"venv":null}'
# the kernel audit's options from the spec's kernel_audit check
readonly -a RB_AUDIT_ARGS=(--path lib/python3.12/site-packages/torch/lib)
# Each file of the spec and its sha256: a run refuses to start when one changed.
readonly -a RB_SPEC_FILES=(specs/h200.yaml=51665d1bd3efa80fae4b3b9f067d9addd2ac273046a116851e73fe8e549494ec)
# Hosts this runbook touches.
readonly -a RB_HOSTS=(here)
readonly -a RB_STEPS=(preflight manifest transfer verify relocate prove swap exports probe)
# transfer.exclude
readonly -a RB_EXCLUDE_ARGS=(--exclude __pycache__ --exclude '*.pyc')
# cuda.library_path_first, relative to the venv's site-packages
readonly -a RB_LIB_FIRST=(nvidia/cu13/lib)
# env
readonly -a RB_ENV=(NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1)
# route direct/auto: ssh arguments the source uses to reach the destination
readonly -a RB_DIRECT_SSH=()
declare -rA RB_STEP_DOC=(
  [preflight]='Reach every host, ship the kit, check the source is a venv after the excludes, take the destination'"'"'s lock, check its state and free space.'
  [manifest]='Hash every file of the source (in parallel) into a manifest; detect a re-run and what an incremental one must send.'
  [transfer]='Stream the source into a staging directory beside the destination.'
  [verify]='Check the staging against the manifest: every file, mode, link and digest.'
  [relocate]='Rewrite what names the old path (shebangs, activate scripts) for the new one.'
  [prove]='The staged interpreter runs here and reports the staging as sys.prefix.'
  [swap]='Put the proven copy in place in one rename, then prove it there (sys.prefix, bin/pip); a failure puts back what was there.'
  [exports]='Write the env file: CUDA_HOME, PATH, LD_LIBRARY_PATH with the venv'"'"'s libs first.'
  [probe]='Run the checks with the moved interpreter on the target; fetch the report.'
)
declare -rA RB_STEP_PREVIEW=(
  [preflight]='on here: connect; use the kit here; check tar and python3 >= 3.9
on here: rbkit engine scan /opt/torch/.venv --exclude __pycache__ --exclude '"'"'*.pyc'"'"' (refused unless pyvenv.cfg, bin/python and files are sent)
on here: rbkit engine serve --dest /opt/torch-moved/.venv: takes /opt/torch-moved/..venv.rb-lock for the run (a second run is refused, naming this one)
on here: engine preflight: on_existing replace; free space for /opt/torch-moved/..venv.rb-staging
on here: rbprobes preflight --venv /opt/torch/.venv --arch sm_90 --path lib/python3.12/site-packages/torch/lib (refused with the files and packages named unless --force; on one machine, references outside the venv are said, not refused)
compression: none'
  [manifest]='on here: rbkit engine hash /opt/torch/.venv --exclude __pycache__ --exclude '"'"'*.pyc'"'"' --algo sha256 --jobs 8
here: keep a copy in runs/h200/manifest.jsonl; send it to here
on here: engine current: if /opt/torch-moved/.venv/.rb-manifest.jsonl matches, skip the install
on here: engine stage: if it differs, link unchanged files from /opt/torch-moved/.venv into /opt/torch-moved/..venv.rb-staging, send only the rest'
  [transfer]='on here: engine stage: rm -rf /opt/torch-moved/..venv.rb-staging && mkdir /opt/torch-moved/..venv.rb-staging
on here: tar -C /opt/torch/.venv --null --no-recursion -T <manifest names> -cf - | <compress: none> (rbkit engine send)
  | through this machine (relay) |
on here: <decompress> | tar -C /opt/torch-moved/..venv.rb-staging -xf - --no-same-owner (rbkit engine receive)'
  [verify]='on here: engine verify /opt/torch-moved/..venv.rb-staging against the manifest (--jobs 8); the stamp relocate, prove and swap require'
  [relocate]='on here: engine relocate /opt/torch-moved/..venv.rb-staging --old /opt/torch/.venv --new /opt/torch-moved/.venv'
  [prove]='on here: /opt/torch-moved/..venv.rb-staging/bin/python -I -B -c '"'"'import sys; print(sys.prefix)'"'"' (within 120 s)'
  [swap]='on here: engine swap /opt/torch-moved/..venv.rb-staging /opt/torch-moved/.venv --policy replace
on here: /opt/torch-moved/.venv/bin/python -c '"'"'import sys; print(sys.prefix)'"'"'; /opt/torch-moved/.venv/bin/pip --version; on failure put back what was there'
  [exports]='on here: engine exports: write /opt/torch-moved/.venv.env.sh
  CUDA_HOME=/usr/local/cuda; LD_LIBRARY_PATH: nvidia/cu13/lib (in site-packages), then $CUDA_HOME/lib64'
  [probe]='on here: engine probe: source the env file; /opt/torch-moved/.venv/bin/python -m rbprobes run: relocation, kernel_audit, libraries, torch, devices, imports, matmul, matmul, nccl, command
here: fetch the report to runs/h200/probe-here.json'
)
declare -rA RB_STEP_HOST=(
  [preflight]=here
  [manifest]=here
  [transfer]=here
  [verify]=here
  [relocate]=here
  [prove]=here
  [swap]=here
  [exports]=here
  [probe]=here
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
RB_COMPRESSION_USED=none
declare -a RB_BG_PIDS=()
RB_STEP_DETAIL=''
declare -a RB_HOST_SSH=()
RB_HOST_TARGET=''
declare -a RB_PROBE_REPORTS=()
declare -A RB_KIT_DIR=()
RB_KIT_TAR_SHA256=''
RB_ALLOW_EDITED=0
RB_FORCE=0
RB_EDITED=''
RB_CAUSE=''
RB_HINT=''
declare -A RB_PY=()
declare -A RB_J=()
RB_NOW=0
RB_ENGINE_PID=''
RB_ENGINE_LOCAL_PID=''
RB_ENGINE_W=''
RB_ENGINE_R=''
RB_ENGINE_STATUS=''
RB_ENGINE_DETAIL=''
declare -a RB_KIT_ARGV=()

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
# The stream's progress, from pv's byte counts (one a line on stdin): a log line with the bytes,
# the percent of $1 (the stream's size, 0 when unknown), the rate and the time left since $2 (ms),
# and a `progress` event the timeline draws the rate from.
#######################################
rb::progress() {
  local total=$1 start=$2 bytes ms rate line
  while read -r bytes; do
    [[ "${bytes}" =~ ^[0-9]+$ ]] || continue
    rb::now
    rb::event progress transfer "${RB_DST_HOST}" "${RB_NOW}" "${bytes}"
    ms=$((RB_NOW - start > 0 ? RB_NOW - start : 1))
    rate=$((bytes * 1000 / ms))
    line="$((bytes / 1000000)) MB"
    if ((total > 0)); then
      line+=" of $((total / 1000000)) MB ($((bytes * 100 / total))%)"
    fi
    line+=", $((rate / 1000000)) MB/s"
    if ((total > bytes && rate > 0)); then
      line+=", about $(((total - bytes) / rate)) s left"
    fi
    printf '    progress: %s\n' "${line}" >&2
  done
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
    # the third line marks a failure in words: the failure block shows it as the cause
    printf '%s\n%s\nfail\n' "${RB_HOST}" "${RB_LAST_CMD}" >"${RB_WORK}/last-command"
  fi
  rb::log "ERROR: $*"
  return 1
}

#######################################
# Milliseconds since the epoch, into RB_NOW.
#######################################
rb::now() {
  local t=${EPOCHREALTIME/[.,]/}
  RB_NOW=${t:0:13}
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
  local host=$1 words
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
    words=$(rb::shq "$@")
    ssh "${RB_HOST_SSH[@]}" "${RB_SSH_COMMON[@]}" -- "${RB_HOST_TARGET}" "${words}"
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
# Bytes as a short human figure into the variable named $1: 1234567 -> 1.2 MB.
#######################################
rb::human() {
  local n=$2 units=(B KB MB GB TB PB) i=0
  while ((n >= 1000000 && i < 4)); do
    n=$((n / 1000))
    i=$((i + 1))
  done
  if ((n >= 1000)); then
    printf -v "$1" '%d.%d %s' $((n / 1000)) $((n % 1000 / 100)) "${units[i + 1]}"
  else
    printf -v "$1" '%d %s' "${n}" "${units[i]}"
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
  rb::now
  RB_STEP_START=${RB_NOW}
  "step_${id}"
  detail=${RB_STEP_DETAIL}
  rb::now
  rb::event step "${id}" ok "${RB_STEP_START}" "${RB_NOW}" "${RB_STEP_HOST[${id}]}" "${detail}"
  rb::log "step ${id}: ok${detail:+ (${detail})}"
  RB_STEP=''
}

#######################################
# ERR trap: name the step, the host and the command, write the report, exit non-zero. In a
# subshell (a command substitution, a background job) it only exits: the shell that waits for
# it sees the failure and reports it, once.
#######################################
rb::on_err() {
  local rc=$? line=$1 what said=
  trap - ERR
  if ((BASHPID != $$)); then
    exit "${rc}"
  fi
  set +e
  # the command that ran last, also when it ran in a subshell (whose variables are gone)
  if [[ -n "${RB_WORK}" && -f "${RB_WORK}/last-command" ]]; then
    { read -r RB_HOST; read -r RB_LAST_CMD; read -r said || true; } <"${RB_WORK}/last-command"
  fi
  what=$(rb::short "${RB_LAST_CMD:-${BASH_COMMAND}}") || true
  if [[ "${said:-}" == fail ]]; then
    RB_CAUSE=${what}   # rb::fail said it in words (logged above as ERROR)
    RB_HINT=''
    rb::log "FAILED in step ${RB_STEP:-main} on host ${RB_HOST:-this machine}: ${RB_CAUSE}"
  else
    rb::cause "${rc}"
    rb::log "FAILED in step ${RB_STEP:-main} on host ${RB_HOST:-this machine}: ${RB_CAUSE}"
    rb::log "  command: ${what} (exit ${rc}; line ${line})"
  fi
  if [[ -n "${RB_HINT}" ]]; then
    rb::log "  what to do: ${RB_HINT}"
  fi
  RB_FAILED_STEP=${RB_STEP}
  if [[ -n "${RB_STEP}" ]]; then
    rb::now
    rb::event step "${RB_STEP}" failed "${RB_STEP_START}" "${RB_NOW}" "${RB_HOST}" "${RB_CAUSE}"
  fi
  rb::finish failed
  # the documented statuses: 1 a step or a check failed (the tool's own status is in the log)
  exit 1
}

#######################################
# INT/TERM: the destination is only ever replaced by the swap step, so stopping is safe.
#######################################
rb::on_signal() {
  trap - ERR INT TERM
  if ((BASHPID != $$)); then
    exit 130
  fi
  set +e
  rb::log "interrupted in step ${RB_STEP:-main}; the destination was not replaced unless the swap step had finished"
  if [[ -n "${RB_STEP}" ]]; then
    rb::now
    rb::event step "${RB_STEP}" interrupted "${RB_STEP_START}" "${RB_NOW}" "${RB_HOST}" ""
  fi
  rb::finish interrupted
  exit 130
}

#######################################
# The first line of a command, at most 160 characters: what the failure block shows of it.
#######################################
rb::short() {
  local text=${1%%$'\n'*}
  if ((${#text} > 160)); then
    text="${text:0:157}..."
  fi
  if [[ "${text}" != "$1" && "${text}" != *... ]]; then
    text+=" ..."
  fi
  printf '%s' "${text}"
}

#######################################
# Set RB_CAUSE (what failed, in words) and RB_HINT (what to do, or empty) for exit status $1 of
# the last host command. ssh's own failures (status 255) are asked again in a few seconds, to
# say why: refused, unreachable, unknown name, or a host key this machine does not trust.
#######################################
rb::cause() {
  local rc=$1 why port host=${RB_HOST:-}
  RB_HINT=''
  RB_CAUSE="exit status ${rc}"
  if ((rc == 127)); then
    why=$(rb::short "${RB_LAST_CMD:-${BASH_COMMAND}}") || true
    RB_CAUSE="a command was not found on ${host:-this machine}: ${why}"
    RB_HINT="install it there, or put it on the PATH of the ssh user"
    return 0
  fi
  if ((rc != 255)) || [[ -z "${host}" ]] || rb::is_local "${host}"; then
    return 0
  fi
  "rb::host_${host}"
  why=$(timeout 20 ssh "${RB_HOST_SSH[@]}" "${RB_SSH_COMMON[@]}" -o ControlPath=none \
    -o ConnectTimeout=8 -- "${RB_HOST_TARGET}" true 2>&1 >/dev/null | tr -d '\r' | grep -v '^Warning' |
    tail -n 1) || true
  port=$(rb::port_of) || true
  RB_CAUSE="cannot reach ${host} (${RB_HOST_TARGET}${port}): ${why:-ssh exited 255}"
  case "${why}" in
    *"Host key verification failed"* | *"No "*"host key is known"* | *"HOST IDENTIFICATION HAS CHANGED"*)
      port=$(rb::port_of -p) || true
      RB_HINT="this machine does not trust ${host}'s host key. Check its fingerprint with the host's"
      RB_HINT+=" owner (ssh-keyscan${port} ${RB_HOST_TARGET#*@} | ssh-keygen -lf -), then"
      RB_HINT+=" add it (ssh-keyscan${port} ${RB_HOST_TARGET#*@} >> ~/.ssh/known_hosts), or"
      RB_HINT+=" set hosts.${host}.host_keys: accept-new in the spec for a first contact"
      ;;
    *"Permission denied"*)
      RB_HINT="the key this runbook uses is not accepted there: check hosts.${host}.ssh (user)"
      RB_HINT+=" and identity_file"
      ;;
    *"Connection refused"* | *"timed out"* | *"No route"* | *"Could not resolve"* | *"Name or service"*)
      RB_HINT="check that ${RB_HOST_TARGET#*@} is up and its sshd listens there (hosts.${host} in the spec)"
      ;;
  esac
}

#######################################
# ", port N" (or "-p N" with an argument) when the host's ssh words name a port.
#######################################
rb::port_of() {
  local i
  for ((i = 0; i < ${#RB_HOST_SSH[@]}; i++)); do
    if [[ "${RB_HOST_SSH[i]}" == -p ]]; then
      if (($# > 0)); then
        printf ' -p %s' "${RB_HOST_SSH[i + 1]}"
      else
        printf ', port %s' "${RB_HOST_SSH[i + 1]}"
      fi
      return 0
    fi
  done
}

#######################################
# The kit's command line on HOST as words, for a stage of a pipeline: sets RB_KIT_ARGV.
#######################################
rb::kit_argv() {
  local host=$1 dir
  dir=$(rb::kit_dir "${host}")
  RB_KIT_ARGV=(env PYTHONPATH="${dir}" PYTHONDONTWRITEBYTECODE=1 "${RB_PY[${host}]:-python3}" -m rbkit)
}

#######################################
# Read one answer of the engine from stdin, lines of `set KEY VALUE` (into RB_J), `event JSON`
# (into the event log, under the current step), `ping` (ignored) and last `done STATUS DETAIL`
# (into RB_ENGINE_STATUS and RB_ENGINE_DETAIL). $1: at most this many seconds between two lines
# (the engine pings every 5 s while it works). Returns 1 when the answer ends before `done`.
#######################################
rb::engine_read() {
  local kind a b
  local -a wait=()
  if [[ -n "${1:-}" ]]; then
    wait=(-t "$1")
  fi
  RB_J=()
  RB_ENGINE_STATUS=''
  RB_ENGINE_DETAIL=''
  while IFS=$'\t' read -r "${wait[@]}" kind a b; do
    case "${kind}" in
      set) RB_J[${a}]=${b} ;;
      event) rb::event engine "${RB_STEP:-main}" "${a}" ;;
      done)
        RB_ENGINE_STATUS=${a}
        RB_ENGINE_DETAIL=${b}
        return 0
        ;;
      *) ;;
    esac
  done
  return 1
}

#######################################
# Run `rbkit engine ARGS...` once on HOST (the source's scan, hash and delta) and read its
# answer; the step fails with the engine's reason when it failed.
#######################################
rb::engine_once() {
  local host=$1 out rc=0
  shift
  out=$(rb::kit "${host}" engine "$@") || rc=$?
  if ! rb::engine_read <<<"${out}" || ((rc != 0)); then
    rb::fail "${RB_ENGINE_DETAIL:-rbkit engine $1 on ${host} exited ${rc} (above)}"
  fi
}

#######################################
# The static checks on the source, before anything moves (issue #16): the kernel audit for the
# target's arch (a spec with gpu:) and the references that leave the venv (editable installs,
# .pth paths, links out of the tree). A failure is refused with the files and packages named,
# unless --force. When both ends are one machine, references that leave the venv still resolve
# there: they are said, not refused.
#######################################
rb::preflight_audit() {
  local out rc=0 failed src_kit
  local -a cmd=(outside "${RB_SRC_ABS}")
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  if [[ -n "${RB_AUDIT_ARCH}" ]]; then
    cmd=(preflight --venv "${RB_SRC_ABS}" --arch "${RB_AUDIT_ARCH}" "${RB_AUDIT_ARGS[@]}")
  fi
  out=$(rb::on_host "${RB_SRC_HOST}" env PYTHONPATH="${src_kit}" PYTHONDONTWRITEBYTECODE=1 \
    "${RB_PY[${RB_SRC_HOST}]}" -m rbprobes "${cmd[@]}" 2>"${RB_WORK}/audit.err") || rc=$?
  if ((rc == 0)); then
    rb::log "static checks on the source: passed (${cmd[0]}${RB_AUDIT_ARCH:+, kernels for ${RB_AUDIT_ARCH}})"
    return 0
  fi
  if ((rc != 1)); then
    cat "${RB_WORK}/audit.err" >&2
    rb::fail "the static checks could not run on ${RB_SRC_HOST} (exit ${rc}, above)"
  fi
  # links that leave the tree are the spec's to allow (transfer.outside_links: keep)
  failed=$("${RB_LOCAL_PY}" -c 'import json, sys
doc, keep_links = json.loads(sys.argv[1]), sys.argv[2] == "keep"
failed = set()
for c in doc.get("checks") or [doc]:
    refs = (c.get("values") or {}).get("refs") or []
    if c["status"] != "fail" or (c["type"] == "outside" and keep_links and refs
                                 and all(r.get("kind") == "symlink" for r in refs)):
        continue
    failed.add(c["type"])
print(" ".join(sorted(failed)))' "${out}" "${RB_OUTSIDE_LINKS}") ||
    rb::fail "the static checks' report is not JSON: ${out:0:200}"
  grep -v '^check \|^[a-z_]* *L0 ' "${RB_WORK}/audit.err" >&2 || true
  if [[ -z "${failed}" ]]; then
    rb::log "static checks on the source: passed; its links that leave the tree are kept" \
      "(transfer.outside_links: keep)"
    return 0
  fi
  rb::fact static_failed "${failed}"
  if [[ "${failed}" == outside && "${RB_SRC_HOST}" == "${RB_DST_HOST}" ]]; then
    rb::log "the venv names paths outside itself (above); both ends are this one machine, where" \
      "they resolve: moving it"
  elif ((RB_FORCE)); then
    rb::log "the static checks failed (${failed}; above): moving it anyway (--force)"
  else
    rb::fail "the source cannot work on ${RB_DST_HOST} as it is (${failed}: the files and" \
      "packages above, each with its fix); nothing was moved. Fix the venv, or move it anyway" \
      "with --force"
  fi
}

#######################################
# Start the destination's engine for this run (rbkit engine serve): it takes the destination's
# lock for the whole run (a second run is refused, naming this one), makes its private state
# directory, and answers one request per step (rb::engine) until rb::engine_stop. Its log lines
# go to the log as they come.
#######################################
rb::engine_start() {
  local host=${RB_DST_HOST} item kit fifo="${RB_WORK}/engine"
  kit=$(rb::kit_dir "${host}")
  local -a args=(--dest "${RB_DST_ABS}" --old "${RB_SRC_ABS}" --policy "${RB_ON_EXISTING}"
    --manifest "${kit}/${RB_NAME}.manifest.jsonl" --jobs "${RB_JOBS}"
    --compression "${RB_COMPRESSION_USED}" --env-out "${RB_ENV_FILE}" --cuda-home "${RB_CUDA_HOME}"
    --origin "runbook ${RB_NAME} (${RB_SPEC})" --rerun "${RB_RERUN}"
    --probe-config "${RB_PROBE_CONFIG:-}" --on-failed-checks "${RB_ON_FAILED_CHECKS:-keep}"
    --special-modes "${RB_SPECIAL_MODES}" --keep-backups "${RB_KEEP_BACKUPS}"
    --swap-atomic "${RB_SWAP_ATOMIC}"
    --holder "runbook ${RB_NAME} run from ${HOSTNAME%%.*} (pid $$, run dir ${RB_RUN_DIR})")
  if [[ -n "${RB_ENGINE_PID}" ]]; then
    return 0
  fi
  for item in "${RB_LIB_FIRST[@]}"; do
    args+=(--first "${item}")
  done
  for item in "${RB_ENV[@]}"; do
    args+=(--env "${item}")
  done
  if [[ -n "${RB_LOCK_WAIT:-}" ]]; then
    args+=(--lock-wait "${RB_LOCK_WAIT}")
  fi
  rb::kit_argv "${host}"
  mkfifo -m 600 "${fifo}.in" "${fifo}.out"
  # a background job: its failure ends it quietly (rb::on_err), this shell sees it as EOF; with
  # RB_WORK empty it does not record itself as the command that ran last
  RB_WORK='' rb::pipe_on_host "${host}" "${RB_KIT_ARGV[@]}" engine serve "${args[@]}" \
    <"${fifo}.in" >"${fifo}.out" &
  RB_ENGINE_PID=$!
  RB_BG_PIDS+=("${RB_ENGINE_PID}")
  exec {RB_ENGINE_W}>"${fifo}.in" {RB_ENGINE_R}<"${fifo}.out"
  RB_HOST=${host}
  RB_LAST_CMD="on ${host}: rbkit engine serve --dest ${RB_DST_ABS}"
  if ! rb::engine_read 120 <&"${RB_ENGINE_R}"; then
    rb::fail "the engine on ${host} did not start (above)"
  fi
  if [[ "${RB_ENGINE_STATUS}" != ok ]]; then
    rb::fail "${RB_ENGINE_DETAIL}"
  fi
  if rb::is_local "${host}"; then
    RB_ENGINE_LOCAL_PID=${RB_J[pid]}
  fi
}

#######################################
# Ask the destination's engine to run one step: $1 the step, then key=value words. Its events are
# recorded under the current step; RB_J, RB_ENGINE_STATUS and RB_ENGINE_DETAIL say how it went.
# rb::engine fails the step when the engine's step failed; rb::engine_call leaves it to the
# caller (the probe fetches its report first).
#######################################
rb::engine() {
  rb::engine_call "$@"
  if [[ "${RB_ENGINE_STATUS}" == failed ]]; then
    rb::fail "${RB_ENGINE_DETAIL}"
  fi
}

rb::engine_call() {
  local rc=0
  RB_HOST=${RB_DST_HOST}
  RB_LAST_CMD="on ${RB_DST_HOST}: rbkit engine $*"
  if [[ -z "${RB_ENGINE_PID}" ]]; then
    rb::fail "the engine on ${RB_DST_HOST} is not running (it is started by the first step)"
  fi
  printf '%s\n%s\n' "${RB_HOST}" "${RB_LAST_CMD}" >"${RB_WORK}/last-command"
  # an engine that is gone must fail this step, not end this shell with SIGPIPE
  trap '' PIPE
  printf '%s\0' "$@" '' >&"${RB_ENGINE_W}" || rc=$?
  trap - PIPE
  if ((rc != 0)) || ! rb::engine_read 90 <&"${RB_ENGINE_R}"; then
    rb::fail "the engine on ${RB_DST_HOST} ended (or went silent) before it answered $1 (above)"
  fi
}

#######################################
# End the destination's engine: the end of its requests finishes the run there (replace: the
# install the swap replaced is removed now), it lets go of the lock and removes its state; its
# last events are recorded. $1 `now` (an interrupted run): an engine on this machine stops where
# it is (never inside a rename); one over ssh ends the step it is in (the ssh session is gone).
#######################################
rb::engine_stop() {
  local pid=${RB_ENGINE_PID}
  if [[ -z "${pid}" ]]; then
    return 0
  fi
  RB_ENGINE_PID=''
  if [[ "${1:-}" == now && -n "${RB_ENGINE_LOCAL_PID}" ]]; then
    kill -TERM "${RB_ENGINE_LOCAL_PID}" 2>/dev/null || true
  fi
  exec {RB_ENGINE_W}>&-
  rb::engine_read 90 <&"${RB_ENGINE_R}" || true
  exec {RB_ENGINE_R}<&-
  wait "${pid}" || true
}

#######################################
# End the destination's engine (its last events go into the log), write the JSON report and
# print the summary. Argument: the outcome this shell saw; the report's is the worse of it and
# what the steps' events say.
#######################################
rb::finish() {
  local outcome=$1 probe
  local -a probe_args=()
  if ((RB_FINISHED)) || [[ -z "${RB_WORK}" ]] || ((RB_DRY_RUN)); then
    return 0
  fi
  RB_FINISHED=1
  if [[ "${outcome}" == interrupted ]]; then
    rb::engine_stop now
  else
    rb::engine_stop
  fi
  for probe in "${RB_PROBE_REPORTS[@]}"; do
    probe_args+=(--probe "${probe}")
  done
  env PYTHONPATH="${RB_RUN_DIR}/kit" python3 -m rbkit report --name "${RB_NAME}" --spec "${RB_SPEC}" \
    --sha "${RB_SPEC_SHA256}" --events "${RB_EVENTS}" --outcome "${outcome}" \
    --out "${RB_REPORT}" "${probe_args[@]}" ${RB_GPU_DECLARED:+--gpu} || rb::log "could not write the report"
  rb::pictures
  rb::log "report: ${RB_REPORT}; log: ${RB_RUN_DIR}/run.log"
  if [[ "${outcome}" != ok ]]; then
    rb::log "${outcome}: see the step named above; re-run with --from ${RB_FAILED_STEP:-<step>} after" \
      "fixing it (from verify at the latest for relocate, prove and swap: only a staging this run" \
      "verified is installed)"
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
  --force         move a source whose static checks failed (kernels without code for the
                  target, references that leave the venv); the log and the report say so
  --allow-edited  run this runbook although it was edited, or its spec changed, since compile
  --version       the compiler, spec and kit this runbook was made from
  -h, --help      this text

Environment: RB_RUN_DIR (default runs/${RB_NAME}) holds the log, the manifest and the reports;
RB_LOCK_WAIT (seconds, default 30) how long to wait for a destination another run is installing.
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
# Host here (specs/h200.yaml:8): this machine
# Sets RB_HOST_SSH to the ssh options from the spec and RB_HOST_TARGET to user@host (both empty:
# this machine).
#######################################
rb::host_here() {
  RB_HOST_SSH=()
  RB_HOST_TARGET=''
}

#######################################
# State of the single-host install (a fan-out runbook installs on its nodes instead and has
# templates/partials/fanout.sh.j2 in this place).
#######################################
RB_SKIP_INSTALL=0
RB_SRC_BYTES=0
RB_SRC_FILES=0
RB_SRC_DISK=0
RB_ROUTE_USED=relay
# the transfer hashes the source unless the manifest step already did in this run
RB_HASH_DURING_STREAM=1
RB_FINGERPRINT=''
# an incremental install: staging holds links to the unchanged files, the stream only the rest
RB_DELTA=0
RB_SEND_NAMES=''
RB_SRC_STAT=''
# beside the destination, by the engine's one rule (rbkit.engine.staging_path): preflight asks it
RB_STAGING=''
# the destination holds an earlier install (preflight); the engine's private state dir there
RB_DST_INSTALLED=0
RB_ENGINE_STATE=''

#######################################
# Paths on the destination are the engine's (the staging, the env file): nothing to set here.
#######################################
rb::install_paths() {
  :
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
# Step 1/9: preflight (specs/h200.yaml:7)
# Reach every host, ship the kit, check the source is a venv after the excludes, take the destination's lock, check its state and free space.
#######################################
step_preflight() {
  local host need src_kit identity
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
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  # refused unless what the excludes leave is a venv with files (pyvenv.cfg and bin/python sent)
  rb::engine_once "${RB_SRC_HOST}" scan "${RB_SRC_ABS}" "${RB_EXCLUDE_ARGS[@]}" \
    --names "${src_kit}/${RB_NAME}.names" --special-modes "${RB_SPECIAL_MODES}" \
    --outside-links "${RB_OUTSIDE_LINKS}"
  RB_SRC_BYTES=${RB_J[bytes]}
  RB_SRC_DISK=${RB_J[disk_bytes]}
  RB_SRC_FILES=${RB_J[files]}
  RB_SRC_STAT=${RB_J[stat_fingerprint]}
  identity=${RB_J[identity]}
  need=$((RB_J[need_bytes] + RB_J[need_bytes] / 10))
  rb::log "source: ${RB_ENGINE_DETAIL} apparent, after excludes"
  rb::preflight_audit
  rb::fact files "${RB_SRC_FILES}"
  rb::fact bytes "${RB_SRC_BYTES}"
  rb::fact disk_bytes "${RB_SRC_DISK}"
  # the destination's engine for the run: from here on it holds the destination's lock
  rb::engine_start
  RB_ENGINE_STATE=${RB_J[state]}
  # never into the source, nor inside it, nor the reverse, whatever the names
  rb::engine preflight "need=${need}" "source_identity=${identity}"
  RB_DST_INSTALLED=${RB_J[installed]}
  RB_STAGING=${RB_J[staging]}
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
# Step 2/9: manifest (specs/h200.yaml:14)
# Hash every file of the source (in parallel) into a manifest; detect a re-run and what an incremental one must send.
#######################################
step_manifest() {
  RB_SKIP_INSTALL=0
  if ((RB_DST_INSTALLED == 0)); then
    # nothing to compare with: hash while the stream runs (each file is read once from disk)
    RB_HASH_DURING_STREAM=1
    rb::log "no earlier install at the destination: the source is hashed while the stream runs"
    RB_STEP_DETAIL='deferred: hashed during the transfer'
    return 0
  fi
  if [[ "${RB_RERUN}" == quick ]]; then
    rb::engine current mode=quick "source_stat=${RB_SRC_STAT}"
    if [[ "${RB_J[up_to_date]}" == 1 ]]; then
      RB_SKIP_INSTALL=1
      rb::log "the destination already holds this exact tree (same source, nothing changed there:" \
        "quick check of sizes, modes and mtimes; rerun: digest re-hashes); nothing will be sent"
      RB_STEP_DETAIL='quick check: destination up to date'
      return 0
    fi
    rb::log "quick check: ${RB_ENGINE_DETAIL}"
    if ((RB_INCREMENTAL)); then
      # the source changed, or files at the destination did: send only what differs
      rb::delta_plan
      return 0
    fi
  fi
  rb::manifest_build
  rb::manifest_share
  RB_HASH_DURING_STREAM=0
  # every file at the destination re-hashed; a different install with on_existing: refuse fails
  rb::engine current mode=digest
  if [[ "${RB_J[up_to_date]}" == 1 ]]; then
    RB_SKIP_INSTALL=1
    rb::log "the destination already holds this exact tree (verified); nothing will be sent"
  else
    rb::log "${RB_ENGINE_DETAIL}"
  fi
  RB_STEP_DETAIL="fingerprint ${RB_FINGERPRINT:0:16}"
}

#######################################
# The source or the destination changed since the destination was installed: send only what
# differs. The destination's manifest goes to the source, whose unchanged files (same mode, size
# and mtime) keep their recorded digests; the destination's engine links its unchanged files into
# a new staging and names what the stream must still carry.
#######################################
rb::delta_plan() {
  local src_kit sent linked
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  rb::on_host "${RB_DST_HOST}" cat "${RB_DST_ABS}/.rb-manifest.jsonl" >"${RB_RUN_DIR}/installed.jsonl"
  rb::pipe_on_host "${RB_SRC_HOST}" sh -c 'cat >"$1"' rb "${src_kit}/${RB_NAME}.installed.jsonl" \
    <"${RB_RUN_DIR}/installed.jsonl"
  rb::manifest_build --reuse "${src_kit}/${RB_NAME}.installed.jsonl"
  rb::log "source hashed: ${RB_J[reused]} unchanged files kept the digest recorded at the install"
  rb::manifest_share
  RB_HASH_DURING_STREAM=0
  rb::engine stage delta=1
  RB_DELTA=1
  RB_SRC_BYTES=${RB_J[send_bytes]}
  RB_SRC_FILES=${RB_J[send_files]}
  rb::fact linked_files "${RB_J[linked]}"
  rb::fact send_files "${RB_J[send_files]}"
  rb::human sent "${RB_J[send_bytes]}"
  rb::human linked "${RB_J[linked_bytes]}"
  rb::log "incremental: ${RB_J[send_files]} files (${sent}) to send; ${RB_J[linked]} unchanged" \
    "files (${linked}) linked from the current install into staging; ${RB_J[removed]} entries" \
    "gone from the source"
  RB_STEP_DETAIL="source changed: ${RB_J[send_files]} files to send, ${RB_J[linked]} linked"
  # through a file here: both ends may be one host and one kit directory
  rb::on_host "${RB_DST_HOST}" cat "${RB_J[names]}" >"${RB_RUN_DIR}/send-names"
  rb::pipe_on_host "${RB_SRC_HOST}" sh -c 'cat >"$1"' rb "${src_kit}/${RB_NAME}.send-names" \
    <"${RB_RUN_DIR}/send-names"
  RB_SEND_NAMES="${src_kit}/${RB_NAME}.send-names"
}

#######################################
# Hash the source into its manifest (on the source, in parallel). Sets RB_FINGERPRINT.
# Extra arguments go to `rbkit engine hash` (--reuse FILE).
#######################################
rb::manifest_build() {
  local src_kit
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  rb::engine_once "${RB_SRC_HOST}" hash "${RB_SRC_ABS}" "${RB_EXCLUDE_ARGS[@]}" \
    --algo "${RB_VERIFY}" --jobs "${RB_JOBS}" --out "${src_kit}/${RB_NAME}.manifest.jsonl" \
    --special-modes "${RB_SPECIAL_MODES}" "$@"
  rb::manifest_facts
}

rb::manifest_facts() {
  RB_FINGERPRINT=${RB_J[fingerprint]}
  rb::fact manifest_files "${RB_J[files]}"
  rb::log "manifest: ${RB_ENGINE_DETAIL}"
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
# Step 3/9: transfer (specs/h200.yaml:9)
# Stream the source into a staging directory beside the destination.
#######################################
step_transfer() {
  local src_kit start_ms ms bytes hash_pid='' names remote total
  local -a send recv
  if ((RB_SKIP_INSTALL)); then
    RB_STEP_DETAIL='skipped: destination already matches the source manifest'
    return 0
  fi
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  names="${src_kit}/${RB_NAME}.names"
  if ((RB_DELTA)); then
    names=${RB_SEND_NAMES}      # staging already holds the unchanged files (the manifest step)
  else
    rb::engine stage
  fi
  if ((RB_HASH_DURING_STREAM)); then
    # a background job: its failure ends it quietly (rb::on_err), `wait` below sees it
    RB_WORK='' rb::kit "${RB_SRC_HOST}" engine hash "${RB_SRC_ABS}" "${RB_EXCLUDE_ARGS[@]}" \
      --algo "${RB_VERIFY}" --jobs "${RB_JOBS}" --out "${src_kit}/${RB_NAME}.manifest.jsonl" \
      --special-modes "${RB_SPECIAL_MODES}" \
      >"${RB_RUN_DIR}/manifest-build.out" 2>"${RB_RUN_DIR}/manifest-build.err" &
    hash_pid=$!
    RB_BG_PIDS+=("${hash_pid}")
  fi
  # the two ends of the stream are the engine's (send on the source, receive into this run's
  # staging on the destination), with the one compression table
  rb::kit_argv "${RB_SRC_HOST}"
  send=("${RB_KIT_ARGV[@]}" engine send "${RB_SRC_ABS}" "${names}" --compression "${RB_COMPRESSION_USED}")
  rb::kit_argv "${RB_DST_HOST}"
  # receive hashes each file as the stream carries it (verify compares those digests)
  recv=("${RB_KIT_ARGV[@]}" engine receive --dest "${RB_DST_ABS}" --state "${RB_ENGINE_STATE}"
    --compression "${RB_COMPRESSION_USED}" --special-modes "${RB_SPECIAL_MODES}"
    --algo "${RB_VERIFY}" --jobs "${RB_JOBS}")
  rb::log "streaming ${RB_SRC_HOST}:${RB_SRC_ABS} -> ${RB_DST_HOST}:${RB_STAGING} (${RB_ROUTE_USED}," \
    "compression ${RB_COMPRESSION_USED})"
  rb::now
  start_ms=${RB_NOW}
  if [[ "${RB_ROUTE_USED}" == direct ]]; then
    remote=$(rb::shq "${recv[@]}")
    rb::on_host "${RB_SRC_HOST}" "${send[@]}" --remote ssh -o BatchMode=yes -c "${RB_SSH_CIPHERS}" \
      "${RB_DIRECT_SSH[@]}" "${remote}" >"${RB_WORK}/receive.out"
  elif command -v pv >/dev/null; then
    # pv counts the bytes every 5 s; rb::progress logs percent, rate and ETA and records them
    # for the timeline (the size is known when the stream is not compressed)
    total=0
    if [[ "${RB_COMPRESSION_USED}" == none ]]; then
      total=$((${RB_SRC_BYTES:-0} + 768 * ${RB_SRC_FILES:-0}))   # tar: a header and padding a file
    fi
    # shellcheck disable=SC2312 # pv's counts go to rb::progress; pv's status is in PIPESTATUS
    rb::on_host "${RB_SRC_HOST}" "${send[@]}" |
      pv -f -n -b -i 5 2> >(rb::progress "${total}" "${start_ms}") |
      rb::pipe_on_host "${RB_DST_HOST}" "${recv[@]}" >"${RB_WORK}/receive.out" ||
      rb::pipe_failed "stream" "pack on ${RB_SRC_HOST}" "pv here" "unpack on ${RB_DST_HOST}" \
        "${PIPESTATUS[@]}"
  else
    rb::on_host "${RB_SRC_HOST}" "${send[@]}" |
      rb::pipe_on_host "${RB_DST_HOST}" "${recv[@]}" >"${RB_WORK}/receive.out" ||
      rb::pipe_failed "stream" "pack on ${RB_SRC_HOST}" "unpack on ${RB_DST_HOST}" "${PIPESTATUS[@]}"
  fi
  rb::now
  ms=$((RB_NOW - start_ms))
  if ! rb::engine_read <"${RB_WORK}/receive.out" || [[ "${RB_ENGINE_STATUS}" != ok ]]; then
    rb::fail "the receiving end on ${RB_DST_HOST}: ${RB_ENGINE_DETAIL:-no answer (above)}"
  fi
  if [[ -n "${hash_pid}" ]]; then
    if ! wait "${hash_pid}"; then
      cat "${RB_RUN_DIR}/manifest-build.err" >&2
      rb::fail "hashing the source on ${RB_SRC_HOST} failed (above)"
    fi
    if ! rb::engine_read <"${RB_RUN_DIR}/manifest-build.out"; then
      rb::fail "hashing the source on ${RB_SRC_HOST} said nothing (above)"
    fi
    rb::manifest_facts
    rb::manifest_share
    rb::now
    rb::log "manifest ready $((RB_NOW - start_ms - ms)) ms after the stream ended"
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
# Step 4/9: verify (specs/h200.yaml:14)
# Check the staging against the manifest: every file, mode, link and digest.
#######################################
step_verify() {
  # every entry of this run's staging; files linked unchanged from the current install by stat.
  # The engine leaves its stamp: relocate, prove and swap install only what this run verified.
  rb::engine verify
  RB_STEP_DETAIL=${RB_ENGINE_DETAIL}
}

#######################################
# Step 5/9: relocate (specs/h200.yaml:11)
# Rewrite what names the old path (shebangs, activate scripts) for the new one.
#######################################
step_relocate() {
  rb::engine relocate
  rb::fact rewritten "${RB_J[rewritten]:-0}"
  RB_STEP_DETAIL=${RB_ENGINE_DETAIL}
}

#######################################
# Step 6/9: prove (specs/h200.yaml:11)
# The staged interpreter runs here and reports the staging as sys.prefix.
#######################################
step_prove() {
  # the staged interpreter must run here before anything is installed (a venv whose base
  # interpreter this host lacks stops here)
  rb::engine prove
  RB_STEP_DETAIL=${RB_ENGINE_DETAIL}
}

#######################################
# Step 7/9: swap (specs/h200.yaml:15)
# Put the proven copy in place in one rename, then prove it there (sys.prefix, bin/pip); a failure puts back what was there.
#######################################
step_swap() {
  # one rename, then the post-swap proof there (sys.prefix, bin/pip); the engine puts back what
  # was there when the proof fails
  rb::engine swap
  if [[ -n "${RB_J[backup]:-}" ]]; then
    rb::log "to put the previous destination back: bash ${0##*/} --restore"
  fi
  RB_STEP_DETAIL=${RB_ENGINE_DETAIL}
}

#######################################
# Step 8/9: exports (specs/h200.yaml:19)
# Write the env file: CUDA_HOME, PATH, LD_LIBRARY_PATH with the venv's libs first.
#######################################
step_exports() {
  # a failure past this run's swap puts back what was there (the engine)
  rb::engine exports
  RB_STEP_DETAIL=${RB_ENGINE_DETAIL}
}

#######################################
# Step 9/9: probe (specs/h200.yaml:28)
# Run the checks with the moved interpreter on the target; fetch the report.
#######################################
step_probe() {
  local report="${RB_RUN_DIR}/probe-${RB_DST_HOST}.json"
  # the checks with the moved interpreter; a failure rolls back as on_failed_checks says (the
  # engine)
  rb::engine_call probe
  if [[ -n "${RB_J[report]:-}" ]] && rb::on_host "${RB_DST_HOST}" test -f "${RB_J[report]}"; then
    rb::on_host "${RB_DST_HOST}" cat "${RB_J[report]}" >"${report}"
    RB_PROBE_REPORTS+=("${RB_DST_HOST}=${report}")
  fi
  if [[ "${RB_ENGINE_STATUS}" == failed ]]; then
    rb::fail "checks failed on ${RB_DST_HOST} (table above; report ${report})"
  fi
  RB_STEP_DETAIL="${RB_ENGINE_DETAIL} on ${RB_DST_HOST}"
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
  # shellcheck disable=SC2312 # the log's copy: tee's status is no step's
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
    args=("number=${number}")
  fi
  rb::kit_ship "${RB_DST_HOST}"
  # through the destination's engine: under the destination's lock
  rb::engine_start
  rb::engine restore "${args[@]}"
  rb::log "${RB_ENGINE_DETAIL} (${RB_DST_HOST}:${RB_DST_ABS})"
  rb::engine_stop
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
      --force) RB_FORCE=1 ;;
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
