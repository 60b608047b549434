#!/usr/bin/env bash
# @generated from specs/local.yaml (sha256 c920e77239e27051221162c53cdab3c35d063b1d3881cb2544a31cb150a75ca4) by runbook-compiler -- DO NOT EDIT.
# Edit the spec and recompile: compile specs/local.yaml
# Copy this project's venv to runs/local/venv on this machine and prove it works there.
#
# Usage: bash local.sh [--list | --dry-run | --only STEP | --from STEP] [--report PATH]
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
readonly RB_NAME=local
readonly RB_SPEC=specs/local.yaml
readonly RB_SPEC_SHA256=c920e77239e27051221162c53cdab3c35d063b1d3881cb2544a31cb150a75ca4
readonly RB_KIT_ID=986c62fb4e7a62ea
# AES-GCM first: the relay is CPU-bound.
readonly RB_SSH_CIPHERS=aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com
# transfer (specs/local.yaml:9)
readonly RB_SRC_HOST=here
readonly RB_SRC_PATH=.venv
readonly RB_DST_HOST=here
readonly RB_DST_PATH=runs/local/venv
readonly RB_ROUTE=relay
readonly RB_COMPRESSION=auto
readonly RB_VERIFY=sha256
readonly RB_ON_EXISTING=replace
readonly RB_RERUN=quick
# a re-run that finds changes sends only them (see docs/design.md)
readonly RB_INCREMENTAL=1
# hashing threads on each host (auto: one per CPU)
readonly RB_JOBS=2
# cuda
readonly RB_CUDA_HOME=''
readonly RB_ENV_FILE=''
# on_failed_checks: what a failed check after the swap does
readonly RB_ON_FAILED_CHECKS=keep
# The checks, as one JSON document for the probe on the target.
readonly RB_PROBE_CONFIG='{"checks":[{"allow_skip":false,"id":"torch","params":{"version":"2.13.0"},"type":"torch"},{"allow_skip":false,"id":"imports","params":{"modules":["torch","pydantic","jinja2","ruamel.yaml"]},"type":"imports"},{"allow_skip":false,"id":"libraries","params":{"expect_dirs":[]},"type":"libraries"},{"allow_skip":true,"id":"matmul","params":{"dtype":"float32","every_device":true,"size":256},"type":"matmul"},{"allow_skip":true,"id":"devices","params":{},"type":"devices"}],"cuda":null,"gpu":null,"host":"here","schema":1,"venv":null}'
# Hosts this runbook touches.
readonly -a RB_HOSTS=(here)
readonly -a RB_STEPS=(preflight manifest transfer verify relocate swap exports probe)
# transfer.exclude
readonly -a RB_EXCLUDE_ARGS=(--exclude __pycache__ --exclude '*.pyc')
# cuda.library_path_first, relative to the venv's site-packages
readonly -a RB_LIB_FIRST=()
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
  [preflight]='on here: connect; use the kit here; check tar and python3 >= 3.9
on here: rbkit scan .venv --exclude __pycache__ --exclude '"'"'*.pyc'"'"'
on here: rbkit scan runs/local/venv; rbkit free runs/local/.venv.rb-staging
compression: zstd -1 if both ends have zstd, else none'
  [manifest]='on here: rbkit manifest build .venv --exclude __pycache__ --exclude '"'"'*.pyc'"'"' --algo sha256 --jobs 2
here: keep a copy in runs/local/manifest.jsonl; send it to here
on here: if runs/local/venv/.rb-manifest.jsonl matches, skip the install
on here: if it differs, rbkit stage: link unchanged files from runs/local/venv into runs/local/.venv.rb-staging, send only the rest'
  [transfer]='on here: rm -rf runs/local/.venv.rb-staging && mkdir -p runs/local/.venv.rb-staging
on here: tar -C .venv --null --no-recursion -T <manifest names> -cf - | <compress: zstd -1 if both ends have zstd, else none>
  | through this machine (relay) |
on here: <decompress> | tar -C runs/local/.venv.rb-staging -xf - --no-same-owner'
  [verify]='on here: rbkit manifest verify runs/local/.venv.rb-staging <manifest> --jobs 2'
  [relocate]='on here: rbkit relocate runs/local/.venv.rb-staging --old .venv --new runs/local/venv'
  [swap]='on here: rbkit swap runs/local/.venv.rb-staging runs/local/venv --policy replace
on here: runs/local/venv/bin/python -c '"'"'import sys; print(sys.prefix)'"'"'; runs/local/venv/bin/pip --version'
  [exports]='on here: write runs/local/venv.env.sh'
  [probe]='on here: source the env file; runs/local/venv/bin/python -m rbprobes run: torch, imports, libraries, matmul, devices
