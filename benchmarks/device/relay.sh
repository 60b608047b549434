#!/usr/bin/env bash
# @generated from device/relay.yaml (sha256 fa827b236b81e8df00e47795077852cd2215ca1d2e225b844bc7cf3d9179f930) by runbook-compiler 0.1.0 -- DO NOT EDIT.
# Edit the spec and recompile: compile device/relay.yaml
# sha256 of this file with these 64 digits zeroed: d3677d28945d1444aa33b4a6fa2b9bccd0439599f436fb1309c5c81c81bd9de5
# Relay the device's torch venv between two sshd on it, through itself (no checks).
#
# Usage: bash relay.sh [--list | --dry-run | --plan | --apply PLAN | --only STEP | --from STEP] [--report PATH] [--version]
#
# ShellCheck exclusions, for the whole file, each for a reason:
#   SC2016: scripts run by `sh -c` on a host (here or over ssh) are single-quoted on purpose, so
#     that `$1` in them expands there; their arguments travel quoted by rb::shq.
#   SC1003: spec values are single-quoted by the compiler (Python's shlex.quote), right by
#     construction; a value may hold a backslash, which this check takes for a mistyped
#     escape.
# shellcheck disable=SC2016,SC1003
set -Eeuo pipefail
shopt -s inherit_errexit
if ((BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] < 404)); then
  echo "this runbook needs bash 4.4 or newer (found ${BASH_VERSION})" >&2
  exit 2
fi
# This file: its own hash and the kit beside it are read from here (by an absolute path: the
# Pythons that read them start from `/`).
readonly RB_SELF=${BASH_SOURCE[0]}
RB_SELF_ABS=${RB_SELF}
if [[ "${RB_SELF_ABS}" != /* ]]; then
  RB_SELF_ABS=${PWD}/${RB_SELF_ABS}
fi
readonly RB_SELF_ABS

#######################################
# Settings, from the spec. Every value is quoted by the compiler.
#######################################
# The runbook and its spec.
readonly RB_NAME=relay
readonly RB_SPEC=device/relay.yaml
readonly RB_SPEC_SHA256=fa827b236b81e8df00e47795077852cd2215ca1d2e225b844bc7cf3d9179f930
readonly RB_COMPILER_VERSION=0.1.0
# The kit (hostkit/): embedded below (compile --standalone).
readonly RB_KIT_SHA256=c69b19383bbf7aa3338f889d6ed94f3fadf6bf6a64ce121631d64eae35432d69
readonly RB_KIT_FILE=''
# AES-GCM first: the relay is CPU-bound.
readonly RB_SSH_CIPHERS=aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com
# transfer (device/relay.yaml:19)
readonly RB_SRC_HOST=a
readonly RB_SRC_PATH=/opt/torch/.venv
readonly RB_DST_HOST=b
readonly RB_DST_PATH=/opt/rb-relay/.venv
readonly RB_ROUTE=relay
readonly RB_COMPRESSION=auto
readonly RB_VERIFY=sha256
readonly RB_RERUN=quick
# the threat model's choices the source's scan reads (docs/design.md): setuid/setgid/world-write entries, links that leave the tree
readonly RB_SPECIAL_MODES=strip
readonly RB_OUTSIDE_LINKS=refuse
# gpu: declared: the report says whether the checks proved it (a skip is not a pass)
readonly RB_GPU_DECLARED=''
# the static checks on the source before anything moves: the kernel audit for this arch (empty: no gpu:, or gpu.kernel_audit: false), and the references that leave the venv
readonly RB_AUDIT_ARCH=''
# a re-run that finds changes sends only them (see docs/design.md)
readonly RB_INCREMENTAL=1
# hashing threads on each host (auto: one per CPU); one stream per two where the sending end starts the receiving ends (one host, direct)
readonly RB_JOBS=auto
# The install engine's choices, as one JSON document for the engine on the target (rbkit/choices.py).
readonly RB_ENGINE_CHOICES='{"cuda_home":"","env":{},"env_file":"","jobs":"auto","keep_backups":2,"library_path_first":[],"on_existing":"replace","on_failed_checks":"keep","origin":"runbook relay (device/relay.yaml)","rerun":"quick","schema":1,"shared_parent":"refuse","special_modes":"strip","swap_atomic":"allow","timeout":null,"verify":"sha256"}'
# the kernel audit's options from the spec's kernel_audit check
readonly -a RB_AUDIT_ARGS=()
# Each file of the spec, three words each: its name, its path from this runbook's folder, its sha256: a run refuses to start when one changed.
readonly -a RB_SPEC_FILES=(device/relay.yaml relay.yaml fa827b236b81e8df00e47795077852cd2215ca1d2e225b844bc7cf3d9179f930)
# Hosts this runbook touches.
readonly -a RB_HOSTS=(a b)
readonly -a RB_STEPS=(preflight manifest transfer verify relocate prove swap exports)
# transfer.exclude
readonly -a RB_EXCLUDE_ARGS=(--exclude __pycache__ --exclude '*.pyc')
# compression auto: the first of these every end of the stream has, else none
readonly -a RB_AUTO_COMPRESSION=(lz4 zstd)
# route direct/auto: ssh arguments the source uses to reach the destination
readonly -a RB_DIRECT_SSH=()
declare -rA RB_STEP_DOC=(
  [preflight]='Reach every host, ship the kit, check the source is a venv after the excludes, take the destination'"'"'s lock, check its state and free space.'
  [manifest]='Hash every file of the source (in parallel) into a manifest; detect a re-run and what an incremental one must send.'
  [transfer]='Stream the source into a staging directory beside the destination.'
  [verify]='Check the staging against the manifest: every file, mode, link and digest.'
  [relocate]='Rewrite what names the old path (shebangs, activate scripts) for the new one.'
  [prove]='The staged interpreter runs here and reports the staging as sys.prefix.'
  [swap]='Put the proven copy in place in one rename, then prove it there (sys.prefix, the console scripts); a failure puts back what was there.'
  [exports]='Write the env file: CUDA_HOME, PATH, LD_LIBRARY_PATH with the venv'"'"'s libs first.'
)
declare -rA RB_STEP_PREVIEW=(
  [preflight]='on a: connect; copy the kit to a private directory (mktemp -d), checked by its sha256; check tar and python3 >= 3.9
on b: connect; copy the kit to a private directory (mktemp -d), checked by its sha256; check tar and python3 >= 3.9
on a: rbkit engine scan /opt/torch/.venv --exclude __pycache__ --exclude '"'"'*.pyc'"'"' (refused unless pyvenv.cfg, bin/python and files are sent)
on b: rbkit engine serve --dest /opt/rb-relay/.venv: refuses a parent of it another user can write (shared_parent: refuse); takes /opt/rb-relay/..venv.rb-lock for the run (a second run is refused, naming this one)
on b: engine preflight: on_existing replace; free space for /opt/rb-relay/..venv.rb-staging
on a: rbprobes outside /opt/torch/.venv (refused with the files and packages named unless --force; on one machine, references outside the venv are said, not refused)
compression: decided at run time: on the relay, measured: the link'"'"'s rate (zeros through this machine for 0.6 s) against each compressor both ends have, packing a 16 MiB sample of the source on the source: the fastest way through; where that cannot run, and on the direct route, none if every machine the stream passes through runs one kernel (the same boot id: no link to save), else lz4 -1 if both ends have lz4, else zstd -1 if both ends have zstd, else none'
  [manifest]='on a: rbkit engine hash /opt/torch/.venv --exclude __pycache__ --exclude '"'"'*.pyc'"'"' --algo sha256 --jobs auto --scanned <preflight'"'"'s scan of it>
here: keep a copy in runs/relay/manifest.jsonl; send it to b
on b: engine current: if /opt/rb-relay/.venv/.rb-manifest.jsonl matches, skip the install
on b: engine stage: if it differs, link unchanged files from /opt/rb-relay/.venv into /opt/rb-relay/..venv.rb-staging, send only the rest'
  [transfer]='on b: engine stage: rm -rf /opt/rb-relay/..venv.rb-staging && mkdir /opt/rb-relay/..venv.rb-staging
on a: tar -C /opt/torch/.venv -b 256 --null --no-recursion -T <names to send> -cf - | <compress: decided at run time: on the relay, measured: the link'"'"'s rate (zeros through this machine for 0.6 s) against each compressor both ends have, packing a 16 MiB sample of the source on the source: the fastest way through; where that cannot run, and on the direct route, none if every machine the stream passes through runs one kernel (the same boot id: no link to save), else lz4 -1 if both ends have lz4, else zstd -1 if both ends have zstd, else none> (rbkit engine send)
  | through this machine (relay; streams side by side from 256 MB: one per two of the auto jobs, at most 8, jobs: the fewest of the three machines; each stream its own ssh clients here) |
on b: <decompress> | tar -C /opt/rb-relay/..venv.rb-staging -b 256 -xf - --no-same-owner (rbkit engine receive; how much tar has read, every 5 s)'
  [verify]='on b: engine verify /opt/rb-relay/..venv.rb-staging against the manifest (--jobs auto); the stamp relocate, prove and swap require'
  [relocate]='on b: engine relocate /opt/rb-relay/..venv.rb-staging --old /opt/torch/.venv --new /opt/rb-relay/.venv'
  [prove]='on b: /opt/rb-relay/..venv.rb-staging/bin/python -I -B -c '"'"'import sys; print(sys.prefix)'"'"' (within 120 s)'
  [swap]='on b: engine swap /opt/rb-relay/..venv.rb-staging /opt/rb-relay/.venv --policy replace
on b: /opt/rb-relay/.venv/bin/python -c '"'"'import sys; print(sys.prefix)'"'"'; each console script (one per interpreter line) started to its sys.prefix; on failure put back what was there'
  [exports]='on b: engine exports: write /opt/rb-relay/.venv.env.sh'
)
declare -rA RB_STEP_HOST=(
  [preflight]='a->b'
  [manifest]=a
  [transfer]='a->b'
  [verify]=b
  [relocate]=b
  [prove]=b
  [swap]=b
  [exports]=b
)

#######################################
# Runtime: logging, the step runner, host access. The same in every runbook.
#######################################
RB_STEP=''
RB_HOST=''
RB_LAST_CMD=''
RB_RUN_DIR=${RB_RUN_DIR:-}
RB_REPORT=${RB_REPORT:-}
# runs kept, seconds a second run waits (rb::run_dirs checks them)
RB_KEEP_RUNS=${RB_KEEP_RUNS:-20}
RB_LOCK_WAIT=${RB_LOCK_WAIT:-30}
RB_LOCAL_PY=python3
# how every Python this runbook starts on a host is started (rbrules.launch): isolated, by the
# path of the kit's entry file in a private directory, from a private working directory
readonly -a RB_PY_FLAGS=(-I -S -B)
readonly RB_PY_START=rbrules/start.py
# this machine's Python for the kit's local tools: the first python3 on PATH that is a program,
# not a script (a version manager's shim, pyenv's, runs a shell and its resolver at every start:
# 0.15 s on the machines we measure); `python3` when every one is a script. The start that reads
# the kit goes back to `python3` when that program is older than 3.9.
rb::local_python() {
  local dir head
  local -a dirs
  IFS=: read -r -a dirs <<<"${PATH:-}"
  for dir in "${dirs[@]}"; do
    if [[ -f "${dir:-.}/python3" && -x "${dir:-.}/python3" ]]; then
      head=''
      IFS= read -r -n 2 head <"${dir:-.}/python3" || true
      if [[ "${head}" != '#!' ]]; then
        RB_LOCAL_PY=${dir:-.}/python3
        return 0
      fi
    fi
  done
}
rb::local_python
RB_WORK=''
# this machine's kit: RB_WORK/kit (private, this run's), never the run directory
RB_LOCAL_KIT=''
# the run directory's lock this run holds (rb::run_lock)
RB_RUN_LOCK=''
# the runbook's directory: what later runs go on from (rb::run_dirs)
RB_STATE_DIR=''
# the probe rolled the install back: a re-run runs every step (rb::finish says so)
RB_ROLLED_BACK=0
RB_EVENTS=''
RB_STEP_START=0
RB_FINISHED=0
RB_DRY_RUN=0
RB_FAILED_STEP=''
# the last step that finished ok; the signal that interrupted this run (rb::on_signal)
RB_STEP_DONE=''
RB_SIGNALLED=0
declare -a RB_TREE=() RB_KILLED=()
RB_COMPRESSION_USED=none
declare -a RB_BG_PIDS=()
RB_STEP_DETAIL=''
declare -a RB_HOST_SSH=()
RB_HOST_TARGET=''
# the hosts preflight prepared; accept-new hosts whose key is new; where ssh records a host key
declare -a RB_PREPARE_HOSTS=() RB_KH_NEW=()
RB_KH_FILE='' RB_KH_NAME=''
declare -a RB_PROBE_REPORTS=()
declare -A RB_KIT_DIR=()
RB_KIT_TAR_SHA256=''
RB_ALLOW_EDITED=0
RB_FORCE=0
RB_EDITED=''
RB_SEAL_DONE=0
RB_SEAL_OUT=''
RB_CAUSE=''
RB_HINT=''
declare -A RB_PY=()
declare -A RB_HOST_COMP=()
declare -A RB_HOST_BOOT=()
RB_SOURCE_PID=''
RB_MANIFEST_PID=''
# the steps this run runs, in order (main)
RB_RUN_STEPS=()
RB_SOURCE_W=''
declare -A RB_J=()
RB_NOW=0
RB_ENGINE_PID=''
RB_ENGINE_LOCAL_PID=''
RB_ENGINE_W=''
RB_ENGINE_R=''
RB_ENGINE_STATUS=''
RB_ENGINE_DETAIL=''
declare -a RB_KIT_ARGV=()
RB_AUDIT_KEY=''
RB_SRC_STAT=''

#######################################
# Set RB_COMPRESSION_USED from the spec's compression and what the given hosts (the stream's ends)
# have (RB_HOST_COMP, said by rb::hosts_prepare): auto takes the first of RB_AUTO_COMPRESSION that
# every end has, else none; a named tool one end lacks fails.
#######################################
rb::choose_compression() {
  local tool host
  local -a tools=("${RB_COMPRESSION}")
  RB_COMPRESSION_USED=none
  case "${RB_COMPRESSION}" in
    none) return 0 ;;
    auto) tools=("${RB_AUTO_COMPRESSION[@]}") ;;
  esac
  for tool in "${tools[@]}"; do
    for host in "$@"; do
      if [[ ",${RB_HOST_COMP[${host}]:-}," != *",${tool},"* ]]; then
        if [[ "${RB_COMPRESSION}" != auto ]]; then
          rb::fail "compression ${RB_COMPRESSION} was asked for, but ${host} has no ${tool}"
        fi
        rb::log "compression: ${tool} missing on ${host}"
        continue 2
      fi
    done
    RB_COMPRESSION_USED=${tool}
    rb::log "compression: ${tool} (every end has it)"
    return 0
  done
  rb::log "compression: none (no end-to-end compressor of ${tools[*]})"
}

#######################################
# Whether every machine a stream from host $1 to host $2 passes through runs one kernel (the same
# boot id, RB_HOST_BOOT from rb::hosts_prepare): both hosts, and this machine when it relays ($3
# `relay`). Prints that boot id; returns 1 when they differ or one is not known.
#######################################
rb::one_kernel() {
  local boot=${RB_HOST_BOOT[$1]:--} here=''
  if [[ "${boot}" == - || "${RB_HOST_BOOT[$2]:--}" != "${boot}" ]]; then
    return 1
  fi
  if [[ "$3" == relay ]]; then
    IFS= read -r here 2>/dev/null </proc/sys/kernel/random/boot_id || return 1
    [[ "${here}" == "${boot}" ]] || return 1
  fi
  printf '%s\n' "${boot}"
}

#######################################
# Widen the pipe on stdout to 1 MiB (Linux's F_SETPIPE_SZ; pipe-max-size is 1 MiB for any user),
# where there is one; else leave it. Between the two ssh clients of the relay, a 64 KiB pipe makes
# them take turns: a null relay of 900 MB through the lab's multiplexed masters took 2.18 s, 1.90
# with 1 MiB; the whole runbook 4.98 -> 4.65 s, 0.5 s less CPU (7 rounds alternated).
#######################################
rb::wide_pipe() {
  "${RB_LOCAL_PY}" "${RB_PY_FLAGS[@]}" -c 'import fcntl, stat, os, sys
if sys.platform.startswith("linux") and stat.S_ISFIFO(os.fstat(1).st_mode):
    fcntl.fcntl(1, 1031, 1 << 20)' 2>/dev/null || true
}

#######################################
# The receiving end's answer on stdin, passed on to stdout but for its `progress BYTES` lines
# (every 5 s: how much of the tar stream its tar has read): each is a log line with the bytes, the
# percent of $1 (the stream's size, 0 when unknown), the rate and the time left since $2 (ms),
# and a `progress` event the timeline draws the rate from.
#######################################
rb::progress() {
  local total=$1 start=$2 line bytes ms rate have of speed
  while IFS= read -r line || [[ -n "${line}" ]]; do
    if [[ "${line}" != progress$'\t'* ]]; then
      printf '%s\n' "${line}"
      continue
    fi
    bytes=${line#progress$'\t'}
    [[ "${bytes}" =~ ^[0-9]+$ ]] || continue
    rb::now
    rb::event progress transfer "${RB_DST_HOST}" "${RB_NOW}" "${bytes}"
    ms=$((RB_NOW - start > 0 ? RB_NOW - start : 1))
    rate=$((bytes * 1000 / ms))
    rb::human have "${bytes}"
    rb::human speed "${rate}"
    line="${have}"
    if ((total > 0)); then
      # the size is an estimate (tar's headers and padding): never past 100%
      rb::human of "$((bytes > total ? bytes : total))"
      line+=" of ${of} ($((bytes >= total ? 100 : bytes * 100 / total))%)"
    fi
    line+=", ${speed}/s"
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
# Fail the current step with a message, said here once (the ERR trap then adds only the hint,
# the event and the report's row).
#######################################
rb::fail() {
  RB_LAST_CMD="$*"
  if [[ -n "${RB_WORK}" ]]; then
    # the third line marks a failure in words: the failure block shows it as the cause
    printf '%s\n%s\nfail\n' "${RB_HOST}" "${RB_LAST_CMD}" >"${RB_WORK}/last-command"
  fi
  rb::log "FAILED in step ${RB_STEP:-main} on host ${RB_HOST:-this machine}: $*"
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
    # the spec's options first: for ssh the first value of an option wins; the command starts in
    # this run's private kit directory there (`/` before it is made), never the login's directory
    words=$(rb::shq cd "${RB_KIT_DIR[${host}]:-/}")
    words+=" && $(rb::shq "$@")"
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
# The words that start MODULE ($3) of the kit in directory $2 with the Python $1, as
# `python -m MODULE` would but isolated (rbrules.launch: -I -S -B, the kit's entry file by its
# path, nothing from the working directory or the environment): sets RB_KIT_ARGV. Every start of
# the kit goes through here; where it starts is private (rb::_on_host, rb::init).
#######################################
rb::py_argv() {
  RB_KIT_ARGV=("$1" "${RB_PY_FLAGS[@]}" "$2/${RB_PY_START}" "$3")
}

#######################################
# The kit's command line on HOST as words ($2: the module, default rbkit): sets RB_KIT_ARGV.
#######################################
rb::kit_argv() {
  rb::py_argv "${RB_PY[$1]:-python3}" "${RB_KIT_DIR[$1]}" "${2:-rbkit}"
}

#######################################
# Run `rbkit ARGS...` on HOST.
#######################################
rb::kit() {
  local host=$1
  shift
  rb::kit_argv "${host}"
  rb::on_host "${host}" "${RB_KIT_ARGV[@]}" "$@"
}

#######################################
# The known_hosts file ssh records HOST's key in, and the name it records it under, as ssh
# itself reads the spec's options and this user's ssh config (ssh -G, which connects nowhere):
# into RB_KH_FILE and RB_KH_NAME ([name]:port off port 22, or the HostKeyAlias); where ssh
# connects (an alias of the spec's ssh_config resolved) into RB_KH_HOST and RB_KH_PORT.
#######################################
rb::known_hosts_of() {
  local key value name='' port=22 alias='' conf
  RB_KH_FILE=${HOME}/.ssh/known_hosts
  "rb::host_$1"
  conf=$(ssh "${RB_HOST_SSH[@]}" -G -- "${RB_HOST_TARGET}" 2>/dev/null) || true
  while read -r key value; do
    case "${key}" in
      hostname) name=${value} ;;
      port) port=${value} ;;
      hostkeyalias) alias=${value} ;;
      userknownhostsfile) RB_KH_FILE=${value%% *} ;;
    esac
  done <<<"${conf}"
  RB_KH_FILE=${RB_KH_FILE/#\~\//${HOME}/}
  RB_KH_HOST=${name:-${RB_HOST_TARGET#*@}} RB_KH_PORT=${port}
  RB_KH_NAME=${alias:-${RB_KH_HOST}}
  if [[ -z "${alias}" && "${port}" != 22 ]]; then
    RB_KH_NAME="[${RB_KH_NAME}]:${port}"
  fi
}

#######################################
# Before HOST is reached over ssh: each known_hosts file its options name (UserKnownHostsFile,
# GlobalKnownHostsFile; compile refused /dev, /proc, /sys and a user file /dev/null however
# spelled) is a regular file here. With host_keys: accept-new the first user file may be missing
# when ssh can make it: its folder exists, is this user's, and no one else can write it. A file
# ssh can neither read nor write knows no key, and accept-new then takes any key on every
# connection, a changed one too, without a word (issue 33 N5). Fails (rb::fail) naming the file,
# the host and the fix. The spec's ssh config file first (rb::ssh_config_ready).
#######################################
rb::known_hosts_ready() {
  local host=$1 word key file dir mode fix accept_new=0 first=1
  local -a files
  "rb::host_${host}"
  if [[ -z "${RB_HOST_TARGET}" ]]; then
    return 0
  fi
  rb::ssh_config_ready "${host}"
  for word in "${RB_HOST_SSH[@]}"; do
    if [[ "${word}" == StrictHostKeyChecking=accept-new ]]; then
      accept_new=1
    fi
  done
  for word in "${RB_HOST_SSH[@]}"; do
    key=${word%%=*}
    case "${key,,}" in
      userknownhostsfile | globalknownhostsfile) ;;
      *) continue ;;
    esac
    read -r -a files <<<"${word#*=}"
    for file in "${files[@]}"; do
      # ssh's ~/ is this user's home
      if [[ "${file}" == \~/* ]]; then
        file=${HOME}/${file#\~/}
      fi
      if [[ "${key,,}" == globalknownhostsfile && "${file}" == /dev/null ]] || [[ -f "${file}" ]]; then
        [[ "${key,,}" == userknownhostsfile ]] && first=0
        continue
      fi
      RB_HOST=${host}
      if [[ -e "${file}" ]]; then
        rb::fail "hosts.${host}: ${key} ${file} is not a regular file here (ssh reads and records" \
          "${host}'s host key in it): name a known_hosts file"
        return 1
      fi
      dir=${file%/*}
      dir=${dir:-/}
      if [[ "${key,,}" == userknownhostsfile ]] && ((accept_new && first)); then
        mode=$(stat -L -c %a -- "${dir}" 2>/dev/null) || mode=''
        if [[ -d "${dir}" && -O "${dir}" && -n "${mode}" ]] && ((!(8#${mode} & 8#022))); then
          first=0
          continue
        fi
        fix="mkdir -m 700 ${dir}"
        if [[ -d "${dir}" ]]; then
          fix="chown ${EUID} ${dir}; chmod go-w ${dir}"
        fi
        rb::fail "hosts.${host}: ${key} ${file} does not exist and ssh cannot make it there" \
          "(${dir} must be a folder of this user that no one else can write): with host_keys:" \
          "accept-new ssh would take any key of ${host}, a changed one too, on every connection." \
          "Make it one (${fix}), or name a known_hosts file that exists"
        return 1
      fi
      rb::fail "hosts.${host}: ${key} ${file} does not exist here: ssh would know no host key" \
        "of ${host} from it. Create it with ${host}'s key (ssh-keyscan, checked against the" \
        "host's own), or set hosts.${host}.host_keys: accept-new for a first contact, or name" \
        "the file that holds the key"
      return 1
    done
  done
}

#######################################
# Before the first connection: the hosts of HOSTS... with host_keys: accept-new whose key their
# known_hosts file does not hold yet (RB_KH_NEW); rb::known_hosts_after logs what ssh took.
#######################################
rb::known_hosts_before() {
  local host
  RB_KH_NEW=()
  for host in "$@"; do
    "rb::host_${host}"
    if [[ -n "${RB_HOST_TARGET}" && " ${RB_HOST_SSH[*]} " == *" StrictHostKeyChecking=accept-new "* ]]; then
      rb::known_hosts_of "${host}"
      if ! ssh-keygen -F "${RB_KH_NAME}" -f "${RB_KH_FILE}" >/dev/null 2>&1; then
        RB_KH_NEW+=("${host}")
      fi
    fi
  done
}

rb::known_hosts_after() {
  local host fp
  for host in "${RB_KH_NEW[@]}"; do
    rb::known_hosts_of "${host}"
    fp=$(ssh-keygen -lF "${RB_KH_NAME}" -f "${RB_KH_FILE}" 2>/dev/null | grep -v '^#' | head -n 1) || true
    if [[ -n "${fp}" ]]; then
      rb::log "${host}: its host key was accepted on first contact (hosts.${host}.host_keys:" \
        "accept-new) and recorded in ${RB_KH_FILE}: ${fp}"
    fi
  done
  RB_KH_NEW=()
}

#######################################
# Add to RB_HINT how to trust HOST's key: check it, add it to the file ssh reads (rb::known_hosts_of).
#######################################
rb::host_key_hint() {
  local port=''
  rb::known_hosts_of "$1"
  if [[ "${RB_KH_PORT}" != 22 ]]; then
    port=" -p ${RB_KH_PORT}"
  fi
  RB_HINT+="this machine does not trust $1's host key. Check its fingerprint with the host's"
  RB_HINT+=" owner (ssh-keyscan${port} ${RB_KH_HOST} | ssh-keygen -lf -), then add it to"
  RB_HINT+=" the known_hosts file ssh reads for it (ssh-keyscan${port} ${RB_KH_HOST} >> ${RB_KH_FILE}),"
  RB_HINT+=" or set hosts.$1.host_keys: accept-new in the spec for a first contact"
}

#######################################
# Before HOST is reached over ssh: the ssh config file its spec names (hosts.HOST.ssh_config, in
# RB_HOST_SSH after -F; compile refused /dev, /proc, /sys, `..` and relative paths) is a regular
# file here that only this user or root can change, nor any directory above it (rbrules.private
# --file): ssh runs the commands it names (ProxyCommand, Match exec, LocalCommand) on this machine
# as this user, even `ssh -G`. Fails (rb::fail) naming the file, the host and the fix.
#######################################
rb::ssh_config_ready() {
  local host=$1 i why me
  "rb::host_${host}"
  for ((i = 0; i + 1 < ${#RB_HOST_SSH[@]}; i++)); do
    if [[ "${RB_HOST_SSH[i]}" != -F ]]; then
      continue
    fi
    me=$(id -un)
    rb::py_argv "${RB_LOCAL_PY}" "${RB_LOCAL_KIT}" rbrules.private
    if ! why=$("${RB_KIT_ARGV[@]}" --file --what "hosts.${host}.ssh_config" \
      --fix "make it ${me}'s and not writable by others, in folders no one else can write" \
      -- "${RB_HOST_SSH[i + 1]}" 2>&1); then
      RB_HOST=${host}
      rb::fail "${why:-refusing hosts.${host}.ssh_config ${RB_HOST_SSH[i + 1]} (the check failed)}"
      return 1
    fi
  done
}

#######################################
# Prepare HOSTS... for the run, all at once (one background job each), one command and one reply
# per host: tar and python3 >= 3.9 are there, which compressors it has (RB_HOST_COMP), and the
# kit: this machine uses the run directory's copy; an ssh host gets a private directory made for
# this run (mktemp -d: 0700, owned by the ssh user), into which the kit's tar is sent and checked
# against its sha256 there before it is unpacked. Nothing is reused from an earlier run, so
# nothing another user of the host planted is ever run. rb::cleanup removes it. A host that fails
# is named (the first in the order given) once every host's job has ended.
#######################################
rb::hosts_prepare() {
  local host tar=${RB_WORK}/kit.tar out=${RB_WORK}/prepare
  local -A pids=() rcs=()
  # before ssh reads them: the known_hosts files the spec names (rb::known_hosts_ready)
  for host in "$@"; do
    rb::known_hosts_ready "${host}"
  done
  RB_PREPARE_HOSTS=("$@")
  rb::known_hosts_before "$@"
  for host in "$@"; do
    if [[ -n "${RB_KIT_DIR[${host}]:-}" ]]; then
      continue
    fi
    # RB_WORK empty: a job does not record itself as the command that ran last (the jobs race);
    # what ssh says goes to a file, shown once below with the host's name before it
    RB_WORK='' rb::host_prepare "${host}" "${tar}" >"${out}-${host}" 2>"${out}-${host}.err" &
    pids[${host}]=$!
    RB_BG_PIDS+=("$!")
  done
  # every job waited for, so that each kit directory made is known (rb::cleanup removes it)
  for host in "$@"; do
    if [[ -n "${pids[${host}]:-}" ]]; then
      rcs[${host}]=0
      wait "${pids[${host}]}" || rcs[${host}]=$?
    fi
    if [[ "${rcs[${host}]:-}" == 0 ]]; then
      IFS=$'\t' read -r RB_PY["${host}"] RB_KIT_DIR["${host}"] RB_HOST_COMP["${host}"] \
        RB_HOST_BOOT["${host}"] <"${out}-${host}" || true
    fi
    rb::said_on "${host}" "${out}-${host}.err" "${rcs[${host}]:-0}"
  done
  rb::known_hosts_after
  for host in "$@"; do
    if [[ -z "${rcs[${host}]:-}" ]]; then
      continue
    fi
    RB_HOST=${host}
    RB_LAST_CMD="on ${host}: check tar and python3 >= 3.9, receive the kit (sha256 ${RB_KIT_TAR_SHA256:0:12})"
    printf '%s\n%s\n' "${RB_HOST}" "${RB_LAST_CMD}" >"${RB_WORK}/last-command"
    if ((rcs[${host}] != 0)); then
      # this host's failure: the ERR trap names it and the cause (ssh's, asked again)
      return "${rcs[${host}]}"
    fi
    if [[ -z "${RB_PY[${host}]:-}" || -z "${RB_KIT_DIR[${host}]:-}" ]]; then
      rb::fail "${host} did not say how it was prepared"
    fi
    if rb::is_local "${host}"; then
      RB_KIT_DIR[${host}]=${RB_LOCAL_KIT}
    fi
  done
  if [[ -n "${pids[${RB_DST_HOST}]:-}" && -f "${RB_STATE_DIR}/manifest.jsonl" && ${#RB_RUN_STEPS[@]} -gt 0 &&
    " ${RB_RUN_STEPS[*]} " != *" manifest "* ]]; then
    # a --from/--only run without the manifest step goes on from the manifest this machine kept,
    # never one left on the host; sent beside the engines' start (rb::manifest_sent waits)
    RB_WORK='' rb::pipe_on_host "${RB_DST_HOST}" sh -c 'cat >"$1.part" && mv -f -- "$1.part" "$1"' rb \
      "${RB_KIT_DIR[${RB_DST_HOST}]}/${RB_NAME}.manifest.jsonl" <"${RB_STATE_DIR}/manifest.jsonl" &
    RB_MANIFEST_PID=$!
    RB_BG_PIDS+=("$!")
  fi
}

#######################################
# Give HOST the kit (and check its tools): rb::hosts_prepare of one host.
#######################################
rb::kit_ship() {
  rb::hosts_prepare "$1"
}

#######################################
# One host's preparation (rb::hosts_prepare): $1 the host, $2 the kit's tar here. Prints
# `PYTHON<TAB>KIT_DIR<TAB>COMPRESSORS<TAB>BOOT_ID` (KIT_DIR `-` for this machine, which uses the
# run directory's copy; BOOT_ID the running kernel's, `-` where there is none to read). A kit
# that arrives with another sha256 is removed unread.
#######################################
rb::host_prepare() {
  local host=$1 tar=$2 mode=ship
  if rb::is_local "${host}"; then
    mode=here
    tar=/dev/null
  fi
  rb::pipe_on_host "${host}" sh -c 'for t in tar python3; do command -v "$t" >/dev/null ||
      { echo "missing tool on this host: $t" >&2; exit 1; }; done
    comp=none
    for t in gzip lz4 zstd; do if command -v "$t" >/dev/null; then comp="${comp},$t"; fi; done
    dir=-
    if [ "$1" = ship ]; then
      dir=$(umask 077 && mktemp -d /tmp/rbkit.XXXXXXXXXX) || exit 1
      trap "rm -rf -- \"${dir}\"" EXIT
      cat >"${dir}/kit.tar" || exit 1
    fi
    py=$(python3 -I -S -B -c "import hashlib, sys
if sys.version_info < (3, 9): sys.exit(\"python3 here is older than 3.9: \" + sys.version.split()[0])
if sys.argv[1] != \"-\":
    got = hashlib.sha256(open(sys.argv[1] + \"/kit.tar\", \"rb\").read()).hexdigest()
    if got != sys.argv[2]: sys.exit(\"the kit arrived with sha256 %s, not %s\" % (got, sys.argv[2]))
print(sys.executable)" "${dir}" "$2") || exit 1
    if [ "$1" = ship ]; then
      tar -C "${dir}" -xf "${dir}/kit.tar" --no-same-owner --no-same-permissions || exit 1
      rm -f "${dir}/kit.tar" || exit 1
      trap - EXIT
    fi
    boot=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null) || boot=-
    printf "%s\t%s\t%s\t%s\n" "${py}" "${dir}" "${comp}" "${boot:--}"' rb "${mode}" "${RB_KIT_TAR_SHA256}" <"${tar}"
}

#######################################
# Copy the source's manifest (fingerprint $1) here (runs/NAME/manifest.jsonl) and on to the
# destination, in one pipeline; written aside and renamed there (both ends may be one host and
# one kit directory: the file being read). `-` for $1 (the transfer's background job, which has
# not read the fingerprint yet): copied, no fingerprint recorded; the transfer records it after.
#######################################
rb::manifest_share() {
  local src_kit dst_kit fingerprint=$1
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  dst_kit=$(rb::kit_dir "${RB_DST_HOST}")
  rb::kept_fingerprint ''
  rb::on_host "${RB_SRC_HOST}" cat "${src_kit}/${RB_NAME}.manifest.jsonl" |
    tee "${RB_STATE_DIR}/manifest.jsonl" |
    rb::pipe_on_host "${RB_DST_HOST}" sh -c 'cat >"$1.part" && mv -f -- "$1.part" "$1"' rb \
      "${dst_kit}/${RB_NAME}.manifest.jsonl" ||
    rb::pipe_failed "copying the source's manifest" "read on ${RB_SRC_HOST}" "keep here" \
      "write on ${RB_DST_HOST}" "${PIPESTATUS[@]}"
  if [[ "${fingerprint}" != - ]]; then
    rb::kept_fingerprint "${fingerprint}"
  fi
}

#######################################
# The fingerprint of the source manifest this machine keeps (runs/NAME/manifest.jsonl): with an
# argument, record it (the manifest was just written there; '' before it is written: none is
# known while it is rewritten); without, print it (empty when none is recorded).
#######################################
rb::kept_fingerprint() {
  local file=${RB_STATE_DIR}/manifest.fingerprint line=''
  if (($# > 0)); then
    rm -f "${file}"
    if [[ -n "$1" ]]; then
      printf '%s\n' "$1" >"${file}"
    fi
    return 0
  fi
  if [[ -f "${file}" && -f "${RB_STATE_DIR}/manifest.jsonl" ]]; then
    IFS= read -r line <"${file}" || true
  fi
  printf '%s\n' "${line}"
}

#######################################
# Wait for the kept manifest sent by rb::hosts_prepare, if one is on its way; the step fails
# when it did not arrive.
#######################################
rb::manifest_sent() {
  local pid=${RB_MANIFEST_PID}
  if [[ -z "${pid}" ]]; then
    return 0
  fi
  RB_MANIFEST_PID=''
  if ! wait "${pid}"; then
    RB_HOST=${RB_DST_HOST}
    rb::fail "could not send the manifest this machine kept (${RB_STATE_DIR}/manifest.jsonl) to ${RB_DST_HOST}"
  fi
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
    rb::signal_status "${codes[i]}"
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
# The sha256 of a small file here (the kit: coreutils' sha256sum, a few ms, where there is one;
# else hashlib, a Python start).
#######################################
rb::sha256() {
  local out
  if command -v sha256sum >/dev/null && out=$(sha256sum -b -- "$1"); then
    out=${out#\\}          # (a name with a backslash or newline: the line starts with one)
    printf '%s\n' "${out%% *}"
    return 0
  fi
  "${RB_LOCAL_PY}" "${RB_PY_FLAGS[@]}" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$1"
}

#######################################
# The variable named $1 (from the environment) as a whole number of at least $2; anything else is
# refused (exit 2) before anything is written.
#######################################
rb::env_number() {
  local -n value=$1
  if ! [[ "${value}" =~ ^[0-9]{1,9}$ ]] || ((10#${value} < $2)); then
    echo "refusing to run: $1=${value@Q} is not a whole number of at least $2" >&2
    exit 2
  fi
  value=$((10#${value}))
}

#######################################
# The relay's own rate, bytes a second: zeros streamed for 0.6 s from $1
# through this machine (a 1 MiB pipe, as the stream's) to $2 over the run's ssh connections (the
# ones the stream will use, with its cipher), counted and timed on $2 from the first byte to the last. The receiving
# end is started first and says `ready` before the sending end starts (a session that starts late
# is not the link); $3: a scratch path. Prints the rate; returns 1 when it could not be measured.
#######################################
rb::measure_link() {
  local from=$1 to=$2 out=$3 bytes='' first='' last='' ready='' fd rfd pid rc=0
  rm -f "${out}.in" "${out}.out"
  mkfifo -m 600 "${out}.in" "${out}.out"
  # shellcheck disable=SC2016 # $(...) is the far side's
  rb::pipe_on_host "${to}" sh -c 'echo ready; dd bs=1 count=1 of=/dev/null 2>/dev/null
a=$(date +%s%N); n=$(wc -c); b=$(date +%s%N); echo "$((n + 1)) $a $b"' \
    <"${out}.in" >"${out}.out" 2>/dev/null &
  pid=$!
  exec {fd}>"${out}.in" {rfd}<"${out}.out"
  read -r -t 10 -u "${rfd}" ready || true
  if [[ "${ready}" == ready ]]; then
    rb::wide_pipe >&"${fd}"
    # shellcheck disable=SC2016 # $? is the far side's
    rb::on_host "${from}" sh -c 'timeout "$1" cat /dev/zero; [ "$?" -eq 124 ]' rb \
      0.6 >&"${fd}" || rc=1
  fi
  exec {fd}>&-
  read -r -t 10 -u "${rfd}" bytes first last || true
  exec {rfd}<&-
  wait "${pid}" || rc=1
  if ((rc)) || [[ ! "${bytes}${first}${last}" =~ ^[0-9]+$ ]] || ((last - first < 50000000)); then
    return 1
  fi
  printf '%s\n' "$((bytes * 1000 / ((last - first) / 1000000)))"
}

#######################################
# compression: auto on the relay, measured beside the source's scan: started (in the background)
# once the destination's engine answered, unless that destination holds an install ($1, its
# source stat fingerprint: a re-run sends what changed, if anything; the fixed order then). The
# link's rate (rb::measure_link), then each compressor both ends have packing a sample of the
# source tree on the source (rbkit measure, which also takes the choice) into RB_WORK/measure.out.
#######################################
rb::measure_start() {
  local tool
  RB_MEASURE_ARGS=()
  RB_MEASURE_PID=''
  RB_MEASURE_SKIP=''
  if [[ "${RB_MEASURING:-0}" != 1 ]]; then
    return 0
  fi
  for tool in "${RB_AUTO_COMPRESSION[@]}"; do
    if [[ ",${RB_HOST_COMP[${RB_SRC_HOST}]:-}," == *",${tool},"* &&
      ",${RB_HOST_COMP[${RB_DST_HOST}]:-}," == *",${tool},"* ]]; then
      RB_MEASURE_ARGS+=(--tool "${tool}")
    fi
  done
  if [[ -n "$1" ]]; then
    RB_MEASURE_SKIP="not measured: ${RB_DST_HOST} holds an install (a re-run sends what changed)"
    return 0
  fi
  if ((${#RB_MEASURE_ARGS[@]} == 0)); then
    return 0
  fi
  if rb::one_kernel "${RB_SRC_HOST}" "${RB_DST_HOST}" relay >/dev/null; then
    RB_MEASURE_ARGS+=(--shared-cpu)
  fi
  rb::measure_run >"${RB_WORK}/measure.out" 2>"${RB_WORK}/measure.err" &
  RB_MEASURE_PID=$!
  RB_BG_PIDS+=("${RB_MEASURE_PID}")
}

#######################################
# The background job of rb::measure_start (RB_WORK empty: it records no command of its own).
#######################################
rb::measure_run() {
  local link out=${RB_WORK}/measure.link
  RB_WORK=''
  if ! link=$(rb::measure_link "${RB_SRC_HOST}" "${RB_DST_HOST}" "${out}"); then
    printf 'error\t%s\n' "the link's rate could not be measured (timeout, dd or wc missing on an end?)"
    return 0
  fi
  rb::kit "${RB_SRC_HOST}" measure "${RB_SRC_ABS}" "${RB_MEASURE_ARGS[@]}" \
    "${RB_EXCLUDE_ARGS[@]}" --link "${link}" --jobs "${RB_JOBS}" || true
}

#######################################
# The measurement's answer (rb::measure_start's job, waited for): RB_COMPRESSION_USED and its
# figures logged. Returns 1 (the caller falls back to the fixed order) when it did not run or
# could not measure, saying why.
#######################################
rb::measure_finish() {
  local key value choice='' why=''
  if [[ -n "${RB_MEASURE_SKIP}" ]]; then
    rb::log "compression: ${RB_MEASURE_SKIP}"
    return 1
  fi
  if [[ -z "${RB_MEASURE_PID}" ]]; then
    RB_COMPRESSION_USED=none
    rb::log "compression: none (no compressor of ${RB_AUTO_COMPRESSION[*]} on both ends)"
    return 0
  fi
  wait "${RB_MEASURE_PID}" || true
  while IFS=$'\t' read -r key value; do
    case "${key}" in
      choice) choice=${value} ;;
      why) why=${value} ;;
      json) rb::fact compression_measured "${value}" ;;
      error) why=${value} ;;
      *) ;;
    esac
  done <"${RB_WORK}/measure.out"
  if [[ -z "${choice}" ]]; then
    rb::log "compression: not measured on ${RB_SRC_HOST} (${why:-no answer})"
    return 1
  fi
  RB_COMPRESSION_USED=${choice}
  rb::log "compression: ${choice} (auto, measured: ${why})"
}

#######################################
# The relay's stream(s) through this machine (issue 37): `rbkit engine relay` here (the local
# kit) starts each stream as `ssh SRC send` piped into `ssh DST receive`, stream 0 over the run's
# connections, the others over their own (an ssh client is one cipher process); how many (the
# other routes' rule, also bounded by this machine's jobs), the split (on the source, as the
# other routes split) and the fall back to fewer when a host refuses a connection are its own.
# Its one answer (stream.Merged) goes through rb::progress into RB_WORK/receive.out.
# $1: the stream's size, $2: its start (ms), $3: the names on the source, then the sending end's
# words (the kit's on the source, `engine send ...`), `--` and the receiving end's (on the
# destination). Returns 1 with RB_RELAY_CODES (PIPESTATUS) when a stage failed.
#######################################
rb::relay_streams() {
  local total=$1 start=$2 list=$3 end host src_kit dst_kit send_words recv_words
  local -A ssh_of=() words_of=() skip=()
  local -a send=() recv=() relay
  shift 3
  while (($# > 0)) && [[ "$1" != -- ]]; do
    send+=("$1")
    shift
  done
  recv=("${@:2}")
  for end in src dst; do
    host=${RB_SRC_HOST}
    [[ "${end}" == src ]] || host=${RB_DST_HOST}
    "rb::host_${host}"
    ssh_of[${end}]=''
    if [[ -n "${RB_HOST_TARGET}" ]]; then
      ssh_of[${end}]=$(rb::shq ssh "${RB_HOST_SSH[@]}" "${RB_SSH_COMMON[@]}" -- "${RB_HOST_TARGET}")
    fi
    rb::kit_argv "${host}"
    words_of[${end}]=$(rb::shq "${RB_KIT_ARGV[@]}")
    skip[${end}]=${#RB_KIT_ARGV[@]}      # the kit's words before `engine send` / `engine receive`
  done
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  dst_kit=$(rb::kit_dir "${RB_DST_HOST}")
  send_words=$(rb::shq "${send[@]:${skip[src]}}" --jobs "${RB_JOBS}")
  recv_words=$(rb::shq "${recv[@]:${skip[dst]}}")
  rb::py_argv "${RB_LOCAL_PY}" "${RB_LOCAL_KIT}" rbkit
  relay=("${RB_KIT_ARGV[@]}" engine relay --jobs "${RB_JOBS}" --compression "${RB_COMPRESSION_USED}"
    --src-name "${RB_SRC_HOST}" --src-ssh="${ssh_of[src]}" --src-kit "${src_kit}"
    --src-words="${words_of[src]}" --dst-name "${RB_DST_HOST}" --dst-ssh="${ssh_of[dst]}"
    --dst-kit "${dst_kit}" --dst-words="${words_of[dst]}" --send="${send_words}"
    --receive="${recv_words}" --parts "${list}.parts")
  RB_RELAY_CODES=()
  "${relay[@]}" </dev/null | rb::progress "${total}" "${start}" >"${RB_WORK}/receive.out" ||
    RB_RELAY_CODES=("${PIPESTATUS[@]}")
  ((${#RB_RELAY_CODES[@]} == 0))
}

#######################################
# Make (or check) the directory $1, $2 what it is, the rest what to do instead: it must be
# private (rbrules.private: this user's, not writable by others, nor any directory above it by
# anyone but this user or root), or the run stops here (exit 2) before anything is written there.
#######################################
rb::private_dir() {
  local dir=$1 what=$2 why
  shift 2
  rb::py_argv "${RB_LOCAL_PY}" "${RB_LOCAL_KIT}" rbrules.private
  if ! why=$("${RB_KIT_ARGV[@]}" --make --what "${what}" --fix "$*" -- "${dir}" 2>&1); then
    printf '%s\n' "${why:-refusing ${what} ${dir} (the check failed)}" >&2
    exit 2
  fi
}

#######################################
# The runbook's directory (RB_STATE_DIR, default runs/NAME: what later runs go on from, the kept
# manifest, the audit's pass, the fan-out's bundle) and this run's own (RB_RUN_DIR: its log,
# events, report, probe reports): by default runs/NAME/<UTC time>-<pid>, with runs/NAME/latest
# naming the newest and the oldest past RB_KEEP_RUNS (default 20) removed; an RB_RUN_DIR set by
# hand is both. Each made private or refused (exit 2); the runbook's directory held (rb::run_lock)
# before anything is written in either.
#######################################
rb::run_dirs() {
  local me stamp old keep
  local -a runs=()
  rb::env_number RB_KEEP_RUNS 1
  rb::env_number RB_LOCK_WAIT 0
  me=$(id -un)
  if [[ -n "${RB_RUN_DIR}" && "${RB_RUN_DIR}" != /* ]]; then
    RB_RUN_DIR=${PWD}/${RB_RUN_DIR}
  fi
  RB_STATE_DIR=${RB_RUN_DIR:-${PWD}/runs/${RB_NAME}}
  if [[ -n "${RB_REPORT}" && "${RB_REPORT}" != /* ]]; then
    RB_REPORT=${PWD}/${RB_REPORT}
  fi
  rb::private_dir "${RB_STATE_DIR}" "the run directory" "set RB_RUN_DIR to a directory only" \
    "${me} can write (its parents too), or fix the one named"
  RB_STATE_DIR=$(cd "${RB_STATE_DIR}" && pwd -P)
  # a --plan writes only in a new directory of its own: it waits for no run and holds nothing
  if ((${RB_PLANNING:-0} == 0)); then
    rb::run_lock "${RB_LOCK_WAIT}"
  fi
  if [[ -z "${RB_RUN_DIR}" ]]; then
    stamp=$(TZ=UTC0 printf '%(%Y%m%dT%H%M%SZ)T' -1)
    RB_RUN_DIR=${RB_STATE_DIR}/${stamp}-$$
    mkdir -m 700 -- "${RB_RUN_DIR}"
    ln -s -- "${RB_RUN_DIR##*/}" "${RB_STATE_DIR}/.latest.$$"
    mv -Tf -- "${RB_STATE_DIR}/.latest.$$" "${RB_STATE_DIR}/latest"
    # the oldest runs' directories past RB_KEEP_RUNS (the names sort by their UTC time)
    shopt -s nullglob
    runs=("${RB_STATE_DIR}"/[0-9]*T[0-9]*Z-[0-9]*)
    shopt -u nullglob
    keep=${RB_KEEP_RUNS}
    if ((${#runs[@]} > keep)); then
      for old in "${runs[@]:0:${#runs[@]}-keep}"; do
        rm -rf -- "${old}"
      done
    fi
  fi
  RB_REPORT=${RB_REPORT:-${RB_RUN_DIR}/report.json}
  rb::private_dir "${RB_REPORT%/*}" "the directory of --report" "give --report a path in a" \
    "directory only ${me} can write"
}

#######################################
# Hold the runbook's directory for this run (a directory made there, holding this shell's pid):
# a second run of the runbook waits up to $1 seconds for the holder, naming it, then ends here
# (exit 1) before it writes anything; a holder that is gone (killed) is taken over. rb::cleanup
# lets go.
#######################################
rb::run_lock() {
  local lock=${RB_STATE_DIR}/.run-lock holder='' waited=0 said=0 taken=0
  while true; do
    if mkdir -m 700 -- "${lock}" 2>/dev/null; then
      printf '%s %s\n' "$$" "${HOSTNAME%%.*}" >"${lock}/holder"
      RB_RUN_LOCK=${lock}
      return 0
    fi
    holder=''
    if [[ -f "${lock}/holder" ]]; then
      read -r holder _ <"${lock}/holder" || holder=''
    fi
    if ! [[ "${holder}" =~ ^[0-9]+$ ]] || ! kill -0 "${holder}" 2>/dev/null; then
      # its holder is gone (killed), or has not written itself down a second after: taken over
      if ((taken >= 3)); then
        break
      elif [[ -n "${holder}" ]] || ((taken)); then
        rm -rf -- "${lock}"
        taken=$((taken + 1))
        continue
      fi
      taken=1
    elif ((waited >= $1)); then
      break
    elif ((!said)); then
      echo "waiting up to $1 s for another run of ${RB_NAME} (pid ${holder}) that holds" \
        "${RB_STATE_DIR} (RB_LOCK_WAIT)" >&2
      said=1
    fi
    sleep 1
    waited=$((waited + 1))
  done
  echo "refusing to run: another run of ${RB_NAME} (pid ${holder:-unknown}) still holds ${RB_STATE_DIR}" \
    "after ${waited} s; wait for it to end and run again (RB_LOCK_WAIT=SECONDS waits longer)," \
    "or give this run a directory of its own (RB_RUN_DIR=DIR)" >&2
  exit 1
}

#######################################
# Refuse to run a runbook edited by hand (its sha256 line no longer matches its text) or one whose
# spec (any file of its extends chain, found at its recorded path from this runbook's folder)
# changed since it was compiled; a file not found there is named (`spec not checked: ...`) and the
# run goes on. --allow-edited runs it anyway and says so in the log and the report. The seal
# catches accidental edits and stale specs, not tampering: whoever can edit the runbook can
# recompute its hash (docs/design.md, "The seal").
# Sets RB_EDITED to what differs. Returns 1 to refuse.
#######################################
rb::check_sealed() {
  local out line found=''
  if ((RB_SEAL_DONE)); then
    out=${RB_SEAL_OUT}         # the start-up lines that read the kit checked already
  elif ! out=$(cd / && "${RB_LOCAL_PY}" "${RB_PY_FLAGS[@]}" - "${RB_SELF_ABS}" "${RB_SPEC_FILES[@]}" <<'PY'
import sys

def seal_findings(runbook, spec_items):
    """Lines saying what was edited since compile: the runbook's own text (its sha256 line no
    longer matches) and each spec file of `spec_items` (NAME, PATH, SHA256, three words each;
    PATH from the runbook's own folder, whatever the working directory) that changed. A file not
    there is not checked, and a line `spec not checked: NAME not found from here` says so."""
    import hashlib
    import os
    import re

    found = []
    try:
        with open(runbook, "rb") as f:
            data = f.read()
    except OSError as exc:
        return [f"this runbook's own text could not be read to check it ({runbook}: {exc.strerror})"]
    seal = re.search(rb"^# sha256 of this file with these 64 digits zeroed: ([0-9a-f]{64})$", data,
                     re.M)
    if not seal or hashlib.sha256(data[:seal.start(1)] + b"0" * 64 + data[seal.end(1):]) \
            .hexdigest() != seal.group(1).decode():
        found.append("this runbook was edited after it was compiled")
    here = os.path.dirname(os.path.realpath(runbook))
    for at in range(0, len(spec_items) - 2, 3):
        name, path, want = spec_items[at:at + 3]
        try:
            with open(os.path.join(here, path), "rb") as f:
                got = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            found.append(f"spec not checked: {name} not found from here")
            continue
        if got != want:
            found.append(f"{name} changed since this runbook was compiled")
    return found


print("\n".join(seal_findings(sys.argv[1], sys.argv[2:])))
PY
  ); then
    echo "could not check this runbook's own hash (python3 failed)" >&2
    return 1
  fi
  # a spec file not found from the runbook's folder is said, not refused: a copied runbook
  while IFS= read -r line; do
    if [[ "${line}" == "spec not checked: "* ]]; then
      printf '%s\n' "${line}" >&2
    elif [[ -n "${line}" ]]; then
      found+=${found:+$'\n'}${line}
    fi
  done <<<"${out}"
  out=${found}
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
  rb::manifest_sent
  "step_${id}"
  if [[ -n "${RB_APPLY_PLAN:-}" && "${id}" == preflight ]]; then
    rb::apply_check     # --apply: refused when the source or destination moved since the plan
  fi
  detail=${RB_STEP_DETAIL}
  rb::now
  rb::event step "${id}" ok "${RB_STEP_START}" "${RB_NOW}" "${RB_STEP_HOST[${id}]}" "${detail}"
  rb::log "step ${id}: ok${detail:+ (${detail})}"
  RB_STEP=''
  RB_STEP_DONE=${id}
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
  if ((RB_SIGNALLED)); then
    return 0     # a signal is being handled (rb::on_signal): it reports and exits
  fi
  rb::signal_status "${rc}"
  set +e
  # the command that ran last, also when it ran in a subshell (whose variables are gone)
  if [[ -n "${RB_WORK}" && -f "${RB_WORK}/last-command" ]]; then
    { read -r RB_HOST; read -r RB_LAST_CMD; read -r said || true; } <"${RB_WORK}/last-command"
  fi
  what=$(rb::short "${RB_LAST_CMD:-${BASH_COMMAND}}") || true
  if [[ "${said:-}" == fail ]]; then
    RB_CAUSE=${RB_LAST_CMD}   # rb::fail said it in words, logged above as FAILED
    RB_HINT=''
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
# --plan: every host reached read-only (the kit in a private directory made for this run there,
# removed after), the route and compression chosen as a run chooses them, the source scanned and
# its static checks run, the destination's state read by `rbkit liveplan state` (no lock taken,
# nothing written beside it), then the plan composed here: the screen on stdout; plan.json,
# changes.txt (one line a path, rsync -i like) and, with $1 = 1, plan.md in this run's
# directory. Exits 1 naming every host it cannot reach, or when something blocks the run.
#######################################
rb::live_plan() {
  local markdown=$1 dir=${RB_RUN_DIR} src_kit host rc=0 down='' up='' line key
  local route_why compression_why also='' installed=''
  local -a flags=()
  RB_STEP=plan
  rb::hosts_prepare "${RB_HOSTS[@]}" || true
  for host in "${RB_HOSTS[@]}"; do
    if [[ -n "${RB_KIT_DIR[${host}]:-}" ]]; then
      up+="${up:+, }${host}"
    else
      down+="${down:+, }${host}"
    fi
  done
  if [[ -n "${down}" ]]; then
    RB_HOST=${down}
    rb::fail "cannot reach ${down} (each said why above); nothing was planned"
  fi
  rb::preflight_route 2>"${RB_WORK}/plan-how"
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  rb::source_start "${src_kit}/${RB_NAME}.names"
  # meanwhile the destination, read-only: its entries, free space, backups; its install's record
  RB_HOST=${RB_DST_HOST}
  rb::kit "${RB_DST_HOST}" liveplan state "${RB_DST_ABS}" \
    --choices "${RB_ENGINE_CHOICES}" >"${dir}/dest.state"
  : >"${dir}/installed.jsonl"
  IFS= read -r line <"${dir}/dest.state" || line=''
  if [[ "${line}" == *'"installed": true'* ]]; then
    rb::on_host "${RB_DST_HOST}" cat "${RB_DST_ABS}/.rb-manifest.jsonl" >"${dir}/installed.jsonl"
  fi
  if [[ "${line}" =~ \"installed_source_stat\":\ \"([0-9a-f]+)\" ]]; then
    installed=${BASH_REMATCH[1]}
  fi
  # the static checks are skipped, as preflight skips them, for the tree they passed with here
  rb::source_finish "${installed}"
  local -A src=()
  for key in files bytes need_bytes stat_fingerprint audit_rc audit_failed audit_skipped; do
    src[${key}]=${RB_J[${key}]:-}
  done
  # the compression matters only when something is sent: not measured for a source that is the
  # tree the destination's install recorded (its stat fingerprint)
  if [[ -n "${installed}" && "${installed}" == "${src[stat_fingerprint]}" ]]; then
    rb::log "compression: not measured (the source is the tree the destination's install recorded)" \
      2>>"${RB_WORK}/plan-how"
  else
    rb::preflight_compression 2>>"${RB_WORK}/plan-how"
  fi
  cat "${RB_WORK}/plan-how" >>"${dir}/run.log"
  route_why=$(sed -n 's/^.*\] route: //p' "${RB_WORK}/plan-how")
  compression_why=$(sed -n 's/^.*\] compression: //p' "${RB_WORK}/plan-how")
  rb::on_host "${RB_SRC_HOST}" cat "${src_kit}/${RB_NAME}.names.stat" >"${dir}/source.scan"
  ((RB_INCREMENTAL)) && flags+=(--incremental)
  if ((markdown)); then
    flags+=(--markdown)
    also=', plan.md'
  fi
  ((RB_FORCE)) && flags+=(--force)
  [[ "${RB_SRC_HOST}" == "${RB_DST_HOST}" ]] && flags+=(--same-host)
  rb::py_argv "${RB_LOCAL_PY}" "${RB_LOCAL_KIT}" rbkit
  "${RB_KIT_ARGV[@]}" liveplan compose --dir "${dir}" --name "${RB_NAME}" \
    --spec-sha "${RB_SPEC_SHA256}" --kit-sha "${RB_KIT_SHA256}" \
    --made "$(TZ=UTC0 printf '%(%Y-%m-%dT%H:%M:%SZ)T' -1)" --src-host "${RB_SRC_HOST}" \
    --src-path "${RB_SRC_ABS}" --dst-host "${RB_DST_HOST}" --route "${RB_ROUTE_USED:-}" \
    --route-why "${route_why}" --compression "${RB_COMPRESSION_USED}" \
    --compression-why "${compression_why}" --hosts "${up}: reachable (kit in a private directory, removed after)" \
    --choices "${RB_ENGINE_CHOICES}" \
    --source-files "${src[files]:-0}" --source-bytes "${src[bytes]:-0}" \
    --need-bytes "${src[need_bytes]:-0}" --audit-rc "${src[audit_rc]:-2}" \
    --audit-failed "${src[audit_failed]}" --audit-skipped "${src[audit_skipped]}" --arch "${RB_AUDIT_ARCH}" \
    --checks "${RB_PROBE_CONFIG:-}" "${flags[@]}" || rc=$?
  printf '\nplan: %s/plan.json%s; to run exactly it: bash %s --apply %s/plan.json\n' "${dir}" "${also}" \
    "${RB_SELF}" "${dir}"
  RB_FINISHED=1
  exit "${rc}"
}

# the plan --apply runs (rb::apply_read): its digests of the source and the destination
declare -A RB_PLAN=()

#######################################
# --apply PLAN, before anything runs: the plan is this runbook's (same spec and kit) and nothing
# blocked it; its digests into RB_PLAN. Refused otherwise (exit 1).
#######################################
rb::apply_read() {
  local key value out
  rb::py_argv "${RB_LOCAL_PY}" "${RB_LOCAL_KIT}" rbkit
  if ! out=$("${RB_KIT_ARGV[@]}" liveplan read "$1" --name "${RB_NAME}" --spec-sha "${RB_SPEC_SHA256}" \
    --kit-sha "${RB_KIT_SHA256}"); then
    exit 1
  fi
  while IFS=$'\t' read -r key value; do
    RB_PLAN[${key}]=${value}
  done <<<"${out}"
  rb::log "applying the plan ${1} (made against source scan ${RB_PLAN[source_stat]:0:12}," \
    "destination state ${RB_PLAN[dest_digest]:0:12})"
}

#######################################
# --apply, once preflight holds the destination's lock: the source's scan and the destination's
# state against the plan's. What moved since is named (which side, how many paths, the first
# few) and the run ends here (exit 1), before anything is written at the destination.
#######################################
rb::apply_check() {
  local src_kit out moved=''
  local -a drift
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  rb::py_argv "${RB_LOCAL_PY}" "${RB_LOCAL_KIT}" rbkit
  drift=("${RB_KIT_ARGV[@]}" liveplan drift --plan "${RB_APPLY_PLAN}")
  if [[ "${RB_SRC_STAT}" != "${RB_PLAN[source_stat]}" ]]; then
    rb::on_host "${RB_SRC_HOST}" cat "${src_kit}/${RB_NAME}.names.stat" >"${RB_RUN_DIR}/apply-source.scan"
    out=$("${drift[@]}" --side source --now "${RB_RUN_DIR}/apply-source.scan") || true
    moved+="the source ${RB_SRC_HOST}:${RB_SRC_ABS}: ${out%%$'\t'*} paths (${out#*$'\t'}); "
  fi
  rb::kit "${RB_DST_HOST}" liveplan state "${RB_DST_ABS}" \
    --choices "${RB_ENGINE_CHOICES}" >"${RB_RUN_DIR}/apply-dest.state"
  if ! out=$("${drift[@]}" --side dest --now "${RB_RUN_DIR}/apply-dest.state"); then
    moved+="the destination ${RB_DST_HOST}:${RB_DST_ABS}: ${out%%$'\t'*} paths (${out#*$'\t'}); "
  fi
  if [[ -n "${moved}" ]]; then
    rb::fail "refusing to apply ${RB_APPLY_PLAN}: changed since the plan was made: ${moved}nothing" \
      "was written at the destination; make a new plan: bash ${RB_SELF} --plan"
  fi
  rb::log "the plan holds: the source and the destination are as the plan saw them"
  rb::apply_compression "${RB_PLAN[compression]:-}"
}

#######################################
# --apply: the stream's compression is the plan's ($1) where both ends still have it (a measured
# choice follows the link's rate of the moment: preflight's may differ); said when it differs.
#######################################
rb::apply_compression() {
  local want=$1
  if [[ -z "${want}" || "${want}" == "${RB_COMPRESSION_USED}" ]]; then
    return 0
  fi
  if [[ ",${RB_HOST_COMP[${RB_SRC_HOST}]:-}," == *",${want},"* &&
    ",${RB_HOST_COMP[${RB_DST_HOST}]:-}," == *",${want},"* ]]; then
    rb::log "compression: ${want}, as the plan chose (preflight chose ${RB_COMPRESSION_USED} now)"
    RB_COMPRESSION_USED=${want}
    RB_STEP_DETAIL=${RB_STEP_DETAIL/%compression */compression ${want}}
  else
    rb::log "compression: ${RB_COMPRESSION_USED}, not the plan's ${want}: an end no longer has it"
  fi
}

#######################################
# INT, TERM, HUP ($1: which; main traps them): the destination is only ever replaced by the swap
# step, so stopping is safe. A terminal's Ctrl-C (or its closing) reaches every process of the
# run's group: the stream's stages and ssh clients die, the log's copy (rb::init's tee, which
# ignores them) stays.
# Further signals are ignored from here on (they would cut the report short), and the report is
# of this run. Exit 130, whichever the signal.
#######################################
rb::on_signal() {
  trap '' INT TERM HUP PIPE
  trap - ERR
  if ((BASHPID != $$)); then
    exit 130
  fi
  if ((RB_SIGNALLED)); then
    return 0
  fi
  local where="in step ${RB_STEP:-main}"
  RB_SIGNALLED=1
  set +e
  if [[ -z "${RB_STEP}" && -n "${RB_STEP_DONE}" ]]; then
    where="after step ${RB_STEP_DONE}, before the next"
  fi
  rb::log "interrupted ${where} (SIG$1); the destination was not replaced unless the swap step" \
    "had finished"
  if [[ -n "${RB_STEP}" ]]; then
    rb::now
    rb::event step "${RB_STEP}" interrupted "${RB_STEP_START}" "${RB_NOW}" "${RB_HOST}" "SIG$1"
  fi
  RB_FAILED_STEP=${RB_STEP}
  rb::finish interrupted
  exit 130
}

#######################################
# A command that ended by SIGHUP, SIGINT or SIGTERM (status $1: 129, 130, 143) means the run was
# signalled: handled as the signal itself (rb::on_signal), also when this shell's own trap has not
# run yet (a signal landing as a pipeline starts). Other statuses: nothing.
#######################################
rb::signal_status() {
  case "$1" in
    129) rb::on_signal HUP ;;
    130) rb::on_signal INT ;;
    143) rb::on_signal TERM ;;
    *) ;;
  esac
}

#######################################
# The step a re-run should start from: the one that failed or was interrupted ($1), else the one
# after the last that finished; relocate, prove and swap install only a staging this run
# verified, so they go on from verify. Empty when every step had finished.
#######################################
rb::resume_step() {
  local id=$1 i
  if [[ -z "${id}" ]]; then
    id=${RB_RUN_STEPS[0]:-}
    for i in "${!RB_RUN_STEPS[@]}"; do
      if [[ "${RB_RUN_STEPS[i]}" == "${RB_STEP_DONE}" ]]; then
        id=${RB_RUN_STEPS[i + 1]:-}
      fi
    done
  fi
  case "${id}" in
    relocate | prove | swap) id=verify ;;
    *) ;;
  esac
  printf '%s' "${id}"
}

#######################################
# Kill each of the given processes and everything they started (an ssh client, a kit's Python,
# its tar): all found first, then TERM to all at once.
#######################################
rb::kill_tree() {
  local pid
  RB_TREE=()
  for pid in "$@"; do
    rb::tree_pids "${pid}"
  done
  kill -TERM "${RB_TREE[@]}" 2>/dev/null || true
}

rb::tree_pids() {
  local kids kid
  RB_TREE+=("$1")
  kids=$(pgrep -P "$1" 2>/dev/null) || return 0
  for kid in ${kids}; do
    rb::tree_pids "${kid}"
  done
}

#######################################
# Wait for the given jobs at most $1 seconds in all; those still running then are killed with
# what they started (into RB_KILLED). Returns 1 when one had to be killed.
#######################################
rb::wait_bounded() {
  local deadline=$(($1 * 10)) pid rc=0
  shift
  while ((deadline > 0)); do
    for pid in "$@"; do
      if kill -0 "${pid}" 2>/dev/null; then
        sleep 0.1
        deadline=$((deadline - 1))
        continue 2
      fi
    done
    break
  done
  RB_KILLED=()
  for pid in "$@"; do
    if kill -0 "${pid}" 2>/dev/null; then
      rb::kill_tree "${pid}"
      RB_KILLED+=("${pid}")
      rc=1
    fi
    wait "${pid}" 2>/dev/null || true
  done
  return "${rc}"
}

#######################################
# On exit, every host at once: its kit directory removed, then its ssh connection closed. A host
# that does not answer (a link or sshd lost mid-run) or whose rm fails keeps it, and the log says
# where; none holds the prompt: 5 s for all, then its ssh is killed.
#######################################
rb::close_hosts() {
  local host
  local -A ends=()
  for host in "${RB_HOSTS[@]}"; do
    {
      if [[ -n "${RB_KIT_DIR[${host}]:-}" ]] && ! rb::is_local "${host}" &&
        ! rb::on_host "${host}" rm -rf -- "${RB_KIT_DIR[${host}]}" 2>/dev/null; then
        RB_STEP=cleanup rb::log "left on ${host}: ${RB_KIT_DIR[${host}]} (this run's kit; the host" \
          "did not answer, or rm there failed): remove it there"
      fi
      rb::close_master "${host}"
    } &
    ends[${host}]=$!
  done
  if ((${#ends[@]} == 0)) || rb::wait_bounded 5 "${ends[@]}"; then
    return 0
  fi
  for host in "${!ends[@]}"; do
    if [[ " ${RB_KILLED[*]} " == *" ${ends[${host}]} "* && -n "${RB_KIT_DIR[${host}]:-}" ]] &&
      ! rb::is_local "${host}"; then
      RB_STEP=cleanup rb::log "left on ${host}: ${RB_KIT_DIR[${host}]} (this run's kit; the host" \
        "did not answer within 5 s): remove it there"
    fi
    rb::close_master "${host}"
  done
}

rb::close_master() {
  "rb::host_$1"
  if [[ -n "${RB_HOST_TARGET}" ]]; then
    timeout 2 ssh "${RB_HOST_SSH[@]}" "${RB_SSH_COMMON[@]}" -O exit -- "${RB_HOST_TARGET}" \
      2>/dev/null || true
  fi
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
# Log $2 (what HOST $1's preparation printed: ssh's words) once, each line after the host's
# name; the file is kept for rb::cause when it failed ($3 not 0).
#######################################
rb::said_on() {
  local line
  [[ -f "$2" ]] || return 0
  while IFS= read -r line || [[ -n "${line}" ]]; do
    line=${line%$'\r'}
    if [[ -n "${line}" ]]; then
      rb::log "$1: ${line}"
    fi
  done <"$2"
  if (($3 == 0)); then
    rm -f -- "$2"
  fi
}

#######################################
# Set RB_CAUSE (what failed, in words) and RB_HINT (what to do, or empty) for exit status $1 of
# the last host command. ssh's own failures (status 255): its words from preflight's preparation
# (shown above, once), else asked again in a few seconds, say why: refused, unreachable, a name
# that does not resolve, or a host key this machine does not trust (every such host named).
#######################################
rb::cause() {
  local rc=$1 why port host=${RB_HOST:-} name said h words=''
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
  said=${RB_WORK}/prepare-${host}.err
  if [[ -s "${said}" ]]; then
    why=$(tr -d '\r' <"${said}" | grep -v '^Warning' | tail -n 1) || true
  else
    why=$(timeout 20 ssh "${RB_HOST_SSH[@]}" "${RB_SSH_COMMON[@]}" -o ControlPath=none \
      -o ConnectTimeout=8 -- "${RB_HOST_TARGET}" true 2>&1 >/dev/null | tr -d '\r' | grep -v '^Warning' |
      tail -n 1) || true
    said=''
  fi
  port=$(rb::port_of) || true
  name=${RB_HOST_TARGET#*@}
  case "${why}" in
    *"Host key verification failed"* | *"No "*"host key is known"* | *"HOST IDENTIFICATION HAS CHANGED"*)
      words="this machine does not trust its host key"
      rb::host_key_hint "${host}"
      for h in "${RB_PREPARE_HOSTS[@]}"; do
        if [[ "${h}" != "${host}" ]] && grep -qE 'verification failed|host key is known|HAS CHANGED' \
          "${RB_WORK}/prepare-${h}.err" 2>/dev/null; then
          words+="; nor ${h}'s"
          RB_HINT+=". The same for ${h}: "
          rb::host_key_hint "${h}"
        fi
      done
      ;;
    *"Could not resolve"* | *"Name or service"* | *"name resolution"*)
      words="the name ${name} does not resolve on this machine (no DNS or /etc/hosts entry)"
      RB_HINT="check the host name in hosts.${host}.ssh in the spec (a typo?), or make ${name} resolve here"
      ;;
    *"Permission denied"*)
      words="it did not accept this runbook's key for ${RB_HOST_TARGET%@*}"
      RB_HINT="the key this runbook uses is not accepted there: check hosts.${host}.ssh (user)"
      RB_HINT+=" and identity_file"
      ;;
    *"Connection refused"* | *"timed out"* | *"No route"*)
      words="no ssh server answered there (${why##*: })"
      words=${words,,}
      RB_HINT="check that ${name} is up and its sshd listens there (hosts.${host}.ssh and port in the spec)"
      ;;
  esac
  # ssh's own words: shown above once with the host's name, else here
  RB_CAUSE="cannot reach ${host} (${RB_HOST_TARGET}${port}): ${words:-${why:-ssh exited 255}}"
  if [[ -n "${words}" && -z "${said}" && -n "${why}" ]]; then
    RB_CAUSE+=" (${why})"
  fi
}

#######################################
# ", port N" when the host's ssh words name a port.
#######################################
rb::port_of() {
  local i
  for ((i = 0; i < ${#RB_HOST_SSH[@]}; i++)); do
    if [[ "${RB_HOST_SSH[i]}" == -p ]]; then
      printf ', port %s' "${RB_HOST_SSH[i + 1]}"
      return 0
    fi
  done
}

#######################################
# Read one answer of the engine from stdin, lines of `set KEY VALUE` (into RB_J), `event JSON`
# (into the event log, under the current step), `log TEXT` (a traceback: into run.log only, never
# the terminal), `ping` (ignored) and last `done STATUS DETAIL`
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
      log)
        if [[ -n "${RB_RUN_DIR:-}" && -f "${RB_RUN_DIR}/run.log" ]]; then
          printf '%s\n' "${a}${b:+ ${b}}" >>"${RB_RUN_DIR}/run.log"
        fi
        ;;
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
# The source before anything moves, in one engine process there (rbkit engine source), started
# in the background by rb::source_start and read by rb::source_finish: the scan (a venv after
# the excludes; what the threat model refuses), then the static checks (issue #16): the kernel
# audit for the target's arch (a spec with gpu:) and the references that leave the venv
# (editable installs, .pth paths, links out of the tree). Between the two the engine waits for
# the source stat fingerprint the destination's install recorded (rb::source_finish's $1, from
# the destination's engine, which starts meanwhile): the checks are skipped when, and only when,
# the source's equals it and the checks passed here for that tree with the same settings.
# rb::source_start's $1: where the source writes the names of what it sends (empty: nowhere).
#######################################
rb::source_start() {
  local fifo=${RB_WORK}/source passed='' beside=auto
  local -a audit=(outside "${RB_SRC_ABS}") names=()
  if [[ -n "$1" ]]; then
    names=(--names "$1")
  fi
  if [[ -n "${RB_AUDIT_ARCH}" ]]; then
    audit=(preflight --venv "${RB_SRC_ABS}" --arch "${RB_AUDIT_ARCH}" "${RB_AUDIT_ARGS[@]}")
  fi
  # what the checks ran with: a skip also needs the last pass to have had these settings
  RB_AUDIT_KEY=$(printf '%q ' "${RB_SRC_HOST}" "${audit[@]}")
  RB_AUDIT_KEY=${RB_AUDIT_KEY% }
  # on a host with cores to spare the checks run beside the scan: from its start, or, when they
  # passed here before with these settings (a re-run may skip them), from rb::source_finish's word
  passed=$(rb::audit_passed)
  if [[ "${passed#* }" == "${RB_AUDIT_KEY}" ]]; then
    beside=no
  fi
  rb::kit_argv "${RB_SRC_HOST}"
  mkfifo -m 600 "${fifo}.in"
  # a background job: RB_WORK empty, it does not record itself as the command that ran last
  RB_WORK='' rb::pipe_on_host "${RB_SRC_HOST}" "${RB_KIT_ARGV[@]}" engine source "${RB_SRC_ABS}" \
    "${RB_EXCLUDE_ARGS[@]}" "${names[@]}" --special-modes "${RB_SPECIAL_MODES}" \
    --outside-links "${RB_OUTSIDE_LINKS}" --installed-stat - --checks-beside "${beside}" \
    --audit "${audit[@]}" \
    <"${fifo}.in" >"${fifo}.out" &
  RB_SOURCE_PID=$!
  RB_BG_PIDS+=("${RB_SOURCE_PID}")
  exec {RB_SOURCE_W}>"${fifo}.in"
}

#######################################
# The record rb::preflight_audit writes when the checks pass (not when --force moved a failing
# tree): `STAT_FINGERPRINT AUDIT_KEY`, or nothing.
#######################################
rb::audit_passed() {
  local line=''
  if [[ -f "${RB_STATE_DIR}/audit-passed" ]]; then
    IFS= read -r line <"${RB_STATE_DIR}/audit-passed" || line=''
  fi
  printf '%s\n' "${line}"
}

#######################################
# Give the source's engine the stat fingerprint the destination's install recorded ($1, empty:
# none), wait for its answer and read it (RB_J); the step fails with the engine's reason.
#######################################
rb::source_finish() {
  local rc=0 installed=$1 passed=''
  # the checks are skipped only for the tree they passed with here, with these settings
  passed=$(rb::audit_passed)
  if [[ "${passed}" != "${installed} ${RB_AUDIT_KEY}" ]]; then
    installed=''
  fi
  # a source engine that is gone must fail this step, not end this shell with SIGPIPE
  trap '' PIPE
  printf '%s\n' "${installed}" >&"${RB_SOURCE_W}" || true
  trap - PIPE
  exec {RB_SOURCE_W}>&-
  RB_HOST=${RB_SRC_HOST}
  RB_LAST_CMD="on ${RB_SRC_HOST}: rbkit engine source ${RB_SRC_ABS}"
  printf '%s\n%s\n' "${RB_HOST}" "${RB_LAST_CMD}" >"${RB_WORK}/last-command"
  wait "${RB_SOURCE_PID}" || rc=$?
  if ! rb::engine_read <"${RB_WORK}/source.out" || ((rc != 0)); then
    rb::fail "${RB_ENGINE_DETAIL:-rbkit engine source on ${RB_SRC_HOST} exited ${rc} (above)}"
  fi
}

#######################################
# Judge the static checks rb::source_check ran (RB_J: audit_rc, audit_failed, audit_skipped,
# audit_what). A failure is refused with the files and packages named (the engine logged them),
# unless --force. When both ends are one machine, references that leave the venv still resolve
# there: they are said, not refused.
#######################################
rb::preflight_audit() {
  local rc=${RB_J[audit_rc]:-2} failed=${RB_J[audit_failed]:-}
  if [[ "${RB_J[audit_skipped]:-0}" == 1 ]]; then
    rb::log "static checks on the source: skipped, it is the tree the destination's install" \
      "recorded (same stat fingerprint: path, type, mode, size, link, mtime of every entry)"
    return 0
  fi
  if ((rc == 0)) || { ((rc == 1)) && [[ -z "${failed}" ]]; }; then
    printf '%s %s\n' "${RB_SRC_STAT}" "${RB_AUDIT_KEY}" >"${RB_STATE_DIR}/audit-passed"
    if ((rc == 0)); then
      rb::log "static checks on the source: passed (${RB_AUDIT_ARCH:+every kernel has code for ${RB_AUDIT_ARCH}, and }nothing in it names a path outside the venv)"
    else
      rb::log "static checks on the source: passed; its links that leave the tree are kept" \
        "(transfer.outside_links: keep)"
    fi
    return 0
  fi
  if ((rc != 1)); then
    rb::fail "the static checks could not run on ${RB_SRC_HOST} (exit ${rc}, above)"
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
  local host=${RB_DST_HOST} kit fifo="${RB_WORK}/engine"
  kit=$(rb::kit_dir "${host}")
  # the spec's choices are one document (RB_ENGINE_CHOICES); the rest are this run's facts
  local -a args=(--dest "${RB_DST_ABS}" --old "${RB_SRC_ABS}" --choices "${RB_ENGINE_CHOICES}"
    --manifest "${kit}/${RB_NAME}.manifest.jsonl" --compression "${RB_COMPRESSION_USED}"
    --probe-config "${RB_PROBE_CONFIG:-}"
    --holder "runbook ${RB_NAME} run from ${HOSTNAME%%.*} (pid $$, run dir ${RB_RUN_DIR})")
  if [[ -n "${RB_ENGINE_PID}" ]]; then
    return 0
  fi
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
  if [[ "${1:-}" == now ]]; then
    # a few seconds for its last answer, then its ssh client goes: the engine there stops when
    # its answers find no reader (serve's ping), never inside a rename
    rb::engine_read 3 <&"${RB_ENGINE_R}" || true
    exec {RB_ENGINE_R}<&-
    rb::wait_bounded 2 "${pid}" || true
    return 0
  fi
  rb::engine_read 90 <&"${RB_ENGINE_R}" || true
  exec {RB_ENGINE_R}<&-
  wait "${pid}" || true
}

#######################################
# --list-backups: each backup of the destination, the failed install kept apart and the one in
# place (when, from which runbook and spec, the source's fingerprint, its checks, its size), read
# by the destination's engine under its lock.
#######################################
rb::list_backups() {
  RB_STEP=backups
  rb::kit_ship "${RB_DST_HOST}"
  rb::engine_start
  rb::engine backups
  rb::log "${RB_ENGINE_DETAIL} (${RB_DST_HOST}:${RB_DST_ABS})"
  rb::log "to put one back: bash ${RB_SELF} --restore N (without N: the newest backup whose" \
    "checks passed); the checks run on what it puts back"
  rb::engine_stop
  RB_FINISHED=1
}

#######################################
# After --restore: the spec's checks on the install put back, as the probe step runs them; its
# report is fetched into the run directory. A failure fails the restore, naming what to do.
#######################################
rb::restore_checks() {
  local report="${RB_RUN_DIR}/probe-${RB_DST_HOST}.json"
  if [[ -z "${RB_PROBE_CONFIG:-}" ]]; then
    rb::log "the spec has no checks: nothing was run on the restored install"
    return 0
  fi
  rb::engine_call probe
  if [[ -n "${RB_J[report]:-}" ]] && rb::on_host "${RB_DST_HOST}" test -f "${RB_J[report]}"; then
    rb::on_host "${RB_DST_HOST}" cat "${RB_J[report]}" >"${report}"
  fi
  if [[ "${RB_ENGINE_STATUS}" == failed ]]; then
    rb::fail "the restored install failed its checks on ${RB_DST_HOST}: ${RB_ENGINE_DETAIL}" \
      "(table above; report ${report}); see what else there is: bash ${RB_SELF} --list-backups"
  fi
  rb::log "checks on the restored install: ${RB_ENGINE_DETAIL} on ${RB_DST_HOST} (report ${report})"
}

#######################################
# End the destination's engine (its last events go into the log), write the report and print the
# summary. Argument: the outcome this shell saw; the report's is the worse of it and what the
# steps' events say, with where the run stopped. A signal while finishing (INT, TERM, HUP) makes
# it an interrupted run (exit 130) whose report replaces the one just written.
#######################################
rb::finish() {
  local outcome=$1 late='' where from n
  # nothing is written before the run directory is known private and this run holds it
  if ((RB_FINISHED)) || [[ -z "${RB_WORK}" || -z "${RB_RUN_LOCK}" ]] || ((RB_DRY_RUN)); then
    return 0
  fi
  RB_FINISHED=1
  if [[ "${outcome}" == interrupted ]]; then
    rb::engine_stop now
  else
    trap 'late=INT && trap "" INT TERM HUP' INT
    trap 'late=TERM && trap "" INT TERM HUP' TERM
    trap 'late=HUP && trap "" INT TERM HUP' HUP
    rb::engine_stop
  fi
  from=$(rb::resume_step "${RB_FAILED_STEP}")
  where=${RB_FAILED_STEP:+in step ${RB_FAILED_STEP}}
  where=${where:-after step ${RB_STEP_DONE:-(none)}${from:+, before ${from}}}
  # once; again when a signal came while it was being written
  for n in 1 2; do
    if [[ -n "${late}" && "${outcome}" != interrupted ]]; then
      outcome=interrupted where="while finishing (SIG${late}), ${where}"
      rb::log "interrupted ${where}; the report says so"
    elif ((n == 2)); then
      break
    fi
    rb::report "${outcome}" "${where}"
  done
  rb::log "report: ${RB_REPORT}; log: ${RB_RUN_DIR}/run.log"
  if [[ -n "${late}" && -z "${from}" ]]; then
    rb::log "every step had finished before the signal: nothing to go on with"
  elif [[ "${outcome}" == interrupted ]]; then
    rb::log "interrupted: re-run with --from ${from:-${RB_STEPS[0]}} to go on (relocate, prove" \
      "and swap install only a staging this run verified: they go on from verify)"
  elif ((RB_ROLLED_BACK)); then
    # --from probe would check the install put back, not this spec's
    rb::log "${outcome}: rolled back (above); after fixing it, run every step again: bash ${RB_SELF}"
  elif [[ "${outcome}" != ok ]]; then
    rb::log "${outcome}: see the step named above; re-run with --from ${from:-${RB_STEPS[0]}}" \
      "after fixing it (relocate, prove and swap install only a staging this run verified: they" \
      "go on from verify)"
  fi
  if [[ -n "${late}" ]]; then
    exit 130
  fi
}

#######################################
# The report ($1 the outcome, $2 where the run stopped), then its pictures beside it (timeline.svg,
# nodes.svg, report.html): one process, which ignores the run's signals.
#######################################
rb::report() {
  local drawn='' probe fan=''
  local -a args=()
  for probe in "${RB_PROBE_REPORTS[@]}"; do
    args+=(--probe "${probe}")
  done
  if [[ -f "${RB_STATE_DIR}/fanout/fanout.json" ]]; then
    args+=(--fanout "${RB_STATE_DIR}/fanout/fanout.json") fan=', nodes.svg'
  fi
  rb::py_argv "${RB_LOCAL_PY}" "${RB_LOCAL_KIT}" rbkit
  if drawn=$(trap '' INT TERM HUP && exec "${RB_KIT_ARGV[@]}" report --name "${RB_NAME}" \
    --spec "${RB_SPEC}" --sha "${RB_SPEC_SHA256}" --events "${RB_EVENTS}" --outcome "$1" \
    --where "$2" --out "${RB_REPORT}" ${RB_GPU_DECLARED:+--gpu} --pictures "${RB_REPORT%/*}" \
    "${args[@]}"); then
    if [[ -n "${drawn}" ]]; then
      rb::log "pictures: ${RB_REPORT%/*}/report.html (timeline.svg${fan})"
    else
      rb::log "could not draw the pictures of this run (above); the report is complete"
    fi
  else
    rb::log "could not write the report"
  fi
}

#######################################
# Print the usage.
#######################################
rb::usage() {
  cat <<USAGE
Usage: bash ${RB_SELF} [options]
Runbook ${RB_NAME}, compiled from ${RB_SPEC}.

  --list          list the steps with one-line descriptions
  --dry-run       print what each step would run on which host; run nothing
  --only STEP     run one step (with the preflight it needs)
  --from STEP     run from STEP to the end (with the preflight it needs)
  --report PATH   write the JSON report to PATH (default: runs/${RB_NAME}/report.json)
  --restore [N]   put backup N (default: the newest whose checks passed) of the destination
                  back in place, then run the checks on it
  --list-backups  the destination's backups: when, from which spec and source, checks, size
  --plan          reach every host read-only and say what a run would change and need
                  (--markdown: also plan.md); writes runs/${RB_NAME}/<run>/plan.json
  --apply PLAN    run exactly that plan; refused (exit 1) when either end changed since
  --force         move a source whose static checks failed (kernels without code for the
                  target, references that leave the venv); the log and the report say so
  --allow-edited  run this runbook although it was edited, or its spec changed, since compile
  --version       the compiler, spec and kit this runbook was made from
  -h, --help      this text

Environment: each run writes its log, events and reports in a directory of its own,
runs/${RB_NAME}/<UTC time>-<pid> (runs/${RB_NAME}/latest: the newest; RB_KEEP_RUNS, default 20,
are kept); runs/${RB_NAME} keeps what later runs go on from. RB_RUN_DIR=DIR: one directory
for both. RB_LOCK_WAIT (seconds, default 30): how long a second run waits for the first (the
runbook's directory, the destination) before it gives up, naming it.
Exit status: 0 all steps and checks passed; 1 a step or check failed; 2 usage or a refused
directory; 130 interrupted (Ctrl-C, SIGTERM, SIGHUP: the summary and the report say where).
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
# Host a (device/relay.yaml:9): root@127.0.0.2 over ssh
# Sets RB_HOST_SSH to the ssh options from the spec and RB_HOST_TARGET to user@host (both empty:
# this machine).
#######################################
rb::host_a() {
  RB_HOST_SSH=(-o ConnectTimeout=10 -o StrictHostKeyChecking=yes -p 2222 -o IdentitiesOnly=yes -i /tmp/rb-device/id -o GlobalKnownHostsFile=/dev/null -o UserKnownHostsFile=/tmp/rb-device/known_hosts)
  RB_HOST_TARGET=root@127.0.0.2
}

#######################################
# Host b (device/relay.yaml:14): root@127.0.0.3 over ssh
# Sets RB_HOST_SSH to the ssh options from the spec and RB_HOST_TARGET to user@host (both empty:
# this machine).
#######################################
rb::host_b() {
  RB_HOST_SSH=(-o ConnectTimeout=10 -o StrictHostKeyChecking=yes -p 2222 -o IdentitiesOnly=yes -i /tmp/rb-device/id -o GlobalKnownHostsFile=/dev/null -o UserKnownHostsFile=/tmp/rb-device/known_hosts)
  RB_HOST_TARGET=root@127.0.0.3
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
# continuing what a cut stream left in the staging: the stream only what is missing there
RB_RESUME=0
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
# The kit: Python tools this runbook runs on each host (hostkit/rbkit, rbprobes, rbrules) and here
# (hostkit/rbview, the pictures: never sent to a host), embedded (compile --standalone).
# Arguments: the directory to write them into.
#######################################
rb::kit_write() {
  local dir=$1
  mkdir -p "${dir}"/rbkit "${dir}"/rbprobes "${dir}"/rbrules "${dir}"/rbview
  cat >"${dir}"/rbkit/__init__.py <<'RB_PY_D8709D74'
"""rbkit: the file-system tools a runbook ships to every host (stdlib only, Python >= 3.9).

Relative imports only: on a host this package is named `rbkit` (see docs/design.md).
"""
RB_PY_D8709D74
  cat >"${dir}"/rbkit/__main__.py <<'RB_PY_4A0F4903'
"""python -m rbkit (on hosts) / python -m rbkit (from the repo). See docs/design.md.

    manifest build ROOT --out F [...]     a manifest of a tree (JSON summary on stdout)
    manifest verify ROOT MANIFEST [...]    a tree against a manifest (differences on stderr)
    relocate ROOT --old OLD --new NEW      rewrite what names OLD in a venv's bin/ (by hand)
    elsewhere --fd N --old OLD...          text files outside bin/ naming OLD (relocate's report)
    report --events E --out R [...]        the run's report from its event log (on the head)
    measure ROOT --tool T...               how fast each compressor packs a sample of the tree
    engine ...                             the install engine (serve.py): every step of a move
    liveplan ...                           the live plan (--plan, --apply): liveplan.py

The steps of a move (scan, stage, receive, verify, relocate, prove, swap, exports, probe,
restore) are the engine's only: `python -m rbkit engine run STEP... --dest DEST` runs them by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from rbrules import common

from . import report


def jobs(value: str) -> int:
    """--jobs N, or auto: one per CPU of this host (at most 32)."""
    if value == "auto":
        return max(1, min(32, os.cpu_count() or 1))
    return max(1, int(value))


def _print(doc) -> None:
    print(json.dumps(doc, sort_keys=True))


def cmd_manifest_build(a) -> int:
    from . import manifest
    m = manifest.build(a.root, a.exclude, a.algo, a.jobs,
                       manifest.load(a.reuse) if a.reuse else None)
    manifest.save(m, a.out)
    if a.names:
        with open(a.names, "wb") as f:
            manifest.names(m, f)
    _print({"totals": m["totals"], "fingerprint": manifest.fingerprint(m), "reused": m["reused"]})
    return 0


def cmd_manifest_verify(a) -> int:
    from . import manifest
    result = manifest.verify(a.root, manifest.load(a.manifest), a.jobs,
                             linked_from=a.linked_from)
    for line in manifest.describe(result):
        print(line, file=sys.stderr)
    _print({k: result[k] for k in ("ok", "algo", "checked", "hashed", "linked", "counts")})
    return 0 if result["ok"] else 1


def cmd_relocate(a) -> int:
    from . import relocate
    result = relocate.relocate(a.root, a.old, a.new)
    for rel in result["remaining"]:
        print(f"still names {a.old}: {rel}", file=sys.stderr)
    _print({"rewritten": sorted(result["rewritten"]), "count": len(result["rewritten"]),
            "remaining": result["remaining"], "elsewhere": result["elsewhere"],
            "same_path": result["same_path"]})
    return 1 if result["remaining"] else 0


def cmd_elsewhere(a) -> int:
    """The tree open at descriptor --fd (inherited): its text files outside bin/ that name any
    --old prefix, as a JSON list (relocate.ElsewhereChild)."""
    from . import relocate
    try:
        found = relocate.elsewhere_at(a.fd, a.old)
    finally:
        os.close(a.fd)
    _print(found)
    return 0


def cmd_report(a) -> int:
    probes = dict(item.split("=", 1) for item in a.probe)
    doc = report.build(a.name, a.spec, a.sha, a.events, probes, a.outcome, gpu=a.gpu,
                       where=a.where)
    # a new file of its own name beside the report (O_EXCL, never a name another user could have
    # pointed elsewhere), renamed over it
    fd, tmp = tempfile.mkstemp(prefix=".report.", suffix=".tmp", dir=os.path.dirname(a.out) or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, a.out)
    except BaseException:
        os.unlink(tmp)
        raise
    print(report.table(doc), file=sys.stderr)
    if a.pictures:
        # in the same process (one Python start less at the end of every run); a drawing that
        # fails is said on stderr and by no `drawn` line, never the report's outcome
        try:
            # the controller-only package beside rbkit in this machine's kit (never on a host)
            from rbview import draw
            for path in draw.draw(doc, a.events, a.pictures, a.fanout):
                print("drawn %s" % path)
        except Exception as exc:  # noqa: BLE001 - the pictures are a view; the report stands
            print("rbkit report: could not draw the pictures: %s: %s" % (type(exc).__name__, exc),
                  file=sys.stderr)
    return 0


def cmd_measure(a) -> int:
    from . import measure
    doc = measure.measure(a.root, a.tool, a.exclude, a.bytes, a.seconds)
    if a.link is None:
        _print(doc)
    else:
        jobs = (os.cpu_count() or 1) if a.jobs == "auto" else int(a.jobs)
        print("\n".join(measure.main_lines(doc, a.link, a.shared_cpu, jobs)))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rbkit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
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
    r = sub.add_parser("relocate")
    r.add_argument("root")
    r.add_argument("--old", required=True)
    r.add_argument("--new", required=True)
    r.set_defaults(fn=cmd_relocate)
    e = sub.add_parser("elsewhere", help="text files outside bin/ naming an old prefix (JSON)")
    e.add_argument("--fd", type=int, required=True, help="an inherited descriptor of the tree")
    e.add_argument("--old", action="append", required=True)
    e.set_defaults(fn=cmd_elsewhere)
    sub.add_parser("engine", help="the install engine: python -m rbkit engine --help")
    ms = sub.add_parser("measure", help="how fast each compressor packs a sample of the tree")
    ms.add_argument("root")
    ms.add_argument("--tool", action="append", default=[])
    ms.add_argument("--exclude", action="append", default=[])
    ms.add_argument("--bytes", type=int, default=common.MEASURE_SAMPLE)
    ms.add_argument("--seconds", type=float, default=5.0)
    ms.add_argument("--link", type=int, help="the link's rate (bytes/s): print the choice")
    ms.add_argument("--shared-cpu", action="store_true",
                    help="the compressor and the link share CPUs (one kernel)")
    ms.add_argument("--jobs", default="1", help="the run's jobs (auto: the cores): its streams")
    ms.set_defaults(fn=cmd_measure)
    rp = sub.add_parser("report")
    rp.add_argument("--name", required=True)
    rp.add_argument("--spec", required=True)
    rp.add_argument("--sha", required=True)
    rp.add_argument("--events", required=True)
    rp.add_argument("--probe", action="append", default=[])
    rp.add_argument("--outcome", required=True)
    rp.add_argument("--where", default="", help="where a run that did not pass stopped")
    rp.add_argument("--gpu", action="store_true", help="the spec declares gpu: say whether it was proven")
    rp.add_argument("--out", required=True)
    rp.add_argument("--pictures", default="", help="also draw the run's pictures into this directory")
    rp.add_argument("--fanout", default="", help="with --pictures: the fan-out's fanout.json")
    rp.set_defaults(fn=cmd_report)
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["engine"]:
        from . import serve          # the install engine's own command line (serve.py)

        return serve.main(argv[1:])
    if argv[:1] == ["liveplan"]:
        from . import liveplan       # the live plan's own command line (--plan, --apply)

        return liveplan.main(argv[1:])
    a = parser().parse_args(argv)
    try:
        return a.fn(a)
    except (OSError, ValueError) as exc:
        print(f"rbkit {a.cmd}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
RB_PY_4A0F4903
  cat >"${dir}"/rbkit/backups.py <<'RB_PY_6A05FA69'
"""The installs kept beside the destination, asked for by hand: `restore` (a backup back in
place) and `list_backups`.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import os
from typing import Optional

from . import hostfs
from .runner import Result, Context, _require_lock


def restore(ctx: Context, number: Optional[int] = None) -> Result:
    """`--restore [N]`: backup N (default: the newest whose checks passed) back at the
    destination; says which and why, and what is in place now. The runbook runs the checks on it
    next (probe)."""
    _require_lock(ctx)
    ctx.critical += 1
    try:
        result = hostfs.restore(ctx.dest, number, env_file=ctx.env_out,
                                swap_atomic=ctx.choices.swap_atomic)
        if os.path.isdir(ctx.dest):
            # chosen by hand: the checks that follow are this install's, not a stale spec's
            hostfs.write_info(ctx.dest, put_back_after=None, failed_install=None)
    finally:
        ctx.critical -= 1
    for why in result.get("ignored") or []:
        ctx.log("ignored: " + why)
    now = result.get("installed") or {}
    if now:
        ctx.log("in place now: %s" % _describe(now))
    if result["restored"] is None:
        return Result("nothing restored: %s" % result["why"], {"restored": "", "kept_current_as": ""})
    if result["kept_current_as"] is None:
        then = "nothing was in place"
    elif result.get("kept_failed"):
        then = ("the install that was in place failed its checks: kept apart at %s"
                % result["kept_current_as"])
    else:
        then = "the install that was in place is now %s" % result["kept_current_as"]
    skipped = "; ".join(result.get("skipped") or []) or "none"
    return Result("restored %s: %s (skipped: %s); %s"
                  % (result["restored"], result["why"], skipped, then),
                  {"restored": result["restored"], "kept_current_as": result["kept_current_as"] or ""})


def _describe(doc: dict) -> str:
    """An install's record and stat check in words (describe_install's dict)."""
    info = doc.get("info") or {}
    parts = ["%s made %s by %s" % (doc.get("path"), info.get("installed", "at an unknown time"),
                                   info.get("origin", "an unknown run"))]
    fp = info.get("source_fingerprint") or doc.get("source_fingerprint")
    parts.append("source %s" % (fp[:16] if fp else "unknown"))
    parts.append("checks %s" % ("failed: " + doc["failed"] if doc.get("failed")
                                else info.get("checks", "not recorded")))
    check = doc.get("tree_check") or {}
    if check.get("ok") is True:
        parts.append("its files are as installed (stat check against its manifest)")
    elif check.get("ok") is False:
        changed = check.get("changed") or check.get("missing") or []
        parts.append("changed since installed: %s" % (", ".join(changed[:8]) if changed
                                                       else check.get("why", "see its manifest")))
    else:
        parts.append(check.get("why", "no stat check"))
    return "; ".join(parts)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0
    return "%d B" % n


def list_backups(ctx: Context) -> Result:
    """`--list-backups`: each backup of the destination, the failed install kept apart and the
    one in place: when it was installed, by which runbook and spec, the source's fingerprint,
    its checks, its size."""
    rows = hostfs.list_installs(ctx.dest)
    ctx.log("installs of %s (keep_backups: %s counts the backups whose checks passed):"
            % (ctx.dest, ctx.choices.keep_backups or "-"))
    table = []
    for row in rows:
        info = row["info"]
        checks = "failed" if row["failed"] else info.get("checks", "unknown").split(":")[0]
        label = ("backup %d" % row["number"]) if row["kind"] == "backup" else row["kind"]
        fp = info.get("source_fingerprint") or ""
        table.append((label, info.get("installed", "-"), checks, _size(row["size"]),
                      "source " + (fp[:12] or "-"), info.get("origin", "-"), row["path"]))
    widths = [max(len(r[i]) for r in table) for i in range(6)] if table else []
    for r, row in zip(table, rows):
        ctx.log("  " + "  ".join(r[i].ljust(widths[i]) for i in range(6)) + "  " + r[6])
        if row["failed"]:
            ctx.log("      why: %s" % row["failed"])
        if row["info"].get("put_back_after"):
            ctx.log("      put back after %s failed (the failed install: %s)"
                    % (row["info"]["put_back_after"], row["info"].get("failed_install", "-")))
    if not rows:
        ctx.log("  nothing there yet")
    n = sum(1 for r in rows if r["kind"] == "backup")
    good = sum(1 for r in rows if r["kind"] == "backup" and not r["failed"])
    return Result("%d backups (%d whose checks did not fail)%s" % (
        n, good, "; a failed install kept apart" if any(r["kind"] == "failed" for r in rows)
        else ""), {"backups": n, "good": good})
RB_PY_6A05FA69
  cat >"${dir}"/rbkit/choices.py <<'RB_PY_E7C304B6'
"""The engine's choices for a run: one JSON document, read once.

The compiler writes the spec's choices for the install engine as one JSON document (the runbook's
RB_ENGINE_CHOICES setting, compiler/engineconf.py), the way it writes the checks' document
(RB_PROBE_CONFIG, read by rbprobes); a runbook passes it whole, as one argument (`--choices`), to
`rbkit engine serve|run|receive` and to `rbkit.fanout node`, beside the facts of the run itself
(the destination and source paths as resolved on the hosts, the manifest's path there, the
compression this run measured). `Choices.from_json` reads it into a frozen Choices, refusing a
document that is not one (an unknown key, a value that is not one of a choice's words, another
schema), so a mistake is named before anything is done:

    {"schema": 1, "on_existing": "backup", "rerun": "quick", "verify": "sha256",
     "special_modes": "refuse", "keep_backups": 2, "swap_atomic": "allow",
     "shared_parent": "refuse", "on_failed_checks": "rollback", "jobs": "auto",
     "cuda_home": "/usr/local/cuda", "env_file": "", "library_path_first": ["nvidia/cu13/lib"],
     "env": {"NCCL_DEBUG": "WARN"}, "origin": "runbook b300 (specs/b300.yaml)", "timeout": null}

A key left out takes its default below (the safe word of each choice).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, Optional, Tuple, Union

from .hostfs import SPECIAL_MODES, SWAP_ATOMIC
from .stream import COMPRESSION

SCHEMA = 1
# the spec's words for each choice (compiler/spec.py holds the same lists as its field types)
ON_EXISTING = ("refuse", "backup", "replace")     # transfer.on_existing
RERUN = ("quick", "digest")                       # transfer.rerun
VERIFY = ("sha256", "blake2b", "none")            # transfer.verify: the digest of each file
ON_FAILED_CHECKS = ("rollback", "keep")           # on_failed_checks
SHARED_PARENT = ("refuse", "allow")               # transfer.shared_parent


class ChoicesError(ValueError):
    """The document is not the engine's choices: the message names the key and what it holds."""


@dataclass(frozen=True)
class Choices:
    """What the spec chose for the install engine (none of it depends on the run)."""

    on_existing: str = "refuse"         # what is at the destination: refused, backed up, replaced
    rerun: str = "quick"                # how a re-run decides the destination holds the tree
    verify: str = "sha256"              # the digest receive takes of each file (verify's)
    special_modes: str = "refuse"       # setuid/setgid/sticky/world-write entries
    keep_backups: Optional[int] = None  # backups kept whose checks passed (None: all)
    swap_atomic: str = "allow"          # a swap that cannot be one rename: refused, or two
    shared_parent: str = "refuse"       # a destination's parent other users can write
    on_failed_checks: str = "keep"      # after the swap: failed checks roll back, or stay
    jobs: Union[str, int] = "auto"      # hashing threads on each host (auto: one per CPU)
    cuda_home: str = ""                 # the env file's CUDA_HOME ("" without cuda:)
    env_file: str = ""                  # cuda.env_file ("": DEST.env.sh)
    library_path_first: Tuple[str, ...] = ()   # LD_LIBRARY_PATH's first dirs, in site-packages
    env: Tuple[Tuple[str, str], ...] = field(default=())   # the spec's env:, sorted by name
    origin: str = "a runbook"           # who installs: written in the install's record
    timeout: Optional[float] = None     # seconds for each child (a fan-out node's fanout.timeout_s)

    @classmethod
    def from_json(cls, text: str) -> "Choices":
        """The document `text` as Choices; ChoicesError naming what is wrong."""
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ChoicesError("the engine's choices are not JSON: %s" % exc) from None
        if not isinstance(doc, dict):
            raise ChoicesError("the engine's choices are not a JSON object")
        return cls.from_dict(doc)

    @classmethod
    def from_dict(cls, doc: Dict[str, Any]) -> "Choices":
        doc = dict(doc)
        schema = doc.pop("schema", SCHEMA)
        if schema != SCHEMA:
            raise ChoicesError("the engine's choices are of schema %r; this kit reads schema %d"
                               % (schema, SCHEMA))
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise ChoicesError("the engine's choices hold keys this kit does not know: %s"
                               % ", ".join(unknown))
        for key, words in _WORDS.items():
            if key in doc and doc[key] not in words:
                raise ChoicesError("the engine's choice %s is %r, not one of %s"
                                   % (key, doc[key], ", ".join(words)))
        for key in ("cuda_home", "env_file", "origin"):
            if key in doc and not isinstance(doc[key], str):
                raise ChoicesError("the engine's choice %s is %r, not a string" % (key, doc[key]))
        if "keep_backups" in doc:
            doc["keep_backups"] = _whole(doc, "keep_backups", allow_none=True)
        if "jobs" in doc and doc["jobs"] != "auto":
            doc["jobs"] = _whole(doc, "jobs")
        if doc.get("timeout") is not None:
            value = doc["timeout"]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ChoicesError("the engine's choice timeout is %r, not a number of seconds"
                                   % (value,))
        if "library_path_first" in doc:
            first = doc["library_path_first"]
            if not isinstance(first, list) or not all(isinstance(x, str) for x in first):
                raise ChoicesError("the engine's choice library_path_first is %r, not a list of "
                                   "strings" % (first,))
            doc["library_path_first"] = tuple(first)
        if "env" in doc:
            env = doc["env"]
            if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in env.items()):
                raise ChoicesError("the engine's choice env is %r, not an object of strings"
                                   % (env,))
            doc["env"] = tuple(sorted(env.items()))
        return cls(**doc)

    def to_json(self) -> str:
        """The document (as the compiler writes it: keys sorted, no spaces)."""
        doc = asdict(self)
        doc["library_path_first"] = list(self.library_path_first)
        doc["env"] = dict(self.env)
        doc["schema"] = SCHEMA
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))


_WORDS = {"on_existing": ON_EXISTING, "rerun": RERUN, "verify": VERIFY,
          "special_modes": SPECIAL_MODES, "swap_atomic": SWAP_ATOMIC,
          "shared_parent": SHARED_PARENT, "on_failed_checks": ON_FAILED_CHECKS}


def _whole(doc: Dict[str, Any], key: str, allow_none: bool = False) -> Optional[int]:
    value = doc[key]
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ChoicesError("the engine's choice %s is %r, not a whole number above 0"
                           % (key, value))
    return value


def _read(text: str) -> Choices:
    """--choices: the document, read once (argparse names the option when it is refused)."""
    try:
        return Choices.from_json(text)
    except ChoicesError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_choices_option(p: argparse.ArgumentParser) -> None:
    """--choices JSON: the spec's choices, read into a Choices (`engine receive`, and below)."""
    p.add_argument("--choices", type=_read, required=True, metavar="JSON",
                   help="the spec's choices for the engine: one JSON document (rbkit/choices.py)")


def add_run_options(p: argparse.ArgumentParser) -> None:
    """--choices, and the facts of a run that the install's steps take beside it (`engine serve`,
    `engine run`, `rbkit.fanout node`)."""
    p.add_argument("--dest", required=True)
    p.add_argument("--old", default="", help="the source's path (what relocation rewrites)")
    p.add_argument("--compression", choices=sorted(COMPRESSION), default="none",
                   help="the compression this run's stream uses")
    p.add_argument("--probe-config", default="", help="the checks' document (rbprobes)")
    add_choices_option(p)
RB_PY_E7C304B6
  cat >"${dir}"/rbkit/engine.py <<'RB_PY_B47E6041'
"""The install engine: every destination-side step of a move, written once.

A single-host runbook drives these steps one request at a time through `python -m rbkit engine
serve` on the destination (one process for the whole run, holding the destination's lock: see
serve.py); a fan-out node runs the same functions in its own process (`rbkit.fanout node`, through
`install` below). Each step is a function taking the run's Context and returning a Result; `run`
times it and emits one event:

    {"step": "verify", "status": "ok|failed|skipped", "detail": "...", "facts": {...},
     "duration_s": 1.234, "error": ["...", ...]}        (error: only when it failed)

The steps, in order (STEPS): stage (a fresh staging beside the destination, or one whose unchanged
files are hard-linked from the current install), receive (a tar stream into it), verify (every
entry against the source's manifest; leaves the stamp), relocate (rewrites what names the old
path; updates the stamp), prove (the staged interpreter runs), swap (one rename, then the
post-swap proof), exports (the env file), probe (the checks, with the moved interpreter). Before
them `current` says whether the destination already holds the tree; after a failure past the swap
`after_failure` rolls back to what was there.

The stamp: verify writes it into the run's private state directory (made by this process, never a
place the tree controls): the manifest's fingerprint and the staging's identity (st_dev, st_ino).
relocate and swap refuse without it, so a staging that failed verification, or one another run
replaced, is never installed.

The engine is split at its seams: runner.py (Context, Result, StepError, `run`, the private state
and its stamp), staging.py (stage and resume), receive.py (the stream's receiving end), proof.py
(verify, prove, the post-swap proof) and backups.py (restore, list_backups); this module holds the
other steps, the order they run in (`install`) and what a failure past the swap does, and names
every step for its callers (serve.py, fanout.py).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import threading
import time
from typing import Any, Callable, List, Optional

from rbrules import launch
from rbrules.common import compressors, human

from . import exports as kitexports
from . import hostfs, privacy, safefs
from . import manifest as kitmanifest
from . import relocate as kitrelocate
# the runner and the steps of the other modules, named here for the engine's callers (serve.py,
# fanout.py, source.py): `engine.run(ctx, "verify", engine.verify)`
from .backups import list_backups, restore
from .proof import (_cancel_elsewhere, _report_elsewhere, interpreter_prefix, prove, prove_scripts,
                    stop_background, verify)
from .receive import receive
from .runner import (INSTALLED, STEPS, Context, Result, StepError, _load_keyed, _require,
                     _require_lock, _sha256, _write_stamp, jobs, make_state, os_error_words,
                     read_stamp, remove_tree, run, skipped, staging_path, user_name, write_file)
from .staging import resumable, stage
from .stream import child_env, run_quiet, tail

__all__ = ["Context", "Result", "StepError", "INSTALLED", "SKIPPED_WHEN_CURRENT", "STEPS",
           "after_failure", "begin_early_check", "current", "exports", "finish", "install", "jobs",
           "list_backups", "make_state", "os_error_words", "own_env_copy", "preflight", "probe",
           "prove", "prove_scripts", "read_stamp", "receive", "relocate", "remove_tree",
           "restore", "resumable", "rollback", "run", "skipped", "stage", "staging_path", "step",
           "stop_background", "swap", "take_lock", "user_name", "verify", "write_file"]


def after_failure(ctx: Context, step: str) -> Optional[dict]:
    """After a failed step: a failure past this run's swap puts back what was there (the post-
    swap proof, the env file; failed checks only with on_failed_checks: rollback)."""
    if ctx.swapped is None:
        return None
    if step in ("swap", "exports") or (step == "probe"
                                       and ctx.choices.on_failed_checks == "rollback"):
        return run(ctx, "rollback", rollback, step)
    if step == "probe":
        ctx.log("checks failed; the new install stays in place (on_failed_checks: %s)"
                % ctx.choices.on_failed_checks)
    return None


# The steps that put the tree in place: each is skipped when `current` found that the destination
# already holds the tree. The one rule: a runbook's requests (serve.py) and a node's install ask it
# through `step`.
SKIPPED_WHEN_CURRENT = ("stage", "receive", "verify", "relocate", "prove", "swap")


def step(ctx: Context, name: str, fn: Callable[..., Result], **kw: Any) -> dict:
    """One step as a run asks for it: skipped when the destination holds the tree already and
    the step is one that puts it there (SKIPPED_WHEN_CURRENT); else run, a failure followed by
    what `after_failure` does."""
    if ctx.up_to_date and name in SKIPPED_WHEN_CURRENT:
        return skipped(ctx, name, ctx.up_to_date)
    event = run(ctx, name, fn, **kw)
    if event["status"] == "failed":
        after_failure(ctx, name)
    return event


def install(ctx: Context, producer: Optional[List[str]] = None,
            carried: Optional[str] = None) -> int:
    """A whole install in this process (a fan-out node): current, then stage .. swap unless the
    destination holds the tree already, exports, probe. Returns 0, 1 (a step failed) or 3 (the
    payload lacks files this host needs: it needs the whole bundle)."""
    cur = run(ctx, "current", current, ctx.choices.rerun, linking=carried is not None)
    if cur["status"] == "failed":
        return 1
    steps: List[tuple] = [
        ("stage", stage, {"delta": carried is not None, "carried": carried}),
        ("receive", receive, {"producer": producer}), ("verify", verify, {}),
        ("relocate", relocate, {}), ("prove", prove, {}), ("swap", swap, {}),
        ("exports", exports, {})]
    if ctx.probe_config:
        steps.append(("probe", probe, {}))
    for sid, fn, kw in steps:
        event = step(ctx, sid, fn, **kw)
        if event["status"] == "failed":
            return 3 if event["facts"].get("needs_full") else 1
    return 0


def finish(ctx: Context) -> Optional[dict]:
    """The run is over: under on_existing: replace, the install the swap replaced (kept until
    now, for a rollback) is removed."""
    if ctx.swapped is None or not ctx.swapped.get("transient"):
        return None
    return run(ctx, "finish", _drop_replaced)


def _drop_replaced(ctx: Context) -> Result:
    old = ctx.swapped["previous"]
    ctx.swapped = None
    remove_tree(old)
    return Result("removed the install it replaced (%s; on_existing: replace)" % old)


# -- the steps -----------------------------------------------------------------------------------


def take_lock(ctx: Context, lock: Any) -> Result:
    """Hold the destination's lock (rbkit.lock) for the run; then a swap or restore an earlier run
    left half done (two renames, journaled) is finished or undone, before anything here may
    remove the staging, where a previous install can sit until it has its backup name."""
    from .lock import Taken

    shared = check_parent(ctx)
    try:
        lock.acquire()
    except Taken as exc:
        raise StepError(str(exc)) from None
    except OSError as exc:
        parent, who = os.path.dirname(ctx.dest), user_name()
        raise StepError(
            "%s. The run keeps its lock and its staging beside the destination %s, in %s, so %s "
            "must be able to create files there: make %s writable for %s, or set transfer.to to "
            "a destination whose parent directory %s can write"
            % (os_error_words(exc, "create"), ctx.dest, parent, who, parent, who, who)) from exc
    ctx.locked = True
    facts: dict = {"state": ctx.state, "lock": lock.path, "staging": ctx.staging,
                   "pid": os.getpid()}
    if shared:
        facts["shared_parent"] = shared
    recovered = hostfs.recover_swap(ctx.dest)
    if recovered:
        ctx.log("an earlier swap of %s was interrupted: %s" % (ctx.dest, recovered.get("detail")))
        facts["recovered"] = recovered.get("action")
    return Result("holding %s" % lock.path, facts)


def check_parent(ctx: Context) -> str:
    """The destination's parent, and every directory above it, before anything is written there
    (the lock is first): a directory another user can write (privacy.why_not_private) is refused,
    naming it, its owner and mode, and the fixes; with shared_parent: allow it is a warning, and
    returned."""
    uid = os.geteuid()
    found = privacy.check_parent(ctx.dest, uid)
    if found is None:
        return ""
    where, why = found
    if ctx.choices.shared_parent != "allow":
        raise StepError(privacy.refusal(ctx.dest, where, why, uid), {"shared_parent": where})
    ctx.log("warning: %s; going on because %s is allow: the checks source the install's own env "
            "file (not %s), and a backup of another user is never restored, but another user can "
            "still swap what this run puts in %s"
            % (why, privacy.SPEC_KEY, ctx.env_out, os.path.dirname(ctx.dest)))
    return where


def preflight(ctx: Context, need: int = 0, source_identity: str = "") -> Result:
    """The destination before anything is sent: that it is not the source (nor inside it, nor
    the reverse, whatever the names: `source_identity`, the source's hostfs.identity), what is
    there, the policy for it, room for the staging, and which compressors this host has."""
    if source_identity:
        why = hostfs.same_or_nested(json.loads(source_identity), hostfs.identity(ctx.dest))
        if why:
            raise StepError("refusing to install %s: %s" % (ctx.dest, why))
    exists = os.path.lexists(ctx.dest)
    installed = os.path.isfile(os.path.join(ctx.dest, INSTALLED))
    if exists and ctx.choices.on_existing == "refuse" and not installed:
        raise StepError("destination %s exists and on_existing is refuse; move it away or set "
                        "on_existing: backup" % ctx.dest)
    free = hostfs.free_bytes(ctx.staging)
    if need and free["free_bytes"] < need:
        raise StepError("not enough space for the staging at %s: %s free, %s needed"
                        % (free["measured_at"], human(free["free_bytes"]), human(need)))
    have = compressors(shutil.which)
    what = ("exists (an earlier install: %s)" % INSTALLED if installed else "exists") if exists \
        else "does not exist yet"
    ctx.log("destination %s %s; on_existing is %s" % (ctx.dest, what, ctx.choices.on_existing))
    ctx.log("free at %s: %s; the staging needs about %s" % (free["measured_at"],
                                                            human(free["free_bytes"]), human(need)))
    return Result("%s; %s free" % (what, human(free["free_bytes"])),
                  {"exists": int(exists), "installed": int(installed), "staging": ctx.staging,
                   "free_bytes": free["free_bytes"], "compressors": ",".join(have)})


class EarlyCheck:
    """The quick check's half that needs no source: the install's manifest, and the stat walk of
    the destination against it (`kitmanifest.check_tree`), in a thread begun as soon as this run
    holds the destination's lock, while the runbook is still scanning the source. `current`
    (mode quick) takes it; nothing this run does writes to the destination before that."""

    def __init__(self, dest: str) -> None:
        self.dest = dest
        self.installed: Optional[dict] = None
        self.key: Optional[tuple] = None
        self.tree: Optional[dict] = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.key, self.installed = _load_keyed(os.path.join(self.dest, INSTALLED), None)
        except (OSError, ValueError):
            return
        if self.installed["header"].get("source_stat_fingerprint") is not None:
            self.tree = kitmanifest.check_tree(self.dest, self.installed)

    def take(self) -> tuple:
        """(installed manifest or None, check_tree's result or None)."""
        self._thread.join()
        return self.installed, self.tree


def begin_early_check(ctx: Context) -> None:
    """Start EarlyCheck when a quick re-run check may follow (the lock is held)."""
    if (ctx.choices.rerun == "quick" and ctx.locked
            and os.path.isfile(os.path.join(ctx.dest, INSTALLED))):
        ctx.early = EarlyCheck(ctx.dest)


def current(ctx: Context, mode: str = "quick", source_stat: str = "",
            linking: bool = False) -> Result:
    """Does the destination already hold this tree? `quick`: the source's stat fingerprint
    (`source_stat`, else the manifest's) against the one the install recorded, and every entry
    there against the install's manifest (no reading); `digest`: the install came from a source
    with this manifest's fingerprint and every file there still has its recorded digest (with
    `linking`, a staging linked from the install follows: the files are hashed even when the
    source changed). A file that fails the digest check is never linked into a staging: it is
    sent again."""
    ctx.up_to_date = None
    ctx.unlinkable = set()
    early, ctx.early = ctx.early, None
    tree = None
    if early is not None and mode == "quick":
        installed, tree = early.take()
        ctx.keep_installed(early.key, installed)
    else:
        try:
            installed = ctx.installed()
        except (OSError, ValueError):
            installed = None
    if installed is None or installed["header"].get("source_stat_fingerprint") is None:
        return _not_current(ctx, "no earlier install at %s (or its manifest is unreadable)"
                            % ctx.dest, mode)
    if mode == "digest":
        same_source = installed["header"].get("source_fingerprint") == ctx.fingerprint()
        if not same_source and not linking:
            return _not_current(ctx, "the destination holds an install of a different source "
                                "tree", mode)
        result = kitmanifest.verify(ctx.dest, installed, jobs(ctx.choices.jobs), limit=1 << 30)
        if not result["ok"]:
            ctx.unlinkable = set(result["missing"]) | {d["p"] for d in result["differ"]}
            for line in kitmanifest.describe(dict(result, missing=result["missing"][:20],
                                                  extra=result["extra"][:20],
                                                  differ=result["differ"][:20])):
                ctx.log(line)
            return _not_current(ctx, "the destination has changed since it was installed (%d "
                                "entries, listed above; they are sent again, never linked)"
                                % sum(result["counts"].values()), mode)
        if not same_source:
            return _not_current(ctx, "the source changed since the install", mode)
        why = "up to date (every file re-hashed)"
    else:
        stat_fp = source_stat or kitmanifest.stat_fingerprint(ctx.new_manifest()["entries"])
        quick = kitmanifest.quick_check(ctx.dest, installed, stat_fp, tree=tree)
        if not quick["ok"]:
            for rel in quick.get("changed", []):
                ctx.log("changed at the destination: %s" % rel)
            return _not_current(ctx, quick["why"], mode)
        why = "up to date (quick check)"
    ctx.up_to_date = why
    return Result(why, {"up_to_date": 1})


def _not_current(ctx: Context, why: str, mode: str) -> Result:
    if mode == "digest" and ctx.choices.on_existing == "refuse" and os.path.lexists(ctx.dest):
        raise StepError("destination %s holds a different install and on_existing is refuse (%s)"
                        % (ctx.dest, why))
    return Result(why, {"up_to_date": 0, "why": why})


def relocate(ctx: Context) -> Result:
    """Rewrite what names the old path (shebangs, activate scripts, pyvenv.cfg) in the verified
    staging, write the install's manifest, and put the rewritten files' digests in the stamp."""
    _require_lock(ctx)
    doc = _require(ctx, ("verified",), "relocate")
    # from here the staging is being rewritten: nothing may install it until relocate says so
    _write_stamp(ctx, dict(doc, stage="relocating"))
    result = kitrelocate.relocate(ctx.staging, ctx.old, ctx.dest, scan_elsewhere=False)
    if ctx.elsewhere is None or ctx.elsewhere[1] != result["old_prefixes"]:
        _cancel_elsewhere(ctx)
        ctx.elsewhere = (kitrelocate.Elsewhere(ctx.staging, result["old_prefixes"]),
                         result["old_prefixes"])
    m = ctx.new_manifest()
    algo = m["header"]["algo"]
    changes, digests = {}, {}
    for rel, info in result["rewritten"].items():
        change = {"s": info["s"]}
        if algo != "none":
            change["h"] = kitmanifest.digest(os.path.join(ctx.staging, rel), algo)
        changes[rel] = change
        digests[rel] = _sha256(os.path.join(ctx.staging, rel))
    installed = kitmanifest.relocated(m, changes, ctx.fingerprint())
    path = os.path.join(ctx.staging, INSTALLED)
    kitmanifest.save(installed, path)
    digests[INSTALLED] = _sha256(path)
    if result["remaining"]:
        raise StepError("still naming %s under bin/ after relocation: %s"
                        % (ctx.old, ", ".join(result["remaining"])), lines=result["remaining"])
    ctx.log("rewritten: %s" % (", ".join(sorted(result["rewritten"])) or "nothing"))
    _write_stamp(ctx, dict(doc, stage="relocated", relocated=digests))
    return Result("%d files rewritten" % len(result["rewritten"]),
                  {"rewritten": len(result["rewritten"])})


def swap(ctx: Context) -> Result:
    """Put the proven staging at the destination in one rename, then prove it there: sys.prefix
    is the destination, and the console scripts start from it (prove_scripts). What was there is
    kept until the run ends (a backup with on_existing: backup, for good)."""
    _require_lock(ctx)
    doc = _require(ctx, ("proven",), "swap")
    transient = ctx.choices.on_existing == "replace" and os.path.lexists(ctx.dest)
    ctx.critical += 1
    try:
        if transient:
            # replace: what was there waits as a backup (not pruned, not unshared) until the run
            # ends, for a rollback
            result = hostfs.swap(ctx.staging, ctx.dest, "backup",
                                 swap_atomic=ctx.choices.swap_atomic,
                                 unshare=False)
        else:
            # keep_backups is applied once the new install passed its checks (prune_after_checks)
            result = hostfs.swap(ctx.staging, ctx.dest, ctx.choices.on_existing,
                                 swap_atomic=ctx.choices.swap_atomic)
        previous = result.get("previous")
        ctx.swapped = {"previous": previous, "transient": transient,
                       "policy": ctx.choices.on_existing}
        _write_stamp(ctx, None)
    finally:
        ctx.critical -= 1
    _record_install(ctx)
    kept = previous if previous not in (None, "none", "removed") and not transient else ""
    if result.get("previous_failed"):
        ctx.log("the previous destination had failed its checks: kept apart at %s (not a backup; "
                "replaced by the next failure)" % kept)
        kept = ""
    facts = {"previous": previous, "backup": kept, "atomic": int(bool(result.get("atomic", True)))}
    if result.get("note"):
        ctx.log(result["note"])
    prefix, version = interpreter_prefix(os.path.join(ctx.dest, "bin", "python"), ctx.dest)
    if os.path.realpath(prefix) != os.path.realpath(ctx.dest):
        raise StepError("the moved interpreter reports sys.prefix %s, expected %s"
                        % (prefix, ctx.dest), facts)
    facts["prefix"] = prefix
    proven, failed = prove_scripts(ctx.dest, list(doc.get("relocated") or {}))
    facts["scripts"] = len(proven)
    if failed:
        raise StepError(failed[0], facts, lines=failed)
    if proven:
        ctx.log("%d console scripts started from %s by their shebangs (sys.prefix there): %s%s"
                % (len(proven), ctx.dest, ", ".join(proven[:8]),
                   ", ..." if len(proven) > 8 else ""))
    _report_elsewhere(ctx, facts)
    if kept:
        ctx.log("the previous destination is kept at %s" % kept)
    what = "kept until the run ends (replace)" if transient else previous
    return Result("installed at %s; previous: %s" % (ctx.dest, what), facts)


def _record_install(ctx: Context) -> None:
    """The new install's record (hostfs.read_info): when, from which runbook and spec, the
    source's manifest fingerprint; its checks not run yet."""
    try:
        fingerprint = ctx.fingerprint()
    except (StepError, OSError, ValueError):
        fingerprint = ""
    hostfs.write_info(ctx.dest, installed=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      origin=ctx.choices.origin, source_fingerprint=fingerprint, checks="not run",
                      put_back_after=None, failed_install=None)


def prune_after_checks(ctx: Context) -> None:
    """keep_backups, applied once this run's new install proved itself (its checks passed, or
    the spec has none and its env file is written): an install that fails never evicts a good
    backup."""
    s = ctx.swapped
    if (s is None or s.get("transient") or s.get("policy") != "backup"
            or not ctx.choices.keep_backups):
        return
    for gone in hostfs.prune_backups(ctx.dest, ctx.choices.keep_backups):
        ctx.log("removed an older backup (keep_backups: %s): %s (the new install passed its "
                "checks)" % (ctx.choices.keep_backups, gone))


def exports(ctx: Context) -> Result:
    """The env file: VIRTUAL_ENV, CUDA_HOME, PATH, LD_LIBRARY_PATH with the venv's dirs first."""
    _require_lock(ctx)
    c = ctx.choices
    text, summary = kitexports.render(ctx.dest, c.cuda_home, list(c.library_path_first),
                                      dict(c.env), c.origin)
    if summary["missing_dirs"]:
        raise StepError("library dirs do not exist in the venv: %s"
                        % ", ".join(summary["missing_dirs"]), lines=summary["missing_dirs"])
    kitexports.write(ctx.env_out, text, venv=ctx.dest)
    ctx.log("env file %s; LD_LIBRARY_PATH: %s" % (ctx.env_out, (
        "the venv's %s first" % ":".join(summary["library_dirs"]) if summary["library_dirs"]
        else "unchanged (the venv has no library directory to put first)")))
    if not ctx.probe_config and ctx.swapped is not None:
        hostfs.write_info(ctx.dest, checks="none")
        prune_after_checks(ctx)
    return Result(ctx.env_out, {"file": ctx.env_out,
                                "library_dirs": len(summary["library_dirs"])})


ENV_COPY = "env.sh"     # in the state directory: what the checks source


def own_env_copy(ctx: Context) -> str:
    """The env file the checks source, as root: the install's own copy (DEST/.rb-env.sh, which
    exports wrote beside the public one), opened without following a link, a regular file of this
    user not writable by others, copied into this run's private state directory. Never the public
    env file by its name: that is in the destination's parent, where another user may swap it."""
    if not ctx.state:
        raise StepError("the engine has no private state directory")
    got = safefs.read_in(ctx.dest, kitexports.IN_INSTALL, limit=1 << 20)
    if got is None:
        raise StepError("the install at %s holds no env file of its own (%s: missing, or not a "
                        "regular file): run the exports step again (--from exports)"
                        % (ctx.dest, kitexports.IN_INSTALL))
    data, st = got
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o022:
        raise StepError("refusing to source %s as %s: it is owned by %s, mode %04o (not written "
                        "by this kit); look at it, remove it and run the exports step again"
                        % (os.path.join(ctx.dest, kitexports.IN_INSTALL),
                           privacy.user_name(os.geteuid()), privacy.owner(st),
                           stat.S_IMODE(st.st_mode)))
    path = os.path.join(ctx.state, ENV_COPY)
    write_file(path, data, 0o600)
    return path


def probe(ctx: Context, report: str = "") -> Result:
    """The checks (rbprobes, from this kit) with the moved interpreter and the install's own env
    file sourced (own_env_copy); the report is written to `report` (default: the state
    directory)."""
    report = report or os.path.join(ctx.state, "probe-report.json")
    info = hostfs.read_info(ctx.dest)
    if ctx.swapped is None and ctx.up_to_date is None and info.get("put_back_after"):
        raise StepError("the install at %s is the previous one, put back after %s failed (the "
                        "failed install is kept at %s): checking it would not check what this spec "
                        "installs; run every step again" % (
                            ctx.dest, info["put_back_after"], info.get("failed_install", "-")),
                        {"put_back_after": info["put_back_after"]})
    own_env = own_env_copy(ctx)
    env = child_env()
    # the moved interpreter, isolated (rbrules.launch: the checks see the venv's own
    # site-packages and the env file's variables, never a PYTHON* variable or the working
    # directory), from /
    argv = (["bash", "-c", 'source "$1" && shift && exec "$@"', "rb", own_env]
            + launch.argv(os.path.join(ctx.dest, "bin", "python"), "rbprobes", site=True)
            + ["run", "--config-json", ctx.probe_config, "--report", report])
    if ctx.capture:
        rc, out, err = run_quiet(argv, ctx.choices.timeout, env)
        ctx.log(err)
    else:
        # the checks' table goes to the runbook's log as it is printed
        rc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=2, env=env, cwd="/",
                            timeout=ctx.choices.timeout, check=False).returncode
        out = err = ""
    summary: dict = {}
    names: List[str] = []
    try:
        with open(report, encoding="utf-8") as f:
            doc = json.load(f)
        summary = doc.get("summary", {})
        names = [str((c.get("values") or {}).get("name") or c.get("id"))
                 for c in doc.get("checks", []) if c.get("status") == "fail"]
        # the checked packages' own warnings (rbprobes keeps them): the run's log only
        for warned in doc.get("warnings") or []:
            ctx.trace("a warning while the checks ran (from the checked packages): %s" % warned)
    except (OSError, ValueError, AttributeError):
        pass
    facts = {"report": report, "pass": summary.get("pass", 0), "skip": summary.get("skip", 0),
             "fail": summary.get("fail", 0)}
    detail = "%s passed, %s skipped, %s failed" % (facts["pass"], facts["skip"], facts["fail"])
    if rc != 0:
        ctx.failed_checks = ", ".join(names) or "the checks"
        hostfs.set_checks(ctx.dest, False, "checks failed: " + ctx.failed_checks)
        raise StepError("checks failed: " + detail if summary else
                        "the checks did not run (exit %s)" % rc, facts, tail(err or out), rc=rc)
    hostfs.set_checks(ctx.dest, True)
    prune_after_checks(ctx)
    return Result(detail, facts)


def rollback(ctx: Context, after: str = "") -> Result:
    """Put back what this run's swap replaced; the failed install is kept apart as
    `DEST.rb-failed` (removed under on_existing: replace), never as a backup. Nothing was there:
    the new install stays, without its manifest, so that no re-run takes it for a good install."""
    _require_lock(ctx)
    s = ctx.swapped
    if s is None:
        return Result("nothing to roll back: no swap in this run", status="skipped")
    previous = s["previous"]
    what = ctx.failed_checks if after == "probe" and ctx.failed_checks else \
        "step %s" % (after or "a step")
    ctx.critical += 1
    try:
        if previous in (None, "none", "removed"):
            ctx.swapped = None
            try:
                os.unlink(os.path.join(ctx.dest, INSTALLED))
            except FileNotFoundError:
                pass
            return Result("nothing was at %s before this run: the new install stays, without "
                          "its manifest (a re-run installs it again)" % ctx.dest)
        from_failed = previous == hostfs.failed_path(ctx.dest)
        number = None if from_failed else int(previous.rsplit(".", 1)[1])
        got = hostfs.restore(ctx.dest, number, env_file=ctx.env_out,
                             swap_atomic=ctx.choices.swap_atomic,
                             failed="%s failed after the swap (runbook rollback)" % what,
                             from_failed=from_failed)
        ctx.swapped = None
        kept: Optional[str] = got["kept_current_as"]
        if s["transient"]:
            remove_tree(kept)
            kept = None
        hostfs.write_info(ctx.dest, put_back_after=what, failed_install=kept or "removed")
    finally:
        ctx.critical -= 1
    where = "kept at %s" % kept if kept else "removed (on_existing: replace)"
    ctx.log("rolled back: %s failed; the previous install is at %s again; the failed one is %s"
            % (what, ctx.dest, where))
    return Result("rolled back: %s failed; failed install %s" % (what, where),
                  {"restored": previous, "kept_current_as": kept, "rolled_back": 1})
RB_PY_B47E6041
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
  cat >"${dir}"/rbkit/fanout.py <<'RB_PY_1F141AB8'
"""Fan-out: the install on one node, and the comparison of every node's report.

`python -m rbkit.fanout node --dir DIR --dest DEST --old OLD --choices JSON ...` runs on each node (started by the
cluster engine: `srun` or `clush`). DIR holds the unpacked bundle: `kit/` (this package),
`manifest.jsonl`, and `payload` (the tar stream, compressed as the run chose) unless the node
script left it inside DIR.tar (it does: the payload is then streamed from there into staging,
written once on the node). It installs through the install engine's steps (engine.install, the
functions a single-host runbook's destination runs too: stage, receive, verify, relocate, prove,
swap with its post-swap proof, exports, probe; a failure past the swap rolls back), holding the
destination's lock, and prints its report on stdout as `RBFAN NODE I/N CHUNK` lines: the compact
JSON cut into chunks of at most CHUNK characters, so every line is shorter than the 1 KiB messages
in which slurmstepd forwards task output (a longer line from one node could be cut and
interleaved with another node's output by srun; clush keeps nodes apart anyway).

A re-run's bundle carries only what changed since the last fan-out (`delta.names` lists it): the
node links its unchanged files from its install into staging and extracts the rest over them; a
node that lacks something the bundle does not carry (no earlier install, a file changed there, a
file that failed the digest check with `rerun: digest`) reports `needs_full` and installs
nothing. `nodes --which needs-full` names those nodes from the engine's output; the runbook sends
them the whole bundle in a second round.

`python -m rbkit.fanout compare --nodes N1,N2,... --engine-out OUT [--engine-out OUT2] --out-dir D
--success all|N` reads those lines back (any prefix such as clush's `node01: ` or srun's `3: ` is
ignored, chunks are put back together per node, in any order; a node's report in a later file
replaces its earlier one), writes each node's report, prints a nodes x checks table with identical
rows folded, names the odd nodes with what differs and the nodes that sent nothing, and exits 0
when the success policy holds.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import socket
import sys
from typing import Any, Dict, List, Optional

from . import engine, hostfs
from .choices import add_run_options
from .lock import Lock

MARK = "RBFAN "
CHUNK = 800
LINE = re.compile(r"RBFAN (\S+) (\d+)/(\d+) (.*)$")
STEPS = engine.STEPS
PAYLOAD = "payload"      # the tar stream in the bundle, compressed as the run chose
LOCK_WAIT_S = 10.0
VOLATILE = re.compile(r"(duration|seconds|elapsed|_s$|^started$|^time|pid)")
SOURCE_IDENTITY = "source-identity.json"   # in the bundle: the source's hostfs.identity
PRE = ("preflight",)     # a node's steps before the install's, in its report only when they fail


def check_source(ctx: engine.Context, path: str) -> engine.Result:
    """This node's destination is not the source, nor inside it, nor around it, whatever the
    names (a node that is the source host, or shares its file system): the source's identity
    (`path`, the bundle's SOURCE_IDENTITY, from the head's scan) against this node's
    hostfs.identity of the destination, by hostfs.same_or_nested; refused with the message of the
    single-host route's preflight. Nothing is written before it."""
    try:
        with open(path, encoding="utf-8") as f:
            source = json.load(f)
    except (OSError, ValueError) as exc:
        raise engine.StepError("refusing to install %s: the bundle holds no source identity to "
                               "compare it with (%s: %s); pack the bundle again: run the runbook "
                               "from fan_pack" % (ctx.dest, path, exc)) from None
    if not isinstance(source, dict) or not source.get("realpath"):
        raise engine.StepError("refusing to install %s: %s is not a source identity; pack the "
                               "bundle again: run the runbook from fan_pack" % (ctx.dest, path))
    why = hostfs.same_or_nested(source, hostfs.identity(ctx.dest))
    if why:
        raise engine.StepError("refusing to install %s: %s" % (ctx.dest, why))
    return engine.Result("%s is apart from the source %s" % (ctx.dest, source["realpath"]))


def node(a: argparse.Namespace) -> int:
    """Install and probe on this node through the engine's steps (engine.install: the same
    functions a single-host runbook's destination runs); print the node's report. Exit 0 when
    every step passed, 3 when this node needs the whole bundle, else 1."""
    dest = a.dest.rstrip("/")
    bundle = a.dir.rstrip("/") + ".tar"
    payload = os.path.join(a.dir, PAYLOAD)
    # the payload is read from inside the bundle file (the node script unpacked the rest), so a
    # node writes it once, into staging; a bundle unpacked whole has it as a file
    producer = ["cat", "--", payload] if os.path.exists(payload) else \
        ["tar", "-xOf", bundle, "./" + PAYLOAD]
    delta = os.path.join(a.dir, "delta.names")
    # the engine's name for this node: Slurm's (it may differ from the hostname), else the hostname
    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    doc: Dict[str, Any] = {"node": name, "dest": dest, "steps": [], "ok": False, "probe": None}
    logs: List[str] = []
    ctx = engine.Context(dest, a.choices, old=a.old, compression=a.compression,
                         manifest=os.path.join(a.dir, "manifest.jsonl"),
                         probe_config=a.probe_config, capture=True, log=logs.append)
    ctx.state = engine.make_state()
    lock = Lock(dest, "fan-out node %s (%s)" % (name, a.choices.origin), LOCK_WAIT_S,
                logs.append)
    try:
        # never into the source (before the lock: nothing is written beside a refused one)
        pre = engine.run(ctx, "preflight", check_source, os.path.join(a.dir, SOURCE_IDENTITY))
        if pre["status"] != "failed":
            engine.run(ctx, "lock", engine.take_lock, lock)
        rc = engine.install(ctx, producer, delta if os.path.exists(delta) else None) \
            if ctx.locked else 1
        engine.finish(ctx)
        _report(doc, ctx.events, rc)        # before the state goes: the checks' report is there
    finally:
        engine.stop_background(ctx)
        lock.release()
        shutil.rmtree(ctx.state, ignore_errors=True)
    # CPU seconds of this node's install (its children and itself): what the node's cores did
    ru = [resource.getrusage(w) for w in (resource.RUSAGE_CHILDREN, resource.RUSAGE_SELF)]
    doc["cpu_s"] = round(sum(r.ru_utime + r.ru_stime for r in ru), 2)
    emit(doc)
    if rc == 0:
        # installed: the bundle and its unpacked kit leave the node's scratch (a failed node
        # keeps them, for `--from fan_install`)
        shutil.rmtree(a.dir, ignore_errors=True)
        try:
            os.unlink(bundle)
        except OSError:
            pass
    return rc


def _report(doc: Dict[str, Any], events: List[dict], rc: int) -> None:
    """The node's report from the engine's events: one entry per step (id, ok, rc, seconds, and
    the error or why it was skipped), and what the comparison and the re-run read."""
    for e in events:
        facts = e.get("facts") or {}
        if e["step"] in PRE + ("lock", "current", "finish"):
            if facts.get("up_to_date"):
                doc["up_to_date"] = e["detail"]
            if e["status"] != "failed":
                continue                  # named in the report only when it failed
        entry: Dict[str, Any] = {"id": e["step"], "ok": e["status"] != "failed",
                                 "rc": facts.get("rc", 0) if e["status"] == "failed" else 0,
                                 "seconds": e["duration_s"]}
        if e["status"] == "failed":
            entry["error"] = e.get("error") or [e["detail"]]
        if e["status"] == "skipped":
            entry["skipped"] = e["detail"].replace("skipped: ", "", 1)
        doc["steps"].append(entry)
        if e["step"] == "stage" and facts.get("delta"):
            doc["delta"] = {k: facts.get(k) for k in ("linked", "linked_bytes", "send_files",
                                                      "send_bytes")}
        if e["step"] == "stage" and facts.get("needs_full"):
            doc["needs_full"] = e["detail"].replace("needs the whole bundle: ", "", 1)
        if e["step"] == "verify":
            doc["verify"] = {k: facts.get(k) for k in ("checked", "hashed", "linked", "streamed")}
        if e["step"] == "swap" and facts.get("previous"):
            doc["previous"] = facts["previous"]
        if e["step"] == "rollback" and e["status"] == "ok":
            doc["rolled_back"] = facts
        if e["step"] == "probe" and facts.get("report"):
            try:
                with open(facts["report"], encoding="utf-8") as f:
                    doc["probe"] = json.load(f)
            except (OSError, ValueError):
                pass
    doc["ok"] = rc == 0


def pending(reports: Dict[str, Dict[str, Any]], nodes: List[str]) -> List[str]:
    """Nodes whose report says the re-run's bundle was not enough (they need the whole one)."""
    return [n for n in nodes if (reports.get(n) or {}).get("needs_full")]


def emit(doc: Dict[str, Any], out=None) -> None:
    """Print a node's report as `RBFAN NODE I/N CHUNK` lines (see the module's docstring)."""
    out = out or sys.stdout
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    parts = [text[i:i + CHUNK] for i in range(0, len(text), CHUNK)]
    for i, part in enumerate(parts, 1):
        out.write("%s%s %d/%d %s\n" % (MARK, doc["node"], i, len(parts), part))
        out.flush()


def parse_reports(lines) -> Dict[str, Dict[str, Any]]:
    """Node reports from engine output: the `RBFAN NODE I/N CHUNK` lines, whatever their prefix,
    put together per node. A report with a chunk missing or not JSON is no report."""
    chunks: Dict[str, Dict[int, str]] = {}
    counts: Dict[str, int] = {}
    for line in lines:
        at = line.find(MARK)
        m = LINE.match(line[at:].rstrip("\r\n")) if at >= 0 else None
        if not m:
            continue
        name, i, n = m.group(1), int(m.group(2)), int(m.group(3))
        if counts.setdefault(name, n) != n or not 1 <= i <= n:
            continue
        chunks.setdefault(name, {})[i] = m.group(4)
    out: Dict[str, Dict[str, Any]] = {}
    for name, got in chunks.items():
        if len(got) != counts[name]:
            continue
        try:
            doc = json.loads("".join(got[i] for i in range(1, counts[name] + 1)))
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("node") == name:
            out[name] = doc
    return out


def match_nodes(nodes: List[str], reports: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Reports keyed by the spec's node names: a node that reported its full hostname
    (node01.cluster.example) counts as node01 when the spec names node01; others are dropped."""
    out: Dict[str, Dict[str, Any]] = {}
    for name, doc in reports.items():
        short = name.split(".", 1)[0]
        key = name if name in nodes else short if short in nodes else None
        if key is not None and key not in out:
            out[key] = dict(doc, node=key) if key != name else doc
    return out


def _stable(values: Any) -> Any:
    if isinstance(values, dict):
        return {k: _stable(v) for k, v in sorted(values.items()) if not VOLATILE.search(str(k))}
    if isinstance(values, list):
        return [_stable(v) for v in values]
    return values


def cells(doc: Optional[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """One node's row: column -> {"status": pass|fail|skip|-, "detail": what to compare}."""
    row: Dict[str, Dict[str, Any]] = {}
    if doc is None:
        return row
    for s in doc.get("steps", []):
        if s["id"] == "probe":
            continue
        row[s["id"]] = {"status": "pass" if s["ok"] else "fail",
                        "detail": None if s["ok"] else "; ".join(s.get("error", []))[:300]}
    probe = doc.get("probe") or {}
    for c in probe.get("checks", []):
        detail = c.get("reason") or ""
        row["check:" + str(c.get("id"))] = {"status": c.get("status", "?"),
                                            "detail": detail[:300],
                                            "values": _stable(c.get("values") or {})}
    return row


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= 160 else text[:157] + "..."


def compare(nodes: List[str], reports: Dict[str, Dict[str, Any]], engine_err: List[str],
            success: str) -> Dict[str, Any]:
    rows = {n: cells(reports.get(n)) for n in nodes}
    # a step before the install's is in a report only when it failed: every other node that
    # reported passed it
    pre = [s for s in PRE if any(s in r for r in rows.values())]
    for n in nodes:
        for s in pre:
            if n in reports:
                rows[n].setdefault(s, {"status": "pass", "detail": None})
    columns: List[str] = pre + [s for s in STEPS
                                if s != "probe" and any(s in r for r in rows.values())]
    for r in rows.values():
        for col in r:
            if col.startswith("check:") and col not in columns:
                columns.append(col)
    if any("rollback" in r for r in rows.values()):
        columns.append("rollback")     # last: what happened after the checks
    # fold identical rows (status and compared values per column)
    groups: Dict[str, List[str]] = {}
    for n in nodes:
        if n not in reports:
            continue
        key = json.dumps({c: [rows[n].get(c, {}).get("status", "-"),
                              rows[n].get(c, {}).get("values")] for c in columns}, sort_keys=True)
        groups.setdefault(key, []).append(n)
    ordered = sorted(groups.values(), key=lambda g: (-len(g), nodes.index(g[0])))
    majority = ordered[0][0] if ordered else None
    odd: Dict[str, List[str]] = {}
    for n in nodes:
        if n not in reports or n == majority or (ordered and n in ordered[0]):
            continue
        diffs = []
        not_run = []
        for c in columns:
            mine, ref = rows[n].get(c, {}), rows[majority].get(c, {})
            if c not in rows[n] and c in rows[majority]:
                not_run.append(c)
            elif mine.get("status", "-") != ref.get("status", "-"):
                what = "%s: %s (others: %s)" % (c, mine.get("status", "not run"),
                                                 ref.get("status", "not run"))
                if mine.get("detail"):
                    what += ": " + mine["detail"]
                diffs.append(what)
            elif mine.get("values") != ref.get("values"):
                mv, rv = mine.get("values") or {}, ref.get("values") or {}
                for k in sorted(set(mv) | set(rv)):
                    if mv.get(k) != rv.get(k):
                        diffs.append("%s.%s: %s (others: %s)" % (c, k, _short(mv.get(k)),
                                                                 _short(rv.get(k))))
        if not_run:
            diffs.append("not run after that: " + ", ".join(not_run))
        odd[n] = diffs
    missing: Dict[str, List[str]] = {}
    for n in nodes:
        if n not in reports:
            said = [ln.strip() for ln in engine_err if re.search(r"\b%s\b" % re.escape(n), ln)]
            missing[n] = said[-3:] or ["no report came back (node unreachable or killed)"]
    good = [n for n in nodes if reports.get(n, {}).get("ok")]
    need = len(nodes) if success == "all" else int(success)
    return {"nodes": nodes, "columns": columns, "groups": ordered, "odd": odd, "missing": missing,
            "ok_nodes": good, "failed_nodes": [n for n in nodes if n in reports and n not in good],
            "success": success, "needed": need, "passed": len(good) >= need,
            "rolled_back": {n: reports[n]["rolled_back"] for n in nodes
                            if n in reports and reports[n].get("rolled_back")},
            "rows": {n: {c: rows[n].get(c, {}).get("status", "-") for c in columns}
                     for n in nodes if n in reports}}


def fold(names: List[str]) -> str:
    """node01,node02,node03,node05 -> node[01-03,05] (a common prefix and numeric suffix only)."""
    parsed = [re.match(r"^(.*?)(\d+)$", n) for n in names]
    if len(names) < 2 or not all(parsed) or len({m.group(1) for m in parsed}) != 1 or \
            len({len(m.group(2)) for m in parsed}) != 1:
        return ",".join(names)
    prefix, width = parsed[0].group(1), len(parsed[0].group(2))
    nums = sorted(int(m.group(2)) for m in parsed)
    parts, start, prev = [], nums[0], nums[0]
    for x in nums[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        parts.append(("%0*d" % (width, start)) if start == prev else
                     "%0*d-%0*d" % (width, start, width, prev))
        if x is not None:
            start = prev = x
    return "%s[%s]" % (prefix, ",".join(parts))


def table(result: Dict[str, Any]) -> str:
    cols = result["columns"]
    short = [c[6:] if c.startswith("check:") else c for c in cols]
    head = ["nodes"] + short
    body = []
    for group in result["groups"]:
        body.append([fold(group)] + [result["rows"][group[0]][c] for c in cols])
    for n, why in result["missing"].items():
        body.append([n] + ["-"] * len(cols))
    widths = [max(len(str(r[i])) for r in [head] + body) for i in range(len(head))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip() for r in [head] + body]
    for n, diffs in result["odd"].items():
        lines.append("odd node %s: %s" % (n, "; ".join(diffs) or "differs"))
    for n, why in result["missing"].items():
        lines.append("no report from %s: %s" % (n, " | ".join(why)))
    for n, back in sorted(result.get("rolled_back", {}).items()):
        lines.append("rolled back %s: its checks failed, the previous install is in place again; "
                     "the one that failed is kept at %s" % (n, back.get("kept_current_as")))
    lines.append("%d/%d nodes passed; success policy %s needs %d: %s" % (
        len(result["ok_nodes"]), len(result["nodes"]), result["success"], result["needed"],
        "met" if result["passed"] else "NOT met"))
    return "\n".join(lines)


def read_reports(nodes: List[str], paths: List[str]) -> Dict[str, Dict[str, Any]]:
    """Reports from engine output files, in order: a node's report in a later file (the whole
    bundle's round after a re-run's) replaces its earlier one."""
    reports: Dict[str, Dict[str, Any]] = {}
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            reports.update(match_nodes(nodes, parse_reports(f)))
    return reports


def cmd_nodes(a: argparse.Namespace) -> int:
    """The nodes whose report (in one engine output) asks for the whole bundle, or passed."""
    nodes = [n for n in a.nodes.split(",") if n]
    reports = read_reports(nodes, [a.engine_out])
    if a.which == "passed":
        print(",".join(n for n in nodes if (reports.get(n) or {}).get("ok")))
    else:
        print(",".join(pending(reports, nodes)))
    return 0


def cmd_compare(a: argparse.Namespace) -> int:
    nodes = [n for n in a.nodes.split(",") if n]
    reports = read_reports(nodes, a.engine_out)
    err: List[str] = []
    for path in a.engine_err:
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                err += f.read().splitlines()
    result = compare(nodes, reports, err, a.success)
    os.makedirs(a.out_dir, exist_ok=True)
    for n, doc in reports.items():
        with open(os.path.join(a.out_dir, "node-%s.json" % n), "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
        if doc.get("probe"):
            with open(os.path.join(a.out_dir, "probe-%s.json" % n), "w", encoding="utf-8") as f:
                json.dump(doc["probe"], f, indent=2, sort_keys=True)
    with open(os.path.join(a.out_dir, "fanout.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2, sort_keys=True)
    print(table(result), file=sys.stderr)
    # for the runbook: `set KEY VALUE` lines, as the engine answers (serve.py)
    facts = {"passed": int(result["passed"]), "ok": len(result["ok_nodes"]), "nodes": len(nodes),
             "odd": fold(sorted(result["odd"])) if result["odd"] else "",
             "missing": fold(sorted(result["missing"])) if result["missing"] else "",
             "rolled_back": fold(sorted(result["rolled_back"])) if result["rolled_back"] else ""}
    for key, value in sorted(facts.items()):
        print("set\t%s\t%s" % (key, value))
    print("done\t%s\t%d/%d nodes passed" % ("ok" if result["passed"] else "failed",
                                              len(result["ok_nodes"]), len(nodes)))
    return 0 if result["passed"] else 1


def _verdict(doc: Dict[str, Any]) -> str:
    """A node's report in a few words: ok, needs the whole bundle, or the step that failed."""
    if doc.get("needs_full"):
        return "needs the whole bundle"
    if doc.get("ok"):
        return "up to date" if doc.get("up_to_date") else "ok"
    failed = [s["id"] for s in doc.get("steps") or [] if not s.get("ok")]
    checks = [str(c.get("id")) for c in (doc.get("probe") or {}).get("checks") or []
              if isinstance(c, dict) and c.get("status") == "fail"]
    if failed and failed[0] != "probe" or not checks:
        return "failed in %s" % failed[0] if failed else "failed"
    return "failed check%s %s" % ("s" if len(checks) > 1 else "", ", ".join(checks[:3]))


def watch(nodes: List[str], path: str, stop: str, every: float, limit: float,
          out=None, clock=None, sleep=None) -> int:
    """Progress of one engine round, as its nodes finish: read the engine's output as it grows
    (whole lines only), and print a line when a node's report is complete (`node03 ok: 3/8 nodes
    done (1 failed), 5 running`) and, between those, every `every` seconds. Ends when the file
    `stop` exists (the round ended: a last line with the count), when every node reported, or
    after `limit` seconds. A bounded loop; it never fails the round it watches."""
    import time

    out = out or sys.stdout
    clock = clock or time.monotonic
    sleep = sleep or time.sleep
    parent = os.getppid()                   # the runbook's job: gone (killed, ^C) ends the watch
    start = last = clock()
    seen: Dict[str, str] = {}
    lines: List[str] = []
    offset, rest = 0, ""

    def say(text: str) -> None:
        out.write(text + "\n")
        out.flush()

    def count() -> str:
        bad = sum(1 for v in seen.values() if v != "ok" and v != "up to date")
        running = len(nodes) - len(seen)
        return "%d/%d nodes done%s%s" % (len(seen), len(nodes),
                                          " (%d not ok)" % bad if bad else "",
                                          ", %d running" % running if running else "")

    while True:
        stopped = os.path.exists(stop)      # before the read: what came before the stop is read
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            data = b""
        offset += len(data)
        text = rest + data.decode("utf-8", "replace")
        complete, _, rest = text.rpartition("\n")
        if complete:
            lines += complete.split("\n")
            for name, doc in sorted(match_nodes(nodes, parse_reports(lines)).items()):
                if name not in seen:
                    seen[name] = _verdict(doc)
                    last = clock()
                    say("%s %s: %s, %.0f s" % (name, seen[name], count(), last - start))
        now = clock()
        if os.getppid() != parent:
            return 0
        if stopped or len(seen) == len(nodes) or now - start >= limit:
            if len(seen) < len(nodes):
                say("%s when the round ended, %.0f s" % (count(), now - start))
            return 0
        if now - last >= every:
            last = now
            say("%s, %.0f s" % (count(), now - start))
        sleep(min(1.0, every))


def cmd_watch(a: argparse.Namespace) -> int:
    return watch([n for n in a.nodes.split(",") if n], a.engine_out, a.stop, a.every, a.limit)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rbkit.fanout", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    n = sub.add_parser("node")
    n.add_argument("--dir", required=True)
    add_run_options(n)          # --dest, --old, --compression, --probe-config, --choices
    n.set_defaults(fn=node)
    c = sub.add_parser("compare")
    c.add_argument("--nodes", required=True)
    c.add_argument("--engine-out", action="append", required=True,
                   help="engine output; repeated: a later file's reports replace earlier ones")
    c.add_argument("--engine-err", action="append", default=[])
    c.add_argument("--success", default="all")
    c.add_argument("--out-dir", required=True)
    c.set_defaults(fn=cmd_compare)
    nd = sub.add_parser("nodes", help="nodes of one engine output that need the whole bundle, "
                        "or that passed")
    nd.add_argument("--which", choices=("needs-full", "passed"), required=True)
    nd.add_argument("--nodes", required=True)
    nd.add_argument("--engine-out", required=True)
    nd.set_defaults(fn=cmd_nodes)
    w = sub.add_parser("watch", help="print the round's progress as its nodes finish")
    w.add_argument("--nodes", required=True)
    w.add_argument("--engine-out", required=True)
    w.add_argument("--stop", required=True, help="the round ended when this file exists")
    w.add_argument("--every", type=float, default=10.0)
    w.add_argument("--limit", type=float, default=3600.0)
    w.set_defaults(fn=cmd_watch)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    a = parser().parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
RB_PY_1F141AB8
  cat >"${dir}"/rbkit/filehash.py <<'RB_PY_84902F71'
"""Files' digests, as a manifest records them: one file's (`digest`, through a link never), and
many files' in parallel (`digests`: forked workers where this process has no threads, else
threads). Public through rbkit.manifest (manifest.digest, manifest.digests, ...).
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from typing import Any, Callable, Optional

from rbprobes import workers

CHUNK = 1 << 20


def hasher(algo: str) -> Callable[[], Any]:
    """A function making a new hash of `algo` (blake2b: 32 bytes; hashlib's named constructors
    are faster than hashlib.new)."""
    if algo == "blake2b":
        return functools.partial(hashlib.blake2b, digest_size=32)
    return getattr(hashlib, algo, None) or functools.partial(hashlib.new, algo)


class Changed(ValueError):
    """A file read for its digest did not have the size the walk (or the scan) saw: the source
    changed while it was being moved."""


def digest(path: str, algo: str, buf: Optional[bytearray] = None,
           size: Optional[int] = None) -> str:
    """The file's digest; a link at `path` (made after the walk saw a file) is an error, not a
    path to another file. `buf`: a buffer of CHUNK bytes to read into (one per thread: no new
    1 MiB object, and no fresh pages, each read). `size`: what the walk saw; other than the bytes
    read, Changed is raised (the digest would not be of the entry's file)."""
    h = hasher(algo)()
    if buf is None:
        buf = bytearray(CHUNK)
    view = memoryview(buf)
    total = 0
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC)
    with open(fd, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            total += n
            h.update(view[:n])
    if size is not None and total != size:
        raise Changed("%s: %d bytes read, %d when the tree was walked: it changed while being "
                      "moved (stop what writes to the source, then run again)" % (path, total, size))
    return h.hexdigest()


def digests(root: str, rels: list, algo: str, jobs: int, sizes: Optional[list] = None) -> list:
    """digest() of each of `rels` (paths under `root`; `sizes`: each one's size as walked), in
    their order. Where this process has no threads, by `jobs` forked workers taking the biggest
    files first (_digests_forked): threads of one Python hash at one thread's pace, processes at
    one each. Else by `jobs` threads that take the next path from one shared iterator (no task
    object nor wake-up per file, which a thread pool's per-file futures cost). The figures:
    docs/benchmarks.md, "Figures behind choices in the code". The first error (in the order of
    `rels`) is raised once every worker stopped."""
    n = max(1, min(jobs, len(rels)))
    if n > 1 and workers.forkable():
        return _digests_forked(root, rels, algo, n, sizes)
    out: list = [None] * len(rels)
    todo = iter(enumerate(rels))
    errors: list = []

    def work() -> None:
        buf = bytearray(CHUNK)
        # errors looked at before a path is taken, never after: a path taken is hashed, so every
        # path before the first one that failed is (its error, if any, is the one raised)
        while not errors:
            try:
                i, rel = next(todo)         # a list iterator's next() is one step under the GIL
            except StopIteration:
                return
            try:
                out[i] = digest(os.path.join(root, rel), algo, buf,
                                None if sizes is None else sizes[i])
            except BaseException as exc:     # re-raised below, in the caller
                errors.append((i, exc))
                return

    if n == 1:
        work()
    else:
        threads = [threading.Thread(target=work, daemon=True) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise min(errors, key=lambda e: e[0])[1]
    return out


def _digests_forked(root: str, rels: list, algo: str, jobs: int,
                    sizes: Optional[list]) -> list:
    """digests() by forked workers (rbprobes.workers.over_workers), the biggest files first: a file
    a worker could not hash (or that no worker answered for) is hashed here again, in order, so
    that the first error is raised here as the threads' is."""
    buf = bytearray(CHUNK)

    def fn(i: int) -> Optional[str]:
        try:
            return digest(os.path.join(root, rels[i]), algo, buf,
                          None if sizes is None else sizes[i])
        except Exception:
            return None

    got, _workers = workers.over_workers(fn, list(sizes) if sizes is not None
                                         else [0] * len(rels), jobs)
    for i, h in enumerate(got):
        if h is None:
            got[i] = digest(os.path.join(root, rels[i]), algo, buf,
                            None if sizes is None else sizes[i])
    return got
RB_PY_84902F71
  cat >"${dir}"/rbkit/hostfs.py <<'RB_PY_5F73DE2D'
"""Small facts about paths on a host: what is there, how big, how much room, and the atomic swap.

The host side runs as root over trees other users wrote (see docs/design.md, "Threat model"):
`scan` reports what must not be moved silently (setuid/setgid/world-writable entries, links that
leave the tree, device nodes) and refuses it unless the spec allows it; `strip_special` removes
those mode bits from an extracted tree; `identity`/`same_or_nested` (rbkit.pathid) tell whether
the destination is the source under another name; `swap` and `restore` (rbkit.swapfs) never
replace a link with a directory, journal a swap that cannot be one rename, keep each backup
independent of the live install (rbkit.installs), and bring back an install's own env file.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
from typing import List, Optional

from rbrules import links
from rbrules.common import OUTSIDE_LINKS, SPECIAL_MODES  # noqa: F401 (the spec's choices)

from . import manifest, safefs
# public here (what callers use as hostfs.NAME): which path is which, and the swap's side
from .pathid import identity, mount_of, same_machine, same_or_nested  # noqa: F401
from .installs import (backup_dirs, backups, describe_install, failed_mark,  # noqa: F401
                       failed_path, list_installs, read_info, remove, set_checks, unshare_backup,
                       write_info)
from .swapfs import (RENAME_EXCHANGE, RENAME_NOREPLACE, SWAP_ATOMIC,  # noqa: F401
                     journal_path, prune_backups, recover_swap, restore, swap)

__all__ = [
    "scan", "link_escapes", "strip_special", "free_bytes", "stage",
    "identity", "mount_of", "same_machine", "same_or_nested",
    "swap", "restore", "backups", "backup_dirs", "prune_backups", "unshare_backup",
    "recover_swap", "journal_path", "describe_install", "failed_mark", "remove",
    "failed_path", "list_installs", "read_info", "write_info", "set_checks",
    "RENAME_EXCHANGE", "RENAME_NOREPLACE", "SWAP_ATOMIC", "SPECIAL_MODES", "OUTSIDE_LINKS",
]



def _octal(mode: int) -> str:
    return "%04o" % mode


def link_escapes(root: str, rel: str, target: str, max_hops: int = links.MAX_HOPS) -> bool:
    """Whether the symlink `rel` (target `target`) in the tree `root` leads outside it
    (rbrules.links.leaves, the tree read here). An absolute target always does: at the
    destination it names the source's path or the host's files."""
    return links.leaves(rel, target, _lookup(root), max_hops=max_hops)


def _lookup(root: str) -> links.Lookup:
    """rbrules.links' view of the tree `root`: a link's text, "" for another entry, None for
    nothing there."""
    def lookup(rel: str) -> Optional[str]:
        here = os.path.join(root, rel)
        try:
            st = os.lstat(here)
        except OSError:
            return None
        return os.readlink(here) if stat.S_ISLNK(st.st_mode) else ""
    return lookup


def scan(root: str, patterns, names_path: Optional[str] = None, *,
         special_modes: str = "refuse", outside_links: str = "refuse", limit: int = 50) -> dict:
    """Is `root` a venv, and how many files/bytes (apparent and on disk) after the excludes.
    With `names_path`, also write the entries as a NUL-separated list for `tar -T` (the same walk
    and order as a manifest's), and beside it (NAMES.stat: manifest.SCAN_SUFFIX) their stat lines:
    the scan record a manifest build of this run takes instead of walking again; and
    (NAMES.links: manifest.LINKS_SUFFIX) the files of more than one link, a JSON line each of its
    index in the list and its inode (stream.split_names keeps one inode's names in one stream).

    Also what must not be moved silently: `special_modes` (entries with setuid, setgid, sticky or
    world-write bits: refused unless the spec says `strip` or `keep`), `outside_links` (symlinks
    that leave the tree, the venv's bin/python* excepted: refused unless `keep`) and `devices`
    (never moved); `refusal` is the text preflight fails with, "" when nothing is refused.
    `need_bytes` is the room the copy takes: each file at the larger of its apparent size and its
    blocks (tar writes a sparse file's holes out). `bytes` counts the data of an inode the tree
    names twice (a hard link) once, as `du --apparent-size` does and as the stream carries it
    (tar sends the second name as a link): the transfer's progress runs to 100% on it."""
    if special_modes not in SPECIAL_MODES:
        raise ValueError(f"special_modes must be one of {SPECIAL_MODES}, not {special_modes!r}")
    patterns = list(patterns)
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
        tally = _Tally(root, special_modes == "strip", bool(names_path))
        for rel, st in manifest.walk(root, patterns):
            tally.add(rel, st)
        if names_path:
            tally.write(names_path, patterns)
        out.update(tally.values(limit, special_modes))
        out["refusal"] = _refusal(tally.special, special_modes, tally.outside, outside_links,
                                  tally.devices, tally.not_utf8)
    out["installed_manifest"] = os.path.isfile(os.path.join(root, ".rb-manifest.jsonl"))
    return out


class _Tally:
    """What `scan` gathers over one walk of `root`: the counts and sizes it reports, what it
    refuses on (special modes, outside links, devices, names that are not UTF-8), and, when
    `names` is set, the records it writes for `tar -T` and the manifest build."""

    def __init__(self, root: str, strip: bool, names: bool):
        self.root, self.strip, self.keep_names = root, strip, names
        self.lookup = _lookup(root)
        self.files = self.dirs = self.links = 0
        self.apparent = self.disk = self.need = 0
        self.names: List[bytes] = []
        self.multi: List[bytes] = []   # [index in names, st_dev, st_ino] of multi-link files
        self.inodes: set = set()       # (st_dev, st_ino) of the files of more than one link
        # the stat fingerprint's lines as manifest.stat_line writes them, hashed once at the end
        self.lines: List[bytes] = []
        self.special: List[dict] = []
        self.outside: List[dict] = []
        self.devices: List[str] = []
        self.sparse: List[str] = []
        self.not_utf8: List[str] = []

    def add(self, rel: str, st: os.stat_result) -> None:
        values = manifest.stat_values(self.root, rel, st, self.strip)
        try:
            self.lines.append(manifest.values_line(values))
        except UnicodeEncodeError:
            # a name (or link target) of bytes that are not UTF-8: no manifest records it
            self.not_utf8.append(_shown(rel))
        if self.keep_names:
            self.names.append(rel.encode("utf-8", "surrogateescape") + b"\0")
        blocks = st.st_blocks * 512
        self.disk += blocks
        mode = stat.S_IMODE(st.st_mode)
        if values[1] == "l":
            self.links += 1
            self.need += blocks
            if not links.interpreter_link(rel) and links.leaves(rel, values[4], self.lookup):
                self.outside.append({"p": rel, "l": values[4]})
            return
        if mode & manifest.SPECIAL_BITS:
            self.special.append({"p": rel, "m": _octal(mode)})
        if stat.S_ISREG(st.st_mode):
            self._file(rel, st, blocks)
        elif stat.S_ISDIR(st.st_mode):
            self.dirs += 1
            self.need += max(blocks, 4096)
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            self.devices.append(rel)

    def _file(self, rel: str, st: os.stat_result, blocks: int) -> None:
        self.files += 1
        if st.st_nlink > 1:
            if self.keep_names:
                self.multi.append(b"[%d, %d, %d]\n" % (len(self.names) - 1, st.st_dev,
                                                        st.st_ino))
            if (st.st_dev, st.st_ino) in self.inodes:
                self.disk -= blocks            # its data is counted (and sent, and stored) once
                return
            self.inodes.add((st.st_dev, st.st_ino))
        self.apparent += st.st_size
        self.need += max(blocks, -(-st.st_size // 4096) * 4096)
        if blocks + 4096 <= st.st_size:
            self.sparse.append(rel)

    def write(self, names_path: str, patterns: List[str]) -> None:
        """The names for `tar -T`, the scan record (NAMES.stat) and the multi-link files
        (NAMES.links): this run's private files, no fsync."""
        safefs.write_file(names_path, b"".join(self.names), 0o600, sync=False)
        safefs.write_file(names_path + manifest.SCAN_SUFFIX,
                          manifest.scan_header(self.root, patterns, self.strip)
                          + b"".join(self.lines), 0o600, sync=False)
        safefs.write_file(names_path + manifest.LINKS_SUFFIX, b"".join(self.multi), 0o600,
                          sync=False)

    def values(self, limit: int, special_modes: str) -> dict:
        """scan's answer: the counts, and the first `limit` of each list."""
        return dict(files=self.files, dirs=self.dirs, links=self.links, bytes=self.apparent,
                    disk_bytes=self.disk, need_bytes=self.need,
                    stat_fingerprint=hashlib.sha256(b"".join(self.lines)).hexdigest(),
                    special_modes=self.special[:limit], special_modes_count=len(self.special),
                    special_modes_action=special_modes,
                    outside_links=self.outside[:limit], outside_links_count=len(self.outside),
                    devices=self.devices[:limit], sparse_files=self.sparse[:limit],
                    sparse_count=len(self.sparse))


def _count(items: list, one: str, many: str) -> str:
    return f"{len(items)} {one if len(items) == 1 else many}"


def _shown(rel: str) -> str:
    """A path whose bytes are not all UTF-8, as text: those bytes as \\xNN."""
    return repr(os.fsencode(rel))[2:-1]


def _refusal(special: list, special_action: str, outside: list, outside_action: str,
             devices: list, not_utf8: List[str], shown: int = 10) -> str:
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
    if not_utf8:
        why.append(f"{_count(not_utf8, 'entry', 'entries')} whose name or link target is "
                   "not UTF-8 (a manifest records paths as UTF-8 text, so it could not be "
                   "verified): " + some(not_utf8) + "; rename them, or leave them out "
                   "with transfer.exclude")
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
    mtime in both manifests, and the inode linked still has the recorded stat); writes the
    NUL-separated names tar must still send (changed and new files, relocatable files, every
    directory and symlink: tar restores their modes and targets). `dest` is never written.
    A staging path that is a link is removed as a link (its target is not touched).

    Each directory is reached through descriptors, one component at a time without following a
    link (safefs.open_dir), and each file is linked by name in its directory (linkat without
    AT_SYMLINK_FOLLOW: a link planted at the name is linked as the link, never what it names);
    the stat check is made on the staging's new name after the link, so it is of the very inode
    linked. One directory's descriptors are open at a time (a manifest lists a directory's
    entries together, parents first)."""
    if new["header"].get("algo") != installed["header"].get("algo") or new["header"]["algo"] == "none":
        raise ValueError("an incremental install needs digests of one algorithm in both manifests")
    before = {e["p"]: e for e in installed["entries"]}
    if os.path.lexists(staging):
        remove(staging)
    os.makedirs(staging)
    send: list[str] = []
    inodes: dict = {}
    linked = linked_bytes = send_bytes = send_files = 0
    here = _DirPair(dest, staging)
    try:
        for e in new["entries"]:                   # parents come before their children
            rel = e["p"]
            head, _, name = rel.rpartition("/")
            here.enter(head)
            if e["t"] == "d":
                os.mkdir(name, 0o777, dir_fd=here.dst)
                send.append(rel)
                continue
            old = before.get(rel)
            if here.src is not None and manifest.linkable(old, e) and _link_unchanged(
                    here.src, here.dst, name, old, inodes, rel):
                linked += 1
                linked_bytes += e["s"]
                continue
            send.append(rel)
            if e["t"] == "f":
                send_files += 1
                send_bytes += e["s"]
    finally:
        here.close()
    buf = bytearray()
    for rel in send:
        buf += rel.encode("utf-8", "surrogateescape") + b"\0"
    safefs.write_file(names_path, bytes(buf), 0o600)
    return {"linked": linked, "linked_bytes": linked_bytes, "send_files": send_files,
            "send_bytes": send_bytes, "send_entries": len(send), "inodes": inodes,
            "removed": len(set(before) - {e["p"] for e in new["entries"]})}


class _DirPair:
    """The descriptors of one directory in the install (`src`: None when it is not a directory
    reached without following a link) and in the staging (`dst`), for `stage`. Its ancestors'
    stay open while the walk is below them, so each directory is opened once, from its parent,
    with O_NOFOLLOW (safefs.open_dir of one component)."""

    def __init__(self, src_root: str, dst_root: str) -> None:
        self.stack = [("", safefs.open_dir(src_root), safefs.open_dir(dst_root))]
        self.src: Optional[int] = self.stack[0][1]
        self.dst: int = self.stack[0][2]

    def enter(self, rel: str) -> None:
        if rel == self.stack[-1][0]:
            return
        while len(self.stack) > 1 and not (rel == self.stack[-1][0]
                                           or rel.startswith(self.stack[-1][0] + "/")):
            self._pop()
        at, src, dst = self.stack[-1]
        for part in [p for p in rel[len(at):].split("/") if p]:
            at = at + "/" + part if at else part
            try:
                src = safefs.open_dir_at(src, part) if src is not None else None
            except OSError:
                src = None                         # gone, or a link now: nothing is linked here
            try:
                dst = safefs.open_dir_at(dst, part)
            except BaseException:
                if src is not None:
                    os.close(src)
                raise
            self.stack.append((at, src, dst))
        self.src, self.dst = src, dst

    def _pop(self) -> None:
        _rel, src, dst = self.stack.pop()
        for fd in (src, dst):
            if fd is not None:
                os.close(fd)

    def close(self) -> None:
        while self.stack:
            self._pop()


def _link_unchanged(src_dir: int, dst_dir: int, name: str, old: dict, inodes: dict,
                    rel: str) -> bool:
    """Hard-link `name` from the install's directory into the staging's when the inode linked is
    a regular file with the recorded mode, size and mtime (its (st_dev, st_ino) go in `inodes`
    under `rel`); else nothing is left at `name`."""
    try:
        os.link(name, name, src_dir_fd=src_dir, dst_dir_fd=dst_dir, follow_symlinks=False)
    except OSError:
        return False                               # gone, another file system, not allowed: send
    st = os.stat(name, dir_fd=dst_dir, follow_symlinks=False)
    if (stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == old.get("m")
            and st.st_size == old.get("s") and int(st.st_mtime) == old.get("mt")):
        inodes[rel] = (st.st_dev, st.st_ino)
        return True
    os.unlink(name, dir_fd=dst_dir)
    return False
RB_PY_5F73DE2D
  cat >"${dir}"/rbkit/installs.py <<'RB_PY_B549C8EF'
"""The installs kept beside a destination, and what each one is: its backups (`DEST.rb-backup.N`),
the install whose checks failed kept apart (`DEST.rb-failed`), the record each install holds
(INFO) and its failure mark (FAILED_MARK); listed, described, made independent of the live install
(`unshare_backup`), removed. Nothing here moves an install into place: rbkit.swapfs does (swap,
restore, prune_backups, the journal). Public through rbkit.hostfs.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import stat
from typing import List, Optional

from . import manifest, privacy, safefs

FICLONE = 0x40049409
FAILED_MARK = ".rb-failed"                     # in an install whose checks failed (manifest skips it)
INFO = ".rb-install.json"                      # what an install is: when, from what, its checks


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
    """The backups that are real directories of ours (a link named like one, or a directory
    another user made there, is not ours to use: `foreign_backups` says why)."""
    return [(n, p) for n, p in backups(dest) if is_real_dir(p) and not_ours(p) is None]


def not_ours(path: str) -> Optional[str]:
    """Why the directory `path`, named like a backup, may have been planted by another user (None:
    it cannot have been). In a private parent (rbkit.privacy) only this user and root make
    entries, so every one is ours, whoever owns it (a previous install of another user, moved
    aside by a swap). In a parent others can write (transfer.shared_parent: allow), one owned by
    another user than this one or root, or writable by every user, is not ours: only root can
    give a directory another owner, so one planted there keeps its planter's. Group write is not
    judged: extraction keeps the source root's (umask 002)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if privacy.why_not_private(os.path.dirname(os.path.abspath(path)), os.geteuid()) is None:
        return None
    if st.st_uid not in (os.geteuid(), 0):
        return (f"{path} is owned by {privacy.owner(st)}, not by "
                f"{privacy.user_name(os.geteuid())}: not a "
                "backup this kit made (another user can make a directory of that name beside "
                "the destination); it is never restored, counted or removed: look at it and "
                "remove it")
    if stat.S_IMODE(st.st_mode) & 0o002:
        return (f"{path} is writable by every user (mode {stat.S_IMODE(st.st_mode):04o}): not a "
                "backup this kit made; it is never restored, counted or removed: look at it and "
                "remove it")
    return None


def foreign_backups(dest: str) -> list[str]:
    """Why each directory named like a backup of `dest` is not one of ours (`not_ours`)."""
    return [why for _n, p in backups(dest) if is_real_dir(p)
            for why in [not_ours(p)] if why is not None]


def is_real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def next_backup(dest: str) -> str:
    found = backups(dest)
    return f"{dest}.rb-backup.{(found[-1][0] + 1) if found else 1}"


def failed_mark(path: str) -> Optional[str]:
    """Why the install at `path` was rolled back (its checks failed), or None."""
    got = safefs.read_in(path, FAILED_MARK, limit=64 << 10)
    return got[0].decode("utf-8", "replace").strip() if got is not None else None


def failed_path(dest: str) -> str:
    """Where the one install whose checks failed is kept apart: `DEST.rb-failed` (never a backup:
    never counted toward keep_backups, never restored without being named, replaced by the next
    failure)."""
    return os.path.abspath(dest) + ".rb-failed"


def read_info(path: str) -> dict:
    """The install's own record (INFO, written by the engine: `installed` (UTC, ISO 8601),
    `origin` (the runbook and its spec), `source_fingerprint`, `checks` (passed, none, not run,
    failed: ...), `put_back_after`); {} when it has none or it is not one."""
    got = safefs.read_in(path, INFO, limit=64 << 10)
    try:
        doc = json.loads(got[0]) if got is not None else {}
    except ValueError:
        doc = {}
    return doc if isinstance(doc, dict) else {}


def write_info(path: str, **fields: object) -> dict:
    """Merge `fields` into the install's record (a None value removes the key)."""
    doc = read_info(path)
    doc.update(fields)
    doc = {k: v for k, v in doc.items() if v is not None}
    safefs.write_in(path, INFO, json.dumps(doc, sort_keys=True).encode() + b"\n", 0o644)
    return doc


def set_checks(path: str, passed: bool, why: str = "") -> None:
    """Record the checks' verdict on the install at `path`: passed (the failure mark removed), or
    failed (marked: FAILED_MARK says why)."""
    write_info(path, checks="passed" if passed else "failed: " + why)
    if passed:
        dir_fd = safefs.open_dir(path)
        try:
            os.unlink(FAILED_MARK, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        finally:
            os.close(dir_fd)
    else:
        safefs.write_in(path, FAILED_MARK, why.encode("utf-8") + b"\n", 0o644)


def _size(path: str) -> int:
    total = 0
    for _rel, st in manifest.walk(path, ordered=False):
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
    return total


def list_installs(dest: str) -> List[dict]:
    """What `--list-backups` shows: each backup of `dest` (oldest first), the failed install kept
    apart, and the one in place, each with `path`, `number` (None: not a backup), `kind`
    (backup, failed, in place), its record (read_info), `failed` (failed_mark) and `size`."""
    rows = [(n, p, "backup") for n, p in backup_dirs(dest)]
    if is_real_dir(failed_path(dest)):
        rows.append((None, failed_path(dest), "failed"))
    if is_real_dir(dest):
        rows.append((None, os.path.abspath(dest), "in place"))
    out = []
    for number, path, kind in rows:
        info = read_info(path)
        out.append({"number": number, "path": path, "kind": kind, "info": info,
                    "failed": failed_mark(path), "size": _size(path)})
    return out


def remove(path: str) -> None:
    """Remove a directory tree, or a link or file (never what a link points to)."""
    if is_real_dir(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


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
    out: dict = {"path": path, "failed": failed_mark(path), "info": read_info(path)}
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
RB_PY_B549C8EF
  cat >"${dir}"/rbkit/liveplan.py <<'RB_PY_30510C7C'
"""The live plan (`bash RUNBOOK --plan`, `--apply PLAN`): what a run will change, read from the
real hosts without writing anything there, and the check that a saved plan still holds.

    liveplan state DEST [--policy P] [--keep-backups N]   on the destination, read-only: a JSON
        line of facts (exists, installed, free space, backups), then the stat line of every
        entry of DEST (manifest.values_line's, the walk's order): its state, digested
    liveplan compose --dir DIR ...                         here: the plan from what the runbook
        fetched into DIR (source.scan, dest.state, installed.jsonl): plan.json, changes.txt,
        plan.md (--markdown), and the screen on stdout; exit 1 when something blocks the run
    liveplan drift --plan PLAN --side source|dest --now FILE   here: what moved since the plan
        (exit 1, naming the side, how many paths and the first few), exit 0 when nothing did
    liveplan read PLAN --name N --spec-sha S --kit-sha K   here: the plan's digests as
        `KEY<TAB>VALUE` lines, or why it is not this runbook's (exit 1)

The source's side is the scan preflight makes (hostfs.scan's record, NAMES.stat): its stat
fingerprint is the source's digest. The changes are judged as the engine judges a re-run (the
quick check: path, type, mode, size, link and mtime; rbkit.manifest.quick_check), against the
source as the install recorded it (manifest.source_of) and the destination as it is now.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from typing import Dict, List, Optional, Tuple

from rbrules import paths

from . import hostfs, privacy, safefs, swapfs
from .choices import Choices
from . import manifest as kitmanifest

INSTALLED = ".rb-manifest.jsonl"      # engine.INSTALLED: the install's own manifest
SHOWN = 8                             # itemized lines shown on the screen (all in changes.txt)
MARGIN = 10                           # percent over the staging's bytes, as preflight asks


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return ("%d B" % n) if unit == "B" else "%.1f %s" % (n, unit)
        n /= 1000.0
    return str(n)


# -- the destination, read-only ----------------------------------------------------------------


def dest_state(dest: str, policy: str, keep_backups: int) -> Tuple[dict, List[bytes]]:
    """(facts, stat lines) of the destination; nothing is written, no lock is taken."""
    dest = os.path.abspath(dest)
    parent = os.path.dirname(dest)
    staging = paths.staging(dest)
    facts: dict = {"dest": dest, "exists": os.path.lexists(dest), "is_dir": os.path.isdir(dest),
                   "installed": os.path.isfile(os.path.join(dest, INSTALLED)),
                   "staging_left": os.path.lexists(staging)}
    found = privacy.check_parent(dest, os.geteuid())
    if found is not None:
        # preflight refuses it unless transfer.shared_parent: allow (engine.check_parent)
        facts["shared_parent"] = privacy.refusal(dest, found[0], found[1], os.geteuid())
    free = hostfs.free_bytes(staging)
    facts.update(free_bytes=free["free_bytes"], measured_at=free["measured_at"])
    lines: List[bytes] = []
    size = 0
    patterns: List[str] = []
    if facts["installed"]:
        try:
            with open(os.path.join(dest, INSTALLED), encoding="utf-8") as f:
                head = json.loads(f.readline())
            patterns = list(head.get("excludes") or ())
            facts["installed_source_stat"] = head.get("source_stat_fingerprint") or ""
            st = os.stat(os.path.join(dest, INSTALLED))
            facts["installed_record"] = [st.st_size, st.st_mtime_ns]
        except (OSError, ValueError) as exc:
            facts["installed_error"] = str(exc)
    if facts["is_dir"] and not os.path.islink(dest):
        for rel, st in kitmanifest.walk(dest, patterns):
            v = kitmanifest.stat_values(dest, rel, st)
            try:
                lines.append(kitmanifest.values_line(v))
            except UnicodeEncodeError:
                continue
            if v[1] == "f":
                size += st.st_size
    facts["bytes"] = size
    facts["digest"] = hashlib.sha256(json.dumps(
        [facts["exists"], facts.get("installed_record")]).encode() + b"".join(lines)).hexdigest()
    good: List[str] = []
    if os.path.isdir(parent):
        good = [p for _n, p in swapfs.backup_dirs(dest) if swapfs.failed_mark(p) is None]
    facts["backups"] = good
    # a swap under `backup` makes the install in place the newest backup; past keep_backups the
    # oldest go once the new install passed its checks (swapfs.prune_backups)
    after = good + ([dest] if policy == "backup" and facts["exists"] else [])
    facts["evicts"] = after[:-keep_backups] if keep_backups and len(after) > keep_backups else []
    return facts, lines


# -- here: the plan --------------------------------------------------------------------------------


def _rows(lines: List[bytes]) -> List[list]:
    body = b",".join(ln.rstrip(b"\n") for ln in lines if ln.strip())
    return json.loads(b"[" + body + b"]") if body else []


def read_scan(path: str) -> Tuple[str, List[list]]:
    """(stat fingerprint, rows [p, t, m, s, l, mt]) of a source scan record (hostfs.scan)."""
    with open(path, "rb") as f:
        data = f.read()
    _head, _, body = data.partition(b"\n")
    return hashlib.sha256(body).hexdigest(), _rows(body.split(b"\n"))


def read_state(path: str) -> Tuple[dict, List[list]]:
    with open(path, "rb") as f:
        data = f.read().split(b"\n")
    return json.loads(data[0]), _rows(data[1:])


def _flags(old: Optional[list], new: list) -> str:
    """An rsync -i like code of 11 characters for `new` against `old` (None: new there)."""
    kind = {"f": "f", "d": "d", "l": "L"}.get(new[1], "?")
    head = (">" if new[1] == "f" else "c") + kind
    if old is None:
        return head + "+++++++++"
    if old[1] != new[1]:
        return head + "T" * 9
    return head + "." + ("s" if old[3] != new[3] else ".") + ("t" if old[5] != new[5] else ".") \
        + ("p" if old[2] != new[2] else ".") + ("L" if old[4] != new[4] else ".") + "...."


def changes(src: List[list], dest: List[list], installed: Optional[dict]) -> dict:
    """What a run would change at the destination: `src` the source's scan rows, `dest` the
    destination's, `installed` its install's manifest (None: not an install of this tool). Each
    source entry is added, changed (against the source as the install recorded it, or a file
    changed at the destination since) or unchanged; what the destination holds that the source
    lacks is removed."""
    now = {r[0]: r for r in dest}
    base: Dict[str, list] = {}
    moved_there: set = set()
    if installed is not None:
        rows = [[e["p"], e.get("t"), e.get("m"), e.get("s"), e.get("l"), e.get("mt")]
                for e in installed["entries"]]
        base = {r[0]: r for r in rows}
        moved_there = {r[0] for r in rows if now.get(r[0]) != r} | (set(now) - set(base))
        for e in installed["header"].get("source_entries") or ():
            # the source's own entries of what relocation rewrote (manifest.source_of)
            base[e["p"]] = [e["p"], e.get("t"), e.get("m"), e.get("s"), e.get("l"), e.get("mt")]
    else:
        base = dict(now)
    items: List[str] = []
    out = {"added": 0, "added_bytes": 0, "changed": 0, "changed_bytes": 0, "removed": 0,
           "removed_bytes": 0, "unchanged": 0, "changed_there": 0}
    have = set()
    for row in src:
        p = row[0]
        have.add(p)
        old = base.get(p)
        size = row[3] if row[1] == "f" else 0
        if old is None:
            out["added"] += 1
            out["added_bytes"] += size
            items.append("%s %s" % (_flags(None, row), p))
        elif old[1:] != row[1:] or p in moved_there:
            code, why = _flags(old, row), ""
            if old[1:] == row[1:]:
                code, why = code[:2] + "?" * 9, " (changed at the destination since the install)"
                out["changed_there"] += 1
            out["changed"] += 1
            out["changed_bytes"] += size
            items.append("%s %s%s" % (code, p, why))
        else:
            out["unchanged"] += 1
    gone = sorted(set(base) | set(now)) if installed is not None else sorted(now)
    for p in gone:
        if p in have or p == INSTALLED:
            continue
        row = now.get(p) or base.get(p)
        out["removed"] += 1
        out["removed_bytes"] += row[3] if row and row[1] == "f" else 0
        items.append("*deleting   %s" % p)
    out["items"] = items
    return out


def _load_installed(path: str) -> Optional[dict]:
    """The install's manifest (header, entries) as fetched, in one parse (no fingerprint: the
    plan only compares stats); None when there is none or it is not one."""
    try:
        with open(path, "rb") as f:
            rows = [ln for ln in f.read().split(b"\n") if ln.strip()]
        docs = json.loads(b"[" + b",".join(rows) + b"]") if rows else []
    except (OSError, ValueError):
        return None
    if not docs or not isinstance(docs[0], dict) or docs[0].get("kind") != "rb-manifest":
        return None
    entries = [d for d in docs[1:] if isinstance(d, dict) and "p" in d]
    return {"header": docs[0], "entries": entries}


def _write(path: str, text: str) -> None:
    """A file of this run's private directory: a new file and one rename, never through a link."""
    safefs.write_file(path, text.encode("utf-8"), 0o600, sync=False)


def compose(a: argparse.Namespace) -> int:
    d = a.dir
    src_stat, src = read_scan(os.path.join(d, "source.scan"))
    facts, dest = read_state(os.path.join(d, "dest.state"))
    installed = _load_installed(os.path.join(d, "installed.jsonl"))
    if installed is not None and installed["header"].get("source_stat_fingerprint") is None:
        installed = None
    ch = changes(src, dest, installed)
    _write(os.path.join(d, "changes.txt"), "".join(line + "\n" for line in ch["items"]))
    up_to_date = (installed is not None and facts.get("installed_source_stat") == src_stat
                  and ch["changed"] == ch["added"] == ch["removed"] == 0)
    delta = installed is not None and a.incremental
    src_bytes = int(a.source_bytes or 0)
    # an incremental run also sends again what relocation rewrites (bin/*, pyvenv.cfg: their
    # installed copies are not the source's, never linked)
    rewritten = sum(r[3] for r in src if r[1] == "f" and kitmanifest.relocatable(r[0]))
    ch["rewritten_bytes"] = rewritten
    send = 0 if up_to_date else (ch["added_bytes"] + ch["changed_bytes"] + rewritten if delta
                                 else src_bytes)
    staging = 0 if up_to_date else (send if delta else int(a.need_bytes or src_bytes))
    staging += staging * MARGIN // 100
    # with backup, the install in place stays as a backup; an incremental staging links its
    # unchanged files from it, and the swap gives the backup copies of its own (unshare_backup:
    # free where the file system has reflinks)
    backup = 0
    if a.policy == "backup" and facts["exists"] and delta and not up_to_date:
        backup = max(0, facts.get("bytes", 0) - ch["changed_bytes"])
    need = staging + backup
    blockers: List[str] = []
    if need > facts["free_bytes"]:
        blockers.append("not enough room at %s: %s needed (staging %s%s), %s free"
                        % (facts["measured_at"], human(need), human(staging),
                           ", kept backup " + human(backup) if backup else "",
                           human(facts["free_bytes"])))
    if facts["exists"] and not facts["installed"] and a.policy == "refuse":
        blockers.append("the destination %s exists and on_existing is refuse" % facts["dest"])
    if facts.get("shared_parent") and a.shared_parent != "allow":
        blockers.append(facts["shared_parent"])
    audit = static_verdict(a)
    if audit.startswith("failed") and not a.force and not a.same_host:
        blockers.append("the static checks on the source failed (%s): fix the venv or --force"
                        % audit)
    checks = json.loads(a.checks or "{}").get("checks") or []
    plan = {
        "kind": "rb-plan", "schema": 1, "runbook": a.name, "spec_sha256": a.spec_sha,
        "kit_sha256": a.kit_sha, "made": a.made,
        "source": {"host": a.src_host, "path": a.src_path, "stat_fingerprint": src_stat,
                   "files": int(a.source_files or 0), "bytes": src_bytes},
        "destination": {"host": a.dst_host, "path": facts["dest"], "digest": facts["digest"],
                        "exists": facts["exists"], "installed": facts["installed"],
                        "free_bytes": facts["free_bytes"], "measured_at": facts["measured_at"]},
        "route": a.route, "compression": a.compression,
        "changes": {k: v for k, v in ch.items() if k != "items"}, "up_to_date": up_to_date,
        "incremental": delta, "send_bytes": send,
        "disk": {"staging": staging, "backup": backup, "need": need,
                 "free": facts["free_bytes"]},
        "policy": a.policy, "backups": facts["backups"], "evicts": facts["evicts"],
        "static": audit, "checks": [c.get("id") for c in checks], "blockers": blockers,
    }
    _write(os.path.join(d, "plan.json"), json.dumps(plan, indent=1, sort_keys=True) + "\n")
    lines = screen(plan, ch["items"], a, checks, os.path.join(d, "changes.txt"))
    print("\n".join(lines))
    if a.markdown:
        _write(os.path.join(d, "plan.md"), markdown(plan, ch["items"], lines))
    return 1 if blockers else 0


def static_verdict(a: argparse.Namespace) -> str:
    what = "kernel audit for %s, references leaving the venv" % a.arch if a.arch \
        else "references leaving the venv"
    if a.audit_skipped == "1":
        return ("skipped: the source is the tree the destination's install recorded, and they "
                "passed for it here (%s)" % what)
    if a.audit_rc == "0" or (a.audit_rc == "1" and not a.audit_failed):
        return "passed (%s)" % what
    if a.audit_rc == "1":
        said = " (both ends are this machine: said, not refused)" if a.same_host \
            and a.audit_failed == "outside" else ""
        return "failed: %s%s" % (a.audit_failed, said)
    return "could not run (exit %s)" % a.audit_rc


def screen(plan: dict, items: List[str], a: argparse.Namespace, checks: List[dict],
           listing: str) -> List[str]:
    ch, disk = plan["changes"], plan["disk"]
    src, dst = plan["source"], plan["destination"]
    out = ["plan for %s: %s:%s -> %s:%s" % (plan["runbook"], src["host"], src["path"],
                                           dst["host"], dst["path"])]
    out.append("  hosts:       %s" % a.hosts)
    out.append("  route:       %s" % a.route_why)
    out.append("  compression: %s" % a.compression_why)
    out.append("  source:      %d files, %s (scan %s)" % (src["files"], human(src["bytes"]),
                                                          src["stat_fingerprint"][:12]))
    state = ("holds an install of this tool" if dst["installed"] else
             "exists (not installed by this tool)" if dst["exists"] else "does not exist yet")
    out.append("  destination: %s; on_existing %s" % (state, plan["policy"]))
    if plan["up_to_date"]:
        out.append("  changes:     nothing to send: the destination already holds this exact tree")
    else:
        out.append("  changes:     %d added (%s), %d changed (%s), %d removed (%s); %d unchanged"
                   % (ch["added"], human(ch["added_bytes"]), ch["changed"],
                      human(ch["changed_bytes"]), ch["removed"], human(ch["removed_bytes"]),
                      ch["unchanged"]))
        for line in items[:SHOWN]:
            out.append("               " + line)
        if len(items) > SHOWN:
            out.append("               ... %d more" % (len(items) - SHOWN))
        out.append("               every line: %s" % listing)
        how = ("only the changes, and %s of bin/ and pyvenv.cfg that relocation rewrites "
               "(incremental)" % human(ch["rewritten_bytes"])) if plan["incremental"] \
            else "the whole tree"
        out.append("  to send:     %s, %s" % (human(plan["send_bytes"]), how))
    room = "enough room" if disk["need"] <= disk["free"] else "NOT ENOUGH ROOM"
    out.append("  disk:        %s needed (staging %s%s) of %s free at %s: %s"
               % (human(disk["need"]), human(disk["staging"]),
                  ", kept backup " + human(disk["backup"]) if disk["backup"] else "",
                  human(disk["free"]), dst["measured_at"], room))
    if plan["policy"] == "backup":
        kept = "%d backups kept" % len(plan["backups"])
        evict = ("; evicts %s once the new install passes its checks"
                 % ", ".join(plan["evicts"])) if plan["evicts"] else "; evicts none"
        out.append("  backups:     %s (keep_backups %s)%s" % (kept, a.keep_backups, evict))
    out.append("  static:      %s" % plan["static"])
    names = []
    head = True
    for c in checks:
        # the implied checks come first (compiler.implied: relocation, and kernel_audit for a gpu)
        head = head and c.get("type") in ("relocation", "kernel_audit")
        implied = " (implied)" if head else ""
        skip = " (may skip)" if c.get("allow_skip") else ""
        names.append("%s%s%s" % (c.get("id"), implied, skip))
    out.append("  checks:      %s" % (", ".join(names) or "none"))
    for b in plan["blockers"]:
        out.append("  BLOCKED:     %s" % b)
    return out


def markdown(plan: dict, items: List[str], lines: List[str]) -> str:
    text = ["# Live plan: %s" % plan["runbook"], "",
            "Made %s against the real hosts (spec sha256 %s)." % (plan["made"],
                                                                plan["spec_sha256"][:12]), "",
            "```", *lines[1:], "```", ""]
    if items:
        text += ["<details><summary>%d itemized changes</summary>" % len(items), "", "```",
                 *items, "```", "</details>", ""]
    return "\n".join(text)


# -- here: the plan against what is there now -----------------------------------------------------


def drift(plan_path: str, side: str, now_path: str) -> Tuple[int, str]:
    """(number of paths, the first few) that differ between the plan's record of `side` and now."""
    d = os.path.dirname(os.path.abspath(plan_path))
    record = ""
    if side == "source":
        _fp, then = read_scan(os.path.join(d, "source.scan"))
        _fp, now = read_scan(now_path)
    else:
        was, then = read_state(os.path.join(d, "dest.state"))
        facts, now = read_state(now_path)
        if (was.get("exists"), was.get("installed_record")) != \
                (facts.get("exists"), facts.get("installed_record")):
            record = INSTALLED + " (the install's record)" if facts.get("exists") \
                else facts["dest"] + " (gone)"
    a, b = {r[0]: r for r in then}, {r[0]: r for r in now}
    moved = sorted(p for p in set(a) | set(b) if a.get(p) != b.get(p))
    shown = []
    for p in moved[:5]:
        shown.append(p + (" (new)" if p not in a else " (gone)" if p not in b else " (changed)"))
    if record:
        moved.append(record)
        shown.insert(0, record)
    return len(moved), ", ".join(shown[:5])


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="rbkit liveplan")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("state")
    s.add_argument("dest")
    s.add_argument("--choices", required=True, help="the engine's choices (RB_ENGINE_CHOICES)")
    c = sub.add_parser("compose")
    c.add_argument("--dir", required=True)
    for key in ("name", "spec-sha", "kit-sha", "made", "src-host", "src-path", "dst-host",
                "route", "route-why", "compression", "compression-why", "hosts", "choices",
                "source-files", "source-bytes", "need-bytes", "audit-rc",
                "audit-failed", "audit-skipped", "arch", "checks"):
        c.add_argument("--" + key, default="")
    for flag in ("incremental", "markdown", "force", "same-host"):
        c.add_argument("--" + flag, action="store_true")
    dr = sub.add_parser("drift")
    dr.add_argument("--plan", required=True)
    dr.add_argument("--side", choices=("source", "dest"), required=True)
    dr.add_argument("--now", required=True)
    r = sub.add_parser("read")
    r.add_argument("plan")
    r.add_argument("--name", required=True)
    r.add_argument("--spec-sha", required=True)
    r.add_argument("--kit-sha", required=True)
    a = p.parse_args(argv)
    try:
        if a.cmd in ("state", "compose"):
            # the spec's choices for the destination, from the engine's one document
            ch = Choices.from_json(a.choices)
            a.policy, a.shared_parent = ch.on_existing, ch.shared_parent
            a.keep_backups = ch.keep_backups or 0 if a.cmd == "state" else (
                "" if ch.keep_backups is None else str(ch.keep_backups))
        if a.cmd == "state":
            facts, lines = dest_state(a.dest, a.policy, a.keep_backups)
            out = sys.stdout.buffer
            out.write(json.dumps(facts, sort_keys=True).encode() + b"\n")
            out.write(b"".join(lines))
            return 0
        if a.cmd == "compose":
            return compose(a)
        if a.cmd == "drift":
            n, first = drift(a.plan, a.side, a.now)
            if n:
                print("%d\t%s" % (n, first))
                return 1
            return 0
        return read_plan(a)
    except (OSError, ValueError, KeyError) as exc:
        print("rbkit liveplan %s: %s" % (a.cmd, exc), file=sys.stderr)
        return 2


def read_plan(a: argparse.Namespace) -> int:
    try:
        with open(a.plan, encoding="utf-8") as f:
            plan = json.load(f)
    except (OSError, ValueError) as exc:
        print("the plan %s cannot be read (%s): make one with --plan" % (a.plan, exc),
              file=sys.stderr)
        return 1
    why = ""
    if plan.get("kind") != "rb-plan" or plan.get("runbook") != a.name:
        why = "it is not a plan of runbook %s" % a.name
    elif plan.get("spec_sha256") != a.spec_sha or plan.get("kit_sha256") != a.kit_sha:
        why = "this runbook was compiled again since (another spec or kit)"
    elif plan.get("blockers"):
        why = "the plan is blocked: " + "; ".join(plan["blockers"])
    if why:
        print("refusing to apply %s: %s; make a new one with --plan" % (a.plan, why),
              file=sys.stderr)
        return 1
    for key, value in (("source_stat", plan["source"]["stat_fingerprint"]),
                       ("dest_digest", plan["destination"]["digest"]),
                       ("route", plan.get("route", "")),
                       ("compression", plan.get("compression", ""))):
        print("%s\t%s" % (key, value))
    return 0


if __name__ == "__main__":
    sys.exit(main())
RB_PY_30510C7C
  cat >"${dir}"/rbkit/lock.py <<'RB_PY_65124211'
"""One lock per destination, held for a whole run: flock on `.<name>.rb-lock` beside it.

The file is opened with O_NOFOLLOW and must be a regular file of ours with one link (a symlink
or a hard link planted there is refused, never written through); the holder (host, pid, what
runs, since when) is written into it, so a run that finds it taken names who holds it. The lock
is the kernel's: it goes with the holder's process, however that ends. The holder removes the
file when it lets go (a file whose lock is free is taken over by the next run; one replaced
while we waited for it is opened again).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import time
from typing import Callable, List, Optional

from rbrules import paths


def lock_path(dest: str) -> str:
    """`.<name>.rb-lock` beside the destination: rbrules.paths.lock, the one rule."""
    return paths.lock(dest)


class Taken(Exception):
    """The lock is held by another run (the message names it), or cannot be trusted."""


class Lock:
    def __init__(self, dest: str, holder: str, wait: float = 0.0,
                 log: Optional[Callable[[str], None]] = None) -> None:
        self.path = lock_path(dest)
        self.holder, self.wait = holder, wait
        self.log = log or (lambda line: None)
        self.fd: Optional[int] = None
        self.made: List[str] = []      # parent directories this lock made (removed when empty)

    def acquire(self) -> None:
        self._parents()
        deadline = time.monotonic() + self.wait
        said = False
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
                who = _read(fd)
                os.close(fd)
                if time.monotonic() >= deadline:
                    raise Taken("%s is locked by another run: %s. Two runs must not install "
                                "into one destination at once; wait for it to end (the lock goes "
                                "with its process)" % (os.path.dirname(self.path) or ".", who)) \
                        from None
                if not said:
                    self.log("waiting up to %.0f s for the lock %s, held by %s"
                             % (self.wait, self.path, who))
                    said = True
                time.sleep(0.5)
                continue
            # the file may have been removed (or replaced) by its last holder since we opened it
            try:
                same = _ident(os.lstat(self.path)) == _ident(os.fstat(fd))
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            self.fd = fd
            doc = {"holder": self.holder, "host": socket.gethostname(), "pid": os.getpid(),
                   "since": time.strftime("%Y-%m-%d %H:%M:%S %z")}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(doc, sort_keys=True) + "\n").encode(), 0)
            return

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            if _ident(os.lstat(self.path)) == _ident(os.fstat(self.fd)):
                os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None
        for d in reversed(self.made):
            try:
                os.rmdir(d)
            except OSError:
                break

    def _parents(self) -> None:
        """The destination's parent directory, made if missing (the staging will be there too)."""
        parent = os.path.dirname(self.path) or "."
        missing = []
        while parent and not os.path.lexists(parent):
            missing.append(parent)
            parent = os.path.dirname(parent)
        for d in reversed(missing):
            os.mkdir(d, 0o755)
            self.made.append(d)

    def _open(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise Taken("the lock path %s is a symlink: refusing to follow it (remove it if "
                            "you put it there)" % self.path) from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.geteuid():
            os.close(fd)
            raise Taken("the lock path %s is not a lock file of this user (type %o, %d links, "
                        "owner uid %d): refusing to use it" % (self.path, stat.S_IFMT(st.st_mode),
                                                                st.st_nlink, st.st_uid))
        return fd


def _ident(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino)


def _read(fd: int) -> str:
    try:
        doc = json.loads(os.pread(fd, 4096, 0).decode("utf-8", "replace") or "{}")
    except ValueError:
        doc = {}
    if not doc:
        return "a run that has not written its name yet"
    return "%s (engine pid %s on %s, since %s)" % (doc.get("holder", "?"), doc.get("pid", "?"),
                                                   doc.get("host", "?"), doc.get("since", "?"))
RB_PY_65124211
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
import functools
import hashlib
import io
import json
import os
import re
import stat
from typing import Callable, Iterable, Iterator, Optional, Tuple

from . import safefs
# public here (what callers use as manifest.NAME): a file's digest, many files' in parallel
from .filehash import CHUNK, Changed, digest, digests, hasher  # noqa: F401

SCHEMA = 1
# written into an install by the install itself (its manifest, its versioned env file, the mark
# of a build whose checks failed, its record (installs.INFO)): never compared, never sent
SKIP_NAMES = (".rb-manifest.jsonl", ".rb-env.sh", ".rb-failed", ".rb-install.json")
# what an install never carries unless the spec says so out loud (transfer.special_modes: keep)
SPECIAL_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWOTH
QUICK_KEYS = ("t", "m", "s", "mt")    # what a stat-level comparison of two file entries uses
SCAN_SUFFIX = ".stat"                 # the scan record beside a names list (hostfs.scan)
LINKS_SUFFIX = ".links"               # its files of more than one link: [index, st_dev, st_ino]


def relocatable(rel: str) -> bool:
    """What relocation may rewrite (bin/*, pyvenv.cfg): its installed content is not the source's,
    so an incremental install never reuses its digest nor links it from the previous install."""
    return rel == "pyvenv.cfg" or rel.startswith("bin/")


def linkable(old: Optional[dict], new: dict) -> bool:
    """Whether a file recorded as `old` (by an earlier install or an earlier source manifest) can
    stand for `new` unread: same digest, type, mode, size and mtime, and not relocatable."""
    # QUICK_KEYS written out: this runs once per file of a tree on every incremental re-run
    return (old is not None and new["t"] == "f" and bool(new.get("h"))
            and old.get("h") == new["h"] and old.get("t") == "f" and old.get("m") == new.get("m")
            and old.get("s") == new.get("s") and old.get("mt") == new.get("mt")
            and not relocatable(new["p"]))


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
    """Whether a pattern matches `rel` or one of its tails (the path from any of its components
    on: `__pycache__` excludes `a/__pycache__`, `*.pyc` every .pyc), fnmatch rules."""
    if not patterns:
        return False
    return _exclusion(tuple(patterns))(rel)


@functools.lru_cache(maxsize=64)
def _exclusion(patterns: tuple) -> Callable[..., bool]:
    """The test `excluded` makes. A pattern without "/" or a wildcard matches a tail only as the
    last component, and `*` then such a text only a last component that ends with it (the text
    has no "/"): a set and a tuple of suffixes, for the usual excludes (`__pycache__`, `*.pyc`).
    Any other pattern goes into one regex: each (fnmatch.translate, anchored at the end) may
    start at the beginning or after any "/", which is matching it against every tail. The test
    takes the path and, optionally, its last component (a walk has it: one slice less)."""
    names, suffixes, rest = set(), [], []
    for p in patterns:
        text = p[1:] if p.startswith("*") else p
        if "/" in p or any(c in text for c in "*?["):
            rest.append(p)
        elif p.startswith("*"):
            suffixes.append(text)
        else:
            names.add(p)
    ends = tuple(suffixes)
    regex = re.compile(r"(?:\A|(?<=/))(?:%s)" % "|".join(fnmatch.translate(p) for p in rest)
                       ).search if rest else None

    def test(rel: str, name: Optional[str] = None) -> bool:
        if name is None:
            name = rel[rel.rfind("/") + 1:]
        return name in names or name.endswith(ends) or (regex is not None and
                                                         regex(rel) is not None)
    return test


def walk(root: str, patterns: Iterable[str] = (), ordered: bool = True
         ) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every entry below root, sorted (unless not `ordered`: the order
    the directories give), excludes pruned."""
    patterns = tuple(patterns)
    test = _exclusion(patterns) if patterns else None      # looked up once, not per entry
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        full = os.path.join(root, rel_dir) if rel_dir else root
        with os.scandir(full) as it:
            entries = sorted(it, key=lambda e: e.name) if ordered else list(it)
        subdirs = []
        for entry in entries:
            name = entry.name
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if rel in SKIP_NAMES or (test is not None and test(rel, name)):
                continue
            st = entry.stat(follow_symlinks=False)
            yield rel, st
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(rel)
        stack.extend(reversed(subdirs))


def entry_of(root: str, rel: str, st: os.stat_result) -> dict:
    return entry_from(stat_values(root, rel, st))


def entry_from(v: tuple) -> dict:
    """The entry whose STAT_KEYS values are `v` (stat_values): a file's mtime in whole seconds
    (what tar restores: its default format keeps seconds), no mode for a link."""
    if v[1] == "f":
        return {"p": v[0], "t": "f", "m": v[2], "s": v[3], "mt": v[5]}
    if v[1] == "l":
        return {"p": v[0], "t": "l", "l": v[4]}
    return {"p": v[0], "t": v[1], "m": v[2]}


def without_special(entry: dict) -> dict:
    """`entry` with its mode's SPECIAL_BITS cleared (links have no mode of their own)."""
    if entry.get("t") == "l" or "m" not in entry or not entry["m"] & SPECIAL_BITS:
        return entry
    return dict(entry, m=entry["m"] & ~SPECIAL_BITS)


STAT_KEYS = ("p", "t", "m", "s", "l", "mt")
# one encoder each, made once: json.dumps with options makes a new one per call (a manifest's
# lines are encoded 22k at a time); their output is json.dumps's with the same options
_ENTRY = json.JSONEncoder(sort_keys=True, ensure_ascii=False)
_STAT = json.JSONEncoder(ensure_ascii=False)
_STR = json.encoder.encode_basestring          # what _STAT writes for a str (ensure_ascii off)


_FILE_KEYS = frozenset(("h", "m", "mt", "p", "s", "t"))


def entry_line(entry: dict) -> str:
    """An entry as a manifest's line holds it (without the newline): json.dumps with sorted keys,
    put together here for a hashed file's usual values (str and int: faster than the encoder on a
    big tree, and every install writes two manifests of every entry)."""
    if entry.keys() == _FILE_KEYS:
        h, m, mt, p, s = entry["h"], entry["m"], entry["mt"], entry["p"], entry["s"]
        if (type(h) is str and type(p) is str and type(m) is int and type(mt) is int
                and type(s) is int and entry["t"] == "f"):
            return '{"h": %s, "m": %s, "mt": %s, "p": %s, "s": %s, "t": "f"}' % (
                _STR(h), int.__repr__(m), int.__repr__(mt), _STR(p), int.__repr__(s))
    return _ENTRY.encode(entry)


def stat_line(entry: dict) -> bytes:
    """JSON of the entry's STAT_KEYS values as a list, and a newline: the bytes the json module
    writes (stat fingerprints compare with those of earlier installs), put together here for the
    usual values (str, int, None: faster than the encoder on a big tree)."""
    parts = []
    for k in STAT_KEYS:
        v = entry.get(k)
        if v is None:
            parts.append("null")
        elif type(v) is str:
            parts.append(_STR(v))
        elif type(v) is int:
            parts.append(int.__repr__(v))
        else:
            return _STAT.encode([entry.get(k) for k in STAT_KEYS]).encode() + b"\n"
    return ("[" + ", ".join(parts) + "]\n").encode()


def stat_values(root: str, rel: str, st: os.stat_result, strip: bool = False) -> tuple:
    """An entry's STAT_KEYS values as a tuple (its modes `without_special` with `strip`), from
    the walk's lstat: what entry_of, a scan and a verify of every entry of a tree take."""
    m = st.st_mode
    fmt = stat.S_IFMT(m)
    if fmt == stat.S_IFLNK:
        return (rel, "l", None, None, os.readlink(os.path.join(root, rel)), None)
    mode = m & ~SPECIAL_BITS & 0o7777 if strip else m & 0o7777
    if fmt == stat.S_IFREG:
        return (rel, "f", mode, st.st_size, None, int(st.st_mtime))
    return (rel, "d" if fmt == stat.S_IFDIR else "?", mode, None, None, None)


def values_line(v: tuple) -> bytes:
    """stat_line of the entry whose STAT_KEYS values are `v` (from stat_values): the same bytes."""
    if v[1] == "f":
        return ('[%s, "f", %d, %d, null, %d]\n' % (_STR(v[0]), v[2], v[3], v[5])).encode()
    if v[1] == "l":
        return ('[%s, "l", null, null, %s, null]\n' % (_STR(v[0]), _STR(v[4]))).encode()
    return ('[%s, "%s", %d, null, null, null]\n' % (_STR(v[0]), v[1], v[2])).encode()


def stat_fingerprint(entries: Iterable[dict]) -> str:
    """sha256 over what a quick check compares (path, type, mode, size, link, mtime): no reading."""
    h = hashlib.sha256()
    for e in entries:
        h.update(stat_line(e))
    return h.hexdigest()


def quick_check(root: str, installed: dict, source_stat: str, tree: Optional[dict] = None) -> dict:
    """Re-run check without reading file contents, like rsync's default: the source's stat
    fingerprint must equal the one recorded at install time, and every entry at `root` must still
    have the path, type, mode, size, link target and mtime the install recorded (`tree`: that
    check_tree result, when it was taken already)."""
    recorded = installed["header"].get("source_stat_fingerprint")
    if recorded != source_stat:
        return {"ok": False, "why": "the source changed since the install (or was never recorded)"}
    result = dict(tree) if tree is not None else check_tree(root, installed)
    if result["ok"]:
        result["why"] = "same source, destination unchanged (stat check)"
    return result


def check_tree(root: str, installed: dict) -> dict:
    """Whether every entry at `root` still has the path, type, mode, size, link target and mtime
    that `installed` (the manifest the install recorded) says; no reading of contents."""
    patterns = installed["header"].get("excludes", ())
    want = {e["p"]: e for e in installed["entries"]}
    changed = []
    # in the order the directories give; what is compared is keyed by path
    for rel, st in walk(root, patterns, ordered=False):
        w = want.pop(rel, None)
        v = stat_values(root, rel, st)
        if w is None or v[1:] != (w.get("t"), w.get("m"), w.get("s"), w.get("l"), w.get("mt")):
            changed.append(rel)
    changed.extend(want)
    changed.sort()
    if changed:
        return {"ok": False, "why": f"{len(changed)} entries changed at the destination",
                "changed": changed[:20]}
    return {"ok": True, "why": "unchanged since the install (stat check)"}


def scan_header(root: str, patterns: Iterable[str], strip_special: bool) -> bytes:
    """The first line of a scan record (hostfs.scan): what the walk was of, and how."""
    return (json.dumps({"kind": "rb-scan", "root": root, "excludes": list(patterns),
                        "strip_special": bool(strip_special)}, sort_keys=True) + "\n").encode()


def read_scan(path: str, root: str, patterns: Iterable[str], strip_special: bool
              ) -> Optional[bytes]:
    """The stat lines (values_line's, in the walk's order) of a scan record hostfs.scan wrote
    for this very walk (same root, excludes and strip rule); None when there is none, or it is of
    another walk."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC)
    except OSError:
        return None
    with open(fd, "rb") as f:
        data = f.read()
    head, _, body = data.partition(b"\n")
    if head + b"\n" != scan_header(root, patterns, strip_special):
        return None
    return body


def build(root: str, patterns: Iterable[str] = (), algo: str = "sha256", jobs: int = 4,
          reuse: Optional[dict] = None, *, strip_special: bool = False,
          scanned: Optional[str] = None) -> dict:
    """Scan and hash `root`; returns {"header", "entries", "totals", "reused"}.

    With `reuse` (the manifest an earlier install recorded), a file whose type, mode, size and
    mtime equal its entry there takes that entry's digest unread (rsync's quick check: the same
    trust as `rerun: quick`); relocatable files are always read. With `strip_special`, modes are
    recorded without SPECIAL_BITS (transfer.special_modes: strip). With `scanned` (the scan
    record this run's preflight wrote, hostfs.scan), the entries are the ones that scan saw and
    listed for tar, not walked again (totals' disk_bytes is then None: the scan reported it); a
    file read with another size than seen raises Changed."""
    entries, disk = [], 0
    patterns = list(patterns)
    body = read_scan(scanned, root, patterns, strip_special) if scanned else None
    if body is not None:
        rows = body.split(b"\n")              # a name's newline is escaped in its JSON
        if rows[-1] == b"":
            rows.pop()
        values = json.loads(b"[" + b",".join(rows) + b"]")
        entries = [entry_from(v) for v in values]
        stat_fp = hashlib.sha256(body).hexdigest()
        disk = None
        del body, rows, values
    else:
        lines = []
        for rel, st in walk(root, patterns):
            # the entry (without_special'd with strip_special) and its stat_line, from one set
            # of stat values: the install records the lines' sha256 as its source's stat
            v = stat_values(root, rel, st, strip_special)
            lines.append(values_line(v))
            entries.append(entry_from(v))
            disk += st.st_blocks * 512
        stat_fp = hashlib.sha256(b"".join(lines)).hexdigest()
        del lines
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
        for e, h in zip(todo, digests(root, [e["p"] for e in todo], algo, jobs,
                                      [e["s"] for e in todo])):
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
    header["stat_fingerprint"] = stat_fp
    return {"header": header, "entries": entries, "totals": totals, "reused": reused}


def _body(entries: list) -> str:
    """The entry lines of a manifest, each ended by a newline: what its fingerprint is of."""
    lines = [entry_line(e) for e in entries]
    return "\n".join(lines) + "\n" if lines else ""


def dump(manifest: dict, out) -> str:
    """Write `manifest` as JSON lines to `out`; returns its fingerprint (of the lines written)."""
    body = _body(manifest["entries"])
    out.write(json.dumps(manifest["header"], sort_keys=True) + "\n")
    out.write(body)
    out.write(json.dumps({"totals": manifest["totals"]}, sort_keys=True) + "\n")
    return hashlib.sha256(body.encode()).hexdigest()


def save(manifest: dict, path: str, mode: int = 0o644, *, sync: bool = True) -> str:
    """Write `manifest` to `path` (e.g. an install's `.rb-manifest.jsonl`) through a new temp
    file and one rename: a link at `path` is replaced, never written through (`sync`: flushed to
    disk before the rename; a run's private copy need not be). Returns its fingerprint."""
    buf = io.StringIO()
    fp = dump(manifest, buf)
    safefs.write_file(path, buf.getvalue().encode("utf-8"), mode, sync=sync)
    return fp


def load(path: str) -> dict:
    return load_fingerprinted(path)[0]


def load_fingerprinted(path: str) -> Tuple[dict, str]:
    """`load`, and the manifest's fingerprint taken from its entry lines as they are written: for
    a file `dump` wrote (every manifest the kit writes) that is `fingerprint` of its entries,
    without encoding each entry again; for one written otherwise, the fingerprint of its bytes
    (equal fingerprints still mean equal entries)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    rows = [line for line in text.split("\n") if line.strip()]
    # one parse of all the lines (cheaper than a call per line); a line that holds more or less
    # than one value is refused: the count of values differs from the count of lines
    lines = json.loads("[" + ",".join(rows) + "]") if rows else []
    if (len(lines) != len(rows) or not lines or not isinstance(lines[0], dict)
            or not isinstance(lines[-1], dict) or lines[0].get("kind") != "rb-manifest"
            or "totals" not in lines[-1]):
        raise ValueError(f"{path}: not a complete manifest (header or totals line missing)")
    fp = hashlib.sha256("".join(row + "\n" for row in rows[1:-1]).encode()).hexdigest()
    return {"header": lines[0], "entries": lines[1:-1], "totals": lines[-1]["totals"]}, fp


def fingerprint(manifest: dict) -> str:
    """sha256 over the entries: equal fingerprints mean equal trees (for the chosen algo)."""
    return hashlib.sha256(_body(manifest["entries"]).encode()).hexdigest()


def _is_inode(st: os.stat_result, path: str) -> bool:
    """Whether `path` (not followed) is the inode `st` describes (the walk's lstat of a staging
    file: one lstat less per linked file)."""
    try:
        other = os.lstat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (other.st_dev, other.st_ino)


def verify(root: str, manifest: dict, jobs: int = 4, limit: int = 50,
           linked_from: Optional[str] = None, received: Optional[dict] = None,
           linked_inodes: Optional[dict] = None) -> dict:
    """Compare the tree at `root` with `manifest`; every difference is listed (up to `limit`).
    With `linked_from`, a file that is a hard link of the same path there (an incremental install's
    staging: unchanged files linked from the previous install) is checked by stat, not read;
    `linked_inodes` ({path: (st_dev, st_ino)}, what the stage that linked them recorded), a file
    that is still the inode linked is such a link without a look at `linked_from`.
    With `received` ({path: [digest, inode, ctime_ns, size]}: what the receiving end hashed from
    the stream and the inode it wrote), a file that still has that inode, ctime and size is
    checked by that digest, not read (`streamed`); any other file is read and hashed."""
    algo = manifest["header"]["algo"]
    want = {e["p"]: e for e in manifest["entries"]}
    received = received or {}
    extra: list[str] = []
    seen: set = set()
    differ: list[dict] = []
    to_hash = []
    linked = streamed = 0
    # one pass, in the order the directories give (what is compared is keyed by path); what the
    # move excluded (caches: __pycache__, *.pyc) may appear once the venv has run there
    for rel, st in walk(root, manifest["header"].get("excludes", ()), ordered=False):
        w = want.get(rel)
        if w is None:
            extra.append(rel)
            continue
        seen.add(rel)
        v = stat_values(root, rel, st)
        kind = v[1]
        expected = (w.get("t"), w.get("m"), w.get("s"), w.get("l"))
        if expected != v[1:5]:
            key, want_v, value = next(d for d in zip(("t", "m", "s", "l"), expected, v[1:5])
                                      if d[1] != d[2])
            differ.append({"p": rel, "what": key, "want": want_v, "have": value})
        elif kind == "f" and algo != "none":
            if linked_from and ((st.st_dev, st.st_ino) == linked_inodes.get(rel)
                                if linked_inodes is not None
                                else _is_inode(st, os.path.join(linked_from, rel))):
                linked += 1
                continue
            got = received.get(rel)
            if got and got[0] and got[1:] == [st.st_ino, st.st_ctime_ns, st.st_size]:
                streamed += 1
                if w.get("h") != got[0]:
                    differ.append({"p": rel, "what": "content", "want": w.get("h"),
                                   "have": got[0]})
                continue
            to_hash.append(w)
    if to_hash:
        for w, h in zip(to_hash, digests(root, [w["p"] for w in to_hash], algo, jobs)):
            if w.get("h") != h:
                differ.append({"p": w["p"], "what": "content", "want": w.get("h"), "have": h})
    missing = sorted(set(want) - seen) if len(seen) != len(want) else []
    extra.sort()
    ok = not (missing or extra or differ)
    return {
        "ok": ok,
        "algo": algo,
        "checked": len(want),
        "hashed": len(to_hash),
        "linked": linked,
        "streamed": streamed,
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


# what `relocated` adds to a source manifest's header; `source_of` takes them out again
SOURCE_KEYS = ("source_fingerprint", "source_stat_fingerprint", "source_entries")


def relocated(manifest: dict, changes: dict[str, dict], source_fingerprint: Optional[str]) -> dict:
    """The manifest of the installed tree: `manifest` with relocation's rewritten entries, and in
    its header what the source was (for re-runs): its fingerprints, and the source's own entries
    of the rewritten files, so that `source_of` can give back `manifest` itself."""
    entries = [dict(e, **changes.get(e["p"], {})) for e in manifest["entries"]]
    header = {k: v for k, v in manifest["header"].items() if k != "stat_fingerprint"}
    # the stat fingerprint `build` took of these entries, where it is there (it is theirs by
    # construction: the source's engine wrote both), else taken now
    stat_fp = manifest["header"].get("stat_fingerprint") or stat_fingerprint(manifest["entries"])
    header.update(source_fingerprint=source_fingerprint, source_stat_fingerprint=stat_fp,
                  source_entries=[e for e in manifest["entries"] if e["p"] in changes])
    return {"header": header, "entries": entries, "totals": manifest["totals"]}


def source_of(installed: dict) -> Optional[dict]:
    """The source's manifest as of the install, from the install's own manifest: the rewritten
    files' source entries put back, the header without what `relocated` added. None when the
    install did not record them (an older kit). Whether it is that manifest is the caller's to
    check: its fingerprint (`fingerprint`, or what `save` returns) against the one recorded."""
    header = installed["header"]
    kept = header.get("source_entries")
    if not isinstance(kept, list) or not all(isinstance(e, dict) and "p" in e for e in kept):
        return None
    by_path = {e["p"]: e for e in kept}
    m = {"header": {k: v for k, v in header.items() if k not in SOURCE_KEYS},
         "entries": [by_path.get(e["p"], e) for e in installed["entries"]],
         "totals": installed["totals"]}
    return m
RB_PY_E618E5FC
  cat >"${dir}"/rbkit/measure.py <<'RB_PY_804BF2F5'
"""How fast each compressor packs this tree, on the host that will pack it (`compression: auto`).

    rbkit measure ROOT --tool lz4 --tool zstd [--exclude PAT]... [--bytes N] [--seconds S]
                       [--link RATE [--shared-cpu] [--jobs J]]

reads a sample of the tree's files (spread over the whole tree by size: every file's chance is its
bytes, at most 1 MiB of each, N bytes in all, rbrules.common.MEASURE_SAMPLE by default) into
memory, packs it with each tool exactly as the stream packs (rbrules.common.COMPRESSION's `pack`
words: `zstd -1 -T0` uses every core, as the stream's does) and unpacks what it packed, and prints one JSON line: the sample's size, and
per tool the rate it read the sample at (bytes a second, wall), the bytes per CPU second packing
and unpacking (the child's rusage: what the tool takes from CPUs it shares) and the ratio (sample
bytes / packed bytes). A tool that is missing or fails is said with its reason, never measured.
Bounded: the walk stops after 200,000 entries, each tool after S seconds (default 5). With
--link (the relay's rate, rb::measure_link) it prints the choice instead (`through`, `choose`).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import stat
import subprocess
import time
from typing import Any, Dict, List, Tuple

from rbrules.common import COMPRESSION, MEASURE_SAMPLE, stream_count

MAX_ENTRIES = 200_000
PER_FILE = 1 << 20


def _files(root: str, excludes: List[str]) -> List[Tuple[str, int]]:
    """(path, size) of the regular files under root the excludes leave, up to MAX_ENTRIES entries
    seen, in walk order; links are not followed."""
    out: List[Tuple[str, int]] = []
    seen = 0
    todo = [root]
    while todo and seen < MAX_ENTRIES:
        here = todo.pop()
        try:
            entries = sorted(os.scandir(here), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            seen += 1
            if any(fnmatch.fnmatch(e.name, p) for p in excludes):
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                todo.append(e.path)
            elif stat.S_ISREG(st.st_mode) and st.st_size > 0:
                out.append((e.path, st.st_size))
    return out


def sample(root: str, excludes: List[str], want: int = MEASURE_SAMPLE) -> bytes:
    """About `want` bytes of the tree: files picked at even steps of the tree's cumulative size
    (a big file is picked as often as its bytes say), at most PER_FILE of each."""
    files = _files(root, excludes)
    total = sum(size for _p, size in files)
    if not files or total == 0:
        return b""
    picks = max(1, want // (128 << 10))
    step = max(1, total // picks)
    parts: List[bytes] = []
    have, at, mark = 0, 0, 0
    for path, size in files:
        at += size
        if at < mark:
            continue
        mark = at + step
        try:
            # the file the walk saw, never a link put in its place since (read as root)
            with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb", buffering=0) as f:
                data = f.read(min(PER_FILE, want - have))
        except OSError:
            continue
        parts.append(data)
        have += len(data)
        if have >= want:
            break
    return b"".join(parts)


def _run(words: List[str], data: bytes, seconds: float) -> Tuple[float, float, Any]:
    """(wall seconds, CPU seconds of the child, the run) of `words` reading `data`."""
    import resource
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(words, input=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=seconds, check=False, cwd="/")
    took = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return took, cpu, done


def rate(tool: str, data: bytes, seconds: float) -> Dict[str, Any]:
    """{"rate": bytes/s read (wall), "cpu_rate": bytes per CPU second packing, "unpack_cpu_rate":
    bytes (unpacked) per CPU second unpacking, "ratio": in/out} of `tool` on `data`, or
    {"error": why}. The tool's own start (timed on one byte first) is not counted: the stream
    starts it once."""
    words = COMPRESSION[tool]["pack"]
    if shutil.which(words[0]) is None:
        return {"error": "%s is not installed here" % words[0]}
    try:
        start_s, start_cpu, _ = _run(words, b"\0", seconds)
        took, cpu, done = _run(words, data, seconds)
        if done.returncode == 0 and done.stdout:
            _s, un_cpu, undone = _run(COMPRESSION[tool]["unpack"], done.stdout, seconds)
    except subprocess.TimeoutExpired:
        return {"error": "%s took more than %ss for %d bytes" % (words[0], seconds, len(data))}
    took = max(took - start_s, 1e-3)
    if done.returncode != 0 or not done.stdout:
        return {"error": "%s exited %d: %s" % (words[0], done.returncode,
                                               done.stderr.decode("utf-8", "replace")[-200:])}
    cpu = max(cpu - start_cpu, 1e-3)
    out = {"rate": int(len(data) / took), "cpu_rate": int(len(data) / cpu),
           "ratio": round(len(data) / len(done.stdout), 3), "seconds": round(took, 4)}
    if undone.returncode == 0 and len(undone.stdout) == len(data):
        out["unpack_cpu_rate"] = int(len(data) / max(un_cpu - start_cpu, 1e-3))
    return out


MARGIN = 1.1      # a compressor is taken when it is this much faster through than none
SMALL = 1 << 20   # a tree whose sample is smaller moves in a moment whatever its compression


def mb(rate: float) -> str:
    return "%d MB/s" % round(rate / 1e6)


def through(link: int, m: Dict[str, Any], shared: bool, streams: int = 1) -> float:
    """Bytes of the tree a second that `m` (a tool's figures) moves over a link of `link` bytes a
    second. Machines of their own (the stages side by side): the slowest of the link (its bytes
    are the tree's over the ratio), the packing on the source (one packer a stream) and the
    unpacking on the destination. One kernel (every machine of the stream on the same CPUs: the
    link's rate was measured with the ssh ciphers taking those CPUs): the stages take turns, the
    link's time for the packed bytes plus the CPU time packing and unpacking them."""
    moved = link * float(m["ratio"])
    pack = float(m.get("cpu_rate") or m["rate"])
    unpack = float(m.get("unpack_cpu_rate") or 0)
    if shared:
        return 1.0 / (1.0 / moved + 1.0 / pack + (1.0 / unpack if unpack else 0.0))
    rates = [moved, float(m["rate"]) * max(1, streams)] + ([unpack * streams] if unpack else [])
    return min(rates)


def choose(link: int, tools: Dict[str, Dict[str, Any]], shared: bool = False,
           streams: int = 1) -> Tuple[str, str]:
    """(the compression to use, the reason in words) for a link of `link` bytes a second and the
    measured tools (rbkit measure's figures; `through` says how fast each moves the tree), in
    `streams` streams side by side. The fastest, when it beats none by MARGIN, else none."""
    best, best_rate, said = "none", float(link), []
    for tool, m in tools.items():
        if "rate" not in m:
            said.append("%s: %s" % (tool, m.get("error", "not measured")))
            continue
        rate_ = through(link, m, shared, streams)
        said.append("%s %s on this tree (ratio %.1f%s): %s through" % (
            tool, mb(m.get("cpu_rate") or m["rate"]), m["ratio"],
            ", unpacked at %s" % mb(m["unpack_cpu_rate"]) if m.get("unpack_cpu_rate") else "",
            mb(rate_)))
        if rate_ > best_rate * (MARGIN if best == "none" else 1.0):
            best, best_rate = tool, rate_
    why = "link %s%s; %s: %s" % (
        mb(link), " (one kernel: the compressor shares its CPUs)" if shared else "",
        "; ".join(said) if said else "no compressor to try", best)
    if best == "none":
        why += ", the link is as fast as any compressor"
    return best, why


def measure(root: str, tools: List[str], excludes: List[str], want: int = MEASURE_SAMPLE,
            seconds: float = 5.0) -> Dict[str, Any]:
    start = time.monotonic()
    data = sample(root, excludes, want)
    doc: Dict[str, Any] = {"sample_bytes": len(data),
                           "read_seconds": round(time.monotonic() - start, 4), "tools": {}}
    if not data:
        doc["error"] = "no file to sample under %s" % root
        return doc
    for tool in tools:
        if tool not in COMPRESSION or tool == "none":
            doc["tools"][tool] = {"error": "not a compressor the stream knows"}
            continue
        doc["tools"][tool] = rate(tool, data, seconds)
    return doc


def main_lines(doc: Dict[str, Any], link: int, shared: bool = False, jobs: int = 1) -> List[str]:
    """What `rbkit measure --link RATE` prints for the runbook: `choice TOOL`, `why TEXT` and the
    figures as one `json` line (tab-separated)."""
    import json
    if doc.get("error") or link <= 0:
        return ["error\t%s" % (doc.get("error") or "no link rate")]
    if doc["sample_bytes"] < SMALL:
        choice, why = "none", "link %s; the tree is %d KB: nothing worth packing" % (
            mb(link), doc["sample_bytes"] // 1024)
    else:
        choice, why = choose(link, doc["tools"], shared, stream_count(jobs))
    doc = dict(doc, link_rate=link, choice=choice)
    return ["choice\t" + choice, "why\t" + why, "json\t" + json.dumps(doc, sort_keys=True)]
RB_PY_804BF2F5
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
  cat >"${dir}"/rbkit/privacy.py <<'RB_PY_74A03C2D'
"""The destination's parent, private to the user the kit runs as, or refused (issue 33, N4).

Whatever the kit writes beside the destination (the lock, the staging, the backups a `--restore`
puts back, the env file) is only as safe as the directories along the way: whoever can write one
of them can rename, replace or plant an entry there between two of the kit's steps. The rule is
rbrules.private's walk (first_not_private: every component from / down, links followed, owned by
this user or root and not writable by others unless sticky; what is missing is not judged, the
kit makes it), the one the run directory and --report's directory also go through; here the
refusal preflight fails with, naming the fixes and the spec key that accepts such a parent. Not
covered: ACLs and capabilities that grant writes beyond the mode bits.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

from rbrules import private
from rbrules.private import MAX_LINKS, first_not_private, owner, user_name  # noqa: F401

SPEC_KEY = "transfer.shared_parent"


def why_not_private(path: str, uid: int) -> Optional[str]:
    """Why `path`, where entries are made, is not private to the user `uid`, or None: the rule
    (rbrules.private, for a directory entries are made in)."""
    return private.why_not_private(path, uid, parent=True)


def refusal(dest: str, where: str, why: str, uid: int) -> str:
    """The preflight's refusal of `dest`, whose parent (or an ancestor of it) `where` is not
    private: what, why it matters, and the fixes."""
    runner = user_name(uid)
    return ("refusing to install %s as %s: %s. The lock, the staging, the backups that --restore "
            "puts back and the env file live beside the destination, in %s; whoever can write "
            "there can swap them between two steps of this run. Fix: make %s %s's and not "
            "writable by others (chown %s %s && chmod go-w %s), or choose a destination under a "
            "parent only %s can write, or, to accept it, set %s: allow in the spec"
            % (dest, runner, why, os.path.dirname(dest), where, runner, runner, where, where,
               runner, SPEC_KEY))


def check_parent(dest: str, uid: int) -> Optional[Tuple[str, str]]:
    """(the component, why) when the parent of `dest` is not private to `uid`; else None."""
    return first_not_private(os.path.dirname(os.path.abspath(dest)) or "/", uid)
RB_PY_74A03C2D
  cat >"${dir}"/rbkit/proof.py <<'RB_PY_018A9177'
"""The proofs: `verify` (every entry of the staging against the source's manifest, taking the
digests the stream's receiving end computed), `prove` (the staged interpreter runs), the post-swap
proof of the console scripts (`prove_scripts`), the interpreter's own answer, and the scan of data
files that still name the old path (begun with verify, reported by swap).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from typing import Any, List, Tuple

from . import safefs
from . import manifest as kitmanifest
from . import relocate as kitrelocate
from .stream import child_env, run_quiet, tail
from .runner import (PROVE_TIMEOUT, jobs, StepError, Result, Context, read_stamp, _write_stamp,
                     _identity, _require, _require_lock)
from .receive import _load_received
from .staging import _chmod_dir, _drop_mark, _read_mark


def verify(ctx: Context) -> Result:
    """Every entry of the staging against the source's manifest, by a stat walk (type, mode, size,
    link target; every entry there, nothing extra). A file's content: by the digest receive took
    from the stream, when the file still has the inode and ctime tar left it with (RECEIVED);
    by stat when this run's stage linked it from the current install; else it is read and hashed.
    Leaves the stamp relocate and swap require."""
    _require_lock(ctx)
    doc = read_stamp(ctx) or {}
    _write_stamp(ctx, None)
    identity = _identity(ctx.staging)
    linked = ctx.dest if doc.get("delta") and doc.get("identity") == identity else None
    new = ctx.new_manifest()
    received = _load_received(ctx, identity, new["header"]["algo"])
    _scan_elsewhere(ctx)
    inodes = (ctx.linked_inodes[1] if linked and ctx.linked_inodes is not None
              and ctx.linked_inodes[0] == identity else None)
    result = kitmanifest.verify(ctx.staging, new, jobs(ctx.choices.jobs), linked_from=linked,
                                received=received, linked_inodes=inodes)
    listed = kitmanifest.describe(result)
    for line in listed:
        ctx.log(line)
    facts = {k: result[k] for k in ("checked", "hashed", "linked", "streamed")}
    if not result["ok"]:
        _cancel_elsewhere(ctx)
        raise StepError("the copy in %s differs from the source manifest (listed above); the "
                        "destination was not touched" % ctx.staging, facts, listed)
    if _read_mark(ctx) is not None:
        # whole and verified: no longer what a cut stream left; the install's mode
        _chmod_dir(ctx.staging, 0o755)
        _drop_mark(ctx)
    _write_stamp(ctx, {"stage": "verified", "identity": identity, "fingerprint": ctx.fingerprint(),
                       "delta": bool(linked)})
    if result["streamed"]:
        # the files whose digests the stream's receiving end computed are not read again
        detail = "%d entries match, %d files checked by the stream's %s" % (
            result["checked"], result["streamed"], result["algo"])
        if result["hashed"]:
            detail += ", %d hashed again" % result["hashed"]
    else:
        detail = "%d entries match, %d files hashed (%s)" % (result["checked"], result["hashed"],
                                                              result["algo"])
    if linked:
        detail += ", %d linked unchanged" % result["linked"]
    return Result(detail, facts)


def _scan_elsewhere(ctx: Context) -> None:
    """Data files outside bin/ that name the old path are only reported (swap, _report_elsewhere);
    that scan reads every .py, .txt, .json... of the staging, so it starts with verify, in a child
    Python beside verify's walk, on the prefixes relocate will replace (relocate starts it again
    in a thread if those differ)."""
    _cancel_elsewhere(ctx)
    olds = kitrelocate.old_prefixes(ctx.staging, ctx.old, ctx.dest) if ctx.old else []
    if olds:
        ctx.elsewhere = (kitrelocate.ElsewhereChild(ctx.staging, olds), olds)


def stop_background(ctx: Context) -> None:
    """The run's engine ends: what it started beside its steps is stopped (the scan of data
    files, when no swap took its result)."""
    _cancel_elsewhere(ctx)


def _cancel_elsewhere(ctx: Context) -> None:
    scan, ctx.elsewhere = ctx.elsewhere, None
    if scan is not None and hasattr(scan[0], "cancel"):
        scan[0].cancel()


def _report_elsewhere(ctx: Context, facts: dict) -> None:
    """What the scan begun at verify (or relocate) found: logged, counted in `facts`."""
    scan, ctx.elsewhere = ctx.elsewhere, None
    if scan is None:
        return
    found, why = scan[0].result()
    if why:
        ctx.log("the scan for data files that name %s did not finish: %s" % (ctx.old, why))
        return
    facts["elsewhere"] = len(found)
    if found:
        ctx.log("still naming %s outside bin/ (data, left as is): %s" % (ctx.old, ", ".join(found)))


def prove(ctx: Context) -> Result:
    """The staged interpreter runs here and knows where it is: bin/python -c 'sys.prefix' from
    the staging, within PROVE_TIMEOUT. A venv whose base interpreter this host lacks stops here,
    before anything is installed."""
    _require_lock(ctx)
    doc = _require(ctx, ("relocated",), "prove")
    python = os.path.join(ctx.staging, "bin", "python")
    try:
        prefix, version = interpreter_prefix(python, ctx.staging)
    except StepError as exc:
        raise StepError("%s; refused before the swap: nothing was installed" % exc,
                        lines=exc.lines) from None
    if os.path.realpath(prefix) != os.path.realpath(ctx.staging):
        raise StepError("the staged interpreter reports sys.prefix %s, not the staging %s"
                        % (prefix, ctx.staging))
    made = _cfg(ctx.staging, "version") or _cfg(ctx.staging, "version_info")
    if made and made.split(".")[:2] != version.split(".")[:2]:
        raise StepError("bin/python here is Python %s, the venv was made with %s (pyvenv.cfg): its "
                        "packages under lib/python%s are not seen; install Python %s here"
                        % (version, made, ".".join(made.split(".")[:2]),
                           ".".join(made.split(".")[:2])))
    _write_stamp(ctx, dict(doc, stage="proven"))
    return Result("bin/python %s runs from the staging" % version, {"python": version})


# the post-swap proof's hook: a console script's interpreter imports sitecustomize from
# PYTHONPATH at start-up (site), before the script; this one says where the interpreter runs
# from and ends it there, so no script's own code runs
EXEC_PROOF = "rb-exec-proof"
_PROOF_HOOK = (b"import os, sys\n"
               b"os.write(1, b'" + EXEC_PROOF.encode() + b" ' + os.fsencode(sys.prefix) + b'\\0'"
               b" + os.fsencode(sys.executable) + b'\\n')\n"
               b"os._exit(0)\n")


def _console_scripts(dest: str, rewritten: List[str]) -> List[Tuple[str, bytes]]:
    """(rel, header) for each executable regular file under bin/ that relocation rewrote, and
    bin/pip always: what the post-swap proof execs. `header`: the lines the kernel and the
    trampoline read to find the interpreter (the first two) when that is the venv's own python,
    else b"" (a script whose code would run if started)."""
    rels = sorted({r for r in rewritten if r.startswith("bin/") and r.count("/") == 1}
                  | {"bin/pip"})
    out = []
    for rel in rels:
        got = safefs.read_in(dest, rel, limit=1 << 24)
        if got is None or not got[1].st_mode & 0o111:
            continue
        head = got[0][:4096]
        own = kitrelocate.python_script(head, dest)
        out.append((rel, b"\n".join(head.split(b"\n", 2)[:2]) if own else b""))
    return out


def prove_scripts(dest: str, rewritten: List[str], timeout: float = PROVE_TIMEOUT
                  ) -> Tuple[List[str], List[str]]:
    """Exec the console scripts of `dest` through the kernel (their shebangs), at once: each
    whose interpreter is the venv's own python must report, through the hook above, sys.prefix
    == dest, and no code of the script runs. Scripts whose interpreter lines are the same bytes
    (every script in bin/, the same directory) start the same way: one of each such group is
    started for all (bin/pip always for itself). A bin/pip started otherwise (a wrapper) runs
    `--version`, which must name dest; other such scripts are not started. Returns (the scripts
    proven, the failures)."""
    groups: dict = {}
    for rel, head in _console_scripts(dest, rewritten):
        if head or rel == "bin/pip":
            groups.setdefault(head if rel != "bin/pip" else b"pip", []).append(rel)
    if not groups:
        return [], []
    runs = list(groups.values())
    results: List[Any] = [None] * len(runs)
    hook = tempfile.mkdtemp(prefix="rbkit-exec-proof.")     # 0700, this user's
    try:
        fd = os.open(os.path.join(hook, "sitecustomize.py"),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(_PROOF_HOOK)
        env = dict(child_env(), PYTHONPATH=hook, PYTHONDONTWRITEBYTECODE="1")

        def one(i: int) -> None:
            results[i] = run_quiet([os.path.join(dest, runs[i][0]), "--version"], timeout, env)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(runs))]
        width = max(1, min(16, os.cpu_count() or 1))
        for k in range(0, len(threads), width):
            for t in threads[k:k + width]:
                t.start()
            for t in threads[k:k + width]:
                t.join()
    finally:
        shutil.rmtree(hook, ignore_errors=True)
    real = os.path.realpath(dest)
    proven, failed = [], []
    for rels, (rc, out, err) in zip(runs, results):
        line = out.split("\n", 1)[0]
        if line.startswith(EXEC_PROOF + " "):
            prefix, _, exe = line[len(EXEC_PROOF) + 1:].partition("\0")
            # the interpreter in the venv's bin/, however reached (a trampoline beside
            # it runs it by its real path when dest is a link)
            ok = (rc == 0 and os.path.realpath(prefix) == real
                  and os.path.realpath(os.path.dirname(exe)) == os.path.join(real, "bin"))
            said = "sys.prefix %s, %s" % (prefix, exe)
        else:
            # no hook ran (not the venv's python, or one that skips site): what it printed
            ok = rc == 0 and dest + "/" in out
            said = out.strip() or err.strip() or "exit %s" % rc
        if ok:
            proven.extend(rels)
        else:
            same = " (and %d more with its interpreter lines: %s)" % (
                len(rels) - 1, ", ".join(rels[1:])) if len(rels) > 1 else ""
            failed.append("console script %s runs from the wrong place: %s%s"
                          % (rels[0], said, same))
    return sorted(proven), failed


# -- children ------------------------------------------------------------------------------------


def interpreter_prefix(python: str, root: str) -> tuple:
    """(sys.prefix, version) that `python` reports; fails naming what is missing."""
    if not os.path.lexists(python):
        raise StepError("%s has no bin/python: not a venv" % root)
    if not os.path.exists(python):
        target = os.readlink(python) if os.path.islink(python) else python
        raise StepError("bin/python -> %s: that interpreter does not exist on this host (the "
                        "venv's base interpreter%s must be installed here)" % (target, _home(root)))
    rc, out, err = run_quiet([python, "-I", "-B", "-c",
                              "import sys; print(sys.prefix); print(sys.version.split()[0])"],
                             PROVE_TIMEOUT)
    lines = out.splitlines()
    if rc != 0 or len(lines) < 2:
        raise StepError("%s does not run here (exit %s): %s" % (python, rc, " | ".join(
            tail(err or out, 3)) or "no output"), lines=tail(err or out))
    return lines[0], lines[1]


def _home(root: str) -> str:
    home = _cfg(root, "home")
    return ", pyvenv.cfg home = %s" % home if home else ""


def _cfg(root: str, key: str) -> str:
    """A value of the venv's pyvenv.cfg ('' when not there; a link there is not followed)."""
    try:
        got = safefs.read_in(root, "pyvenv.cfg", limit=1 << 20)
    except OSError:
        return ""
    for line in (got[0] if got else b"").decode("utf-8", "replace").splitlines():
        k, _, value = line.partition("=")
        if k.strip() == key:
            return value.strip()
    return ""
RB_PY_018A9177
  cat >"${dir}"/rbkit/receive.py <<'RB_PY_990E7C16'
"""The stream's receiving end: `receive` unpacks the tar stream into this run's staging, hashing
each file as the stream carries it, and keeps those digests (RECEIVED, in the state directory) for
verify (proof.py).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any, List, Optional

from . import hostfs
from . import tarstream
from .stream import COMPRESSION, TAR_RECORD, Progress, pipeline, tail
from .runner import (RECEIVED, KEPT, jobs, StepError, Result, Context, read_stamp, _identity,
                     write_file)


def receive(ctx: Context, producer: Optional[List[str]] = None) -> Result:
    """Unpack a tar stream into this run's staging: from stdin (the far end of the runbook's
    pipeline), or from `producer`'s output (a fan-out node reading its bundle). A reader between
    the decompressor and tar (tarstream.Digester) hashes each file as the stream carries it; when
    tar is done, the digests and each file's inode and ctime as tar left it go into the state
    directory (RECEIVED), for verify. A stream that is not a whole tar archive (truncated, a bad
    header) fails here, whatever tar says."""
    doc = read_stamp(ctx)
    if doc is None or doc.get("stage") != "staged" or _identity(ctx.staging) != doc["identity"]:
        raise StepError("refusing to receive: %s is not the staging this run's stage step made"
                        % ctx.staging)
    _forget_received(ctx)
    # the spec's digest: the source's manifest is made with it, verify compares the two
    algo = ctx.choices.verify
    table = COMPRESSION[ctx.compression]
    argvs: List[Any] = []
    names: List[str] = []
    if producer:
        argvs.append(producer)
        names.append("read")
    if table["unpack"]:
        argvs.append(table["unpack"])
        names.append(table["tool"])
    digester = None
    if algo != "none":
        # hashing threads for big files: the cores tar and the decompressor leave; none on two
        # (tarstream: there each hand-over costs more than the thread gives)
        n = jobs(ctx.choices.jobs)
        if ctx.part is not None:
            n = max(1, n // ctx.part[1])     # several streams: the cores shared among them
        digester = tarstream.Digester(algo, min(8, n - 1) if n > 2 else 0)
        argvs.append(digester.stage)
        names.append("digest reader")
    # never a setuid, setgid, sticky or world-write bit made (as root, --no-same-owner alone keeps
    # them): umask 002 and --no-same-permissions, unless the spec keeps them (special_modes: keep)
    keep = ctx.choices.special_modes == "keep"
    argvs.append(["tar", "-C", ctx.staging, *TAR_RECORD, "-xf", "-", "--no-same-owner"]
                 + ([] if keep else ["--no-same-permissions"]))
    names.append("tar")
    watch = Progress(*ctx.progress) if ctx.progress else None
    codes, errs = pipeline(argvs, ctx.choices.timeout, capture=ctx.capture,
                           umask=None if keep else 0o002,
                           started=watch.start if watch else None)
    if watch is not None:
        watch.stop(digester.off if digester is not None else None)
    bad = ["%s exited %s" % (n, c) for n, c in zip(names, codes) if c != 0]
    broken = ""
    if digester is not None:
        digester.close()
        if digester.corrupt:
            broken = "the stream is not a good tar archive: %s" % digester.corrupt
        elif digester.truncated:
            broken = ("the stream ended at byte %d, before the end of the tar archive (cut short "
                      "on the way?)" % digester.off)
    if bad or broken:
        raise StepError("unpacking into %s failed: %s" % (ctx.staging, "; ".join(
            bad + ([broken] if broken else []))), lines=tail("\n".join(e for e in errs if e)),
            rc=next((c for c in codes if c != 0), 1))
    facts: dict = {"staging": ctx.staging}
    if digester is not None:
        facts["stream_bytes"] = digester.off     # what this end read of the tar stream
    if ctx.choices.special_modes == "strip":
        # several streams: each strips the whole staging once its own tar is done (what another
        # stream's tar still writes, that stream strips)
        stripped = hostfs.strip_special(ctx.staging)
        facts["stripped"] = len(stripped)
        for item in stripped[:20]:
            ctx.log("stripped %s: mode %s -> %s" % (item["p"], item["was"], item["now"]))
    detail = "unpacked into %s (compression %s)" % (ctx.staging, ctx.compression)
    if digester is not None:
        digests = digester.result()
        if digester.lost:
            ctx.log("no digests from the stream (verify reads every file): %s" % digester.lost)
        facts["streamed"] = _save_received(ctx, algo, digests)
        detail += ", %d files hashed from the stream (%s)" % (facts["streamed"], algo)
    return Result(detail, facts)


def _received_path(ctx: Context) -> str:
    if not ctx.state:
        raise StepError("the engine has no private state directory")
    if ctx.part is not None:
        return os.path.join(ctx.state, "received.%d.json" % ctx.part[0])
    return os.path.join(ctx.state, RECEIVED)


def _received_paths(ctx: Context) -> List[str]:
    """Every stream's RECEIVED in the state directory (one, or one per stream)."""
    if not ctx.state:
        raise StepError("the engine has no private state directory")
    try:
        names = os.listdir(ctx.state)
    except OSError:
        return []
    return [os.path.join(ctx.state, n) for n in sorted(names)
            if n in (RECEIVED, KEPT) or _PART_RECEIVED.match(n)]


_PART_RECEIVED = re.compile(r"received\.[0-9]+\.json\Z")


def _forget_received(ctx: Context, every: bool = False) -> None:
    for path in _received_paths(ctx) if every else [_received_path(ctx)]:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _save_received(ctx: Context, algo: str, digests: dict) -> int:
    """RECEIVED: for each regular file of the staging that the stream carried, its digest and
    the inode, ctime and size tar left it with (an lstat each, no reading: a path through a
    link is never one verify's walk takes, so what it names is never looked up). Verify trusts
    a digest only for a file that still has them; returns how many files it lists."""
    files = {}
    for rel, digest in digests.items():
        try:
            st = os.lstat(os.path.join(ctx.staging, rel))
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            files[rel] = [digest, st.st_ino, st.st_ctime_ns, st.st_size]
    doc = {"algo": algo, "identity": _identity(ctx.staging), "files": files}
    write_file(_received_path(ctx), json.dumps(doc, separators=(",", ":")).encode(), 0o600)
    return len(files)


def _load_received(ctx: Context, identity: List[int], algo: str) -> Optional[dict]:
    """The files receive hashed from the stream, or from each of the streams, into this staging
    (None: no record; a record of another staging or algorithm counts as none: those files are
    read)."""
    files: Optional[dict] = None
    for path in _received_paths(ctx):
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError):
            continue
        if (not isinstance(doc, dict) or doc.get("identity") != identity
                or doc.get("algo") != algo):
            continue
        got = doc.get("files") or {}
        if files is None:
            files = got
        else:
            files.update(got)
    return files
RB_PY_990E7C16
  cat >"${dir}"/rbkit/relay.py <<'RB_PY_490D178E'
"""The relay in streams side by side (issue 37): `rbkit engine relay`, run on THIS machine (the
runbook's local kit) when the source cannot reach the destination. Each stream is a pair of ssh
processes here, `ssh SRC <send part I>` piped (1 MiB) into `ssh DST <receive --part I/N>`: one
ssh client is one cipher process, so N pairs use N times the cores of one.

Stream 0 goes over the run's multiplexed connections (its ControlMaster); every other stream
opens its own connections (-o ControlPath=none -o ControlMaster=no, the host's own options and
known_hosts otherwise). Each end starts gated (`send --gate`, `receive --gate`): it says
`ready JOBS` (the cores it may use) and waits for one line on stdin before anything moves:

    split N     (the source end of stream 0 only) split the scan's list into N parts by bytes
                (stream.split_names, the other routes' split); it says `parts M` (M = 1: not split)
    go I N      send / receive part I of N (N = 1: the whole list, no --part)

so a pair whose connection a host refused (sshd's MaxStartups, a firewall) is known before any
byte moves; it is stopped (its ends exit 3, nothing received) and the tree goes in fewer
streams, said on stderr. How many: common.stream_count of the fewest jobs of the three machines
(each stream costs two ssh cipher processes here), at most common.MAX_STREAMS, none below
common.STREAMS_MIN_BYTES (the split says so). The receiving ends' answers are one answer on
stdout (stream.Merged): their progress summed, one receive event with `streams: N`, or the
stream that failed first, named; the others are stopped.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import subprocess
import sys
import threading
from typing import Any, List, Optional

from rbrules import common

from . import stream

GATE = "rbkit-gate"          # the source end's gate lines on its stderr: `rbkit-gate ready 16`
READY_S = 60.0               # a connection (and the kit's start) that says nothing by then: refused
FRESH = ["-o", "ControlPath=none", "-o", "ControlMaster=no", "-o", "ConnectTimeout=15"]


def fresh_ssh(words: List[str]) -> List[str]:
    """The host's ssh words for a connection of its own: not the run's ControlMaster (the first
    value of an ssh option wins, so these go first)."""
    return words[:1] + FRESH + words[1:] if words else []


def shq(word: str) -> str:
    """A word quoted for the far side's shell as rb::shq quotes it: always in single quotes."""
    return "'%s'" % word.replace("'", "'\\''")


def read_line(fd: int, limit: int = 256) -> str:
    """One line from fd, a byte at a time: nothing past it is taken (the stream follows)."""
    got = b""
    while len(got) < limit:
        b = os.read(fd, 1)
        if not b or b == b"\n":
            break
        got += b
    return got.decode("ascii", "replace")


def widen(fd: int) -> None:
    """A 1 MiB pipe between the two ssh clients (as rb::wide_pipe): else they take turns."""
    if sys.platform.startswith("linux"):
        try:
            import fcntl
            fcntl.fcntl(fd, 1031, 1 << 20)
        except OSError:
            pass


class End:
    """How to start the kit on one host: its ssh words (empty: this machine), its kit dir and the
    kit's words there."""

    def __init__(self, name: str, ssh: str, kit: str, words: str) -> None:
        self.name, self.ssh, self.kit = name, shlex.split(ssh), kit
        self.words = shlex.split(words)

    def argv(self, extra: List[str], fresh: bool) -> tuple:
        """(argv, cwd) of the kit words + extra on this host, in its private kit dir."""
        words = self.words + extra
        if not self.ssh:
            return words, self.kit
        line = "cd %s && %s" % (shq(self.kit), " ".join(shq(w) for w in words))
        return (fresh_ssh(self.ssh) if fresh else self.ssh) + [line], "/"


class Pair:
    """One stream: `ssh SRC send --gate` | `ssh DST receive --gate`, started, not yet told to go."""

    def __init__(self, relay: "Relay", k: int, fresh: bool) -> None:
        self.k, self.relay, self.fresh = k, relay, fresh
        relay.pairs.append(self)
        self.index = -1
        self.src_jobs: Optional[int] = None
        self.dst_jobs: Optional[int] = None
        self.said: "queue.Queue[str]" = queue.Queue()
        self.live = threading.Event()      # told to go: its stderr passes through from now on
        self.over = threading.Event()      # go or stop decided
        self.held: List[str] = []          # its stderr until then (why a connection failed)
        self.refused: List[str] = []
        self.timed_out = False
        self.stopped = False               # killed here: another stream failed
        p_r, self.p_w = os.pipe()
        widen(self.p_w)
        g_r, self.g_w = os.pipe()
        e_r, e_w = os.pipe()
        f_r, f_w = os.pipe()
        argv, cwd = relay.src.argv(relay.send + ["--gate", relay.prefix], fresh)
        try:
            self.src = subprocess.Popen(argv, stdin=g_r, stdout=self.p_w, stderr=e_w, cwd=cwd)
            argv, cwd = relay.dst.argv(relay.receive + ["--gate"], fresh)
            self.dst = subprocess.Popen(argv, stdin=p_r, stdout=subprocess.PIPE, stderr=f_w,
                                        cwd=cwd)
        finally:
            for fd in (p_r, g_r, e_w, f_w):
                os.close(fd)
        self.threads = [threading.Thread(target=self._src_err, args=(e_r,), daemon=True),
                        threading.Thread(target=self._dst_err, args=(f_r,), daemon=True),
                        threading.Thread(target=self._dst_out, daemon=True)]
        for t in self.threads:
            t.start()

    def _pass(self, line: str) -> None:
        if self.live.is_set():
            sys.stderr.write(line)
            sys.stderr.flush()
        else:
            self.held.append(line)

    def _src_err(self, fd: int) -> None:
        with open(fd, "r", encoding="utf-8", errors="replace", closefd=True) as f:
            for line in f:
                words = line.split()
                if words[:1] == [GATE] and len(words) == 3 and words[2].isdigit():
                    if words[1] == "ready":
                        self.src_jobs = int(words[2])
                    self.said.put("%s %s" % (words[1], words[2]))
                    continue
                self._pass(line)
        self.said.put("end")

    def _dst_err(self, fd: int) -> None:
        with open(fd, "r", encoding="utf-8", errors="replace", closefd=True) as f:
            for line in f:
                self._pass(line)

    def _dst_out(self) -> None:
        f = self.dst.stdout
        first = f.readline().decode("utf-8", "replace").rstrip("\n").split("\t")
        if first[:2] == ["gate", "ready"] and len(first) == 3 and first[2].isdigit():
            self.dst_jobs = int(first[2])
        self.said.put("dst")
        self.over.wait()
        if self.live.is_set() and self.dst_jobs is not None:
            self.relay.merged.read_file(self.index, f)
        else:
            f.read()

    def ready(self, timeout: float) -> bool:
        """Both ends said ready (their connections made, their kits started); else `refused`
        names the end that ended first, or both when neither answered in time."""
        import time
        deadline = time.monotonic() + timeout
        while self.src_jobs is None or self.dst_jobs is None:
            try:
                got = self.said.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                self.timed_out = True
                self.refused = [e.name for e, j in ((self.relay.src, self.src_jobs),
                                                    (self.relay.dst, self.dst_jobs)) if j is None]
                return False
            if got == "end" and self.src_jobs is None:
                self.refused = [self.relay.src.name]
                return False
            if got == "dst" and self.dst_jobs is None:
                self.refused = [self.relay.dst.name]
                return False
        return True

    def why(self) -> str:
        """The last words of its ends' stderr (ssh's reason), or that they said nothing."""
        lines = [ln.strip() for ln in self.held if ln.strip()]
        if lines:
            return lines[-1]
        return "no answer within %d s" % READY_S if self.timed_out else "it ended without a word"

    def split(self, n: int) -> int:
        """Ask the source end (stream 0's) to split the list into n: the parts it made."""
        os.write(self.g_w, b"split %d\n" % n)
        while True:
            try:
                got = self.said.get(timeout=READY_S)
            except queue.Empty:
                return 1
            if got.startswith("parts "):
                return int(got.split()[1])
            if got == "end":
                return 1

    def go(self, i: int, n: int) -> None:
        self.index = i
        self.live.set()
        for line in self.held:
            sys.stderr.write(line)
        self.held = []
        line = b"go %d %d\n" % (i, n)
        os.write(self.p_w, line)        # the destination's gate line first, then the tar
        os.close(self.p_w)
        self.over.set()
        os.write(self.g_w, line)
        os.close(self.g_w)

    def stop(self) -> None:
        """No go: both ends exit without sending or receiving anything."""
        self.over.set()
        for fd in (self.p_w, self.g_w):
            try:
                os.close(fd)
            except OSError:
                pass
        for p in (self.src, self.dst):
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for t in self.threads:
            t.join(5)

    def kill(self) -> None:
        self.stopped = True
        for p in (self.src, self.dst):
            if p.poll() is None:
                p.kill()


class Relay:
    def __init__(self, src: End, dst: End, send: List[str], receive: List[str], prefix: str,
                 jobs: int, compression: str, most: int = common.MAX_STREAMS) -> None:
        self.src, self.dst, self.send, self.receive = src, dst, send, receive
        self.prefix, self.jobs, self.compression, self.most = prefix, jobs, compression, most
        self.merged: Any = None
        self.pairs: List[Pair] = []

    def say(self, text: str) -> None:
        sys.stderr.write("    relay: %s\n" % text)
        sys.stderr.flush()

    def run(self) -> int:
        """The relay; its streams end with it: on SIGTERM/SIGHUP, or once the runbook that
        started it is gone (its parent changed), every pair is killed (the streams that do not
        use the run's connections would outlive them otherwise)."""
        import signal
        self.pairs = []
        parent = os.getppid()

        def end(signum: int = signal.SIGTERM, _frame: Any = None) -> None:
            for p in list(self.pairs):
                p.kill()
            os._exit(128 + signum)

        def watch() -> None:
            while os.getppid() == parent:
                threading.Event().wait(1.0)
            end()

        signal.signal(signal.SIGTERM, end)
        signal.signal(signal.SIGHUP, end)
        threading.Thread(target=watch, daemon=True).start()
        return self._run()

    def _run(self) -> int:
        first = Pair(self, 0, False)
        if not first.ready(READY_S):
            first.kill()
            first.stop()
            why = "the stream did not start: %s on %s (%s)" % (
                "no answer from the kit" if first.timed_out else "it ended",
                " and ".join(first.refused), first.why())
            sys.stderr.write("rbkit engine relay: %s\n" % why)
            event = {"step": "receive", "status": "failed", "detail": why, "duration_s": 0,
                     "facts": {}}
            sys.stdout.write("event\t%s\ndone\tfailed\t%s\n" % (
                json.dumps(event, sort_keys=True, separators=(",", ":")), why))
            sys.stdout.flush()
            return 255
        jobs = min(self.jobs, first.src_jobs or 1, first.dst_jobs or 1)
        want = min(self.most, common.stream_count(jobs))
        pairs = [first]
        n = first.split(want) if want > 1 else 1
        why = ("below %d MB or no scan record to split" % (common.STREAMS_MIN_BYTES >> 20)
               if want > 1 else "the fewest jobs of the three machines is %d" % jobs)
        if n > 1:
            extra = [Pair(self, k, True) for k in range(1, n)]
            for p in extra:
                if p.ready(READY_S):
                    pairs.append(p)
                else:
                    p.kill()
                    p.stop()
                    self.say("stream %d: %s refused its own connection (%s)"
                             % (p.k + 1, " and ".join(p.refused), p.why()))
            if len(pairs) < n:
                got = first.split(len(pairs)) if len(pairs) > 1 else 1
                for p in pairs[got:]:
                    p.stop()
                why = "%d stream%s instead of %d: %d extra connection%s refused" % (
                    got, "s" if got > 1 else "", n, n - len(pairs), "s" if n - len(pairs) > 1
                    else "")
                pairs, n = pairs[:got], got
            else:
                why = ""
        if n > 1:
            self.say("%d streams side by side (the fewest jobs of here %d, %s %d, %s %d: one "
                     "stream per two), stream 1 over the run's ssh connections, the others "
                     "over their own%s" % (n, self.jobs, self.src.name, first.src_jobs or 0,
                                           self.dst.name, first.dst_jobs or 0,
                                           "; " + why if why else ""))
        else:
            self.say("1 stream (%s)" % why if "instead" not in why else why)
        return self._go(pairs)

    def _go(self, pairs: List[Pair]) -> int:
        n = len(pairs)
        self.merged = stream.Merged(n, sys.stdout, self.compression) if n > 1 else Through()
        failed: List[int] = []
        mutex = threading.Lock()
        codes: List[List[int]] = [[] for _ in range(n)]

        def wait(i: int) -> None:
            p = pairs[i]
            codes[i] = [p.src.wait(), p.dst.wait()]
            for t in p.threads:
                t.join()
            if any(codes[i]):
                with mutex:
                    failed.append(i)
                    if len(failed) == 1:
                        for q in pairs:        # one stream failed: the others are stopped
                            q.kill()

        for i, p in enumerate(pairs):
            p.go(i, n)
        threads = [threading.Thread(target=wait, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        said = []
        for i in range(n):
            why = "; ".join("%s exited %d" % (label, c) for label, c in zip(
                ("pack on %s" % self.src.name, "unpack on %s" % self.dst.name), codes[i]) if c)
            if why and pairs[i].stopped and i != (failed or [-1])[0]:
                why = "stopped here (another stream failed)"
            if why:
                said.append(("stream %d/%d: " % (i + 1, n) if n > 1 else "") + why)
                if not self.merged.done[i]:          # its receiving end said nothing of it
                    self.merged.done[i] = ["failed", why]
        self.merged.answer(failed[0] if failed else None)
        if said:
            sys.stderr.write("rbkit engine relay: %s\n" % "; ".join(said))
            return 1
        return 0


class Through:
    """The one stream's answer, passed on as its receiving end wrote it (Merged's face); a failed
    answer of its own at the end when that end said none."""

    def __init__(self) -> None:
        self.done: List[Optional[List[str]]] = [None]
        self.heard = False

    def read_file(self, i: int, f: Any) -> None:
        for raw in f:
            line = raw.decode("utf-8", "replace")
            if line.startswith("done\t"):
                self.heard = True
                self.done[0] = line.rstrip("\n").split("\t")[1:]
            sys.stdout.write(line)
            sys.stdout.flush()

    def answer(self, first: Optional[int] = None) -> None:
        got = self.done[0]
        if got and got[0] == "failed" and not self.heard:
            event = {"step": "receive", "status": "failed", "detail": got[1], "duration_s": 0,
                     "facts": {}}
            sys.stdout.write("event\t%s\ndone\tfailed\t%s\n" % (
                json.dumps(event, sort_keys=True, separators=(",", ":")), got[1]))
            sys.stdout.flush()


def gate_send(root: str, names: str, compression: str, prefix: str, jobs: int) -> int:
    """`engine send --gate PREFIX`: say ready, then split (`split N`: the parts in PREFIX.N/)
    as asked, and send what `go I N` names. 3: told nothing (stopped)."""
    import shutil
    sys.stderr.write("%s ready %d\n" % (GATE, jobs))
    sys.stderr.flush()
    while True:
        words = read_line(0).split()
        if words[:1] == ["split"] and len(words) == 2 and words[1].isdigit():
            n = int(words[1])
            into = "%s.%d" % (prefix, n)
            shutil.rmtree(into, ignore_errors=True)
            os.mkdir(into, 0o700)
            parts = stream.split_names(names, n, into, common.STREAMS_MIN_BYTES) if n > 1 else None
            sys.stderr.write("%s parts %d\n" % (GATE, len(parts) if parts else 1))
            sys.stderr.flush()
            continue
        if words[:1] == ["go"] and len(words) == 3 and all(w.isdigit() for w in words[1:]):
            i, n = int(words[1]), int(words[2])
            if n > 1:
                names = os.path.join("%s.%d" % (prefix, n), "names.%d" % i)
            return stream.send(root, names, compression)
        return 3


def gate_receive(jobs: int) -> Optional[tuple]:
    """`engine receive --gate`: say ready on stdout, then the part `go I N` names: (I, N), None
    for the one stream; False when told nothing (stopped)."""
    sys.stdout.write("gate\tready\t%d\n" % jobs)
    sys.stdout.flush()
    words = read_line(0).split()
    if words[:1] == ["go"] and len(words) == 3 and all(w.isdigit() for w in words[1:]):
        i, n = int(words[1]), int(words[2])
        return (i, n) if n > 1 else None
    return False
RB_PY_490D178E
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
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import threading
from typing import List, Optional, Tuple

from rbrules import launch

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


# a path the kernel reads as one shebang word and sh as one word inside double quotes
PLAIN_PATH = re.compile(rb"^[A-Za-z0-9/._+-]+$")
PROGRAM = re.compile(rb"^[A-Za-z0-9._+-]+$")
TRAMPOLINE_TAIL = b'" "$0" "$@"'
# pip's own form for a path it cannot write into a shebang: the interpreter beside the script
BESIDE = b'"$(dirname -- "$(realpath -- "$0")")/'


def _fix_venv_shebang(data: bytes, new: str) -> Optional[bytes]:
    """A script whose interpreter is the new venv's own bin/NAME (a shebang, or pip's trampoline),
    where the new path holds anything but plain path characters (a space ends a shebang's path;
    `$`, backquotes or quotes would run inside the trampoline's double quotes): the trampoline that
    finds its interpreter beside the script, so the path is never written into it. None when the
    script is not such a one (a plain path too long for a shebang gets pip's trampoline naming it,
    _fix_long_shebang)."""
    first, _nl, rest = data.partition(b"\n")
    own = b"#!" + new.encode() + b"/bin/"
    tramp = b"'''exec' \"" + new.encode() + b"/bin/"
    if first.startswith(own) and PROGRAM.match(first[len(own):]):
        name = first[len(own):]
        if PLAIN_PATH.match(new.encode()):
            return None  # a plain path: as it is, or pip's trampoline naming it when too long
    elif first.strip() == b"#!/bin/sh" and rest.startswith(tramp):
        line, _nl2, after = rest.partition(b"\n")
        name, sep, tail = line[len(tramp):].partition(b'"')
        if not sep or not PROGRAM.match(name) or (b'"' + tail) != TRAMPOLINE_TAIL:
            return None
        if PLAIN_PATH.match(new.encode()):
            return data
        rest = after
    else:
        return None
    if not rest.startswith(b"' '''"):
        rest = b"' '''\n" + rest
    return b"#!/bin/sh\n'''exec' " + BESIDE + name + TRAMPOLINE_TAIL + b"\n" + rest


def python_script(data: bytes, root: str) -> bool:
    """Whether `data` is a script the kernel starts with the venv at `root`'s own bin/python*,
    in one of the forms relocation writes: `#!ROOT/bin/pythonX`, pip's trampoline naming
    ROOT/bin/pythonX, or the trampoline that finds pythonX beside the script (no interpreter
    arguments: -I or -S would keep the post-swap proof's hook from running)."""
    first, _nl, rest = data.partition(b"\n")
    own = root.encode() + b"/bin/"
    if first.startswith(b"#!" + own):
        name = first[2 + len(own):]
    elif first.strip() == b"#!/bin/sh" and rest.startswith(b"'''exec' "):
        line = rest.partition(b"\n")[0][len(b"'''exec' "):]
        for lead in (b'"' + own, BESIDE):
            if line.startswith(lead):
                name, sep, tail = line[len(lead):].partition(b'"')
                if not sep or (b'"' + tail) != TRAMPOLINE_TAIL:
                    return False
                break
        else:
            return False
    else:
        return False
    return bool(PROGRAM.match(name)) and name.startswith(b"python")


def rewrite_bytes(data: bytes, old: str, new: str) -> Optional[bytes]:
    """`data` with the old prefix replaced, if it is text that names it; else None."""
    if not _is_text(data[:SNIFF]):
        return None
    pat = _pattern(old)
    if not pat.search(data):
        return None
    out = pat.sub(new.encode().replace(b"\\", b"\\\\"), data)
    fixed = _fix_venv_shebang(out, new)
    return fixed if fixed is not None else _fix_long_shebang(out)


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


ACTIVATE_PREFIX = re.compile(rb"""^[ \t]*(?:export[ \t]+)?VIRTUAL_ENV=(['"]?)(/[^'"\n]*?)\1[ \t]*$""",
                             re.MULTILINE)


def recorded_prefix(root: str) -> Optional[str]:
    """The path the venv was made at, as its bin/activate says (VIRTUAL_ENV=...): a venv copied
    with `cp -a` or reached through a link names that path in its scripts, not the one a spec
    gives. None when bin/activate is missing, not a regular file, or names no absolute path."""
    try:
        fd = os.open(os.path.join(root, "bin", "activate"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, 65536)
    finally:
        os.close(fd)
    m = ACTIVATE_PREFIX.search(data)
    return os.fsdecode(m.group(2)).rstrip("/") if m else None


def old_prefixes(root: str, old: str, new: str) -> List[str]:
    """The prefixes relocation replaces in the venv at `root` (copied from `old`, to live at
    `new`): `old`, and the one its activate script records when that differs; [] when the venv
    stays where it was."""
    olds = [old.rstrip("/")]
    recorded = recorded_prefix(root)
    if recorded and recorded not in olds and recorded != new.rstrip("/"):
        olds.append(recorded)
    return [o for o in olds if o != new.rstrip("/")]


def relocate(root: str, old: str, new: str, *, scan_elsewhere: bool = True) -> dict:
    """Rewrite under `root` (a venv copied from `old`, to live at `new`). Returns a summary. The
    prefix the venv's own activate script records is rewritten too when it differs from `old`
    (a venv copied from elsewhere, or reached through a link): its scripts name that path.
    Without `scan_elsewhere`, "elsewhere" is None: the caller scans (`Elsewhere`, in a thread)."""
    rewritten: dict[str, dict] = {}
    olds = old_prefixes(root, old, new)
    if not olds:
        return {"same_path": True, "rewritten": {}, "elsewhere": [], "remaining": [],
                "old_prefixes": []}

    def rewrite(rel: str, dir_fd: int, name: str, data: bytes, st: os.stat_result) -> None:
        out = data
        for prefix in olds:
            out = rewrite_bytes(out, prefix, new) or out
        if out == data:
            return
        # the file's own mode and times (tar restored them; the manifest recorded them)
        safefs.write_at(dir_fd, name, out, stat.S_IMODE(st.st_mode),
                        times_ns=(st.st_atime_ns, st.st_mtime_ns))
        rewritten[rel] = {"s": len(out), "h_sha256": hashlib.sha256(out).hexdigest()}

    _scan_bin(root, rewrite)
    return {
        "same_path": False,
        "old_prefixes": olds,
        "rewritten": rewritten,
        "remaining": sorted({rel for prefix in olds for rel in check(root, prefix)}),
        "elsewhere": sorted({rel for prefix in olds for rel in elsewhere(root, prefix)})
        if scan_elsewhere else None,
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
    root_fd = safefs.open_dir(root)
    try:
        return elsewhere_at(root_fd, [old], limit)
    finally:
        os.close(root_fd)


ELSEWHERE_SUFFIXES = (".pth", ".json", ".txt", ".cfg", "RECORD", ".py", ".sh")


def elsewhere_at(root_fd: int, olds: List[str], limit: int = 20) -> list[str]:
    """`elsewhere` for any of `olds`, in the tree open at `root_fd` (the walk goes by descriptors:
    it finishes in the same tree when that tree is renamed meanwhile; links are not followed).
    What relocation rewrites (bin/, pyvenv.cfg) is not read: the scan may run before it."""
    pats = [_pattern(o) for o in olds]
    found: List[str] = []
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=root_fd):
        rel_dir = os.path.normpath(dirpath)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d != "bin"]
            filenames = [f for f in filenames if f != "pyvenv.cfg"]
        dirnames.sort()
        for name in sorted(filenames):
            if not name.endswith(ELSEWHERE_SUFFIXES):
                continue
            try:
                got = safefs.read_at(dir_fd, name, limit=4 << 20)
            except OSError:
                continue
            if got is None:
                continue
            data = got[0]
            if _is_text(data[:SNIFF]) and any(p.search(data) for p in pats):
                found.append(os.path.normpath(os.path.join(rel_dir, name)))
                if len(found) >= limit:
                    return found
    return found


class ElsewhereChild:
    """`elsewhere_at` in a child Python (`python -S -m rbkit elsewhere`), given a descriptor of
    the tree opened now: it reads every text file outside bin/ while the engine's own walks (verify)
    hold this process's interpreter, and finishes in the same tree when it is renamed. The same
    `result()` as Elsewhere; `cancel()` ends it."""

    def __init__(self, root: str, olds: List[str]) -> None:
        self._out = tempfile.TemporaryFile()
        self._p: Optional[subprocess.Popen] = None
        self._error = ""
        fd = safefs.open_dir(root)
        try:
            env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "HOME")}
            argv = launch.argv(sys.executable, "rbkit") + ["elsewhere", "--fd", str(fd)]
            for o in olds:
                argv += ["--old", o]
            self._p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._out,
                                       stderr=subprocess.STDOUT, cwd="/", env=env, pass_fds=(fd,))
        except OSError as exc:
            self._error = "could not start the scan: %s" % exc.strerror
        finally:
            os.close(fd)

    def cancel(self) -> None:
        if self._p is not None and self._p.poll() is None:
            self._p.kill()
            self._p.wait()

    def result(self, timeout: float = 120.0) -> Tuple[List[str], str]:
        if self._p is None:
            return [], self._error
        try:
            rc = self._p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.cancel()
            return [], "still scanning after %.0f s" % timeout
        self._out.seek(0)
        text = self._out.read().decode("utf-8", "replace")
        try:
            found = json.loads(text) if rc == 0 else None
        except ValueError:
            found = None
        if not isinstance(found, list):
            return [], "the scan exited %s: %s" % (rc, text.strip()[-300:] or "no output")
        return [str(f) for f in found], ""


class Elsewhere:
    """`elsewhere_at` in a thread of its own, over a descriptor of the tree opened now: the
    engine starts it at relocate and takes `result()` after the swap's rename, while the console
    scripts are proved (the scan only reports, it never changes what is installed)."""

    def __init__(self, root: str, olds: List[str]) -> None:
        self._found: List[str] = []
        self._error = ""
        self._fd = safefs.open_dir(root)
        self._thread = threading.Thread(target=self._run, args=(olds,), daemon=True)
        self._thread.start()

    def _run(self, olds: List[str]) -> None:
        try:
            self._found = elsewhere_at(self._fd, olds) if olds else []
        except OSError as exc:
            self._error = str(exc)
        finally:
            os.close(self._fd)

    def result(self, timeout: float = 120.0) -> Tuple[List[str], str]:
        """(paths found, why the scan did not finish: "" when it did)."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            return [], "still scanning after %.0f s" % timeout
        return self._found, self._error
RB_PY_5E1398E2
  cat >"${dir}"/rbkit/report.py <<'RB_PY_A002A646'
"""The run report: the runbook's event log + each host's probe report -> one JSON and a table.

The event log (events.tsv) has tab-separated records: `step ID STATUS START_MS END_MS HOST DETAIL`
(the runbook's steps), `fact STEP KEY VALUE`, and `engine STEP JSON` (an event of the install
engine, rbkit/engine.py, during that step). Each step is reported once (a step recorded twice
keeps its worst status), with the engine's events of it; the outcome is the worse of what the
runbook said and what the steps' records say."""

from __future__ import annotations

import json
import os

from rbrules.common import human

SCHEMA = 1


RANK = {"ok": 0, "skipped": 0, "interrupted": 1, "failed": 2}


def read_events(path: str) -> tuple[list[dict], dict, dict]:
    """(steps, facts by step, engine events by step) from the event log."""
    steps: dict = {}
    facts: dict = {}
    engine: dict = {}
    if not os.path.exists(path):
        return [], facts, engine
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if parts[0] == "step" and len(parts) >= 7:
                _, sid, status, start, end, host, detail = parts[:7]
                entry = {"id": sid, "status": status, "host": host or None,
                         "duration_s": round((int(end) - int(start)) / 1000.0, 3),
                         "detail": detail}
                # once per step: a second record (never written by a sound run) keeps the worse
                if sid not in steps or RANK.get(status, 2) >= RANK.get(steps[sid]["status"], 2):
                    steps[sid] = entry
            elif parts[0] == "fact" and len(parts) >= 4:
                _, sid, key, value = parts[:4]
                facts.setdefault(sid, {})[key] = _number(value)
            elif parts[0] == "engine" and len(parts) >= 3:
                try:
                    event = json.loads(parts[2])
                except ValueError:
                    continue
                engine.setdefault(parts[1], []).append(event)
    return list(steps.values()), facts, engine


def outcome_of(said: str, steps: list[dict]) -> str:
    """The worse of what the runbook said and what its steps' records say."""
    worst = max([said] + [s["status"] for s in steps], key=lambda s: RANK.get(s, 2))
    return "ok" if RANK.get(worst, 2) == 0 else worst


def _number(value: str):
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            return value


GPU_CHECKS = ("devices", "matmul", "nccl", "libraries", "torch")


def gpu_verdict(probe_docs: dict) -> dict:
    """For a spec that declares gpu:, whether the checks proved a GPU: a GPU check that was
    skipped (allow_skip) or a host without a probe report leaves it unproven, said as such."""
    unproven = []
    proven = False
    for host, doc in sorted(probe_docs.items()):
        if "checks" not in doc:
            unproven.append(f"{host}: no probe report")
            continue
        for c in doc["checks"]:
            if c.get("type") in GPU_CHECKS and c.get("status") == "skip":
                unproven.append(f"{host}: {c.get('id')} skipped")
            elif c.get("type") in ("devices", "matmul") and c.get("status") == "pass":
                proven = True
    if not probe_docs:
        unproven.append("no checks ran")
    return {"declared": True, "proven": proven and not unproven, "unproven": unproven}


def build(name: str, spec: str, sha: str, events: str, probes: dict, outcome: str,
          gpu: bool = False, where: str = "") -> dict:
    """The report; WHERE: where a run that did not pass stopped (`in step transfer`), kept unless
    its outcome is ok."""
    steps, facts, engine = read_events(events)
    # a swap undone later in the run (a check or step failed): its row says so, not "installed"
    undone = [e for events_of in engine.values() for e in events_of
              if e.get("step") == "rollback" and e.get("status") == "ok"
              and str(e.get("detail", "")).startswith("rolled back:")]
    for step in steps:
        if step["id"] == "swap" and undone:
            step["detail"] = undone[-1]["detail"]
        if step["id"] in facts:
            step["facts"] = facts[step["id"]]
        if step["id"] in engine:
            step["engine"] = engine.pop(step["id"])
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
    outcome = outcome_of(outcome, steps)
    return {
        "schema": SCHEMA,
        "kind": "rb-run-report",
        "runbook": name,
        "spec": spec,
        "spec_sha256": sha,
        "outcome": outcome,
        **({"where": where} if where and outcome != "ok" else {}),
        "steps": steps,
        "checks": checks,
        "probes": probe_docs,
        "notes": facts.get("main", {}),
        # engine events outside any step: the end of the run (replace: the old install removed)
        "engine": [e for events in engine.values() for e in events],
        **({"gpu": gpu_verdict(probe_docs)} if gpu else {}),
    }


def _rate(mb_s) -> str:
    """A transfer's rate: `<1 MB/s` for a small or fast one whose figure rounds to 0."""
    if not isinstance(mb_s, (int, float)):
        return f"{mb_s} MB/s"
    return f"{mb_s:g} MB/s" if mb_s >= 1 else "<1 MB/s"


def table(doc: dict) -> str:
    rows = [("step", "host", "status", "time", "detail")]
    for s in doc["steps"]:
        f = s.get("facts", {})
        detail = s["detail"]
        if "bytes" in f:
            detail = f"{human(f['bytes'])} in {f.get('files', '?')} files" + (
                f", {_rate(f['mb_s'])}" if "mb_s" in f else "") + (f"; {detail}" if detail else "")
        rows.append((s["id"], s["host"] or "-", s["status"], f"{s['duration_s']:.1f}s", detail))
    widths = [max(len(str(r[i])) for r in rows) for i in range(4)]
    out = []
    for r in rows:
        out.append("  ".join(str(r[i]).ljust(widths[i]) for i in range(4)) + "  " + str(r[4]))
    c = doc["checks"]
    if doc.get("probes") or any(c.values()):     # no line for checks that never ran
        out.append(f"checks: {c['pass']} passed, {c['fail']} failed, {c['skip']} skipped")
    gpu = doc.get("gpu")
    if gpu and not gpu["proven"]:
        out.append("GPU NOT PROVEN: the spec declares gpu:, but "
                   + ("; ".join(gpu["unproven"]) or "no GPU check passed")
                   + " (a skip the spec allowed is not a pass)")
    out.append(f"outcome: {doc['outcome']}" + (f" ({doc['where']})" if doc.get("where") else ""))
    return "\n".join(out)
RB_PY_A002A646
  cat >"${dir}"/rbkit/runner.py <<'RB_PY_3915A8A7'
"""The engine's runner: the steps' Context (what the steps of one run share), Result and StepError,
`run` (times one step and emits its event), the errno words, and the run's private state with its
stamp (see engine.py for the steps and the event).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pwd
import stat
import subprocess
import tempfile
import time
import traceback
from typing import Any, Callable, List, Optional, Tuple

from rbrules import paths
from rbrules.common import ENGINE_STEPS as STEPS, PROVE_TIMEOUT  # noqa: F401 (the engine's names)

from . import hostfs, safefs
from .choices import Choices
from . import manifest as kitmanifest


STAMP = "stamp.json"
RECEIVED = "received.json"   # what receive saw in the stream: each file's digest, and its inode
                             # (received.I.json: stream I's, when several streams ran)
BEFORE = {"relocate": "verify", "prove": "relocate", "swap": "prove"}   # what each stamp needs
INSTALLED = ".rb-manifest.jsonl"
INCOMPLETE = ".incomplete"   # beside the staging (STAGING.incomplete): what arrived of a stream
                             # that did not end in a verified staging, and the source it was for
KEPT = "received.kept.json"  # resume: the kept files' digests, as RECEIVED's, for verify


def staging_path(dest: str) -> str:
    """`.<name>.rb-staging` beside the destination: rbrules.paths.staging, the one rule."""
    return paths.staging(dest)


def jobs(value: Any) -> int:
    """--jobs N, or auto: one per CPU of this host (at most 32)."""
    if value in (None, "", "auto"):
        return max(1, min(32, os.cpu_count() or 1))
    return max(1, int(value))


class StepError(Exception):
    """A step failed: the message is the event's detail; `lines` what it listed (missing files)."""

    def __init__(self, message: str, facts: Optional[dict] = None,
                 lines: Optional[List[str]] = None, rc: int = 1) -> None:
        super().__init__(message)
        self.facts = facts or {}
        self.lines = lines or []
        self.rc = rc


class Result:
    def __init__(self, detail: str = "", facts: Optional[dict] = None, status: str = "ok") -> None:
        self.detail, self.facts, self.status = detail, facts or {}, status


class Context:
    """What the steps of one run share: the destination, the spec's choices (`choices`, read from
    the runbook's document: choices.py) and the facts of this run (`old`: the source's path as it
    was there; `manifest`: the source's manifest on this host; `compression`: what the stream
    uses; `probe_config`: the checks' document; `state`: the private state directory), and what
    the run learned so far (the up-to-date verdict, what the swap did, files never to link).
    `emit` receives every event; `log` every human line (the runbook's stderr, or a node's
    report); `capture`: children's output is collected (a node) instead of passed through."""

    def __init__(self, dest: str, choices: Optional[Choices] = None, *, old: str = "",
                 manifest: str = "", compression: str = "none", probe_config: str = "",
                 state: str = "", capture: bool = False,
                 emit: Optional[Callable[[dict], None]] = None,
                 log: Optional[Callable[[str], None]] = None,
                 trace: Optional[Callable[[str], None]] = None) -> None:
        self.dest = os.path.abspath(dest)
        self.staging = staging_path(self.dest)
        self.choices = choices or Choices()
        self.old, self.manifest, self.compression = old, manifest, compression
        self.probe_config, self.state, self.capture = probe_config, state, capture
        self.env_out = paths.env_file(self.dest, self.choices.env_file)
        self.emit = emit or (lambda event: None)
        self.log = log or (lambda line: None)
        # where a failure's traceback goes: the run's log file only, never the terminal
        self.trace = trace or self.log
        # receive only: (every so many seconds, where to) the bytes of the stream its tar has
        # read so far; which stream of how many this one is (rbkit send --part I/N), None: the one
        self.progress: Optional[Tuple[float, Callable[[int], None]]] = None
        self.part: Optional[Tuple[int, int]] = None
        self.locked = False
        self.events: List[dict] = []
        self.up_to_date: Optional[str] = None   # why the destination already holds the tree
        self.unlinkable: set = set()             # failed the digest check: sent, never linked
        self.swapped: Optional[dict] = None      # this run's swap, until rolled back or finished
        self.failed_checks = ""                  # the checks that failed, named (probe)
        self.critical = 0                        # inside a rename sequence: signals wait
        self.elsewhere: Any = None               # (the scan of data files, its prefixes)
        self.early: Any = None                   # the quick check's walk, begun at the lock
        self._manifest_cache: Optional[tuple] = None
        self._installed_cache: Optional[tuple] = None   # (stat key, the install's manifest)
        self.linked_inodes: Optional[tuple] = None     # (staging identity, what stage linked)

    def new_manifest(self) -> dict:
        """The source's manifest for this run (loaded once per version of the file)."""
        if not self.manifest:
            raise StepError("no source manifest was given to the engine")
        try:
            st = os.stat(self.manifest)
        except OSError as exc:
            raise StepError("the source's manifest %s is not here (%s): run the manifest step "
                            "first" % (self.manifest, exc.strerror)) from None
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if self._manifest_cache is None or self._manifest_cache[0] != key:
            m, fp = kitmanifest.load_fingerprinted(self.manifest)
            self._manifest_cache = (key, m, fp)
        return self._manifest_cache[1]

    def fingerprint(self) -> str:
        self.new_manifest()
        return self._manifest_cache[2]

    def wrote_manifest(self, m: dict, fp: str) -> None:
        """`m` (fingerprint `fp`) was just written to self.manifest: kept without reading it."""
        st = os.stat(self.manifest)
        self._manifest_cache = ((st.st_mtime_ns, st.st_size, st.st_ino), m, fp)

    def installed(self) -> dict:
        """The current install's manifest (raises OSError, ValueError), read once per version of
        the file: the quick check's read (EarlyCheck) serves the stage that follows it."""
        key, m = _load_keyed(os.path.join(self.dest, INSTALLED), self._installed_cache)
        self.keep_installed(key, m)
        return m

    def keep_installed(self, key: Optional[tuple], m: Optional[dict]) -> None:
        """Keep `m`, read from the install's manifest while it had stat `key` (_file_key), for
        `installed`; nothing is kept without both."""
        self._installed_cache = (key, m) if key is not None and m is not None else None


def _file_key(path: str) -> tuple:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _load_keyed(path: str, cache: Optional[tuple]) -> Tuple[Optional[tuple], dict]:
    """(stat key, manifest at `path`): `cache`'s manifest when the file has its key still; the
    key is None when the file changed while it was read (nothing to keep)."""
    key = _file_key(path)
    if cache is not None and cache[0] == key:
        return key, cache[1]
    m = kitmanifest.load(path)
    return (key if _file_key(path) == key else None), m


# -- the runner ----------------------------------------------------------------------------------


def run(ctx: Context, step: str, fn: Callable[..., Result], *args: Any, **kw: Any) -> dict:
    """Run one step, time it, emit its event (also kept in ctx.events); never raises for the
    step's own failure. An exception's text is never the detail: it is said in words
    (os_error_words), its traceback goes to ctx.trace (the run's log)."""
    start = time.monotonic()
    error: List[str] = []
    try:
        res = fn(ctx, *args, **kw)
        status, detail, facts = res.status, res.detail, res.facts
    except StepError as exc:
        status, detail, facts, error = "failed", str(exc), exc.facts, exc.lines
        facts = dict(facts, rc=exc.rc)
        if exc.__cause__ is not None:
            _trace(ctx, step, exc)
    except OSError as exc:
        status, detail, facts = "failed", os_error_words(exc), {"rc": 1}
        _trace(ctx, step, exc)
    except (ValueError, subprocess.SubprocessError) as exc:
        status, detail, facts = "failed", "%s on %s: %s" % (step, ctx.dest, exc), {"rc": 1}
        _trace(ctx, step, exc)
    except Exception as exc:             # a bug of the kit: the step fails, the run reports it
        status, detail, facts = "failed", (
            "the engine's %s step stopped on an error of its own (a bug of the kit: the "
            "traceback is in the run's log)" % step), {"rc": 1}
        _trace(ctx, step, exc)
    event = {"step": step, "status": status, "detail": detail, "facts": facts,
             "duration_s": round(time.monotonic() - start, 3)}
    if status == "failed":
        event["error"] = ([detail] + error)[:20]
    ctx.events.append(event)
    ctx.emit(event)
    return event


def _trace(ctx: Context, step: str, exc: BaseException) -> None:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    ctx.trace("the engine's %s step failed on %s; traceback:\n%s" % (step, ctx.dest, text))


def user_name() -> str:
    """Who this process acts as: the effective user's name (uid N when it has none)."""
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "uid %d" % uid


# what each errno means for who tried, where the system's own words say too little
_ERRNO_WHY = {
    errno.EROFS: "the file system that holds it is mounted read-only",
    errno.EPERM: "the system does not permit it to %s: an immutable or append-only attribute "
                 "(lsattr -d), or a capability %s lacks",
    errno.EACCES: "the permissions of the directory (or of one above it) do not let %s write",
    errno.ENOSPC: "the file system is full",
    errno.EDQUOT: "%s's disk quota is used up",
    errno.ENOENT: "it, or a directory above it, does not exist",
    errno.ENOTDIR: "a path above it is not a directory",
}


def os_error_words(exc: OSError, doing: str = "") -> str:
    """An OSError in words: who cannot do what where, why (the errno's meaning), e.g.
    `root cannot write /x/.venv.rb-lock: read-only file system (EROFS: the file system that
    holds it is mounted read-only)`; never the exception's own text."""
    if exc.errno is None and exc.args:
        return str(exc)          # raised by the kit with its own words (no errno): as it is
    if exc.filename is None and exc.strerror:
        return exc.strerror      # the kit's words with an errno (swapfs), or the system's alone
    who = user_name()
    # what was tried, where the caller does not say: only these errnos tell it was a write
    doing = doing or ("write" if exc.errno in (errno.EROFS, errno.ENOSPC, errno.EDQUOT) else "use")
    where = exc.filename if exc.filename is not None else "a file"
    if exc.filename2 is not None:
        where = "%s to %s" % (where, exc.filename2)
    said = (exc.strerror or "").strip() or "error %s" % exc.errno
    said = said[:1].lower() + said[1:]
    name = errno.errorcode.get(exc.errno or -1, "")
    why = _ERRNO_WHY.get(exc.errno or -1, "")
    why = why.replace("%s", who)
    paren = ": ".join(x for x in (name, why) if x)
    return "%s cannot %s %s: %s%s" % (who, doing, where, said, " (%s)" % paren if paren else "")


def skipped(ctx: Context, step: str, why: str) -> dict:
    return run(ctx, step, lambda c: Result("skipped: " + why, status="skipped"))


# -- the private state and the stamp -------------------------------------------------------------


def make_state(parent: Optional[str] = None) -> str:
    """This run's private state directory (mkdtemp: 0700, ours)."""
    return tempfile.mkdtemp(prefix="rbengine.", dir=parent)


def _stamp_path(ctx: Context) -> str:
    if not ctx.state:
        raise StepError("the engine has no private state directory")
    return os.path.join(ctx.state, STAMP)


def read_stamp(ctx: Context) -> Optional[dict]:
    try:
        with open(_stamp_path(ctx), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def _write_stamp(ctx: Context, doc: Optional[dict]) -> None:
    path = _stamp_path(ctx)
    if doc is None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    write_file(path, json.dumps(doc, sort_keys=True).encode(), 0o600)


def _identity(path: str) -> List[int]:
    """(st_dev, st_ino) of a staging directory; a symlink or a file there is refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise StepError("the staging %s does not exist" % path) from None
    if not stat.S_ISDIR(st.st_mode):
        raise StepError("the staging %s is not a directory (a symlink or a file is never "
                        "followed)" % path)
    return [st.st_dev, st.st_ino]


def _require(ctx: Context, want: tuple, step: str) -> dict:
    """The stamp, when it says the staging went through `want` in this run and is still the same
    directory with the same manifest; else the step is refused."""
    doc = read_stamp(ctx)
    if doc is None or doc.get("stage") not in ("verified", "relocated", "proven"):
        raise StepError(
            "refusing to %s: the staging %s was not verified in this run (a verify that failed, "
            "or one in an earlier run, leaves nothing to install); run again --from verify, or "
            "the whole runbook" % (step, ctx.staging))
    if doc.get("stage") not in want:
        raise StepError("refusing to %s: %s must pass first, in this run (the staging is %s)"
                        % (step, BEFORE[step], doc.get("stage")))
    if _identity(ctx.staging) != doc.get("identity"):
        raise StepError("refusing to %s: %s is not the staging directory this run verified "
                        "(it was replaced since: another run?)" % (step, ctx.staging))
    if doc.get("fingerprint") != ctx.fingerprint():
        raise StepError("refusing to %s: the staging was verified against another manifest"
                        % step)
    for rel, digest in sorted(doc.get("relocated", {}).items()):
        if _sha256(os.path.join(ctx.staging, rel)) != digest:
            raise StepError("refusing to %s: %s changed in the staging after relocation"
                            % (step, rel))
    return doc


def _require_lock(ctx: Context) -> None:
    if not ctx.locked:
        raise StepError("the engine does not hold the destination's lock (a bug)")


def _sha256(path: str) -> Optional[str]:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_file(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write `path` whole: a new temp file beside it (O_EXCL, O_NOFOLLOW), then one rename
    (safefs.write_file: a link at `path` is replaced, never written through)."""
    safefs.write_file(path, data, mode)


def remove_tree(path: str) -> None:
    """Remove a tree we made or replaced, if it is there (hostfs.remove: a link is removed, never
    followed)."""
    if os.path.lexists(path):
        hostfs.remove(path)
RB_PY_3915A8A7
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


def open_dir_at(dir_fd: int, name: str) -> int:
    """A descriptor of the directory `name` in `dir_fd`, not following a link (one component of
    `open_dir`, for a walk that keeps its parent open)."""
    if not name or name in (".", "..") or "/" in name:
        raise OSError(errno.EINVAL, "not one component of a path", name)
    return os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=dir_fd)


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
  cat >"${dir}"/rbkit/serve.py <<'RB_PY_AA931AC3'
"""`python -m rbkit engine ...`: the install engine's command line (engine.py has the steps).

    engine serve --dest D --choices JSON [the run's facts] --holder TEXT
                                                               the destination's engine for a run
    engine receive --dest D --state S --compression C --choices JSON [--progress S] [--part I/N]
                                                               the far end of the stream (stdin)
    engine run STEP... --dest D --choices JSON [the run's facts]   steps in one process (tests)
    engine scan ROOT [--exclude P]... [--names F]              the source before anything is sent
    engine source ROOT [scan's options] [--installed-stat FP|-] --audit RBPROBES-ARGV...
                                                               scan and static checks, one process
    engine hash ROOT --out F [--exclude P]... [--algo A] [--jobs N] [--names F] [--reuse F]
        [--scanned NAMES.stat]                                     (the entries this run's scan saw)
    engine delta MANIFEST BASE --names-out F                   what a host installed from BASE needs
    engine send ROOT NAMES --compression C [--jobs N] [--remote SSH... | --local RECEIVE...]
                                                               the sending end of the stream(s)
    engine relay --src-name H --src-ssh W --src-kit D --src-words W (and --dst-...) --send W
        --receive W --parts PREFIX [--jobs N]                  (here) the relay in streams side by side
    engine staging DEST                                        the staging path (the one rule)

Every command but send and staging answers in lines a runbook reads without a parser:

    set<TAB>KEY<TAB>VALUE      a fact of the step (also inside its event)
    event<TAB>{JSON}           the step's event (engine.py: step, status, detail, facts, duration_s)
    done<TAB>STATUS<TAB>DETAIL the end of the answer: ok, skipped or failed, and why
    ping                       (serve only) the engine is alive; ignored
    log<TAB>TEXT               a line for the run's log file only, never the terminal (a failed
                               step's traceback)
    progress<TAB>BYTES         (receive --progress S only) how much of the tar stream tar has read,
                               every S seconds and once at its end

`--choices` is the spec's choices for the engine, one JSON document (choices.py: read by
Choices.from_json, which refuses a document it cannot read before anything is done); the other
options are the facts of this run: the source's path (--old), the source's manifest here
(--manifest), the compression the run uses, the checks' document (--probe-config).

`serve` takes the destination's lock (lock.py), makes its private state directory (the stamp, the
names a re-run sends, the checks' report: `set state PATH` in its first answer), answers `done`
once it holds the lock (with `set installed_stat FP`: the source stat fingerprint the install
there recorded, empty when none), then reads requests from stdin: words each ended by NUL, a request ended
by an empty word (`verify\\0\\0`, `preflight\\0need=123\\0\\0`). Each request runs one step (a
failure past the swap is followed by its rollback); at the end of stdin it finishes the run
(replace: the install the swap replaced is removed), lets go of the lock and removes its state.
Human lines go to stderr, as they happen. It writes `ping` every few seconds, so that the runbook
knows it alive during a long step, and an ssh session whose runbook is gone (a link down) is
noticed and the lock let go.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import sys
import threading
from typing import Any, Dict, List, Optional

from rbrules import common

from . import engine, hostfs, relay, source, stream
from .choices import VERIFY, add_choices_option, add_run_options
from . import manifest as kitmanifest
from .lock import Lock

PING_S = 5.0
LOCK_WAIT_S = 30.0


class Stop(BaseException):
    """SIGTERM/SIGHUP, or the runbook gone: end the run where it is (never inside a rename)."""


class Answer:
    """The answer channel: lines as described above, written whole under a lock (the ping thread
    writes too)."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.mutex = threading.Lock()
        self.events: List[dict] = []

    def line(self, *fields: Any) -> None:
        text = "\t".join(_one_line(f) for f in fields) + "\n"
        with self.mutex:
            self.out.write(text)
            self.out.flush()

    def event(self, event: dict) -> None:
        for key, value in sorted(event["facts"].items()):
            if isinstance(value, (str, int, float)) or value is None:
                self.line("set", key, "" if value is None else value)
        self.line("event", json.dumps(event, sort_keys=True, separators=(",", ":")))
        self.events.append(event)

    def trace(self, text: str) -> None:
        """Lines for the run's log file only (a failure's traceback): `log` lines."""
        for part in text.splitlines():
            self.line("log", part)

    def done(self) -> int:
        """End the answer to one request: failed when one of its events failed."""
        events, self.events = self.events, []
        failed = [e for e in events if e["status"] == "failed"]
        last = failed[0] if failed else (events[0] if events else None)
        status = "failed" if failed else (last["status"] if last else "ok")
        self.line("done", status, last["detail"] if last else "")
        return 1 if failed else 0


def _one_line(value: Any) -> str:
    return str(value).replace("\t", " ").replace("\n", " ")


def _log(line: str) -> None:
    """A human line of the engine: to stderr (the runbook's log), indented under its step's."""
    for part in (line or "").splitlines():
        sys.stderr.write("    " + part + "\n")
    sys.stderr.flush()


def context(a: argparse.Namespace, **kw: Any) -> engine.Context:
    return engine.Context(a.dest, a.choices, old=a.old, manifest=a.manifest,
                          compression=a.compression, probe_config=a.probe_config, **kw)


# what a request may ask: the step's function and how its key=value words are read
REQUESTS: Dict[str, tuple] = {
    "preflight": (engine.preflight, {"need": int, "source_identity": str}),
    "current": (engine.current, {"mode": str, "source_stat": str}),
    "stage": (engine.stage, {"delta": lambda v: v == "1", "source_stat": str, "algo": str,
                             "exclude": list, "source": str, "resume": lambda v: v == "1"}),
    "resumable": (engine.resumable, {"source": str}),
    "verify": (engine.verify, {}),
    "relocate": (engine.relocate, {}),
    "prove": (engine.prove, {}),
    "swap": (engine.swap, {}),
    "exports": (engine.exports, {}),
    "probe": (engine.probe, {"report": str}),
    "restore": (engine.restore, {"number": int}),
    "backups": (engine.list_backups, {}),
}


def handle(ctx: engine.Context, words: List[str]) -> None:
    """One request: its step, as engine.step runs it (skipped when the destination already holds
    the tree, a failure past the swap rolled back)."""
    name, params = words[0], {}
    fn, types = REQUESTS.get(name, (None, {}))
    for word in words[1:]:
        key, _, value = word.partition("=")
        if key not in types:
            fn = None
            break
        if types[key] is list:                    # a key that may be given again: each a value
            params.setdefault(key, []).append(value)
        else:
            params[key] = types[key](value)
    if fn is None:
        engine.run(ctx, name, _refuse, " ".join(words))
        return
    engine.step(ctx, name, fn, **params)


def _refuse(ctx: engine.Context, what: str) -> engine.Result:
    raise engine.StepError("the engine does not know this request: %s" % what)


def _requests(fd: int):
    """Requests from fd: words ended by NUL, a request ended by an empty word; None at the end."""
    buf = b""
    words: List[str] = []
    while True:
        while b"\0" not in buf:
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            buf += chunk
        word, buf = buf.split(b"\0", 1)
        if word:
            words.append(word.decode("utf-8", "surrogateescape"))
        elif words:
            yield words
            words = []


def serve(a: argparse.Namespace) -> int:
    # the answer channel is a copy of stdout; stdout itself becomes stderr, so that nothing a
    # step or a child prints can be taken for an answer
    out = os.fdopen(os.dup(1), "w", encoding="utf-8", errors="replace")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    answer = Answer(out)
    ctx = context(a, emit=answer.event, log=_log, trace=answer.trace)
    ctx.state = engine.make_state()
    lock = Lock(ctx.dest, a.holder, a.lock_wait, _log)
    stop = {"asked": False}

    def on_signal(signum: int, frame: Any) -> None:
        if stop["asked"]:
            return                  # stopping already (the group's signal, then the runbook's)
        stop["asked"] = True
        if ctx.critical == 0:
            raise Stop()

    def ping() -> None:
        # also while a step works: the runbook reads its answers with a bound between two lines
        while True:
            threading.Event().wait(PING_S)
            try:
                answer.line("ping")
            except (OSError, ValueError):
                os.kill(os.getpid(), signal.SIGTERM)       # the runbook is gone
                return

    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the runbook's Ctrl-C: it closes our stdin
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    rc = 0
    try:
        engine.run(ctx, "lock", engine.take_lock, lock)
        engine.begin_early_check(ctx)
        answer.line("set", "installed_stat", installed_stat(ctx.dest))
        if answer.done():
            return 1
        threading.Thread(target=ping, daemon=True).start()
        for words in _requests(0):
            handle(ctx, words)
            answer.done()
            if stop["asked"]:
                raise Stop()
        engine.finish(ctx)
        answer.done()
    except Stop:
        _log("the engine on %s stops: its runbook is gone or it was told to" % ctx.dest)
        rc = 1
    except BrokenPipeError:
        rc = 1
    finally:
        # once stopping, a second signal (the group's, then the runbook's own TERM) must not cut
        # the release of the lock and the removal of the state short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        engine.stop_background(ctx)
        lock.release()
        shutil.rmtree(ctx.state, ignore_errors=True)
    return rc


def cmd_run(a: argparse.Namespace) -> int:
    """Steps in order, in this process, under the lock; stops at the first failure."""
    answer = Answer(sys.stdout)
    ctx = context(a, emit=answer.event, log=_log, trace=answer.trace)
    ctx.state = engine.make_state()
    lock = Lock(ctx.dest, a.holder, a.lock_wait, _log)
    try:
        engine.run(ctx, "lock", engine.take_lock, lock)
        if answer.done():
            return 1
        for step in a.steps:
            words = [step] + (["mode=" + ctx.choices.rerun] if step == "current" else [])
            handle(ctx, words)
            if answer.done():
                return 1
        engine.finish(ctx)
        answer.done()
        return 0
    finally:
        engine.stop_background(ctx)
        lock.release()
        shutil.rmtree(ctx.state, ignore_errors=True)


def cmd_receive(a: argparse.Namespace) -> int:
    if a.gate:
        part = relay.gate_receive(engine.jobs(a.choices.jobs))
        if part is False:
            return 3            # stopped before anything came: nothing received
        a.part = part
    answer = Answer(sys.stdout)
    ctx = engine.Context(a.dest, a.choices, compression=a.compression, state=a.state, log=_log,
                         emit=answer.event, trace=answer.trace)
    if a.progress > 0:
        ctx.progress = (a.progress, lambda n: answer.line("progress", n))
    ctx.part = a.part
    event = engine.run(ctx, "receive", engine.receive)
    if event["status"] == "failed":
        # the runbook names the stage that failed (unpack on HOST); this says why, in its log
        _log("receive: %s" % event["detail"])
    return answer.done()


def cmd_scan(a: argparse.Namespace) -> int:
    answer = Answer(sys.stdout)
    ctx = engine.Context(a.root, emit=answer.event, log=_log, trace=answer.trace)
    def scan(c: engine.Context) -> engine.Result:
        try:
            detail, facts = stream.scan_source(a.root, a.exclude, a.names, a.special_modes,
                                               a.outside_links)
        except stream.SourceRefused as exc:
            raise engine.StepError(str(exc)) from None
        return engine.Result(detail, facts)

    engine.run(ctx, "scan", scan)
    return answer.done()


def cmd_source(a: argparse.Namespace) -> int:
    """The source's scan, then its static checks (source.py), in this one process. The answer
    channel is a copy of stdout; stdout itself becomes stderr (the checks print)."""
    out = os.fdopen(os.dup(1), "w", encoding="utf-8", errors="replace")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    answer = Answer(out)
    ctx = engine.Context(a.root, emit=answer.event, log=_log, trace=answer.trace)
    facts: Dict[str, Any] = {}
    # with cores to spare, the static checks run beside the scan: from the start when no earlier
    # pass can let them be skipped (--checks-beside auto), else as soon as the runbook's line says
    # none does (empty); cancelled when the scan fails or the line's fingerprint is the scan's
    beside = bool(a.audit) and source.spare_cores()
    early: List[Any] = [source.EarlyAudit(a.audit)] if beside and a.checks_beside == "auto" else []
    line: List[str] = [a.installed_stat]
    reader = None
    if a.installed_stat == "-":
        # the runbook learns it from the destination's engine while this scan runs

        def read_line() -> None:
            line[0] = sys.stdin.readline(4096).strip()
            if beside and not early and not line[0]:
                early.append(source.EarlyAudit(a.audit))

        reader = threading.Thread(target=read_line, daemon=True)
        reader.start()
    event = engine.run(ctx, "scan", source.scan, a.root, a.exclude, a.names, a.special_modes,
                       a.outside_links, facts)
    if reader is not None:
        reader.join()
    started = early[0] if early else None
    if event["status"] != "failed":
        engine.run(ctx, "audit", source.audit, a.audit, facts.get("stat_fingerprint") or "",
                   line[0], a.outside_links, started)
    elif started is not None:
        started.cancel()
    return answer.done()


def installed_stat(dest: str) -> str:
    """The source stat fingerprint the install at dest recorded (its manifest's first line), or
    empty: read to let the source skip the static checks of a tree it already passed."""
    try:
        with open(os.path.join(dest, engine.INSTALLED), "rb") as f:
            header = json.loads(f.readline(1 << 20))
    except (OSError, ValueError):
        return ""
    if not isinstance(header, dict) or header.get("kind") != "rb-manifest":
        return ""
    value = header.get("source_stat_fingerprint")
    return value if isinstance(value, str) else ""


def cmd_hash(a: argparse.Namespace) -> int:
    answer = Answer(sys.stdout)

    def build(ctx: engine.Context) -> engine.Result:
        reuse = kitmanifest.load(a.reuse) if a.reuse else None
        m = kitmanifest.build(a.root, a.exclude, a.algo, engine.jobs(a.jobs), reuse,
                              strip_special=a.special_modes == "strip", scanned=a.scanned)
        kitmanifest.save(m, a.out, 0o600)
        if a.names:
            engine.write_file(a.names, b"".join(e["p"].encode("utf-8", "surrogateescape") + b"\0"
                                                for e in m["entries"]), 0o600)
        t = m["totals"]
        fp = kitmanifest.fingerprint(m)
        return engine.Result("%d files, %d symlinks, %s; fingerprint %s" % (
            t["files"], t["links"], a.algo, fp[:16]), {
            "files": t["files"], "links": t["links"], "bytes": t["bytes"], "fingerprint": fp,
            "reused": m["reused"]})

    engine.run(engine.Context(a.root, emit=answer.event, log=_log, trace=answer.trace), "hash",
               build)
    return answer.done()


def cmd_delta(a: argparse.Namespace) -> int:
    answer = Answer(sys.stdout)

    def delta(ctx: engine.Context) -> engine.Result:
        d = kitmanifest.delta(kitmanifest.load(a.manifest), kitmanifest.load(a.base))
        engine.write_file(a.names_out, b"".join(n.encode("utf-8", "surrogateescape") + b"\0"
                                                for n in d.pop("send")), 0o600)
        d["usable"] = int(d["usable"])
        return engine.Result(d.get("why") or "%s files to send" % d.get("send_files"), d)

    engine.run(engine.Context(a.manifest, emit=answer.event, log=_log, trace=answer.trace),
               "delta", delta)
    return answer.done()


def cmd_send(a: argparse.Namespace) -> int:
    if a.gate:
        return relay.gate_send(a.root, a.names, a.compression, a.gate, engine.jobs(a.jobs))
    return stream.send(a.root, a.names, a.compression, a.remote or None, a.local or None,
                       engine.jobs(a.jobs))


def cmd_relay(a: argparse.Namespace) -> int:
    src = relay.End(a.src_name, a.src_ssh, a.src_kit, a.src_words)
    dst = relay.End(a.dst_name, a.dst_ssh, a.dst_kit, a.dst_words)
    return relay.Relay(src, dst, shlex.split(a.send), shlex.split(a.receive), a.parts,
                       engine.jobs(a.jobs), a.compression, a.most).run()


def _part(text: str) -> tuple:
    """--part I/N: stream I (0-based) of N."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError("not I/N: %r" % text) from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError("stream %d of %d" % (i, n))
    return (i, n)


def cmd_staging(a: argparse.Namespace) -> int:
    print(engine.staging_path(a.dest))
    return 0


def _choices(p: argparse.ArgumentParser) -> None:
    """serve's and run's options: the run's facts, the lock's holder and wait."""
    add_run_options(p)
    p.add_argument("--manifest", default="", help="the source's manifest on this host")
    p.add_argument("--holder", default="rbkit engine", help="who holds the lock (named to others)")
    p.add_argument("--lock-wait", type=float, default=LOCK_WAIT_S,
                   help="seconds to wait for a lock another run holds")


def _scan_options(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The source's scan options (`scan`, and `source` which scans first)."""
    p.add_argument("root")
    p.add_argument("--exclude", action="append", default=[])
    p.add_argument("--names")
    p.add_argument("--special-modes", choices=hostfs.SPECIAL_MODES, default="refuse")
    p.add_argument("--outside-links", choices=hostfs.OUTSIDE_LINKS, default="refuse")
    return p


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rbkit engine", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    _choices(s)
    s.set_defaults(fn=serve)
    r = sub.add_parser("run")
    r.add_argument("steps", nargs="+", choices=["current"] + list(REQUESTS))
    _choices(r)
    r.set_defaults(fn=cmd_run)
    rc = sub.add_parser("receive")
    rc.add_argument("--dest", required=True)
    rc.add_argument("--state", required=True)
    rc.add_argument("--compression", choices=sorted(common.COMPRESSION), default="none")
    add_choices_option(rc)
    rc.add_argument("--progress", type=float, default=0.0, metavar="S",
                    help="a `progress BYTES` line every S seconds (0: none)")
    rc.add_argument("--part", type=_part, default=None, metavar="I/N",
                    help="this is stream I of N (rbkit send's streams side by side)")
    rc.add_argument("--gate", action="store_true",
                    help="say `gate ready JOBS`, then wait for `go I N` on stdin (rbkit relay)")
    rc.set_defaults(fn=cmd_receive)
    sc = _scan_options(sub.add_parser("scan"))
    sc.set_defaults(fn=cmd_scan)
    so = _scan_options(sub.add_parser("source"))
    so.add_argument("--installed-stat", default="",
                    help="the destination install's source stat fingerprint (equal: no checks); "
                         "`-`: read it from stdin after the scan")
    so.add_argument("--checks-beside", choices=("auto", "no"), default="auto",
                    help="auto: the static checks start with the scan on a host with cores to "
                         "spare; no: once the installed stat (`-`) says they cannot be skipped")
    so.add_argument("--audit", action="store_true",
                    help="the words after it: the rbprobes command line of the static checks")
    so.set_defaults(fn=cmd_source)
    h = sub.add_parser("hash")
    h.add_argument("root")
    h.add_argument("--exclude", action="append", default=[])
    h.add_argument("--algo", choices=VERIFY, default="sha256")
    h.add_argument("--jobs", default="auto")
    h.add_argument("--out", required=True)
    h.add_argument("--names")
    h.add_argument("--reuse")
    h.add_argument("--scanned", help="the scan record this run's `engine source` wrote (NAMES.stat):"
                   " its entries, not a new walk")
    h.add_argument("--special-modes", choices=hostfs.SPECIAL_MODES, default="refuse",
                   help="strip: modes recorded without setuid/setgid/sticky/world-write")
    h.set_defaults(fn=cmd_hash)
    d = sub.add_parser("delta")
    d.add_argument("manifest")
    d.add_argument("base")
    d.add_argument("--names-out", required=True)
    d.set_defaults(fn=cmd_delta)
    se = sub.add_parser("send")
    se.add_argument("root")
    se.add_argument("names")
    se.add_argument("--compression", choices=sorted(common.COMPRESSION), default="none")
    se.add_argument("--jobs", default="1",
                    help="the cores the run may use here: one stream per two (rbkit stream)")
    se.add_argument("--remote", action="store_true",
                    help="the words after it: an ssh command line the stream is piped into")
    se.add_argument("--local", action="store_true",
                    help="the words after it: the receiving end's command, started here")
    se.add_argument("--gate", metavar="PREFIX", default="",
                    help="say ready, then split into PREFIX.N/ and send as told (rbkit relay)")
    se.set_defaults(fn=cmd_send)
    rl = sub.add_parser("relay")
    for end in ("src", "dst"):
        rl.add_argument("--%s-name" % end, required=True)
        rl.add_argument("--%s-ssh" % end, default="",
                        help="the host's ssh words, quoted for a shell (empty: this machine)")
        rl.add_argument("--%s-kit" % end, required=True, help="the kit's directory there")
        rl.add_argument("--%s-words" % end, required=True, help="the kit's words there, quoted")
    rl.add_argument("--send", required=True, help="`engine send ...` for the source, quoted")
    rl.add_argument("--receive", required=True, help="`engine receive ...`, quoted")
    rl.add_argument("--parts", required=True, help="where the source end splits its list")
    rl.add_argument("--compression", choices=sorted(common.COMPRESSION), default="none")
    rl.add_argument("--jobs", default="auto", help="the cores the run may use here")
    rl.add_argument("--most", type=int, default=common.MAX_STREAMS)
    rl.set_defaults(fn=cmd_relay)
    st = sub.add_parser("staging")
    st.add_argument("dest")
    st.set_defaults(fn=cmd_staging)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    remote: List[str] = []
    tail = {"send": "--remote", "source": "--audit"}.get(argv[0] if argv else "")
    if tail == "--remote":
        tail = next((w for w in argv if w in ("--remote", "--local")), tail)
    if tail and tail in argv:
        # every word after --remote (--local, --audit) is the ssh (receive's, rbprobes')
        # command line, options included
        at = argv.index(tail)
        argv, remote = argv[:at + 1], argv[at + 1:]
    a = parser().parse_args(argv)
    if a.fn is cmd_send:
        a.remote, a.local = (remote, []) if tail == "--remote" else ([], remote)
    if a.fn is cmd_source:
        a.audit = remote
    return a.fn(a)
RB_PY_AA931AC3
  cat >"${dir}"/rbkit/source.py <<'RB_PY_8E7DD95A'
"""The source before anything is sent, in one process (`rbkit engine source`): the scan (a venv
after the excludes, what the threat model refuses; stream.scan_source) and the static checks
(rbprobes: `outside`, or `preflight` with the kernel audit for the target's arch), run in this
process instead of a second Python start; on a host with cores to spare (4 or more) and nothing
recorded to compare with yet, the static checks start in a child Python before the scan and run
beside it (EarlyAudit; on a big venv both take a second or more).

On a re-run the static checks are skipped when, and only when, the scan's stat fingerprint equals
`installed_stat`: the one the destination's install recorded for its source (the tree then was
this tree, file for file: path, type, mode, size, link, mtime), given by the runbook from the
destination's engine. The event says so.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from typing import Any, Dict, List, Optional, Tuple

from rbrules import launch

from . import engine, stream

AUDIT_TIMEOUT_S = 900

# rbprobes' table of checks (`check ...`, `outside   L0 ...`): not repeated in the log
TABLE_ROW = re.compile(r"^check |^[a-z_]* *L0 ")


def scan(ctx: engine.Context, root: str, excludes: List[str], names: Any, special_modes: str,
         outside_links: str, into: Dict[str, Any]) -> engine.Result:
    try:
        detail, facts = stream.scan_source(root, excludes, names, special_modes, outside_links)
    except stream.SourceRefused as exc:
        raise engine.StepError(str(exc)) from None
    into.update(facts)
    return engine.Result(detail, facts)


def failed_checks(doc: Dict[str, Any], keep_links: bool) -> List[str]:
    """The check types that failed in an rbprobes document; links that leave the tree are the
    spec's to allow (transfer.outside_links: keep)."""
    failed = set()
    for c in doc.get("checks") or [doc]:
        refs = (c.get("values") or {}).get("refs") or []
        if c.get("status") != "fail" or (c.get("type") == "outside" and keep_links and refs and
                                         all(r.get("kind") == "symlink" for r in refs)):
            continue
        failed.add(c.get("type") or "?")
    return sorted(failed)


def spare_cores() -> bool:
    """Whether this host has cores for the static checks beside the scan (4 or more usable;
    RBKIT_AUDIT_BESIDE=1 or 0 decides instead: the tests take both ways on any host)."""
    forced = os.environ.get("RBKIT_AUDIT_BESIDE", "")
    if forced in ("0", "1"):
        return forced == "1"
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return n >= 4


class EarlyAudit:
    """rbprobes ARGV in a child Python (this interpreter, this kit), begun before the scan; its
    output goes to unlinked temporary files, read when the scan is done."""

    def __init__(self, argv: List[str]) -> None:
        env = stream.child_env()
        self._out, self._err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        self._p: Optional[subprocess.Popen] = None
        try:
            self._p = subprocess.Popen(launch.argv(sys.executable, "rbprobes") + list(argv),
                                       stdin=subprocess.DEVNULL, stdout=self._out, stderr=self._err,
                                       cwd="/", env=env)
        except OSError as exc:
            self._err.write(("could not start the static checks: %s\n" % exc.strerror).encode())

    def cancel(self) -> None:
        if self._p is not None and self._p.poll() is None:
            self._p.kill()
            self._p.wait()

    def result(self) -> Tuple[int, str, str]:
        """(exit code, stdout, stderr) as cli.main would leave them (124: past AUDIT_TIMEOUT_S)."""
        rc = 127
        if self._p is not None:
            try:
                rc = self._p.wait(AUDIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.cancel()
                rc = 124
        texts = []
        for f in (self._out, self._err):
            f.seek(0)
            texts.append(f.read().decode("utf-8", "replace"))
            f.close()
        return rc, texts[0], texts[1]


def _in_process(argv: List[str]) -> Tuple[int, str, str]:
    cli = importlib.import_module("rbprobes.cli")
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        rc = cli.main(argv)
    except SystemExit as exc:                       # argparse: a usage error
        rc = exc.code if isinstance(exc.code, int) else 2
    finally:
        sys.stdout, sys.stderr = old
    return rc, out.getvalue(), err.getvalue()


def audit(ctx: engine.Context, argv: List[str], stat: str, installed_stat: str,
          outside_links: str, early: Optional[EarlyAudit] = None) -> engine.Result:
    """rbprobes ARGV (in this process, or `early`'s result): facts audit_rc (0 passed, 1 failed,
    else it could not run), audit_failed (the failed check types, space-separated). Its human
    lines go to the log: all of them when it could not run, the problems when it failed."""
    what = argv[0] if argv else ""
    if installed_stat and installed_stat == stat:
        if early is not None:
            early.cancel()
        return engine.Result(
            "skipped: the source is the tree the destination's install recorded (same stat "
            "fingerprint %s); the static checks are not repeated" % stat[:16],
            {"audit_rc": 0, "audit_skipped": 1, "audit_failed": "", "audit_what": what},
            status="skipped")
    rc, out, err = early.result() if early is not None else _in_process(argv)
    failed: List[str] = []
    if rc == 1:
        doc: Dict[str, Any] = {}
        try:
            doc = json.loads(out)
            failed = failed_checks(doc, outside_links == "keep")
        except ValueError:
            rc = 2
            err += "the static checks' report is not JSON: %s\n" % out[:200]
        # the problems, each with its fix (not the table of checks); a single check (outside)
        # prints none: its reason says them
        lines = [ln for ln in err.splitlines() if not TABLE_ROW.match(ln)] or \
            ["%s: %s" % (c.get("type"), c.get("reason")) for c in doc.get("checks") or [doc]
             if c.get("status") == "fail"]
    else:
        lines = err.splitlines() if rc != 0 else []
    for line in lines:
        # a long fact (outside: N reference(s) leave ...) wrapped, each line the engine's prefix
        ctx.log(textwrap.fill(line, width=96, subsequent_indent="  ", break_long_words=False,
                              break_on_hyphens=False) if len(line) > 96 else line)
    if rc == 0 or (rc == 1 and not failed):
        said = "passed"
    elif rc == 1:
        said = "failed: " + " ".join(failed)
    else:
        said = "could not run (exit %s)" % rc
    return engine.Result("%s: %s" % (what, said),
                         {"audit_rc": rc, "audit_skipped": 0, "audit_failed": " ".join(failed),
                          "audit_what": what})
RB_PY_8E7DD95A
  cat >"${dir}"/rbkit/staging.py <<'RB_PY_CD377B36'
"""The staging beside the destination: `stage` (a fresh one, or one whose unchanged files are
hard-linked from the current install), its mark while a stream has not been verified into it,
the resume of what a cut stream left (`resumable`, `resume_stage`), and the source manifest a
re-run may keep (`kept_source`).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import json
import os
import stat
from typing import List, Optional, Tuple

from . import hostfs
from . import manifest as kitmanifest
from .stream import human
from .runner import (INCOMPLETE, KEPT, jobs, StepError, Result, Context, _write_stamp, _identity,
                     _require_lock, write_file, remove_tree)
from .receive import _forget_received


def stage(ctx: Context, delta: bool = False, carried: Optional[str] = None,
          source_stat: str = "", algo: str = "", exclude: Optional[List[str]] = None,
          source: str = "", resume: bool = False) -> Result:
    """A fresh staging beside the destination. With `delta`, every unchanged file (same digest,
    mode, size and mtime as the install recorded, and still so at the destination) is hard-linked
    from the current install, and `send.names` in the state directory lists what the stream must
    still carry. `carried`: the names a payload holds (a fan-out re-run's bundle); a staging that
    needs more than that is removed and the step fails with needs_full.

    With `source_stat` (a re-run, before anything is hashed at the source): the source manifest
    this host holds for the run (ctx.manifest, the one the runbook's machine kept from its last
    run) is used only when it is the source's manifest as of the install (`kept_source`), so
    that nothing at the source needs hashing: `kept=1`. Otherwise nothing is staged (skipped,
    `kept=0` and why): the source is hashed and stage is asked again without it.

    `source` (a fresh staging): what the staging is for (`STAT-FINGERPRINT HOST:PATH`), written
    in its mark (INCOMPLETE, beside it) until verify passes: a stream cut short leaves a staging
    that is private (0700), marked, and never installed, which a later run for the same source
    may continue (`resume`: only the files missing or different are sent, see `resume_stage`).
    Any other staging left here is removed, saying why."""
    _require_lock(ctx)
    _write_stamp(ctx, None)
    _forget_received(ctx, every=True)
    ctx.linked_inodes = None
    if resume:
        return resume_stage(ctx, source)     # refused unless resumable (the manifest step asks)
    if os.path.lexists(ctx.staging):
        why = resumable_why(ctx, source) if source else "not a fresh move's staging"
        ctx.log("an earlier run's staging %s is removed (%s)" % (ctx.staging, why or
                                                                 "this run starts afresh"))
        remove_tree(ctx.staging)
    _drop_mark(ctx)
    facts: dict = {"delta": int(bool(delta))}
    installed = None
    if delta:
        try:
            installed = ctx.installed()
        except (OSError, ValueError):
            why = "no earlier install at %s (or its manifest is unreadable)" % ctx.dest
            if carried is None:
                raise StepError("nothing to link from: " + why) from None
            raise StepError("needs the whole bundle: " + why, {"needs_full": 1}, rc=3) from None
    if source_stat:
        if installed is None:
            raise StepError("a kept source manifest is only for an incremental stage (delta=1)")
        why, rebuilt = kept_source(ctx, installed, source_stat, algo, exclude or [])
        if why:
            return Result("the source is hashed: " + why, {"kept": 0, "why": why},
                          status="skipped")
        m = ctx.new_manifest()
        facts.update(kept=1, rebuilt=int(rebuilt), fingerprint=ctx.fingerprint(),
                     files=m["totals"]["files"], manifest=ctx.manifest)
    if delta:
        if ctx.unlinkable:
            # what failed the digest check is not linked: it is sent (or the bundle is whole)
            installed = dict(installed, entries=[e for e in installed["entries"]
                                                 if e["p"] not in ctx.unlinkable])
        names = os.path.join(ctx.state, "send.names")
        got = hostfs.stage(ctx.dest, ctx.staging, ctx.new_manifest(), installed, names)
        facts.update({k: got.get(k) for k in ("linked", "linked_bytes", "send_files",
                                              "send_bytes", "removed")})
        facts["names"] = names
        if carried is not None:
            have = set(kitmanifest.read_names(carried))
            lacking = [n for n in kitmanifest.read_names(names) if n not in have]
            if lacking:
                remove_tree(ctx.staging)
                raise StepError(
                    "needs the whole bundle: %d files here differ from what the last fan-out "
                    "installed (changed here, or installed from another source), e.g. %s"
                    % (len(lacking), lacking[0]), dict(facts, needs_full=1), rc=3)
        detail = ("%d unchanged files linked from the current install, %d files to send"
                  % (got["linked"], got["send_files"]))
        if source_stat:
            detail += "; the source is unchanged: its manifest as of the install stands for it"
    else:
        parent = os.path.dirname(ctx.staging)
        os.makedirs(parent, exist_ok=True)
        if source:
            # private and marked until verify passes: what a cut stream leaves is kept for a
            # re-run to continue, and is never taken for a whole staging
            os.mkdir(ctx.staging, 0o700)
            write_file(_mark_path(ctx), json.dumps(
                {"source": source, "dest": ctx.dest,
                 "identity": _identity(ctx.staging)}).encode(), 0o600)
        else:
            os.mkdir(ctx.staging, 0o755)
        detail = "fresh staging %s" % ctx.staging
    identity = _identity(ctx.staging)
    if delta:
        # verify, in this engine, knows each linked file by the inode linked (not by a look at
        # the install's file of that name)
        ctx.linked_inodes = (identity, got["inodes"])
    _write_stamp(ctx, {"stage": "staged", "identity": identity, "delta": bool(delta)})
    return Result(detail, facts)


def _mark_path(ctx: Context) -> str:
    return ctx.staging + INCOMPLETE


def _drop_mark(ctx: Context) -> None:
    try:
        os.unlink(_mark_path(ctx))
    except FileNotFoundError:
        pass


def _read_mark(ctx: Context) -> Optional[dict]:
    """The staging's mark, when it is a regular file of ours (this user's, one link, no bits for
    others: made by `stage` under the lock), else None."""
    try:
        fd = os.open(_mark_path(ctx), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1
                or st.st_mode & 0o077):
            return None
        try:
            doc = json.loads(f.read(1 << 16))
        except ValueError:
            return None
    return doc if isinstance(doc, dict) else None


def resumable_why(ctx: Context, source: str) -> str:
    """"" when the staging beside the destination is what a cut stream of this very source left
    (a private directory of ours, marked by `stage` for `source`: STAT-FINGERPRINT HOST:PATH),
    else why not, in words."""
    try:
        st = os.lstat(ctx.staging)
    except FileNotFoundError:
        return "no staging at %s" % ctx.staging
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return "%s is not a directory of ours" % ctx.staging
    mark = _read_mark(ctx)
    if mark is None:
        return ("it is not marked as what a cut stream left (%s: a staging that passed verify, "
                "or an older kit's)" % _mark_path(ctx))
    if mark.get("dest") != ctx.dest or mark.get("identity") != [st.st_dev, st.st_ino]:
        return "its mark %s is of another directory" % _mark_path(ctx)
    was, now = str(mark.get("source", "")), source
    if was.partition(" ")[2] != now.partition(" ")[2]:
        return "it was for another source (%s)" % was.partition(" ")[2]
    if was != now:
        return "the source changed since (its stat fingerprint differs)"
    return ""


def resumable(ctx: Context, source: str = "") -> Result:
    """Whether a cut stream of this source left a staging here that `stage resume=1` continues
    (resumable_why). Nothing is written."""
    _require_lock(ctx)
    why = resumable_why(ctx, source)
    if why:
        if os.path.lexists(ctx.staging):
            return Result("an earlier staging is not continued: %s" % why,
                          {"resumable": 0, "why": why})
        return Result(why, {"resumable": 0, "why": why})
    return Result("%s holds what a cut stream of this source left" % ctx.staging,
                  {"resumable": 1})


def resume_stage(ctx: Context, source: str) -> Result:
    """Continue a cut stream's staging (resumable_why must hold, and the source's manifest be
    here): every entry there that the manifest does not list as it is (a file of another size,
    mode or mtime: one cut mid-write; a link, a directory where a file belongs) is removed; each
    remaining file is read and kept only when its digest is the manifest's (the others are
    removed). The names the stream must still carry (every directory and symlink, and each file
    not kept) go to `send.names` in the state directory; the kept files' digests, with the
    inode, ctime and size they were read with, to KEPT (verify takes them as it takes the
    stream's). The staging stays marked until verify passes."""
    why = resumable_why(ctx, source)
    m = ctx.new_manifest()
    algo = m["header"].get("algo")
    if not why and algo in (None, "", "none"):
        why = "the manifest has no digests (verify: none) to compare what arrived with"
    if why:
        raise StepError("cannot continue the staging %s: %s" % (ctx.staging, why))
    _chmod_dir(ctx.staging, 0o700)
    wanted = {e["p"]: e for e in m["entries"]}
    candidates, removed = _resume_walk(ctx.staging, wanted)
    kept = _resume_hash(ctx.staging, candidates, algo, jobs(ctx.choices.jobs))
    removed += len(candidates) - len(kept)
    send: List[str] = []
    kept_bytes = send_bytes = send_files = total = 0
    for e in m["entries"]:
        if e["t"] == "f":
            total += e["s"]
            if e["p"] in kept:
                kept_bytes += e["s"]
                continue
            send_files += 1
            send_bytes += e["s"]
        send.append(e["p"])
    names = os.path.join(ctx.state, "send.names")
    write_file(names, b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in send), 0o600)
    identity = _identity(ctx.staging)
    doc = {"algo": algo, "identity": identity, "files": kept}
    write_file(os.path.join(ctx.state, KEPT), json.dumps(doc, separators=(",", ":")).encode(),
               0o600)
    _write_stamp(ctx, {"stage": "staged", "identity": identity, "delta": False})
    detail = ("resuming: %s of %s already staged (%d files, read and matched); %s to send "
              "(%d files)" % (human(kept_bytes), human(total), len(kept), human(send_bytes),
                              send_files))
    return Result(detail, {"resumed": 1, "kept": len(kept), "kept_bytes": kept_bytes,
                           "send_files": send_files, "send_bytes": send_bytes,
                           "total_bytes": total, "removed": removed, "names": names,
                           "delta": 0})


def _chmod_dir(path: str, mode: int) -> None:
    """chmod the directory at `path` itself (a link there is refused, never followed)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _resume_walk(root: str, wanted: dict) -> Tuple[List[tuple], int]:
    """What a cut stream left in `root`, against the manifest's entries: (the files whose type,
    size, mode and mtime are the manifest's, to be read: (rel, entry, stat)), how many entries
    were removed. Nothing is followed: a link (at any name) is removed as a link, a directory the
    manifest does not list is removed whole."""
    candidates: List[tuple] = []
    removed = 0
    for here, dirs, files in os.walk(root, topdown=True, followlinks=False):
        rel_here = os.path.relpath(here, root)
        rel_here = "" if rel_here == "." else rel_here
        for name in list(dirs) + files:
            rel = rel_here + "/" + name if rel_here else name
            path = os.path.join(here, name)
            st = os.lstat(path)
            e = wanted.get(rel)
            if stat.S_ISDIR(st.st_mode) and e is not None and e["t"] == "d":
                continue
            if (stat.S_ISREG(st.st_mode) and e is not None and e["t"] == "f"
                    and st.st_size == e["s"] and stat.S_IMODE(st.st_mode) == e.get("m")
                    and int(st.st_mtime) == e.get("mt")):
                candidates.append((rel, e, st))
                continue
            remove_tree(path)
            removed += 1
            if name in dirs:
                dirs.remove(name)
    return candidates, removed


def _resume_hash(root: str, candidates: List[tuple], algo: str, n: int) -> dict:
    """{rel: [digest, ino, ctime_ns, size]} of the candidates whose digest is the manifest's and
    that did not change while read; each other one is removed."""
    from concurrent.futures import ThreadPoolExecutor

    def one(item: tuple) -> Optional[list]:
        rel, e, st = item
        path = os.path.join(root, rel)
        try:
            got = kitmanifest.digest(path, algo, size=e["s"])
            after = os.lstat(path)
        except (OSError, kitmanifest.Changed):
            got, after = None, None
        if (got == e.get("h") and after is not None and after.st_ino == st.st_ino
                and after.st_ctime_ns == st.st_ctime_ns and after.st_size == st.st_size):
            return [got, st.st_ino, st.st_ctime_ns, st.st_size]
        remove_tree(path)
        return None

    kept = {}
    with ThreadPoolExecutor(max_workers=max(1, min(8, n))) as pool:
        for item, got in zip(candidates, pool.map(one, candidates)):
            if got is not None:
                kept[item[0]] = got
    return kept


def kept_source(ctx: Context, installed: dict, source_stat: str, algo: str,
                exclude: List[str]) -> Tuple[str, bool]:
    """(why not, rebuilt): whether the source's manifest as of the install can stand for the
    source's now, and where it came from. It can when the install recorded `source_stat` as its
    source's stat fingerprint and that is the stat fingerprint of the manifest's entries (the
    source is unchanged since, by the quick check's trust: path, type, mode, size, link and mtime
    of every entry), the manifest is, by its fingerprint, the one the install recorded for its
    source, and it was made with this run's digest, excludes and special-modes rule. The manifest
    is the one this host was given for the run (ctx.manifest: the runbook's machine kept it from
    its last run) when that is it; else the one `manifest.source_of` rebuilds from the install's
    own manifest, written to ctx.manifest (rebuilt: True)."""
    header = installed["header"]
    if header.get("source_stat_fingerprint") != source_stat:
        return "the source changed since the install", False
    rebuilt, stat_fp = False, ""
    try:
        ok = ctx.fingerprint() == header.get("source_fingerprint")
    except (StepError, OSError, ValueError):
        ok = False
    if not ok:
        m = kitmanifest.source_of(installed)
        if m is None:
            return ("the install did not record its source's manifest (an older kit), and none "
                    "kept here is it"), False
        if not ctx.manifest:
            raise StepError("no source manifest path was given to the engine")
        # the stat fingerprint its entries have (checked below), in its header as build puts
        # it there: relocate's record of the source takes it from there
        stat_fp = kitmanifest.stat_fingerprint(m["entries"])
        if stat_fp == source_stat:
            m["header"]["stat_fingerprint"] = stat_fp
        fp = kitmanifest.save(m, ctx.manifest, 0o600, sync=False)
        if fp != header.get("source_fingerprint"):
            os.unlink(ctx.manifest)
            return "the install's record of its source's manifest does not add up", False
        ctx.wrote_manifest(m, fp)
        rebuilt = True
    m = ctx.new_manifest()
    kept = m["header"]
    if (kept.get("algo") != algo or list(kept.get("excludes", ())) != list(exclude)
            or bool(kept.get("strip_special")) != (ctx.choices.special_modes == "strip")):
        return "the install's source manifest has other digests, excludes or modes", rebuilt
    if (stat_fp if rebuilt else kitmanifest.stat_fingerprint(m["entries"])) != source_stat:
        return "the install's source manifest does not have its recorded stat", rebuilt
    return "", rebuilt
RB_PY_CD377B36
  cat >"${dir}"/rbkit/stream.py <<'RB_PY_5F5B99FE'
"""The stream between hosts and what runs beside it: the one compression table, the sending end
(`send`: tar of the names a manifest lists, compressed; on to ssh for the direct route), the
source's scan before anything is sent (`scan_source`), and how the engine runs children
(`pipeline`, every stage's exit code seen; `run_quiet`). The receiving end is engine.receive.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional

# the stream's rules are rbrules.common's (the compiler states them too); engine.py, serve.py,
# fanout.py, relay.py and measure.py still name them from here
from rbrules.common import (COMPRESSION, MAX_STREAMS, STREAMS_MIN_BYTES,  # noqa: F401
                            TAR_RECORD, compressors, human, stream_count)

from . import hostfs
from . import manifest as kitmanifest

class SourceRefused(Exception):
    """The source must not be sent: the message says why."""


def child_env() -> Dict[str, str]:
    """The environment of what runs from the tree: ours without PYTHON* (the kit's PYTHONPATH
    must not reach the moved interpreter), no bytecode written into the tree."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run_quiet(argv: List[str], timeout: Optional[float],
              env: Optional[Dict[str, str]] = None) -> tuple:
    """(rc, stdout, stderr) of argv, output collected, from /; 124 when it timed out, 127 when
    it could not start."""
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=env or child_env(), cwd="/",
                           timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return 124, "", "timed out after %ss: %s" % (timeout, argv[0])
    except OSError as exc:
        return 127, "", "%s: %s" % (argv[0], exc.strerror)
    return (p.returncode, p.stdout.decode("utf-8", "replace"),
            p.stderr.decode("utf-8", "replace"))


def pipeline(argvs: List[Any], timeout: Optional[float], capture: bool = False,
             stdin: Any = None, stdout: Any = None, umask: Optional[int] = None,
             started: Optional[Callable[[List[Any]], None]] = None) -> tuple:
    """Run argvs as one pipeline (each stage's stdout into the next; the first reads `stdin`,
    default ours; the last writes `stdout`, default ours), from /. Returns (one exit code per
    stage, stderr texts: only with `capture`, else they went to ours). A stage that cannot start
    counts 127 (and so do the stages after it); past `timeout` every stage is killed (124).
    `started` is called with the running stages once all have started (a `Progress` watch).

    A stage may be a function `fn(in_fd, out_fd) -> int` instead of an argv (not the last): it
    runs in a thread of this process between its neighbours (tarstream.Digester.stage), its
    return value is its exit code (1 when it raised), its stderr text empty."""
    procs: List[Any] = []
    errs: List[Any] = []
    prev = stdin
    not_started: Optional[str] = None
    for i, argv in enumerate(argvs):
        last = i == len(argvs) - 1
        if callable(argv):
            procs.append(_Inline(argv, prev))
            prev = procs[-1].stdout
            errs.append(None)
            continue
        err = tempfile.TemporaryFile() if capture else None
        try:
            p = subprocess.Popen(argv, stdin=prev, stdout=stdout if last else subprocess.PIPE,
                                 stderr=err, cwd="/", umask=-1 if umask is None else umask)
        except OSError as exc:
            not_started = "%s: %s" % (argv[0], exc.strerror)
            if err is not None:
                err.close()
            break
        if i > 0:
            _close(prev)                 # the previous stage's output is the child's now
        prev = p.stdout
        procs.append(p)
        errs.append(err)
    if not_started is not None:
        if procs and prev is not None:
            _close(prev)
        for p in procs:
            p.kill()
    elif started is not None:
        started(procs)
    codes: List[int] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    for p in procs:
        try:
            left = None if deadline is None else max(0.1, deadline - time.monotonic())
            codes.append(p.wait(left))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            codes.append(124)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    codes += [127] * (len(argvs) - len(procs))
    texts = [not_started] if not_started else []
    for err in errs:
        if err is not None:
            err.seek(0)
            texts.append(err.read().decode("utf-8", "replace"))
            err.close()
        elif capture:
            texts.append("")
    return codes, texts


def _close(stream: Any) -> None:
    if isinstance(stream, int):
        os.close(stream)
    elif stream is not None:
        stream.close()


class _Inline:
    """A pipeline stage that is a function in a thread (see `pipeline`), with a Popen's face:
    `stdout` (the read end of its output pipe, an fd for the next stage), wait, poll, kill."""

    def __init__(self, fn: Any, stdin: Any) -> None:
        import threading
        if stdin is None:
            self._in, self._own_in = 0, False
        elif isinstance(stdin, int):
            self._in, self._own_in = stdin, True
        else:
            self._in, self._own_in = os.dup(stdin.fileno()), True
            stdin.close()
        self.stdout, self._out = os.pipe()
        self._fn = fn
        self.returncode: Optional[int] = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.returncode = int(self._fn(self._in, self._out) or 0)
        except Exception as exc:          # the stage's own failure: named, counted as exit 1
            sys.stderr.write("rbkit: %s: %s\n" % (type(exc).__name__, exc))
            self.returncode = 1
        finally:
            os.close(self._out)
            if self._own_in:
                os.close(self._in)

    def wait(self, timeout: Optional[float] = None) -> int:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise subprocess.TimeoutExpired("inline stage", timeout or 0)
        return self.returncode if self.returncode is not None else 1

    def poll(self) -> Optional[int]:
        return None if self._thread.is_alive() else self.wait()

    def kill(self) -> None:
        pass          # it ends when its input ends or its reader goes: both are killed


class Progress:
    """How far the last stage of a pipeline (the receiving end's tar) has read its input: every
    `every` seconds, the bytes it read so far (rchar in /proc/PID/io, the uncompressed tar stream:
    no copy of the stream is made to count it) go to `say`. Nothing where /proc does not tell;
    never a figure of another process (a stage reaped, its pid free again, is read no more)."""

    def __init__(self, every: float, say: Callable[[int], None]) -> None:
        self.every, self.say = every, say
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self, procs: List[Any]) -> None:
        """The `started` hook of `pipeline`."""
        last = procs[-1] if procs else None
        if last is None or not isinstance(getattr(last, "pid", None), int):
            return
        self._thread = threading.Thread(target=self._run, args=(last,), daemon=True)
        self._thread.start()

    def _run(self, proc: Any) -> None:
        path = "/proc/%d/io" % proc.pid
        while not self._stop.wait(self.every):
            if proc.returncode is not None:
                return
            try:
                with open(path, "rb") as f:
                    text = f.read()
            except OSError:
                return
            if proc.returncode is not None:
                return
            for line in text.splitlines():
                if line.startswith(b"rchar:"):
                    self.say(int(line.split()[1]))
                    break
            else:
                return

    def stop(self, final: Optional[int] = None) -> None:
        """No more samples; `final`: the stream's whole size, said last (when it is known)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if final is not None:
            self.say(final)


def tail(text: str, lines: int = 8) -> List[str]:
    return [ln for ln in (text or "").splitlines() if ln.strip()][-lines:]



def scan_source(root: str, excludes: List[str], names: Optional[str] = None,
                special_modes: str = "refuse", outside_links: str = "refuse") -> tuple:
    """The source before anything is sent: it exists, and what the excludes leave of it is a venv
    (pyvenv.cfg and bin/python are sent) with files in it. A tree the excludes empty, or one
    that is not a venv, is refused here (SourceRefused): `replace` would otherwise swap a working
    install for it. Returns (detail, facts)."""
    out = hostfs.scan(root, excludes, names, special_modes=special_modes,
                      outside_links=outside_links)
    if not out["exists"]:
        raise SourceRefused("source %s does not exist" % root)
    if not out.get("is_dir"):
        raise SourceRefused("source %s is not a directory" % root)
    why = []
    for rel in ("pyvenv.cfg", "bin/python"):
        parts = rel.split("/")
        left_out = [p for p in ("/".join(parts[:i + 1]) for i in range(len(parts)))
                    if kitmanifest.excluded(p, excludes)]
        if left_out:
            why.append("transfer.exclude leaves out %s" % left_out[0])
        elif not os.path.exists(os.path.join(root, rel)):
            why.append("no %s" % rel)
    if not out.get("files"):
        why.append("no files to send after the excludes (%d entries)" % (
            out.get("files", 0) + out.get("dirs", 0) + out.get("links", 0)))
    if why:
        raise SourceRefused("source %s is not a venv after the excludes: %s; nothing was sent (an "
                        "install there would not run)" % (root, "; ".join(why)))
    if out.get("refusal"):
        raise SourceRefused("source %s: %s" % (root, out["refusal"]))
    facts = {k: out.get(k) for k in ("files", "dirs", "links", "bytes", "disk_bytes",
                                     "need_bytes", "stat_fingerprint")}
    # what the destination compares itself with (never the source, nor inside it)
    facts["identity"] = json.dumps(hostfs.identity(root), sort_keys=True, separators=(",", ":"))
    facts["compressors"] = ",".join(compressors(shutil.which))
    return "%d files, %s" % (out["files"], human(out["bytes"])), facts


def send_argvs(root: str, names: str, compression: str) -> List[List[str]]:
    """The sending end of the stream: tar of the listed names (NUL-separated), compressed."""
    argvs = [["tar", "-C", root, *TAR_RECORD, "--null", "--no-recursion", "-T", names, "-cf", "-"]]
    if COMPRESSION[compression]["pack"]:
        argvs.append(COMPRESSION[compression]["pack"])
    return argvs


def split_names(names: str, n: int, into: str, min_bytes: int = 0) -> Optional[List[str]]:
    """The list `names` (the scan's, NUL-separated, its stat lines at NAMES.stat and its files of
    more than one link at NAMES.links) split into `n` lists in directory `into`, one per stream:
    each list keeps the scan's order and holds every directory (each stream's tar makes the
    directories it writes into before it writes there: parents first, as the scan lists them;
    two tars may both make one, tar takes a directory that is there); every other entry is in
    one list, the biggest first into the list with the fewest bytes so far; the names of one
    inode in one list (tar sends the second as a link to the first). None when the scan's
    record is not there or not of this list (one stream then), when its files hold fewer than
    `min_bytes`, when the split would leave a list with nothing but directories, or when a
    directory forbids its owner to write (one tar's setting its mode would stop another's
    writing there, for an owner who is not root)."""
    try:
        with open(names, "rb") as f:
            listed = f.read().split(b"\0")
        with open(names + kitmanifest.SCAN_SUFFIX, "rb") as f:
            rows = f.read().split(b"\n")[1:]
        with open(names + kitmanifest.LINKS_SUFFIX, "rb") as f:
            multi = f.read().split(b"\n")
    except OSError:
        return None
    if listed and listed[-1] == b"":
        listed.pop()
    rows = [r for r in rows if r]
    multi = [r for r in multi if r]
    try:
        values = json.loads(b"[" + b",".join(rows) + b"]")
        inodes = json.loads(b"[" + b",".join(multi) + b"]")
    except ValueError:
        return None
    if len(values) != len(listed) or any(
            not isinstance(v, list) or len(v) != 6 or os.fsencode(v[0]) != name
            for v, name in zip(values[:1] + values[-1:], listed[:1] + listed[-1:])):
        return None
    group: Dict[int, tuple] = {}
    for item in inodes:
        if isinstance(item, list) and len(item) == 3 and 0 <= item[0] < len(listed):
            group[item[0]] = (item[1], item[2])
    # the entries that are not directories, by size, each inode's names as one item
    items: Dict[Any, List[int]] = {}
    sizes: Dict[Any, int] = {}
    for i, v in enumerate(values):
        if v[1] == "d":
            if not isinstance(v[2], int) or not v[2] & 0o200:
                return None
            continue
        key = group.get(i, i)
        items.setdefault(key, []).append(i)
        if key not in sizes:
            sizes[key] = (v[3] if v[1] == "f" and isinstance(v[3], int) else 0) + 512
    if len(items) < n or sum(sizes.values()) - 512 * len(sizes) < min_bytes:
        return None
    where = [-1] * len(listed)
    load = [0] * n
    for key in sorted(items, key=lambda k: -sizes[k]):
        j = load.index(min(load))
        load[j] += sizes[key]
        for i in items[key]:
            where[i] = j
    out: List[List[bytes]] = [[] for _ in range(n)]
    for i, name in enumerate(listed):
        if where[i] < 0:
            for part in out:
                part.append(name)
        else:
            out[where[i]].append(name)
    paths = []
    for j, part in enumerate(out):
        path = os.path.join(into, "names.%d" % j)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with open(fd, "wb") as f:
            f.write(b"\0".join(part) + b"\0")
        paths.append(path)
    return paths


def send(root: str, names: str, compression: str, remote: Optional[List[str]] = None,
         local: Optional[List[str]] = None, jobs: int = 1) -> int:
    """Stream the tree to stdout; or with `remote` (an ssh argv) to the far end of that ssh, or
    with `local` (the receiving end's argv) into that command started here. With either, the
    tree goes in several streams (stream_count: --part I/N added to each receiving end's
    command) when the scan's record allows, and the receiving ends' answers are one answer on
    stdout (Merged). Each stage's failure is named on stderr; returns the first non-zero
    exit code."""
    receiver = local or remote
    n = stream_count(jobs) if receiver else 1
    if n > 1:
        work = tempfile.mkdtemp(prefix="rbkit-send.")
        try:
            parts = split_names(names, n, work, STREAMS_MIN_BYTES)
            if parts:
                return _send_parts(root, parts, compression, remote, local)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    argvs = send_argvs(root, names, compression)
    labels = ["tar", compression][:len(argvs)]
    if receiver:
        argvs.append(receiver)
        labels.append("ssh" if remote else "receive")
    codes, _errs = pipeline(argvs, None, stdin=subprocess.DEVNULL)
    bad = [(label, c) for label, c in zip(labels, codes) if c != 0]
    if bad:
        sys.stderr.write("rbkit engine send: %s\n" % "; ".join("%s exited %s" % b for b in bad))
        return bad[0][1]
    return 0


def part_argv(receiver: List[str], remote: bool, part: int, n: int) -> List[str]:
    """The receiving end's command for stream `part` of `n`: --part I/N after its words (for
    ssh, the last word is the remote command line: the option is added to it)."""
    if remote:
        return receiver[:-1] + [receiver[-1] + " --part %d/%d" % (part, n)]
    return receiver + ["--part", "%d/%d" % (part, n)]


def _send_parts(root: str, parts: List[str], compression: str, remote: Optional[List[str]],
                local: Optional[List[str]]) -> int:
    n = len(parts)
    receiver = local or remote or []
    merged = Merged(n, sys.stdout, compression)
    procs: List[List[Any]] = [[] for _ in range(n)]
    codes: List[Optional[List[int]]] = [None] * n
    first: List[int] = []
    mutex = threading.Lock()

    def one(i: int) -> None:
        argvs: List[Any] = send_argvs(root, parts[i], compression)
        argvs.append(part_argv(receiver, bool(remote), i, n))
        rfd, wfd = os.pipe()
        reader = threading.Thread(target=merged.read, args=(i, rfd), daemon=True)
        reader.start()
        try:
            got, _ = pipeline(argvs, None, stdin=subprocess.DEVNULL, stdout=wfd,
                              started=procs[i].extend)
        finally:
            os.close(wfd)
            reader.join()
        codes[i] = got
        if not any(got):
            return
        with mutex:
            first.append(i)
            if len(first) > 1:
                return
            # one stream failed: the run fails; the others are stopped, not waited for
            for others in procs:
                for p in others:
                    if p.poll() is None:
                        p.kill()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    labels = ["tar", compression][:len(send_argvs(root, parts[0], compression))]
    labels.append("ssh" if remote else "receive")
    bad = []
    for i, got in enumerate(codes):
        for label, c in zip(labels, got or [1]):
            if c != 0:
                bad.append(("stream %d/%d: %s" % (i + 1, n, label), c))
    merged.answer(first[0] if first else None)
    if bad:
        sys.stderr.write("rbkit engine send: %s\n" % "; ".join("%s exited %s" % b for b in bad))
        return bad[0][1]
    return 0


class Merged:
    """The answers of the receiving ends of several streams as one (a runbook reads one): their
    progress lines summed as they come, and at the end one receive event: failed, naming the
    stream that failed first and in its own words, when one did; else of them all (its numbers
    summed, `streams` N)."""

    def __init__(self, n: int, out: Any, compression: str) -> None:
        self.n, self.out, self.compression = n, out, compression
        self.mutex = threading.Lock()
        self.progress = [0] * n
        self.events: List[List[dict]] = [[] for _ in range(n)]
        self.done: List[Optional[List[str]]] = [None] * n

    def _write(self, text: str) -> None:
        with self.mutex:
            self.out.write(text)
            self.out.flush()

    def read(self, i: int, fd: int) -> None:
        with open(fd, "rb", closefd=True) as f:
            self.read_file(i, f)

    def read_file(self, i: int, f: Any) -> None:
        """Stream i's answer, lines from the binary file f."""
        for raw in f:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            kind, _, rest = line.partition("\t")
            if kind == "progress":
                try:
                    value = int(rest)
                except ValueError:
                    continue
                with self.mutex:
                    self.progress[i] = value
                    total = sum(self.progress)
                self._write("progress\t%d\n" % total)
            elif kind == "event":
                try:
                    event = json.loads(rest)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    self.events[i].append(event)
            elif kind == "done":
                self.done[i] = rest.split("\t", 1)

    def answer(self, first: Optional[int] = None) -> None:
        """The one answer (after every stream ended); `first`: the stream that failed first
        (the others may have failed because they were stopped)."""
        failed = [i for i in range(self.n)
                  if not self.done[i] or self.done[i][0] != "ok"
                  or not any(e.get("step") == "receive" for e in self.events[i])]
        lines: List[str] = []
        if failed:
            i = first if first is not None and first in failed else failed[0]
            why = (self.done[i][1] if self.done[i] and len(self.done[i]) > 1
                   else "no answer from its receiving end")
            detail = "stream %d of %d: %s" % (i + 1, self.n, why)
            event = {"step": "receive", "status": "failed", "detail": detail,
                     "duration_s": max((e.get("duration_s", 0) for es in self.events
                                        for e in es), default=0),
                     "facts": {"streams": self.n, "failed_stream": i + 1}}
            lines.append("set\tstreams\t%d" % self.n)
            lines.append("event\t" + json.dumps(event, sort_keys=True, separators=(",", ":")))
            lines.append("done\tfailed\t" + detail.replace("\t", " ").replace("\n", " "))
        else:
            got = [next(e for e in es if e.get("step") == "receive") for es in self.events]
            # the numbers summed; the rest (the staging) as the first stream says it
            facts: Dict[str, Any] = dict(got[0].get("facts") or {})
            for k in facts:
                if isinstance(facts[k], int) and not isinstance(facts[k], bool):
                    facts[k] = sum((e.get("facts") or {}).get(k, 0) for e in got)
            facts["streams"] = self.n
            detail = "unpacked into %s in %d streams side by side (compression %s)" % (
                facts.get("staging", "the staging"), self.n, self.compression)
            if "streamed" in facts:
                detail += ", %d files hashed from the streams" % facts["streamed"]
            event = {"step": "receive", "status": "ok", "detail": detail,
                     "duration_s": max(e.get("duration_s", 0) for e in got), "facts": facts}
            for k, v in sorted(facts.items()):
                lines.append("set\t%s\t%s" % (k, v))
            lines.append("event\t" + json.dumps(event, sort_keys=True, separators=(",", ":")))
            lines.append("done\tok\t" + detail.replace("\t", " ").replace("\n", " "))
        self._write("".join(line + "\n" for line in lines))
RB_PY_5F5B99FE
  cat >"${dir}"/rbkit/swapfs.py <<'RB_PY_D6AAE1CF'
"""Putting a staging in place, and an earlier install back: swap, restore, pruning the backups,
the journal. What the installs beside a destination are (backups, the failed one, their records)
is rbkit.installs.

Public through rbkit.hostfs (hostfs.swap, hostfs.restore, ...). One rename where the file system
can exchange two names (renameat2 RENAME_EXCHANGE); elsewhere (NFS) two renames, journaled beside
the destination first, so an interruption between them is finished or undone by the next run
(`recover_swap`, which swap, restore and prune_backups call first) instead of leaving the previous
install where the next run deletes it. A destination or staging that is a symlink is refused.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import stat
from typing import List, Optional

from rbrules.common import SWAP_ATOMIC

from . import exports, safefs
from .installs import (FAILED_MARK, backup_dirs, describe_install, failed_mark, failed_path,
                       foreign_backups, is_real_dir, next_backup, not_ours, read_info, remove,
                       unshare_backup)

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


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


def _refuse_link(path: str, what: str) -> None:
    if os.path.islink(path):
        raise OSError(errno.ELOOP, f"the {what} {path} is a symlink to {os.readlink(path)}: refusing "
                      "to replace a link with a directory (its target would be left behind, and the "
                      f"next steps would act on the link); name {os.path.realpath(path)} itself")


def _keep_failed(path: str, dest: str) -> str:
    """Move the install at `path` (its checks failed) to `failed_path(dest)`, replacing the one
    kept there before. Returns where it is."""
    target = failed_path(dest)
    if os.path.abspath(path) == target:
        return target                    # exchanged with the failed one: already there
    if os.path.lexists(target):
        remove(target)
    os.rename(path, target)
    _sync_parent(os.path.dirname(target))
    return target


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
    names = re.compile(rf"^(?:{base}\.rb-backup\.[0-9]+|{base}\.rb-failed|\.{base}\.rb-(?:old|restore))$")
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
            target = old_at if not os.path.lexists(old_at) else next_backup(dest)
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
        os.rename(old_at, backup if not os.path.lexists(backup) else next_backup(dest))
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
    if os.path.lexists(dest) and not is_real_dir(dest):
        raise FileExistsError(f"the destination {dest} exists and is not a directory")
    if not is_real_dir(staging):
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
    # an install whose checks failed (on_failed_checks: keep) is kept apart, never as a backup
    was_failed = policy == "backup" and failed_mark(dest) is not None
    old_at = (failed_path(dest) if was_failed else next_backup(dest)) if policy == "backup" \
        else os.path.join(parent, "." + os.path.basename(os.path.abspath(dest)) + ".rb-old")
    if (policy != "backup" or was_failed) and os.path.lexists(old_at):
        remove(old_at)       # debris of an earlier replace (its journal is gone), an older failure
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
        result["previous_failed"] = was_failed
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


def prune_backups(dest: str, keep: int) -> List[str]:
    """Remove all but the `keep` newest good backups of `dest` (transfer.keep_backups, at least 1:
    the newest is what a rollback puts back). A backup marked as failed its checks (left by an
    interrupted rollback, or an older kit) is neither counted nor removed, so it never evicts a
    good one; nor is a link named like a backup. Returns the paths removed. The engine calls it
    only once the new install passed its checks."""
    if keep < 1:
        raise ValueError("keep_backups must be at least 1: the newest backup is what a rollback "
                         "puts back")
    recover_swap(dest)
    good = [(n, p) for n, p in backup_dirs(dest) if failed_mark(p) is None]
    removed = []
    for _n, path in good[:-keep]:
        shutil.rmtree(path)
        removed.append(path)
    return removed


def restore(dest: str, number: Optional[int] = None, *, env_file: Optional[str] = None,
            failed: Optional[str] = None, swap_atomic: str = "allow",
            from_failed: bool = False) -> dict:
    """Put backup N (default: the newest whose checks did not fail) back at `dest`.

    What was in place goes apart as `DEST.rb-failed` when its checks failed (`failed` given: a
    rollback, which marks it; or marked by an earlier probe), else it becomes the newest backup
    (a new number, never the name of the one restored). An interrupted swap is finished or undone
    first; when that already put the previous install back, nothing more moves. With `env_file`,
    the restored install's own env file (`DEST/.rb-env.sh`, see exports.write) is put back there.
    The result says which backup was chosen and why (`why`, `skipped`), where the replaced install
    is (`kept_current_as`), and what is at `dest` now (`installed`: its record, a stat check).
    `from_failed` (a rollback whose swap moved an install that had failed its checks apart): that
    install, at `DEST.rb-failed`, is what goes back; the one replacing it there is `failed`."""
    if swap_atomic not in SWAP_ATOMIC:
        raise ValueError(f"swap_atomic must be one of {SWAP_ATOMIC}, not {swap_atomic!r}")
    recovered = recover_swap(dest)
    _refuse_link(dest, "destination")
    result: dict = {"recovered": recovered, "atomic": True}
    if recovered and recovered["action"] == "undone":
        result.update(restored=None, kept_current_as=None, why=recovered["detail"], skipped=[])
    else:
        result.update(_restore_backup(dest, number, failed, swap_atomic, from_failed))
    result["env_file"] = exports.restore_env(dest, env_file) if env_file else None
    result["installed"] = describe_install(dest)
    return result


def _restore_backup(dest: str, number: Optional[int], failed: Optional[str],
                    swap_atomic: str, from_failed: bool = False) -> dict:
    found = dict(backup_dirs(dest))
    foreign = foreign_backups(dest)
    if from_failed:
        if not is_real_dir(failed_path(dest)):
            raise FileNotFoundError(f"{failed_path(dest)} is not there to put back")
        return _exchange(dest, failed_path(dest), failed, swap_atomic, {
            "restored": failed_path(dest), "skipped": [], "ignored": foreign,
            "why": "the install this run replaced (its checks had failed before)"})
    if number is not None and number not in found:
        why = not_ours(f"{dest}.rb-backup.{number}")
        if why:
            raise PermissionError(f"refusing to restore backup {number}: {why}")
    apart = failed_path(dest)
    apart_note = (f"; the install whose checks failed is kept apart at {apart} and is never "
                  "restored by --restore: move it back by hand if you mean to"
                  if is_real_dir(apart) else "")
    if not found:
        raise FileNotFoundError(f"no backup of {dest} to restore (no {dest}.rb-backup.N)"
                                + apart_note
                                + (f" ({'; '.join(foreign)})" if foreign else ""))
    skipped = [f"{found[n]} ({failed_mark(found[n])})" for n in sorted(found)
               if failed_mark(found[n]) is not None and n != number]
    if number is None:
        usable = [n for n in sorted(found) if failed_mark(found[n]) is None]
        if not usable:
            raise FileNotFoundError(
                f"every backup of {dest} failed its checks ({', '.join(found[n] for n in sorted(found))});"
                " name one to put it back anyway: --restore N")
        number = usable[-1]
        checks = read_info(found[number]).get("checks")
        why = ("the newest backup whose checks passed" if checks == "passed" else
               "the newest backup not marked as failed its checks (its checks: %s)"
               % (checks or "not recorded"))
    elif number in found:
        why = "named on the command line (--restore %d)" % number
        if failed_mark(found[number]) is not None:
            why += "; its checks had failed: %s" % failed_mark(found[number])
    if number not in found:
        raise FileNotFoundError(f"{dest}.rb-backup.{number} does not exist (backups: "
                                f"{', '.join(str(n) for n in sorted(found))})")
    return _exchange(dest, found[number], failed, swap_atomic,
                     {"restored": found[number], "why": why, "skipped": skipped,
                      "ignored": foreign})


def _exchange(dest: str, source: str, failed: Optional[str], swap_atomic: str,
              done: dict) -> dict:
    """The install at `source` (a backup, or the failed one) to `dest`; what was there to a new
    backup number, or apart as DEST.rb-failed when its checks failed."""
    if not os.path.lexists(dest):
        os.rename(source, dest)
        return dict(done, kept_current_as=None)
    current_failed = failed or failed_mark(dest)
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
    else:
        _sync_parent(os.path.dirname(os.path.abspath(dest)))
    # what was in place: apart when its checks failed, else the newest backup (a new number)
    if current_failed:
        if failed:
            safefs.write_in(source, FAILED_MARK, failed.encode("utf-8") + b"\n", 0o644)
        kept = _keep_failed(source, dest)
    else:
        kept = next_backup(dest)
        os.rename(source, kept)
        _sync_parent(os.path.dirname(kept))
    return dict(done, kept_current_as=kept, kept_failed=bool(current_failed), atomic=atomic)
RB_PY_D6AAE1CF
  cat >"${dir}"/rbkit/tarstream.py <<'RB_PY_825E258E'
"""Digests from a tar stream as it passes: a reader between the decompressor and `tar -x` (the
receiving end, engine.receive) that hands every byte on to tar unchanged and hashes each regular
file's data as it goes by, so that verify compares the source's manifest with what tar was given
instead of reading every file tar wrote.

The parser knows what GNU tar writes (`rbkit engine send`: `tar -cf - --null --no-recursion -T
NAMES`, GNU format) and what a POSIX one may: ustar names with their prefix, GNU long names and
long link targets (`L`, `K` members before the entry they name), pax extended headers (`x`, and
`g` for every entry after it: path, linkpath, size), numbers in octal or GNU base-256, hard links
(`1`: no data; the content of the member it names, earlier in the same stream). Each header's
checksum is checked. What it does not follow (a GNU sparse member, pax sparse keys) stops the
digests, never the stream: the files from there on get no digest and verify reads them.

The stream must end as a tar archive ends (a zero block); one that stops before it, or in the
middle of a member, is truncated (`Digester.truncated`), whatever tar says about it.

One thread copies and parses: it reads a piece, writes it to tar, then parses it (a file's data is
a slice of the piece, no copy). Small files are hashed there. Big ones, with `workers`, by
hashing threads (hashlib releases the GIL on buffers of 2 KiB and more; every piece of one file
goes to the same thread, in order): one file's digest is sequential work (sha256 runs at about
1 GB/s a core), so on a host with cores to spare big files are hashed side by side. The parser
hands a big file's pieces to its thread and goes on to the next member without waiting for them
to be hashed, up to a byte budget for all threads together (`budget`: bounded memory; an eighth
of the memory available, 64 MiB to 1 GiB): with a small per-thread limit the parser would wait on
each big file in turn and the stream run at one core's hashing rate. Each hand-over costs
wake-ups and GIL switches, so a host of two cores (tar, ssh and this share them) hashes
everything in the one thread (engine.receive: no workers), which costs less CPU there than a
parser thread and one hasher (docs/benchmarks.md, "Figures behind choices in the code").

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any, Callable, Dict, List, Optional

from . import manifest

BLOCK = 512
CHUNK = 1 << 20            # what one read asks for (a pipe gives at most its size)
PIPE_SIZE = 1 << 20        # asked for both pipes (F_SETPIPE_SZ; a refusal is ignored)
INLINE = 64 << 10          # files up to this size are hashed by the parser's thread, bigger ones
                           # by the hashing threads (docs/benchmarks.md: what it takes off it)
BUDGET_MIN, BUDGET_MAX = 64 << 20, 1 << 30   # bytes handed to hashing threads, not yet hashed
F_SETPIPE_SZ = 1031        # fcntl.F_SETPIPE_SZ (named there from Python 3.10 only)
REGULAR = (b"0", b"\0", b"7")
NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")     # tarfile's rule: these never carry data
ZERO = bytes(BLOCK)


def hash_budget() -> int:
    """How many bytes of big files' data may wait for the hashing threads: an eighth of the
    memory available now, between BUDGET_MIN and BUDGET_MAX (256 MiB where /proc/meminfo does
    not say)."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return max(BUDGET_MIN, min(BUDGET_MAX, int(line.split()[1]) * 1024 // 8))
    except (OSError, ValueError, IndexError):
        pass
    return 256 << 20


class _Hasher:
    """One hashing thread: its queue of (hasher, piece, slot) items, and the bytes handed to it
    and not hashed yet (kept by _Budget, under its lock)."""

    __slots__ = ("queue", "thread", "pending")

    def __init__(self, target: Callable[["_Hasher"], None]) -> None:
        self.queue: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self.pending = 0
        self.thread = threading.Thread(target=target, args=(self,), daemon=True)


class _Budget:
    """Bytes handed to the hashing threads and not hashed yet, in all and per thread
    (_Hasher.pending). `take` waits while they would pass `limit` (a piece always goes when
    nothing is held: one bigger than the limit cannot wait for room)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.cv = threading.Condition()

    def take(self, n: int, worker: _Hasher) -> None:
        with self.cv:
            while self.held and self.held + n > self.limit:
                self.cv.wait()
            self.held += n
            worker.pending += n

    def give(self, n: int, worker: _Hasher) -> None:
        with self.cv:
            self.held -= n
            worker.pending -= n
            self.cv.notify_all()


def _number(field: bytes) -> int:
    """A header number: octal text, or GNU base-256 (first byte 0x80, or 0xff: negative)."""
    if field[:1] and field[0] & 0x80:
        n = int.from_bytes(field[1:], "big")
        if field[0] == 0xFF:
            raise ValueError("a negative number in a tar header")
        return n
    text = field.split(b"\0", 1)[0].strip(b" \0")
    return int(text, 8) if text else 0


def _text(field: bytes) -> bytes:
    return field.split(b"\0", 1)[0]


def norm(name: bytes) -> Optional[str]:
    """A member's name as the manifest writes the path: no leading `./`, no trailing `/`; None
    for a name tar would rewrite before extracting (absolute, `..`), which gets no digest."""
    text = name.decode("utf-8", "surrogateescape")
    while text.startswith("./"):
        text = text[2:]
    text = text.rstrip("/")
    if not text or text[0] == "/" or (".." in text and ".." in text.split("/")):
        return None
    return text


def _pax(data: bytes) -> Dict[str, bytes]:
    """The records of a pax extended header: `LEN KEY=VALUE\\n`, each."""
    out: Dict[str, bytes] = {}
    at = 0
    while at < len(data) and data[at:at + 1] not in (b"\0", b""):
        space = data.index(b" ", at)
        length = int(data[at:space])
        if length <= 0:
            raise ValueError("a pax record of length %d" % length)
        record = data[space + 1:at + length - 1]          # without the newline
        key, _, value = record.partition(b"=")
        out[key.decode("utf-8", "replace")] = value
        at += length
    return out


class Digester:
    """Parses a tar stream fed to it in pieces (`feed`), in order, and keeps each regular file's
    digest by its path (`result`). `stage(in_fd, out_fd)` is the reader itself: a pipeline stage
    (stream.pipeline) that copies in_fd to out_fd and feeds a copy to the parser."""

    def __init__(self, algo: str = "sha256", workers: int = 2,
                 budget: Optional[int] = None) -> None:
        self.algo = algo
        self._new = manifest.hasher(algo)
        self.off = 0                    # stream offset of what feed sees next
        self.ended = False              # saw the end of the archive (a zero block)
        self.corrupt: Optional[str] = None   # the stream is not a good tar archive: why
        self.lost: Optional[str] = None      # the parser stopped following the stream: why
        self._hdr = bytearray()
        self._left = 0                  # data bytes of the current member still to come
        self._pad = 0                   # padding after them
        self._sink: Any = None          # where the data goes: a hash's update, or a bytearray
        self._meta: Optional[tuple] = None   # (type, bytearray) of an L/K/x/g member
        self._file: Optional[tuple] = None   # (slot, hash, worker or None) of a file
        self._pending: Dict[str, bytes] = {}
        self._global: Dict[str, bytes] = {}
        # what each member left: (path, slot) in stream order; slots hold digests, or
        # ("link", target path) for a hard link, resolved in order by `result`
        self._order: List[tuple] = []
        self._slots: List[Any] = []
        self._workers: List[_Hasher] = []
        self._nworkers = max(0, workers)
        self._budget = _Budget(hash_budget() if budget is None else budget)
        self._closed = False

    # -- the parser --------------------------------------------------------------------------

    def feed(self, data: Any) -> None:
        mv = memoryview(data)
        while mv.nbytes:
            if self.corrupt or self.lost or (self.ended and not self._hdr):
                self.off += mv.nbytes
                return
            if self._left:
                n = min(self._left, mv.nbytes)
                if self._sink is not None:
                    self._sink(mv[:n])
                self._left -= n
                self.off += n
                mv = mv[n:]
                if not self._left:
                    self._member_done()
                continue
            if self._pad:
                n = min(self._pad, mv.nbytes)
                self._pad -= n
                self.off += n
                mv = mv[n:]
                continue
            if not self._hdr and mv.nbytes >= BLOCK:
                block = mv[:BLOCK].tobytes()
                mv = mv[BLOCK:]
            else:
                n = min(BLOCK - len(self._hdr), mv.nbytes)
                self._hdr += mv[:n]
                self.off += n - BLOCK          # the whole block is counted below
                mv = mv[n:]
                if len(self._hdr) < BLOCK:
                    self.off += BLOCK
                    return
                block, self._hdr = bytes(self._hdr), bytearray()
            self.off += BLOCK
            self._header(block, self.off - BLOCK)

    def _header(self, h: bytes, at: int) -> None:
        if h == ZERO:
            self.ended = True
            return
        try:
            want = _number(h[148:156])
            size = _number(h[124:136])
        except ValueError as exc:
            self.corrupt = "the tar header at byte %d of the stream: %s" % (at, exc)
            return
        unsigned = sum(h) - sum(h[148:156]) + 256      # the checksum field counts as spaces
        if want != unsigned and want != unsigned - 256 * sum(1 for b in h if b > 127):
            self.corrupt = "the tar header at byte %d of the stream fails its checksum" % at
            return
        kind = h[156:157]
        if kind in (b"L", b"K", b"x", b"g"):
            self._meta = (kind, bytearray())
            self._sink = self._meta[1].extend
            self._expect(size)
            return
        name = _text(h[0:100])
        if h[257:263] == b"ustar\0":              # POSIX ustar: a prefix before the name
            prefix = _text(h[345:500])
            if prefix:
                name = prefix + b"/" + name
        link = _text(h[157:257])
        meta = dict(self._global, **self._pending) if self._pending or self._global else {}
        self._pending = {}
        if meta:
            name = meta.get("path", name)
            link = meta.get("linkpath", link)
            size = int(meta["size"]) if "size" in meta else size
        if kind in (b"S", b"M") or (meta and any(k.startswith("GNU.sparse") for k in meta)):
            self.lost = ("member %s of type %s (sparse or multi-volume) is not followed"
                         % (name.decode("utf-8", "replace"), kind.decode("ascii", "replace")))
            return
        path = norm(name)
        if kind in REGULAR and not (kind == b"\0" and name.endswith(b"/")):
            slot = len(self._slots)
            self._slots.append(None)
            self._order.append((path, slot))
            hasher = self._new()
            worker = self._worker() if size > INLINE else None
            self._file = (slot, hasher, worker)
            self._sink = hasher.update if worker is None else \
                (lambda piece, w=worker, hs=hasher: self._hand(w, hs, piece))
            self._expect(size)
            return
        if kind == b"1":
            slot = len(self._slots)
            self._slots.append(("link", norm(link)))
            self._order.append((path, slot))
        else:
            self._order.append((path, None))    # a directory, a symlink, a device: no digest
        if kind not in NO_DATA:
            self._sink = None                   # an unknown member: its data is skipped
            self._expect(size)

    def _expect(self, size: int) -> None:
        self._left, self._pad = size, (-size) % BLOCK
        if not size:
            self._member_done()

    def _member_done(self) -> None:
        if self._meta is not None:
            kind, data = self._meta
            self._meta = None
            if kind == b"L":
                self._pending["path"] = _text(bytes(data))
            elif kind == b"K":
                self._pending["linkpath"] = _text(bytes(data))
            else:
                try:
                    records = _pax(bytes(data))
                except ValueError as exc:
                    self.corrupt = "a pax header before byte %d: %s" % (self.off, exc)
                    return
                (self._pending if kind == b"x" else self._global).update(records)
        elif self._file is not None:
            slot, hasher, worker = self._file
            if worker is None:
                self._slots[slot] = hasher.hexdigest()
            else:
                worker.queue.put((hasher, None, slot))
        self._file = None
        self._sink = None

    # -- big files' hashing threads ------------------------------------------------------------

    def _worker(self) -> Optional[_Hasher]:
        """The thread for the next big file: a new one while there are fewer than `workers`,
        else the one with the fewest bytes still to hash."""
        if not self._nworkers:
            return None
        if len(self._workers) < self._nworkers:
            w = _Hasher(self._hash_loop)
            self._workers.append(w)
            w.thread.start()
            return w
        with self._budget.cv:
            return min(self._workers, key=lambda w: w.pending)

    def _hand(self, worker: _Hasher, hasher: Any, piece: memoryview) -> None:
        """A piece of a big file to its thread, once the budget has room for it."""
        self._budget.take(piece.nbytes, worker)
        worker.queue.put((hasher, piece, None))

    def _hash_loop(self, w: _Hasher) -> None:
        while True:
            item = w.queue.get()
            if item is None:
                return
            hasher, piece, slot = item
            try:
                if piece is None:
                    self._slots[slot] = hasher.hexdigest()
                else:
                    hasher.update(piece)
            except Exception as exc:
                # a bug: no digests at all; the thread goes on, or the parser would wait for
                # budget this thread never gives back
                self.lost = "a hashing thread failed: %s: %s" % (type(exc).__name__, exc)
            if piece is not None:
                self._budget.give(piece.nbytes, w)

    def close(self) -> None:
        """Wait for the hashing threads (every digest is in its slot after this)."""
        if self._closed:
            return
        self._closed = True
        for w in self._workers:
            w.queue.put(None)
        for w in self._workers:
            w.thread.join()

    @property
    def truncated(self) -> bool:
        """The stream stopped before the archive's end: in a member, or before its zero block."""
        return not (self.corrupt or self.lost) and (
            not self.ended or bool(self._left) or bool(self._hdr))

    def result(self) -> Dict[str, Optional[str]]:
        """path -> digest of its content as the stream carried it (the last member of that path
        wins, as it does on disk); none at all when the parser lost the stream (verify then reads
        every file)."""
        self.close()
        if self.corrupt or self.lost:
            return {}
        out: Dict[str, Optional[str]] = {}
        for path, slot in self._order:
            if path is None:
                continue
            value = None if slot is None else self._slots[slot]
            if isinstance(value, tuple):           # a hard link: the content of its target
                value = out.get(value[1]) if value[1] else None
            if value is None:
                out.pop(path, None)
            else:
                out[path] = value
        return out

    # -- the pipeline stage ------------------------------------------------------------------

    def stage(self, in_fd: int, out_fd: int) -> int:
        """Copy in_fd to out_fd unchanged and parse each piece right after tar was given it, in
        this one thread (small files are hashed here, big files' pieces go to the hashing
        threads). Ends at the end of in_fd, or when out_fd's reader is gone (tar stopped: its
        own exit code says why); returns 0."""
        for fd in (in_fd, out_fd):
            try:
                import fcntl
                fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_SIZE)
            except (OSError, ImportError):
                pass                               # not a pipe, or over the host's limit
        writing = True
        try:
            while True:
                data = os.read(in_fd, CHUNK)
                if not data:
                    break
                if not writing:
                    continue                       # past the archive's end, tar gone: read only
                view = memoryview(data)
                try:
                    while view.nbytes:
                        view = view[os.write(out_fd, view):]
                except BrokenPipeError:
                    # tar is gone. Whether it had the whole archive is the parser's to say, on
                    # every byte written before the pipe broke: past the end, the rest of in_fd
                    # is read unparsed (the sender's writes must not fail); inside it, the
                    # stage stops
                    writing = False
                    self._parse(data[:len(data) - view.nbytes])
                    if not self.ended:
                        break
                    continue
                self._parse(data)
        finally:
            self.close()
        return 0

    def _parse(self, data: bytes) -> None:
        try:
            self.feed(data)
        except Exception as exc:                # a parser bug: no digests, the copy goes on
            self.lost = "the tar parser failed at byte %d: %s: %s" % (
                self.off, type(exc).__name__, exc)
RB_PY_825E258E
  cat >"${dir}"/rbprobes/__init__.py <<'RB_PY_54A17906'
"""rbprobes: prove that a moved Python/CUDA environment works on its GPU host.

Shipped to hosts as the package `rbprobes` (stdlib only; torch imported inside the checks that
need it); in the repo it is `hostkit/rbprobes`, installed with the compiler as the package `rbprobes`. Public API:

- run_config(config) -> (report, stopped_early): run a config document's checks (docs/design.md)
- run_check(check, context) -> one report entry
- audit(root, target, paths=None, driver_ptx_max=None, partial_ok=None, strict=False) -> kernel
  audit values (every unit of GPU code judged for the target)
- scan_file(path) -> the fatbin containers and entries of one file
"""

import importlib

__all__ = ["Context", "audit", "run_check", "run_config", "scan_file"]

# imported when first asked for: `python -m rbprobes outside` needs none of the GPU code's modules
_WHERE = {"Context": "result", "audit": "checks_static", "run_check": "runner",
          "run_config": "runner", "scan_file": "fatbin"}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    value = getattr(importlib.import_module("." + _WHERE[name], __name__), name)
    globals()[name] = value
    return value
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
"""The check types: function, level, accepted params, default deadline and lane of each.

The params are those of compiler/spec.py's check models (the config's `params`), plus a few
optional ones only the probes read (marked "probes-only" in docs/probes.md).

Lanes (runner.run_config): SERIAL checks use torch and CUDA in the probe's own process (torch is
imported once, by the first of them); they run there one after another, in the config's order,
because they share that process's state (what it has loaded, TF32 switches, the CUDA context).
PARALLEL checks touch nothing of the process that another check reads: they read files or run
their own child processes, and they start at once and overlap the serial ones.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, NamedTuple, Union


SERIAL = "serial"
PARALLEL = "parallel"


class CheckType(NamedTuple):
    run: Union[str, Callable[..., Any]]  # "module.function" in this package, imported when the
    #     check runs (a process that runs one check imports its module only: the source's
    #     `outside` does), or the function itself
    level: str
    params: Dict[str, str]  # name -> "str" | "int" | "bool" | "strs"
    deadline_s: int  # the runner stops waiting after this (params.timeout_s extends it)
    lane: str = PARALLEL  # SERIAL: uses torch/CUDA in the probe's process; see above

    def function(self) -> Callable[..., Any]:
        if callable(self.run):
            return self.run
        module, _, name = self.run.rpartition(".")
        return getattr(importlib.import_module("." + module, __package__), name)


CHECKS: Dict[str, CheckType] = {
    "kernel_audit": CheckType(
        "checks_static.kernel_audit", "L0",
        {"arch": "str", "paths": "strs", "driver_ptx_max": "str", "strict": "bool",
         "partial_ok": "strs"}, 1800),
    "relocation": CheckType(
        "checks_venv.relocation_check", "L0", {"old": "str", "timeout_s": "int"}, 300),
    "outside": CheckType("checks_venv.outside_check", "L0", {}, 600),
    "libraries": CheckType(
        "checks_runtime.libraries_check", "L1",
        {"expect_dirs": "strs", "modules": "strs", "runtime": "bool"}, 600, SERIAL),
    "torch": CheckType("checks_runtime.torch_check", "L1", {"version": "str", "cuda": "str"}, 300,
                       SERIAL),
    "devices": CheckType(
        "checks_runtime.devices_check", "L1",
        {"count": "int", "capability": "str", "names": "strs"}, 300, SERIAL),
    "imports": CheckType("checks_runtime.imports_check", "L1", {"modules": "strs"}, 600, SERIAL),
    "matmul": CheckType(
        "checks_numeric.matmul_check", "L2",
        {"dtype": "str", "size": "int", "every_device": "bool"}, 900, SERIAL),
    "nccl": CheckType(
        "checks_numeric.nccl_check", "L2", {"timeout_s": "int", "elements": "int"}, 240),
    "python": CheckType(
        "checks_hatch.python_check", "L1", {"code": "str", "name": "str", "timeout_s": "int"}, 300),
    "command": CheckType(
        "checks_hatch.command_check", "L1",
        {"run": "str", "name": "str", "expect_exit": "int", "timeout_s": "int"}, 300),
}


def deadline_for(check_type: str, params: Dict[str, Any]) -> float:
    """How long the runner waits for a check: its default, or params.timeout_s plus a margin."""
    spec = CHECKS[check_type]
    own = params.get("timeout_s")
    if isinstance(own, int) and not isinstance(own, bool):
        return max(spec.deadline_s, own + 90)
    return spec.deadline_s


def lane_for(check_type: str, params: Any) -> str:
    """SERIAL or PARALLEL (see above). A `libraries` check with runtime: false only reads files;
    an unknown type fails at once and runs nothing."""
    spec = CHECKS.get(check_type) if isinstance(check_type, str) else None
    if spec is None:
        return PARALLEL
    if check_type == "libraries" and isinstance(params, dict) and params.get("runtime") is False:
        return PARALLEL
    return spec.lane
RB_PY_EE87DE44
  cat >"${dir}"/rbprobes/checks_hatch.py <<'RB_PY_74DEDE3E'
"""Escape hatches: the spec author's own Python snippet or shell command, judged by exit status."""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any, Dict, List

from . import proc, venvfs
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
    # isolated, from / (proc.run_bounded): the snippet sees the venv, not where the run started
    finished = proc.run_bounded([sys.executable, "-I", "-c", code], timeout_s,
                                env=proc.child_env())
    return _judge(label.strip(), finished, 0, timeout_s,
                  {"name": params.get("name"), "python": sys.executable})


# Words after which the next word is run as a command too (`env FOO=1 torchrun ...`).
_PREFIX_COMMANDS = {"exec", "command", "env", "nohup", "time", "builtin"}
_OPERATORS = {";", "&&", "||", "|", "&", "(", ")", "{", "}", "!", ";;", "|&"}


def command_names(run: str) -> List[str]:
    """The programs a shell command line starts: the first word of each simple command
    (after VAR=value assignments, and after env/exec/command/nohup/time), in order, once."""
    lex = shlex.shlex(run, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    names: List[str] = []
    expect = True
    for word in lex:
        if word in _OPERATORS or (word and set(word) <= set(";&|()")):
            expect = True
            continue
        if not expect:
            continue
        if "=" in word and not word.startswith("=") and "/" not in word.split("=", 1)[0]:
            continue  # an assignment before the command
        if word.startswith("-"):
            continue  # an option of env/time/command
        if word not in names:
            names.append(word)
        expect = word in _PREFIX_COMMANDS
    return names


def resolve_names(names: List[str], env: Dict[str, str], venv_bin: str
                  ) -> List[Dict[str, Any]]:
    """How /bin/sh, with `env` (its PATH), resolves each name: `command -v` in the same
    shell the command runs in (a builtin resolves to its own name)."""
    bare = [n for n in names if "/" not in n]
    found: Dict[str, str] = {}
    if bare:
        script = 'for n in "$@"; do p=$(command -v -- "$n") || p=; printf "%s\\n" "$p"; done'
        done = proc.run_bounded(["/bin/sh", "-c", script, "sh"] + bare, 30, env=env)
        if done.timed_out or done.returncode != 0:
            raise ValueError("resolving %s with /bin/sh failed: %s" % (
                " ".join(bare), done.output.strip()[-200:] or "timed out"))
        lines = done.stdout.split("\n")
        found = {n: (lines[i] if i < len(lines) else "") for i, n in enumerate(bare)}
    out = []
    for n in names:
        item: Dict[str, Any] = {"name": n}
        if "/" in n:
            item["path"] = n
        else:
            item["path"] = found.get(n) or None
            if item["path"] and "/" not in item["path"]:
                item["builtin"] = True
            own = os.path.join(venv_bin, n)
            item["in_venv_bin"] = os.path.lexists(own)
        if item.get("path") and "/" in item["path"]:
            item["realpath"] = os.path.realpath(item["path"])
            item["from_venv"] = venvfs.inside(os.path.normpath(os.path.abspath(item["path"])),
                                              [os.path.normpath(venv_bin)])
        out.append(item)
    return out


def _cannot_exec(item: Dict[str, Any]) -> str:
    """Why the venv's file `item` (resolve_names) cannot be executed: the interpreter its #!
    line names is missing or not executable here; "" when it can (or is not a script)."""
    path = item.get("realpath") or item.get("path") or ""
    try:
        with open(path, "rb") as f:
            first = f.readline(512)
    except OSError:
        return ""
    if not first.startswith(b"#!"):
        return ""
    words = first[2:].decode("utf-8", "replace").split()
    if not words:
        return "%s cannot be executed: its #! line names no interpreter" % item["path"]
    interp = words[0]
    if os.path.isfile(interp) and os.access(interp, os.X_OK):
        return ""
    return ("the venv's %s cannot be executed: its #! line names the interpreter %s, which %s "
            "here (re-run the relocate step, or reinstall the package that made it)" % (
                item["path"], interp, "is not executable" if os.path.exists(interp)
                else "does not exist"))


def command_check(params: Dict[str, Any], ctx: Context):
    """Run params.run with /bin/sh -c, the venv's bin/ first in PATH; pass when it exits with
    params.expect_exit (0). Reports the file each command name resolved to, and fails when a
    name the venv's bin/ has resolved to something else."""
    command = params.get("run")
    if not command:
        return failed("no command to run: give params.run")
    timeout_s = params.get("timeout_s", DEFAULT_TIMEOUT_S)
    expect = params.get("expect_exit", 0)
    label = ("command %s" % (params.get("name") or "")).strip()
    venv = ctx.venv_or_prefix()
    venv_bin = os.path.join(venv, "bin")
    env = proc.child_env()
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", os.defpath)
    values: Dict[str, Any] = {"name": params.get("name"), "expect_exit": expect,
                              "path": env["PATH"], "venv_bin": venv_bin}
    try:
        resolved = resolve_names(command_names(command), env, venv_bin)
    except ValueError as exc:  # unbalanced quotes (the shell will say so when it runs)
        resolved = []
        values["resolve_error"] = str(exc)
    values["resolved"] = resolved
    if resolved and resolved[0].get("path"):
        values["executed"] = resolved[0].get("realpath") or resolved[0]["path"]
    finished = proc.run_bounded(["/bin/sh", "-c", command], timeout_s, env=env)
    outcome = _judge(label, finished, expect, timeout_s, values)
    elsewhere = ["%s -> %s (the venv has %s)" % (r["name"], r.get("path") or "not found",
                                                  os.path.join(venv_bin, r["name"]))
                 for r in resolved if r.get("in_venv_bin") and not r.get("from_venv")]
    if elsewhere:
        return failed("%s: %s resolved outside the venv's bin/; %s" % (
            label, "; ".join(elsewhere), outcome.reason), outcome.values)
    # a venv script whose interpreter is missing: /bin/sh (dash) goes on down PATH when the exec
    # fails, and runs a program of the same name elsewhere, which the outcome would be taken for
    broken = [why for why in (_cannot_exec(r) for r in resolved if r.get("from_venv")) if why]
    if broken:
        return failed("%s: %s; the shell ran what it found further down PATH, or nothing (%s)" % (
            label, "; ".join(broken), outcome.reason), outcome.values)
    if outcome.status == "pass" and values.get("executed"):
        return passed("%s (ran %s)" % (outcome.reason, values["executed"]), outcome.values)
    return outcome
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

from rbrules import launch

from . import driver, proc
from .checks_runtime import need_cuda
from .result import Context, Unavailable, failed, passed, short_list

# Per element, |C - ref| <= atol + rtol * |ref|, the reference being the same (rounded) inputs
# multiplied in float64 on the CPU:
#   rtol = EPS[dtype]: the output's rounding is at most half of that (2^-9 of an element in
#          bfloat16, 2^-12 in float16, 2^-25 in float32);
#   atol = s * (ATOL_DTYPE * sqrt(K) * EPS[dtype] + ATOL_ACC * K * EPS_ACC), s = rms(A) * rms(B)
#          (the size of one product term, so sqrt(K) * s is the size of an element of C): the
#          first term for partial sums kept in the dtype (split-K reductions in reduced
#          precision), the second for float32 accumulation over K terms (its rounding errors
#          grow with K, not sqrt(K); docs/probes.md has what a float32 8192^3 product on the
#          H200 was off by, as that predicts).
# float32 runs with TF32 off (restored afterwards), so its tolerance is float32's own.
EPS = {"float32": 2.0 ** -23, "bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}
EPS_ACC = 2.0 ** -23
ATOL_DTYPE = 2.0
ATOL_ACC = 8.0
WORST_LISTED = 5
FULL_ROWS = 1024  # the device's float64 reference is compared with the CPU's on this many
FULL_COLS = 8192  # sampled rows (and every column up to FULL_COLS, else FULL_ROWS of them)
REF_AGREE = 1e-9  # largest relative difference between the two float64 references


def _sample(torch, n: int, limit: int, seed: int):
    if n <= limit:
        return None
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=g)[:limit].sort().values


class _Tf32Off:
    """TF32 off for float32 products (torch.backends.cuda.matmul and cudnn, old and new
    switches, and the float32 matmul precision), restored on exit."""

    def __init__(self, torch):
        self.torch = torch
        self.saved = []

    def __enter__(self):
        import warnings

        t = self.torch
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for obj in (t.backends.cuda.matmul, t.backends.cudnn):
                for attr in ("fp32_precision", "allow_tf32"):
                    if hasattr(obj, attr):
                        self.saved.append((obj, attr, getattr(obj, attr)))
            self.precision = t.get_float32_matmul_precision()
            t.backends.cuda.matmul.allow_tf32 = False
            t.backends.cudnn.allow_tf32 = False
            t.set_float32_matmul_precision("highest")
        return self

    def __exit__(self, *exc):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.torch.set_float32_matmul_precision(self.precision)
            for obj, attr, value in reversed(self.saved):
                try:
                    setattr(obj, attr, value)
                except (RuntimeError, ValueError, TypeError):
                    pass
        return False


def tolerance(dtype_name: str, k: int, scale: float) -> Dict[str, float]:
    """atol and rtol of a product with inner dimension k and term size `scale`."""
    eps = EPS[dtype_name]
    atol = scale * (ATOL_DTYPE * math.sqrt(k) * eps + ATOL_ACC * k * EPS_ACC)
    return {"atol": atol, "rtol": eps}


def compare(torch, got, ref, atol: float, rtol: float, rows=None, cols=None) -> Dict[str, Any]:
    """Per element |got - ref| <= atol + rtol*|ref| (got, ref: float64 tensors on one device):
    how many fail, the largest ratio of error to allowance, and the worst few as (row, col,
    got, want) in the full matrix's indices (`rows`/`cols` map a sampled block back)."""
    err = (got - ref).abs()
    allowed = atol + rtol * ref.abs()
    ratio = err / allowed
    finite = torch.isfinite(got)
    ratio = torch.where(finite, ratio, torch.full_like(ratio, float("inf")))
    bad = int((ratio > 1.0).sum())  # non-finite outputs have ratio inf
    flat = ratio.flatten()
    k = min(WORST_LISTED, flat.numel())
    values, where = torch.topk(flat, k)
    worst = []
    ncols = ratio.shape[1]
    for v, w in zip(values.tolist(), where.tolist()):
        i, j = divmod(int(w), ncols)
        worst.append({"row": int(rows[i]) if rows is not None else i,
                      "col": int(cols[j]) if cols is not None else j,
                      "got": float(got[i, j]), "want": float(ref[i, j]),
                      "ratio": float(v)})
    return {"bad": bad, "elements": int(flat.numel()), "max_ratio": float(values[0]) if k else 0.0,
            "worst": worst, "max_abs_err": float(err[finite].max()) if bool(finite.any())
            else float("nan")}


def matmul_once(torch, device: str, dtype_name: str, size: int, seed: int = 0,
                min_time_s: float = 0.2, op=None, crosscheck: Optional[bool] = None
                ) -> Dict[str, Any]:
    """C = A @ B on `device` in `dtype`, every element checked against the same rounded inputs
    multiplied in float64 on the device, that reference itself checked against float64 on the
    CPU for a seeded sample of rows (and columns), then timed. `op` replaces torch.matmul
    (unit tests and the GPU calibration inject wrong products with it); `crosscheck` forces
    the CPU comparison on or off (default: on unless the device is the CPU)."""
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
    scale = float(a.float().pow(2).mean().sqrt()) * float(b.float().pow(2).mean().sqrt())
    tol = tolerance(dtype_name, size, scale)
    c = op(a, b)
    sync()
    a64, b64 = a.double(), b.double()
    ref = a64 @ b64
    result = compare(torch, c.double(), ref, tol["atol"], tol["rtol"])
    ref_max = float(ref.abs().max())
    if crosscheck is None:
        crosscheck = not device.startswith("cpu")
    if crosscheck:
        rows = _sample(torch, size, FULL_ROWS, seed + 1)
        cols = _sample(torch, size, FULL_COLS if size <= FULL_COLS else FULL_ROWS, seed + 2)
        a_ref = (a if rows is None else a[rows.to(device)]).cpu().double()
        b_ref = (b if cols is None else b[:, cols.to(device)]).cpu().double()
        sample = ref if rows is None else ref[rows.to(device)]
        sample = (sample if cols is None else sample[:, cols.to(device)]).cpu()
        cpu = a_ref @ b_ref
        diff = float((cpu - sample).abs().max()) / max(float(cpu.abs().max()), 1e-300)
        result["reference_check"] = {"rows": int(cpu.shape[0]), "cols": int(cpu.shape[1]),
                                     "max_rel_diff": diff, "ok": diff <= REF_AGREE}
    del a64, b64, ref
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
    tflops = 2.0 * size ** 3 * runs / elapsed / 1e12
    checked = "every element of %dx%d" % (size, size)
    if "reference_check" in result:
        checked += "; float64 reference on %s agrees with the CPU's on %dx%d" % (
            device, result["reference_check"]["rows"], result["reference_check"]["cols"])
    result.update({
        "atol": tol["atol"], "rtol": tol["rtol"], "scale": scale,
        "max_rel_err": result["max_abs_err"] / ref_max if ref_max > 0 else float("inf"),
        "tflops": float("%.4g" % tflops), "runs": runs, "checked": checked})
    return result


def _describe_worst(r: Dict[str, Any]) -> str:
    return ", ".join("C[%d,%d] = %.6g, want %.6g" % (w["row"], w["col"], w["got"], w["want"])
                     for w in r["worst"][:3])


def matmul_check(params: Dict[str, Any], ctx: Context, device: Optional[str] = None, op=None):
    """Check: on every device (or the first), a dtype matmul is right element by element.
    `device="cpu"` and `op` are for unit tests of the numerics; the check itself needs CUDA."""
    dtype_name = params.get("dtype", "bfloat16")
    size = int(params.get("size", 4096))
    if dtype_name not in EPS:
        return failed("dtype %r is not one of %s" % (dtype_name, ", ".join(sorted(EPS))))
    if size < 1:
        return failed("size must be positive, got %d" % size)
    if device is None:
        torch = need_cuda()
        n = torch.cuda.device_count() if params.get("every_device", True) else 1
        targets = ["cuda:%d" % i for i in range(n)]
    else:
        import torch

        targets = [device]
    results = []
    with _Tf32Off(torch) if dtype_name == "float32" else _Nothing():
        tf32 = bool(torch.backends.cuda.matmul.allow_tf32)
        for dev in targets:
            name = (torch.cuda.get_device_name(torch.device(dev)) if dev.startswith("cuda")
                    else "cpu")
            r = matmul_once(torch, dev, dtype_name, size, op=op)
            r.update({"device": dev, "name": name,
                      "ok": r["bad"] == 0 and r.get("reference_check", {}).get("ok", True)})
            results.append(r)
    values: Dict[str, Any] = {"dtype": dtype_name, "size": size, "devices": results,
                              "allow_tf32": tf32,
                              "rule": "|C - ref| <= atol + rtol*|ref| per element"}
    bad = ["%s: %d of %d elements off (worst %.3g x allowed: %s)" % (
        r["device"], r["bad"], r["elements"], r["max_ratio"], _describe_worst(r))
        for r in results if r["bad"]]
    bad += ["%s: its float64 reference differs from the CPU's by %.3g (relative)" % (
        r["device"], r["reference_check"]["max_rel_diff"])
        for r in results if not r.get("reference_check", {}).get("ok", True)]
    if bad:
        return failed("%s %dx%d matmul wrong on %s" % (dtype_name, size, size, short_list(bad)),
                      values)
    worst = max(r["max_ratio"] for r in results)
    speeds = ", ".join("%.3g" % r["tflops"] for r in results)
    return passed("%s %d^3 on %d device(s): every element within atol %.2g + rtol %.2g "
                  "(worst %.2f of allowed), TF32 %s, TFLOP/s %s" % (
                      dtype_name, size, len(results), results[0]["atol"], results[0]["rtol"],
                      worst, "on" if tf32 else "off", speeds), values)


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def nccl_check(params: Dict[str, Any], ctx: Context):
    """Check: an all-reduce over every local GPU, one process per GPU, gives the exact sum.

    It imports no torch in this process (it overlaps the serial checks, and the libraries check
    reads what this process has loaded): the number of workers comes from libcuda
    (cuDeviceGetCount, which honours CUDA_VISIBLE_DEVICES as torch does), and the workers
    themselves say whether torch, CUDA and NCCL are there (the same words as need_cuda)."""
    timeout_s = int(params.get("timeout_s", 180))
    elements = int(params.get("elements", 1 << 22))
    world, how = driver.cuda_device_count()
    if not world:
        why = how if world is None else "libcuda sees no CUDA device (CUDA_VISIBLE_DEVICES=%r)" \
            % os.environ.get("CUDA_VISIBLE_DEVICES")
        raise Unavailable("no CUDA device visible: %s; the all-reduce needs one" % why,
                          {"devices_from": how})
    results = _run_workers(world, elements, timeout_s)
    seen = [r.get("device_count") for r in results if isinstance(r.get("device_count"), int)]
    if seen and seen[0] != world and seen[0] > 0 and not any(r.get("unavailable")
                                                              for r in results):
        # torch counts otherwise than libcuda did (should not happen): run again with its count
        world = seen[0]
        results = _run_workers(world, elements, timeout_s)
    expected = world * (world + 1) // 2
    values = {"world_size": world, "expected": expected, "elements": elements,
              "devices_from": how, "ranks": results,
              "env": {k: os.environ.get(k, v) for k, v in proc.SAFE_ENV.items()}}
    for r in results:
        if r.get("unavailable"):
            raise Unavailable(r["unavailable"], values)
    for r in results:
        if r.get("no_nccl"):
            return failed(r["no_nccl"], values)
    bad = ["rank %d: %s" % (r["rank"], r.get("error") or "sum %s, expected %s" % (
        r.get("min"), expected)) for r in results if not r.get("ok")]
    if bad:
        return failed("all-reduce over %d GPU(s) failed: %s" % (world, short_list(bad, 3)),
                      values)
    slowest = max(r.get("elapsed_s", 0.0) for r in results)
    note = " (world size 1: only one GPU, no inter-GPU traffic)" if world == 1 else ""
    return passed("all-reduce over %d GPU(s) gave exactly %d on every element in %.3f s%s"
                  % (world, expected, slowest, note), values)


def _run_workers(world: int, elements: int, timeout_s: int) -> List[Dict[str, Any]]:
    """Start one worker per rank, wait for all (bounded by timeout_s + 60 s, then every
    worker's process group is killed), and read each one's JSON line."""
    tmp = tempfile.mkdtemp(prefix="rbprobes-nccl-")
    env = proc.child_env()
    try:
        store = os.path.join(tmp, "store")
        argv = launch.argv(sys.executable, __package__ + ".nccl_worker", site=True)
        started = time.monotonic()
        children = []
        try:
            for rank in range(world):
                log = open(os.path.join(tmp, "rank%d.log" % rank), "w+b")
                child = proc.subprocess.Popen(
                    argv + [str(rank), str(world), store, str(elements), str(timeout_s)],
                    stdout=log, stderr=proc.subprocess.STDOUT, stdin=proc.subprocess.DEVNULL,
                    env=env, start_new_session=True)
                children.append((child, log))
        except BaseException:
            for other, log in children:
                proc.kill_group(other)
                other.wait()
                log.close()
            raise
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
    return results


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
import re
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple

from . import arch, cudalibs, driver
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


def torch_check(params: Dict[str, Any], ctx: Context):
    """torch's version and CUDA version as expected, and a driver new enough for the wheel:
    a driver whose CUDA major is older than torch.version.cuda's fails (a cu130 wheel on a
    driver < 580); an older minor of the same major runs through CUDA's minor-version
    compatibility and is a note."""
    torch = need_torch()
    values: Dict[str, Any] = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "file": getattr(torch, "__file__", None),
        "cuda_available": bool(torch.cuda.is_available()),
    }
    host = driver.host_driver()
    values["driver"] = host.version
    values["driver_cuda"] = host.cuda
    values["driver_cuda_source"] = host.cuda_source
    problems = []
    notes = []
    want = params.get("version")
    if want and not version_matches(want, torch.__version__):
        problems.append("torch is %s, expected %s" % (torch.__version__, want))
    want_cuda = params.get("cuda") or None
    if want_cuda and not version_matches(want_cuda, torch.version.cuda):
        problems.append("torch is built for CUDA %s, expected %s"
                        % (torch.version.cuda or "none (CPU-only build)", want_cuda))
    if torch.version.cuda and host.cuda:
        wheel = arch.parse_version(torch.version.cuda)
        have = arch.parse_version(host.cuda)
        need = [d for d, c in driver.DRIVER_TO_CUDA if arch.parse_version(c) >= wheel]
        least = need[-1] if need else "?"
        if have[0] < wheel[0]:
            problems.append("torch %s is built for CUDA %s but the driver %s supports CUDA %s "
                            "(CUDA %d needs a driver >= %s)" % (
                                torch.__version__, torch.version.cuda, host.version or "?",
                                host.cuda, wheel[0], least))
        elif have < wheel:
            notes.append("driver CUDA %s is older than the wheel's %s: runs through CUDA "
                         "minor-version compatibility (PTX from the newer toolkit cannot be "
                         "JIT-compiled; kernel_audit checks that)" % (host.cuda,
                                                                      torch.version.cuda))
    elif torch.version.cuda and not host.cuda:
        notes.append("no NVIDIA driver found")
    text = "torch %s, CUDA %s" % (torch.__version__, torch.version.cuda or "none")
    if host.version or host.cuda:
        text += ", driver %s (CUDA %s)" % (host.version or "?", host.cuda or "?")
    if problems:
        return failed("; ".join(problems), values)
    return passed("; ".join([text] + notes), values)


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
    # the spec's gpu.model: a device of the same capability but another model (an H100 for an
    # H200) is not the GPU the spec declared
    model, model_names = ctx.gpu_value("model"), ctx.gpu_value("names")
    if model_names:
        values["model"] = model
        wrong = ["%d: %s" % (d["index"], d["name"]) for d in devices
                 if not names_model(d["name"], model_names)]
        if wrong:
            problems.append("the spec's gpu.model is %s, but device %s is not one (its names: %s)"
                            % (model, short_list(wrong), ", ".join(model_names)))
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
    return passed("%d x %s (capability %s%s); torch carries %s" % (
        n, "/".join(names_seen), "/".join(caps), ", gpu.model %s" % model if model_names else "",
        ", ".join(a for c in caps for a in values["arch_paths"][c])), values)


def names_model(device: str, names: List[str]) -> bool:
    """Whether a device's name as the driver reports it ("NVIDIA H100 80GB HBM3") names one of
    `names` (a model and its aliases, from the compiler's GPU catalog): a run of its words,
    joined without case or separators, is one of them. "NVIDIA GH200 480GB" names GH200, not
    H200; "NVIDIA RTX PRO 6000 Blackwell Server Edition" names RTX-PRO-6000."""
    words = [w for w in re.split(r"[\s._-]+", device.lower()) if w]
    keys = {re.sub(r"[\s._-]+", "", n).lower() for n in names}
    return any("".join(words[i:j]) in keys
               for i in range(len(words)) for j in range(i + 1, len(words) + 1))


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
    return passed(", ".join("%s %s" % (r["module"], r["version"]) if r["version"] else
                            "%s (no version: neither __version__ nor package metadata)"
                            % r["module"] for r in results), values)


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
    """Import the modules; with a GPU, touch CUDA, cuBLAS and cuDNN (through torch, when it is
    one of them) so they load. `cuda_initialised`: a CUDA device was found and used."""
    info: Dict[str, Any] = {"imported": []}
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise Unavailable("cannot import %s (%s): the runtime part needs it" % (name, exc))
        info["imported"].append(name)
    torch = sys.modules.get("torch")
    if torch is not None:
        if torch.cuda.is_available():
            torch.cuda.init()
            a = torch.ones((64, 64), device="cuda")
            (a @ a).sum().item()
            info["cudnn"] = torch.backends.cudnn.version()
            info["cuda_initialised"] = True
            info["devices"] = torch.cuda.device_count()
        else:
            info["cuda_initialised"] = False
            info["why_not"] = "torch %s (CUDA %s) reports torch.cuda.is_available() == False" % (
                torch.__version__, torch.version.cuda or "none: a CPU-only build")
        return info
    count, how = driver.cuda_device_count()
    info["devices"] = count
    info["cuda_initialised"] = bool(count)
    if not count:
        info["why_not"] = how if count is None else "libcuda sees no CUDA device"
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
    # Nothing wrong was seen; but without CUDA in use, nothing was proven either.
    if not values["runtime"]["cuda_initialised"]:
        raise Unavailable("no CUDA device to load the CUDA libraries with (%s); %d tracked "
                          "CUDA libraries were loaded by importing %s, none from elsewhere" % (
                              values["runtime"].get("why_not", "?"), len(loaded),
                              ", ".join(modules) or "nothing"), values)
    if not loaded:
        raise Unavailable("CUDA is initialised but no tracked CUDA library was loaded after "
                          "importing %s" % (", ".join(modules) or "nothing"), values)
    text = "%d CUDA libraries loaded, all from expected dirs, CUDA %s" % (
        len(loaded), "+".join(map(str, values["loaded_majors"])) or "?")
    return passed("; ".join([text] + notes), values)
RB_PY_3C4C6F72
  cat >"${dir}"/rbprobes/checks_static.py <<'RB_PY_D11E5D37'
"""L0 checks: read files only, need no GPU and no torch.

- kernel_audit: every unit of GPU code in the venv, and whether it has a path to the target
  device (SASS that runs there, or PTX this host's driver can JIT for it).
- library_inventory: which CUDA libraries the venv ships, by CUDA major (used by `libraries`).
"""

from __future__ import annotations

import fnmatch
import os
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from . import arch, cudalibs, decompress, driver, fatbin, venvfs
from .result import Context, failed, passed, short_list
from .workers import over_workers

_SUFFIXES = (".so", ".cubin", ".fatbin")
# Libraries whose vendor dispatches per arch by design: a unit without the target's code is
# a note there, not a failure (NVIDIA's math libraries: libcublasLt has no sm_103 code in many
# of its units and launches only the kernels it has for the device; docs/probes.md counts them).
DEFAULT_PARTIAL_OK = ["nvidia/*"]
UNITS_LISTED = 20  # units without a path listed per file


def _is_candidate(name: str) -> bool:
    return name.endswith(_SUFFIXES) or ".so." in name


def candidate_files(root: str, skipped: Optional[List[str]] = None) -> List[str]:
    """Shared objects, cubins and fatbins under root (or root itself if it is a file), each
    regular file once: symbolic links are not followed, hard links are de-duplicated, and
    anything else with such a name (a FIFO, a socket, a device) is listed in `skipped`."""
    return [path for path, _size in _candidates(root, skipped)]


def _candidates(root: str, skipped: Optional[List[str]]) -> List[Tuple[str, int]]:
    """candidate_files with each file's size (what the audit's workers are balanced by)."""
    if not os.path.isdir(root):
        if os.path.isfile(root):
            try:
                return [(root, os.stat(root).st_size)]
            except OSError:
                return [(root, 0)]  # gone since: its scan says so
        if skipped is not None and os.path.exists(root):
            skipped.append(root)
        return []
    seen = set()
    out = []
    for _top, entry in venvfs.walk(root):
        if not _is_candidate(entry.name):
            continue
        try:
            if entry.is_symlink() or entry.is_dir(follow_symlinks=False):
                continue
            if not entry.is_file(follow_symlinks=False):
                if skipped is not None:
                    skipped.append(entry.path)
                continue
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        if key not in seen:
            seen.add(key)
            out.append((entry.path, st.st_size))
    return out


def glob_match(path: str, globs: List[str]) -> Optional[str]:
    """The first glob that matches `path` or any end part of it that starts at a directory
    (`nvidia/*` matches .../site-packages/nvidia/cu13/lib/libcublasLt.so.13), else None."""
    parts = os.path.abspath(path).strip(os.sep).split(os.sep)
    tails = ["/".join(parts[i:]) for i in range(len(parts))]
    for g in globs:
        if any(fnmatch.fnmatchcase(t, g) for t in tails):
            return g
    return None


def unit_path(unit: List[fatbin.Container], target: Tuple[int, int],
              ptx_max: Optional[Tuple[int, int]]) -> Tuple[Optional[str], str]:
    """("sass" | "ptx" | None, what it has): SASS that runs on the target, else PTX that the
    driver can JIT for it (its ISA version at most `ptx_max`, when known)."""
    entries = [e for c in unit for e in c.entries]
    for e in entries:
        if e.kind == "sass" and arch.runs_on("sass", e.number, e.suffix, target):
            return "sass", e.name
    ptx_fit = [e for e in entries if e.kind == "ptx"
               and arch.runs_on("ptx", e.number, e.suffix, target)]
    for e in ptx_fit:
        if ptx_max is None or e.version <= ptx_max:
            return "ptx", e.name
    names = sorted({e.name for e in entries}, key=fatbin._arch_key)
    code = [e for e in entries if e.kind in ("sass", "ptx")]
    if not code:
        if any(e.kind == "lto" for e in entries):
            return None, ("only LTO-IR (%s): input for nvJitLink, never loaded as it is"
                          % "+".join(names))
        return None, "no SASS or PTX (%s)" % ("+".join(names) or "no entries")
    why = "has %s" % "+".join(names)
    if ptx_fit:
        why += "; its PTX is ISA %s, the driver JITs up to %d.%d" % (
            "/".join(sorted({"%d.%d" % e.version for e in ptx_fit})), ptx_max[0], ptx_max[1])
    return None, why


def judged_units(scan: fatbin.Scan, target: Tuple[int, int],
                 ptx_max: Optional[Tuple[int, int]]) -> List[List[fatbin.Container]]:
    """`Scan.units` as the runtime uses them on `target`: a device-linked (-rdc) container
    whose SASS runs there is one unit; one that does not is replaced by the relocatable units
    it was linked from, each on its own (on the H200 the runtime then loads each unit whose
    relocatable SASS runs, or whose PTX it can JIT, and only those)."""
    out = []
    for unit in scan.units:
        if fatbin.linked_group(unit) and unit_path(unit[:1], target, ptx_max)[0] is None:
            out.extend([c] for c in unit[1:])
        elif fatbin.linked_group(unit):
            out.append(unit[:1])
        else:
            out.append(unit)
    return out


def jit_versions(unit: List[fatbin.Container], target: Tuple[int, int]) -> List[str]:
    """PTX ISA versions of the entries a PTX-only unit would be JIT-compiled from."""
    return sorted({"%d.%d" % e.version for c in unit for e in c.entries
                   if e.kind == "ptx" and arch.runs_on("ptx", e.number, e.suffix, target)})


def _arch_specific(unit: List[fatbin.Container]) -> bool:
    """A unit whose code is all arch- or family-specific (sm_100a, sm_90a, sm_100f, ...): built
    for those archs' own features, so a library calls it only on them (dispatch by design)."""
    code = [e for c in unit for e in c.entries if e.kind in ("sass", "ptx")]
    return bool(code) and all(e.suffix in ("a", "f") for e in code)


def _examine(scan: fatbin.Scan, buf, target: Tuple[int, int],
             ptx_max: Optional[Tuple[int, int]], waived: bool,
             strict: bool = False, run: Optional[decompress.DecodeBudget] = None) -> Dict[str, Any]:
    """Per-file facts: units with and without a path, the kernels of the latter, problems.
    Units without a path whose code is all arch-specific are listed apart (`arch_specific`)
    unless `strict`. `run`: the audit run's decoding budget and deadline (a fresh one when not
    given); a unit a limit left undecoded is `unproven`, a problem: it may hold kernels."""
    if run is None:
        run = decompress.DecodeBudget()
        try:
            return _examine(scan, buf, target, ptx_max, waived, strict, run)
        finally:
            run.close()
    units = judged_units(scan, target, ptx_max)
    with_path = {"sass": 0, "ptx": 0}
    missing: List[Dict[str, Any]] = []
    specific: List[Dict[str, Any]] = []
    kernel_free = 0
    problems: List[str] = []
    unreadable: List[str] = ["%s: %s" % (c.label, c.error) for c in scan.containers if c.error]
    unknown = sorted({e.name for e in scan.entries
                      if e.kind not in ("sass", "ptx", "lto")}, key=fatbin._arch_key)
    lacking = []
    jit = set()
    for unit in units:
        how, what = unit_path(unit, target, ptx_max)
        if how:
            with_path[how] += 1
            if how == "ptx":
                jit.update(jit_versions(unit, target))
        elif any(c.entries for c in unit):
            lacking.append((unit, what))
    # A waived file with some unit that runs needs no decoding: it is a note either way.
    decode = not (waived and (with_path["sass"] or with_path["ptx"]))
    budget = [decompress.FILE_INPUT_BUDGET]
    for unit, what in lacking:
        label = (unit[0].label if len(unit) == 1
                 else "%s (%d embedded containers)" % (unit[0].section, len(unit)))
        item: Dict[str, Any] = {"unit": label, "why": what,
                                "archs": sorted({e.name for c in unit for e in c.entries},
                                                key=fatbin._arch_key)}
        has_code = any(e.kind in ("sass", "ptx") for c in unit for e in c.entries)
        if decode and has_code and buf is not None:
            k = fatbin.unit_kernels(buf, unit, budget, run)
            if k.error:
                unreadable.append(k.error)
            if k.kernel_free:
                kernel_free += 1
                continue
            item["kernels"] = k.names
            item["kernels_complete"] = k.complete
            if not k.complete:
                item["kernels_note"] = k.undecoded
            if k.limited:
                item["unproven"] = True
        elif has_code:
            item["kernels_note"] = "not decoded (partial_ok)" if not decode else "not decoded"
        (specific if not strict and _arch_specific(unit) else missing).append(item)
    if unknown:
        problems.append("entries of a kind this reader does not know (%s): cannot judge"
                        % ", ".join(unknown))
    if unreadable:
        problems.append("unreadable: %s" % short_list(unreadable, 3))
    n_path = with_path["sass"] + with_path["ptx"]
    if not n_path and specific:  # nothing in the file runs here: arch-specific or not
        missing, specific = missing + specific, []
    # A unit without a path that a limit left undecoded may be free of kernels (then it would
    # not count): that was not shown, so it counts, and the file says why.
    unproven = [m["kernels_note"] for m in missing if m.get("unproven")]
    if unproven:
        problems.append("not proven: %d units without a path not decoded, so not shown free of "
                        "kernels (%s)" % (len(unproven), short_list(unproven, 2)))
    if missing:
        verdict = "partial" if n_path else "none"
    elif n_path:
        verdict = "ptx" if with_path["ptx"] else "sass"
    else:
        verdict = "empty"
    return {"units": len(units), "units_with_path": n_path, "units_ptx_only": with_path["ptx"],
            "units_kernel_free": kernel_free, "units_without_path": len(missing),
            "units_arch_specific": len(specific), "jit_ptx_versions": sorted(jit),
            "missing": missing,
            "arch_specific": specific, "verdict": verdict, "problems": problems,
            "unreadable": unreadable, "unproven": unproven, "unknown_kinds": unknown}


def file_verdict(
    scan: fatbin.Scan, target: Tuple[int, int], driver_ptx_max: Optional[Tuple[int, int]],
    buf=None,
) -> Tuple[str, int]:
    """("sass" | "ptx" | "partial" | "none" | "empty", units without a path) for one file.

    Each unit (`Scan.units`) has a path when one of its SASS entries runs on the target, or
    else one of its PTX entries can be JIT-compiled for it. With `buf` (the file's bytes) the
    units without a path are decoded and those without any kernel left out (without it, the
    file at scan.path is read when there is one)."""
    if buf is None and os.path.isfile(scan.path):
        with fatbin.mapped(scan.path, follow=True) as (_again, mm):
            info = _examine(scan, mm, target, driver_ptx_max, False)
    else:
        info = _examine(scan, buf, target, driver_ptx_max, False)
    return info["verdict"], info["units_without_path"]


def _describe_missing(item: Dict[str, Any]) -> str:
    kernels = item.get("kernels")
    if kernels:
        text = "kernels %s" % short_list(kernels, 3)
    else:
        text = "kernels not read: %s" % item.get("kernels_note", "?")
    return "%s: %s; %s" % (item["unit"], item["why"], text)


AUDIT_JOBS_MAX = 8
AUDIT_PARALLEL_BYTES = 64 << 20  # less to read than this: one process reads it all


class _Seen(NamedTuple):
    """What the audit's summary needs of a fatbin.Entry (a worker sends these back)."""
    kind: str
    name: str
    version: Tuple[int, int]
    compression: Optional[str]


def audit_jobs(sizes: List[int]) -> int:
    """How many processes read the audit's files: RBPROBES_AUDIT_JOBS when set, else one per
    usable core but one (at most AUDIT_JOBS_MAX) when there is at least AUDIT_PARALLEL_BYTES to
    read, and never more than the files. Only a process without threads forks workers."""
    forced = os.environ.get("RBPROBES_AUDIT_JOBS", "")
    if forced.isdigit():
        return max(1, min(int(forced), len(sizes)))
    if sum(sizes) < AUDIT_PARALLEL_BYTES:
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores - 1, AUDIT_JOBS_MAX, len(sizes)))


def _audit_file(path: str, follow: bool, base: str, target: Tuple[int, int],
                driver_ptx_max: Optional[Tuple[int, int]], globs: List[str],
                strict: bool, run: Optional[decompress.DecodeBudget] = None
                ) -> Optional[Dict[str, Any]]:
    """One candidate file's part of `audit`: None (not ELF), {"skipped": path} (not a regular
    file), else {"errors": [...], "seen": [entry facts], "file": its row when it has GPU code}.
    Plain data only (a worker process marshals it back). `run`: the audit's decoding limits."""
    with fatbin.mapped(path, follow=follow) as (scan, buf):
        if scan.kind == "not-elf":
            return None
        if scan.kind == "not-regular":
            return {"skipped": path}
        rel = os.path.relpath(path, base)
        if scan.error:
            return {"errors": ["%s: %s" % (rel, scan.error)],
                    "file": {"path": rel, "verdict": "unreadable", "fails": True,
                             "problems": ["unreadable: %s" % scan.error]}}
        entries = [e for c in scan.runtime_containers + scan.embedded_containers
                   for e in c.entries]
        if not entries and not any(c.error for c in scan.containers):
            return {}
        waived_by = None if strict else glob_match(path, globs)
        facts = _examine(scan, buf, target, driver_ptx_max, waived_by is not None, strict, run)
    info: Dict[str, Any] = {"path": rel}
    info.update(fatbin.summarize(entries))
    info["containers"] = len(scan.runtime_containers)
    if scan.embedded_containers:
        info["embedded_containers"] = len(scan.embedded_containers)
    if any(c.section == fatbin.RELOCATABLE_SECTION for c in scan.containers):
        info["relocatable"] = sum(
            len(c.entries) for c in scan.containers
            if c.section == fatbin.RELOCATABLE_SECTION)
    missing = facts.pop("missing")
    specific = facts.pop("arch_specific")
    info.update(facts)
    info["missing"] = missing[:UNITS_LISTED]
    if specific:
        info["arch_specific"] = specific[:UNITS_LISTED]
        info["arch_specific_archs"] = sorted(
            {a for u in specific for a in u["archs"]}, key=fatbin._arch_key)
    problems = list(facts["problems"])
    verdict = facts["verdict"]
    if verdict == "none":
        problems.append("no unit has a path to %s" % arch.capability_to_arch(target))
    elif verdict == "partial":
        if waived_by:
            info["waived_by"] = waived_by
        else:
            problems.append("%d of %d units have no path to %s%s" % (
                len(missing), facts["units"] - facts["units_kernel_free"],
                arch.capability_to_arch(target), " (strict)" if strict else ""))
    info["problems"] = problems
    info["fails"] = bool(problems)
    if problems:
        info["package"] = venvfs.owner(path)
    return {"errors": ["%s: %s" % (rel, u) for u in facts["unreadable"]],
            "seen": [(e.kind, e.name, e.version, e.compression) for e in entries],
            "file": info}


def audit(
    root: str,
    target: Tuple[int, int],
    paths: Optional[List[str]] = None,
    driver_ptx_max: Optional[Tuple[int, int]] = None,
    partial_ok: Optional[List[str]] = None,
    strict: bool = False,
    jobs: Optional[int] = None,
) -> Dict[str, Any]:
    """Scan root (a venv, a directory or one file), or the given paths inside it, and judge
    every unit for `target`. A file fails when it is unreadable, holds entries of an unknown
    kind, has no unit with a path ("none"), or has units without a path ("partial") unless
    it matches a `partial_ok` glob (default DEFAULT_PARTIAL_OK; ignored with `strict`).

    The files are read by `jobs` worker processes (default: audit_jobs), the result the same
    as one process's, file for file and in the same order."""
    globs = DEFAULT_PARTIAL_OK if partial_ok is None else list(partial_ok)
    roots = [root] if not paths else [p if os.path.isabs(p) else os.path.join(root, p)
                                      for p in paths]
    missing_paths = [p for p in roots if not os.path.lexists(p)]
    base = root if os.path.isdir(root) else os.path.dirname(root)
    skipped: List[str] = []
    todo: List[Tuple[str, bool]] = []
    sizes: List[int] = []
    for r in roots:
        if os.path.lexists(r):
            for path, size in _candidates(r, skipped):
                todo.append((path, path == r))
                sizes.append(size)
    n = audit_jobs(sizes) if jobs is None else jobs
    run = decompress.DecodeBudget()  # decoded bytes and seconds for the whole run, all workers
    try:
        records, workers = over_workers(
            lambda i: _audit_file(todo[i][0], todo[i][1], base, target, driver_ptx_max, globs,
                                  strict, run), sizes, n)
    finally:
        run.close()
    files: List[Dict[str, Any]] = []
    errors: List[str] = []
    scanned = 0
    all_entries: List[Any] = []
    for rec in records:
        if rec is None:
            continue
        if "skipped" in rec:
            skipped.append(rec["skipped"])
            continue
        scanned += 1
        errors.extend(rec.get("errors", ()))
        all_entries.extend(_Seen(*e) for e in rec.get("seen", ()))
        if "file" in rec:
            files.append(rec["file"])
    overall = fatbin.summarize(all_entries)

    def having(cond) -> List[str]:
        return [f["path"] for f in files if cond(f)]

    return {
        "target": arch.capability_to_arch(target),
        "root": root,
        "files_scanned": scanned,
        "workers": workers,
        "gpu_files": len(files),
        "failing": having(lambda f: f["fails"]),
        "no_path": having(lambda f: f["verdict"] == "none"),
        "partial": having(lambda f: f["verdict"] == "partial"),
        "partial_waived": having(lambda f: f["verdict"] == "partial" and f.get("waived_by")),
        "ptx_only": having(lambda f: f["verdict"] == "ptx"),
        "kernel_free": having(lambda f: f["verdict"] == "empty"),
        "arch_specific": having(lambda f: f.get("units_arch_specific")),
        "unreadable": having(lambda f: f["verdict"] == "unreadable" or f.get("unreadable")),
        "unproven": having(lambda f: f.get("unproven")),
        "decode_limits": {"entry_cap": decompress.ENTRY_CAP, "output": run.output,
                          "seconds": run.seconds, "file_input": decompress.FILE_INPUT_BUDGET},
        "unknown_kinds": having(lambda f: f.get("unknown_kinds")),
        "partial_ok": globs,
        "strict": strict,
        "sass": overall["sass"],
        "ptx": overall["ptx"],
        "lto": overall["lto"],
        "ptx_versions": overall["ptx_versions"],
        "compressed_entries": overall["compressed"],
        "zstd_decoder": decompress.zstd_decoder(),
        "missing_paths": missing_paths,
        "skipped_not_regular": skipped,
        "errors": errors,
        "files": files,
    }


def resolve_ptx_limit(value: Optional[str]) -> Tuple[Optional[Tuple[int, int]], Dict[str, Any]]:
    """driver_ptx_max as given: "X.Y" (that), "none" (not checked), absent (this host's
    driver, when it has one). Returns (limit, what the report says about it)."""
    if value and value.lower() != "none":
        return arch.parse_version(value), {"ptx_max": value, "source": "params.driver_ptx_max"}
    if value:
        return None, {"ptx_max": None, "source": "not checked (driver_ptx_max: none)"}
    host = driver.host_driver()
    info = dict(host.as_dict())
    info["source"] = host.describe()
    return host.ptx_max, info


def kernel_audit(params: Dict[str, Any], ctx: Context):
    """Check: every unit of GPU code has a path to the target arch (see `audit`)."""
    target_text = params.get("arch") or ctx.gpu_value("arch") or ctx.gpu_value("capability")
    if not target_text:
        return failed("no target architecture: give params.arch (e.g. sm_103) or gpu.arch")
    try:
        target = arch.parse_target(str(target_text))
        driver_max, driver_info = resolve_ptx_limit(params.get("driver_ptx_max"))
    except ValueError as exc:
        return failed(str(exc))
    root = ctx.venv_or_prefix()
    if not os.path.exists(root):
        return failed("%s does not exist" % root)
    values = audit(root, target, params.get("paths"), driver_max, params.get("partial_ok"),
                   bool(params.get("strict")))
    values["driver"] = driver_info
    values["driver_ptx_max"] = driver_info.get("ptx_max")
    return judge_audit(values)


def judge_audit(values: Dict[str, Any]):
    """The kernel_audit outcome (pass/fail and its one-line reason) for audit() values."""
    name = values["target"]
    problems = []
    if values["missing_paths"]:
        problems.append("missing paths: %s" % short_list(values["missing_paths"]))
    failing = [f for f in values["files"] if f["fails"]]
    if failing:
        described = []
        for f in failing:
            text = f["path"]
            if f.get("package"):
                text += " [%s]" % f["package"]
            detail = "; ".join(f["problems"])
            if f.get("missing"):
                detail += "; " + _describe_missing(f["missing"][0])
                if f["units_without_path"] > 1:
                    detail += " (+%d more units)" % (f["units_without_path"] - 1)
            described.append("%s (%s)" % (text, detail))
        problems.append("%d of %d files with GPU code fail for %s: %s" % (
            len(failing), values["gpu_files"], name, short_list(described, 3)))
    if problems:
        return failed("; ".join(problems), values)
    notes = []
    drv = values.get("driver") or {}
    if values["ptx_only"]:
        jit = sorted({v for f in values["files"] for v in f.get("jit_ptx_versions", [])},
                     key=lambda v: tuple(int(x) for x in v.split(".")))
        if values.get("driver_ptx_max"):
            notes.append("%d only through PTX JIT (slow first launch; ISA %s <= %s)" % (
                len(values["ptx_only"]), "/".join(jit or ["?"]), values["driver_ptx_max"]))
        else:
            notes.append("%d only through PTX JIT (slow first launch; PTX ISA %s not checked: "
                         "%s)" % (len(values["ptx_only"]), "/".join(jit or ["?"]),
                                  drv.get("source", "no driver limit")))
    if values["partial_waived"]:
        waived = [f for f in values["files"] if f.get("waived_by")]
        notes.append("%d with units lacking %s code, allowed by partial_ok (vendor dispatch): "
                     "%s" % (len(waived), name, short_list(
                         ["%s (%d of %d units)" % (os.path.basename(f["path"]),
                                                   f["units_without_path"], f["units"])
                          for f in waived], 3)))
    if values.get("arch_specific"):
        spec = [f for f in values["files"] if f.get("units_arch_specific")]
        notes.append("%d with arch-specific units for other archs, called only there: %s" % (
            len(spec), short_list(["%s (%d units: %s)" % (
                os.path.basename(f["path"]), f["units_arch_specific"],
                "+".join(f["arch_specific_archs"][:4])) for f in spec], 3)))
    if values["kernel_free"]:
        notes.append("%d without any kernel" % len(values["kernel_free"]))
    if values["skipped_not_regular"]:
        notes.append("%d not regular files, skipped" % len(values["skipped_not_regular"]))
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
  cat >"${dir}"/rbprobes/checks_venv.py <<'RB_PY_27ABEEEE'
"""L0 checks of the venv as a tree of files: does it still work where it now lives
(`relocation`), and does it reach outside itself (`outside`)?

Both read the tree without following links (os.scandir, lstat) and open regular files only;
`relocation` also starts the venv's python once, bounded in time.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import unquote, urlparse

from rbrules import links
from rbrules.links import PYTHON_NAME

from . import proc, venvfs
from .result import Context, failed, passed, short_list

ACTIVATE = ("activate", "activate.csh", "activate.fish", "activate.nu", "Activate.ps1")
TRAMPOLINE = re.compile(rb"^'''exec' (.*)$")  # pip/distlib/uv's form for long shebangs
# the form that names no path: the interpreter beside the script (what relocation writes for a
# venv path that is too long for a shebang or is not plain path characters)
BESIDE = re.compile(rb'''^'\'\'exec' "\$\(dirname -- "\$\(realpath -- "\$0"\)"\)/([A-Za-z0-9._+-]+)" "\$0" "\$@"$''')
PYTHON_START_S = 60
SCAN_LIMIT = 256 << 20  # bytes of one bin/ file searched for the old prefix


def _old_pattern(old: str):
    """The old prefix as a whole path: followed by '/', a quote, whitespace, ':', NUL or the
    end (so /opt/venv does not match /opt/venv2)."""
    return re.compile(re.escape(old.rstrip("/").encode()) + rb"(?=[/\"'\s:;\x00]|$)",
                      re.MULTILINE)


def _inside_venv(path: str, venv: str) -> bool:
    roots = [os.path.normpath(venv), os.path.realpath(venv)]
    if venvfs.inside(os.path.normpath(path), roots):
        return True
    parent = os.path.realpath(os.path.dirname(path))  # /venv-link/bin/python
    return venvfs.inside(os.path.join(parent, os.path.basename(path)), roots)


def parse_interpreter(head: bytes) -> Optional[Tuple[str, List[str], str]]:
    """(interpreter, arguments, form) of a script's first lines, or None without a shebang.
    form: "shebang" or "trampoline" (`#!/bin/sh` + `'''exec' "/venv/bin/python" "$0" "$@"`)."""
    if not head.startswith(b"#!"):
        return None
    lines = head.split(b"\n", 2)
    first = lines[0][2:].strip().decode("utf-8", "replace")
    if first in ("/bin/sh", "/bin/sh -") and len(lines) > 1:
        m = TRAMPOLINE.match(lines[1].rstrip(b"\r"))
        if m:
            try:
                words = shlex.split(m.group(1).decode("utf-8", "replace"))
            except ValueError:
                words = m.group(1).decode("utf-8", "replace").split()
            beside = BESIDE.match(lines[1].rstrip(b"\r"))
            if beside:  # pip's form: the interpreter beside the script, wherever it lives
                return "@beside/" + beside.group(1).decode(), [], "trampoline"
            if words:
                return words[0], words[1:], "trampoline"
    try:
        words = shlex.split(first)
    except ValueError:
        words = first.split()
    if not words:
        return "", [], "shebang"
    return words[0], words[1:], "shebang"


def _env_command(args: List[str]) -> Optional[str]:
    """The program `/usr/bin/env [-S] [-i] [VAR=x]... PROG` runs."""
    words: List[str] = []
    for a in args:
        words.extend(a.split() if " " in a else [a])
    for w in words:
        if w.startswith("-") or "=" in w:
            continue
        return w
    return None


def _judge_interpreter(script: str, head: bytes, venv: str, path_env: str
                       ) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """(what the script runs, problem or None)."""
    parsed = parse_interpreter(head)
    if parsed is None:
        return None, None
    interp, args, form = parsed
    info: Dict[str, Any] = {"script": script, "interpreter": interp, "form": form}
    if not interp:
        return info, "%s: empty shebang" % script
    runs = interp
    if interp.startswith("@beside/"):
        where = script if os.path.isabs(script) else os.path.join(venv, script)
        runs = interp = os.path.join(os.path.dirname(os.path.realpath(where)),
                                     interp[len("@beside/"):])
        info["interpreter"] = interp
    if os.path.basename(interp) == "env" and form == "shebang":
        prog = _env_command(args)
        if not prog:
            return info, "%s: %s without a program" % (script, interp)
        if "/" in prog:
            runs = prog
        else:
            import shutil

            found = shutil.which(prog, path=path_env)
            info["via_env"] = prog
            if not found:
                return info, "%s: `%s %s` finds no %s on PATH (venv bin/ first)" % (
                    script, interp, prog, prog)
            runs = found
    info["runs"] = runs
    if not os.path.isabs(runs):
        return info, "%s: interpreter %s is not an absolute path" % (script, runs)
    if not os.path.exists(runs):
        return info, "%s: interpreter %s does not exist" % (script, runs)
    if not os.access(runs, os.X_OK) or os.path.isdir(runs):
        return info, "%s: interpreter %s is not executable" % (script, runs)
    inside = _inside_venv(runs, venv)
    info["inside"] = inside
    if PYTHON_NAME.match(os.path.basename(runs)) and not inside:
        return info, "%s: runs %s, a python outside the venv" % (script, runs)
    return info, None


def relocation(venv: str, old: Optional[str] = None,
               timeout_s: float = PYTHON_START_S) -> Dict[str, Any]:
    """Facts about a (moved) venv: what each bin/ script runs, which files still name `old`,
    whether bin/python starts (and with which sys.prefix), whether pyvenv.cfg's home exists.
    `problems` lists what is wrong."""
    venv = os.path.abspath(venv)
    problems: List[Dict[str, str]] = []
    values: Dict[str, Any] = {"venv": venv, "old": old, "scripts": [], "names_old": [],
                              "activate": [], "system_interpreters": []}
    if old and os.path.normpath(old) in (os.path.normpath(venv), os.path.realpath(venv)):
        problems.append({"file": "", "what": "the old prefix %s is the venv's own path: "
                                             "nothing to compare" % old})
        old = None
    bindir = os.path.join(venv, "bin")
    pattern = _old_pattern(old) if old else None
    path_env = bindir + os.pathsep + os.environ.get("PATH", os.defpath)
    if not os.path.isdir(bindir):
        problems.append({"file": "bin", "what": "no bin/ directory in %s" % venv})
    else:
        with os.scandir(bindir) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            rel = "bin/" + entry.name
            if entry.is_symlink():
                target = os.readlink(entry.path)
                if pattern and pattern.search(target.encode("utf-8", "surrogateescape")):
                    values["names_old"].append(rel)
                    problems.append({"file": rel, "what": "links to %s, under the old prefix"
                                     % target})
                elif not os.path.exists(entry.path):
                    problems.append({"file": rel, "what": "links to %s, which does not exist"
                                     % target})
                continue
            if not venvfs.is_regular(entry):
                continue
            data = venvfs.read_small(entry.path, SCAN_LIMIT)
            if data is None:
                problems.append({"file": rel, "what": "cannot be read"})
                continue
            if entry.name in ACTIVATE:
                values["activate"].append(entry.name)
            if pattern and pattern.search(data):
                values["names_old"].append(rel)
                problems.append({"file": rel, "what": "names the old prefix %s" % old})
            info, problem = _judge_interpreter(rel, data[:4096], venv, path_env)
            if info:
                values["scripts"].append(info)
                if info.get("inside") is False and info.get("runs"):
                    values["system_interpreters"].append("%s: %s" % (rel, info["runs"]))
            if problem:
                problems.append({"file": rel, "what": problem.split(": ", 1)[1]})
    cfg = venvfs.pyvenv_cfg(venv)
    if cfg is None:
        values["pyvenv_cfg"] = None
    else:
        home = cfg.get("home")
        values["pyvenv_cfg"] = {"home": home, "home_exists": bool(home and os.path.isdir(home))}
        if not home:
            problems.append({"file": "pyvenv.cfg", "what": "has no home"})
        elif not os.path.isdir(home):
            problems.append({"file": "pyvenv.cfg", "what": "home %s does not exist" % home})
        if pattern:
            data = venvfs.read_small(os.path.join(venv, "pyvenv.cfg"), 1 << 16) or b""
            if pattern.search(data):
                values["names_old"].append("pyvenv.cfg")
                problems.append({"file": "pyvenv.cfg", "what": "names the old prefix %s" % old})
    values["python"] = _start_python(venv, timeout_s, problems)
    values["problems"] = problems
    return values


def _start_python(venv: str, timeout_s: float, problems: List[Dict[str, str]]
                  ) -> Dict[str, Any]:
    """Run bin/python -c (bounded): it must start, and its sys.prefix must be the venv."""
    exe = next((os.path.join(venv, "bin", n) for n in ("python", "python3")
                if os.path.lexists(os.path.join(venv, "bin", n))), None)
    if exe is None:
        problems.append({"file": "bin/python", "what": "missing"})
        return {"path": None}
    info: Dict[str, Any] = {"path": exe, "resolves_to": os.path.realpath(exe)}
    code = "import sys; print(sys.prefix); print(sys.version.split()[0])"
    env = proc.child_env()
    env.pop("PYTHONHOME", None)
    env.pop("VIRTUAL_ENV", None)
    try:
        done = proc.run_bounded([exe, "-I", "-c", code], timeout_s, env=env)
    except OSError as exc:
        problems.append({"file": "bin/python", "what": "cannot be started: %s" % exc})
        info["error"] = str(exc)
        return info
    info["seconds"] = round(done.duration_s, 3)
    if done.timed_out:
        problems.append({"file": "bin/python", "what": "did not finish `-c` within %gs"
                         % timeout_s})
        return info
    if done.returncode != 0:
        problems.append({"file": "bin/python", "what": "-c exited %d: %s" % (
            done.returncode, done.output.strip()[-200:])})
        return info
    lines = done.stdout.strip().splitlines()
    info["prefix"] = lines[0] if lines else None
    info["version"] = lines[1] if len(lines) > 1 else None
    if info["prefix"] and not _same_dir(info["prefix"], venv):
        problems.append({"file": "bin/python", "what": "starts with sys.prefix %s, not the venv "
                         "%s (pyvenv.cfg missing or wrong?)" % (info["prefix"], venv)})
    return info


def _same_dir(a: str, b: str) -> bool:
    return os.path.normpath(a) == os.path.normpath(b) or os.path.realpath(a) == os.path.realpath(b)


def relocation_check(params: Dict[str, Any], ctx: Context):
    """Check: the venv works where it lives (see `relocation`)."""
    venv = ctx.venv_or_prefix()
    if not os.path.isdir(venv):
        return failed("venv %s does not exist" % venv)
    values = relocation(venv, params.get("old"), params.get("timeout_s", PYTHON_START_S))
    if values["problems"]:
        text = ["%s %s" % (p["file"], p["what"]) if p["file"] else p["what"]
                for p in values["problems"]]
        return failed("%d problem(s) in %s: %s" % (len(text), venv, short_list(text, 4)),
                      values)
    interps = sorted({s["runs"] for s in values["scripts"] if s.get("runs")})
    py = values["python"]
    text = "%d scripts in bin/ (interpreters: %s); bin/python -> %s starts (Python %s, " \
           "sys.prefix is the venv)" % (len(values["scripts"]), short_list(interps, 3) or "none",
                                        py.get("resolves_to"), py.get("version"))
    if values["old"]:
        text += "; no file in bin/ names %s" % values["old"]
    else:
        text += "; old prefix not given: not searched"
    if values["pyvenv_cfg"]:
        text += "; home %s exists" % values["pyvenv_cfg"]["home"]
    else:
        text += "; no pyvenv.cfg (not a venv: home not checked)"
    return passed(text, values)


# ---------------------------------------------------------------------------------------------
# outside: references that leave the tree

FIXES = {
    "editable": "reinstall it without -e (pip install --no-deps --force-reinstall SRC), or "
                "bring SRC to the same path on the destination",
    "pth": "install that directory as a package, or move it into the venv and drop the line",
    "symlink": "replace the link with a copy of what it points to (cp -L), or make that path "
               "exist on the destination",
    "system_site_packages": "recreate the venv without --system-site-packages, or install the "
                            "same packages system-wide on the destination",
}


def _ref(kind: str, where: str, target: str, package: Optional[str] = None,
         fix: Optional[str] = None, **extra) -> Dict[str, Any]:
    out = {"kind": kind, "file": where, "target": target, "package": package,
           "fix": fix or FIXES[kind.split(":")[0]]}
    out.update(extra)
    return out


def _finder_mapping(data: bytes) -> Dict[str, List[str]]:
    """{name: [paths]} from a setuptools `__editable___*_finder.py` (MAPPING, NAMESPACES)."""
    out: Dict[str, List[str]] = {}
    try:
        tree = ast.parse(data.decode("utf-8", "replace"))
    except SyntaxError:
        return out
    for node in tree.body:
        targets = []
        if isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            value = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            targets = [node.target.id]
            value = node.value
        if not set(targets) & {"MAPPING", "NAMESPACES"} or value is None:
            continue
        try:
            literal = ast.literal_eval(value)
        except ValueError:
            continue
        if isinstance(literal, dict):
            for k, v in literal.items():
                paths = [v] if isinstance(v, str) else [p for p in v if isinstance(p, str)] \
                    if isinstance(v, (list, tuple)) else []
                out.setdefault(str(k), []).extend(paths)
    return out


def _editable_name(filename: str) -> str:
    """__editable___mypkg_1_0_finder.py -> mypkg 1.0 (as setuptools names it)."""
    stem = re.sub(r"^__editable__[._]*", "", filename)
    stem = re.sub(r"(_finder)?\.(py|pth)$", "", stem)
    m = re.match(r"^(.*?)_(\d+(?:_\d+)*.*)$", stem)
    return "%s %s" % (m.group(1), m.group(2).replace("_", ".")) if m else stem


def outside_refs(venv: str) -> List[Dict[str, Any]]:
    """Every reference from the venv to a path outside it: editable installs (finder mappings,
    __editable__ .pth files, direct_url.json with dir_info.editable), other .pth lines with
    paths outside, symbolic links leaving the tree, include-system-site-packages. The venv's
    own interpreter links (bin/python* into pyvenv.cfg's home) are not listed: they leave the
    tree by design and `relocation` checks them."""
    venv = os.path.abspath(venv)
    roots = [os.path.normpath(venv), os.path.realpath(venv)]
    refs: List[Dict[str, Any]] = []

    def outside(path: str) -> bool:
        return not venvfs.inside(os.path.normpath(path), roots) and \
            not venvfs.inside(os.path.realpath(path), roots)

    cfg = venvfs.pyvenv_cfg(venv) or {}
    home = cfg.get("home")
    if cfg.get("include-system-site-packages", "false").lower() == "true":
        refs.append(_ref("system_site_packages", "pyvenv.cfg", home or "?"))
    for site in venvfs.site_packages(venv):
        try:
            with os.scandir(site) as it:
                names = sorted(e.name for e in it if not e.is_symlink())  # links: below
        except OSError:
            continue
        for name in names:
            full = os.path.join(site, name)
            rel = os.path.relpath(full, venv)
            if name.startswith("__editable__") and name.endswith("finder.py"):
                data = venvfs.read_small(full) or b""
                for mod, paths in sorted(_finder_mapping(data).items()):
                    for p in paths:
                        if outside(p):
                            refs.append(_ref("editable", rel, p, _editable_name(name),
                                             module=mod))
            elif name.endswith(".pth"):
                data = venvfs.read_small(full) or b""
                editable = name.startswith("__editable__")
                for line in data.decode("utf-8", "replace").splitlines():
                    line = line.strip()
                    if not line or line.startswith(("#", "import ", "import\t")):
                        continue
                    target = line if os.path.isabs(line) else os.path.join(site, line)
                    if outside(target):
                        refs.append(_ref("editable" if editable else "pth", rel,
                                         os.path.normpath(target),
                                         _editable_name(name) if editable else None))
            elif name.endswith(".dist-info"):
                data = venvfs.read_small(os.path.join(full, "direct_url.json"), 1 << 20)
                if not data:
                    continue
                try:
                    doc = json.loads(data.decode("utf-8", "replace"))
                except ValueError:
                    continue
                url = doc.get("url", "") if isinstance(doc, dict) else ""
                editable = isinstance(doc, dict) and isinstance(doc.get("dir_info"), dict) \
                    and doc["dir_info"].get("editable") is True
                if editable and url.startswith("file://"):
                    target = unquote(urlparse(url).path)
                    if outside(target):
                        stem = name[: -len(".dist-info")]
                        refs.append(_ref("editable", os.path.join(rel, "direct_url.json"),
                                         target, " ".join(stem.split("-", 1))))
    interp_dirs = [d for d in (home,) if d]
    lookup = venvfs.link_lookup(venv)
    for top, entry in venvfs.walk(venv):
        if not entry.is_symlink():
            continue
        rel = os.path.relpath(entry.path, venv)
        try:
            text = os.readlink(entry.path)
        except OSError:
            continue
        if not links.leaves(rel, text, lookup, roots):
            continue
        target = os.path.normpath(os.path.join(top, text))
        if not outside(target):  # through a link (`x -> dot/..`): the lexical path lies
            target = os.path.realpath(entry.path)
        if (links.interpreter_link(rel)
                and (any(venvfs.inside(os.path.realpath(target), [os.path.realpath(d)])
                         or venvfs.inside(target, [d]) for d in interp_dirs)
                     or not interp_dirs)):
            continue  # the venv's interpreter: relocation checks it
        refs.append(_ref("symlink", rel, target, venvfs.owner(entry.path),
                         exists=os.path.exists(target)))
    # An editable seen through its finder, .pth and direct_url.json stays listed once per
    # file (each is a file to change); the same target twice in one file is listed once.
    seen = set()
    unique = []
    for r in refs:
        key = (r["kind"], r["file"], r["target"])
        if key not in seen:
            seen.add(key)
            unique.append(r)
    return unique


def outside_check(params: Dict[str, Any], ctx: Context):
    """Check: nothing in the venv points outside it (see `outside_refs`)."""
    venv = ctx.venv_or_prefix()
    if not os.path.isdir(venv):
        return failed("venv %s does not exist" % venv)
    refs = outside_refs(venv)
    values = {"venv": venv, "refs": refs,
              "targets": sorted({r["target"] for r in refs}),
              "packages": sorted({r["package"] for r in refs if r.get("package")})}
    if refs:
        described = ["%s %s -> %s" % (r["kind"], r["package"] or r["file"], r["target"])
                     for r in refs]
        kinds = sorted({r["kind"] for r in refs})
        return failed("%d reference(s) leave %s: %s; fix: %s" % (
            len(refs), venv, short_list(described, 4),
            " | ".join("%s: %s" % (k, FIXES[k]) for k in kinds)), values)
    return passed("nothing in %s points outside it (editable installs, .pth paths, "
                  "symbolic links, system site-packages)" % venv, values)
RB_PY_27ABEEEE
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
    p.add_argument("--driver-ptx-max",
                   help="newest PTX ISA the driver accepts, e.g. 9.0 ('none': do not check; "
                        "default: this host's driver)")
    p.add_argument("--driver-cuda", help="the driver's CUDA version, e.g. 12.8 (instead of "
                                         "--driver-ptx-max)")
    p.add_argument("--partial-ok", dest="partial_ok", action="append",
                   help="glob of files whose units may lack the target (vendor dispatch); "
                        "repeatable; replaces the default nvidia/*")
    p.add_argument("--no-partial-ok", action="store_true",
                   help="no file may have units without a path (partial_ok: [])")
    p.add_argument("--strict", action="store_true",
                   help="every unit counts, partial_ok ignored")
    _common(p)

    p = sub.add_parser("relocation", help="L0: a moved venv works where it lives")
    p.add_argument("venv")
    p.add_argument("--old", help="the prefix the venv was built at (searched for in bin/)")
    p.add_argument("--timeout-s", type=int, default=60,
                   help="bound on starting bin/python")
    _common(p)

    p = sub.add_parser("outside", help="L0: references from the venv to paths outside it")
    p.add_argument("venv")
    _common(p)

    p = sub.add_parser("preflight", help="source host, before a move: kernel_audit for the "
                                         "destination arch + outside (+ relocation with --old)")
    p.add_argument("--venv", required=True)
    p.add_argument("--arch", required=True, help="the destination's arch, e.g. sm_103")
    p.add_argument("--old", help="also run the relocation check with this old prefix")
    p.add_argument("--path", dest="paths", action="append",
                   help="audit only this path (relative to the venv); repeatable")
    p.add_argument("--driver-ptx-max", help="the destination driver's PTX ISA limit")
    p.add_argument("--driver-cuda", help="the destination driver's CUDA version, e.g. 13.0")
    p.add_argument("--partial-ok", dest="partial_ok", action="append")
    p.add_argument("--no-partial-ok", action="store_true")
    p.add_argument("--strict", action="store_true")

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
    p.add_argument("--venv", help="whose bin/ goes first in PATH (default: this "
                                  "interpreter's prefix)")
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
        ptx_max = args.driver_ptx_max
        if not ptx_max and args.driver_cuda:
            from . import driver

            limit = driver.ptx_max_for_cuda(args.driver_cuda)
            ptx_max = "%d.%d" % limit if limit else "none"
        params = {"arch": args.arch, "paths": args.paths, "driver_ptx_max": ptx_max,
                  "strict": args.strict or None,
                  "partial_ok": [] if args.no_partial_ok else args.partial_ok}
    elif c == "relocation":
        venv = os.path.abspath(args.venv)
        params = {"old": args.old, "timeout_s": args.timeout_s}
    elif c == "outside":
        venv = os.path.abspath(args.venv)
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
        venv = os.path.abspath(args.venv) if args.venv else None
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
        warned = _keep_warnings()
        try:
            config = _load_config(args.config_json)
            doc, _stopped = runner.run_config(config)
        except runner.ConfigError as exc:
            sys.stderr.write("error: %s\n" % exc)
            return EXIT_USAGE
        if warned:
            doc["warnings"] = warned
        report.write(args.report, doc)
        sys.stderr.write(report.table(doc["checks"]) + "\n" + report.summary_line(doc) + "\n")
        code = EXIT_FAIL if doc["summary"].get("fail") else EXIT_OK
        # The report is written. Leave without the interpreter's teardown: a stuck check's
        # thread (_stopped) would be waited for, and with torch loaded the teardown alone is a
        # noticeable part of the probe step, for nothing.
        _hard_exit(code)
    if args.command == "preflight":
        return _preflight(args)
    job = _standalone(args)
    entry = runner.run_check(job["check"], job["ctx"])
    sys.stdout.write(json.dumps(entry, indent=2, default=str) + "\n")
    code = EXIT_FAIL if entry["status"] == FAIL else EXIT_OK
    if entry["values"].get("timed_out"):
        _hard_exit(code)
    return code


def _keep_warnings() -> List[str]:
    """Python warnings the checked packages raise while they are imported and used (torch's
    `Failed to initialize NumPy`) are kept for the report (and the runbook's log), not printed
    among the checks' lines: they are the package's, not a verdict."""
    import warnings

    kept: List[str] = []

    def keep(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
             line: Optional[str] = None) -> None:
        kept.append(warnings.formatwarning(message, category, filename, lineno, line).strip())

    warnings.showwarning = keep
    return kept


def _preflight(args: argparse.Namespace) -> int:
    from . import preflight

    try:
        doc = preflight.run(args.venv, args.arch, args.old, args.driver_ptx_max,
                            args.driver_cuda, [] if args.no_partial_ok else args.partial_ok,
                            args.strict, args.paths)
    except ValueError as exc:
        sys.stderr.write("error: %s\n" % exc)
        return EXIT_USAGE
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    sys.stderr.write(report.table(doc["checks"]) + "\n")
    for p in doc["problems"]:
        sys.stderr.write("%s: %s%s: %s\n    fix: %s\n" % (
            p["check"], p["file"], " [%s]" % p["package"] if p.get("package") else "",
            p["what"], p["fix"]))
    return EXIT_OK if doc["ok"] else EXIT_FAIL


def _hard_exit(code: int) -> None:
    """Leave now, output flushed, without joining threads (a check stuck in a CUDA call, say)
    or running the interpreter's teardown."""
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
  cat >"${dir}"/rbprobes/decompress.py <<'RB_PY_2B375D53'
"""Decoding fatbin payloads: the LZ4 block and Zstandard decoders and the limits they work within
(rbprobes.fatbin reads the format and calls these on an entry's stored bytes). Stdlib only:
zstd through Python 3.14's compression.zstd, the zstandard module, or libzstd.so.1 by ctypes."""

from __future__ import annotations

import contextlib
import os
import time
from typing import List, Optional, Tuple

# Decoding payloads: only for units without a path to the target (are there kernels in them,
# and which?). The limits, all here, so that a few small entries that declare huge outputs cannot
# cost the source's preflight seconds and hundreds of MB (what they cost unbounded, and the
# largest real entries seen: docs/benchmarks.md, "Figures behind choices in the code"):
#  - ENTRY_CAP: one entry's decoded size, above the largest real entries seen; an entry that
#    declares more is not decoded.
#  - AUDIT_OUTPUT_BUDGET: decoded bytes for a whole audit run (every file, every worker).
#  - AUDIT_DEADLINE_S: seconds after the audit's start after which nothing more is decoded.
#  - FILE_INPUT_BUDGET: compressed bytes decoded per file (checks_static).
# Every decoder stops at the entry's declared size (more output is Unreadable: corrupt) and
# checks the deadline as it goes (every DECODE_CHUNK of output at most); an entry the budget,
# the deadline or the cap leaves undecoded is NotDecoded: its unit is not proven, never passed.
ENTRY_CAP = 128 << 20
AUDIT_OUTPUT_BUDGET = 2 << 30
AUDIT_DEADLINE_S = 60.0
FILE_INPUT_BUDGET = 64 << 20
DECODE_CHUNK = 4 << 20
_TOKEN = 1 << 20  # the run's output budget is shared as tokens of this many bytes


class Unreadable(ValueError):
    """A payload that cannot be decoded: corrupt, truncated, or larger than it says."""


class NotDecoded(Unreadable):
    """A payload left undecoded by a limit (ENTRY_CAP, the run's output budget or deadline):
    nothing is known of it, so what depends on it is not proven."""


def mib(n: int) -> str:
    return "%d MiB" % (n >> 20) if n >= 1 << 20 else "%d bytes" % n


class DecodeBudget:
    """What one audit run may decode: `output` bytes of decoded output in all, and nothing once
    `seconds` have passed since it was made. Shared by the run's forked workers: the bytes are
    tokens of _TOKEN bytes in a pipe (a read takes, a write gives back, both atomic), taken
    before an entry is decoded (its declared size) and the unused part given back after. A
    process keeps less than one token between entries. `close()` when the run is done."""

    def __init__(self, output: Optional[int] = None, seconds: Optional[float] = None):
        self.output = AUDIT_OUTPUT_BUDGET if output is None else output
        self.seconds = AUDIT_DEADLINE_S if seconds is None else seconds
        self.deadline = time.monotonic() + self.seconds
        output = self.output
        self._held = 0  # bytes this process took from the pipe and did not use yet
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        tokens = output // _TOKEN
        while tokens > 0:  # more than the pipe holds: only the first pipeful (64 GiB on Linux)
            try:
                tokens -= os.write(self._w, b"\0" * min(tokens, 1 << 16))
            except BlockingIOError:
                break
        os.set_blocking(self._w, False)

    def close(self) -> None:
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._r = self._w = -1

    def expired(self) -> Optional[str]:
        if time.monotonic() > self.deadline:
            return "the audit's decoding deadline (%g s) passed" % self.seconds
        return None

    def take(self, size: int) -> None:
        """Room for `size` decoded bytes, or NotDecoded (the deadline passed, the budget spent)."""
        why = self.expired()
        if why:
            raise NotDecoded("not decoded: %s" % why)
        need = -(-(size - self._held) // _TOKEN)
        got = 0
        while got < need:
            try:
                chunk = os.read(self._r, need - got)
            except (BlockingIOError, OSError):
                chunk = b""
            if not chunk:
                break
            got += len(chunk)
        if got < need:
            self._give(got)
            raise NotDecoded("not decoded: the audit's budget of %s of decoded output is spent "
                             "(this entry declares %s)" % (mib(self.output), mib(size)))
        self._held += got * _TOKEN

    def used(self, n: int) -> None:
        """`n` of the bytes taken were decoded; whole tokens not used go back to the pipe."""
        self._held = max(0, self._held - n)
        back = self._held // _TOKEN
        if back:
            self._held -= back * _TOKEN
            self._give(back)

    def _give(self, tokens: int) -> None:
        with contextlib.suppress(OSError):
            os.write(self._w, b"\0" * tokens)


def _past(deadline: Optional[float], produced: int):
    """Raise NotDecoded when the deadline passed (`produced` bytes were decoded by then)."""
    if deadline is not None and time.monotonic() > deadline:
        exc = NotDecoded("not decoded: the audit's decoding deadline passed")
        exc.produced = produced  # type: ignore[attr-defined]
        raise exc


def zstd_decompress(raw: bytes, limit: int, deadline: Optional[float] = None):
    """At most `limit` bytes out of one zstd frame, DECODE_CHUNK at a time (stopped at
    `deadline`, a time.monotonic() value); None when no decoder is available."""
    try:
        from compression import zstd  # type: ignore  # Python 3.14+
    except ImportError:
        zstd = None
    if zstd is not None:
        d = zstd.ZstdDecompressor()
        out = bytearray()
        data = raw
        try:
            while not d.eof:
                _past(deadline, len(out))
                out += d.decompress(data, max_length=min(DECODE_CHUNK, limit + 1 - len(out)))
                data = b""
                if len(out) > limit:
                    raise Unreadable("zstd output exceeds the declared %d bytes" % limit)
                if d.needs_input and not d.eof:
                    raise Unreadable("truncated zstd frame")
        except zstd.ZstdError as exc:
            raise Unreadable("zstd: %s" % exc) from None
        return out
    try:
        import zstandard  # type: ignore
    except ImportError:
        zstandard = None
    if zstandard is not None:
        out = bytearray()
        try:
            declared = zstandard.frame_content_size(raw)
            if declared > limit:
                raise Unreadable("zstd frame declares %d bytes, the entry %d" % (declared, limit))
            with zstandard.ZstdDecompressor().stream_reader(raw) as reader:
                while True:
                    _past(deadline, len(out))
                    chunk = reader.read(min(DECODE_CHUNK, limit + 1 - len(out)))
                    if not chunk:
                        break
                    out += chunk
                    if len(out) > limit:
                        raise Unreadable("zstd output exceeds the declared %d bytes" % limit)
        except zstandard.ZstdError as exc:
            raise Unreadable("zstd: %s" % exc) from None
        if 0 <= declared != len(out):  # the reader ends quietly where the input does
            raise Unreadable("truncated zstd frame")
        return out
    lib = _libzstd()
    if lib is None:
        return None
    return _libzstd_stream(lib, raw, limit, deadline)


def _libzstd_stream(lib, raw: bytes, limit: int, deadline: Optional[float]) -> bytearray:
    """One zstd frame through libzstd's streaming API, straight into the bytearray it returns
    (as large as the frame declares, plus one byte to see more; grown a chunk at a time when it
    does not say), DECODE_CHUNK of output per call."""
    import ctypes

    declared = lib.ZSTD_getFrameContentSize(raw, len(raw))
    known = declared < (1 << 64) - 2  # not UNKNOWN (-1) nor ERROR (-2)
    if known and declared > limit:
        raise Unreadable("zstd frame declares %d bytes, the entry %d" % (declared, limit))
    most = declared if known else limit
    out = bytearray((declared if known else min(DECODE_CHUNK, limit)) + 1)
    pos = 0
    src = ctypes.c_char_p(raw)  # raw's own bytes, not a copy
    inb = _ZstdIn(ctypes.cast(src, ctypes.c_void_p), len(raw), 0)
    ds = lib.ZSTD_createDStream()
    if not ds:
        raise MemoryError("ZSTD_createDStream")
    try:
        lib.ZSTD_initDStream(ds)
        while True:
            _past(deadline, pos)
            if pos == len(out):  # a frame that does not say its size: room for a chunk more
                out.extend(bytes(min(DECODE_CHUNK, most + 1 - pos)))
            view = (ctypes.c_char * (len(out) - pos)).from_buffer(out, pos)
            outb = _ZstdOut(ctypes.addressof(view), min(DECODE_CHUNK, len(out) - pos), 0)
            ret = lib.ZSTD_decompressStream(ds, ctypes.byref(outb), ctypes.byref(inb))
            del view
            if lib.ZSTD_isError(ret):
                raise Unreadable("zstd: %s" % lib.ZSTD_getErrorName(ret).decode("ascii",
                                                                                "replace"))
            pos += outb.pos
            if pos > most:
                raise Unreadable("zstd output exceeds the declared %d bytes" % most)
            if ret == 0:
                break
            if inb.pos == inb.size and outb.pos < outb.size:
                raise Unreadable("truncated zstd frame")
    finally:
        lib.ZSTD_freeDStream(ds)
    del out[pos:]
    return out


_LIBZSTD: List[object] = []


def _zstd_types():
    import ctypes

    class _In(ctypes.Structure):
        _fields_ = [("src", ctypes.c_void_p), ("size", ctypes.c_size_t),
                    ("pos", ctypes.c_size_t)]

    class _Out(ctypes.Structure):
        _fields_ = [("dst", ctypes.c_void_p), ("size", ctypes.c_size_t),
                    ("pos", ctypes.c_size_t)]

    return _In, _Out


def _libzstd():
    """libzstd.so.1 through ctypes (present on most Linux hosts), or None."""
    global _ZstdIn, _ZstdOut
    if not _LIBZSTD:
        lib = None
        try:
            import ctypes

            lib = ctypes.CDLL("libzstd.so.1")
            size_t, vp = ctypes.c_size_t, ctypes.c_void_p
            lib.ZSTD_isError.restype = ctypes.c_uint
            lib.ZSTD_isError.argtypes = [size_t]
            lib.ZSTD_getErrorName.restype = ctypes.c_char_p
            lib.ZSTD_getErrorName.argtypes = [size_t]
            lib.ZSTD_getFrameContentSize.restype = ctypes.c_ulonglong
            lib.ZSTD_getFrameContentSize.argtypes = [ctypes.c_char_p, size_t]
            lib.ZSTD_createDStream.restype = vp
            lib.ZSTD_createDStream.argtypes = []
            lib.ZSTD_initDStream.restype = size_t
            lib.ZSTD_initDStream.argtypes = [vp]
            lib.ZSTD_freeDStream.restype = size_t
            lib.ZSTD_freeDStream.argtypes = [vp]
            _ZstdIn, _ZstdOut = _zstd_types()
            lib.ZSTD_decompressStream.restype = size_t
            lib.ZSTD_decompressStream.argtypes = [vp, ctypes.POINTER(_ZstdOut),
                                                  ctypes.POINTER(_ZstdIn)]
        except (OSError, AttributeError):
            lib = None
        _LIBZSTD.append(lib)
    return _LIBZSTD[0]


_ZstdIn = _ZstdOut = None


def zstd_decoder() -> Optional[str]:
    """Which zstd decoder this host has ("compression.zstd", "zstandard", "libzstd"), or None."""
    try:
        from compression import zstd  # type: ignore  # noqa: F401

        return "compression.zstd"
    except ImportError:
        pass
    try:
        import zstandard  # type: ignore  # noqa: F401

        return "zstandard"
    except ImportError:
        pass
    return "libzstd" if _libzstd() is not None else None


def _lz4_length(src: bytes, i: int, length: int, room: int) -> Tuple[int, int]:
    """A 4-bit length of 15 continues in bytes of 255 until one is smaller. `room`: the output
    left; a longer length is refused as soon as it is seen."""
    if length != 15:
        return length, i
    n = len(src)
    while True:
        if i >= n:
            raise Unreadable("truncated LZ4 block: a length runs past the input")
        extra = src[i]
        i += 1
        length += extra
        if length > room:
            raise Unreadable("LZ4 output exceeds the declared size")
        if extra != 255:
            return length, i


def lz4_block_decompress(src: bytes, size: int, deadline: Optional[float] = None) -> bytearray:
    """Decode one LZ4 block (the format of flag 0x2000) into at most `size` bytes (the entry's
    declared uncompressed size). Raises Unreadable for output past `size`, a match before the
    start of the output, or input that ends in the middle of a sequence; NotDecoded once
    `deadline` (a time.monotonic() value) has passed, checked every 1024 sequences and every
    DECODE_CHUNK of a long match."""
    if size > ENTRY_CAP:
        raise NotDecoded("not decoded: declared size %d exceeds the %d-byte cap for one entry"
                         % (size, ENTRY_CAP))
    dst = bytearray()
    try:
        _lz4_into(dst, src, size, deadline)
    except Unreadable as exc:
        exc.produced = len(dst)  # type: ignore[attr-defined]
        raise
    return dst


def _lz4_into(dst: bytearray, src: bytes, size: int, deadline: Optional[float]) -> None:
    i, n = 0, len(src)
    steps = 0
    while i < n:
        steps += 1
        if deadline is not None and not steps & 1023:
            _past(deadline, len(dst))
        token = src[i]
        i += 1
        length, i = _lz4_length(src, i, token >> 4, size - len(dst))
        if i + length > n:
            raise Unreadable("truncated LZ4 block: %d literal bytes past the input" % (
                i + length - n))
        if len(dst) + length > size:
            raise Unreadable("LZ4 output exceeds the declared %d bytes" % size)
        dst += src[i:i + length]
        i += length
        if i >= n or len(dst) == size:
            break  # the last sequence has literals only
        if i + 2 > n:
            raise Unreadable("truncated LZ4 block: no room for a match offset")
        offset = src[i] | (src[i + 1] << 8)
        i += 2
        if offset == 0 or offset > len(dst):
            raise Unreadable("corrupt LZ4 block: match offset %d at output %d"
                             % (offset, len(dst)))
        length, i = _lz4_length(src, i, token & 15, size - len(dst))
        length += 4
        if len(dst) + length > size:
            raise Unreadable("LZ4 output exceeds the declared %d bytes" % size)
        start = len(dst) - offset
        if offset >= length:
            dst += dst[start:start + length]
            continue
        # overlapping: the last `offset` bytes repeat. Appended a block of whole periods at a
        # time (at most about DECODE_CHUNK), so a long match costs no more memory than that
        # and the deadline is looked at between blocks.
        period = bytes(dst[start:])
        block = period * (min(length, DECODE_CHUNK) // offset + 1)
        while length > len(block):
            _past(deadline, len(dst))
            dst += block
            length -= len(block)
        dst += block[:length]
RB_PY_2B375D53
  cat >"${dir}"/rbprobes/driver.py <<'RB_PY_FD5DB10E'
"""The NVIDIA driver on this host: its version, the CUDA version it supports, and from that the
newest PTX ISA its JIT compiler accepts.

Read, in this order: libcuda's `cuDriverGetVersion` (exact: 13000 is CUDA 13.0; also what a
forward-compatibility libcuda on LD_LIBRARY_PATH reports), else the kernel driver's version
(`/proc/driver/nvidia/version`, else `nvidia-smi`) through DRIVER_TO_CUDA. No GPU and no
torch are needed; a host without a driver gives None.
"""

from __future__ import annotations

import subprocess
from typing import Dict, NamedTuple, Optional, Tuple

from . import arch

# The first Linux driver of each CUDA release (CUDA release notes, "CUDA Toolkit and
# Corresponding Driver Versions"): a driver at least this new supports that CUDA version.
DRIVER_TO_CUDA = [
    ("590.44.01", "13.1"),
    ("580.65.06", "13.0"),
    ("575.51.03", "12.9"),
    ("570.26", "12.8"),
    ("565.57.01", "12.7"),  # the 565 branch reports CUDA 12.7 (no 12.7 toolkit was released)
    ("560.28.03", "12.6"),
    ("555.42.02", "12.5"),
    ("550.54.14", "12.4"),
    ("545.23.06", "12.3"),
    ("535.54.03", "12.2"),
    ("530.30.02", "12.1"),
    ("525.60.13", "12.0"),
    ("520.61.05", "11.8"),
    ("515.43.04", "11.7"),
    ("510.39.01", "11.6"),
    ("495.29.05", "11.5"),
    ("470.42.01", "11.4"),
    ("465.19.01", "11.3"),
    ("460.27.03", "11.2"),
    ("455.23", "11.1"),
    ("450.36.06", "11.0"),
]


def _tuple(text: str) -> Tuple[int, ...]:
    return tuple(int(p) for p in text.strip().split(".") if p.isdigit())


def cuda_for_driver(version: str) -> Optional[str]:
    """"580.159.04" -> "13.0"; None for a driver older than CUDA 11.0 or not a version."""
    try:
        have = _tuple(version)
    except ValueError:
        return None
    if not have:
        return None
    have = have + (0,) * (3 - len(have))
    for first, cuda in DRIVER_TO_CUDA:
        if have >= _tuple(first):
            return cuda
    return None


def ptx_max_for_cuda(cuda: str) -> Optional[Tuple[int, int]]:
    """The newest PTX ISA a CUDA version's JIT accepts ("13.0" -> (9, 0), "12.6" -> (8, 5));
    None when the version is newer than the table (then it accepts at least the newest ISA
    listed, and anything newer is unknown here) or older than all of it."""
    want = arch.parse_version(cuda)
    newest_cuda = max(arch.parse_version(c) for c in arch.PTX_ISA_TO_CUDA.values())
    if want > newest_cuda:
        return None
    best = None
    for isa, first in sorted(arch.PTX_ISA_TO_CUDA.items()):
        if arch.parse_version(first) <= want:
            best = isa
    return best


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


class HostDriver(NamedTuple):
    version: Optional[str]  # kernel driver, "580.159.04"
    cuda: Optional[str]  # CUDA version it supports, "13.0"
    cuda_source: Optional[str]  # "libcuda" or "driver version table"
    ptx_max: Optional[Tuple[int, int]]  # newest PTX ISA its JIT accepts

    def describe(self) -> str:
        if not self.cuda:
            return "no NVIDIA driver found on this host"
        text = "driver %s, CUDA %s (%s)" % (self.version or "?", self.cuda, self.cuda_source)
        if self.ptx_max:
            text += ", JIT accepts PTX ISA <= %d.%d" % self.ptx_max
        else:
            text += ", newest PTX ISA it accepts not in the table"
        return text

    def as_dict(self) -> Dict[str, object]:
        return {"version": self.version, "cuda": self.cuda, "cuda_source": self.cuda_source,
                "ptx_max": "%d.%d" % self.ptx_max if self.ptx_max else None}


def host_driver() -> HostDriver:
    """What this host's driver supports (all None without a driver)."""
    version = driver_version()
    cuda = driver_cuda_version()
    source = "libcuda" if cuda else None
    if cuda is None and version:
        cuda = cuda_for_driver(version)
        source = "driver version table" if cuda else None
    return HostDriver(version, cuda, source, ptx_max_for_cuda(cuda) if cuda else None)


def cuda_device_count() -> Tuple[Optional[int], str]:
    """(devices, how it was found) through libcuda (cuInit, cuDeviceGetCount) without torch;
    (None, why) when libcuda is missing or cuInit fails."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return None, "libcuda.so.1 cannot be loaded (%s)" % exc
    try:
        rc = lib.cuInit(0)
        if rc != 0:
            return None, "cuInit failed with CUDA error %d" % rc
        count = ctypes.c_int(0)
        rc = lib.cuDeviceGetCount(ctypes.byref(count))
        if rc != 0:
            return None, "cuDeviceGetCount failed with CUDA error %d" % rc
    except AttributeError as exc:
        return None, "libcuda.so.1 lacks %s" % exc
    return count.value, "libcuda cuDeviceGetCount"
RB_PY_FD5DB10E
  cat >"${dir}"/rbprobes/elf.py <<'RB_PY_489C7406'
"""Just enough ELF to find sections, the soname and a cubin's kernels, read with struct.

Works on a bytes-like buffer (an mmap of the file, so a 1 GB library is not read into memory).
Little-endian ELF32 and ELF64; anything else is reported as "not ELF" by returning None. An image
that has the magic but cannot be read (a section table outside the file, a truncated header, a
section name table that is not there) raises ElfError: it is unreadable, not "no GPU code".
"""

from __future__ import annotations

import struct
from typing import Dict, List, NamedTuple, Optional

MAGIC = b"\x7fELF"
EM_CUDA = 190
SHT_PROGBITS = 1
SHT_SYMTAB = 2
SHT_STRTAB = 3
SHT_NOBITS = 8
SHT_DYNAMIC = 6
DT_NULL = 0
DT_SONAME = 14
STT_FUNC = 2
STO_CUDA_ENTRY = 0x10  # st_other bit nvcc sets on a kernel's symbol in a cubin
SHN_XINDEX = 0xFFFF


class ElfError(ValueError):
    """An ELF image (it has the magic) whose header or section table cannot be read."""


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
    type: int  # e_type: 1 relocatable, 2 executable, 3 shared object
    machine: int
    osabi: int
    abiversion: int
    flags: int  # e_flags
    sections: List[Section]


def parse(buf) -> Optional[Elf]:
    """The header and section table of the ELF image in `buf`; None if it is not a
    little-endian ELF32/ELF64. Raises ElfError when it is one but cannot be read."""
    if len(buf) < 4 or bytes(buf[:4]) != MAGIC:
        return None
    if len(buf) < 52:
        raise ElfError("truncated ELF header (%d bytes)" % len(buf))
    ei_class, ei_data = buf[4], buf[5]
    if ei_data != 1 or ei_class not in (1, 2):
        return None
    osabi, abiversion = buf[7], buf[8]
    if ei_class == 2:
        if len(buf) < 64:
            raise ElfError("truncated ELF64 header (%d bytes)" % len(buf))
        e_type, machine = struct.unpack_from("<HH", buf, 16)
        shoff, flags = struct.unpack_from("<QI", buf, 40)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", buf, 58)
        fmt = "<IIQQQQIIQQ"
    else:
        e_type, machine = struct.unpack_from("<HH", buf, 16)
        shoff, flags = struct.unpack_from("<II", buf, 32)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", buf, 46)
        fmt = "<IIIIIIIIII"
    raw = []
    if shoff:
        if shentsize < struct.calcsize(fmt):
            raise ElfError("section header size %d is too small" % shentsize)
        if shoff + shentsize > len(buf):
            raise ElfError("section table at offset %d lies outside the file (%d bytes): "
                           "truncated?" % (shoff, len(buf)))
        first = struct.unpack_from(fmt, buf, shoff)
        if shnum == 0:  # more than 0xff00 sections: the count is in section 0's sh_size
            shnum = first[5]
        if shstrndx == SHN_XINDEX:
            shstrndx = first[6]
        if shoff + shnum * shentsize > len(buf):
            raise ElfError("section table (%d entries at offset %d) runs past the end of the "
                           "file (%d bytes): truncated?" % (shnum, shoff, len(buf)))
        for i in range(shnum):
            (sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, _info, _align,
             _entsize) = struct.unpack_from(fmt, buf, shoff + i * shentsize)
            raw.append((sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link))
    names = b""
    if raw:
        if not 0 <= shstrndx < len(raw):
            raise ElfError("section name table index %d is not a section" % shstrndx)
        _n, _t, _f, _a, off, size, _l = raw[shstrndx]
        if off + size > len(buf):
            raise ElfError("section name table lies outside the file: truncated?")
        names = bytes(buf[off:off + size])
    sections = []
    for sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link in raw:
        end = names.find(b"\0", sh_name)
        name = names[sh_name:end if end >= 0 else len(names)].decode("latin-1")
        sections.append(Section(name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link))
    bits = 64 if ei_class == 2 else 32
    return Elf(bits, e_type, machine, osabi, abiversion, flags, sections)


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


def kernels(buf, image: Elf) -> List[str]:
    """The kernels of a cubin: global functions marked STO_CUDA_ENTRY in `.symtab`, in symbol
    order; without a symbol table, the names of its `.text.NAME` sections."""
    found: List[str] = []
    for sec in image.sections:
        if sec.type != SHT_SYMTAB or not (0 <= sec.link < len(image.sections)):
            continue
        data = section_bytes(buf, sec)
        strs = section_bytes(buf, image.sections[sec.link])
        step = 24 if image.bits == 64 else 16
        for pos in range(0, len(data) - step + 1, step):
            if image.bits == 64:
                st_name, st_info, st_other = struct.unpack_from("<IBB", data, pos)
            else:
                (st_name,) = struct.unpack_from("<I", data, pos)
                st_info, st_other = data[pos + 12], data[pos + 13]
            if st_info & 0xF == STT_FUNC and st_other & STO_CUDA_ENTRY:
                end = strs.find(b"\0", st_name)
                name = strs[st_name:end if end >= 0 else len(strs)].decode("latin-1")
                if name and name not in found:
                    found.append(name)
    if found:
        return found
    return [sec.name[len(".text."):] for sec in image.sections if sec.name.startswith(".text.")]
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
  they are one module (see `Scan.units`).

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

import contextlib
import mmap
import os
import re
import stat
import struct
from typing import Dict, List, NamedTuple, Optional, Tuple

from . import arch, decompress, elf
from .decompress import DecodeBudget, NotDecoded, Unreadable

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
# cuLibraryLoadData; libcufft keeps most of its containers in .ldata, see docs/probes.md).
# Searched only in files that have one of the sections above.
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
    size: int  # uncompressed size: the header's declared size when compressed (0: not given),
    #            else the (padded) payload size

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

    @property
    def label(self) -> str:
        """Where it is: `.nv_fatbin+0x8e990` (the file offset of its header)."""
        return "%s+0x%x" % (self.section, self.offset)


class Scan(NamedTuple):
    """What one file holds: its containers (runtime and relocatable) and wrapper count."""

    path: str
    kind: str  # "elf", "cubin", "fatbin", "not-elf", "not-regular", "error"
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
    def units(self) -> List[List[Container]]:
        """What is judged on its own: each registered container (one translation unit, or one
        device link), and all embedded containers together (the library picks among them).

        nvcc 13 registers, for a non-rdc `-shared` build, one container per translation unit
        (version-1 wrapper, the unit's SASS and PTX) and a kernel-free device-linked one
        (version-2 wrapper); the runtime loads each as a module of its own, so a unit built for
        other archs fails to launch even when its neighbour has the target's code. With -rdc
        the device-linked container (version 2) holds every unit's kernels as SASS for the
        link's archs only, and the units' relocatable code sits in `__nv_relfatbin` (version-1
        wrappers): when the linked SASS does not fit, the runtime falls back to those units,
        each on its own (seen on the H200), so such a unit is [linked container] + those
        relocatable containers (`linked_group`; checks_static.judged_units splits it)."""
        embedded = self.embedded_containers
        rt = self.runtime_containers
        rdc = [c for c in self.containers
               if c.section == RELOCATABLE_SECTION and c.wrapper == 1 and c not in rt]
        units = [[c] + rdc if c.wrapper == 2 and rdc else [c] for c in rt]
        return units + ([embedded] if embedded else [])

    @property
    def entries(self) -> List[Entry]:
        return [e for c in self.containers for e in c.entries]


def linked_group(unit: List[Container]) -> bool:
    """A device-linked container followed by the relocatable units it was linked from."""
    return (len(unit) > 1 and unit[0].wrapper == 2
            and all(c.section == RELOCATABLE_SECTION for c in unit[1:]))


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
    found by searching data sections) rejects any entry that is not PTX, ELF or LTO-IR of
    version 0x0101, so random bytes that happen to hold the magic are not taken for code."""
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
        if comp and compressed > size:
            return entries, ("entry at offset %d: compressed size %d exceeds its payload of %d"
                             % (pos, compressed, size))
        entries.append(Entry(
            kind, number, _suffix(flags), (major, minor), flags, comp, pos + hsize,
            compressed if comp and compressed else size, usize if comp else size))
        pos += hsize + size
    if pos != end and end - pos >= 8 and any(bytes(buf[pos:end])):
        return entries, "%d stray bytes after the last entry at offset %d" % (end - pos, pos)
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


_FATBIN_SECTIONS = (RUNTIME_SECTION, RELOCATABLE_SECTION, WRAPPER_SECTION)
NO_SECTION_TABLE = "<no section table>"


def scan_buffer(buf, path: str = "<buffer>", embedded: bool = True) -> Scan:
    """Scan an in-memory image (ELF shared object or object, cubin, or a raw fatbin).
    `embedded`: also search the data sections of a file with GPU code (EMBEDDED_PREFIXES).
    Raises elf.ElfError for an ELF image whose section table cannot be read."""
    if bytes(buf[:4]) == _MAGIC_BYTES:
        return Scan(path, "fatbin", parse_containers(buf, 0, len(buf), "<fatbin>"), 0, None)
    image = elf.parse(buf)
    if image is None:
        return Scan(path, "not-elf", [], 0, None)
    if image.machine == elf.EM_CUDA:
        entry = _cubin_entry(buf, image)
        return Scan(path, "cubin", [Container("<cubin>", 0, [entry], None)], 0, None)
    if not image.sections:
        # A stripped image without section headers (sstrip): the runtime still registers
        # its fatbins (the registration code holds their addresses), so search all of it.
        found = parse_containers(buf, 0, len(buf), NO_SECTION_TABLE, strict=True)
        return Scan(path, "elf", found, 0, None)
    containers: List[Container] = []
    versions: Dict[int, int] = {}  # container file offset -> wrapper version
    wrappers = 0
    for sec in image.sections:
        if sec.name not in _FATBIN_SECTIONS or sec.type == elf.SHT_NOBITS:
            continue
        if not elf.in_file(buf, sec):
            containers.append(Container(sec.name, sec.offset, [], (
                "section %s (%d bytes at offset %d) lies outside the file (%d bytes): truncated?"
                % (sec.name, sec.size, sec.offset, len(buf)))))
        elif sec.name in (RUNTIME_SECTION, RELOCATABLE_SECTION):
            containers.extend(parse_containers(buf, sec.offset, sec.offset + sec.size, sec.name))
        else:
            for magic, version, data in _wrappers(buf, sec):
                wrappers += magic == WRAPPER_MAGIC
                where = elf.file_offset(image, data) if magic == WRAPPER_MAGIC and data else None
                if where is not None:
                    versions[where] = version
    containers = [c._replace(wrapper=versions.get(c.offset)) for c in containers]
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


def scan_file(path: str, embedded: bool = True, follow: bool = False) -> Scan:
    """Scan one file through a read-only mmap (never reads a big library into memory). Only a
    regular file is read: the open does not block (a FIFO named `x.so` must not hang the
    audit) and, unless `follow`, does not follow a symbolic link."""
    with mapped(path, embedded, follow) as (scan, _buf):
        return scan


@contextlib.contextmanager
def mapped(path: str, embedded: bool = True, follow: bool = False):
    """`with mapped(path) as (scan, buf)`: scan_file, with the file's read-only mmap kept open
    for decoding payloads (buf is None when nothing was mapped)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        yield Scan(path, "error", [], 0, "%s: %s" % (type(exc).__name__, exc.strerror or exc)), None
        return
    mm = None
    try:
        scan = None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                scan = Scan(path, "not-regular", [], 0, None)
            elif st.st_size < 16 or os.pread(fd, 4, 0) not in (elf.MAGIC, _MAGIC_BYTES):
                scan = Scan(path, "not-elf", [], 0, None)
            else:
                mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                scan = scan_buffer(mm, path, embedded)
        except (OSError, ValueError) as exc:  # elf.ElfError is a ValueError
            scan = Scan(path, "error", [], 0, "%s: %s" % (type(exc).__name__, exc))
        yield scan, mm
    finally:
        if mm is not None:
            mm.close()
        os.close(fd)


def _limit(entry: Entry) -> int:
    if entry.compression and entry.size <= 0:
        raise Unreadable("%s entry declares no uncompressed size" % entry.compression)
    if entry.size > decompress.ENTRY_CAP:
        raise NotDecoded("not decoded: declares %d decoded bytes, more than the cap for one "
                         "entry (%s; the largest real entry seen has 71 MB)"
                         % (entry.size, decompress.mib(decompress.ENTRY_CAP)))
    return entry.size


def payload(buf, entry: Entry, budget: Optional[DecodeBudget] = None):
    """The entry's code (bytes, or a bytearray when it was decompressed); None when it is
    Zstandard-compressed and no zstd decoder (Python 3.14's compression.zstd, the zstandard
    module, or libzstd.so.1 through ctypes) is available. Raises Unreadable for a payload that
    does not decode within its declared size, NotDecoded for one a limit left undecoded (the
    entry cap; with `budget`, the run's output budget and deadline)."""
    end = entry.payload_offset + entry.stored_size
    if end > len(buf):
        raise Unreadable("payload runs past the end of the data")
    if entry.compression is None:
        return bytes(buf[entry.payload_offset:end])
    limit = _limit(entry)
    raw = bytes(buf[entry.payload_offset:end])
    deadline = None
    if budget is not None:
        budget.take(limit)
        deadline = budget.deadline
    out = None
    produced = limit
    try:
        if entry.compression == "lz4":
            out = decompress.lz4_block_decompress(raw, limit, deadline)
        elif not raw.startswith(_ZSTD_MAGIC):
            raise Unreadable("entry is flagged zstd but its payload has no zstd frame magic")
        elif deadline is None:
            out = decompress.zstd_decompress(raw, limit)
        else:
            out = decompress.zstd_decompress(raw, limit, deadline)
        produced = len(out) if out is not None else 0
        return out
    except Unreadable as exc:
        produced = getattr(exc, "produced", limit)
        raise
    finally:
        if budget is not None:
            budget.used(produced)


_PTX_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$%][\w$]*)")


def entry_kernels(buf, entry: Entry, run: Optional[DecodeBudget] = None) -> Optional[List[str]]:
    """The kernels of a SASS or PTX entry (a cubin's STO_CUDA_ENTRY symbols, PTX `.entry`
    names); [] for code without any kernel; None when it cannot be decoded here (zstd without a
    decoder). Raises Unreadable for a payload that does not decode or is not a cubin, NotDecoded
    for one a limit left undecoded (`run`: the audit run's budget and deadline)."""
    data = payload(buf, entry, run)
    if data is None:
        return None
    if entry.kind == "ptx":
        found = []
        for m in _PTX_ENTRY.finditer(data):
            name = m.group(1).decode("latin-1")
            if name not in found:
                found.append(name)
        return found
    try:
        image = elf.parse(data)
    except elf.ElfError as exc:
        raise Unreadable("cubin: %s" % exc) from None
    if image is None or image.machine != elf.EM_CUDA:
        raise Unreadable("payload of a SASS entry is not a CUDA ELF image")
    return elf.kernels(data, image)


class UnitKernels(NamedTuple):
    names: List[str]  # kernels found (mangled names as the symbol table has them)
    complete: bool  # every container with code was decoded: `names == []` means kernel-free
    error: Optional[str]  # a payload that is corrupt (the unit is unreadable)
    undecoded: str  # why some container was not decoded ("" when complete)
    limited: bool = False  # a limit (budget, deadline, cap) left it undecoded: not proven

    @property
    def kernel_free(self) -> bool:
        return self.complete and not self.names and not self.error


def unit_kernels(buf, unit: List[Container], budget: Optional[List[int]] = None,
                 run: Optional[DecodeBudget] = None) -> UnitKernels:
    """The kernels of a unit, read from the cheapest code entry of each container that decodes
    here (all entries of one container hold the same kernels, compiled for other archs).
    `budget`: [bytes] of compressed input still allowed to be decoded (shared across calls);
    a container past it is left undecoded. `run`: the audit run's output budget and deadline
    (DecodeBudget); an entry past them, or over ENTRY_CAP, is left undecoded (`limited`)."""
    order = {None: 0, "lz4": 1, "zstd": 2}
    names: List[str] = []
    undecoded = ""
    limited = False
    for c in unit:
        code = sorted((e for e in c.entries if e.kind in ("sass", "ptx")),
                      key=lambda e: (order.get(e.compression, 3), e.stored_size))
        if not code:
            continue
        done = False
        why = ""
        capped = False
        for e in code:
            if budget is not None and budget[0] < e.stored_size:
                why = ("%s %s: not decoded: the file's budget of %s of compressed input is "
                       "spent" % (c.label, e.name, decompress.mib(decompress.FILE_INPUT_BUDGET)))
                capped = True
                break
            try:
                found = entry_kernels(buf, e, run)
            except NotDecoded as exc:
                why = "%s %s: %s" % (c.label, e.name, exc)
                capped = True
                continue  # another entry of the container may be within the limits
            except Unreadable as exc:
                return UnitKernels(names, False, "%s %s: %s" % (c.label, e.name, exc), "")
            if budget is not None:
                budget[0] -= e.stored_size
            if found is None:
                why = why or "zstd payload and no zstd decoder here"
                continue
            names.extend(k for k in found if k not in names)
            done = True
            break
        if not done:
            undecoded = undecoded or why or "no decodable entry"
            limited = limited or capped
    return UnitKernels(names, not undecoded, None, undecoded, limited)


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
JSON line as its last line of output. The check's preconditions are found here, in a fresh
process, not in the probe's: `unavailable` (torch or a CUDA device missing, need_cuda's words),
`no_nccl` (a torch build without NCCL), `device_count` (torch's; the check started one worker
per device libcuda counted, and a worker whose torch counts otherwise stops before NCCL).
"""

from __future__ import annotations

import datetime
import json
import sys
import time

from .proc import apply_safe_env
from .result import Unavailable


def main(argv) -> int:
    rank, world, store, elements, timeout_s = (int(argv[0]), int(argv[1]), argv[2],
                                               int(argv[3]), int(argv[4]))
    apply_safe_env()
    out = {"rank": rank, "ok": False}
    try:
        from .checks_runtime import need_cuda

        try:
            torch = need_cuda()
        except Unavailable as exc:
            out["unavailable"] = exc.reason
            print(json.dumps(out), flush=True)
            return 1
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_nccl_available():
            out["no_nccl"] = "this torch build has no NCCL backend (torch %s)" % torch.__version__
            print(json.dumps(out), flush=True)
            return 1
        out["device_count"] = torch.cuda.device_count()
        if out["device_count"] != world:
            out["error"] = "torch sees %d device(s), the check started %d worker(s)" % (
                out["device_count"], world)
            print(json.dumps(out), flush=True)
            return 1
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
  cat >"${dir}"/rbprobes/preflight.py <<'RB_PY_41200470'
"""Preflight on the SOURCE host, before anything is sent: will this venv's GPU code run on the
destination's arch (kernel_audit), and does the venv reach outside itself (outside)? With
`old`, also the relocation proof of a tree (run it on a moved copy).

    python -m rbprobes preflight --venv V --arch sm_103 [--old OLD] [--driver-cuda 12.8]

One JSON document on stdout (schema 1, kind "preflight"; docs/probes.md), exit 0 when nothing
failed, 1 otherwise (the problems name the files and packages), 2 on usage errors. The local
driver is never read: it is not the destination's. Give the destination's driver CUDA version
(or PTX ISA limit) to hold PTX-only code against it.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional

from . import arch, checks_static, checks_venv, driver, report
from .checks import CHECKS
from .result import FAIL, PASS, Outcome

SCHEMA = 1


def _entry(check_type: str, outcome: Outcome, started: float) -> Dict[str, Any]:
    return report.result(check_type, check_type, CHECKS[check_type].level, outcome.status,
                         outcome.reason, outcome.values, time.monotonic() - started)


def _audit_problems(values: Dict[str, Any]) -> List[Dict[str, Any]]:
    out = []
    for p in values.get("missing_paths", []):
        out.append({"check": "kernel_audit", "file": p, "package": None,
                    "what": "path to audit does not exist", "fix": "fix the spec's paths"})
    for f in values["files"]:
        if not f.get("fails"):
            continue
        what = "; ".join(f.get("problems", []))
        missing = f.get("missing") or []
        kernels = sorted({k for m in missing for k in (m.get("kernels") or [])})
        num = values["target"].split("_", 1)[1]
        fix = ("rebuild it with code for %s (-gencode arch=compute_%s,code=sm_%s, or PTX "
               "the destination's driver can JIT), or install a build of the package that "
               "has it" % (values["target"], num, num))
        if f.get("verdict") == "unreadable" or f.get("unreadable"):
            fix = "reinstall the package (the file is damaged or truncated)"
        item = {"check": "kernel_audit", "file": f["path"], "package": f.get("package"),
                "what": what, "fix": fix}
        if missing:
            item["units"] = [{"unit": m["unit"], "archs": m["archs"], "why": m["why"],
                              "kernels": m.get("kernels")} for m in missing]
        if kernels:
            item["kernels"] = kernels[:50]
        out.append(item)
    return out


def run(venv: str, target: str, old: Optional[str] = None,
        driver_ptx_max: Optional[str] = None, driver_cuda: Optional[str] = None,
        partial_ok: Optional[List[str]] = None, strict: bool = False,
        paths: Optional[List[str]] = None) -> Dict[str, Any]:
    """The preflight document for `venv` and a destination arch (raises ValueError for a bad
    arch or version)."""
    venv = os.path.abspath(venv)
    cap = arch.parse_target(target)
    limit = None
    drv: Dict[str, Any] = {"source": "not checked: the destination's driver is unknown here "
                                     "(give --driver-cuda or --driver-ptx-max)"}
    if driver_ptx_max:
        limit = arch.parse_version(driver_ptx_max)
        drv = {"ptx_max": driver_ptx_max, "source": "--driver-ptx-max"}
    elif driver_cuda:
        limit = driver.ptx_max_for_cuda(driver_cuda)
        drv = {"cuda": driver_cuda, "ptx_max": "%d.%d" % limit if limit else None,
               "source": "--driver-cuda %s" % driver_cuda}
    checks: List[Dict[str, Any]] = []
    problems: List[Dict[str, Any]] = []

    started = time.monotonic()
    values = checks_static.audit(venv, cap, paths, limit, partial_ok, strict)
    values["driver"] = drv
    values["driver_ptx_max"] = drv.get("ptx_max")
    checks.append(_entry("kernel_audit", checks_static.judge_audit(values), started))
    problems.extend(_audit_problems(values))

    started = time.monotonic()
    outcome = checks_venv.outside_check({}, _ctx(venv)) if os.path.isdir(venv) else \
        Outcome(FAIL, "venv %s does not exist" % venv, {})
    checks.append(_entry("outside", outcome, started))
    for r in outcome.values.get("refs", []):
        problems.append({"check": "outside", "file": r["file"], "package": r.get("package"),
                         "what": "%s -> %s" % (r["kind"], r["target"]), "fix": r["fix"]})
    if not os.path.isdir(venv):
        problems.append({"check": "outside", "file": venv, "package": None,
                         "what": "venv does not exist", "fix": "check --venv"})

    if old:
        started = time.monotonic()
        outcome = checks_venv.relocation_check({"old": old}, _ctx(venv))
        checks.append(_entry("relocation", outcome, started))
        for p in outcome.values.get("problems", []):
            problems.append({"check": "relocation", "file": p["file"], "package": None,
                             "what": p["what"],
                             "fix": "python -m rbkit relocate %s --old %s --new %s"
                                    % (venv, old, venv)})
    summary = {"pass": 0, "fail": 0, "skip": 0}
    for c in checks:
        summary[c["status"]] += 1
    return {"schema": SCHEMA, "kind": "preflight", "venv": venv,
            "arch": arch.capability_to_arch(cap), "old": old,
            "ok": all(c["status"] == PASS for c in checks),
            "problems": problems,
            "files": sorted({p["file"] for p in problems}),
            "packages": sorted({p["package"] for p in problems if p.get("package")}),
            "checks": checks, "summary": summary}


def _ctx(venv: str):
    from .result import Context

    return Context(venv=venv)
RB_PY_41200470
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


def child_env() -> Dict[str, str]:
    """This process's environment with the SAFE_ENV defaults, for a child (started isolated:
    rbrules.launch)."""
    return apply_safe_env(dict(os.environ))


class Finished(NamedTuple):
    returncode: Optional[int]  # None when it was killed at the deadline
    output: str  # the tail of stdout and stderr together
    stdout: str
    timed_out: bool
    duration_s: float


def tail(text: str, limit: int = TAIL_CHARS) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def run_bounded(argv: List[str], timeout_s: float, env: Optional[Dict[str, str]] = None,
                cwd: str = "/") -> Finished:
    """Run argv in its own process group, from `cwd` (default /: no other user can write there);
    at the deadline kill the whole group."""
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
          checks: List[Dict[str, Any]],
          schedule: Optional[List[Dict[str, Any]]] = None) -> Dict[str, Any]:
    """The report; `schedule` (run_config's) lists, in the checks' order, each check's lane and
    its start and end in seconds from `started` (null for a check that was not run)."""
    ran = {c["level"] for c in checks if not c["values"].get("not_run")}
    summary = {"pass": 0, "fail": 0, "skip": 0}
    for c in checks:
        summary[c["status"]] = summary.get(c["status"], 0) + 1
    doc = {
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
    if schedule is not None:
        doc["schedule"] = schedule
    return doc


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
    gpu: Optional[Dict[str, Any]] = None  # {"model", "count", "capability", "arch", "names"}
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
(a hung CUDA call cannot be interrupted; the caller exits the process without waiting for it).
Any exception a check raises becomes a failed result, never a crash of the runner.

A config's checks run in two lanes (checks.py says which check goes where): the serial lane, in
this process, one after another in the config's order (torch, devices, imports, matmul,
libraries: they share torch, the CUDA context and what the process has loaded); and the
parallel lane, up to PARALLEL_MAX at a time, started at once (checks that read files or run
their own processes: kernel_audit, relocation, outside, command, python, nccl). A check that
times out stops the serial checks after it (they would share its stuck process); the others run
on. The report lists the checks in the config's order whatever order they finished in.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

from . import report
from .checks import CHECKS, SERIAL, deadline_for, lane_for
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
    kind, value = _call(spec.function(), params, ctx, float(deadline_s))
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


# Parallel checks running at once, at most: each is a thread waiting on a child process or
# reading files; more than this many children at once (a spec with many commands) would only
# compete for the same cores.
PARALLEL_MAX = 8


def _not_run(check: Dict[str, Any], stopped: str) -> Dict[str, Any]:
    spec = CHECKS.get(check["type"])
    return report.result(check["id"], str(check["type"]), spec.level if spec else "L?", FAIL,
                         "not run: check %s timed out in the probe's process, which the "
                         "serial checks after it share" % stopped,
                         {"not_run": True})


def run_config(config: Dict[str, Any], on_result=None) -> Tuple[Dict[str, Any], bool]:
    """Run every check of the config; returns (report, stopped_early). The serial checks run in
    the config's order in this process; after one of them times out, the serial checks behind it
    are not started and are reported as failed, "not run". The parallel checks start at once and
    each runs to its own end or deadline. `on_result(entry)` is called, in this thread, as each
    check finishes (in the order they finish); the report holds them in the config's order, and
    its `schedule` says when each ran and in which lane. stopped_early: a check timed out (its
    thread may still be running)."""
    checks = validate_config(config)
    ctx = context_of(config)
    started_wall = time.time()
    start = time.monotonic()
    lanes = [lane_for(c["type"], c.get("params")) for c in checks]
    results: List[Optional[Dict[str, Any]]] = [None] * len(checks)
    schedule: List[Dict[str, Any]] = [{"id": c["id"], "lane": lane, "start_s": None,
                                       "end_s": None} for c, lane in zip(checks, lanes)]
    finished: "queue.Queue[int]" = queue.Queue()

    def run_one(i: int) -> Dict[str, Any]:
        schedule[i]["start_s"] = round(time.monotonic() - start, 3)
        try:
            entry = run_check(checks[i], ctx)
        except BaseException as exc:  # run_check catches what a check raises; this is a bug
            entry = report.result(checks[i]["id"], str(checks[i]["type"]), "L?", FAIL,
                                  "runner error: %s: %s" % (type(exc).__name__, exc))
        schedule[i]["end_s"] = round(time.monotonic() - start, 3)
        results[i] = entry
        finished.put(i)
        return entry

    serial = [i for i, lane in enumerate(lanes) if lane == SERIAL]
    parallel = [i for i, lane in enumerate(lanes) if lane != SERIAL]
    todo: "queue.Queue[int]" = queue.Queue()
    for i in parallel:
        todo.put(i)

    def parallel_worker() -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            run_one(i)

    def serial_lane() -> None:
        stopped: Optional[str] = None
        for i in serial:
            if stopped:
                results[i] = _not_run(checks[i], stopped)
                finished.put(i)
                continue
            if run_one(i)["values"].get("timed_out"):
                stopped = checks[i]["id"]

    # Daemon threads: each returns by its checks' deadlines (run_check does not wait for a
    # stuck check), so they are joined through `finished`, never left behind waiting.
    threads = [threading.Thread(target=parallel_worker, name="rbprobes-parallel-%d" % n,
                                daemon=True)
               for n in range(min(PARALLEL_MAX, len(parallel)))]
    if serial:
        threads.insert(0, threading.Thread(target=serial_lane, name="rbprobes-serial",
                                           daemon=True))
    for t in threads:
        t.start()
    for _ in checks:
        i = finished.get()
        if on_result:
            on_result(results[i])
    entries = [r for r in results if r is not None]
    stopped = any(e["values"].get("timed_out") for e in entries)
    doc = report.build(ctx.host, started_wall, time.monotonic() - start, entries, schedule)
    return doc, stopped
RB_PY_5EB6C9BA
  cat >"${dir}"/rbprobes/venvfs.py <<'RB_PY_8F1E5D47'
"""Walking a venv we did not write: os.scandir without following links, regular files only;
pyvenv.cfg; which installed distribution owns a file."""

from __future__ import annotations

import csv
import glob
import io
import os
import stat
from typing import Callable, Dict, Iterator, List, Optional, Tuple


def walk(root: str, skip_dirs=("__pycache__",)) -> Iterator[Tuple[str, "os.DirEntry"]]:
    """(directory path, entry) for every entry below root, depth first in name order. Never
    follows a symbolic link (a link to a directory is yielded as an entry, not entered)."""
    stack = [root]
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for entry in entries:
            yield top, entry
            try:
                if entry.is_dir(follow_symlinks=False) and entry.name not in skip_dirs:
                    subdirs.append(entry.path)
            except OSError:
                continue
        stack.extend(reversed(subdirs))


def is_regular(entry: "os.DirEntry") -> bool:
    try:
        return entry.is_file(follow_symlinks=False)
    except OSError:
        return False


def lstat_kind(path: str) -> str:
    """"file", "dir", "link", "missing" or "special" (FIFO, socket, device)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "missing"
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "special"


def read_small(path: str, limit: int = 1 << 20) -> Optional[bytes]:
    """The first `limit` bytes of a regular file (not through a link, never blocking on a
    FIFO); None for anything else."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks = []
        left = limit
        while left > 0:
            data = os.read(fd, min(left, 1 << 20))
            if not data:
                break
            chunks.append(data)
            left -= len(data)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def pyvenv_cfg(venv: str) -> Optional[Dict[str, str]]:
    """pyvenv.cfg as {key: value} (keys lower-cased), or None when there is none."""
    data = read_small(os.path.join(venv, "pyvenv.cfg"), 1 << 16)
    if data is None:
        return None
    out: Dict[str, str] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip().lower()] = value.strip()
    return out


def site_packages(venv: str) -> List[str]:
    """The venv's site-packages directories (lib/pythonX.Y/site-packages, lib64 too)."""
    found = []
    for pattern in ("lib/python*/site-packages", "lib64/python*/site-packages",
                    "lib/site-packages", "Lib/site-packages"):
        for d in sorted(glob.glob(os.path.join(venv, pattern))):
            real = os.path.realpath(d)
            if os.path.isdir(d) and real not in {os.path.realpath(f) for f in found}:
                found.append(d)
    return found


def site_packages_of(path: str) -> Optional[str]:
    parts = path.split(os.sep)
    for i in range(len(parts) - 1, 0, -1):
        if parts[i] in ("site-packages", "dist-packages"):
            return os.sep.join(parts[:i + 1])
    return None


_OWNERS: Dict[str, Dict[str, str]] = {}


def owner(path: str) -> Optional[str]:
    """The distribution ("torch 2.11.0") whose RECORD lists `path`, or None."""
    site = site_packages_of(os.path.abspath(path))
    if not site:
        return None
    if site not in _OWNERS:
        index: Dict[str, str] = {}
        for info in sorted(glob.glob(os.path.join(site, "*.dist-info"))):
            stem = os.path.basename(info)[: -len(".dist-info")]
            name, _, version = stem.partition("-")
            data = read_small(os.path.join(info, "RECORD"), 64 << 20)
            if data is None:
                continue
            for row in csv.reader(io.StringIO(data.decode("utf-8", "replace"))):
                if row and row[0]:
                    index[os.path.normpath(os.path.join(site, row[0]))] = "%s %s" % (name,
                                                                                    version)
        _OWNERS[site] = index
    return _OWNERS[site].get(os.path.normpath(os.path.abspath(path)))


def link_lookup(root: str) -> Callable[[str], Optional[str]]:
    """rbrules.links' view of the tree `root`: the text of the link at a path of the tree, ""
    for another entry, None for nothing there."""
    def lookup(rel: str) -> Optional[str]:
        path = os.path.join(root, rel)
        kind = lstat_kind(path)
        if kind == "missing":
            return None
        try:
            return os.readlink(path) if kind == "link" else ""
        except OSError:
            return None
    return lookup


def inside(path: str, roots: List[str]) -> bool:
    """Whether `path` (absolute, normalised) lies in one of `roots` (or is one)."""
    for r in roots:
        r = r.rstrip(os.sep) or os.sep
        if path == r or path.startswith(r + os.sep) or r == os.sep:
            return True
    return False
RB_PY_8F1E5D47
  cat >"${dir}"/rbprobes/workers.py <<'RB_PY_9645E52D'
"""Work spread over forked worker processes: the kernel audit's files (checks_static), and the
install engine's digests of the source (rbkit.manifest imports it from here: rbprobes imports
nothing outside itself, rbkit may import rbprobes, both ship in every kit). One process each,
where threads of one Python do not scale (sha256 in threads of one process runs at one thread's
pace; figures: docs/benchmarks.md, "Figures behind choices in the code").

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import marshal
import os
import struct
import sys
from typing import Any, Callable, List, Tuple


def forkable() -> bool:
    """Whether this process may fork workers: no threads in it (a fork copies the locks another
    thread holds, held for ever in the child), and a fork to call."""
    threaded = "threading" in sys.modules and sys.modules["threading"].active_count() > 1
    return hasattr(os, "fork") and not threaded


def over_workers(fn: Callable[[int], Any], sizes: List[int],
                 jobs: int) -> Tuple[List[Any], int]:
    """([fn(0), fn(1), ...] for each of `sizes`' items, how many workers answered), computed by
    `jobs` forked workers that take the items largest first, each as soon as it is free; the
    results come back marshalled (plain data). An item no worker answered for (a worker that
    died, an answer that does not load) is computed here, so the list is always whole. With one
    job, or threads in this process (a fork would copy their locks held), everything is
    computed here."""
    n = len(sizes)
    if jobs <= 1 or n <= 1 or not forkable():
        return [fn(i) for i in range(n)], 0
    order = sorted(range(n), key=lambda i: -sizes[i])
    task_r, task_w = os.pipe()
    # every index is 4 bytes, written before any worker reads: a pipe hands each 4-byte read
    # whole to one reader (n * 4 bytes fit its buffer up to 16,384 items; more, chunk by chunk)
    children = []
    parent = os.getpid()
    todo = b"".join(struct.pack("<I", i) for i in order)
    for _ in range(min(jobs, n)):
        out_r, out_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker
            code = 0
            try:
                os.close(task_w)
                os.close(out_r)
                done = []
                while os.getppid() == parent:
                    got = os.read(task_r, 4)
                    if len(got) != 4:
                        break
                    i = struct.unpack("<I", got)[0]
                    done.append((i, fn(i)))
                data = marshal.dumps(done)
                view = memoryview(data)
                while view:
                    view = view[os.write(out_w, view):]
            except BaseException:  # noqa: B902 (the parent computes what is not answered)
                code = 1
            finally:
                os._exit(code)
        os.close(out_w)
        children.append((pid, out_r))
    os.close(task_r)
    try:
        view = memoryview(todo)
        while view:
            view = view[os.write(task_w, view):]
    finally:
        os.close(task_w)
    results: List[Any] = [None] * n
    answered = [False] * n
    workers = 0
    for pid, out_r in children:
        with os.fdopen(out_r, "rb") as f:
            data = f.read()
        _pid, status = os.waitpid(pid, 0)
        if status != 0:
            continue
        try:
            got = marshal.loads(data)
            for i, rec in got:
                results[i] = rec
                answered[i] = True
        except (ValueError, EOFError, TypeError):
            continue
        workers += 1
    for i in range(n):
        if not answered[i]:
            results[i] = fn(i)
    return results, workers
RB_PY_9645E52D
  cat >"${dir}"/rbrules/__init__.py <<'RB_PY_0ECD12E6'
"""rbrules: the rules the compiler and the kit share, each written once (stdlib only, Python >= 3.9).

The bottom of the kit: it imports nothing outside itself; rbprobes and rbkit import it, and it is
the one host-side package the compiler imports (for the rules it renders into a runbook's bash).

    launch    how every Python the runbook starts on a host is started: isolated, by the path of
              the kit's own entry file, from a private working directory
    common    the rules both sides state, each once: a byte count in words (`human`)
    links     whether a symbolic link leads outside the venv (the transfer's scan, the `outside`
              check)
    paths     the names a run keeps beside a destination: staging, lock, env file
    private   whether a path root executes from or writes to is private, and the refusal if not
"""
RB_PY_0ECD12E6
  cat >"${dir}"/rbrules/common.py <<'RB_PY_3E02FF0A'
"""The rules that the compiler (which renders them into a runbook's settings, bash and prose) and
the kit (which acts on them) both state, each written once here: stdlib only, no I/O.

    COMPRESSION     the compression table: each one's tool, how it packs, how it unpacks
    compressors     which compressions a host has, by the tools found on its PATH
    LINK_SECONDS, MEASURE_SAMPLE   compression auto's measurement: the link's, and the sample's
    TAR_RECORD      tar's record size on both ends of a stream
    MAX_STREAMS,    several streams side by side: at most this many, none below this size,
    STREAMS_MIN_BYTES, stream_count   one per two of the run's jobs
    ENGINE_STEPS    the install engine's steps, in order
    PROVE_TIMEOUT   seconds for the staged (and the installed) interpreter to answer
    SPECIAL_MODES, OUTSIDE_LINKS, ON_EXISTING, SHARED_PARENT, SWAP_ATOMIC, RERUN, ALGOS,
    ON_FAILED_CHECKS   the choices of the spec fields the engine takes
    human           a byte count in words (`786.4 MB`)
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

# The compression table, the only one: the stream's sending end packs with `pack`, its receiving
# end unpacks with `unpack`; `tool` is what a host must have (None: nothing).
COMPRESSION: Dict[str, Dict[str, Any]] = {
    "none": {"tool": None, "pack": None, "unpack": None},
    "zstd": {"tool": "zstd", "pack": ["zstd", "-q", "-1", "-T0"], "unpack": ["zstd", "-q", "-d", "-c"]},
    "lz4": {"tool": "lz4", "pack": ["lz4", "-q", "-1", "-c"], "unpack": ["lz4", "-q", "-d", "-c"]},
    "gzip": {"tool": "gzip", "pack": ["gzip", "-1"], "unpack": ["gzip", "-d", "-c"]},
}
# the tools a host is asked for, sorted (the runbook's bash asks `command -v` for each)
COMPRESSOR_TOOLS = tuple(sorted(c["tool"] for c in COMPRESSION.values() if c["tool"]))


def compressors(found: Callable[[str], Optional[str]]) -> List[str]:
    """The compressions a host has, sorted: none, and each whose tool `found` finds (on the host:
    shutil.which; the runbook's bash asks `command -v` for COMPRESSOR_TOOLS)."""
    return [name for name, c in sorted(COMPRESSION.items()) if c["tool"] is None or found(c["tool"])]


# compression auto on the relay measures the link (zeros through this machine for LINK_SECONDS,
# a word for `timeout`) against each compressor packing MEASURE_SAMPLE bytes of the source
LINK_SECONDS = "0.6"
MEASURE_SAMPLE = 16 << 20

# tar's record on both ends of a stream, in 512-byte blocks: 256 (128 KiB) instead of tar's
# default 20 (measured: docs/h200.md). Either end reads the other's records whatever their size (GNU
# tar reblocks a pipe's short reads).
TAR_BLOCKS = 256
TAR_RECORD = ["-b", str(TAR_BLOCKS)]

# Several streams side by side, where the sending end starts the receiving ends (one host, or the
# direct route; measured: docs/h200.md): one per two of the cores the run may use (its jobs), at most
# MAX_STREAMS, none for a tree below STREAMS_MIN_BYTES.
MAX_STREAMS = 8
STREAMS_MIN_BYTES = 256 << 20


def stream_count(jobs: int) -> int:
    return max(1, min(MAX_STREAMS, jobs // 2))


# the install engine's steps, in order: a single-host runbook runs them one by one on the
# destination, a fan-out node all in one process
ENGINE_STEPS = ("stage", "receive", "verify", "relocate", "prove", "swap", "exports", "probe")

PROVE_TIMEOUT = 120  # seconds for the staged (and the installed) interpreter to answer

# the choices of the spec's fields that the engine takes (transfer.*, and the manifest's digest)
SPECIAL_MODES = ("refuse", "strip", "keep")     # transfer.special_modes
OUTSIDE_LINKS = ("refuse", "keep")              # transfer.outside_links
ON_EXISTING = ("refuse", "backup", "replace")   # transfer.on_existing
SHARED_PARENT = ("refuse", "allow")             # transfer.shared_parent
SWAP_ATOMIC = ("require", "allow")              # transfer.swap_atomic
RERUN = ("quick", "digest")                     # transfer.rerun
ALGOS = ("sha256", "blake2b", "none")           # transfer.verify
ON_FAILED_CHECKS = ("rollback", "keep")         # on_failed_checks


def human(n: Any) -> str:
    """`n` bytes in decimal units (`512 B`, `1.5 KB`, `786.4 MB`, up to TB); `-` for what is not a
    number (a size not measured)."""
    if isinstance(n, bool) or not isinstance(n, (int, float)):
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return "%d B" % n if unit == "B" else "%.1f %s" % (n, unit)
        n /= 1000.0
    return "%.1f TB" % n
RB_PY_3E02FF0A
  cat >"${dir}"/rbrules/launch.py <<'RB_PY_F06911C4'
"""How the runbook and the kit start a Python on a host (docs/design.md, "Threat model": other
users of the same hosts).

Every start is isolated (`-I`: no PYTHON* variable is read, no user site-packages, and neither the
working directory nor the started file's directory goes on sys.path), writes no bytecode (`-B`),
and names its code by absolute path inside this run's private kit directory: START, which puts
that directory, and nothing else, first on sys.path and runs the module named after it. Never
`-m`, never `-c` or `-` with code that imports from where it was started. The kit's own tools
also skip site (`-S`: the kit is stdlib only); the venv's interpreter keeps it (the checks import
the venv's packages). The runbook's bash gets these words from here (the compiler renders them),
and every start's working directory is private: the run's 0700 directory on the runbook's
machine, the kit's 0700 directory on an ssh host, `/` before either exists.
"""

from __future__ import annotations

import os
from typing import List

FLAGS = ("-I", "-S", "-B")          # the kit's tools: stdlib only
SITE_FLAGS = ("-I", "-B")           # the venv's interpreter: its own site-packages, nothing else
START = "rbrules/start.py"          # relative to the kit directory


def kit_dir() -> str:
    """The directory that holds this kit's packages (rbrules, rbprobes, rbkit)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def argv(python: str, module: str, *, site: bool = False, kit: str = "") -> List[str]:
    """The words that run `module` (as `python -m module` would) with `python`, isolated, from
    the kit at `kit` (default: this one). Start it with cwd set to a private directory."""
    kit = kit or kit_dir()
    return [python, *(SITE_FLAGS if site else FLAGS), os.path.join(kit, START), module]
RB_PY_F06911C4
  cat >"${dir}"/rbrules/links.py <<'RB_PY_31286AD4'
"""Whether a symbolic link in a venv leads outside it: one rule for the transfer's scan
(rbkit.hostfs, on the source: such a link is refused unless transfer.outside_links is keep) and
for the `outside` check (rbprobes.checks_venv, on the destination). Stdlib only, no I/O: the
caller reads the tree through `lookup`.

    interpreter_link(rel)     the venv's own interpreter links (bin/python3 -> /usr/bin/python3.12):
                              outside the tree by design; the scan lets them through, the probe
                              leaves them to `relocation`
    leaves(rel, target, lookup, names)
                              the link `rel` (text `target`) resolved in the tree as the kernel
                              would: does it get out?
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, List, Optional

PYTHON_NAME = re.compile(r"^(python|pypy)[0-9.]*$")
MAX_HOPS = 40  # links followed while resolving one (the kernel's own limit)

# lookup("lib/x"): the text of the link at that path of the tree, "" for an entry that is not a
# link, None for nothing there (or a path through a file).
Lookup = Callable[[str], Optional[str]]


def interpreter_link(rel: str) -> bool:
    """`bin/python`, `bin/python3.12`, `bin/pypy3`: a venv's interpreter names."""
    head, _, name = rel.rpartition("/")
    return head == "bin" and bool(PYTHON_NAME.match(name))


def _parts(path: str) -> List[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def _under(target: str, names: Iterable[str]) -> Optional[List[str]]:
    """The components of the absolute `target` below one of the tree's own absolute `names`,
    None when it names none of them (compared component by component, never normalised: `..`
    after a link is not lexical)."""
    parts = _parts(target)
    for name in names:
        root = _parts(name)
        if parts[:len(root)] == root:
            return parts[len(root):]
    return None


def leaves(rel: str, target: str, lookup: Lookup, names: Iterable[str] = (),
           max_hops: int = MAX_HOPS) -> bool:
    """Whether the link `rel` (relative to the tree, text `target`) leads outside the tree.
    It is resolved component by component against the tree, following the links it meets as the
    kernel would (`dot -> .` then `x -> dot/..` is the tree's parent, which a lexical normpath
    calls inside); a `..` above the top leaves. An absolute target leaves unless it lies under one
    of `names`, the tree's own absolute paths: the scan on the source passes none (at the
    destination such a link names the source's path), the probe on the destination passes the
    venv's path and its real path. A target that does not exist (yet) leads nowhere: False, and
    so does a loop (the kernel gives ELOOP)."""
    names = list(names)
    stack = _parts(rel)[:-1]
    todo = target.split("/")
    if target.startswith("/"):
        below = _under(target, names)
        if below is None:
            return True
        stack, todo = [], below
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
        text = lookup("/".join(stack + [part]))
        if text is None:
            return False                      # dangling (or through a file): resolves nowhere
        if text:
            hops += 1
            if hops > max_hops:
                return False
            if text.startswith("/"):
                below = _under(text, names)
                if below is None:
                    return True
                stack, todo = [], below + todo
            else:
                todo = text.split("/") + todo
            continue
        stack.append(part)
    return False
RB_PY_31286AD4
  cat >"${dir}"/rbrules/paths.py <<'RB_PY_C8E78B80'
"""The names a run keeps beside a destination, one rule each, read by the kit (which makes them)
and by the compiler (which shows them in --dry-run, --plan and the settings): the staging
(`.NAME.rb-staging`, on the destination's file system, so the swap is one rename), the lock
(`.NAME.rb-lock`) and the env file's default (`DEST.env.sh`)."""

from __future__ import annotations

import posixpath


def beside(dest: str, suffix: str) -> str:
    """`.<name><suffix>` in the destination's parent."""
    dest = dest.rstrip("/") or "/"
    head, tail = posixpath.split(dest)
    return posixpath.join(head, "." + tail + suffix)


def staging(dest: str) -> str:
    return beside(dest, ".rb-staging")


def lock(dest: str) -> str:
    return beside(dest, ".rb-lock")


def env_file(dest: str, given: str = "") -> str:
    """The env file: the spec's cuda.env_file, else `DEST.env.sh`."""
    return given or (dest.rstrip("/") or "/") + ".env.sh"
RB_PY_C8E78B80
  cat >"${dir}"/rbrules/private.py <<'RB_PY_005C2B26'
"""Whether a path that root executes from or writes to is private (docs/design.md, "Threat
model": other users of the same hosts), and the directory made so.

A directory is private to user U when U owns it and neither its group nor others may write it,
and every directory above it (each link along the way followed, each checked where it lies) can
be changed only by U or root: a directory another user may write is refused, except a sticky one
(/tmp) whose next entry U or root owns, since the sticky bit stops others renaming that entry.

    python -I -S -B KIT/rbrules/start.py rbrules.private [--make] [--what TEXT] [--fix TEXT] DIR

checks DIR (with --make: creates what is missing first, the last directory 0700; with --file: DIR
is a file whose content is obeyed, see why_not_private_file) and exits 2 with the refusal, naming
the directory (or file), its owner and mode, and the fix, when it is not private.
"""

from __future__ import annotations

import argparse
import errno
import os
import pwd
import stat
import sys
from typing import List, Optional, Tuple

MAX_LINKS = 40        # symlinks followed along one path (the kernel's own limit)


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "uid %d" % uid


def owner(st: os.stat_result) -> str:
    """`name (uid N)`, or `uid N` for a uid without a name."""
    name = user_name(st.st_uid)
    return name if name.startswith("uid ") else "%s (uid %d)" % (name, st.st_uid)


def _judge(path: str, st: os.stat_result, uid: int) -> Optional[str]:
    """Why this one component is not private (None: it is)."""
    mode = stat.S_IMODE(st.st_mode)
    kind = "the symlink" if stat.S_ISLNK(st.st_mode) else "directory" \
        if stat.S_ISDIR(st.st_mode) else "the file"
    if st.st_uid not in (uid, 0):
        return ("%s %s is owned by %s, mode %04o: that user can rename or replace what is in it%s"
                % (kind, path, owner(st), mode,
                   "" if not stat.S_ISLNK(st.st_mode) else " (and the link itself)"))
    if stat.S_ISLNK(st.st_mode):
        return None        # a link's own mode means nothing; its directory and target are judged
    if mode & 0o022 and not mode & stat.S_ISVTX:
        who = "group and others" if mode & 0o022 == 0o022 else \
            "group" if mode & 0o020 else "others"
        return ("%s %s is owned by %s, mode %04o: writable by %s without the sticky bit, so "
                "another user can rename or replace what is in it"
                % (kind, path, owner(st), mode, who))
    return None


def first_not_private(path: str, uid: int) -> Optional[Tuple[str, str]]:
    """(the component, why) of the first component of `path` that is not private to `uid`, from
    `/` down, links followed as the kernel would; None when there is none."""
    todo: List[str] = [p for p in os.path.abspath(path).split("/") if p]
    todo.reverse()                      # a stack: the next component is last
    cur = "/"
    why = _judge(cur, os.lstat(cur), uid)
    if why:
        return cur, why
    links = 0
    while todo:
        name = todo.pop()
        if name == ".":
            continue
        if name == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, name)
        try:
            st = os.lstat(nxt)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return None               # not there yet: the kit makes it
            raise
        why = _judge(nxt, st, uid)
        if why:
            return nxt, why
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_LINKS:
                return nxt, "more than %d symlinks along %s" % (MAX_LINKS, path)
            target = os.readlink(nxt)
            if target.startswith("/"):
                cur = "/"
            todo.extend(reversed([p for p in target.split("/") if p]))
            continue
        cur = nxt
    return None


def why_not_private(path: str, uid: Optional[int] = None, *, parent: bool = False
                    ) -> Optional[str]:
    """None when the directory `path` is private to `uid` (default: this process's effective
    user), else why not: the first directory along it that another user can change, named with
    its owner and mode (first_not_private), or the directory itself when it is missing, not a
    directory, not `uid`'s, or writable by its group or others.
    parent=True: `path` is where private entries are to be made: the walk alone is the rule
    (root may own it; others may write it when it is sticky; what is missing the kit makes)."""
    uid = os.geteuid() if uid is None else uid
    try:
        found = first_not_private(path, uid)
    except OSError as exc:
        return "%s: %s" % (exc.filename or path, exc.strerror)
    if found is not None:
        return found[1]
    if parent:
        return None
    try:
        st = os.stat(path)
    except OSError as exc:
        return "%s: %s" % (path, exc.strerror)
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISDIR(st.st_mode):
        return "%s is not a directory" % path
    if st.st_uid != uid:
        return "directory %s is owned by %s, mode %04o, not by %s" % (
            path, owner(st), mode, user_name(uid))
    if mode & 0o022:
        return "directory %s is writable by %s (mode %04o)" % (
            path, "others" if mode & 0o002 else "its group", mode)
    return None


def why_not_private_file(path: str, uid: Optional[int] = None) -> Optional[str]:
    """None when `path` is a regular file that only `uid` (default: this process's effective user)
    or root can change, nor any directory along it (first_not_private), else why not: for a file
    whose content a program run by `uid` obeys (an ssh config: ProxyCommand, Match exec)."""
    uid = os.geteuid() if uid is None else uid
    try:
        st = os.stat(path)
        found = first_not_private(path, uid)
        # the walk judges each directory, and each link, along the way; the file is judged below
        if found is not None and stat.S_ISREG(os.lstat(found[0]).st_mode):
            found = None
    except OSError as exc:
        return "%s: %s" % (exc.filename or path, exc.strerror)
    if not stat.S_ISREG(st.st_mode):
        return "%s is not a regular file" % path
    if found is not None:
        return found[1]
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (uid, 0):
        return "the file %s is owned by %s, mode %04o: that user can change what it says" % (
            path, owner(st), mode)
    if mode & 0o022:   # a file's sticky bit protects nothing
        return "the file %s is writable by %s (mode %04o)" % (
            path, "others" if mode & 0o002 else "its group", mode)
    return None


def make_private(path: str) -> Optional[str]:
    """Create the directory `path` where it is missing (the directories above it 0755, itself
    0700, none through a link another user made: each is checked before the next is made), then
    check it; None when it is private, else why not."""
    path = os.path.abspath(path)
    missing: List[str] = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        probe = os.path.dirname(probe)
    for d in reversed(missing):
        why = why_not_private(os.path.dirname(d), parent=True)
        if why is not None:
            return why
        try:
            os.mkdir(d, 0o700 if d == path else 0o755)
        except FileExistsError:
            pass
        except OSError as exc:
            return "cannot make %s: %s" % (d, exc.strerror)
    return why_not_private(path)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="rbrules.private", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--make", action="store_true", help="create what is missing, the last 0700")
    p.add_argument("--what", default="the directory", help="what DIR is, for the refusal")
    p.add_argument("--fix", default="", help="what to do instead, for the refusal")
    p.add_argument("--file", action="store_true",
                   help="DIR is a file whose content is obeyed (why_not_private_file)")
    a = p.parse_args(argv)
    why = why_not_private_file(a.dir) if a.file else make_private(a.dir) if a.make \
        else why_not_private(a.dir)
    if why is None:
        return 0
    fix = (": " + a.fix) if a.fix else ""
    sys.stderr.write("refusing %s %s: %s; another user could replace what is run or written "
                     "there%s\n" % (a.what, os.path.abspath(a.dir), why, fix))
    return 2


if __name__ == "__main__":
    sys.exit(main())
RB_PY_005C2B26
  cat >"${dir}"/rbrules/start.py <<'RB_PY_ED3E91CD'
"""The one entry file of every Python the runbook starts on a host (rbrules.launch):

    python -I -S -B KIT/rbrules/start.py MODULE ARGS...

runs MODULE as `python -m MODULE ARGS...` would, with KIT (this file's grandparent) first on
sys.path and nothing from the working directory or the environment: under -I neither the
working directory nor this file's directory is on sys.path, so the only place a kit module can
come from is the private directory this file lies in. Nothing here imports before sys.path is set.
"""

import os
import runpy
import sys

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -I -S -B KIT/rbrules/start.py MODULE [ARGS...]")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    module = sys.argv.pop(1)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
RB_PY_ED3E91CD
  cat >"${dir}"/rbview/__init__.py <<'RB_PY_FBA331C4'
"""rbview: the pictures of a run, drawn on the machine that runs the runbook only (never shipped to
a host): timeline.svg, nodes.svg (fan-out) and report.html beside report.json.

`draw.write_all(report, events_path, out_dir, fanout=None)` draws
- timeline.svg (`timeline`): one row per step, grouped in one band per host, on a time axis in
  seconds (from the step lines of the event log), each host's checks under its band, and the
  transfer rate over time (from `progress` lines when the log has them, else the transfer's
  average rate);
- nodes.svg (`nodes`), for a fan-out: nodes x steps and checks, a cell per status with its
  seconds, odd and missing nodes named;
- report.html (`page`): the pictures, the steps, each host's checks, the fan-out comparison.
`svg` holds what they share: colours, the one escaper, text fitted to a width, the Svg writer.

Event log lines read here (tab-separated; `rbkit.report.read_events` reads the first two):
    step STEP STATUS START_MS END_MS HOST DETAIL
    fact STEP KEY VALUE
    progress STEP HOST T_MS BYTES        (optional: BYTES of the stream STEP moved so far, at T_MS,
                                          same clock; the transfer's: what the destination's tar
                                          read)

The SVG is written by hand: no plotting library. The output depends only on its inputs (no clock,
stable order), so the same run gives the same bytes; every text from the run (hosts, details,
reasons) is escaped.

`python -m rbview --report R --events E --out DIR [--fanout F]` writes them from files (F: the
fan-out's fanout.json; the node-*.json beside it give the seconds per cell). `rbkit report
--pictures DIR` draws them in its own process at the end of every run.

It is part of the pinned kit, which the runbook extracts here, and left out of the tar sent to the
hosts (compiler.kit.CONTROLLER_PACKAGES). stdlib only (and rbkit.fanout.fold); Python >= 3.9.
"""
RB_PY_FBA331C4
  cat >"${dir}"/rbview/__main__.py <<'RB_PY_C31436F4'
import sys

from .draw import main

sys.exit(main())
RB_PY_C31436F4
  cat >"${dir}"/rbview/draw.py <<'RB_PY_C4F391BD'
"""Every picture of a run written beside its report (atomically), from files or a report dict; and
`python -m rbview`."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import List, Optional

from . import __doc__ as DOC
from .nodes import nodes_picture
from .page import page
from .timeline import from_report, read_log, timeline


def _write(out_dir: str, name: str, text: str) -> str:
    path = os.path.join(out_dir, name)
    fd, tmp = tempfile.mkstemp(prefix="." + name + ".", suffix=".tmp", dir=out_dir)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)
            f.write(text.encode("utf-8"))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def write_all(report: dict, events_path: str, out_dir: str,
              fanout: Optional[dict] = None) -> list[str]:
    """Write timeline.svg, nodes.svg (when FANOUT is given) and report.html into OUT_DIR; return
    their paths. FANOUT is `fanout.compare()`'s result, with the node reports under "reports"
    (node -> report) when the cells should carry seconds."""
    steps, samples = read_log(events_path)
    timed = bool(steps)
    if not steps:
        steps = from_report(report)
    written = [_write(out_dir, "timeline.svg", timeline(report, steps, samples, timed))]
    names = ["timeline.svg"]
    if fanout:
        written.append(_write(out_dir, "nodes.svg",
                              nodes_picture(fanout, str(report.get("runbook", "")))))
        names.append("nodes.svg")
    written.append(_write(out_dir, "report.html", page(report, names, fanout)))
    return written


def draw(report: dict, events: str, out: str, fanout: str = "") -> List[str]:
    """Every picture of a run into `out`, from its report (a dict), events.tsv and fanout.json
    (node-*.json beside it are read too); returns the paths written."""
    fan = None
    if fanout:
        with open(fanout, encoding="utf-8") as f:
            fan = json.load(f)
        where = os.path.dirname(os.path.abspath(fanout))
        reports = {}
        for n in fan.get("nodes") or []:
            path = os.path.join(where, "node-%s.json" % n)
            if os.path.isfile(path):
                try:
                    with open(path, encoding="utf-8") as f:
                        reports[n] = json.load(f)
                except (OSError, ValueError):
                    pass
        fan = dict(fan, reports=reports)
    os.makedirs(out, exist_ok=True)
    return write_all(report, events, out, fan)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="rbview", description=DOC,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--report", required=True, help="the run's report.json")
    p.add_argument("--events", default="", help="the run's events.tsv")
    p.add_argument("--out", required=True, help="directory to write the pictures into")
    p.add_argument("--fanout", default="", help="fanout.json; node-*.json beside it are read too")
    a = p.parse_args(argv)
    with open(a.report, encoding="utf-8") as f:
        report = json.load(f)
    for path in draw(report, a.events, a.out, a.fanout):
        print(path)
    return 0
RB_PY_C4F391BD
  cat >"${dir}"/rbview/nodes.py <<'RB_PY_46F06310'
"""nodes.svg, for a fan-out: nodes x steps and checks, a cell per status with its seconds, odd and
missing nodes named."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .svg import CHAR, Svg, colour, fit, legend, num, secs, status_word


def fold(names: List[str]) -> str:
    """rbkit.fanout.fold, imported only for a fan-out's pictures (the engine behind it is not
    needed to draw a single host's run)."""
    from rbkit.fanout import fold as fold_names
    return fold_names(names)


def _node_seconds(doc: Optional[Dict[str, Any]]) -> Dict[str, float]:
    """Column -> seconds, from one node's report (its steps, its checks)."""
    out: Dict[str, float] = {}
    if not isinstance(doc, dict):
        return out
    for s in doc.get("steps") or []:
        if isinstance(s, dict) and isinstance(s.get("seconds"), (int, float)):
            out[str(s.get("id"))] = float(s["seconds"])
    for c in (doc.get("probe") or {}).get("checks") or []:
        if isinstance(c, dict) and isinstance(c.get("duration_s"), (int, float)):
            out["check:" + str(c.get("id"))] = float(c["duration_s"])
    return out


def nodes_picture(fanout: Dict[str, Any], name: str = "") -> str:
    """Nodes x columns of the comparison: a cell per status with its seconds (when the node
    reports are in `fanout["reports"]`), odd and missing nodes named beside their row."""
    nodes = [str(n) for n in fanout.get("nodes") or []]
    cols = [str(c) for c in fanout.get("columns") or []]
    rows = fanout.get("rows") or {}
    odd = fanout.get("odd") or {}
    missing = fanout.get("missing") or {}
    reports = fanout.get("reports") or {}
    seconds = {n: _node_seconds(reports.get(n)) for n in nodes}

    label_w = min(200.0, max(90.0, 30 + max([len(n) for n in nodes] or [6]) * 12 * CHAR))
    heads = [c[6:] if c.startswith("check:") else c for c in cols]
    need = max([len(h) for h in heads] or [4]) * 11 * CHAR + 10
    cell_w, cell_h, slant = max(58.0, min(96.0, need)), 20.0, need > 96
    head_h = 36 + (need * 0.6 if slant else 0)
    note_w = 420.0
    x0 = 16 + label_w
    width = max(760.0, x0 + cell_w * len(cols) + 16 + note_w)
    svg = Svg()
    ok = len(fanout.get("ok_nodes") or [])
    title = "fan-out%s: %d/%d nodes passed; %d odd, %d missing; success policy %s: %s" % (
        (" " + name) if name else "", ok, len(nodes), len(odd), len(missing),
        fanout.get("success", "?"), "met" if fanout.get("passed") else "NOT met")
    svg.text(16, 26, fit(title, width - 32, 16), 16, weight="bold",
             fill="#212121" if fanout.get("passed") else colour("failed")[0])
    groups = fanout.get("groups") or []
    sub = "%d group%s of identical rows: %s" % (
        len(groups), "" if len(groups) == 1 else "s",
        "; ".join("%s (%d)" % (fold([str(n) for n in g]), len(g)) for g in groups) or "none")
    svg.text(16, 46, fit(sub, width - 32, 12), 12, fill="#455a64")
    legend(svg, 16, 70, [(colour("pass")[0], colour("pass")[0], "pass"),
                          (colour("fail")[0], colour("fail")[0], "fail"),
                          (colour("skip")[0], colour("skip")[0], "skip"),
                          (colour("-")[0], "#b0bec5", "not run"),
                          ("url(#nohatch)", "#8d6e63", "no report"),
                          ("#ffffff", "#ef6c00", "odd node (differs from the majority)")])
    svg.parts.insert(0, '<defs><pattern id="nohatch" width="6" height="6" '
                        'patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
                        '<rect width="6" height="6" fill="#fbe9e7"/>'
                        '<line x1="0" y1="0" x2="0" y2="6" stroke="#bcaaa4" stroke-width="2"/>'
                        '</pattern></defs>')
    y = 84 + head_h
    # column heads, slanted; steps and checks apart
    for j, h in enumerate(heads):
        cx = x0 + j * cell_w + cell_w / 2
        if slant:
            svg.add("text", {"x": num(cx), "y": num(y - 6), "font-size": "11", "fill": "#212121",
                             "transform": "rotate(-35 %s %s)" % (num(cx), num(y - 6))},
                    h, cols[j])
        else:
            svg.text(cx, y - 6, h, 11, anchor="middle", title=cols[j])
    first_check = next((j for j, c in enumerate(cols) if c.startswith("check:")), None)
    for lo, hi, what in ((0, first_check if first_check is not None else len(cols), "steps"),
                         (first_check, len(cols), "checks")):
        if lo is None or hi <= lo:
            continue
        svg.text(x0 + (lo + hi) * cell_w / 2, 84 + 14, what, 12, anchor="middle",
                 weight="bold", fill="#455a64")
        svg.line(x0 + lo * cell_w + 4, 84 + 19, x0 + hi * cell_w - 4, 84 + 19,
                 stroke="#90a4ae", stroke_width=1.0)
    for i, n in enumerate(nodes):
        ry = y + i * cell_h
        if i % 2 == 0:
            svg.rect(8, ry, width - 16, cell_h, "#f5f7f8")
        is_odd, is_missing = n in odd, n in missing
        svg.text(x0 - 10, ry + 14, fit(n, label_w - 10, 12), 12, anchor="end",
                 weight="bold" if is_odd or is_missing else None,
                 fill="#ef6c00" if is_odd else "#6d4c41" if is_missing else "#212121")
        if is_missing:
            why = " | ".join(str(w) for w in missing[n]) or "no report"
            svg.rect(x0, ry + 1, cell_w * len(cols), cell_h - 2, "url(#nohatch)",
                     title="%s: no report: %s" % (n, why), stroke="#8d6e63", stroke_width=1.0)
            svg.text(x0 + 8, ry + 14, "no report", 11, fill="#4e342e", weight="bold")
            note = "no report: " + why
            svg.text(x0 + cell_w * len(cols) + 12, ry + 14,
                     fit(note, width - (x0 + cell_w * len(cols) + 20), 11), 11, fill="#6d4c41",
                     title=note)
            continue
        row = rows.get(n) or {}
        for j, c in enumerate(cols):
            st = str(row.get(c, "-"))
            fill, ink = colour(st)
            s = seconds[n].get(c)
            word = secs(s).replace(" ", "") if s is not None and st != "-" else (
                "" if st == "-" else status_word(st))
            if st == "fail":
                word = "\u2717 " + word if s is not None else "\u2717 fail"
            tip = "%s %s: %s%s" % (n, heads[j], status_word(st),
                                   (", " + secs(s)) if s is not None else "")
            svg.rect(x0 + j * cell_w + 1, ry + 1, cell_w - 2, cell_h - 2, fill, title=tip,
                     stroke="#b0bec5" if st == "-" else None)
            if word:
                svg.text(x0 + j * cell_w + cell_w / 2, ry + 14, word, 10.5, anchor="middle",
                         fill=ink, weight="bold" if st == "fail" else None)
        if is_odd:
            svg.rect(x0 - 0.5, ry + 0.5, cell_w * len(cols) + 1, cell_h - 1, "none",
                     stroke="#ef6c00", stroke_width=2.0)
            diffs = [str(d) for d in odd[n]] or ["differs"]
            note = "odd: " + "; ".join(diffs)
            svg.text(x0 + cell_w * len(cols) + 12, ry + 14,
                     fit(note, width - (x0 + cell_w * len(cols) + 20), 11), 11, fill="#e65100",
                     title=note)
    y += cell_h * len(nodes)
    if first_check:
        sx = x0 + first_check * cell_w
        svg.line(sx, 84 + 22, sx, y, stroke="#546e7a", stroke_width=1.0,
                 stroke_dasharray="3 3")
    y += 18
    if reports:
        svg.text(16, y, "Cells give each node's seconds per step and check.", 11,
                 fill="#607d8b")
        y += 14
    for n in nodes:
        if n in odd:
            line = "odd node %s: %s" % (n, "; ".join(str(d) for d in odd[n]) or "differs")
            svg.text(16, y + 4, fit(line, width - 32, 11), 11, fill="#e65100", title=line)
            y += 16
    for n in nodes:
        if n in missing:
            line = "no report from %s: %s" % (n, " | ".join(str(w) for w in missing[n]))
            svg.text(16, y + 4, fit(line, width - 32, 11), 11, fill="#6d4c41", title=line)
            y += 16
    desc = "; ".join("%s: %s" % (n, "no report" if n in missing else ", ".join(
        "%s %s" % (h, (rows.get(n) or {}).get(c, "-")) for h, c in zip(heads, cols)))
        for n in nodes)
    return svg.render(width, y + 12, title, desc)
RB_PY_46F06310
  cat >"${dir}"/rbview/page.py <<'RB_PY_DD350837'
"""report.html: the pictures, where a run that did not pass stopped, the steps, each host's checks
(each group of identical nodes' for a fan-out) and the fan-out comparison."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .nodes import fold
from rbrules.common import human

from .svg import FONT, esc


CSS = """body{font-family:%s;margin:24px;color:#212121;max-width:1100px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px}img{max-width:100%%;border:1px solid #cfd8dc}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{border:1px solid #cfd8dc;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eceff1}td.num{text-align:right}.ok,.pass{color:#2e7d32;font-weight:bold}
.failed,.fail{color:#c62828;font-weight:bold}.skip{color:#607d8b}.interrupted{color:#ef6c00}
code{font-size:12px}""" % FONT


def page(report: Dict[str, Any], pictures: List[str], fanout: Optional[Dict[str, Any]]) -> str:
    name = str(report.get("runbook", "?"))
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           "<title>runbook %s: %s</title>" % (esc(name), esc(report.get("outcome", "?"))),
           "<style>%s</style></head><body>" % CSS,
           "<h1>runbook %s: <span class=\"%s\">%s</span></h1>" % (
               esc(name), esc(report.get("outcome", "?")),
               esc(report.get("outcome", "?"))),
           "<p>spec <code>%s</code> (sha256 <code>%s</code>); <a href=\"report.json\">report.json"
           "</a></p>" % (esc(report.get("spec", "?")),
                         esc(str(report.get("spec_sha256", ""))[:12]))]
    if report.get("where"):
        # where a run that did not pass stopped, under the heading
        out.insert(5, "<p class=\"%s\">%s %s</p>" % (esc(report.get("outcome")),
                                                esc(report.get("outcome")), esc(report["where"])))
    for p in pictures:
        out.append('<p><a href="%s"><img src="%s" alt="%s"></a></p>' % (
            esc(p), esc(p), esc(p.rsplit(".", 1)[0])))
    out.append("<h2>Steps</h2><table><tr><th>step</th><th>host</th><th>status</th>"
               "<th>seconds</th><th>detail</th></tr>")
    for s in report.get("steps") or []:
        f = s.get("facts") or {}
        said = []
        if "bytes" in f:
            said.append(human(f["bytes"]) + (" in %s files" % f["files"] if "files" in f else ""))
        if "mb_s" in f:
            said.append("%s MB/s" % f["mb_s"])
        detail = "; ".join([", ".join(said)] * bool(said) + [str(s.get("detail") or "")] *
                           bool(s.get("detail")))
        d = s.get("duration_s")
        out.append("<tr><td>%s</td><td>%s</td><td class=\"%s\">%s</td><td class=num>%s</td>"
                   "<td>%s</td></tr>" % (
                       esc(s.get("id")), esc(s.get("host") or "-"), esc(s.get("status", "")),
                       esc(s.get("status")), "%.1f" % d if isinstance(d, (int, float)) else "-",
                       esc(detail)))
    out.append("</table>")
    if fanout:
        out.append(_fanout_html(fanout))
    c = report.get("checks") or {}
    out.append("<h2>Checks</h2><p>%s passed, %s failed, %s skipped</p>" % (
        esc(c.get("pass", 0)), esc(c.get("fail", 0)), esc(c.get("skip", 0))))
    probes = report.get("probes") or {}
    if fanout:
        # one table per group of identical rows (a node of each): a table per node does not
        # scale to a cluster, and the nodes of a group passed and failed the same checks
        reports = fanout.get("reports") or {}
        for g in fanout.get("groups") or []:
            g = [str(n) for n in g]
            doc = probes.get(g[0]) or (reports.get(g[0]) or {}).get("probe")
            out.append("<h3>node %s</h3>" % esc(g[0]) if len(g) == 1 else
                       "<h3>nodes %s (%d; seconds of %s)</h3>" % (esc(fold(g)), len(g), esc(g[0])))
            out.append(_checks_table(doc))
    else:
        for host in sorted(probes):
            out.append("<h3>host %s</h3>" % esc(host))
            out.append(_checks_table(probes[host]))
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _checks_table(doc: Any) -> str:
    """One host's checks: id, level, status, seconds, reason."""
    if not isinstance(doc, dict) or not isinstance(doc.get("checks"), list):
        why = doc.get("error") if isinstance(doc, dict) and doc.get("error") else "no checks ran"
        return "<p>%s</p>" % esc(why)
    out = ["<table><tr><th>check</th><th>level</th><th>status</th><th>seconds</th>"
           "<th>reason</th></tr>"]
    for chk in doc["checks"]:
        if not isinstance(chk, dict):
            continue
        d = chk.get("duration_s")
        out.append("<tr><td>%s</td><td>%s</td><td class=\"%s\">%s</td><td class=num>%s</td>"
                   "<td>%s</td></tr>" % (
                       esc(chk.get("id")), esc(chk.get("level", "")), esc(chk.get("status", "")),
                       esc(chk.get("status")), "%.2f" % d if isinstance(d, (int, float)) else "-",
                       esc(chk.get("reason") or "")))
    out.append("</table>")
    return "\n".join(out)


def _fanout_html(fanout: Dict[str, Any]) -> str:
    cols = [str(c) for c in fanout.get("columns") or []]
    rows = fanout.get("rows") or {}
    out = ["<h2>Fan-out comparison</h2><p>%d/%d nodes passed; success policy %s needs %s: %s</p>"
           % (len(fanout.get("ok_nodes") or []), len(fanout.get("nodes") or []),
              esc(fanout.get("success", "?")), esc(fanout.get("needed", "?")),
              "met" if fanout.get("passed") else "<b class=failed>NOT met</b>")]
    out.append("<table><tr><th>nodes</th><th>count</th>%s</tr>" % "".join(
        "<th>%s</th>" % esc(c[6:] if c.startswith("check:") else c) for c in cols))
    for g in fanout.get("groups") or []:
        r = rows.get(g[0]) or {}
        out.append("<tr><td>%s</td><td class=num>%d</td>%s</tr>" % (
            esc(fold([str(n) for n in g])), len(g), "".join(
                "<td class=\"%s\">%s</td>" % (esc(r.get(c, "-")), esc(r.get(c, "-")))
                for c in cols)))
    out.append("</table>")
    odd = fanout.get("odd") or {}
    if odd:
        out.append("<h3>Odd nodes</h3><ul>")
        for n in fanout.get("nodes") or []:
            if n in odd:
                out.append("<li><b>%s</b>: %s</li>" % (esc(n), esc("; ".join(
                    str(d) for d in odd[n]) or "differs")))
        out.append("</ul>")
    missing = fanout.get("missing") or {}
    if missing:
        out.append("<h3>Missing nodes</h3><ul>")
        for n in fanout.get("nodes") or []:
            if n in missing:
                out.append("<li><b>%s</b>: %s</li>" % (esc(n), esc(" | ".join(
                    str(w) for w in missing[n]))))
        out.append("</ul>")
    return "\n".join(out)
RB_PY_DD350837
  cat >"${dir}"/rbview/svg.py <<'RB_PY_9BE74B61'
"""The pictures' drawing: colours, the one escaper, numbers and text fitted to a width, and `Svg`,
elements written by hand (no plotting library: the controller has nothing more than the stdlib
either). Every text from the run goes through `esc`."""

from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Optional, Tuple

FONT = "DejaVu Sans, Verdana, Helvetica, Arial, sans-serif"
CHAR = 0.6            # a character's width, in font sizes (a generous average for sans fonts)
COLOURS = {           # status -> (fill, text on it)
    "ok": ("#2e7d32", "#ffffff"), "pass": ("#2e7d32", "#ffffff"),
    "failed": ("#c62828", "#ffffff"), "fail": ("#c62828", "#ffffff"),
    "interrupted": ("#ef6c00", "#ffffff"),
    "skip": ("#90a4ae", "#000000"),
    "-": ("#eceff1", "#607d8b"),
    "missing": ("#ffffff", "#6d4c41"),
}
OTHER = ("#7e57c2", "#ffffff")
RATE = "#1565c0"
_BAD_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# every attribute is written in double quotes, so ' needs no reference
_REFS = (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&quot;"), ("\n", "&#10;"),
         ("\r", "&#13;"), ("\t", "&#9;"))


def clean(value: Any) -> str:
    """Any value as text XML can hold (control characters and lone surrogates replaced)."""
    return _BAD_XML.sub("\ufffd", str(value))


def esc(value: Any) -> str:
    """The one escaper: any value as text for SVG or HTML, inside an element or a double-quoted
    attribute (clean's characters, then & < > " and the whitespace an attribute would fold, as
    references). xml.sax.saxutils is not used: importing it costs a report ~30 ms (urllib, ssl)."""
    text = clean(value)
    for old, new in _REFS:
        text = text.replace(old, new)
    return text


def num(v: float) -> str:
    text = "%.1f" % v
    return text[:-2] if text.endswith(".0") else text


def fit(text: str, width: float, size: float) -> str:
    """TEXT cut to what fits in WIDTH pixels at font SIZE (an estimate), with an ellipsis."""
    text = clean(text)
    room = int(width / (size * CHAR))
    if len(text) <= room:
        return text
    return text[:max(0, room - 1)] + "\u2026" if room > 0 else ""


def wrap(text: str, width: float, size: float, most: int) -> List[str]:
    """TEXT in lines that fit WIDTH at font SIZE, cut at spaces where it can, MOST lines at most
    (the last one ends with an ellipsis when text is left)."""
    room = max(8, int(width / (size * CHAR)))
    lines, rest = [], clean(text)
    while rest and len(lines) < most:
        if len(rest) <= room:
            lines.append(rest)
            rest = ""
            break
        cut = rest.rfind(" ", room // 2, room)
        cut = cut if cut > 0 else room
        lines.append(rest[:cut])
        rest = rest[cut:].lstrip(" ")
    if rest:
        lines[-1] = fit(lines[-1] + " " + rest, width, size)
    return lines


def secs(s: Optional[float]) -> str:
    if s is None:
        return ""
    if s < 0.1:
        return "%d ms" % round(s * 1000)
    if s < 10:
        return "%.1f s" % s
    if s < 600:
        return "%d s" % round(s)
    return "%d min %02d s" % (int(s) // 60, int(round(s)) % 60)




def nice(span: float, ticks: int = 8) -> float:
    """A tick step of 1, 2 or 5 times a power of ten giving at most about TICKS ticks."""
    raw = max(span, 1e-9) / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def colour(status: str) -> Tuple[str, str]:
    return COLOURS.get(status, OTHER)


def status_word(status: str) -> str:
    return {"ok": "ok", "pass": "pass", "failed": "FAILED", "fail": "FAIL",
            "interrupted": "INTERRUPTED", "skip": "skip", "-": "not run"}.get(status, status)


class Svg:
    """Elements as text, in the order drawn."""

    def __init__(self) -> None:
        self.parts: List[str] = []

    def add(self, tag: str, attrs: Dict[str, Any], text: Optional[str] = None,
            title: Optional[str] = None) -> None:
        a = "".join(' %s="%s"' % (k.rstrip("_").replace("_", "-"),
                                esc(num(v) if isinstance(v, float) else v))
                    for k, v in attrs.items() if v is not None)
        inner = ("<title>%s</title>" % esc(title) if title else "") + (esc(text) if text else "")
        self.parts.append("<%s%s>%s</%s>" % (tag, a, inner, tag) if inner else "<%s%s/>" % (tag, a))

    def rect(self, x: float, y: float, w: float, h: float, fill: str, title: Optional[str] = None,
             **kw: Any) -> None:
        self.add("rect", dict(x=float(x), y=float(y), width=float(max(w, 0)),
                              height=float(max(h, 0)), fill=fill, **kw), title=title)

    def text(self, x: float, y: float, text: str, size: float = 12, anchor: str = "start",
             fill: str = "#212121", weight: Optional[str] = None, title: Optional[str] = None,
             **kw: Any) -> None:
        self.add("text", dict(x=float(x), y=float(y), font_size=num(size),
                              text_anchor=anchor if anchor != "start" else None, fill=fill,
                              font_weight=weight, **kw), text, title)

    def line(self, x1: float, y1: float, x2: float, y2: float, stroke: str = "#b0bec5",
             **kw: Any) -> None:
        self.add("line", dict(x1=float(x1), y1=float(y1), x2=float(x2), y2=float(y2),
                              stroke=stroke, **kw))

    def render(self, width: float, height: float, title: str, desc: str) -> str:
        head = ('<?xml version="1.0" encoding="UTF-8"?>\n'
                '<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" '
                'viewBox="0 0 %s %s" font-family="%s" role="img">\n<title>%s</title>\n'
                '<desc>%s</desc>\n<rect width="100%%" height="100%%" fill="#ffffff"/>\n'
                % (num(width), num(height), num(width), num(height), esc(FONT), esc(title),
                   esc(desc)))
        return head + "\n".join(self.parts) + "\n</svg>\n"


def legend(svg: Svg, x: float, y: float, items: List[Tuple[str, str, str]]) -> float:
    """Swatches with labels from X on the line Y: (fill, stroke, label). Returns the end x."""
    for fill, stroke, label in items:
        svg.rect(x, y - 10, 14, 12, fill, stroke=stroke, stroke_width=1.0)
        svg.text(x + 19, y, label, 12)
        x += 19 + len(label) * 12 * CHAR + 18
    return x


def host_label(host: str) -> str:
    if not host:
        return "this machine"
    if "->" in host:
        return "hosts " + " \u2192 ".join(host.split("->"))
    return "host " + host
RB_PY_9BE74B61
  cat >"${dir}"/rbview/timeline.py <<'RB_PY_39D39694'
"""timeline.svg: one row per step, grouped in one band per host, on a time axis in seconds (from
the step lines of the event log), each host's checks under its band, and the transfer rate over
time (from `progress` lines when the log has them, else the transfer's average rate)."""

from __future__ import annotations

import math
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from rbrules.common import human

from .svg import (CHAR, RATE, Svg, colour, fit, legend, host_label, nice, num, secs, status_word,
                  wrap)

Samples = Dict[Tuple[str, str], List[Tuple[int, int]]]    # (step, host) -> [(t_ms, bytes)]


def read_log(path: str) -> Tuple[List[Dict[str, Any]], Samples]:
    """Steps with their start and end (ms) and the progress samples per (step, host), in file
    order; lines that do not parse are skipped (a log cut short by a crash still draws)."""
    steps: List[Dict[str, Any]] = []
    samples: Samples = {}
    if not path or not os.path.exists(path):
        return steps, samples
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            try:
                if parts[0] == "step" and len(parts) >= 7:
                    steps.append({"id": parts[1], "status": parts[2], "start": int(parts[3]),
                                  "end": max(int(parts[3]), int(parts[4])),
                                  "host": parts[5], "detail": parts[6]})
                elif parts[0] == "progress" and len(parts) >= 5:
                    samples.setdefault((parts[1], parts[2]), []).append(
                        (int(parts[3]), int(parts[4])))
            except ValueError:
                continue
    return steps, samples


def from_report(report: Dict[str, Any]) -> List[Dict[str, Any]]:
    """No event log: the report's steps one after the other, by their durations."""
    steps, t = [], 0
    for s in report.get("steps", []):
        ms = int(round(float(s.get("duration_s") or 0) * 1000))
        steps.append({"id": s.get("id", "?"), "status": s.get("status", "?"), "start": t,
                      "end": t + ms, "host": s.get("host") or "", "detail": s.get("detail", "")})
        t += ms
    return steps


def _check_rows(report: Dict[str, Any], host: str, steps: List[Dict[str, Any]]
                ) -> List[Dict[str, Any]]:
    """HOST's checks as rows with a start and end (ms) where they can be placed: one after the
    other from the probe's start, which is its own clock's; when that falls outside the step that
    ran the probe on HOST (clocks differ), from that step's start."""
    doc = (report.get("probes") or {}).get(host)
    if not isinstance(doc, dict) or not isinstance(doc.get("checks"), list):
        return []
    probe = [s for s in steps if s["host"] == host and "probe" in s["id"]]
    started = doc.get("started")
    t: Optional[float] = None
    if isinstance(started, (int, float)):
        t = float(started) * 1000
    if probe and (t is None or not probe[-1]["start"] <= t <= probe[-1]["end"]):
        t = float(probe[-1]["start"])
    # where the probe says when each check ran (its `schedule`: checks overlap), each row is
    # placed there; else one after the other
    schedule = {}
    for item in doc.get("schedule") or []:
        if isinstance(item, dict) and all(isinstance(item.get(k), (int, float))
                                          for k in ("start_s", "end_s")):
            schedule[str(item.get("id"))] = (float(item["start_s"]), float(item["end_s"]))
    t0 = t
    rows = []
    for c in doc["checks"]:
        if not isinstance(c, dict):
            continue
        d = c.get("duration_s")
        d = float(d) if isinstance(d, (int, float)) else None
        row = {"id": str(c.get("id", "?")), "status": str(c.get("status", "?")), "check": True,
               "detail": str(c.get("reason") or ""), "level": c.get("level"), "seconds": d,
               "start": None, "end": None}
        at = schedule.get(row["id"])
        if t0 is not None and at is not None:
            row["start"], row["end"] = t0 + at[0] * 1000, t0 + at[1] * 1000
        elif t is not None and d is not None:
            row["start"], row["end"] = t, t + d * 1000
            t += d * 1000
        rows.append(row)
    return rows


def _rates(steps: List[Dict[str, Any]], report: Dict[str, Any],
           samples: Samples) -> List[Dict[str, Any]]:
    """Rate series per transfer: from progress samples (MB/s between successive samples) when
    there are at least two, else the step's average (fact mb_s) over the step."""
    facts = {}
    for s in report.get("steps", []):
        if isinstance(s, dict) and s.get("facts"):
            facts.setdefault(s.get("id"), s["facts"])
    out = []
    for s in steps:
        got = sorted(set(samples.get((s["id"], s["host"]), [])))
        f = facts.get(s["id"], {})
        if len(got) >= 2:
            pts = []
            for (t1, b1), (t2, b2) in zip(got, got[1:]):
                if t2 > t1:
                    pts.append((t1, t2, max(0.0, (b2 - b1) / (t2 - t1) / 1000.0)))
            if pts:
                total = (got[-1][1] - got[0][1]) / max(1, got[-1][0] - got[0][0]) / 1000.0
                out.append({"step": s, "points": pts, "average": total, "sampled": True,
                            "bytes": f.get("bytes", got[-1][1])})
                continue
        if isinstance(f.get("mb_s"), (int, float)) and s["end"] > s["start"]:
            out.append({"step": s, "points": [(s["start"], s["end"], float(f["mb_s"]))],
                        "average": float(f["mb_s"]), "sampled": False, "bytes": f.get("bytes")})
    return out


class Axis:
    """Time (ms) to x, and the ticks of the time axis: 1, 2 or 5 times a power of ten seconds."""

    def __init__(self, t0: float, span: float, x0: float, x1: float) -> None:
        self.t0, self.x0, self.x1 = t0, x0, x1
        self.scale = (x1 - x0) / span
        step = nice(span / 1000.0) * 1000
        self.ticks = [n * step for n in range(int(span / step + 1e-9) + 1)]

    def x(self, t: float) -> float:
        return self.x0 + (t - self.t0) * self.scale

    def draw(self, svg: Svg, y: float) -> None:
        svg.line(self.x0, y, self.x1, y, stroke="#546e7a", stroke_width=1.0)
        for t in self.ticks:
            gx = self.x0 + t * self.scale
            svg.line(gx, y, gx, y + 5, stroke="#546e7a", stroke_width=1.0)
            svg.text(gx, y + 18, "%s s" % num(t / 1000.0), 11, anchor="middle", fill="#37474f")

    def grid(self, svg: Svg, top: float, bottom: float, colour: str) -> None:
        for t in self.ticks:
            gx = self.x0 + t * self.scale
            svg.line(gx, top, gx, bottom, stroke=colour, stroke_width=1.0)


def _bar(svg: Svg, axis: Axis, r: Dict[str, Any], host: str, mid: float) -> None:
    """One step's or check's bar at height MID, its time (and, when it did not pass, its status
    and detail) beside it, on the side with more room."""
    fill = colour(r["status"])[0]
    bx, bw = axis.x(r["start"]), max(3.0, (r["end"] - r["start"]) * axis.scale)
    h = 14.0 if not r["check"] else 10.0
    took = (r["end"] - r["start"]) / 1000.0
    tip = "%s %s on %s: %s, %s%s" % ("check" if r["check"] else "step", r["id"],
                                     host or "this machine", status_word(r["status"]),
                                     secs(took), (": " + r["detail"]) if r["detail"] else "")
    svg.rect(bx, mid - h / 2, bw, h, fill, title=tip, rx=2.0)
    note = secs(took)
    if r["status"] not in ("ok", "pass"):
        note = "%s %s%s" % (status_word(r["status"]), note,
                            (": " + r["detail"]) if r["detail"] else "")
    weight = "bold" if r["status"] in ("failed", "fail", "interrupted") else None
    ink = {"ok": "#37474f", "pass": "#37474f", "skip": "#546e7a"}.get(r["status"], fill)
    after, before = axis.x1 - (bx + bw) - 6, bx - axis.x0 - 6
    if after >= before or after >= 200:
        svg.text(bx + bw + 6, mid + 4, fit(note, after, 11), 11, fill=ink, weight=weight,
                 title=tip)
    else:
        svg.text(bx - 6, mid + 4, fit(note, before, 11), 11, anchor="end", fill=ink,
                 weight=weight, title=tip)


def _rate_panel(svg: Svg, axis: Axis, rates: List[Dict[str, Any]], y: float) -> float:
    """The transfer rate (MB/s) on the timeline's time axis, from Y; returns the y below it.
    Sampled rates are a solid step curve, an average alone a dashed line over its step."""
    panel_h = 90.0
    top = max(p[2] for r in rates for p in r["points"]) or 1.0
    ystep = nice(top, 3)
    ymax = ystep * math.ceil(top * 1.25 / ystep)
    svg.text(16, y + 4, "transfer rate", 13, weight="bold", fill="#263238")
    y += 14

    def Y(v: float) -> float:
        return y + panel_h - v / ymax * panel_h

    for k in range(int(ymax / ystep + 1e-9) + 1):
        svg.line(axis.x0, Y(k * ystep), axis.x1, Y(k * ystep), stroke="#eceff1",
                 stroke_width=1.0)
        svg.text(axis.x0 - 8, Y(k * ystep) + 4, "%s MB/s" % num(k * ystep), 11, anchor="end",
                 fill="#37474f")
    axis.grid(svg, y, y + panel_h, "#eceff1")

    def xy(t: float, v: float) -> str:
        return "%s,%s" % (num(axis.x(t)), num(Y(v)))

    for r in rates:
        s, points = r["step"], r["points"]
        line = [xy(t, v) for a, b, v in points for t in (a, b)]
        first, last = points[0][0], points[-1][1]
        svg.add("polygon", {"points": " ".join([xy(first, 0)] + line + [xy(last, 0)]),
                            "fill": RATE, "fill-opacity": "0.15"})
        svg.add("polyline", {"points": " ".join(line), "fill": "none", "stroke": RATE,
                             "stroke-width": "2",
                             "stroke-dasharray": None if r["sampled"] else "6 3"},
                title="%s on %s: %s" % (s["id"], s["host"] or "this machine",
                                        "sampled" if r["sampled"] else "average only"))
        what = "%s%s: %s MB/s average%s" % (
            s["id"], (" " + human(r["bytes"])) if r["bytes"] is not None else "",
            num(r["average"]), "" if r["sampled"] else " (no progress samples: average only)")
        lx, ly = axis.x(first), Y(max(p[2] for p in points)) - 6
        if lx + len(what) * 11 * CHAR > axis.x1:
            svg.text(min(axis.x1, axis.x(last)), ly, what, 11, anchor="end", fill=RATE)
        else:
            svg.text(lx, ly, what, 11, fill=RATE)
    axis.draw(svg, y + panel_h)
    return y + panel_h + 30


def timeline(report: Dict[str, Any], steps: List[Dict[str, Any]],
             samples: Samples, timed: bool = True) -> str:
    """The timeline picture (see the module's docstring). TIMED: the steps have real start
    times (else they were laid one after the other from their durations)."""
    hosts: List[str] = []
    for s in steps:
        if s["host"] not in hosts:
            hosts.append(s["host"])
    bands = [(h, [dict(s, check=False) for s in steps if s["host"] == h] +
              _check_rows(report, h, steps)) for h in hosts]
    times = [r[k] for _, rows in bands for r in rows for k in ("start", "end")
             if r[k] is not None]
    t0 = min(times) if times else 0
    total = (max(times) - t0) / 1000.0 if times else 0.0
    rates = _rates(steps, report, samples)
    width = 1000.0
    labels = [("\u00b7 " + r["id"]) if r["check"] else r["id"] for _, rows in bands for r in rows]
    left = min(240.0, max(110.0, 40 + max([len(x) for x in labels] or [8]) * 12 * CHAR))
    axis = Axis(t0, max(1000.0, total * 1000), left, width - 24)

    svg = Svg()
    outcome = str(report.get("outcome", "?"))
    where = (" (%s)" % report["where"]) if report.get("where") else ""
    title = "runbook %s: %s%s, %s" % (report.get("runbook", "?"), outcome, where, secs(total))
    svg.text(16, 26, fit(title, width - 32, 17), 17, weight="bold",
             fill=colour("failed")[0] if outcome not in ("ok", "?") else "#212121")
    c = report.get("checks") or {}
    sub = "spec %s; %d step%s on %d host%s" % (
        report.get("spec", "?"), len(steps), "" if len(steps) == 1 else "s", len(hosts),
        "" if len(hosts) == 1 else "s")
    if report.get("probes") or any(c.get(k) for k in ("pass", "fail", "skip")):
        sub += "; checks %s passed, %s failed, %s skipped" % (
            c.get("pass", 0), c.get("fail", 0), c.get("skip", 0))
    if times and timed and t0 > 1e11:
        sub += "; started %s UTC" % time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0 / 1000.0))
    if not timed:
        sub += "; no event log: steps laid end to end by duration"
    svg.text(16, 46, fit(sub, width - 32, 12), 12, fill="#455a64")
    statuses = ["ok", "failed"] + sorted({r["status"] for _, rows in bands for r in rows} -
                                         {"ok", "failed", "pass", "fail"})
    items = [(colour(s)[0], colour(s)[0], {"ok": "ok / pass"}.get(s, s)) for s in statuses]
    legend(svg, 16, 70, items + [(RATE, RATE, "transfer rate")] * bool(rates))

    # host bands (behind), the grid, then the rows: a label and a bar each
    y = top = 88.0
    failed: List[Dict[str, Any]] = []
    body = Svg()
    for i, (host, rows) in enumerate(bands):
        svg.rect(8, y, width - 16, 30 + 22 * len(rows), "#f5f7f8" if i % 2 == 0 else "#eef2f4")
        body.text(16, y + 17, host_label(host), 13, weight="bold", fill="#263238")
        y += 24
        for r in rows:
            mid = y + 11
            label = ("\u00b7 " + r["id"]) if r["check"] else r["id"]
            body.text(left - 10, mid + 4, fit(label, left - 26, 12), 12 if not r["check"] else 11,
                      anchor="end", fill="#37474f" if r["check"] else "#212121",
                      weight="bold" if r["status"] in ("failed", "fail") else None)
            if r["start"] is None:
                body.text(left + 4, mid + 4, "%s (no time)" % status_word(r["status"]), 11,
                          fill="#607d8b")
            else:
                _bar(body, axis, r, host, mid)
                if r["status"] in ("failed", "interrupted", "fail"):
                    failed.append(dict(r, host=host))
            y += 22
        y += 6
    axis.grid(svg, top, y + 4, "#cfd8dc")
    svg.parts += body.parts
    axis.draw(svg, y + 4)
    svg.text(left - 22, y + 22, "time", 11, anchor="end", fill="#37474f")
    y += 34
    if rates:
        y = _rate_panel(svg, axis, rates, y + 10)

    # what failed, in words, under the picture
    for r in failed:
        y += 6
        line = "%s: %s %s on host %s after %s%s" % (
            status_word(r["status"]), "check" if r["check"] else "step", r["id"],
            r["host"] or "(this machine)",
            secs((r["end"] - r["start"]) / 1000.0), (": " + r["detail"]) if r["detail"] else "")
        for part in wrap(line, width - 32, 12, 4):
            svg.text(16, y + 10, part, 12, weight="bold", fill=colour(r["status"])[0],
                     title=line)
            y += 16
    desc = "; ".join("%s on %s: %s %s" % (r["id"], h or "this machine", r["status"],
                                          secs((r["end"] - r["start"]) / 1000.0))
                     for h, rows in bands for r in rows if not r["check"])
    return svg.render(width, y + 12, title, desc)
RB_PY_39D39694
  # what the hosts are sent: the host packages only (the pictures' rbview stays here)
  tar -C "${dir}" -cf "${RB_WORK}/kit.tar" rbkit rbprobes rbrules
  RB_KIT_TAR_SHA256=$(rb::sha256 "${RB_WORK}/kit.tar")
}

#######################################
# Step 1/8: preflight (device/relay.yaml:8)
# Reach every host, ship the kit, check the source is a venv after the excludes, take the destination's lock, check its state and free space.
#######################################
step_preflight() {
  local need src_kit identity
  # every host at once: tools, python3, compressors, the kit (one command and reply each)
  rb::hosts_prepare "${RB_HOSTS[@]}"
  rb::preflight_route
  rb::preflight_compression
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  # the source's scan (refused unless what the excludes leave is a venv with files, pyvenv.cfg
  # and bin/python sent), then its static checks: one engine process there, in the background
  rb::source_start "${src_kit}/${RB_NAME}.names"
  # meanwhile the destination's engine for the run: from here on it holds the destination's
  # lock; it says what the install there recorded of its source (the same tree: no audit)
  rb::engine_start
  RB_ENGINE_STATE=${RB_J[state]}
  # compression: auto on the relay: measured meanwhile, beside the scan (unless a re-run)
  rb::measure_start "${RB_J[installed_stat]}"
  rb::source_finish "${RB_J[installed_stat]}"
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
  # never into the source, nor inside it, nor the reverse, whatever the names
  rb::engine preflight "need=${need}" "source_identity=${identity}"
  RB_DST_INSTALLED=${RB_J[installed]}
  RB_STAGING=${RB_J[staging]}
  if ((RB_MEASURING)) && ! rb::measure_finish; then
    rb::compression_fallback
  fi
  RB_STEP_DETAIL="route ${RB_ROUTE_USED}, compression ${RB_COMPRESSION_USED}"
}

#######################################
# Decide the stream's compression: with auto, on the relay by measurement (the link's rate
# against each compressor on the tree), started later beside the scan (rb::measure_start) and
# taken at preflight's end (rb::measure_finish); else rb::compression_fallback.
#######################################
rb::preflight_compression() {
  RB_MEASURING=0
  if [[ "${RB_COMPRESSION}" == auto && "${RB_SRC_HOST}" == "${RB_DST_HOST}" ]] && rb::is_local "${RB_SRC_HOST}"; then
    RB_COMPRESSION_USED=none
    rb::log "compression: none (both ends are this machine: no link to save)"
    return 0
  fi
  if [[ "${RB_COMPRESSION}" == auto && "${RB_ROUTE_USED}" == relay ]]; then
    RB_MEASURING=1
    return 0
  fi
  rb::compression_fallback
}

#######################################
# Where the measurement cannot run, and on the direct route: with auto, none when every machine
# the stream passes through runs one kernel (the same boot id: one host's namespaces or
# containers: no link to save, only CPU to spend); else from the spec and what both ends have
# (rb::choose_compression).
#######################################
rb::compression_fallback() {
  local boot through=''
  if [[ "${RB_COMPRESSION}" == auto ]] && boot=$(rb::one_kernel "${RB_SRC_HOST}" "${RB_DST_HOST}" "${RB_ROUTE_USED}"); then
    RB_COMPRESSION_USED=none
    if [[ "${RB_ROUTE_USED}" == relay ]]; then
      through=' and this machine'
    fi
    rb::log "compression: none (auto: ${RB_SRC_HOST} ${RB_DST_HOST}${through} run one kernel, boot id" \
      "${boot:0:8}: no link between them to save, only CPU to spend)"
    return 0
  fi
  rb::choose_compression "${RB_SRC_HOST}" "${RB_DST_HOST}"
}

#######################################
# Decide the route: relay through this machine, or direct (the source pushes to the destination);
# with both ends on one host, that host (the sending end starts the receiving ends there).
#######################################
rb::preflight_route() {
  local why
  RB_ROUTE_USED=relay
  if [[ "${RB_SRC_HOST}" == "${RB_DST_HOST}" ]]; then
    RB_ROUTE_USED=one-host
    rb::log "route: one host (both ends on ${RB_SRC_HOST}: the stream stays there)"
    return 0
  fi
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
# Step 2/8: manifest (device/relay.yaml:25)
# Hash every file of the source (in parallel) into a manifest; detect a re-run and what an incremental one must send.
#######################################
step_manifest() {
  RB_SKIP_INSTALL=0
  if ((RB_DST_INSTALLED == 0)); then
    if rb::resume_plan; then
      return 0
    fi
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
  rb::manifest_share "${RB_FINGERPRINT}"
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
# The source or the destination changed since the install: send only what differs (the engine
# links the unchanged files into a new staging). An unchanged source is not hashed: its manifest
# as of the install stands for it (engine.kept_source). Else the install's manifest goes to the
# source, whose unchanged files (same mode, size and mtime) keep their recorded digests.
#######################################
rb::delta_plan() {
  local src_kit sent linked i have
  local -a kept=(delta=1 "source_stat=${RB_SRC_STAT}" "algo=${RB_VERIFY}")
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  for ((i = 1; i < ${#RB_EXCLUDE_ARGS[@]}; i += 2)); do
    kept+=("exclude=${RB_EXCLUDE_ARGS[i]}")
  done
  rb::engine stage "${kept[@]}"
  if [[ "${RB_J[kept]:-0}" == 1 ]]; then
    RB_FINGERPRINT=${RB_J[fingerprint]}
    rb::fact manifest_files "${RB_J[files]}"
    have=$(rb::kept_fingerprint)
    if [[ "${RB_J[rebuilt]}" == 1 && "${have}" != "${RB_FINGERPRINT}" ]]; then
      # rebuilt there from the install's record: this machine keeps a copy unless it has it
      rb::kept_fingerprint ''
      rb::on_host "${RB_DST_HOST}" cat "${RB_J[manifest]}" >"${RB_STATE_DIR}/manifest.jsonl"
      rb::kept_fingerprint "${RB_FINGERPRINT}"
    fi
    rb::log "the source is unchanged since the install: its manifest as of then (fingerprint" \
      "${RB_FINGERPRINT:0:16}) stands for it; nothing is hashed there"
  else
    rb::log "${RB_ENGINE_DETAIL}"
    rb::on_host "${RB_DST_HOST}" cat "${RB_DST_ABS}/.rb-manifest.jsonl" >"${RB_STATE_DIR}/installed.jsonl"
    rb::pipe_on_host "${RB_SRC_HOST}" sh -c 'cat >"$1"' rb "${src_kit}/${RB_NAME}.installed.jsonl" \
      <"${RB_STATE_DIR}/installed.jsonl"
    rb::manifest_build --reuse "${src_kit}/${RB_NAME}.installed.jsonl"
    rb::log "source hashed: ${RB_J[reused]} unchanged files kept the digest recorded at the install"
    rb::manifest_share "${RB_FINGERPRINT}"
    rb::engine stage delta=1
  fi
  RB_HASH_DURING_STREAM=0
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
  RB_STEP_DETAIL="incremental: ${RB_J[send_files]} files to send, ${RB_J[linked]} linked"
  rb::send_names
}

#######################################
# Hash the source into its manifest (on the source, in parallel; the entries preflight's scan
# listed for tar, not a new walk). Sets RB_FINGERPRINT.
# Extra arguments go to `rbkit engine hash` (--reuse FILE).
#######################################
rb::manifest_build() {
  local src_kit
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  rb::engine_once "${RB_SRC_HOST}" hash "${RB_SRC_ABS}" "${RB_EXCLUDE_ARGS[@]}" \
    --algo "${RB_VERIFY}" --jobs "${RB_JOBS}" --out "${src_kit}/${RB_NAME}.manifest.jsonl" \
    --special-modes "${RB_SPECIAL_MODES}" --scanned "${src_kit}/${RB_NAME}.names.stat" "$@"
  rb::manifest_facts
}

rb::manifest_facts() {
  RB_FINGERPRINT=${RB_J[fingerprint]}
  rb::fact manifest_files "${RB_J[files]}"
  rb::log "manifest: ${RB_ENGINE_DETAIL}"
}

#######################################
# A cut stream of this source left a staging at the destination (private, marked, never
# installed): hash the source now, keep each file there whose digest is the manifest's, send the
# rest (engine.resume_stage). Returns 1 (nothing done) when there is none to continue.
#######################################
rb::resume_plan() {
  rb::engine resumable "source=${RB_SRC_STAT} ${RB_SRC_HOST}:${RB_SRC_ABS}"
  if [[ "${RB_J[resumable]}" != 1 ]]; then
    if [[ "${RB_ENGINE_DETAIL}" == "an earlier staging"* ]]; then
      rb::log "${RB_ENGINE_DETAIL}: it is removed, and the whole tree sent"
    fi
    return 1
  fi
  rb::log "${RB_ENGINE_DETAIL}: the source is hashed first, to know what arrived whole"
  rb::manifest_build
  rb::manifest_share "${RB_FINGERPRINT}"
  rb::engine stage resume=1 "source=${RB_SRC_STAT} ${RB_SRC_HOST}:${RB_SRC_ABS}"
  RB_HASH_DURING_STREAM=0
  RB_RESUME=1
  RB_SRC_BYTES=${RB_J[send_bytes]}
  RB_SRC_FILES=${RB_J[send_files]}
  rb::fact kept_files "${RB_J[kept]}"
  rb::fact kept_bytes "${RB_J[kept_bytes]}"
  rb::fact send_files "${RB_J[send_files]}"
  rb::log "${RB_ENGINE_DETAIL}"
  RB_STEP_DETAIL="resumed: ${RB_J[kept]} files kept from a cut stream, ${RB_J[send_files]} to send"
  rb::send_names
}

#######################################
# The names the stream must carry, from the destination's engine (RB_J[names]) to the source:
# RB_SEND_NAMES (both ends may be one host: two paths).
#######################################
rb::send_names() {
  local src_kit
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  RB_SEND_NAMES="${src_kit}/${RB_NAME}.send-names"
  rb::on_host "${RB_DST_HOST}" cat "${RB_J[names]}" |
    rb::pipe_on_host "${RB_SRC_HOST}" sh -c 'cat >"$1"' rb "${RB_SEND_NAMES}" ||
    rb::pipe_failed "send names" "read on ${RB_DST_HOST}" "write on ${RB_SRC_HOST}" "${PIPESTATUS[@]}"
}

#######################################
# Step 3/8: transfer (device/relay.yaml:19)
# Stream the source into a staging directory beside the destination.
#######################################
step_transfer() {
  local src_kit start_ms ms bytes hash_pid='' names remote total streams
  local -a send recv
  RB_RELAY_CODES=()
  if ((RB_SKIP_INSTALL)); then
    RB_STEP_DETAIL='skipped: destination already matches the source manifest'
    return 0
  fi
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  names="${src_kit}/${RB_NAME}.names"
  if ((RB_DELTA || RB_RESUME)); then
    names=${RB_SEND_NAMES}      # staging already holds the unchanged files (the manifest step)
  else
    # marked with the source until verify passes: a cut stream's staging is kept for a re-run
    rb::engine stage "source=${RB_SRC_STAT} ${RB_SRC_HOST}:${RB_SRC_ABS}"
  fi
  if ((RB_HASH_DURING_STREAM)); then
    # a background job: hash the source, then copy its manifest here and to the destination
    # while the stream still runs; its failure ends it quietly (rb::on_err), `wait` below sees it
    rb::hash_during_stream "${RB_RUN_DIR}/manifest-build.out" 2>"${RB_RUN_DIR}/manifest-build.err" &
    hash_pid=$!
    RB_BG_PIDS+=("${hash_pid}")
  fi
  # the two ends of the stream are the engine's (send on the source, receive into this run's
  # staging on the destination), with the one compression table
  rb::kit_argv "${RB_SRC_HOST}"
  send=("${RB_KIT_ARGV[@]}" engine send "${RB_SRC_ABS}" "${names}" --compression "${RB_COMPRESSION_USED}")
  rb::kit_argv "${RB_DST_HOST}"
  # receive hashes each file as the stream carries it (verify compares those digests) and says
  # every 5 s how much of the tar stream it unpacked (rb::progress logs it)
  recv=("${RB_KIT_ARGV[@]}" engine receive --dest "${RB_DST_ABS}" --state "${RB_ENGINE_STATE}"
    --compression "${RB_COMPRESSION_USED}" --choices "${RB_ENGINE_CHOICES}" --progress 5)
  rb::log "streaming ${RB_SRC_HOST}:${RB_SRC_ABS} -> ${RB_DST_HOST}:${RB_STAGING} (${RB_ROUTE_USED}," \
    "compression ${RB_COMPRESSION_USED})"
  total=$((${RB_SRC_BYTES:-0} + 768 * ${RB_SRC_FILES:-0}))   # tar: a header and padding a file
  rb::now
  start_ms=${RB_NOW}
  if [[ "${RB_ROUTE_USED}" == one-host ]]; then
    # both ends on one host: the sending end starts the receiving ends there, no ssh between
    # them; several streams side by side where the run may use the cores (rbkit send --jobs)
    rb::on_host "${RB_SRC_HOST}" "${send[@]}" --jobs "${RB_JOBS}" --local "${recv[@]}" |
      rb::progress "${total}" "${start_ms}" >"${RB_WORK}/receive.out" ||
      rb::pipe_failed "stream" "send and receive on ${RB_SRC_HOST}" "progress here" "${PIPESTATUS[@]}"
  elif [[ "${RB_ROUTE_USED}" == direct ]]; then
    remote=$(rb::shq "${recv[@]}")
    rb::on_host "${RB_SRC_HOST}" "${send[@]}" --jobs "${RB_JOBS}" --remote ssh -o BatchMode=yes \
      -c "${RB_SSH_CIPHERS}" "${RB_DIRECT_SSH[@]}" "${remote}" | rb::progress "${total}" "${start_ms}" \
      >"${RB_WORK}/receive.out"
  else
    # through this machine: one pair of ssh clients a stream, side by side (rb::relay_streams);
    # a stream that failed is named by the answer, read below
    rb::relay_streams "${total}" "${start_ms}" "${names}" "${send[@]}" -- "${recv[@]}" || true
  fi
  rb::now
  ms=$((RB_NOW - start_ms))
  if ! rb::engine_read <"${RB_WORK}/receive.out" || [[ "${RB_ENGINE_STATUS}" != ok ]]; then
    rb::fail "the receiving end on ${RB_DST_HOST}: ${RB_ENGINE_DETAIL:-no answer (above)}"
  fi
  if ((${#RB_RELAY_CODES[@]} > 0)); then
    rb::pipe_failed "stream" "relay here (ssh to ${RB_SRC_HOST} and ${RB_DST_HOST})" "progress here" \
      "${RB_RELAY_CODES[@]}"
  fi
  streams=${RB_J[streams]:-1}
  if [[ -n "${hash_pid}" ]]; then
    if ! wait "${hash_pid}"; then
      cat "${RB_RUN_DIR}/manifest-build.err" >&2
      if [[ -s "${RB_RUN_DIR}/manifest-build.out" ]]; then
        rb::fail "copying the source's manifest from ${RB_SRC_HOST} here and to ${RB_DST_HOST}" \
          "failed (above)"
      fi
      rb::fail "hashing the source on ${RB_SRC_HOST} failed (above)"
    fi
    if ! rb::engine_read <"${RB_RUN_DIR}/manifest-build.out"; then
      rb::fail "hashing the source on ${RB_SRC_HOST} said nothing (above)"
    fi
    rb::manifest_facts
    rb::kept_fingerprint "${RB_FINGERPRINT}"
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
  if ((streams > 1)); then
    rb::fact streams "${streams}"
    RB_STEP_DETAIL+=", ${streams} streams side by side"
  fi
  if ((RB_DELTA)); then
    RB_STEP_DETAIL+=", incremental: only changed files sent"
  elif ((RB_RESUME)); then
    RB_STEP_DETAIL+=", resumed: only what the staging lacked sent"
  fi
}

#######################################
# The transfer's background job (no ERR-trap record of its own: RB_WORK is the main shell's):
# hash the source into its manifest (`rbkit engine hash` of the entries preflight's scan listed
# for tar; its answer into $1, written only once it succeeded), then copy that manifest here and
# on to the destination.
#######################################
rb::hash_during_stream() {
  local out=$1 src_kit
  RB_WORK=''
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  rm -f "${out}"
  rb::kit "${RB_SRC_HOST}" engine hash "${RB_SRC_ABS}" "${RB_EXCLUDE_ARGS[@]}" \
    --algo "${RB_VERIFY}" --jobs "${RB_JOBS}" --out "${src_kit}/${RB_NAME}.manifest.jsonl" \
    --special-modes "${RB_SPECIAL_MODES}" --scanned "${src_kit}/${RB_NAME}.names.stat" >"${out}.part"
  mv -f -- "${out}.part" "${out}"
  rb::manifest_share -
}

#######################################
# Step 4/8: verify (device/relay.yaml:25)
# Check the staging against the manifest: every file, mode, link and digest.
#######################################
step_verify() {
  # every entry of this run's staging; files linked unchanged from the current install by stat.
  # The engine leaves its stamp: relocate, prove and swap install only what this run verified.
  rb::engine verify
  RB_STEP_DETAIL=${RB_ENGINE_DETAIL}
}

#######################################
# Step 5/8: relocate (device/relay.yaml:21)
# Rewrite what names the old path (shebangs, activate scripts) for the new one.
#######################################
step_relocate() {
  rb::engine relocate
  rb::fact rewritten "${RB_J[rewritten]:-0}"
  RB_STEP_DETAIL=${RB_ENGINE_DETAIL}
}

#######################################
# Step 6/8: prove (device/relay.yaml:21)
# The staged interpreter runs here and reports the staging as sys.prefix.
#######################################
step_prove() {
  # the staged interpreter must run here before anything is installed (a venv whose base
  # interpreter this host lacks stops here)
  rb::engine prove
  RB_STEP_DETAIL=${RB_ENGINE_DETAIL}
}

#######################################
# Step 7/8: swap (device/relay.yaml:26)
# Put the proven copy in place in one rename, then prove it there (sys.prefix, the console scripts); a failure puts back what was there.
#######################################
step_swap() {
  # one rename, then the post-swap proof there (sys.prefix, the console scripts); the engine puts back what
  # was there when the proof fails
  rb::engine swap
  if [[ -n "${RB_J[backup]:-}" ]]; then
    rb::log "to put the previous destination back: bash ${RB_SELF} --restore"
  fi
  RB_STEP_DETAIL=${RB_ENGINE_DETAIL}
}

#######################################
# Step 8/8: exports (device/relay.yaml:19)
# Write the env file: CUDA_HOME, PATH, LD_LIBRARY_PATH with the venv's libs first.
#######################################
step_exports() {
  # a failure past this run's swap puts back what was there (the engine)
  rb::engine exports
  RB_STEP_DETAIL=${RB_ENGINE_DETAIL}
}

#######################################
# Set up this run: the private scratch directory and this machine's kit, the runbook's directory
# and this run's own (rb::run_dirs: private, or refused; held by one run at a time), the log, ssh
# multiplexing, absolute paths. Nothing is written in either before it is known private and this
# run holds it.
#######################################
rb::init() {
  # this run's scratch directory (mktemp -d: a new name, 0700): this machine's kit, the ssh
  # sockets, and the working directory of every command this runbook starts from here on
  RB_WORK=$(umask 077 && mktemp -d "${TMPDIR:-/tmp}/rb.XXXXXX")
  RB_LOCAL_KIT=${RB_WORK}/kit
  # the real interpreter behind `python3` (a version-manager shim can cost 0.2 s a start); the
  # pinned form's start found it already
  if [[ "${RB_LOCAL_PY}" == python3 ]]; then
    RB_LOCAL_PY=$(cd / && python3 "${RB_PY_FLAGS[@]}" -c 'import sys; print(sys.executable)')
  fi
  rb::kit_write "${RB_LOCAL_KIT}"
  rb::run_dirs
  RB_EVENTS="${RB_RUN_DIR}/events.tsv"
  rm -f -- "${RB_EVENTS}" "${RB_RUN_DIR}/run.log"
  : >"${RB_EVENTS}"
  : >"${RB_RUN_DIR}/run.log"
  # the log's copy: tee's status is no step's, and it ignores the signals a Ctrl-C sends the run's
  # whole process group (gone, the next line this shell writes would end it with SIGPIPE)
  # shellcheck disable=SC2312
  exec 2> >(trap '' INT TERM HUP && exec tee -a "${RB_RUN_DIR}/run.log" >&2)
  RB_SSH_COMMON=(-o BatchMode=yes -o ControlMaster=auto -o "ControlPath=${RB_WORK}/ssh-%C"
    -o ControlPersist=300 -o ServerAliveInterval=15 -o ServerAliveCountMax=4
    -c "${RB_SSH_CIPHERS}")
  RB_SRC_ABS=$(rb::abspath "${RB_SRC_HOST}" "${RB_SRC_PATH}")
  RB_DST_ABS=$(rb::abspath "${RB_DST_HOST}" "${RB_DST_PATH}")
  rb::install_paths
  cd "${RB_WORK}"
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
  if [[ -z "${RB_WORK}" ]]; then
    return 0
  fi
  # the background jobs and what they started (an ssh client, a kit's Python, its tar)
  if ((${#RB_BG_PIDS[@]} > 0)); then
    rb::kill_tree "${RB_BG_PIDS[@]}"
  fi
  rb::close_hosts
  rm -rf "${RB_WORK}"
  if [[ -n "${RB_RUN_LOCK}" ]]; then
    rm -rf -- "${RB_RUN_LOCK}"
  fi
}

#######################################
# --restore [N]: put backup N (default: the newest whose checks passed) back at the destination,
# saying which and why; the current install becomes the newest backup (kept apart as
# DEST.rb-failed when its checks failed); then the checks run on what was put back.
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
  rb::restore_checks
  rb::engine_stop
  RB_FINISHED=1
}

#######################################
# Parse the command line, then run the chosen steps in order.
#######################################
main() {
  local only='' from='' id run=0 restore='' list_backups=0 plan=0 markdown=0
  RB_APPLY_PLAN=''
  RB_PLANNING=0
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
      --list-backups) list_backups=1 ;;
      --plan) plan=1; RB_PLANNING=1 ;;
      --markdown) markdown=1 ;;
      --apply) RB_APPLY_PLAN=${2:?--apply needs a plan.json}; shift ;;
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
  if ((plan)) || [[ -n "${RB_APPLY_PLAN}" ]]; then
    # the live plan (runtime/liveplan.sh.j2): a single-host move, every step
    if [[ "${RB_STEPS[0]}" != preflight || -n "${only}${from}" ]]; then
      echo "--plan and --apply are for every step of a single-host move (not a fan-out, not" \
        "with --only or --from); --dry-run shows the steps" >&2
      return 2
    fi
    if [[ -n "${RB_APPLY_PLAN}" && "${RB_APPLY_PLAN}" != /* ]]; then
      RB_APPLY_PLAN=${PWD}/${RB_APPLY_PLAN}
    fi
  fi
  rb::check_sealed || return 2
  trap 'rb::on_err "${LINENO}"' ERR
  trap 'rb::on_signal INT' INT
  trap 'rb::on_signal TERM' TERM
  trap 'rb::on_signal HUP' HUP
  trap rb::cleanup EXIT
  rb::init
  if ((list_backups)); then
    rb::list_backups
    return 0
  fi
  if [[ -n "${restore}" ]]; then
    rb::restore "${restore}"
    return 0
  fi
  if ((plan)); then
    rb::live_plan "${markdown}"
  elif [[ -n "${RB_APPLY_PLAN}" ]]; then
    rb::apply_read "${RB_APPLY_PLAN}"
  fi
  [[ -z "${from}" ]] && run=1
  for id in "${RB_STEPS[@]}"; do
    [[ "${id}" == "${from}" ]] && run=1
    # the first step (preflight, fan_preflight) always runs: it connects and sets what the rest use
    if [[ "${id}" == "${RB_STEPS[0]}" ]] || { [[ -z "${only}" ]] && ((run)); } || [[ "${id}" == "${only}" ]]; then
      RB_RUN_STEPS+=("${id}")
    fi
  done
  for id in "${RB_RUN_STEPS[@]}"; do
    rb::run_step "${id}"
  done
  rb::finish ok
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