here: fetch the report to runs/local/probe-here.json'
)
declare -rA RB_STEP_HOST=(
  [preflight]=here
  [manifest]=here
  [transfer]=here
  [verify]=here
  [relocate]=here
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
RB_SRC_BYTES=0
RB_SRC_FILES=0
RB_COMPRESSION_USED=none
declare -a RB_BG_PIDS=()
RB_STEP_DETAIL=''
declare -a RB_HOST_SSH=()
RB_HOST_TARGET=''
declare -a RB_PROBE_REPORTS=()
declare -A RB_KIT_DIR=()
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
  local out='' word q="'" bs='\'
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
# Write the kit here once, and copy it to HOST unless it is there already (content-addressed).
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
  dir="/tmp/rbkit-${RB_KIT_ID}"
  tar -C "${RB_RUN_DIR}/kit" -cf - . |
    rb::pipe_on_host "${host}" sh -c \
      'test -f "$1/.complete" && exec cat >/dev/null
       t="$1.tmp.$$" && mkdir -p "$t" && tar -xf - -C "$t" && touch "$t/.complete" &&
       rm -rf "$1" && mv "$t" "$1"' rbkit "${dir}" ||
    rb::pipe_failed "kit to ${host}" "tar here" "unpack on ${host}" "${PIPESTATUS[@]}"
  RB_KIT_DIR[${host}]=${dir}
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
  rb::log "report: ${RB_REPORT}; log: ${RB_RUN_DIR}/run.log"
  if [[ "${outcome}" != ok ]]; then
    rb::log "${outcome}: see the step named above; re-run with --from ${RB_FAILED_STEP:-<step>} after fixing it"
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
# Host here (specs/local.yaml:8): this machine
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
# The kit: Python tools this runbook runs on each host (hostkit/rbkit and hostkit/rbprobes).
# Arguments: the directory to write them into.
#######################################
rb::kit_write() {
  local dir=$1
  mkdir -p "${dir}"/rbkit "${dir}"/rbprobes
  cat >"${dir}"/rbkit/__init__.py <<'RB_PY_D8709D74'
"""rbkit: the file-system tools a runbook ships to every host (stdlib only, Python >= 3.9).

Relative imports only: on a host this package is named `rbkit` (see docs/design.md).
"""
RB_PY_D8709D74
  cat >"${dir}"/rbkit/__main__.py <<'RB_PY_4A0F4903'
"""python -m rbkit (on hosts) / python -m rbkit (from the repo). See docs/design.md."""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import exports, hostfs, manifest, relocate, report


def jobs(value: str) -> int:
    """--jobs N, or auto: one per CPU of this host (at most 32)."""
    if value == "auto":
        return max(1, min(32, os.cpu_count() or 1))
    return max(1, int(value))


def _print(doc) -> None:
    print(json.dumps(doc, sort_keys=True))


def cmd_manifest_build(a) -> int:
    m = manifest.build(a.root, a.exclude, a.algo, a.jobs,
                       manifest.load(a.reuse) if a.reuse else None)
    tmp = f"{a.out}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        manifest.dump(m, f)
    os.replace(tmp, a.out)
    if a.names:
        with open(a.names, "wb") as f:
            manifest.names(m, f)
    _print({"totals": m["totals"], "fingerprint": manifest.fingerprint(m), "reused": m["reused"]})
    return 0


def cmd_manifest_verify(a) -> int:
    result = manifest.verify(a.root, manifest.load(a.manifest), a.jobs,
                             linked_from=a.linked_from)
    for line in manifest.describe(result):
        print(line, file=sys.stderr)
    _print({k: result[k] for k in ("ok", "algo", "checked", "hashed", "linked", "counts")})
    return 0 if result["ok"] else 1


def cmd_manifest_fingerprint(a) -> int:
    m = manifest.load(a.manifest)
    _print({"fingerprint": manifest.fingerprint(m), "source_fingerprint":
            m["header"].get("source_fingerprint"), "totals": m["totals"]})
    return 0


def cmd_manifest_quick(a) -> int:
    result = manifest.quick_check(a.root, manifest.load(a.installed), a.source_stat)
    for rel in result.get("changed", []):
        print(f"changed at the destination: {rel}", file=sys.stderr)
    _print(result)
    return 0 if result["ok"] else 1


def cmd_manifest_delta(a) -> int:
    d = manifest.delta(manifest.load(a.manifest), manifest.load(a.base))
    with open(a.names_out, "wb") as f:
        manifest.write_names(d.pop("send"), f)
    _print(d)
    return 0


def cmd_stage(a) -> int:
    _print(hostfs.stage(a.dest, a.staging, manifest.load(a.manifest), manifest.load(a.installed),
                        a.names_out))
    return 0


def cmd_relocate(a) -> int:
    result = relocate.relocate(a.root, a.old, a.new)
    if a.manifest and a.installed:
        m = manifest.load(a.manifest)
        algo = m["header"]["algo"]
        changes = {}
        for rel, info in result["rewritten"].items():
            change = {"s": info["s"]}
            if algo != "none":
                change["h"] = manifest.digest(os.path.join(a.root, rel), algo)
            changes[rel] = change
        installed = manifest.relocated(m, changes, manifest.fingerprint(m))
        with open(a.installed, "w", encoding="utf-8") as f:
            manifest.dump(installed, f)
    for rel in result["remaining"]:
        print(f"still names {a.old}: {rel}", file=sys.stderr)
    _print({"rewritten": sorted(result["rewritten"]), "count": len(result["rewritten"]),
            "remaining": result["remaining"],
            "elsewhere": result["elsewhere"], "same_path": result["same_path"]})
    return 1 if result["remaining"] else 0


def cmd_scan(a) -> int:
    _print(hostfs.scan(a.root, a.exclude, a.names))
    return 0


def cmd_free(a) -> int:
    _print(hostfs.free_bytes(a.path))
    return 0


def cmd_swap(a) -> int:
    _print(hostfs.swap(a.staging, a.dest, a.policy))
    return 0


def cmd_restore(a) -> int:
    _print(hostfs.restore(a.dest, a.number))
    return 0


def cmd_exports(a) -> int:
    env = dict(item.split("=", 1) for item in a.env)
    text, summary = exports.render(a.venv, a.cuda_home, a.first, env, a.origin)
    if summary["missing_dirs"]:
        for d in summary["missing_dirs"]:
            print(f"library dir does not exist in the venv: {d}", file=sys.stderr)
        _print(summary)
        return 1
    exports.write(a.out, text)
    _print(dict(summary, file=a.out))
    return 0


def cmd_report(a) -> int:
    probes = dict(item.split("=", 1) for item in a.probe)
    doc = report.build(a.name, a.spec, a.sha, a.events, probes, a.outcome)
    tmp = f"{a.out}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, a.out)
    print(report.table(doc), file=sys.stderr)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rbkit", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("manifest").add_subparsers(dest="mcmd", required=True)
    b = m.add_parser("build")
    b.add_argument("root")
    b.add_argument("--exclude", action="append", default=[])
    b.add_argument("--algo", choices=("sha256", "blake2b", "none"), default="sha256")
    b.add_argument("--jobs", type=jobs, default="auto")
    b.add_argument("--out", required=True)
    b.add_argument("--names")
    b.add_argument("--reuse", help="an earlier install's manifest: unchanged files keep its digest")
    b.set_defaults(fn=cmd_manifest_build)
    v = m.add_parser("verify")
    v.add_argument("root")
    v.add_argument("manifest")
    v.add_argument("--jobs", type=jobs, default="auto")
    v.add_argument("--linked-from", help="files hard-linked from here are checked by stat")
    v.set_defaults(fn=cmd_manifest_verify)
    q = m.add_parser("quick-check")
    q.add_argument("root")
    q.add_argument("installed")
    q.add_argument("--source-stat", required=True)
    q.set_defaults(fn=cmd_manifest_quick)
    fp = m.add_parser("fingerprint")
    fp.add_argument("manifest")
    fp.set_defaults(fn=cmd_manifest_fingerprint)
    d = m.add_parser("delta", help="what a host installed from BASE still needs (manifest.delta)")
    d.add_argument("manifest")
    d.add_argument("base")
    d.add_argument("--names-out", required=True)
    d.set_defaults(fn=cmd_manifest_delta)
    r = sub.add_parser("relocate")
    r.add_argument("root")
    r.add_argument("--old", required=True)
    r.add_argument("--new", required=True)
    r.add_argument("--manifest")
    r.add_argument("--installed")
    r.set_defaults(fn=cmd_relocate)
    st = sub.add_parser("stage", help="an incremental install's staging (hostfs.stage)")
    st.add_argument("dest")
    st.add_argument("staging")
    st.add_argument("--manifest", required=True)
    st.add_argument("--installed", required=True)
    st.add_argument("--names-out", required=True)
    st.set_defaults(fn=cmd_stage)
    s = sub.add_parser("scan")
    s.add_argument("root")
    s.add_argument("--exclude", action="append", default=[])
    s.add_argument("--names", help="also write the NUL-separated name list for tar -T here")
    s.set_defaults(fn=cmd_scan)
    fr = sub.add_parser("free")
    fr.add_argument("path")
    fr.set_defaults(fn=cmd_free)
    sw = sub.add_parser("swap")
    sw.add_argument("staging")
    sw.add_argument("dest")
    sw.add_argument("--policy", choices=("refuse", "backup", "replace"), required=True)
    sw.set_defaults(fn=cmd_swap)
    rs = sub.add_parser("restore")
    rs.add_argument("dest")
    rs.add_argument("--number", type=int)
    rs.set_defaults(fn=cmd_restore)
    e = sub.add_parser("exports")
    e.add_argument("--venv", required=True)
    e.add_argument("--out", required=True)
    e.add_argument("--cuda-home", default="")
    e.add_argument("--first", action="append", default=[])
    e.add_argument("--env", action="append", default=[])
    e.add_argument("--origin", default="a runbook")
    e.set_defaults(fn=cmd_exports)
    rp = sub.add_parser("report")
    rp.add_argument("--name", required=True)
    rp.add_argument("--spec", required=True)
    rp.add_argument("--sha", required=True)
    rp.add_argument("--events", required=True)
    rp.add_argument("--probe", action="append", default=[])
    rp.add_argument("--outcome", required=True)
    rp.add_argument("--out", required=True)
    rp.set_defaults(fn=cmd_report)
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    try:
        return a.fn(a)
    except (OSError, ValueError) as exc:
        print(f"rbkit {a.cmd}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
RB_PY_4A0F4903
  cat >"${dir}"/rbkit/exports.py <<'RB_PY_EAEBB3AA'
"""The env file a moved venv is used through: CUDA_HOME, PATH, LD_LIBRARY_PATH (venv dirs first).

The env file belongs to the install it was written for: `write(..., venv=DEST)` keeps a copy inside
the install (`DEST/.rb-env.sh`, which manifests skip), and `restore_env` puts that copy back at the
public path when a restore or a rollback brings the install back. Both are written through a new
temp file and one rename (rbkit.safefs): a link at either name is replaced, never written through.
"""

from __future__ import annotations

import glob
import os
import shlex
from typing import Optional

from . import safefs

IN_INSTALL = ".rb-env.sh"   # the install's own copy of its env file (manifest.SKIP_NAMES)


def site_packages(venv: str) -> str:
    found = sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages")))
    if not found:
        raise FileNotFoundError(f"{venv} has no lib/python3*/site-packages")
    return found[-1]


def render(venv: str, cuda_home: str, first: list, env: dict, origin: str) -> tuple[str, dict]:
    """The env file's text and a summary. `first` are dirs relative to site-packages."""
    site = site_packages(venv)
    lib_dirs = [os.path.join(site, d) for d in first]
    missing = [d for d in lib_dirs if not os.path.isdir(d)]
    q = shlex.quote
    lines = [
        f"# Environment for the venv at {venv}.",
        f"# Written by {origin}. Use: source this file (bash, zsh, sh).",
        f"export VIRTUAL_ENV={q(venv)}",
    ]
    path = [os.path.join(venv, "bin")]
    if cuda_home:
        lines.append(f"export CUDA_HOME={q(cuda_home)}")
        path.append(os.path.join(cuda_home, "bin"))
        lib_dirs = lib_dirs + [os.path.join(cuda_home, "lib64")]
    lines.append(f"export PATH={q(':'.join(path))}" + '"${PATH:+:${PATH}}"')
    if lib_dirs:
        lines.append(
            f"export LD_LIBRARY_PATH={q(':'.join(lib_dirs))}"
            + '"${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"'
        )
    for key in sorted(env):
        lines.append(f"export {key}={q(env[key])}")
    summary = {"site_packages": site, "library_dirs": lib_dirs, "missing_dirs": missing,
               "cuda_home": cuda_home or None}
    return "\n".join(lines) + "\n", summary


def write(path: str, text: str, *, venv: Optional[str] = None) -> None:
    """Write the env file at `path` (mode 0644). With `venv` (the install it is for), first keep
    the same text inside the install as `venv/.rb-env.sh`, so that a restore of this install can
    put its own env file back."""
    data = text.encode("utf-8")
    if venv is not None:
        safefs.write_in(venv, IN_INSTALL, data, 0o644)
    safefs.write_file(path, data, 0o644)


def restore_env(venv: str, path: str) -> dict:
    """Put the env file kept inside the install at `venv` back at `path`. When the install has
    none (made before env files were versioned), `path` is left alone and the result says so."""
    got = safefs.read_in(venv, IN_INSTALL, limit=1 << 20)
    if got is None:
        return {"path": path, "restored": False,
                "why": f"{venv} holds no {IN_INSTALL}; {path} still belongs to the install it "
                       "replaced: run the exports step again"}
    safefs.write_file(path, got[0], 0o644)
    return {"path": path, "restored": True, "from": os.path.join(venv, IN_INSTALL)}
RB_PY_EAEBB3AA
  cat >"${dir}"/rbkit/hostfs.py <<'RB_PY_5F73DE2D'
"""Small facts about paths on a host: what is there, how big, how much room, and the atomic swap.

The host side runs as root over trees other users wrote (see docs/design.md, "Threat model"):
`scan` reports what must not be moved silently (setuid/setgid/world-writable entries, links that
leave the tree, device nodes) and refuses it unless the spec allows it; `strip_special` removes
those mode bits from an extracted tree; `identity`/`same_or_nested` (rbkit.pathid) tell whether
the destination is the source under another name; `swap` and `restore` (rbkit.swapfs) never
replace a link with a directory, journal a swap that cannot be one rename, keep each backup
independent of the live install, and bring back an install's own env file.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import stat
from typing import List, Optional

from . import manifest, safefs
# public here (what callers use as hostfs.NAME): which path is which, and the swap's side
from .pathid import identity, mount_of, same_machine, same_or_nested  # noqa: F401
from .swapfs import (RENAME_EXCHANGE, RENAME_NOREPLACE, SWAP_ATOMIC,  # noqa: F401
                     backup_dirs, backups, describe_install, failed_mark, journal_path,
                     prune_backups, recover_swap, remove, restore, swap, unshare_backup)

__all__ = [
    "scan", "link_escapes", "strip_special", "free_bytes", "stage",
    "identity", "mount_of", "same_machine", "same_or_nested",
    "swap", "restore", "backups", "backup_dirs", "prune_backups", "unshare_backup",
    "recover_swap", "journal_path", "describe_install", "failed_mark", "remove",
    "RENAME_EXCHANGE", "RENAME_NOREPLACE", "SWAP_ATOMIC", "SPECIAL_MODES", "OUTSIDE_LINKS",
]

SPECIAL_MODES = ("refuse", "strip", "keep")    # transfer.special_modes
OUTSIDE_LINKS = ("refuse", "keep")             # transfer.outside_links
# the venv's own interpreter links (bin/python -> /usr/bin/python3.12): outside the tree by design
INTERPRETER_LINK = re.compile(r"^bin/(?:python|pypy)[0-9.]*$")


def _octal(mode: int) -> str:
    return "%04o" % mode


def link_escapes(root: str, rel: str, target: str, max_hops: int = 40) -> bool:
    """Whether the symlink `rel` (target `target`) in the tree `root` leads outside it. An
    absolute target always does (at the destination it names the source's path or the host's
    files); a relative one is resolved component by component against the tree, following the
    links it meets as the kernel would (`dot -> .` then `x -> dot/..` is the tree's parent, which
    a lexical normpath calls inside). A target that does not exist (yet) leads nowhere: False."""
    if target.startswith("/"):
        return True
    stack = [p for p in rel.split("/")[:-1] if p]
    todo = target.split("/")
    hops = 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not stack:
                return True
            stack.pop()
            continue
        here = os.path.join(root, *stack, part)
        try:
            st = os.lstat(here)
        except OSError:
            return False                      # dangling (or through a file): resolves nowhere
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > max_hops:
                return False                  # a loop: the kernel gives ELOOP, nothing is reached
            inner = os.readlink(here)
            if inner.startswith("/"):
                return True
            todo = inner.split("/") + todo
            continue
        stack.append(part)
    return False


def scan(root: str, patterns, names_path: Optional[str] = None, *,
         special_modes: str = "refuse", outside_links: str = "refuse", limit: int = 50) -> dict:
    """Is `root` a venv, and how many files/bytes (apparent and on disk) after the excludes.
    With `names_path`, also write the entries as a NUL-separated list for `tar -T` (the same walk
    and order as a manifest's).

    Also what must not be moved silently: `special_modes` (entries with setuid, setgid, sticky or
    world-write bits: refused unless the spec says `strip` or `keep`), `outside_links` (symlinks
    that leave the tree, the venv's bin/python* excepted: refused unless `keep`) and `devices`
    (never moved); `refusal` is the text preflight fails with, "" when nothing is refused.
    `need_bytes` is the room the copy takes: each file at the larger of its apparent size and its
    blocks (tar writes a sparse file's holes out)."""
    if special_modes not in SPECIAL_MODES:
        raise ValueError(f"special_modes must be one of {SPECIAL_MODES}, not {special_modes!r}")
    if outside_links not in OUTSIDE_LINKS:
        raise ValueError(f"outside_links must be one of {OUTSIDE_LINKS}, not {outside_links!r}")
    out: dict = {"path": root, "exists": os.path.lexists(root), "refusal": ""}
    if not out["exists"]:
        return out
    out["is_link"] = os.path.islink(root)
    if out["is_link"]:
        out["link_target"] = os.readlink(root)
    out["is_dir"] = os.path.isdir(root)
    cfg = os.path.join(root, "pyvenv.cfg")
    out["is_venv"] = os.path.isfile(cfg) and os.path.exists(os.path.join(root, "bin", "python"))
    got = safefs.read_in(root, "pyvenv.cfg", limit=1 << 20) if out["is_dir"] else None
    if got is not None:
        for line in got[0].decode("utf-8", "replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip() in ("version", "version_info", "home"):
                out[f"pyvenv_{key.strip()}"] = value.strip()
    if out["is_dir"]:
        files = dirs = links = 0
        apparent = disk = need = 0
        names: List[bytes] = []
        special: List[dict] = []
        outside: List[dict] = []
        devices: List[str] = []
        sparse: List[str] = []
        stat_fp = hashlib.sha256()
        strip = special_modes == "strip"
        for rel, st in manifest.walk(root, patterns):
            entry = manifest.entry_of(root, rel, st)
            stat_fp.update(manifest.stat_line(manifest.without_special(entry) if strip else entry))
            if names_path:
                names.append(rel.encode("utf-8", "surrogateescape") + b"\0")
            blocks = getattr(st, "st_blocks", 0) * 512
            disk += blocks
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                links += 1
                need += blocks
                if not INTERPRETER_LINK.match(rel) and link_escapes(root, rel, entry["l"]):
                    outside.append({"p": rel, "l": entry["l"]})
                continue
            if mode & manifest.SPECIAL_BITS:
                special.append({"p": rel, "m": _octal(mode)})
            if stat.S_ISREG(st.st_mode):
                files += 1
                apparent += st.st_size
                need += max(blocks, -(-st.st_size // 4096) * 4096)
                if blocks + 4096 <= st.st_size:
                    sparse.append(rel)
            elif stat.S_ISDIR(st.st_mode):
                dirs += 1
                need += max(blocks, 4096)
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                devices.append(rel)
        if names_path:
            safefs.write_file(names_path, b"".join(names), 0o600)
        out.update(files=files, dirs=dirs, links=links, bytes=apparent, disk_bytes=disk,
                   need_bytes=need, stat_fingerprint=stat_fp.hexdigest(),
                   special_modes=special[:limit], special_modes_count=len(special),
                   special_modes_action=special_modes, outside_links=outside[:limit],
                   outside_links_count=len(outside), devices=devices[:limit],
                   sparse_files=sparse[:limit], sparse_count=len(sparse))
        out["refusal"] = _refusal(special, special_modes, outside, outside_links, devices)
    out["installed_manifest"] = os.path.isfile(os.path.join(root, ".rb-manifest.jsonl"))
    return out


def _count(items: list, one: str, many: str) -> str:
    return f"{len(items)} {one if len(items) == 1 else many}"


def _refusal(special: list, special_action: str, outside: list, outside_action: str,
             devices: list, shown: int = 10) -> str:
    why = []

    def some(items: list) -> str:
        more = f", and {len(items) - shown} more" if len(items) > shown else ""
        return ", ".join(items[:shown]) + more

    if special and special_action == "refuse":
        why.append(f"{_count(special, 'entry', 'entries')} with setuid, setgid, sticky or "
                   "world-write bits (moved by root, a setuid file of another user arrives as a "
                   "setuid-root file): "
                   + some([f"{e['p']} ({e['m']})" for e in special])
                   + "; set transfer.special_modes: strip to install them without those bits, "
                   "or keep to move them as they are")
    if outside and outside_action == "refuse":
        why.append(f"{_count(outside, 'symlink points', 'symlinks point')} outside the tree: "
                   + some([f"{e['p']} -> {e['l']}" for e in outside])
                   + "; set transfer.outside_links: keep to move them as they are")
    if devices:
        why.append(f"{_count(devices, 'device node', 'device nodes')} in the tree (never moved): "
                   + some(devices))
    return "; ".join(why)


def _chmod_nofollow(root: str, rel: str, st: os.stat_result, mode: int) -> None:
    """chmod `rel` in the tree `root` to `mode` through a descriptor of the very inode the walk
    saw (opened without following a link); FIFOs and devices through O_PATH, never opened."""
    head, name = os.path.split(rel)
    dir_fd = safefs.open_dir(root, head)
    try:
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            fd = os.open(name, flags | (os.O_DIRECTORY if stat.S_ISDIR(st.st_mode) else 0),
                         dir_fd=dir_fd)
            path_fd = False
        else:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            path_fd = True
        try:
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise OSError(errno.ESTALE, "changed while the tree was walked", rel)
            if path_fd:
                os.chmod(f"/proc/self/fd/{fd}", mode)
            else:
                os.fchmod(fd, mode)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)


def strip_special(root: str) -> List[dict]:
    """Remove the setuid, setgid, sticky and world-write bits (manifest.SPECIAL_BITS) from every
    entry of the tree `root` (an extracted staging), links never followed. Returns what it
    changed, [{"p", "was", "now"}]: empty when the extraction created none (the recommended tar
    flags), so the caller can say what it stripped, or fail when it expected nothing."""
    changed = []
    for rel, st in manifest.walk(root):
        if stat.S_ISLNK(st.st_mode):
            continue
        mode = stat.S_IMODE(st.st_mode)
        if mode & manifest.SPECIAL_BITS:
            now = mode & ~manifest.SPECIAL_BITS
            _chmod_nofollow(root, rel, st, now)
            changed.append({"p": rel, "was": _octal(mode), "now": _octal(now)})
    return changed


def free_bytes(path: str) -> dict:
    """Free bytes on the filesystem that holds `path` (or its nearest existing parent)."""
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    usage = shutil.disk_usage(probe)
    return {"path": path, "measured_at": probe, "free_bytes": usage.free, "total_bytes": usage.total}


def stage(dest: str, staging: str, new: dict, installed: dict, names_path: str) -> dict:
    """An incremental install's staging: a fresh `staging` with every directory of `new`, and each
    unchanged file hard-linked from the previous install at `dest` (same digest, mode, size and
    mtime in both manifests, and the file at `dest` still has the recorded stat); writes the
    NUL-separated names tar must still send (changed and new files, relocatable files, every
    directory and symlink: tar restores their modes and targets). `dest` is never written.
    A staging path that is a link is removed as a link (its target is not touched)."""
    if new["header"].get("algo") != installed["header"].get("algo") or new["header"]["algo"] == "none":
        raise ValueError("an incremental install needs digests of one algorithm in both manifests")
    before = {e["p"]: e for e in installed["entries"]}
    if os.path.lexists(staging):
        remove(staging)
    os.makedirs(staging)
    send: list[str] = []
    linked = linked_bytes = send_bytes = send_files = 0
    for e in new["entries"]:                       # parents come before their children
        rel = e["p"]
        target = os.path.join(staging, rel)
        if e["t"] == "d":
            os.makedirs(target, exist_ok=True)
            send.append(rel)
            continue
        old = before.get(rel)
        if manifest.linkable(old, e):
            src = os.path.join(dest, rel)
            try:
                st = os.lstat(src)
                if manifest.entry_of(dest, rel, st) == {k: v for k, v in old.items() if k != "h"}:
                    os.link(src, target)
                    linked += 1
                    linked_bytes += e["s"]
                    continue
            except OSError:
                pass                               # gone, another file system, not allowed: send
        send.append(rel)
        if e["t"] == "f":
            send_files += 1
            send_bytes += e["s"]
    buf = bytearray()
    for rel in send:
        buf += rel.encode("utf-8", "surrogateescape") + b"\0"
    safefs.write_file(names_path, bytes(buf), 0o600)
    return {"linked": linked, "linked_bytes": linked_bytes, "send_files": send_files,
            "send_bytes": send_bytes, "send_entries": len(send),
            "removed": len(set(before) - {e["p"] for e in new["entries"]})}
RB_PY_5F73DE2D
  cat >"${dir}"/rbkit/manifest.py <<'RB_PY_E618E5FC'
"""Per-file manifests: made on the source, checked on the target, in parallel.

A manifest is JSON lines: a header, one line per entry (sorted by path), and a totals line.
Entries: {"p": path, "t": "f"|"d"|"l", "m": mode, "s": size, "h": digest} (files),
{"p", "t": "d", "m"} (dirs), {"p", "t": "l", "l": link target} (symlinks).
With `strip_special` a manifest records modes without the setuid, setgid, sticky and world-write
bits (SPECIAL_BITS): what the install will hold after they are stripped (`hostfs.strip_special`).
Exclude patterns follow GNU tar's defaults for --exclude: a pattern matches the whole relative
path or any tail of it that starts at a component, and `*` matches `/` too. An excluded directory
is not entered.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import os
import stat
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Iterator, Optional

from . import safefs

SCHEMA = 1
CHUNK = 1 << 20
# written into an install by the install itself (its manifest, its versioned env file, the mark
# of a build whose checks failed): never compared, never sent
SKIP_NAMES = (".rb-manifest.jsonl", ".rb-env.sh", ".rb-failed")
# what an install never carries unless the spec says so out loud (transfer.special_modes: keep)
SPECIAL_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWOTH
QUICK_KEYS = ("t", "m", "s", "mt")    # what a stat-level comparison of two file entries uses


def relocatable(rel: str) -> bool:
    """What relocation may rewrite (bin/*, pyvenv.cfg): its installed content is not the source's,
    so an incremental install never reuses its digest nor links it from the previous install."""
    return rel == "pyvenv.cfg" or rel.startswith("bin/")


def linkable(old: Optional[dict], new: dict) -> bool:
    """Whether a file recorded as `old` (by an earlier install or an earlier source manifest) can
    stand for `new` unread: same digest, type, mode, size and mtime, and not relocatable."""
    return (new["t"] == "f" and old is not None and not relocatable(new["p"])
            and bool(new.get("h")) and old.get("h") == new.get("h")
            and all(old.get(k) == new.get(k) for k in QUICK_KEYS))


def delta(new: dict, base: dict) -> dict:
    """What a host whose install came from `base` (unchanged since) still needs to hold `new`:
    every directory, symlink and relocatable file, and each file not `linkable` from `base`. The
    same rule as `hostfs.stage`, so a host installed from `base` asks for a subset of this."""
    if new["header"].get("algo") != base["header"].get("algo") or new["header"]["algo"] == "none":
        return {"usable": False, "send": [e["p"] for e in new["entries"]],
                "why": "the last fan-out's manifest has digests of another algorithm (or none)"}
    before = {e["p"]: e for e in base["entries"]}
    send, same = [], []
    for e in new["entries"]:
        (same if linkable(before.get(e["p"]), e) else send).append(e)
    files = [e for e in send if e["t"] == "f"]
    return {"usable": True, "send": [e["p"] for e in send], "send_entries": len(send),
            "send_files": len(files), "send_bytes": sum(e["s"] for e in files),
            "unchanged_files": len(same), "unchanged_bytes": sum(e["s"] for e in same),
            "removed": len(set(before) - {e["p"] for e in new["entries"]})}


def excluded(rel: str, patterns: Iterable[str]) -> bool:
    parts = rel.split("/")
    tails = ["/".join(parts[i:]) for i in range(len(parts))]
    return any(fnmatch.fnmatchcase(tail, pat) for pat in patterns for tail in tails)


def walk(root: str, patterns: Iterable[str] = ()) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every entry below root, sorted, excludes pruned."""
    patterns = list(patterns)
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        full = os.path.join(root, rel_dir) if rel_dir else root
        with os.scandir(full) as it:
            entries = sorted(it, key=lambda e: e.name)
        subdirs = []
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if rel in SKIP_NAMES or excluded(rel, patterns):
                continue
            st = entry.stat(follow_symlinks=False)
            yield rel, st
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(rel)
        stack.extend(reversed(subdirs))


def digest(path: str, algo: str) -> str:
    """The file's digest; a link at `path` (made after the walk saw a file) is an error, not a
    path to another file."""
    h = hashlib.new(algo) if algo != "blake2b" else hashlib.blake2b(digest_size=32)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC)
    with open(fd, "rb", buffering=0) as f:
        while True:
            block = f.read(CHUNK)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def entry_of(root: str, rel: str, st: os.stat_result) -> dict:
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return {"p": rel, "t": "l", "l": os.readlink(os.path.join(root, rel))}
    if stat.S_ISDIR(st.st_mode):
        return {"p": rel, "t": "d", "m": mode}
    if stat.S_ISREG(st.st_mode):
        # mtime in whole seconds: what tar restores (its default format keeps seconds)
        return {"p": rel, "t": "f", "m": mode, "s": st.st_size, "mt": int(st.st_mtime)}
    return {"p": rel, "t": "?", "m": mode}


def without_special(entry: dict) -> dict:
    """`entry` with its mode's SPECIAL_BITS cleared (links have no mode of their own)."""
    if entry.get("t") == "l" or "m" not in entry or not entry["m"] & SPECIAL_BITS:
        return entry
    return dict(entry, m=entry["m"] & ~SPECIAL_BITS)


STAT_KEYS = ("p", "t", "m", "s", "l", "mt")


def stat_line(entry: dict) -> bytes:
    return json.dumps([entry.get(k) for k in STAT_KEYS], ensure_ascii=False).encode() + b"\n"


def stat_fingerprint(entries: Iterable[dict]) -> str:
    """sha256 over what a quick check compares (path, type, mode, size, link, mtime): no reading."""
    h = hashlib.sha256()
    for e in entries:
        h.update(stat_line(e))
    return h.hexdigest()


def quick_check(root: str, installed: dict, source_stat: str) -> dict:
    """Re-run check without reading file contents, like rsync's default: the source's stat
    fingerprint must equal the one recorded at install time, and every entry at `root` must still
    have the path, type, mode, size, link target and mtime the install recorded."""
    recorded = installed["header"].get("source_stat_fingerprint")
    if recorded != source_stat:
        return {"ok": False, "why": "the source changed since the install (or was never recorded)"}
    result = check_tree(root, installed)
    if result["ok"]:
        result["why"] = "same source, destination unchanged (stat check)"
    return result


def check_tree(root: str, installed: dict) -> dict:
    """Whether every entry at `root` still has the path, type, mode, size, link target and mtime
    that `installed` (the manifest the install recorded) says; no reading of contents."""
    patterns = installed["header"].get("excludes", ())
    want = {e["p"]: [e.get(k) for k in STAT_KEYS] for e in installed["entries"]}
    have = {}
    for rel, st in walk(root, patterns):
        e = entry_of(root, rel, st)
        have[rel] = [e.get(k) for k in STAT_KEYS]
    changed = sorted(p for p in set(want) | set(have) if want.get(p) != have.get(p))
    if changed:
        return {"ok": False, "why": f"{len(changed)} entries changed at the destination",
                "changed": changed[:20]}
    return {"ok": True, "why": "unchanged since the install (stat check)"}


def build(root: str, patterns: Iterable[str] = (), algo: str = "sha256", jobs: int = 4,
          reuse: Optional[dict] = None, *, strip_special: bool = False) -> dict:
    """Scan and hash `root`; returns {"header", "entries", "totals", "reused"}.

    With `reuse` (the manifest an earlier install recorded), a file whose type, mode, size and
    mtime equal its entry there takes that entry's digest unread (rsync's quick check: the same
    trust as `rerun: quick`); relocatable files are always read. With `strip_special`, modes are
    recorded without SPECIAL_BITS (transfer.special_modes: strip)."""
    entries, disk = [], 0
    patterns = list(patterns)
    for rel, st in walk(root, patterns):
        e = entry_of(root, rel, st)
        entries.append(without_special(e) if strip_special else e)
        disk += getattr(st, "st_blocks", 0) * 512
    files = [e for e in entries if e["t"] == "f"]
    reused = 0
    if algo != "none":
        before = {}
        if reuse is not None and reuse["header"].get("algo") == algo:
            before = {e["p"]: e for e in reuse["entries"] if e.get("t") == "f" and e.get("h")}
        todo = []
        for e in files:
            old = before.get(e["p"])
            if old and not relocatable(e["p"]) and all(old.get(k) == e.get(k) for k in QUICK_KEYS):
                e["h"] = old["h"]
                reused += 1
            else:
                todo.append(e)
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for e, h in zip(todo, pool.map(lambda e: digest(os.path.join(root, e["p"]), algo), todo)):
                e["h"] = h
    totals = {
        "entries": len(entries),
        "files": len(files),
        "dirs": sum(1 for e in entries if e["t"] == "d"),
        "links": sum(1 for e in entries if e["t"] == "l"),
        "other": sum(1 for e in entries if e["t"] == "?"),
        "bytes": sum(e["s"] for e in files),
        "disk_bytes": disk,
    }
    header = {"schema": SCHEMA, "kind": "rb-manifest", "algo": algo, "excludes": list(patterns)}
    if strip_special:
        header["strip_special"] = True
    return {"header": header, "entries": entries, "totals": totals, "reused": reused}


def dump(manifest: dict, out) -> None:
    out.write(json.dumps(manifest["header"], sort_keys=True) + "\n")
    for e in manifest["entries"]:
        out.write(json.dumps(e, sort_keys=True, ensure_ascii=False) + "\n")
    out.write(json.dumps({"totals": manifest["totals"]}, sort_keys=True) + "\n")


def save(manifest: dict, path: str, mode: int = 0o644) -> None:
    """Write `manifest` to `path` (e.g. an install's `.rb-manifest.jsonl`) through a new temp
    file and one rename: a link at `path` is replaced, never written through."""
    buf = io.StringIO()
    dump(manifest, buf)
    safefs.write_file(path, buf.getvalue().encode("utf-8"), mode)


def load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    if not lines or lines[0].get("kind") != "rb-manifest" or "totals" not in lines[-1]:
        raise ValueError(f"{path}: not a complete manifest (header or totals line missing)")
    return {"header": lines[0], "entries": lines[1:-1], "totals": lines[-1]["totals"]}


def fingerprint(manifest: dict) -> str:
    """sha256 over the entries: equal fingerprints mean equal trees (for the chosen algo)."""
    h = hashlib.sha256()
    for e in manifest["entries"]:
        h.update(json.dumps(e, sort_keys=True, ensure_ascii=False).encode() + b"\n")
    return h.hexdigest()


def _same_inode(a: str, b: str) -> bool:
    try:
        sa, sb = os.lstat(a), os.lstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def verify(root: str, manifest: dict, jobs: int = 4, limit: int = 50,
           linked_from: Optional[str] = None) -> dict:
    """Compare the tree at `root` with `manifest`; every difference is listed (up to `limit`).
    With `linked_from`, a file that is a hard link of the same path there (an incremental install's
    staging: unchanged files linked from the previous install) is checked by stat, not read."""
    algo = manifest["header"]["algo"]
    want = {e["p"]: e for e in manifest["entries"]}
    have = {}
    # what the move excluded (caches: __pycache__, *.pyc) may appear once the venv has run there
    for rel, st in walk(root, manifest["header"].get("excludes", ())):
        have[rel] = entry_of(root, rel, st)
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    differ: list[dict] = []
    to_hash = []
    linked = 0
    for rel in sorted(set(want) & set(have)):
        w, h = want[rel], have[rel]
        for key in ("t", "m", "s", "l"):
            if w.get(key) != h.get(key):
                differ.append({"p": rel, "what": key, "want": w.get(key), "have": h.get(key)})
                break
        else:
            if w["t"] == "f" and algo != "none":
                if linked_from and _same_inode(os.path.join(root, rel),
                                               os.path.join(linked_from, rel)):
                    linked += 1
                    continue
                to_hash.append(w)
    if to_hash:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            got = pool.map(lambda e: digest(os.path.join(root, e["p"]), algo), to_hash)
            for w, h in zip(to_hash, got):
                if w.get("h") != h:
                    differ.append({"p": w["p"], "what": "content", "want": w.get("h"), "have": h})
    ok = not (missing or extra or differ)
    return {
        "ok": ok,
        "algo": algo,
        "checked": len(want),
        "hashed": len(to_hash),
        "linked": linked,
        "missing": missing[:limit],
        "extra": extra[:limit],
        "differ": sorted(differ, key=lambda d: d["p"])[:limit],
        "counts": {"missing": len(missing), "extra": len(extra), "differ": len(differ)},
    }


def describe(result: dict) -> list[str]:
    lines = []
    for rel in result["missing"]:
        lines.append(f"missing: {rel}")
    for rel in result["extra"]:
        lines.append(f"extra:   {rel}")
    for d in result["differ"]:
        lines.append(f"differs: {d['p']} ({d['what']}: expected {d['want']}, found {d['have']})")
    c = result["counts"]
    shown = len(lines)
    total = c["missing"] + c["extra"] + c["differ"]
    if total > shown:
        lines.append(f"... and {total - shown} more")
    return lines


def names(manifest: dict, out) -> None:
    """NUL-separated relative paths for `tar --null --no-recursion -T -`, parents first."""
    write_names((e["p"] for e in manifest["entries"]), out)


def write_names(paths: Iterable[str], out) -> None:
    """Relative paths as a NUL-separated list (a binary file), the form `tar -T` and
    `read_names` take."""
    for rel in paths:
        out.write(rel.encode("utf-8", "surrogateescape") + b"\0")


def read_names(path: str) -> list[str]:
    with open(path, "rb") as f:
        return [n.decode("utf-8", "surrogateescape") for n in f.read().split(b"\0") if n]


def relocated(manifest: dict, changes: dict[str, dict], source_fingerprint: Optional[str]) -> dict:
    """The manifest of the installed tree: `manifest` with relocation's rewritten entries, and in
    its header what the source was (for re-runs)."""
    entries = [dict(e, **changes.get(e["p"], {})) for e in manifest["entries"]]
    header = dict(manifest["header"], source_fingerprint=source_fingerprint,
                  source_stat_fingerprint=stat_fingerprint(manifest["entries"]))
    return {"header": header, "entries": entries, "totals": manifest["totals"]}
RB_PY_E618E5FC
  cat >"${dir}"/rbkit/pathid.py <<'RB_PY_22621B07'
"""Is the destination the source? Which machine and which directory a path is, beyond its text.

A text comparison of the spec's two endpoints misses a symlink alias (`/opt/venv` and
`/data/opt/venv`), a relative path, a bind mount, and two host ids (or two addresses) for one machine;
the swap then replaces the source with its own copy. `identity(path)` runs on each end (as
`hostfs.identity`) and says what the path is there; `same_or_nested(source, destination)`, a pure
function of the two results, says why they must not be used together, or None.

One machine: both ends report the same boot id (/proc/sys/kernel/random/boot_id: random per boot,
so never shared by two kernels, whereas cloned images share /etc/machine-id); without a boot id
(not Linux) the machine id decides. On one machine, paths are compared as text only within one
mount namespace (two containers may both have /opt/venv), and (st_dev, st_ino) always: equal, or
the source's directory in the destination's parent chain. Across machines, one network export
mounted on both (NFS, Lustre, ...) is compared by its path inside the export.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional

NETWORK_FS = frozenset((
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs",
    "fuse.glusterfs", "fuse.sshfs", "fuse.beegfs", "fuse.juicefs", "9p", "afs", "orangefs",
    "wekafs", "virtiofs"))


def _read_id(path: str) -> Optional[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _under(child: str, parent: str) -> bool:
    """Whether `child` is strictly below `parent` (whole components)."""
    parent = parent.rstrip("/")
    if not parent:                                   # under "/": everything but "/" itself
        return child.startswith("/") and child != "/"
    return child.startswith(parent + "/")


def mount_of(path: str, mountinfo: str = "/proc/self/mountinfo") -> Optional[Dict[str, str]]:
    """The mount that holds `path` (an absolute, resolved path): its mount point, its root inside
    the file system, the file system type and source (e.g. `filer:/export`)."""
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best: Optional[Dict[str, str]] = None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(" "), right.split(" ")
        if not sep or len(fields) < 5 or len(tail) < 2:
            continue
        point = _unescape(fields[4])
        if path == point or _under(path, point):
            if best is None or len(point) >= len(best["point"]):   # later mounts win
                best = {"point": point, "root": _unescape(fields[3]), "fstype": tail[0],
                        "source": _unescape(tail[1])}
    return best


def identity(path: str) -> Dict[str, Any]:
    """What `path` is on this host: its absolute and resolved forms, whether it is a link (and
    to what), (st_dev, st_ino) of it and of every existing directory above its resolved form
    (`chain`, nearest first), the machine (boot id, machine id, mount namespace) and the mount
    that holds it. JSON-ready; made on each end and compared with `same_or_nested`."""
    real = os.path.realpath(path)
    out: Dict[str, Any] = {"path": path, "abspath": os.path.abspath(path), "realpath": real,
                           "exists": os.path.lexists(path), "is_link": os.path.islink(path)}
    if out["is_link"]:
        out["link_target"] = os.readlink(path)
    try:
        st = os.stat(path)
        out["dev_ino"] = [st.st_dev, st.st_ino]
    except OSError:
        out["dev_ino"] = None
    chain: List[List[int]] = []
    p = real
    while True:
        try:
            s = os.stat(p)
            chain.append([s.st_dev, s.st_ino])
        except OSError:
            pass
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    out["chain"] = chain
    out["boot_id"] = _read_id("/proc/sys/kernel/random/boot_id")
    out["machine_id"] = _read_id("/etc/machine-id") or _read_id("/var/lib/dbus/machine-id")
    try:
        out["mnt_ns"] = os.readlink("/proc/self/ns/mnt")
    except OSError:
        out["mnt_ns"] = None
    out["hostname"] = os.uname().nodename
    out["mount"] = mount_of(real)
    return out


def same_machine(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    """One kernel: equal boot ids; where either lacks one, equal machine ids."""
    if a.get("boot_id") and b.get("boot_id"):
        return a["boot_id"] == b["boot_id"]
    return bool(a.get("machine_id")) and a.get("machine_id") == b.get("machine_id")


def _backup_or_staging_of(src: str, dest: str) -> bool:
    base = re.escape(os.path.basename(dest))
    return (os.path.dirname(src) == os.path.dirname(dest)
            and re.match(rf"^(?:{base}\.rb-backup\.[0-9]+|\.{base}\.rb-(?:staging|old|restore))$",
                         os.path.basename(src)) is not None)


def _in_export(ident: Dict[str, Any]) -> Optional[str]:
    m = ident.get("mount") or {}
    if m.get("fstype") not in NETWORK_FS:
        return None
    rel = os.path.relpath(ident["realpath"], m["point"])
    return os.path.normpath(os.path.join(m.get("root") or "/", rel))


def same_or_nested(src: Dict[str, Any], dst: Dict[str, Any]) -> Optional[str]:
    """Why the destination `dst` must not be installed from the source `src` (both made by
    `identity`, each on its own host), or None when they are apart: one directory, one inside the
    other, or the source is the destination's backup or staging (the install moves or removes
    those)."""
    rs, rd = src["realpath"], dst["realpath"]
    if same_machine(src, dst):
        text = not (src.get("mnt_ns") and dst.get("mnt_ns")) or src["mnt_ns"] == dst["mnt_ns"]
        if text and rs == rd:
            return f"source and destination are one directory: {rs}"
        if text and _under(rd, rs):
            return f"the destination {rd} is inside the source {rs}"
        if text and _under(rs, rd):
            return f"the source {rs} is inside the destination {rd}"
        ids, idd = src.get("dev_ino"), dst.get("dev_ino")
        if ids and ids == idd:
            return (f"source and destination are the same directory under two names ({rs}, {rd}: "
                    "one device and inode)")
        if ids and ids in (dst.get("chain") or []):
            return (f"the destination {rd} is inside the source {rs} (one of its parent directories "
                    "is the source's: a bind mount or another name for it)")
        if idd and idd in (src.get("chain") or []):
            return (f"the source {rs} is inside the destination {rd} (one of its parent directories "
                    "is the destination's: a bind mount or another name for it)")
        if text and _backup_or_staging_of(rs, rd):
            return (f"the source {rs} is the destination's backup or staging: the install would move "
                    "or remove it; copy it elsewhere first")
    es, ed = _in_export(src), _in_export(dst)
    if es is not None and ed is not None:
        ms, md = src["mount"], dst["mount"]
        if ms["fstype"] == md["fstype"] and ms["source"].rstrip("/") == md["source"].rstrip("/"):
            where = f"on one network file system ({ms['source']}, {ms['fstype']})"
            if es == ed:
                return f"source {rs} and destination {rd} are one directory {where}"
            if _under(ed, es):
                return f"the destination {rd} is inside the source {rs} {where}"
            if _under(es, ed):
                return f"the source {rs} is inside the destination {rd} {where}"
    return None
RB_PY_22621B07
  cat >"${dir}"/rbkit/relocate.py <<'RB_PY_5E1398E2'
"""Relocation: make a venv copied to a new path work there.

Rewrites, under bin/: plain shebangs (`#!/old/bin/python`), pip's `#!/bin/sh` + `'''exec'` trampoline
for long paths, `VIRTUAL_ENV` in the activate scripts, and any other text file naming the old prefix;
plus pyvenv.cfg's `command` line. A shebang longer than the kernel's limit (127 bytes on Linux) is
written in the trampoline form. Text elsewhere that still names the old prefix is counted and
reported, not rewritten (it is data: RECORD files, caches, direct_url.json).

Only regular files are read or rewritten, and no link is followed: `bin/` must be a directory of
the tree (not a link out of it), a script or pyvenv.cfg that is a link is left as it is, and a
rewrite is a new file made beside the old one with O_EXCL|O_NOFOLLOW and renamed over it
(rbkit.safefs), so a link the tree ships at any name the kit might use is never written through.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from typing import List, Optional, Tuple

from . import safefs

SHEBANG_MAX = 127
SNIFF = 8192


def _pattern(old: str) -> re.Pattern:
    # the old prefix as a whole path: followed by '/', a quote, whitespace or the end.
    return re.compile(re.escape(old.encode()) + rb"(?=[/\"'\s:]|$)", re.MULTILINE)


def _is_text(head: bytes) -> bool:
    return b"\0" not in head


def _trampoline(interpreter: bytes, rest: bytes) -> bytes:
    return (b"#!/bin/sh\n'''exec' \"" + interpreter + b"\" \"$0\" \"$@\"\n' '''\n" + rest)


def _fix_long_shebang(data: bytes) -> bytes:
    first, nl, rest = data.partition(b"\n")
    if not first.startswith(b"#!") or len(first) <= SHEBANG_MAX:
        return data
    words = first[2:].strip().split()
    if len(words) != 1:
        return data  # interpreter with arguments: leave it, reported by check()
    return _trampoline(words[0], rest)


def rewrite_bytes(data: bytes, old: str, new: str) -> Optional[bytes]:
    """`data` with the old prefix replaced, if it is text that names it; else None."""
    if not _is_text(data[:SNIFF]):
        return None
    pat = _pattern(old)
    if not pat.search(data):
        return None
    out = pat.sub(new.encode().replace(b"\\", b"\\\\"), data)
    return _fix_long_shebang(out)


def rewrite_file(path: str, old: str, new: str) -> Optional[bytes]:
    """New content for `path` if it is a regular file (not a link) that names `old`, else None."""
    head, name = os.path.split(path)
    got = safefs.read_in(head or ".", name)
    return None if got is None else rewrite_bytes(got[0], old, new)


def _open_bin(root_fd: int) -> Optional[int]:
    """The tree's bin/ as a descriptor, or None when it is missing or not a directory (a link
    out of the tree is not followed)."""
    try:
        return os.open("bin", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                       dir_fd=root_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise


def _candidates(root_fd: int) -> List[Tuple[str, int, str]]:
    """(relative path, directory fd, name) of what relocation reads: every entry of bin/, and
    pyvenv.cfg. The caller closes the bin/ descriptor (the one that is not `root_fd`)."""
    out = []
    bin_fd = _open_bin(root_fd)
    if bin_fd is not None:
        out.extend((f"bin/{name}", bin_fd, name) for name in sorted(os.listdir(bin_fd)))
    out.append(("pyvenv.cfg", root_fd, "pyvenv.cfg"))
    return out


def _scan_bin(root: str, fn) -> None:
    """Call fn(rel, dir_fd, name, content, stat) for each regular file relocation reads."""
    root_fd = safefs.open_dir(root)
    try:
        cands = _candidates(root_fd)
        try:
            for rel, dir_fd, name in cands:
                got = safefs.read_at(dir_fd, name)
                if got is not None:
                    fn(rel, dir_fd, name, got[0], got[1])
        finally:
            for fd in {d for _r, d, _n in cands if d != root_fd}:
                os.close(fd)
    finally:
        os.close(root_fd)


def relocate(root: str, old: str, new: str) -> dict:
    """Rewrite under `root` (a venv copied from `old`, to live at `new`). Returns a summary."""
    rewritten: dict[str, dict] = {}
    if old.rstrip("/") == new.rstrip("/"):
        return {"same_path": True, "rewritten": {}, "elsewhere": [], "remaining": []}

    def rewrite(rel: str, dir_fd: int, name: str, data: bytes, st: os.stat_result) -> None:
        out = rewrite_bytes(data, old, new)
        if out is None:
            return
        # the file's own mode and times (tar restored them; the manifest recorded them)
        safefs.write_at(dir_fd, name, out, stat.S_IMODE(st.st_mode),
                        times_ns=(st.st_atime_ns, st.st_mtime_ns))
        rewritten[rel] = {"s": len(out), "h_sha256": hashlib.sha256(out).hexdigest()}

    _scan_bin(root, rewrite)
    return {
        "same_path": False,
        "rewritten": rewritten,
        "remaining": check(root, old),
        "elsewhere": elsewhere(root, old),
    }


def check(root: str, old: str) -> list[str]:
    """Scripts under bin/ that still name the old prefix (must be empty after relocate)."""
    pat = _pattern(old)
    left: List[str] = []

    def look(rel: str, _fd: int, _name: str, data: bytes, _st: os.stat_result) -> None:
        if rel.startswith("bin/") and _is_text(data[:SNIFF]) and pat.search(data):
            left.append(rel)

    _scan_bin(root, look)
    return left


def elsewhere(root: str, old: str, limit: int = 20) -> list[str]:
    """Text files outside bin/ that name the old prefix (counted and reported, not rewritten)."""
    pat = _pattern(old)
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == "bin":
            dirnames[:] = []
            continue
        dirnames.sort()
        for name in sorted(filenames):
            if not name.endswith((".pth", ".json", ".txt", ".cfg", "RECORD", ".py", ".sh")):
                continue
            try:
                got = safefs.read_in(dirpath, name, limit=4 << 20)
            except OSError:
                continue
            if got is None:
                continue
            data = got[0]
            if _is_text(data[:SNIFF]) and pat.search(data):
                found.append(os.path.normpath(os.path.join(rel_dir, name)))
                if len(found) >= limit:
                    return found
    return found
RB_PY_5E1398E2
  cat >"${dir}"/rbkit/report.py <<'RB_PY_A002A646'
"""The run report: the runbook's event log + each host's probe report -> one JSON and a table."""

from __future__ import annotations

import json
import os

SCHEMA = 1


def read_events(path: str) -> tuple[list[dict], dict]:
    steps: list[dict] = []
    facts: dict = {}
    if not os.path.exists(path):
        return steps, facts
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if parts[0] == "step" and len(parts) >= 7:
                _, sid, status, start, end, host, detail = parts[:7]
                steps.append({"id": sid, "status": status, "host": host or None,
                              "duration_s": round((int(end) - int(start)) / 1000.0, 3),
                              "detail": detail})
            elif parts[0] == "fact" and len(parts) >= 4:
                _, sid, key, value = parts[:4]
                facts.setdefault(sid, {})[key] = _number(value)
    return steps, facts


def _number(value: str):
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            return value


def build(name: str, spec: str, sha: str, events: str, probes: dict, outcome: str) -> dict:
    steps, facts = read_events(events)
    for step in steps:
        if step["id"] in facts:
            step["facts"] = facts[step["id"]]
    probe_docs = {}
    for host, path in probes.items():
        try:
            with open(path, encoding="utf-8") as f:
                probe_docs[host] = json.load(f)
        except (OSError, ValueError) as exc:
            probe_docs[host] = {"error": f"no readable probe report at {path}: {exc}"}
    checks = {"pass": 0, "fail": 0, "skip": 0}
    for doc in probe_docs.values():
        for key in checks:
            checks[key] += int(doc.get("summary", {}).get(key, 0))
    return {
        "schema": SCHEMA,
        "kind": "rb-run-report",
        "runbook": name,
        "spec": spec,
        "spec_sha256": sha,
        "outcome": outcome,
        "steps": steps,
        "checks": checks,
        "probes": probe_docs,
    }


def _size(n) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1000.0
    return str(n)


def table(doc: dict) -> str:
    rows = [("step", "host", "status", "time", "detail")]
    for s in doc["steps"]:
        f = s.get("facts", {})
        detail = s["detail"]
        if "bytes" in f:
            detail = f"{_size(f['bytes'])} in {f.get('files', '?')} files" + (
                f", {f['mb_s']} MB/s" if "mb_s" in f else "") + (f"; {detail}" if detail else "")
        rows.append((s["id"], s["host"] or "-", s["status"], f"{s['duration_s']:.1f}s", detail))
    widths = [max(len(str(r[i])) for r in rows) for i in range(4)]
    out = []
    for r in rows:
        out.append("  ".join(str(r[i]).ljust(widths[i]) for i in range(4)) + "  " + str(r[4]))
    c = doc["checks"]
    out.append(f"checks: {c['pass']} passed, {c['fail']} failed, {c['skip']} skipped")
    out.append(f"outcome: {doc['outcome']}")
    return "\n".join(out)
RB_PY_A002A646
  cat >"${dir}"/rbkit/safefs.py <<'RB_PY_A8AA38CB'
"""Writes and reads inside trees we did not make: never through a link, never a guessable name.

The kit runs as root over trees other users wrote (the source venv, the host's /tmp, a shared
parent directory). A tree may hold a link where the kit would write (`bin/activate.rb-tmp ->
/etc/...`), a `bin/` that is a link out of the tree, or a file that is a link to a secret. So:

- a directory inside a tree is reached from the tree's root one component at a time, each opened
  with O_NOFOLLOW|O_DIRECTORY (`open_dir`); the root path itself is the caller's;
- a write goes to a temp file made with O_CREAT|O_EXCL|O_NOFOLLOW and a random name in the
  target's own directory, gets its mode with fchmod on the descriptor (and its times with futimens),
  is fsync'd, and replaces the target with one rename (`write_at`, `write_in`, `write_file`): a link
  at the target's name is replaced, never written through;
- a read opens the final component with O_NOFOLLOW and reads only a regular file (`read_at`).

Stdlib only, Python >= 3.9.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from typing import Optional, Tuple

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_MAX_NAME = 200   # of the target's name inside a temp name (NAME_MAX is 255)


def open_dir(root: str, rel: str = "") -> int:
    """A descriptor of the directory `root`/`rel`. `root` is opened as given (links in the path
    the caller chose are the caller's); each component of `rel` is opened without following a
    link, so `rel` cannot lead out of the tree. OSError (ELOOP, ENOTDIR, ENOENT) otherwise."""
    fd = os.open(root or ".", _DIR_FLAGS)
    try:
        for part in rel.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                raise OSError(errno.EPERM, "'..' in a path inside a tree", rel)
            nfd = os.open(part, _DIR_FLAGS | _NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def fsync_dir(dir_fd: int) -> None:
    try:
        os.fsync(dir_fd)
    except OSError as exc:           # some file systems cannot fsync a directory
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise


def create_excl(dir_fd: int, name: str, mode: int = 0o600) -> int:
    """Open a new file `name` in `dir_fd` for writing: O_CREAT|O_EXCL|O_NOFOLLOW (an existing file
    or link of that name is an error, never opened), mode set with fchmod."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | os.O_CLOEXEC, 0o600,
                 dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        os.unlink(name, dir_fd=dir_fd)
        raise
    return fd


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def temp_name(name: str) -> str:
    return f".{name[:_MAX_NAME]}.rb-tmp.{secrets.token_hex(8)}"


def make_temp(dir_fd: int, name: str, mode: int = 0o600) -> Tuple[int, str]:
    """A new temp file beside `name` (a random name, O_EXCL|O_NOFOLLOW): (fd, temp name)."""
    for _ in range(16):
        tmp = temp_name(name)
        try:
            return create_excl(dir_fd, tmp, mode), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temp name", name)


def write_at(dir_fd: int, name: str, data: bytes, mode: int, *,
             times_ns: Optional[Tuple[int, int]] = None, sync: bool = True) -> None:
    """Replace `name` in the directory `dir_fd` with `data`, mode `mode` (and atime/mtime
    `times_ns`), through a temp file and one rename. A link named `name` is replaced, not
    followed."""
    fd, tmp = make_temp(dir_fd, name, 0o600)
    try:
        try:
            write_all(fd, data)
            os.fchmod(fd, mode)
            if times_ns is not None:
                os.utime(fd, ns=times_ns)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise
    if sync:
        fsync_dir(dir_fd)


def write_in(root: str, rel: str, data: bytes, mode: int, *,
             times_ns: Optional[Tuple[int, int]] = None, sync: bool = True) -> None:
    """`write_at` for the file `rel` inside the tree `root` (no link followed below `root`)."""
    head, name = os.path.split(rel)
    if not name or name in (".", ".."):
        raise OSError(errno.EINVAL, "not a file name", rel)
    dir_fd = open_dir(root, head)
    try:
        write_at(dir_fd, name, data, mode, times_ns=times_ns, sync=sync)
    finally:
        os.close(dir_fd)


def write_file(path: str, data: bytes, mode: int = 0o644, *, sync: bool = True) -> None:
    """`write_at` for a file whose directory the caller chose (an env file, a names list): the
    directory path is taken as given, the file itself is never followed."""
    head, name = os.path.split(path)
    write_in(head or ".", name, data, mode, sync=sync)


def read_at(dir_fd: int, name: str, limit: Optional[int] = None
            ) -> Optional[Tuple[bytes, os.stat_result]]:
    """(content, stat) of `name` in `dir_fd` if it is a regular file (not a link, a FIFO, a
    device); None otherwise. With `limit`, a larger file is None too."""
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOENT, errno.ENOTDIR, errno.ENXIO, errno.EISDIR,
                         errno.EACCES, errno.EPERM):
            return None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (limit is not None and st.st_size > limit):
            return None
        chunks = []
        while True:
            block = os.read(fd, 1 << 20)
            if not block:
                break
            chunks.append(block)
        return b"".join(chunks), st
    finally:
        os.close(fd)


def read_in(root: str, rel: str, limit: Optional[int] = None
            ) -> Optional[Tuple[bytes, os.stat_result]]:
    """`read_at` for `rel` inside the tree `root`; None when a component is a link or missing."""
    head, name = os.path.split(rel)
    try:
        dir_fd = open_dir(root, head)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOENT, errno.ENOTDIR):
            return None
        raise
    try:
        return read_at(dir_fd, name, limit)
    finally:
        os.close(dir_fd)
RB_PY_A8AA38CB
  cat >"${dir}"/rbkit/swapfs.py <<'RB_PY_D6AAE1CF'
"""Putting a staging in place, and an earlier install back: swap, restore, backups, the journal.

Public through rbkit.hostfs (hostfs.swap, hostfs.restore, ...). One rename where the file system
can exchange two names (renameat2 RENAME_EXCHANGE); elsewhere (NFS) two renames, journaled beside
the destination first, so an interruption between them is finished or undone by the next run
(`recover_swap`, which swap, restore and prune_backups call first) instead of leaving the previous
install where the next run deletes it. A destination or staging that is a symlink is refused.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import re
import shutil
import stat
from typing import List, Optional

from . import exports, manifest, safefs

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
FICLONE = 0x40049409
SWAP_ATOMIC = ("require", "allow")             # transfer.swap_atomic
FAILED_MARK = ".rb-failed"                     # in an install whose checks failed (manifest skips it)


def _renameat2(src: str, dst: str, flags: int) -> bool:
    """renameat2(2) through libc; False when the kernel or libc cannot do it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err), dst)


def backups(dest: str) -> list[tuple[int, str]]:
    """(number, path) of every name `DEST.rb-backup.N` beside `dest`, oldest first (whatever they
    are: `backup_dirs` keeps the real directories)."""
    parent, base = os.path.split(dest)
    pat = re.compile(re.escape(base) + r"\.rb-backup\.([0-9]+)$")
    found = []
    for name in os.listdir(parent or "."):
        m = pat.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(parent, name)))
    return sorted(found)


def backup_dirs(dest: str) -> list[tuple[int, str]]:
    """The backups that are real directories (a link named like one is not ours to use)."""
    return [(n, p) for n, p in backups(dest) if _is_real_dir(p)]


def _is_real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _next_backup(dest: str) -> str:
    found = backups(dest)
    return f"{dest}.rb-backup.{(found[-1][0] + 1) if found else 1}"


def _refuse_link(path: str, what: str) -> None:
    if os.path.islink(path):
        raise OSError(errno.ELOOP, f"the {what} {path} is a symlink to {os.readlink(path)}: refusing "
                      "to replace a link with a directory (its target would be left behind, and the "
                      f"next steps would act on the link); name {os.path.realpath(path)} itself")


def failed_mark(path: str) -> Optional[str]:
    """Why the install at `path` was rolled back (its checks failed), or None."""
    got = safefs.read_in(path, FAILED_MARK, limit=64 << 10)
    return got[0].decode("utf-8", "replace").strip() if got is not None else None


# -- the journal of a swap that is more than one rename ---------------------------------------


def journal_path(dest: str) -> str:
    """The journal of `dest`'s swap or restore in progress: beside it, `.NAME.rb-swap-journal`."""
    parent, base = os.path.split(os.path.abspath(dest))
    return os.path.join(parent, f".{base}.rb-swap-journal")


def _write_journal(dest: str, doc: dict) -> None:
    """The journal, made with O_EXCL|O_NOFOLLOW (0600) and fsync'd with its directory before the
    first rename it describes."""
    parent, name = os.path.split(journal_path(dest))
    dir_fd = safefs.open_dir(parent)
    try:
        fd = safefs.create_excl(dir_fd, name, 0o600)
        try:
            safefs.write_all(fd, json.dumps(doc, sort_keys=True).encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        safefs.fsync_dir(dir_fd)
    finally:
        os.close(dir_fd)


def _drop_journal(dest: str) -> None:
    parent = os.path.dirname(journal_path(dest))
    os.unlink(journal_path(dest))
    _sync_parent(parent)


def _sync_parent(parent: str) -> None:
    dir_fd = safefs.open_dir(parent)
    try:
        safefs.fsync_dir(dir_fd)
    finally:
        os.close(dir_fd)


def _read_journal(dest: str) -> Optional[dict]:
    """The journal, if any, checked: ours (a regular file of this user, not writable by others),
    and every name in it one of dest's own: its backups, `.NAME.rb-old`, `.NAME.rb-restore`, a
    staging beside it. Anything else is an error to look at, never a list of renames to obey."""
    path = journal_path(dest)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid()
                or stat.S_IMODE(st.st_mode) & 0o022 or st.st_size > 1 << 16):
            raise ValueError(f"swap journal {path} was not written by this kit (owner, mode or "
                             "size); look at it and remove it by hand")
        raw = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    base = re.escape(os.path.basename(os.path.abspath(dest)))
    names = re.compile(rf"^(?:{base}\.rb-backup\.[0-9]+|\.{base}\.rb-(?:old|restore))$")
    try:
        doc = json.loads(raw)
        ok = (doc.get("v") == 1 and doc.get("op") in ("swap", "restore")
              and names.match(doc.get("old", "")) is not None
              and isinstance(doc.get("ino"), list) and len(doc["ino"]) == 2
              and (doc["op"] != "swap" or doc.get("policy") in ("backup", "replace"))
              and (doc["op"] != "restore" or names.match(doc.get("backup", "")) is not None)
              and "/" not in doc.get("staging", "") and doc.get("staging") not in (".", ".."))
    except (ValueError, AttributeError, TypeError):
        ok = False
    if not ok:
        raise ValueError(f"swap journal {path} does not describe a swap of {dest}; look at it and "
                         "remove it by hand")
    return doc


def _ino(path: str) -> Optional[list]:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino] if stat.S_ISDIR(st.st_mode) else None


def recover_swap(dest: str) -> Optional[dict]:
    """Finish or undo a swap (or restore) of `dest` that was interrupted between its renames
    (a file system without RENAME_EXCHANGE, e.g. NFS, takes two; the move of the previous install
    to its backup name is one more). The journal names where each install was going and the
    previous install's inode, so this finds it wherever the interruption left it:

    - at `dest` with nothing else done: nothing to do;
    - in the staging (the exchange happened, its backup name was not given yet): moved to its
      backup name (policy backup) or removed (replace);
    - at its backup or `.NAME.rb-old` name with `dest` missing: put back at `dest` (undone);
    - there, with the new install at `dest`: `.rb-old` removed (finished).
    Returns what it did ({"action", "detail"}), or None when there was no journal."""
    doc = _read_journal(dest)
    if doc is None:
        return None
    parent = os.path.dirname(os.path.abspath(dest))
    old_at = os.path.join(parent, doc["old"])
    ino = doc["ino"]
    if doc["op"] == "restore":
        return _recover_restore(dest, doc, parent, old_at)
    staging = os.path.join(parent, doc["staging"]) if doc.get("staging") else None
    if _ino(dest) == ino:
        action, detail = "nothing", "the swap had not started; the previous install is in place"
    elif staging and _ino(staging) == ino:
        if doc["policy"] == "backup":
            target = old_at if not os.path.lexists(old_at) else _next_backup(dest)
            os.rename(staging, target)
            action, detail = "finished", f"the previous install moved to {target}"
        else:
            shutil.rmtree(staging)
            action, detail = "finished", "the previous install removed (policy replace)"
    elif _ino(old_at) == ino and not os.path.lexists(dest):
        os.rename(old_at, dest)
        action, detail = "undone", f"the previous install is back at {dest}"
    elif _ino(old_at) == ino:
        if doc["policy"] == "replace":
            shutil.rmtree(old_at)
            action, detail = "finished", "the previous install removed (policy replace)"
        else:
            action, detail = "finished", f"the previous install is kept at {old_at}"
    else:
        action, detail = "nothing", "the previous install is not where the journal says"
    _sync_parent(parent)
    _drop_journal(dest)
    return {"action": action, "detail": detail}


def _recover_restore(dest: str, doc: dict, parent: str, old_at: str) -> dict:
    """A restore without RENAME_EXCHANGE: dest -> .NAME.rb-restore, backup -> dest,
    .NAME.rb-restore -> backup's name. `ino` is the install that was current."""
    backup = os.path.join(parent, doc["backup"])
    ino = doc["ino"]
    if _ino(old_at) == ino and not os.path.lexists(dest):
        os.rename(old_at, dest)
        action, detail = "undone", f"the install that was current is back at {dest}"
    elif _ino(old_at) == ino:
        os.rename(old_at, backup if not os.path.lexists(backup) else _next_backup(dest))
        action, detail = "finished", "the restored install is in place"
    else:
        action, detail = "nothing", "the restore had not started, or had finished"
    _sync_parent(parent)
    _drop_journal(dest)
    return {"action": action, "detail": detail}


# -- swap, restore, backups ----------------------------------------------------------------------


def swap(staging: str, dest: str, policy: str, *, swap_atomic: str = "allow",
         keep_backups: Optional[int] = None, unshare: bool = True) -> dict:
    """Put `staging` at `dest` in one step; what was at `dest` is refused, kept or removed.

    A swap interrupted earlier is finished or undone first (`recover_swap`). `dest` or `staging`
    being a symlink is refused, naming its target. Where the file system cannot exchange two
    names in one rename (RENAME_EXCHANGE, missing on NFS), `swap_atomic: require` refuses before
    anything moves; `allow` swaps with two renames, journaled, and says so (`atomic: false`).
    With policy backup, the backup is made independent of the new install (`unshare_backup`:
    an incremental install linked its unchanged files from it), and with `keep_backups` N only the
    N newest backups are kept (`prune_backups`)."""
    if swap_atomic not in SWAP_ATOMIC:
        raise ValueError(f"swap_atomic must be one of {SWAP_ATOMIC}, not {swap_atomic!r}")
    recovered = recover_swap(dest)
    _refuse_link(dest, "destination")
    _refuse_link(staging, "staging directory")
    if os.path.lexists(dest) and not _is_real_dir(dest):
        raise FileExistsError(f"the destination {dest} exists and is not a directory")
    if not _is_real_dir(staging):
        raise FileNotFoundError(f"staging directory {staging} is missing")
    parent = os.path.dirname(os.path.abspath(dest))
    if os.path.dirname(os.path.abspath(staging)) != parent:
        raise ValueError(f"staging {staging} must be beside the destination {dest}")
    result: dict = {"policy": policy, "swap_atomic": swap_atomic}
    if recovered:
        result["recovered"] = recovered
    if not os.path.lexists(dest):
        if not _renameat2(staging, dest, RENAME_NOREPLACE):
            os.rename(staging, dest)
        result.update(previous="none", atomic=True)
        return _after_swap(result, dest, keep_backups)
    if policy == "refuse":
        raise FileExistsError(f"{dest} exists and on_existing is refuse")
    old_at = _next_backup(dest) if policy == "backup" else os.path.join(
        parent, "." + os.path.basename(os.path.abspath(dest)) + ".rb-old")
    if policy != "backup" and os.path.lexists(old_at):
        remove(old_at)                        # debris of an earlier replace (its journal is gone)
    journal = {"v": 1, "op": "swap", "policy": policy, "old": os.path.basename(old_at),
               "staging": os.path.basename(os.path.abspath(staging)), "ino": _ino(dest)}
    # the journal before the exchange too: its previous install sits at the staging's name until
    # it is renamed to its backup name, and a re-run starts by removing the staging
    _write_journal(dest, journal)
    exchanged = _renameat2(staging, dest, RENAME_EXCHANGE)
    if exchanged:
        _sync_parent(parent)
        os.rename(staging, old_at)
    else:
        if swap_atomic == "require":
            _drop_journal(dest)
            raise OSError(errno.EOPNOTSUPP, f"this file system cannot swap {dest} in one rename "
                          "(no RENAME_EXCHANGE, e.g. NFS) and transfer.swap_atomic is require")
        os.rename(dest, old_at)
        _sync_parent(parent)
        os.rename(staging, dest)
        result["note"] = ("no RENAME_EXCHANGE here (NFS?): swapped with two renames, journaled in "
                          f"{journal_path(dest)} until done")
    _sync_parent(parent)
    result["atomic"] = exchanged
    if policy == "backup":
        result["previous"] = old_at
    else:
        shutil.rmtree(old_at)
        result["previous"] = "removed"
    _drop_journal(dest)
    if policy == "backup" and unshare:
        result["unshared"] = unshare_backup(old_at, dest)
    return _after_swap(result, dest, keep_backups)


def _after_swap(result: dict, dest: str, keep_backups: Optional[int]) -> dict:
    if keep_backups is not None:
        result["pruned"] = prune_backups(dest, keep_backups)
    return result


def remove(path: str) -> None:
    """Remove a directory tree, or a link or file (never what a link points to)."""
    if _is_real_dir(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def prune_backups(dest: str, keep: int) -> List[str]:
    """Remove all but `keep` backups of `dest` (transfer.keep_backups, at least 1: the newest is
    what a rollback puts back). Backups whose install passed are kept before those marked as
    failed its checks, newest first; a link named like a backup is neither counted nor removed.
    Returns the paths removed."""
    if keep < 1:
        raise ValueError("keep_backups must be at least 1: the newest backup is what a rollback "
                         "puts back")
    recover_swap(dest)
    found = backup_dirs(dest)
    ranked = sorted(found, key=lambda nb: (failed_mark(nb[1]) is None, nb[0]))
    removed = []
    for _n, path in sorted(ranked[:-keep]):
        shutil.rmtree(path)
        removed.append(path)
    return removed


def _copy_over(root: str, rel: str, st: os.stat_result) -> bool:
    """Replace `rel` in `root` with a copy of itself (a new inode, same content, mode, owner and
    times): a reflink where the file system has them (free), else an in-kernel copy. True when
    it was a reflink."""
    head, name = os.path.split(rel)
    dir_fd = safefs.open_dir(root, head)
    try:
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            if (os.fstat(src).st_ino, os.fstat(src).st_dev) != (st.st_ino, st.st_dev):
                raise OSError(errno.ESTALE, "changed while the tree was walked", rel)
            fd, tmp = safefs.make_temp(dir_fd, name, 0o600)
            try:
                try:
                    fcntl.ioctl(fd, FICLONE, src)
                    cloned = True
                except OSError:
                    cloned = False
                    offset = 0
                    while offset < st.st_size:
                        n = os.sendfile(fd, src, offset, min(1 << 30, st.st_size - offset))
                        if n == 0:
                            break
                        offset += n
                os.fchown(fd, st.st_uid, st.st_gid)
                os.fchmod(fd, stat.S_IMODE(st.st_mode))          # after chown, which clears setuid
                os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except (OSError, UnboundLocalError):
                pass
            raise
        finally:
            os.close(src)
    finally:
        os.close(dir_fd)
    return cloned


def unshare_backup(backup: str, dest: str) -> dict:
    """Make `backup` independent of the live install at `dest`: each file of it that is the same
    inode as the same path in `dest` (an incremental install hard-links the unchanged files of
    the previous install into its staging) is replaced in the backup by a copy with the same
    content, mode, owner and times. Then a later in-place write to the live install (a tool that
    rewrites a file instead of replacing it) cannot change the backup a rollback would put back.
    The live install keeps its inodes. A reflink where the file system has them costs nothing;
    elsewhere it is a local copy of the unchanged bytes, made after the swap, so the new install
    is in place no later. Returns {"files", "bytes", "reflinked"}."""
    files = nbytes = reflinked = 0
    for rel, st in manifest.walk(backup):
        if not stat.S_ISREG(st.st_mode) or st.st_nlink < 2:
            continue
        try:
            live = os.lstat(os.path.join(dest, rel))
        except OSError:
            continue
        if (live.st_dev, live.st_ino) != (st.st_dev, st.st_ino):
            continue
        reflinked += _copy_over(backup, rel, st)
        files += 1
        nbytes += st.st_size
    return {"files": files, "bytes": nbytes, "reflinked": reflinked}


def describe_install(path: str) -> dict:
    """What an install is, for a restore's report: where, the source it was made from, whether
    it was rolled back for failed checks, and a stat check of it against its own manifest (a file
    changed since it was installed, e.g. written in place, is named)."""
    out: dict = {"path": path, "failed": failed_mark(path)}
    got = safefs.read_in(path, ".rb-manifest.jsonl", limit=1 << 30)
    if got is None:
        out.update(source_fingerprint=None,
                   tree_check={"ok": None, "why": "no .rb-manifest.jsonl in this install"})
        return out
    try:
        lines = [json.loads(line) for line in got[0].decode("utf-8").splitlines() if line.strip()]
        m = {"header": lines[0], "entries": lines[1:-1], "totals": lines[-1]["totals"]}
    except (ValueError, KeyError, IndexError):
        out.update(source_fingerprint=None,
                   tree_check={"ok": False, "why": "its .rb-manifest.jsonl is not a manifest"})
        return out
    out["source_fingerprint"] = m["header"].get("source_fingerprint")
    out["tree_check"] = manifest.check_tree(path, m)
    return out


def restore(dest: str, number: Optional[int] = None, *, env_file: Optional[str] = None,
            failed: Optional[str] = None, swap_atomic: str = "allow") -> dict:
    """Put backup N (default: the newest whose checks did not fail) back at `dest`; the current
    one becomes a backup under that number.

    An interrupted swap is finished or undone first; when that already put the previous install
    back, nothing more moves. With `failed` (a rollback: the checks of the current install
    failed), the install moved aside is marked, so that a later restore without a number does
    not bring it back unchecked. With `env_file`, the restored install's own env file
    (`DEST/.rb-env.sh`, see exports.write) is put back there. The result says what is at `dest`
    now (`installed`: its source, a stat check, whether it failed its checks) for the runbook to
    check again."""
    if swap_atomic not in SWAP_ATOMIC:
        raise ValueError(f"swap_atomic must be one of {SWAP_ATOMIC}, not {swap_atomic!r}")
    recovered = recover_swap(dest)
    _refuse_link(dest, "destination")
    result: dict = {"recovered": recovered, "atomic": True}
    if recovered and recovered["action"] == "undone":
        result.update(restored=None, kept_current_as=None)
    else:
        result.update(_restore_backup(dest, number, failed, swap_atomic))
    result["env_file"] = exports.restore_env(dest, env_file) if env_file else None
    result["installed"] = describe_install(dest)
    return result


def _restore_backup(dest: str, number: Optional[int], failed: Optional[str],
                    swap_atomic: str) -> dict:
    found = dict(backup_dirs(dest))
    if not found:
        raise FileNotFoundError(f"no {dest}.rb-backup.N to restore")
    if number is None:
        usable = [n for n in sorted(found) if failed_mark(found[n]) is None]
        if not usable:
            raise FileNotFoundError(
                f"every backup of {dest} failed its checks ({', '.join(found[n] for n in sorted(found))});"
                " name one to put it back anyway: --restore N")
        number = usable[-1]
    if number not in found:
        raise FileNotFoundError(f"{dest}.rb-backup.{number} does not exist")
    source = found[number]
    if not os.path.lexists(dest):
        os.rename(source, dest)
        return {"restored": source, "kept_current_as": None}
    atomic = _renameat2(source, dest, RENAME_EXCHANGE)
    if not atomic:
        if swap_atomic == "require":
            raise OSError(errno.EOPNOTSUPP, f"this file system cannot swap {dest} in one rename "
                          "(no RENAME_EXCHANGE, e.g. NFS) and transfer.swap_atomic is require")
        parent, base = os.path.split(os.path.abspath(dest))
        aside = os.path.join(parent, f".{base}.rb-restore")
        if os.path.lexists(aside):
            remove(aside)
        _write_journal(dest, {"v": 1, "op": "restore", "old": os.path.basename(aside),
                              "backup": os.path.basename(source), "ino": _ino(dest)})
        os.rename(dest, aside)
        _sync_parent(parent)
        os.rename(source, dest)
        _sync_parent(parent)
        os.rename(aside, source)
        _sync_parent(parent)
        _drop_journal(dest)
    if failed:
        safefs.write_in(source, FAILED_MARK, failed.encode("utf-8") + b"\n", 0o644)
    # what was installed is now kept under the backup's number
    return {"restored": source, "kept_current_as": source, "atomic": atomic}
RB_PY_D6AAE1CF
  cat >"${dir}"/rbprobes/__init__.py <<'RB_PY_54A17906'
"""rbprobes: prove that a moved Python/CUDA environment works on its GPU host.

Shipped to hosts as the package `rbprobes` (stdlib only; torch imported inside the checks that
need it); in the repo it is `hostkit/rbprobes`, installed with the compiler as the package `rbprobes`. Public API:

- run_config(config) -> (report, stopped_early): run a config document's checks (docs/design.md)
- run_check(check, context) -> one report entry
- audit(root, target, paths=None, driver_ptx_max=None) -> kernel audit values
- scan_file(path) -> the fatbin containers and entries of one file
"""

from .checks_static import audit
from .fatbin import scan_file
from .result import Context
from .runner import run_check, run_config

__all__ = ["Context", "audit", "run_check", "run_config", "scan_file"]
RB_PY_54A17906
  cat >"${dir}"/rbprobes/__main__.py <<'RB_PY_0EB65F22'
"""`python -m rbprobes ...` (on a host) / `python -m rbprobes ...` (in the repo)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
RB_PY_0EB65F22
  cat >"${dir}"/rbprobes/arch.py <<'RB_PY_F551C5BA'
"""GPU architecture names and NVIDIA's rules for which code runs on which device.

A *device* has a compute capability (major, minor), e.g. 10.3 for a B300, named sm_103.
*Code* is either SASS (machine code, `sm_XY[a|f]`) or PTX (`compute_XY[a|f]`, compiled by the
driver's JIT on first use). The rules (CUDA programming guide, "Binary compatibility" and
"Family-specific / architecture-specific features", CUDA 12.9+):

| code            | runs on a device of capability D when                                  |
|-----------------|-------------------------------------------------------------------------|
| sm_XY           | D.major == X and D.minor >= Y                                            |
| sm_XYf (family) | D.major == X and D.minor >= Y  (sm_100f: 10.0 and 10.3; sm_103f: 10.3)   |
| sm_XYa          | D == X.Y exactly                                                         |
| compute_XY      | D >= X.Y (any later major too), if the driver accepts the PTX ISA version|
| compute_XYf     | D.major == X and D.minor >= Y, driver permitting                         |
| compute_XYa     | D == X.Y exactly, driver permitting                                      |

Capabilities and arch numbers: sm_XY with a two-digit number means X.Y (sm_90 -> 9.0);
three digits mean XX.Y (sm_103 -> 10.3, sm_120 -> 12.0).
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

_ARCH = re.compile(r"^(sm|compute|lto)_([0-9]{2,3})([af]?)$")
_CAP = re.compile(r"^([0-9]{1,2})\.([0-9])$")

# PTX ISA version -> first CUDA release that accepts it (driver side, the JIT). Used only to
# explain a PTX version in words; the comparison itself is on the PTX ISA version.
PTX_ISA_TO_CUDA = {
    (7, 0): "11.0", (7, 1): "11.1", (7, 2): "11.2", (7, 3): "11.3", (7, 4): "11.4",
    (7, 5): "11.5", (7, 6): "11.6", (7, 7): "11.7", (7, 8): "11.8",
    (8, 0): "12.0", (8, 1): "12.1", (8, 2): "12.2", (8, 3): "12.3", (8, 4): "12.4",
    (8, 5): "12.5", (8, 6): "12.7", (8, 7): "12.8", (8, 8): "12.9",
    (9, 0): "13.0", (9, 1): "13.1",
}


def arch_number_to_capability(number: int) -> Tuple[int, int]:
    """90 -> (9, 0); 103 -> (10, 3); 120 -> (12, 0)."""
    return number // 10, number % 10


def capability_to_arch(cap: Tuple[int, int]) -> str:
    return "sm_%d%d" % cap


def parse_capability(text: str) -> Tuple[int, int]:
    """"10.3" -> (10, 3). Raises ValueError."""
    m = _CAP.match(text.strip())
    if not m:
        raise ValueError("%r is not a compute capability like '10.3'" % (text,))
    return int(m.group(1)), int(m.group(2))


def parse_arch(text: str) -> Tuple[str, int, int, str]:
    """"sm_100a" -> ("sm", 10, 0, "a"); "compute_90" -> ("compute", 9, 0, "")."""
    m = _ARCH.match(text.strip().lower())
    if not m:
        raise ValueError("%r is not an architecture name like 'sm_103' or 'compute_90a'" % (text,))
    major, minor = arch_number_to_capability(int(m.group(2)))
    return m.group(1), major, minor, m.group(3)


def parse_target(text: str) -> Tuple[int, int]:
    """A device to run on, as "sm_103" or "10.3" -> (10, 3). A suffix on sm_ is ignored:
    a device is a capability, `a`/`f` only qualify code."""
    if _CAP.match(text.strip()):
        return parse_capability(text)
    kind, major, minor, _suffix = parse_arch(text)
    if kind != "sm":
        raise ValueError("%r: a target device is named sm_XY (or X.Y), not %s_" % (text, kind))
    return major, minor


def code_name(kind: str, number: int, suffix: str) -> str:
    """("sass", 100, "a") -> "sm_100a"; ("ptx", 90, "") -> "compute_90"."""
    return "%s_%d%s" % ("sm" if kind == "sass" else "compute", number, suffix)


def runs_on(
    kind: str,
    number: int,
    suffix: str,
    device: Tuple[int, int],
    ptx_version: Optional[Tuple[int, int]] = None,
    driver_ptx_max: Optional[Tuple[int, int]] = None,
) -> bool:
    """Whether code of `kind` ("sass" or "ptx") for arch `number` (90, 103, ...) with `suffix`
    ("", "a", "f") can run on a device of capability `device`.

    For PTX, `ptx_version` is the PTX ISA version of the code and `driver_ptx_max` the newest PTX
    ISA the driver's JIT accepts; when either is unknown the version is not held against it.
    """
    code = arch_number_to_capability(number)
    if suffix == "a":
        ok = device == code
    elif suffix == "f" or kind == "sass":
        ok = device[0] == code[0] and device[1] >= code[1]
    else:  # plain PTX: forward to any later device
        ok = device >= code
    if ok and kind == "ptx" and ptx_version and driver_ptx_max:
        ok = ptx_version <= driver_ptx_max
    return ok


def name_runs_on(name: str, device: Tuple[int, int]) -> bool:
    """Same rule for a name as torch.cuda.get_arch_list() gives them ("sm_90", "compute_120")."""
    kind, major, minor, suffix = parse_arch(name)
    return runs_on("ptx" if kind == "compute" else "sass", major * 10 + minor, suffix, device)


def parse_version(text: str) -> Tuple[int, int]:
    """"9.0" -> (9, 0) (a PTX ISA or CUDA version)."""
    parts = text.strip().split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        raise ValueError("%r is not a version like '9.0'" % (text,)) from None
RB_PY_F551C5BA
  cat >"${dir}"/rbprobes/checks.py <<'RB_PY_EE87DE44'
"""The check types: function, level, accepted params and default deadline of each.

The params are those of compiler/spec.py's check models (the config's `params`), plus a few
optional ones only the probes read (marked "probes-only" in docs/probes.md).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, NamedTuple

from . import checks_hatch, checks_numeric, checks_runtime, checks_static


class CheckType(NamedTuple):
    run: Callable[..., Any]
    level: str
    params: Dict[str, str]  # name -> "str" | "int" | "bool" | "strs"
    deadline_s: int  # the runner stops waiting after this (params.timeout_s extends it)


CHECKS: Dict[str, CheckType] = {
    "kernel_audit": CheckType(
        checks_static.kernel_audit, "L0",
        {"arch": "str", "paths": "strs", "driver_ptx_max": "str", "strict": "bool"}, 1800),
    "libraries": CheckType(
        checks_runtime.libraries_check, "L1",
        {"expect_dirs": "strs", "modules": "strs", "runtime": "bool"}, 600),
    "torch": CheckType(checks_runtime.torch_check, "L1", {"version": "str", "cuda": "str"}, 300),
    "devices": CheckType(
        checks_runtime.devices_check, "L1",
        {"count": "int", "capability": "str", "names": "strs"}, 300),
    "imports": CheckType(checks_runtime.imports_check, "L1", {"modules": "strs"}, 600),
    "matmul": CheckType(
        checks_numeric.matmul_check, "L2",
        {"dtype": "str", "size": "int", "every_device": "bool"}, 900),
    "nccl": CheckType(
        checks_numeric.nccl_check, "L2", {"timeout_s": "int", "elements": "int"}, 240),
    "python": CheckType(
        checks_hatch.python_check, "L1", {"code": "str", "name": "str", "timeout_s": "int"}, 300),
    "command": CheckType(
        checks_hatch.command_check, "L1",
        {"run": "str", "name": "str", "expect_exit": "int", "timeout_s": "int"}, 300),
}


def deadline_for(check_type: str, params: Dict[str, Any]) -> float:
    """How long the runner waits for a check: its default, or params.timeout_s plus a margin."""
    spec = CHECKS[check_type]
    own = params.get("timeout_s")
    if isinstance(own, int) and not isinstance(own, bool):
        return max(spec.deadline_s, own + 90)
    return spec.deadline_s
RB_PY_EE87DE44
  cat >"${dir}"/rbprobes/checks_hatch.py <<'RB_PY_74DEDE3E'
"""Escape hatches: the spec author's own Python snippet or shell command, judged by exit status."""

from __future__ import annotations

import sys
from typing import Any, Dict

from . import proc
from .result import Context, failed, passed

DEFAULT_TIMEOUT_S = 300


def _judge(label: str, finished: proc.Finished, expect: int, timeout_s: float,
           values: Dict[str, Any]):
    values.update({"exit": finished.returncode, "output_tail": finished.output,
                   "seconds": round(finished.duration_s, 3)})
    last = finished.output.strip().splitlines()[-1:] or [""]
    if finished.timed_out:
        return failed("%s timed out after %gs" % (label, timeout_s), values)
    if finished.returncode != expect:
        return failed("%s exited %d, expected %d: %s" % (label, finished.returncode, expect,
                                                         last[0][:200]), values)
    return passed("%s exited %d%s" % (label, expect, (": " + last[0][:120]) if last[0] else ""),
                  values)


def python_check(params: Dict[str, Any], ctx: Context):
    """Run params.code with this interpreter in a child process; pass when it exits 0."""
    code = params.get("code")
    if not code:
        return failed("no code to run: give params.code")
    timeout_s = params.get("timeout_s", DEFAULT_TIMEOUT_S)
    label = "python snippet %s" % (params.get("name") or "")
    finished = proc.run_bounded([sys.executable, "-c", code], timeout_s, env=proc.child_env())
    return _judge(label.strip(), finished, 0, timeout_s,
                  {"name": params.get("name"), "python": sys.executable})


def command_check(params: Dict[str, Any], ctx: Context):
    """Run params.run with /bin/sh -c; pass when it exits with params.expect_exit (0)."""
    command = params.get("run")
    if not command:
        return failed("no command to run: give params.run")
    timeout_s = params.get("timeout_s", DEFAULT_TIMEOUT_S)
    expect = params.get("expect_exit", 0)
    label = "command %s" % (params.get("name") or "")
    finished = proc.run_bounded(["/bin/sh", "-c", command], timeout_s, env=proc.child_env())
    return _judge(label.strip(), finished, expect, timeout_s,
                  {"name": params.get("name"), "expect_exit": expect})
RB_PY_74DEDE3E
  cat >"${dir}"/rbprobes/checks_numeric.py <<'RB_PY_4208D592'
"""L2 checks: the GPUs compute the right numbers (matmul) and talk to each other (nccl)."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from . import proc
from .checks_runtime import need_cuda
from .result import Context, failed, passed, short_list

# Largest acceptable max|C - ref| / max|ref|, the reference being the same (rounded) inputs
# multiplied in float64 on the CPU. Output rounding alone is 2^-9 (bf16) and 2^-12 (fp16)
# relative to an element; float32 leaves room for TF32, should a site enable it.
TOLERANCE = {"float32": 1e-3, "bfloat16": 1e-2, "float16": 5e-3}
FULL_ROWS = 1024  # every row is checked up to this size, then this many sampled rows
FULL_COLS = 8192  # every column is checked up to this size, then FULL_ROWS sampled columns


def _sample(torch, n: int, limit: int, seed: int):
    if n <= limit:
        return None
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=g)[:limit].sort().values


def matmul_once(torch, device: str, dtype_name: str, size: int, seed: int = 0,
                min_time_s: float = 0.2, op=None) -> Dict[str, Any]:
    """C = A @ B on `device` in `dtype`, checked against float64 on the CPU, then timed.
    `op` replaces torch.matmul (unit tests inject a wrong product with it)."""
    op = op or torch.matmul
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator(device=device).manual_seed(seed)
    a = (torch.rand((size, size), device=device, generator=gen) * 2 - 1).to(dtype)
    b = (torch.rand((size, size), device=device, generator=gen) * 2 - 1).to(dtype)
    if device.startswith("cuda"):
        def sync():
            torch.cuda.synchronize(device)
    else:
        def sync():
            return None
    c = op(a, b)
    sync()
    rows = _sample(torch, size, FULL_ROWS, seed + 1)
    cols = _sample(torch, size, FULL_COLS if size <= FULL_COLS else FULL_ROWS, seed + 2)
    a_ref = (a if rows is None else a[rows.to(device)]).cpu().double()
    b_ref = (b if cols is None else b[:, cols.to(device)]).cpu().double()
    got = c if rows is None else c[rows.to(device)]
    got = (got if cols is None else got[:, cols.to(device)]).cpu().double()
    ref = a_ref @ b_ref
    scale = float(ref.abs().max())
    err = float((got - ref).abs().max()) / scale if scale > 0 else float("inf")
    if not math.isfinite(err) or not bool(torch.isfinite(got).all()):
        err = float("nan")
    # timing: warm up, then repeat until min_time_s has passed (at most 100 runs)
    for _ in range(2):
        op(a, b)
    sync()
    runs, start = 0, time.perf_counter()
    while True:
        op(a, b)
        runs += 1
        if runs % 5 == 0 or runs == 1:
            sync()
            elapsed = time.perf_counter() - start
            if elapsed >= min_time_s or runs >= 100:
                break
    sync()
    elapsed = time.perf_counter() - start
    checked = "%dx%d of %dx%d" % (ref.shape[0], ref.shape[1], size, size)
    tflops = 2.0 * size ** 3 * runs / elapsed / 1e12
    return {"max_rel_err": err, "tflops": float("%.4g" % tflops),
            "runs": runs, "checked": checked}


def matmul_check(params: Dict[str, Any], ctx: Context, device: Optional[str] = None, op=None):
    """Check: on every device (or the first), a dtype matmul is correct within tolerance.
    `device="cpu"` and `op` are for unit tests of the numerics; the check itself needs CUDA."""
    dtype_name = params.get("dtype", "bfloat16")
    size = int(params.get("size", 4096))
    if dtype_name not in TOLERANCE:
        return failed("dtype %r is not one of %s" % (dtype_name, ", ".join(sorted(TOLERANCE))))
    if size < 1:
        return failed("size must be positive, got %d" % size)
    if device is None:
        torch = need_cuda()
        n = torch.cuda.device_count() if params.get("every_device", True) else 1
        targets = ["cuda:%d" % i for i in range(n)]
    else:
        import torch

        targets = [device]
    tol = TOLERANCE[dtype_name]
    results = []
    for dev in targets:
        name = (torch.cuda.get_device_name(torch.device(dev)) if dev.startswith("cuda")
                else "cpu")
        r = matmul_once(torch, dev, dtype_name, size, op=op)
        r.update({"device": dev, "name": name, "tolerance": tol,
                  "ok": r["max_rel_err"] <= tol})
        results.append(r)
    values: Dict[str, Any] = {"dtype": dtype_name, "size": size, "devices": results}
    if device is None or device.startswith("cuda"):
        values["allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
    bad = ["%s: max rel err %.3g > %.3g" % (r["device"], r["max_rel_err"], tol)
           for r in results if not r["ok"]]
    if bad:
        return failed("%s %dx%d matmul wrong on %s" % (dtype_name, size, size, short_list(bad)),
                      values)
    worst = max(r["max_rel_err"] for r in results)
    speeds = ", ".join("%.3g" % r["tflops"] for r in results)
    return passed("%s %d^3 on %d device(s): max rel err %.2g <= %.0e, TFLOP/s %s" % (
        dtype_name, size, len(results), worst, tol, speeds), values)


def _package_parent() -> str:
    """The directory to put on PYTHONPATH so that `python -m <this package>` works."""
    depth = len(__package__.split("."))
    here = os.path.dirname(os.path.abspath(__file__))
    for _ in range(depth):
        here = os.path.dirname(here)
    return here


def nccl_check(params: Dict[str, Any], ctx: Context):
    """Check: an all-reduce over every local GPU, one process per GPU, gives the exact sum."""
    torch = need_cuda()
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_nccl_available():
        return failed("this torch build has no NCCL backend (torch %s)" % torch.__version__)
    world = torch.cuda.device_count()
    timeout_s = int(params.get("timeout_s", 180))
    elements = int(params.get("elements", 1 << 22))
    tmp = tempfile.mkdtemp(prefix="rbprobes-nccl-")
    env = proc.child_env(_package_parent())
    try:
        store = os.path.join(tmp, "store")
        argv = [sys.executable, "-m", __package__ + ".nccl_worker"]
        started = time.monotonic()
        children = []
        for rank in range(world):
            log = open(os.path.join(tmp, "rank%d.log" % rank), "w+b")
            child = proc.subprocess.Popen(
                argv + [str(rank), str(world), store, str(elements), str(timeout_s)],
                stdout=log, stderr=proc.subprocess.STDOUT, stdin=proc.subprocess.DEVNULL,
                env=env, start_new_session=True)
            children.append((child, log))
        deadline = started + timeout_s + 60
        results: List[Dict[str, Any]] = []
        for rank, (child, log) in enumerate(children):
            try:
                child.wait(timeout=max(1.0, deadline - time.monotonic()))
            except proc.subprocess.TimeoutExpired:
                for other, _log in children:
                    proc.kill_group(other)
                child.wait()
            log.seek(0)
            output = log.read().decode("utf-8", "replace")
            log.close()
            results.append(_worker_result(rank, child.returncode, output))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    expected = world * (world + 1) // 2
    values = {"world_size": world, "expected": expected, "elements": elements,
              "ranks": results, "env": {k: os.environ.get(k, v)
                                        for k, v in proc.SAFE_ENV.items()}}
    bad = ["rank %d: %s" % (r["rank"], r.get("error") or "sum %s, expected %s" % (
        r.get("min"), expected)) for r in results if not r.get("ok")]
    if bad:
        return failed("all-reduce over %d GPU(s) failed: %s" % (world, short_list(bad, 3)),
                      values)
    slowest = max(r.get("elapsed_s", 0.0) for r in results)
    note = " (world size 1: only one GPU, no inter-GPU traffic)" if world == 1 else ""
    return passed("all-reduce over %d GPU(s) gave exactly %d on every element in %.3f s%s"
                  % (world, expected, slowest, note), values)


def _worker_result(rank: int, returncode: Optional[int], output: str) -> Dict[str, Any]:
    for line in reversed(output.strip().splitlines()):
        if line.startswith("{"):
            try:
                data = json.loads(line)
                data.setdefault("rank", rank)
                if returncode != 0 and data.get("ok"):
                    data["ok"] = False
                    data["error"] = "exit status %s" % returncode
                return data
            except ValueError:
                break
    what = "killed at the deadline" if returncode is None or returncode < 0 else \
        "exit status %d" % returncode
    return {"rank": rank, "ok": False,
            "error": "%s; output: %s" % (what, proc.tail(output, 600).strip() or "(none)")}
RB_PY_4208D592
  cat >"${dir}"/rbprobes/checks_runtime.py <<'RB_PY_3C4C6F72'
"""L1 checks: facts of the running environment (torch, devices, imports, loaded libraries).

torch is imported inside the checks, never at module import: the package must load (and the L0
checks run) on a host without torch.
"""

from __future__ import annotations

import glob
import importlib
import os
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple

from . import arch, cudalibs
from .checks_static import library_inventory
from .result import Context, Unavailable, failed, passed, short_list


def need_torch():
    """Import torch, or raise Unavailable saying why it cannot be."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise Unavailable("torch is not installed in %s (%s)" % (sys.prefix, exc)) from None
    return torch


def need_cuda():
    """torch with at least one CUDA device, or Unavailable naming what is missing."""
    torch = need_torch()
    if not torch.cuda.is_available():
        build = "CUDA %s" % torch.version.cuda if torch.version.cuda else "a CPU-only build"
        raise Unavailable("no CUDA device visible: torch %s (%s) reports "
                          "torch.cuda.is_available() == False" % (torch.__version__, build))
    return torch


def version_matches(expected: str, actual: Optional[str]) -> bool:
    """Prefix match by components: '2.11' matches '2.11.0+cu130', not '2.110.0'."""
    if not actual:
        return False
    if "+" in expected:
        return actual.startswith(expected)
    want = expected.split(".")
    have = actual.split("+", 1)[0].split(".")
    return have[: len(want)] == want


def driver_version() -> Optional[str]:
    """The NVIDIA kernel driver version (580.95.05), from /proc or nvidia-smi."""
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as fh:
            for word in fh.readline().split():
                if word.count(".") >= 1 and word.replace(".", "").isdigit():
                    return word
    except OSError:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=False)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def driver_cuda_version() -> Optional[str]:
    """The CUDA version the driver supports ("13.0"), from libcuda's cuDriverGetVersion."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
        out = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(out)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return "%d.%d" % (out.value // 1000, (out.value % 1000) // 10)


def torch_check(params: Dict[str, Any], ctx: Context):
    torch = need_torch()
    values: Dict[str, Any] = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "file": getattr(torch, "__file__", None),
        "cuda_available": bool(torch.cuda.is_available()),
    }
    if values["cuda_available"]:
        values["driver"] = driver_version()
        values["driver_cuda"] = driver_cuda_version()
    problems = []
    want = params.get("version")
    if want and not version_matches(want, torch.__version__):
        problems.append("torch is %s, expected %s" % (torch.__version__, want))
    want_cuda = params.get("cuda") or None
    if want_cuda and not version_matches(want_cuda, torch.version.cuda):
        problems.append("torch is built for CUDA %s, expected %s"
                        % (torch.version.cuda or "none (CPU-only build)", want_cuda))
    text = "torch %s, CUDA %s" % (torch.__version__, torch.version.cuda or "none")
    if values.get("driver"):
        text += ", driver %s" % values["driver"]
        if values.get("driver_cuda"):
            text += " (CUDA %s)" % values["driver_cuda"]
    if problems:
        return failed("; ".join(problems), values)
    return passed(text, values)


def _target(params: Dict[str, Any], ctx: Context) -> Tuple[Optional[str], Optional[int]]:
    cap = params.get("capability") or ctx.gpu_value("capability")
    if not cap and ctx.gpu_value("arch"):
        major, minor = arch.parse_target(ctx.gpu_value("arch"))
        cap = "%d.%d" % (major, minor)
    count = params.get("count")
    if count is None:
        count = ctx.gpu_value("count")
    return cap, count


def devices_check(params: Dict[str, Any], ctx: Context):
    try:
        expected_cap, expected_count = _target(params, ctx)
        if expected_cap:
            arch.parse_capability(expected_cap)
    except ValueError as exc:
        return failed("expected device: %s" % exc)
    torch = need_cuda()
    n = torch.cuda.device_count()
    devices = []
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        devices.append({
            "index": i,
            "name": p.name,
            "capability": "%d.%d" % (p.major, p.minor),
            "memory_gib": round(p.total_memory / 2**30, 1),
            "multiprocessors": p.multi_processor_count,
        })
    arch_list = list(torch.cuda.get_arch_list())
    values: Dict[str, Any] = {"count": n, "devices": devices, "arch_list": arch_list,
                              "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
    problems = []
    if expected_count is not None and n != expected_count:
        problems.append("%d device(s) visible, expected %d" % (n, expected_count))
    if expected_cap:
        wrong = ["%d: %s is %s" % (d["index"], d["name"], d["capability"])
                 for d in devices if d["capability"] != expected_cap]
        if wrong:
            problems.append("capability %s expected, but device %s" % (expected_cap,
                                                                       short_list(wrong)))
    names = params.get("names")
    if names:
        wrong = [d["name"] for d in devices
                 if not any(w.lower() in d["name"].lower() for w in names)]
        if wrong:
            problems.append("device names %s match none of %s" % (short_list(wrong), names))
    # Does this torch build carry code (SASS, or PTX to JIT) for every device present?
    unserved = []
    for cap in sorted({d["capability"] for d in devices}):
        dev = arch.parse_capability(cap)
        usable = [a for a in arch_list if _arch_entry_runs(a, dev)]
        values.setdefault("arch_paths", {})[cap] = usable
        if not usable:
            unserved.append(cap)
    if unserved:
        problems.append("this torch build has no SASS or PTX for capability %s (arch list: %s)"
                        % (", ".join(unserved), " ".join(arch_list)))
    if problems:
        return failed("; ".join(problems), values)
    caps = sorted({d["capability"] for d in devices})
    names_seen = sorted({d["name"] for d in devices})
    return passed("%d x %s (capability %s); torch carries %s" % (
        n, "/".join(names_seen), "/".join(caps),
        ", ".join(a for c in caps for a in values["arch_paths"][c])), values)


def _arch_entry_runs(name: str, dev: Tuple[int, int]) -> bool:
    try:
        return arch.name_runs_on(name, dev)
    except ValueError:
        return False


def module_version(module: Any, name: str) -> Optional[str]:
    version = getattr(module, "__version__", None)
    if isinstance(version, str):
        return version
    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    top = name.split(".")[0]
    for candidate in (top, top.replace("_", "-")):
        try:
            return metadata.version(candidate)
        except Exception:
            continue
    return None


def imports_check(params: Dict[str, Any], ctx: Context):
    modules = params.get("modules") or []
    if not modules:
        return failed("no modules to import: give params.modules")
    results = []
    missing = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except BaseException as exc:  # a module may raise anything, even SystemExit
            if isinstance(exc, KeyboardInterrupt):
                raise
            text = "%s: %s" % (type(exc).__name__, exc)
            results.append({"module": name, "ok": False, "error": text[:500]})
            missing.append("%s (%s)" % (name, text[:200]))
            continue
        results.append({"module": name, "ok": True, "version": module_version(module, name),
                        "file": getattr(module, "__file__", None)})
    values = {"modules": results}
    if missing:
        return failed("cannot import %s" % short_list(missing), values)
    return passed(", ".join("%s %s" % (r["module"], r["version"] or "?") for r in results),
                  values)


def _expected_dirs(params: Dict[str, Any], ctx: Context, venv: str) -> List[str]:
    dirs = [venv]
    dirs.extend(ctx.cuda_value("library_dirs") or [])
    # cuda.library_path_first: directories relative to the venv's site-packages
    for rel in ctx.cuda_value("library_path_first") or []:
        dirs.extend(glob.glob(os.path.join(venv, "lib", "python*", "site-packages", rel)))
    if ctx.cuda_value("home"):
        dirs.append(ctx.cuda_value("home"))
    dirs.extend(params.get("expect_dirs") or [])
    return [d for d in dirs if d]


def _inside(path: str, dirs: List[str]) -> bool:
    real = os.path.realpath(path)
    for d in dirs:
        for base in {d.rstrip("/"), os.path.realpath(d)}:
            if path.startswith(base + "/") or real.startswith(base + "/"):
                return True
    return False


def loaded_report(maps_text: str, expected: List[str]) -> Dict[str, Any]:
    """What the process has loaded, which of it is foreign, and which CUDA majors are mixed."""
    loaded = []
    for fam, path in cudalibs.loaded_libraries(maps_text):
        major, how = cudalibs.cuda_major(path, fam)
        loaded.append({"lib": fam, "path": path, "cuda_major": major, "source": how,
                       "expected_dir": _inside(path, expected)})
    majors = sorted({l["cuda_major"] for l in loaded if l["cuda_major"] is not None})
    return {
        "loaded": loaded,
        "loaded_majors": majors,
        "foreign": [l["path"] for l in loaded if not l["expected_dir"]],
        "expected_dirs": expected,
        "not_loaded": [m for m in cudalibs.MAIN if m not in {l["lib"] for l in loaded}],
    }


def _load_cuda_libraries(modules: List[str]) -> Dict[str, Any]:
    """Import the modules; with torch and a GPU, touch CUDA, cuBLAS and cuDNN so they load."""
    info: Dict[str, Any] = {"imported": []}
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise Unavailable("cannot import %s (%s): the runtime part needs it" % (name, exc))
        info["imported"].append(name)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.init()
        a = torch.ones((64, 64), device="cuda")
        (a @ a).sum().item()
        info["cudnn"] = torch.backends.cudnn.version()
        info["cuda_initialised"] = True
    else:
        info["cuda_initialised"] = False
    return info


def read_maps() -> str:
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
        return fh.read()


def libraries_check(params: Dict[str, Any], ctx: Context):
    """Static: which CUDA libraries the venv ships (by CUDA major). Runtime (unless
    runtime: false): after importing `modules` (default torch) and touching CUDA, which were
    loaded from where; fails on a library from outside the expected dirs, or two CUDA majors."""
    venv = ctx.venv_or_prefix()
    values: Dict[str, Any] = {}
    notes = []
    if os.path.isdir(venv):
        values["static"] = library_inventory(venv)
        if values["static"]["mixed"]:
            notes.append("venv ships CUDA majors %s (%s)" % (
                "+".join(map(str, values["static"]["cuda_majors"])),
                ", ".join("%s: %s" % (k, "/".join(map(str, v)))
                          for k, v in values["static"]["majors_by_lib"].items() if len(v) > 1)
                or "different libraries"))
    else:
        notes.append("venv %s not found: static part skipped" % venv)
    if params.get("runtime") is False:
        shipped = "+".join(map(str, values.get("static", {}).get("cuda_majors", [])))
        text = "static only; venv ships CUDA %s" % (shipped or "none")
        return passed("; ".join([text] + notes), values, level="L0")
    modules = params.get("modules")
    if modules is None:
        modules = ["torch"]
    try:
        values["runtime"] = _load_cuda_libraries(modules)
    except Unavailable as exc:
        raise Unavailable(exc.reason, values) from None
    values.update(loaded_report(read_maps(), _expected_dirs(params, ctx, venv)))
    problems = []
    if values["foreign"]:
        problems.append("loaded from outside the expected dirs: %s"
                        % short_list(values["foreign"]))
    if len(values["loaded_majors"]) > 1:
        by_major = ["CUDA %s: %s" % (m, ", ".join(os.path.basename(l["path"])
                                                 for l in values["loaded"]
                                                 if l["cuda_major"] == m))
                    for m in values["loaded_majors"]]
        problems.append("CUDA majors %s loaded together (%s)"
                        % ("+".join(map(str, values["loaded_majors"])), "; ".join(by_major)))
    if problems:
        return failed("; ".join(problems + notes), values)
    loaded = values["loaded"]
    text = ("%d CUDA libraries loaded, all from expected dirs, CUDA %s" % (
        len(loaded), "+".join(map(str, values["loaded_majors"])) or "?")
        if loaded else "no CUDA library loaded (CUDA %s)"
        % ("initialised" if values["runtime"]["cuda_initialised"] else "not available"))
    return passed("; ".join([text] + notes), values)
RB_PY_3C4C6F72
  cat >"${dir}"/rbprobes/checks_static.py <<'RB_PY_D11E5D37'
"""L0 checks: read files only, need no GPU and no torch.

- kernel_audit: every file with GPU code in the venv, and whether it has a path to the target
  device (SASS that runs there, or PTX the driver can JIT for it).
- library_inventory: which CUDA libraries the venv ships, by CUDA major (used by `libraries`).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from . import arch, cudalibs, fatbin
from .result import Context, failed, passed, short_list

_SUFFIXES = (".so", ".cubin", ".fatbin")


def _is_candidate(name: str) -> bool:
    return name.endswith(_SUFFIXES) or ".so." in name


def candidate_files(root: str) -> List[str]:
    """Shared objects, cubins and fatbins under root (or root itself if it is a file), each
    real file once: symlinks are skipped, hard links de-duplicated."""
    if os.path.isfile(root):
        return [root]
    seen = set()
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if not _is_candidate(name):
                continue
            full = os.path.join(dirpath, name)
            try:
                if os.path.islink(full):
                    continue
                st = os.stat(full)
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            if key not in seen:
                seen.add(key)
                out.append(full)
    return out


def file_verdict(
    scan: fatbin.Scan, target: Tuple[int, int], driver_ptx_max: Optional[Tuple[int, int]]
) -> Tuple[str, int]:
    """("sass" | "ptx" | "partial" | "none" | "empty", modules without a path) for one file.

    A module (one translation unit, or one device link with its units: `Scan.modules`) has a
    path when one of its SASS entries runs on the target ("sass") or else one of its PTX entries
    can be JIT-compiled for it ("ptx"). A file is "partial" when some modules have a path and
    some do not: with lazy module loading that only fails when a kernel of such a module is
    launched. "none" (no entry of the file can run there) does not depend on the grouping.
    Modules without any kernel (`Container.empty`) are left out; a file with nothing else is
    "empty" (it passes: there is nothing to launch).
    """
    paths = []
    for module in scan.modules:
        if all(container.empty for container in module):
            continue  # no kernel in it: nothing to launch, nothing to fail
        how = "none"
        for e in (e for container in module for e in container.entries):
            if e.kind == "sass" and arch.runs_on("sass", e.number, e.suffix, target):
                how = "sass"
                break
            if e.kind == "ptx" and arch.runs_on("ptx", e.number, e.suffix, target, e.version,
                                                driver_ptx_max):
                how = "ptx"
        if any(e.kind in ("sass", "ptx") for container in module for e in container.entries):
            paths.append(how)
    missing = paths.count("none")
    if not paths:
        return ("empty" if scan.modules else "none"), 0
    if missing == len(paths):
        return "none", missing
    if missing:
        return "partial", missing
    return ("ptx" if "ptx" in paths else "sass"), 0


def audit(
    root: str,
    target: Tuple[int, int],
    paths: Optional[List[str]] = None,
    driver_ptx_max: Optional[Tuple[int, int]] = None,
) -> Dict[str, Any]:
    """Scan root (a venv, a directory or one file), or the given paths inside it."""
    roots = [root] if not paths else [p if os.path.isabs(p) else os.path.join(root, p)
                                      for p in paths]
    missing_paths = [p for p in roots if not os.path.exists(p)]
    base = root if os.path.isdir(root) else os.path.dirname(root)
    files: List[Dict[str, Any]] = []
    errors: List[str] = []
    scanned = 0
    all_entries: List[fatbin.Entry] = []
    for r in roots:
        if not os.path.exists(r):
            continue
        for path in candidate_files(r):
            scan = fatbin.scan_file(path)
            if scan.kind == "not-elf":
                continue
            scanned += 1
            rel = os.path.relpath(path, base)
            if scan.error:
                errors.append("%s: %s" % (rel, scan.error))
                continue
            errors.extend("%s: %s" % (rel, c.error) for c in scan.containers if c.error)
            entries = [e for c in scan.runtime_containers + scan.embedded_containers
                       for e in c.entries]
            if not entries:
                continue
            all_entries.extend(entries)
            verdict, without = file_verdict(scan, target, driver_ptx_max)
            info: Dict[str, Any] = {"path": rel}
            info.update(fatbin.summarize(entries))
            info["containers"] = len(scan.runtime_containers)
            if scan.embedded_containers:
                info["embedded_containers"] = len(scan.embedded_containers)
            info["modules"] = len(scan.modules)
            if without:
                info["modules_without_path"] = without
            if any(c.section == fatbin.RELOCATABLE_SECTION for c in scan.containers):
                info["relocatable"] = sum(
                    len(c.entries) for c in scan.containers
                    if c.section == fatbin.RELOCATABLE_SECTION)
            info["verdict"] = verdict
            files.append(info)
    overall = fatbin.summarize(all_entries)
    return {
        "target": arch.capability_to_arch(target),
        "root": root,
        "files_scanned": scanned,
        "gpu_files": len(files),
        "no_path": [f["path"] for f in files if f["verdict"] == "none"],
        "partial": [f["path"] for f in files if f["verdict"] == "partial"],
        "ptx_only": [f["path"] for f in files if f["verdict"] == "ptx"],
        "kernel_free": [f["path"] for f in files if f["verdict"] == "empty"],
        "sass": overall["sass"],
        "ptx": overall["ptx"],
        "lto": overall["lto"],
        "ptx_versions": overall["ptx_versions"],
        "compressed_entries": overall["compressed"],
        "missing_paths": missing_paths,
        "errors": errors,
        "files": files,
    }


def kernel_audit(params: Dict[str, Any], ctx: Context):
    """Check: every file with GPU code has a path to the target arch."""
    target_text = params.get("arch") or ctx.gpu_value("arch") or ctx.gpu_value("capability")
    if not target_text:
        return failed("no target architecture: give params.arch (e.g. sm_103) or gpu.arch")
    try:
        target = arch.parse_target(str(target_text))
        driver_max = (arch.parse_version(params["driver_ptx_max"])
                      if params.get("driver_ptx_max") else None)
    except ValueError as exc:
        return failed(str(exc))
    root = ctx.venv_or_prefix()
    if not os.path.exists(root):
        return failed("%s does not exist" % root)
    values = audit(root, target, params.get("paths"), driver_max)
    values["driver_ptx_max"] = params.get("driver_ptx_max")
    name = values["target"]
    strict = bool(params.get("strict"))
    problems = []
    if values["missing_paths"]:
        problems.append("missing paths: %s" % short_list(values["missing_paths"]))
    if values["no_path"]:
        described = ["%s (%s)" % (f["path"], "+".join(f["sass"] + f["ptx"]))
                     for f in values["files"] if f["verdict"] == "none"]
        problems.append("%d of %d files with GPU code have no %s SASS and no PTX that can be "
                        "JIT-compiled for it: %s" % (len(described), values["gpu_files"], name,
                                                     short_list(described)))
    if strict and values["partial"]:
        problems.append("%d files have modules without a path to %s (strict): %s"
                        % (len(values["partial"]), name, short_list(values["partial"])))
    if values["errors"]:
        problems.append("unreadable: %s" % short_list(values["errors"], 3))
    if problems:
        return failed("; ".join(problems), values)
    notes = []
    if values["ptx_only"]:
        notes.append("%d only through PTX JIT (slow first launch%s)" % (
            len(values["ptx_only"]),
            "" if driver_max else "; driver must accept PTX ISA %s"
            % "/".join(values["ptx_versions"] or ["?"])))
    if values["partial"]:
        notes.append("%d with some modules lacking %s code" % (len(values["partial"]), name))
    if values["kernel_free"]:
        notes.append("%d without any kernel" % len(values["kernel_free"]))
    if values["gpu_files"]:
        summary = "%d files with GPU code (of %d scanned) all have a path to %s" % (
            values["gpu_files"], values["files_scanned"], name)
    else:
        summary = "no file with GPU code (%d shared objects scanned)" % values["files_scanned"]
    return passed(summary + ("; " + "; ".join(notes) if notes else ""), values)


def library_inventory(venv: str) -> Dict[str, Any]:
    """The CUDA libraries a venv ships, with the CUDA major of each."""
    libs = []
    for fam, path in cudalibs.find_in_tree(venv):
        major, how = cudalibs.cuda_major(path, fam)
        libs.append({"lib": fam, "file": os.path.relpath(path, venv), "cuda_major": major,
                     "source": how})
    majors = sorted({l["cuda_major"] for l in libs if l["cuda_major"] is not None})
    by_lib: Dict[str, List[int]] = {}
    for l in libs:
        if l["cuda_major"] is not None:
            by_lib.setdefault(l["lib"], [])
            if l["cuda_major"] not in by_lib[l["lib"]]:
                by_lib[l["lib"]].append(l["cuda_major"])
    found = {l["lib"] for l in libs}
    return {
        "venv": venv,
        "shipped": libs,
        "cuda_majors": majors,
        "mixed": len(majors) > 1,
        "majors_by_lib": {k: sorted(v) for k, v in sorted(by_lib.items())},
        "not_shipped": [m for m in cudalibs.MAIN if m not in found],
    }
RB_PY_D11E5D37
  cat >"${dir}"/rbprobes/cli.py <<'RB_PY_530F8990'
"""Command line: `python -m rbprobes CHECK [options]` and `python -m rbprobes run ...`.

Exit status: 0 pass (or skip), 1 fail, 2 usage error. A standalone check prints its result as
JSON on stdout; `run` writes the report file and prints a table on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional

from . import proc, report, runner
from .result import FAIL, Context

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own usage errors: exit 2, as documented
        self.print_usage(sys.stderr)
        sys.stderr.write("%s: error: %s\n" % (self.prog, message))
        sys.exit(EXIT_USAGE)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-skip", action="store_true",
                   help="a missing precondition (no GPU, no torch) is a skip, not a failure")
    p.add_argument("--deadline-s", type=float, default=None,
                   help="stop waiting for the check after this many seconds")


def build_parser() -> argparse.ArgumentParser:
    prog = "python -m %s" % (__package__ or "rbprobes")
    parser = _Parser(prog=prog, description="Probe a Python/CUDA environment.")
    sub = parser.add_subparsers(dest="command", metavar="CHECK", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("run", help="run the checks of a config document, write a report")
    p.add_argument("--config-json", required=True,
                   help="the config document as a JSON string ('-': read it from stdin)")
    p.add_argument("--report", required=True, help="where to write the report JSON")

    p = sub.add_parser("kernel_audit", help="L0: GPU code in a venv vs a target arch")
    p.add_argument("path", help="a venv (or any directory), or one .so/.cubin/.fatbin file")
    p.add_argument("--arch", required=True, help="target device, e.g. sm_103 or 10.3")
    p.add_argument("--path", dest="paths", action="append",
                   help="only this path (relative to PATH); repeatable")
    p.add_argument("--driver-ptx-max", help="newest PTX ISA the driver accepts, e.g. 9.0")
    p.add_argument("--strict", action="store_true",
                   help="also fail files where only some modules have a path")
    _common(p)

    p = sub.add_parser("libraries", help="L0/L1: CUDA libraries shipped and loaded")
    p.add_argument("--venv", help="the venv (default: this interpreter's prefix)")
    p.add_argument("--expect-dir", dest="expect_dirs", action="append", default=[],
                   help="another directory libraries may come from; repeatable")
    p.add_argument("--library-dir", dest="library_dirs", action="append", default=[],
                   help="a cuda.library_dirs entry; repeatable")
    p.add_argument("--cuda-home", help="cuda.home")
    p.add_argument("--module", dest="modules", action="append",
                   help="import this before reading the maps (default: torch); repeatable")
    p.add_argument("--static-only", action="store_true", help="only scan the venv's files")
    _common(p)

    p = sub.add_parser("torch", help="L1: torch version, CUDA version, driver")
    p.add_argument("--version", dest="version")
    p.add_argument("--cuda")
    _common(p)

    p = sub.add_parser("devices", help="L1: device count, names, capability, torch arch list")
    p.add_argument("--count", type=int)
    p.add_argument("--capability", help="e.g. 10.3")
    p.add_argument("--name", dest="names", action="append")
    _common(p)

    p = sub.add_parser("imports", help="L1: import modules, report versions and files")
    p.add_argument("modules", nargs="+")
    _common(p)

    p = sub.add_parser("matmul", help="L2: matmul on every device vs a float64 reference")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--first-device", action="store_true", help="only device 0")
    _common(p)

    p = sub.add_parser("nccl", help="L2: all-reduce across all local GPUs")
    p.add_argument("--timeout-s", type=int, default=180)
    _common(p)

    p = sub.add_parser("python", help="run a Python snippet with this interpreter")
    p.add_argument("code")
    p.add_argument("--name")
    p.add_argument("--timeout-s", type=int, default=300)
    _common(p)

    p = sub.add_parser("command", help="run a shell command with /bin/sh -c")
    p.add_argument("run")
    p.add_argument("--name")
    p.add_argument("--expect-exit", type=int, default=0)
    p.add_argument("--timeout-s", type=int, default=300)
    _common(p)
    return parser


def _standalone(args: argparse.Namespace) -> Dict[str, Any]:
    """The check dict and context a standalone command line stands for."""
    c = args.command
    params: Dict[str, Any] = {}
    venv: Optional[str] = None
    cuda: Dict[str, Any] = {}
    if c == "kernel_audit":
        venv = os.path.abspath(args.path)
        params = {"arch": args.arch, "paths": args.paths, "driver_ptx_max": args.driver_ptx_max,
                  "strict": args.strict or None}
    elif c == "libraries":
        venv = os.path.abspath(args.venv) if args.venv else None
        params = {"expect_dirs": args.expect_dirs or None, "modules": args.modules,
                  "runtime": False if args.static_only else None}
        cuda = {"library_dirs": args.library_dirs, "home": args.cuda_home}
    elif c == "torch":
        params = {"version": args.version, "cuda": args.cuda}
    elif c == "devices":
        params = {"count": args.count, "capability": args.capability, "names": args.names}
    elif c == "imports":
        params = {"modules": args.modules}
    elif c == "matmul":
        params = {"dtype": args.dtype, "size": args.size,
                  "every_device": False if args.first_device else None}
    elif c == "nccl":
        params = {"timeout_s": args.timeout_s}
    elif c == "python":
        params = {"code": args.code, "name": args.name, "timeout_s": args.timeout_s}
    elif c == "command":
        params = {"run": args.run, "name": args.name, "expect_exit": args.expect_exit,
                  "timeout_s": args.timeout_s}
    check = {"id": c, "type": c, "allow_skip": args.allow_skip,
             "params": {k: v for k, v in params.items() if v is not None}}
    if args.deadline_s:
        check["timeout_s"] = args.deadline_s
    return {"check": check, "ctx": Context(venv=venv, cuda=cuda or None)}


def _load_config(text: str) -> Dict[str, Any]:
    if text == "-":
        text = sys.stdin.read()
    try:
        return json.loads(text)
    except ValueError as exc:
        raise runner.ConfigError("--config-json is not valid JSON: %s" % exc) from None


def main(argv: Optional[List[str]] = None) -> int:
    proc.apply_safe_env()
    args = build_parser().parse_args(argv)
    if args.command == "run":
        try:
            config = _load_config(args.config_json)
            doc, stopped = runner.run_config(config)
        except runner.ConfigError as exc:
            sys.stderr.write("error: %s\n" % exc)
            return EXIT_USAGE
        report.write(args.report, doc)
        sys.stderr.write(report.table(doc["checks"]) + "\n" + report.summary_line(doc) + "\n")
        code = EXIT_FAIL if doc["summary"].get("fail") else EXIT_OK
        if stopped:
            _hard_exit(code)
        return code
    job = _standalone(args)
    entry = runner.run_check(job["check"], job["ctx"])
    sys.stdout.write(json.dumps(entry, indent=2, default=str) + "\n")
    code = EXIT_FAIL if entry["status"] == FAIL else EXIT_OK
    if entry["values"].get("timed_out"):
        _hard_exit(code)
    return code


def _hard_exit(code: int) -> None:
    """A check thread is still stuck (in a CUDA call, say): leave without joining it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
RB_PY_530F8990
  cat >"${dir}"/rbprobes/cudalibs.py <<'RB_PY_8EEA011D'
"""Which CUDA library a file is, and which CUDA major version it belongs to.

The CUDA major of a library is read, in this order, from:
1. the file name for libraries whose soname major *is* the CUDA major (libcudart.so.12,
   libcublas.so.13, libcublasLt, libnvJitLink, libnvrtc, libcupti);
2. the pip distribution that installed the file (RECORD of `nvidia_*_cu12-*.dist-info`);
3. a `cuNN` path component (the CUDA 13 wheels' `nvidia/cu13/lib/` layout);
4. the DT_SONAME inside the file (a plain `libcudart.so` whose soname is libcudart.so.12).
Other libraries carry their own version in the soname (libcufft.so.11 is CUDA 12, libnccl.so.2
and libcudnn.so.9 exist for both), so for them only 2-3 can tell.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Dict, List, Optional, Tuple

from . import elf

# (family, basename pattern); an auditwheel hash (libcudart-d0da41ae.so.12) is allowed.
_TRACKED = [
    ("libcudart", "libcudart"),
    ("libcublasLt", "libcublasLt"),
    ("libcublas", "libcublas"),
    ("libnvJitLink", "libnvJitLink"),
    ("libnccl", "libnccl"),
    ("libcudnn", r"libcudnn(?:_[a-z_]+)?"),
    ("libnvrtc", "libnvrtc"),
    ("libcusparse", "libcusparse"),
    ("libcufft", "libcufft"),
    ("libcurand", "libcurand"),
    ("libcusolver", "libcusolver"),
    ("libcupti", "libcupti"),
]
_PATTERNS = [
    (family, re.compile(r"^%s(?:-[0-9a-f]{8})?\.so((?:\.[0-9]+)*)$" % stem))
    for family, stem in _TRACKED
]
# The libraries every report names, found or not.
MAIN = ["libcudart", "libcublas", "libcublasLt", "libnvJitLink", "libnccl", "libcudnn"]
# Families whose soname major equals the CUDA major.
SONAME_IS_CUDA = {"libcudart", "libcublas", "libcublasLt", "libnvJitLink", "libnvrtc", "libcupti"}

_CU_COMPONENT = re.compile(r"(?:^|[/_.-])cu([0-9]{2})(?=[/_.-]|$)")
_DIST_CU = re.compile(r"[-_]cu([0-9]{2})$")


def family(basename: str) -> Optional[str]:
    """'libcublasLt.so.13' -> 'libcublasLt'; None for anything not tracked."""
    for fam, pat in _PATTERNS:
        if pat.match(basename):
            return fam
    return None


def _soname_major(fam: str, name: str) -> Optional[int]:
    if fam not in SONAME_IS_CUDA:
        return None
    for f, pat in _PATTERNS:
        if f == fam:
            m = pat.match(name)
            if m and m.group(1):
                major = int(m.group(1).split(".")[1])
                # CUPTI went to year versions (libcupti.so.2025.1.1): not a CUDA major
                return major if major < 100 else None
    return None


def site_packages_of(path: str) -> Optional[str]:
    """The `.../site-packages` (or dist-packages) directory above `path`, if any."""
    parts = path.split(os.sep)
    for i in range(len(parts) - 1, 0, -1):
        if parts[i] in ("site-packages", "dist-packages"):
            return os.sep.join(parts[:i + 1])
    return None


_DIST_CACHE: Dict[str, Dict[str, Tuple[str, str]]] = {}


def dist_index(site_packages: str) -> Dict[str, Tuple[str, str]]:
    """realpath of each tracked library file -> (distribution name, version), from the RECORD
    files of the `nvidia*` distributions in one site-packages directory."""
    if site_packages in _DIST_CACHE:
        return _DIST_CACHE[site_packages]
    index: Dict[str, Tuple[str, str]] = {}
    for info in glob.glob(os.path.join(site_packages, "nvidia*.dist-info")):
        stem = os.path.basename(info)[: -len(".dist-info")]
        name, _, version = stem.partition("-")
        try:
            with open(os.path.join(info, "RECORD"), encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    rel = line.split(",", 1)[0]
                    if family(os.path.basename(rel)):
                        full = os.path.realpath(os.path.join(site_packages, rel))
                        index[full] = (name, version)
        except OSError:
            continue
    _DIST_CACHE[site_packages] = index
    return index


def cuda_major(path: str, fam: Optional[str] = None) -> Tuple[Optional[int], str]:
    """(CUDA major, how it was found) for a library file; (None, "unknown") when nothing tells."""
    name = os.path.basename(path)
    fam = fam or family(name)
    if fam is None:
        return None, "unknown"
    major = _soname_major(fam, name)
    if major is not None:
        return major, "soname"
    real = os.path.realpath(path)
    site = site_packages_of(real)
    if site:
        dist = dist_index(site).get(real)
        if dist:
            m = _DIST_CU.search(dist[0].lower())
            if m:
                return int(m.group(1)), "dist:%s-%s" % dist
    # A `cuNN` directory: below site-packages when the file is in one (so a venv that happens
    # to be called /opt/app-cu12 does not count), else anywhere in its directory.
    where = os.path.dirname(real)[len(site):] if site else os.path.dirname(path)
    m = _CU_COMPONENT.search(where)
    if m:
        return int(m.group(1)), "path"
    soname = _read_soname(path)
    if soname:
        major = _soname_major(fam, soname)
        if major is not None:
            return major, "elf-soname"
    return None, "unknown"


def _read_soname(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as fh:
            data = fh.read(64)
            if not data.startswith(elf.MAGIC):
                return None
            fh.seek(0)
            import mmap

            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                image = elf.parse(mm)
                return elf.soname(mm, image) if image else None
    except (OSError, ValueError):
        return None


def find_in_tree(root: str) -> List[Tuple[str, str]]:
    """(family, path) for every tracked library file under root (symlinks skipped: a real file
    is reported once, under its own name)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            fam = family(name)
            full = os.path.join(dirpath, name)
            if fam and not os.path.islink(full):
                out.append((fam, full))
    return out


def loaded_libraries(maps_text: str) -> List[Tuple[str, str]]:
    """(family, path) of each tracked library mapped into a process, from /proc/PID/maps text."""
    seen = set()
    out = []
    for line in maps_text.splitlines():
        fields = line.split(None, 5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue
        path = fields[5]
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        fam = family(os.path.basename(path))
        if fam and path not in seen:
            seen.add(path)
            out.append((fam, path))
    return out
RB_PY_8EEA011D
  cat >"${dir}"/rbprobes/elf.py <<'RB_PY_489C7406'
"""Just enough ELF to find sections and the soname: the section table, read with struct.

Works on a bytes-like buffer (an mmap of the file, so a 1 GB library is not read into memory).
Little-endian ELF32 and ELF64; anything else is reported as "not ELF" by returning None.
"""

from __future__ import annotations

import struct
from typing import Dict, List, NamedTuple, Optional

MAGIC = b"\x7fELF"
EM_CUDA = 190
SHT_PROGBITS = 1
SHT_NOBITS = 8
SHT_DYNAMIC = 6
DT_NULL = 0
DT_SONAME = 14


class Section(NamedTuple):
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int


class Elf(NamedTuple):
    bits: int  # 32 or 64
    machine: int
    osabi: int
    abiversion: int
    flags: int  # e_flags
    sections: List[Section]


def parse(buf) -> Optional[Elf]:
    """The header and section table of the ELF image in `buf`, or None if it is not a
    little-endian ELF (or is truncated)."""
    if len(buf) < 52 or bytes(buf[:4]) != MAGIC:
        return None
    ei_class, ei_data = buf[4], buf[5]
    if ei_data != 1 or ei_class not in (1, 2):
        return None
    osabi, abiversion = buf[7], buf[8]
    try:
        if ei_class == 2:
            (machine,) = struct.unpack_from("<H", buf, 18)
            shoff, flags = struct.unpack_from("<QI", buf, 40)
            shentsize, shnum, shstrndx = struct.unpack_from("<HHH", buf, 58)
            fmt = "<IIQQQQIIQQ"
        else:
            (machine,) = struct.unpack_from("<H", buf, 18)
            shoff, flags = struct.unpack_from("<II", buf, 32)
            shentsize, shnum, shstrndx = struct.unpack_from("<HHH", buf, 46)
            fmt = "<IIIIIIIIII"
        raw = []
        if shoff and shnum and shoff + shnum * shentsize <= len(buf):
            for i in range(shnum):
                (sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, _info, _align,
                 _entsize) = struct.unpack_from(fmt, buf, shoff + i * shentsize)
                raw.append((sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link))
    except struct.error:
        return None
    names = b""
    if 0 <= shstrndx < len(raw):
        _n, _t, _f, _a, off, size, _l = raw[shstrndx]
        names = bytes(buf[off:off + size])
    sections = []
    for sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link in raw:
        end = names.find(b"\0", sh_name)
        name = names[sh_name:end if end >= 0 else len(names)].decode("latin-1")
        sections.append(Section(name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link))
    bits = 64 if ei_class == 2 else 32
    return Elf(bits, machine, osabi, abiversion, flags, sections)


def in_file(buf, section: Section) -> bool:
    """Whether the section has contents inside the file (not NOBITS, not truncated)."""
    return section.type != SHT_NOBITS and section.offset + section.size <= len(buf)


def section_bytes(buf, section: Section) -> bytes:
    """A copy of a (small) section's contents; empty for NOBITS or out-of-file sections."""
    if not in_file(buf, section):
        return b""
    return bytes(buf[section.offset:section.offset + section.size])


def by_name(elf: Elf) -> Dict[str, Section]:
    return {s.name: s for s in elf.sections}


def file_offset(elf: Elf, address: int) -> Optional[int]:
    """The file offset of a virtual address inside an allocated section with file contents."""
    for sec in elf.sections:
        if sec.type != SHT_NOBITS and sec.addr and sec.addr <= address < sec.addr + sec.size:
            return sec.offset + (address - sec.addr)
    return None


def soname(buf, elf: Elf) -> Optional[str]:
    """DT_SONAME of a shared object, or None."""
    for sec in elf.sections:
        if sec.type != SHT_DYNAMIC or not (0 <= sec.link < len(elf.sections)):
            continue
        strtab = elf.sections[sec.link]
        data = section_bytes(buf, sec)
        fmt, step = ("<qQ", 16) if elf.bits == 64 else ("<iI", 8)
        for pos in range(0, len(data) - step + 1, step):
            tag, val = struct.unpack_from(fmt, data, pos)
            if tag == DT_NULL:
                break
            if tag == DT_SONAME:
                strs = section_bytes(buf, strtab)
                end = strs.find(b"\0", val)
                return strs[val:end if end >= 0 else len(strs)].decode("latin-1") or None
    return None
RB_PY_489C7406
  cat >"${dir}"/rbprobes/fatbin.py <<'RB_PY_01DEF17E'
"""A pure-Python reader of NVIDIA fat binaries (no CUDA toolkit needed).

Where GPU code lives in a shared object:
- `.nv_fatbin`: the fatbins the CUDA runtime registers when the library loads (what runs);
- `__nv_relfatbin`: relocatable device code kept for a later device link (-rdc); it only counts
  when a file has no `.nv_fatbin`;
- `.nvFatBinSegment`: 24-byte `__fatBinC_Wrapper_t` records {u32 magic 0x466243B1, u32 version,
  u64 fatbin address, u64 aux address}, one per registered fatbin. They hold no code, but tell
  which containers form one module: nvcc 13's `-shared` (and any device link) writes a version-2
  wrapper for the device-linked container and version-1 wrappers for each translation unit's own
  container; the runtime may fall back from the linked cubin to those units' PTX, so together
  they are one module (see `Scan.modules`).

A section holds one or more *containers*, back to back (8-byte aligned):

    container header, 16 bytes:  u32 magic 0xBA55ED50 | u16 version (1) | u16 header size (16)
                                 | u64 size of the entries that follow
    entry header, >= 64 bytes:   0  u16 kind (1 PTX, 2 ELF/SASS, 8 LTO-IR)   2  u16 (0x0101)
                                 4  u32 entry header size (64, 80, 96, 112: CUDA 12.8+ appends
                                        an option block for newer targets)
                                 8  u64 payload size (8-byte padded)
                                 16 u32 compressed size (0 if not compressed)
                                 20 u32 offset of the option block in the header (0 if none)
                                 24 u16 minor, 26 u16 major: PTX ISA version for PTX entries,
                                        the cubin ABI version ([1, 8]) for ELF entries
                                 28 u32 arch number: 90 = sm_90, 103 = sm_103, 120 = sm_120
                                 32 u32 name offset, 36 u32 name length
                                 40 u64 flags
                                 56 u64 uncompressed size (when compressed)
                                 then the payload, right after the entry header.

Flag bits, as nvcc 13.0 writes them (found by building the same kernel for sm_90 / sm_90a /
sm_100a / sm_100f / compute_100{,a,f} and comparing the bytes; see docs/probes.md):
    0x000001 64-bit, 0x000010 Linux host,
    0x002000 compressed, LZ4 block format (`-compress-mode=speed`, and CUDA < 12.8),
    0x008000 compressed, Zstandard (CUDA 12.8+ default; `size`, `balance`, `default`),
    0x100000 arch-specific code: `sm_90a`, `compute_100a` (the arch number stays 90 / 100),
    0x200000 family-specific code: `sm_100f`, `compute_100f`.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from typing import Dict, List, NamedTuple, Optional, Tuple

from . import arch, elf

FATBIN_MAGIC = 0xBA55ED50
WRAPPER_MAGIC = 0x466243B1
_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)

KIND_PTX = 1
KIND_ELF = 2
KIND_LTO = 8  # LTO-IR (`code=lto_90`): input for nvJitLink, never loaded as it is

FLAG_64BIT = 0x1
FLAG_LINUX = 0x10
FLAG_COMPRESS_LZ4 = 0x2000
FLAG_COMPRESS_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY = 0x200000

RUNTIME_SECTION = ".nv_fatbin"
RELOCATABLE_SECTION = "__nv_relfatbin"
WRAPPER_SECTION = ".nvFatBinSegment"
# Data sections where a library may keep fatbins it loads itself (cuModuleLoadData,
# cuLibraryLoadData): libcufft.so.12 keeps ~24,000 containers in .ldata and a single sm_75 one in
# .nv_fatbin. Searched only in files that have one of the sections above.
EMBEDDED_PREFIXES = (".rodata", ".lrodata", ".data", ".ldata")

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class Entry(NamedTuple):
    kind: str  # "sass", "ptx", "lto", or "kind<N>" for kinds this reader does not know
    number: int  # arch number: 90, 100, 103, 120
    suffix: str  # "", "a" or "f"
    version: Tuple[int, int]  # PTX ISA version (PTX), cubin ABI version (SASS)
    flags: int
    compression: Optional[str]  # None, "lz4", "zstd"
    payload_offset: int  # absolute offset in the buffer
    stored_size: int  # bytes stored (compressed size when compressed)
    size: int  # uncompressed size (padded payload size when not compressed)

    @property
    def name(self) -> str:
        """sm_100a, compute_90, ..."""
        if self.kind == "lto":
            return "lto_%d%s" % (self.number, self.suffix)
        if self.kind not in ("sass", "ptx"):
            return "%s_%d%s" % (self.kind, self.number, self.suffix)
        return arch.code_name(self.kind, self.number, self.suffix)


class Container(NamedTuple):
    section: str
    offset: int
    entries: List[Entry]
    error: Optional[str]  # set when the container is truncated or malformed
    wrapper: Optional[int] = None  # version of the wrapper record pointing at it, if any
    empty: bool = False  # holds no kernel at all (see kernel_free)


class Scan(NamedTuple):
    """What one file holds: its containers (runtime and relocatable) and wrapper count."""

    path: str
    kind: str  # "elf", "cubin", "fatbin", "not-elf", "error"
    containers: List[Container]
    wrappers: int
    error: Optional[str]

    @property
    def embedded_containers(self) -> List[Container]:
        """Containers found in data sections: loaded by the library itself, if at all."""
        return [c for c in self.containers if c.section.startswith(EMBEDDED_PREFIXES)]

    @property
    def runtime_containers(self) -> List[Container]:
        """The containers the CUDA runtime registers when the file is loaded (`__nv_relfatbin`
        ones only when there is nothing else)."""
        registered = [c for c in self.containers if not c.section.startswith(EMBEDDED_PREFIXES)]
        rt = [c for c in registered if c.section != RELOCATABLE_SECTION]
        return rt if rt else registered

    @property
    def modules(self) -> List[List[Container]]:
        """Runtime containers grouped into modules: a device-linked container (version-2
        wrapper) together with the translation-unit containers (version-1 wrappers) it was
        linked from; every other container alone. With several device links in one file the
        units cannot be told apart and join all of them (an optimistic grouping). All embedded
        containers together count as one more module: the library picks among them itself."""
        rt = self.runtime_containers
        embedded = self.embedded_containers
        extra = [embedded] if embedded else []
        linked = [c for c in rt if c.wrapper == 2]
        if not linked:
            return [[c] for c in rt] + extra
        group = linked + [c for c in rt if c.wrapper == 1]
        return [group] + [[c] for c in rt if c.wrapper is None] + extra

    @property
    def entries(self) -> List[Entry]:
        return [e for c in self.containers for e in c.entries]


def _suffix(flags: int) -> str:
    if flags & FLAG_ARCH_SPECIFIC:
        return "a"
    if flags & FLAG_FAMILY:
        return "f"
    return ""


def _compression(flags: int) -> Optional[str]:
    if flags & FLAG_COMPRESS_ZSTD:
        return "zstd"
    if flags & FLAG_COMPRESS_LZ4:
        return "lz4"
    return None


def parse_entries(buf, start: int, end: int,
                  strict: bool = False) -> Tuple[List[Entry], Optional[str]]:
    """Entries of one container whose entry area is buf[start:end]. `strict` (for containers
    found by searching data sections) rejects any entry that is not PTX or ELF of version
    0x0101, so random bytes that happen to hold the magic are not taken for code."""
    entries = []
    pos = start
    while pos + 64 <= end:
        kind_code, v, hsize, size = struct.unpack_from("<HHIQ", buf, pos)
        if strict and (v != 0x0101 or kind_code not in (KIND_PTX, KIND_ELF, KIND_LTO)):
            return [], "not a fatbin entry at offset %d" % pos
        if hsize < 64 or pos + hsize + size > end:
            return entries, "entry at offset %d overruns its container" % pos
        (compressed,) = struct.unpack_from("<I", buf, pos + 16)
        minor, major, number = struct.unpack_from("<HHI", buf, pos + 24)
        (flags,) = struct.unpack_from("<Q", buf, pos + 40)
        (usize,) = struct.unpack_from("<Q", buf, pos + 56)
        kind = {KIND_PTX: "ptx", KIND_ELF: "sass", KIND_LTO: "lto"}.get(
            kind_code, "kind%d" % kind_code)
        comp = _compression(flags)
        entries.append(Entry(
            kind, number, _suffix(flags), (major, minor), flags, comp, pos + hsize,
            compressed if comp and compressed else size, usize if comp and usize else size))
        pos += hsize + size
    return entries, None


def parse_containers(buf, start: int, end: int, section: str,
                     strict: bool = False) -> List[Container]:
    """Every fatbin container found in buf[start:end] (`strict`: see parse_entries; a
    container that fails it is dropped, not reported)."""
    out = []
    pos = buf.find(_MAGIC_BYTES, start, end)
    while 0 <= pos and pos + 16 <= end:
        _m, version, hsize, fsize = struct.unpack_from("<IHHQ", buf, pos)
        if version != 1 or hsize < 16 or pos + hsize > end:
            pos = buf.find(_MAGIC_BYTES, pos + 4, end)
            continue
        cend = pos + hsize + fsize
        error = None
        if cend > end:
            error = "container at offset %d claims %d bytes past its section" % (pos, cend - end)
            cend = end
        entries, entry_error = parse_entries(buf, pos + hsize, cend, strict)
        if strict and (error or entry_error or not entries):
            pos = buf.find(_MAGIC_BYTES, pos + 4, end)
            continue
        if entries or error or entry_error:
            out.append(Container(section, pos, entries, error or entry_error))
        pos = buf.find(_MAGIC_BYTES, max(cend, pos + 4), end)
    return out


_TKINFO_ARCH = re.compile(rb"-arch (sm_[0-9]{2,3}[af]?)")


def _cubin_entry(buf, image: elf.Elf) -> Entry:
    """A standalone cubin: the arch from the toolkit note (ptxas's `-arch sm_90a`), else e_flags."""
    for sec in image.sections:
        if sec.name == ".note.nv.tkinfo":
            m = _TKINFO_ARCH.search(elf.section_bytes(buf, sec))
            if m:
                _k, major, minor, suffix = arch.parse_arch(m.group(1).decode())
                return Entry("sass", major * 10 + minor, suffix, (0, 0), 0, None, 0, len(buf),
                             len(buf))
    number = (image.flags >> 8) & 0xFF if image.abiversion >= 8 else image.flags & 0xFF
    return Entry("sass", number, "", (0, 0), 0, None, 0, len(buf), len(buf))


def scan_buffer(buf, path: str = "<buffer>", embedded: bool = True) -> Scan:
    """Scan an in-memory image (ELF shared object or object, cubin, or a raw fatbin).
    `embedded`: also search the data sections of a file with GPU code (EMBEDDED_PREFIXES)."""
    if bytes(buf[:4]) == _MAGIC_BYTES:
        return Scan(path, "fatbin", parse_containers(buf, 0, len(buf), "<fatbin>"), 0, None)
    image = elf.parse(buf)
    if image is None:
        return Scan(path, "not-elf", [], 0, None)
    if image.machine == elf.EM_CUDA:
        entry = _cubin_entry(buf, image)
        return Scan(path, "cubin", [Container("<cubin>", 0, [entry], None)], 0, None)
    containers: List[Container] = []
    versions: Dict[int, int] = {}  # container file offset -> wrapper version
    wrappers = 0
    for sec in image.sections:
        if not elf.in_file(buf, sec):
            continue
        if sec.name in (RUNTIME_SECTION, RELOCATABLE_SECTION):
            containers.extend(parse_containers(buf, sec.offset, sec.offset + sec.size, sec.name))
        elif sec.name == WRAPPER_SECTION:
            for magic, version, data in _wrappers(buf, sec):
                wrappers += magic == WRAPPER_MAGIC
                where = elf.file_offset(image, data) if magic == WRAPPER_MAGIC and data else None
                if where is not None:
                    versions[where] = version
    containers = [c._replace(wrapper=versions.get(c.offset), empty=kernel_free(buf, c))
                  for c in containers]
    if embedded and (containers or wrappers):
        for sec in image.sections:
            if (sec.type == elf.SHT_PROGBITS and sec.name.startswith(EMBEDDED_PREFIXES)
                    and elf.in_file(buf, sec)):
                containers.extend(parse_containers(buf, sec.offset, sec.offset + sec.size,
                                                   sec.name, strict=True))
    return Scan(path, "elf", containers, wrappers, None)


def _wrappers(buf, sec: elf.Section):
    """(magic, version, fatbin address) of each 24-byte wrapper record. The address is the one
    stored in the file (the linker writes it there as well as into the RELATIVE relocation)."""
    for pos in range(sec.offset, sec.offset + sec.size - 23, 24):
        yield struct.unpack_from("<IIQ", buf, pos)


# Emptiness: a registered module without kernels (libcufft.so.12 and libcufftw.so.12 each carry
# one sm_75 cubin with no .text section) cannot fail a launch, so it needs no path to the target.
DECODE_MAX = 8192  # only entries this small are decoded to look for kernels
EMPTY_CUBIN_MAX = 2560  # an undecodable (zstd, no module) sm_75+ cubin this small is taken as
#                         empty: nvcc 13 writes 1.4-2.3 KB kernel-free cubins (sm_75..sm_120)
#                         and 2.8-5 KB ones for a single empty kernel


def entry_has_kernels(buf, entry: Entry) -> Optional[bool]:
    """True/False when known (a cubin with a `.text.*` section, PTX with `.entry`); None when
    it cannot be told. Big entries are assumed to hold kernels."""
    if entry.kind not in ("sass", "ptx") or entry.size > DECODE_MAX:
        return True
    try:
        data = payload(buf, entry)
    except Exception:  # a corrupt payload, or the zstd module's own error type
        data = None
    if data is None:
        # the size rule was measured on sm_75+ only (what nvcc 13 builds)
        if entry.kind == "sass" and entry.number >= 75 and entry.size <= EMPTY_CUBIN_MAX:
            return False
        return None
    if entry.kind == "ptx":
        return b".entry" in data
    image = elf.parse(data)
    if image is None:
        return None
    return any(sec.name.startswith(".text.") for sec in image.sections)


def kernel_free(buf, container: Container) -> bool:
    """Whether a container surely holds no kernel (every code entry known to be empty)."""
    code = [e for e in container.entries if e.kind in ("sass", "ptx")]
    return bool(code) and all(entry_has_kernels(buf, e) is False for e in code)


def scan_file(path: str, embedded: bool = True) -> Scan:
    """Scan one file through a read-only mmap (never reads a big library into memory)."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < 16:
                return Scan(path, "not-elf", [], 0, None)
            head = fh.read(4)
            if head not in (elf.MAGIC, _MAGIC_BYTES):
                return Scan(path, "not-elf", [], 0, None)
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                scan = scan_buffer(mm, path, embedded)
            return scan
    except (OSError, ValueError) as exc:
        return Scan(path, "error", [], 0, "%s: %s" % (type(exc).__name__, exc))


def payload(buf, entry: Entry) -> Optional[bytes]:
    """The entry's code, decompressed; None when it is Zstandard-compressed and no zstd module
    (Python 3.14's compression.zstd, or zstandard) is importable."""
    raw = bytes(buf[entry.payload_offset:entry.payload_offset + entry.stored_size])
    if entry.compression is None:
        return raw
    if entry.compression == "lz4":
        return lz4_block_decompress(raw, entry.size)
    if not raw.startswith(_ZSTD_MAGIC):
        raise ValueError("entry is flagged zstd but its payload has no zstd frame magic")
    try:
        from compression import zstd  # type: ignore  # Python 3.14+

        return zstd.decompress(raw)
    except ImportError:
        pass
    try:
        import zstandard  # type: ignore
    except ImportError:
        return None
    return zstandard.ZstdDecompressor().decompress(raw, max_output_size=entry.size)


def lz4_block_decompress(src: bytes, size: int) -> bytes:
    """Decode one LZ4 block (the format of flag 0x2000). `size` is the expected output size."""
    dst = bytearray()
    i, n = 0, len(src)
    while i < n:
        token = src[i]
        i += 1
        length = token >> 4
        if length == 15:
            while True:
                extra = src[i]
                i += 1
                length += extra
                if extra != 255:
                    break
        dst += src[i:i + length]
        i += length
        if i >= n or len(dst) >= size:
            break
        offset = src[i] | (src[i + 1] << 8)
        i += 2
        if offset == 0 or offset > len(dst):
            raise ValueError("corrupt LZ4 block: match offset %d at output %d" % (offset, len(dst)))
        length = token & 15
        if length == 15:
            while True:
                extra = src[i]
                i += 1
                length += extra
                if extra != 255:
                    break
        length += 4
        start = len(dst) - offset
        if offset >= length:
            dst += dst[start:start + length]
        else:
            for k in range(length):
                dst.append(dst[start + k])
    return bytes(dst[:size])


def summarize(entries: List[Entry]) -> Dict[str, object]:
    """Sorted SASS and PTX names, PTX ISA versions and the count of compressed entries."""
    sass = sorted({e.name for e in entries if e.kind == "sass"}, key=_arch_key)
    ptx = sorted({e.name for e in entries if e.kind == "ptx"}, key=_arch_key)
    versions = sorted({e.version for e in entries if e.kind == "ptx"})
    lto = sorted({e.name for e in entries if e.kind == "lto"}, key=_arch_key)
    other = sorted({e.name for e in entries if e.kind not in ("sass", "ptx", "lto")})
    out = {
        "sass": sass,
        "ptx": ptx,
        "lto": lto,
        "ptx_versions": ["%d.%d" % v for v in versions],
        "entries": len(entries),
        "compressed": sum(1 for e in entries if e.compression),
    }
    if other:
        out["unknown_kinds"] = other
    return out


def _arch_key(name: str):
    digits = "".join(ch for ch in name if ch.isdigit())
    return (int(digits or 0), name)
RB_PY_01DEF17E
  cat >"${dir}"/rbprobes/nccl_worker.py <<'RB_PY_C1F587CB'
"""One rank of the nccl check: `python -m <package>.nccl_worker RANK WORLD STORE ELEMENTS TIMEOUT`.

Rank r contributes r + 1 on every element of a float32 tensor (integer values, exact in float32),
so after a sum all-reduce every element must equal WORLD * (WORLD + 1) / 2 exactly. Prints one
JSON line as its last line of output.
"""

from __future__ import annotations

import datetime
import json
import sys
import time

from .proc import apply_safe_env


def main(argv) -> int:
    rank, world, store, elements, timeout_s = (int(argv[0]), int(argv[1]), argv[2],
                                               int(argv[3]), int(argv[4]))
    apply_safe_env()
    out = {"rank": rank, "ok": False}
    try:
        import torch
        import torch.distributed as dist

        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method="file://" + store, rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
        x = torch.full((elements,), float(rank + 1), dtype=torch.float32, device="cuda")
        dist.all_reduce(x)  # warm-up: builds the communicator
        torch.cuda.synchronize()
        x.fill_(float(rank + 1))
        start = time.perf_counter()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        expected = world * (world + 1) // 2
        lo, hi = float(x.min()), float(x.max())
        out.update({"ok": lo == hi == expected, "min": lo, "max": hi, "elapsed_s": elapsed,
                    "device": torch.cuda.get_device_name(rank),
                    "nccl": _nccl_version(torch)})
        dist.destroy_process_group()
    except Exception as exc:
        out["error"] = "%s: %s" % (type(exc).__name__, str(exc)[:400])
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


def _nccl_version(torch) -> str:
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
RB_PY_C1F587CB
  cat >"${dir}"/rbprobes/proc.py <<'RB_PY_F571E5A8'
"""Child processes with a deadline, and the environment every GPU process gets."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Dict, List, NamedTuple, Optional

# NVLink multicast (NVLS) can take a shared host's GPUs out of service; no probe uses it.
SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

TAIL_CHARS = 4000


def apply_safe_env(env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Set the SAFE_ENV variables in `env` (default: this process's os.environ) unless they are
    already set; returns the mapping."""
    target = os.environ if env is None else env
    for key, value in SAFE_ENV.items():
        target.setdefault(key, value)
    return target


def child_env(extra_pythonpath: Optional[str] = None) -> Dict[str, str]:
    env = apply_safe_env(dict(os.environ))
    if extra_pythonpath:
        old = env.get("PYTHONPATH")
        env["PYTHONPATH"] = extra_pythonpath + (os.pathsep + old if old else "")
    return env


class Finished(NamedTuple):
    returncode: Optional[int]  # None when it was killed at the deadline
    output: str  # the tail of stdout and stderr together
    stdout: str
    timed_out: bool
    duration_s: float


def tail(text: str, limit: int = TAIL_CHARS) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def run_bounded(argv: List[str], timeout_s: float, env: Optional[Dict[str, str]] = None,
                cwd: Optional[str] = None) -> Finished:
    """Run argv in its own process group; at the deadline kill the whole group."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                            start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc)
        out, err = proc.communicate()
    stdout = out.decode("utf-8", "replace")
    both = stdout + err.decode("utf-8", "replace")
    return Finished(None if timed_out else proc.returncode, tail(both), stdout, timed_out,
                    time.monotonic() - start)


def kill_group(proc: "subprocess.Popen") -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass
RB_PY_F571E5A8
  cat >"${dir}"/rbprobes/report.py <<'RB_PY_D227528A'
"""The report document (schema 1) and the human table printed on stderr."""

from __future__ import annotations

import json
import os
import platform
import socket
from typing import Any, Dict, List, Optional

SCHEMA = 1
LEVELS = ("L0", "L1", "L2")


def result(check_id: str, check_type: str, level: str, status: str, reason: str,
           values: Optional[Dict[str, Any]] = None, duration_s: float = 0.0) -> Dict[str, Any]:
    """One entry of the report's `checks` list (also what a standalone check prints)."""
    return {"id": check_id, "type": check_type, "level": level, "status": status,
            "reason": reason, "values": values or {}, "duration_s": round(duration_s, 3)}


def build(host: Optional[str], started: float, duration_s: float,
          checks: List[Dict[str, Any]]) -> Dict[str, Any]:
    ran = {c["level"] for c in checks if not c["values"].get("not_run")}
    summary = {"pass": 0, "fail": 0, "skip": 0}
    for c in checks:
        summary[c["status"]] = summary.get(c["status"], 0) + 1
    return {
        "schema": SCHEMA,
        "host": host or socket.gethostname(),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "started": started,
        "duration_s": round(duration_s, 3),
        "levels_run": [lv for lv in LEVELS if lv in ran],
        "checks": checks,
        "summary": summary,
    }


def write(path: str, doc: Dict[str, Any]) -> None:
    """Write atomically: a temp file in the same directory, then rename."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, ".%s.%d.tmp" % (os.path.basename(path), os.getpid()))
    try:
        with open(tmp, "w", encoding="utf-8") as fh:  # umask applies, unlike mkstemp's 0600
            json.dump(doc, fh, indent=2, sort_keys=False, default=str)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _one_line(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def table(checks: List[Dict[str, Any]], width: int = 140) -> str:
    """Aligned columns: check, level, status, seconds, detail."""
    rows = [("check", "level", "status", "secs", "detail")]
    for c in checks:
        rows.append((c["id"], c["level"], c["status"].upper(), "%.2f" % c["duration_s"],
                     c["reason"]))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for r in rows:
        head = "  ".join(r[i].ljust(widths[i]) if i != 3 else r[i].rjust(widths[i])
                         for i in range(4))
        lines.append(head + "  " + _one_line(r[4], max(20, width - len(head) - 2)))
    return "\n".join(lines)


def summary_line(doc: Dict[str, Any]) -> str:
    s = doc["summary"]
    return "%s: %d passed, %d failed, %d skipped (levels %s) in %.1fs" % (
        doc["host"], s.get("pass", 0), s.get("fail", 0), s.get("skip", 0),
        "+".join(doc["levels_run"]) or "none", doc["duration_s"])
RB_PY_D227528A
  cat >"${dir}"/rbprobes/result.py <<'RB_PY_147BD1A7'
"""The small types every check shares: its context, its outcome, and a missing precondition."""

from __future__ import annotations

import sys
from typing import Any, Dict, List, NamedTuple, Optional

PASS = "pass"
FAIL = "fail"
SKIP = "skip"


class Context(NamedTuple):
    """What the config document says about the host (all optional for standalone runs)."""

    host: Optional[str] = None
    venv: Optional[str] = None
    gpu: Optional[Dict[str, Any]] = None  # {"model", "count", "capability", "arch"}
    cuda: Optional[Dict[str, Any]] = None  # {"version", "home", "library_dirs",
    #                                          "library_path_first"}

    def gpu_value(self, key: str) -> Any:
        return (self.gpu or {}).get(key)

    def cuda_value(self, key: str) -> Any:
        return (self.cuda or {}).get(key)

    def venv_or_prefix(self) -> str:
        """The venv the check is about: the config's, else the running interpreter's (the
        runbook runs the probe with the moved venv's python and may leave venv null)."""
        return self.venv or sys.prefix


class Outcome(NamedTuple):
    status: str  # PASS or FAIL (SKIP only comes from Unavailable + allow_skip)
    reason: str
    values: Dict[str, Any]
    level: Optional[str] = None  # overrides the check type's level (libraries: L0 or L1)


def passed(reason: str, values: Optional[Dict[str, Any]] = None, level: Optional[str] = None):
    return Outcome(PASS, reason, values or {}, level)


def failed(reason: str, values: Optional[Dict[str, Any]] = None, level: Optional[str] = None):
    return Outcome(FAIL, reason, values or {}, level)


class Unavailable(Exception):
    """A precondition is missing (no CUDA device, torch not installed): the check fails with
    this reason, or is skipped when its config says allow_skip."""

    def __init__(self, reason: str, values: Optional[Dict[str, Any]] = None):
        super().__init__(reason)
        self.reason = reason
        self.values = values or {}


class ParamError(ValueError):
    """A check's params do not fit the check (unknown key, wrong type)."""


# Param types: "str", "int", "bool", "strs" (list of strings).
def check_params(check_type: str, params: Any, allowed: Dict[str, str]) -> Dict[str, Any]:
    """Validate `params` against `allowed` ({name: type}); raises ParamError naming the key."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise ParamError("params of a %s check must be a mapping, got %s"
                         % (check_type, type(params).__name__))
    for key, value in params.items():
        kind = allowed.get(key)
        if kind is None:
            known = ", ".join(sorted(allowed)) or "none"
            raise ParamError("unknown parameter %r for a %s check (known: %s)"
                             % (key, check_type, known))
        if value is None:
            continue
        ok = {
            "str": isinstance(value, str),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "bool": isinstance(value, bool),
            "strs": isinstance(value, list) and all(isinstance(v, str) for v in value),
        }[kind]
        if not ok:
            want = {"str": "a string", "int": "an integer", "bool": "true or false",
                    "strs": "a list of strings"}[kind]
            raise ParamError("parameter %r of a %s check must be %s, got %r"
                             % (key, check_type, want, value))
    return {k: v for k, v in params.items() if v is not None}


def short_list(items: List[str], limit: int = 5) -> str:
    """'a, b, c' or 'a, b, c, d, e and 7 more'."""
    if len(items) <= limit:
        return ", ".join(items)
    return "%s and %d more" % (", ".join(items[:limit]), len(items) - limit)
RB_PY_147BD1A7
  cat >"${dir}"/rbprobes/runner.py <<'RB_PY_5EB6C9BA'
"""Run checks: one (standalone) or the list of a config document, each under a deadline.

A check runs in a worker thread; if it does not finish by its deadline it is reported as failed
and the runner stops (a hung CUDA call cannot be interrupted; the caller exits the process).
Any exception a check raises becomes a failed result, never a crash of the runner.
"""

from __future__ import annotations

import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

from . import report
from .checks import CHECKS, deadline_for
from .result import FAIL, SKIP, Context, Outcome, ParamError, Unavailable, check_params


class ConfigError(ValueError):
    """The config document is unusable as a whole (a usage error: exit status 2)."""


def _call(fn, params: Dict[str, Any], ctx: Context, deadline_s: float) -> Tuple[str, Any]:
    """("ok", Outcome) | ("unavailable", exc) | ("error", text) | ("timeout", None)."""
    box: List[Tuple[str, Any]] = []

    def target() -> None:
        try:
            box.append(("ok", fn(params, ctx)))
        except Unavailable as exc:
            box.append(("unavailable", exc))
        except BaseException as exc:  # SystemExit from a snippet or import counts too
            tb = traceback.format_exc(limit=8)
            box.append(("error", ("%s: %s" % (type(exc).__name__, exc), tb)))

    worker = threading.Thread(target=target, name="rbprobes-check", daemon=True)
    worker.start()
    worker.join(deadline_s)
    if worker.is_alive() or not box:
        return "timeout", None
    return box[0]


def run_check(check: Dict[str, Any], ctx: Context) -> Dict[str, Any]:
    """Run one check given as {"id", "type", "params", "allow_skip", "timeout_s"?}; returns its
    report entry. The entry's values hold "timed_out": true when the deadline passed."""
    start = time.monotonic()
    check_type = check.get("type")
    check_id = str(check.get("id") or check_type)
    spec = CHECKS.get(check_type) if isinstance(check_type, str) else None
    if spec is None:
        return report.result(check_id, str(check_type), "L?", FAIL,
                             "unknown check type %r (known: %s)"
                             % (check_type, ", ".join(sorted(CHECKS))))
    try:
        params = check_params(check_type, check.get("params"), spec.params)
    except ParamError as exc:
        return report.result(check_id, check_type, spec.level, FAIL, str(exc))
    deadline_s = check.get("timeout_s") or deadline_for(check_type, params)
    kind, value = _call(spec.run, params, ctx, float(deadline_s))
    elapsed = time.monotonic() - start
    if kind == "ok" and isinstance(value, Outcome):
        return report.result(check_id, check_type, value.level or spec.level, value.status,
                             value.reason, value.values, elapsed)
    if kind == "unavailable":
        allow = check.get("allow_skip") is True
        status = SKIP if allow else FAIL
        reason = value.reason if allow else "%s (set allow_skip: true to skip)" % value.reason
        values = dict(value.values)
        values["precondition"] = value.reason
        return report.result(check_id, check_type, spec.level, status, reason, values, elapsed)
    if kind == "timeout":
        return report.result(check_id, check_type, spec.level, FAIL,
                             "timed out: still running after %gs" % deadline_s,
                             {"timed_out": True}, elapsed)
    if kind == "error":
        text, tb = value
        return report.result(check_id, check_type, spec.level, FAIL,
                             "unexpected error: %s" % text, {"traceback": tb}, elapsed)
    return report.result(check_id, check_type, spec.level, FAIL,
                         "check returned %r instead of an outcome" % (value,), {}, elapsed)


def context_of(config: Dict[str, Any]) -> Context:
    return Context(host=config.get("host"), venv=config.get("venv"), gpu=config.get("gpu"),
                   cuda=config.get("cuda"))


def validate_config(config: Any) -> List[Dict[str, Any]]:
    """The config's checks, each with an id; raises ConfigError for an unusable document."""
    if not isinstance(config, dict):
        raise ConfigError("the config must be a JSON object, got %s" % type(config).__name__)
    if config.get("schema") != 1:
        raise ConfigError("unsupported config schema %r (this probe reads schema 1)"
                          % (config.get("schema"),))
    for key, kind in (("gpu", dict), ("cuda", dict)):
        if config.get(key) is not None and not isinstance(config[key], kind):
            raise ConfigError("config %r must be an object or null" % key)
    checks = config.get("checks")
    if not isinstance(checks, list):
        raise ConfigError("config 'checks' must be a list")
    out = []
    seen = set()
    for i, check in enumerate(checks):
        if not isinstance(check, dict) or "type" not in check:
            raise ConfigError("checks[%d] must be an object with a 'type'" % i)
        check = dict(check)
        check["id"] = str(check.get("id") or "%s_%d" % (check["type"], i + 1))
        if check["id"] in seen:
            raise ConfigError("checks[%d]: duplicate id %r" % (i, check["id"]))
        seen.add(check["id"])
        out.append(check)
    return out


def run_config(config: Dict[str, Any], on_result=None) -> Tuple[Dict[str, Any], bool]:
    """Run every check of the config in order; returns (report, stopped_early). After a check
    times out the rest are not started and are reported as failed, "not run"."""
    checks = validate_config(config)
    ctx = context_of(config)
    started_wall = time.time()
    start = time.monotonic()
    results: List[Dict[str, Any]] = []
    stopped: Optional[str] = None
    for check in checks:
        if stopped:
            spec = CHECKS.get(check["type"])
            entry = report.result(check["id"], str(check["type"]),
                                  spec.level if spec else "L?", FAIL,
                                  "not run: check %s timed out and the runner stopped" % stopped,
                                  {"not_run": True})
        else:
            entry = run_check(check, ctx)
            if entry["values"].get("timed_out"):
                stopped = entry["id"]
        results.append(entry)
        if on_result:
            on_result(entry)
    doc = report.build(ctx.host, started_wall, time.monotonic() - start, results)
    return doc, stopped is not None
RB_PY_5EB6C9BA
}

#######################################
# Step 1/8: preflight (specs/local.yaml:7)
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
# Step 2/8: manifest (specs/local.yaml:15)
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
# Step 3/8: transfer (specs/local.yaml:9)
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
# Step 4/8: verify (specs/local.yaml:15)
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
# Step 5/8: relocate (specs/local.yaml:11)
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
# Step 6/8: swap (specs/local.yaml:16)
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
# Step 7/8: exports (specs/local.yaml:9)
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
# Step 8/8: probe (specs/local.yaml:18)
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
