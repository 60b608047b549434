#!/usr/bin/env bash
# @generated from specs/cluster8.yaml (sha256 f6850164418f58204549a9ade51db3f0388f567ac9b27ff0797e516c0330fd10) by runbook-compiler 0.1.0 -- DO NOT EDIT.
# Edit the spec and recompile: compile specs/cluster8.yaml
# sha256 of this file with these 64 digits zeroed: 5a7341eb347ec78294c4b214856d5e2d907734b92c80645658e2685ad8f547a0
# Install the SGLang venv on gpu[01-08] through Slurm (sbcast + srun) and compare the nodes.
#
# Usage: bash cluster8.sh [--list | --dry-run | --plan [--markdown] | --apply PLAN | --only STEP | --from STEP]
#   [--report PATH] [--force] [--allow-edited] | --restore [N] | --list-backups | --discard-staging
#   | --version | --help   (--help says what each does)
#
# ShellCheck exclusions, for the whole file, each for a reason:
#   SC2016: `sh -c` scripts for a host are single-quoted so that `$1` expands there (rb::shq).
#   SC1003: spec values are single-quoted by the compiler (shlex.quote): a backslash is no escape.
#   SC2034: settings only the runtime (the pinned kit's runtime.sh) reads look unused;
#   SC2154: the state it sets looks unset: compile lints with the runtime in place.
# shellcheck disable=SC2016,SC1003,SC2034,SC2154
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
if [[ "${RB_SELF}" != /* ]]; then
  RB_SELF_ABS=${PWD}/${RB_SELF}
fi
# its folder as the kernel reaches it (`../x/` and links resolved), so paths read as they are
if RB_SELF_DIR=$(cd -P -- "${RB_SELF_ABS%/*}/" 2>/dev/null && pwd -P); then
  RB_SELF_ABS=${RB_SELF_DIR%/}/${RB_SELF##*/}
fi
readonly RB_SELF_ABS

#######################################
# Settings, from the spec. Every value is quoted by the compiler.
#######################################
# The runbook and its spec.
readonly RB_NAME=cluster8
readonly RB_SPEC=specs/cluster8.yaml
readonly RB_SPEC_SHA256=f6850164418f58204549a9ade51db3f0388f567ac9b27ff0797e516c0330fd10
readonly RB_COMPILER_VERSION=0.1.0
# The kit (hostkit/): .kit/<sha256>.tar beside this runbook, checked against this hash.
readonly RB_KIT_SHA256=e032bccef9ec3d4d624597e95700ec257547d3b55ce90891f858fed5fbf3c092
readonly RB_KIT_FILE=.kit/e032bccef9ec3d4d624597e95700ec257547d3b55ce90891f858fed5fbf3c092.tar
# AES-GCM first: the relay is CPU-bound.
readonly RB_SSH_CIPHERS=aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com
# transfer (specs/cluster8.yaml:9)
readonly RB_SRC_HOST=build
readonly RB_SRC_PATH=/opt/sglang/.venv
readonly RB_DST_HOST=login
readonly RB_DST_PATH=/opt/sglang/.venv
readonly RB_COMPRESSION=zstd
readonly RB_VERIFY=sha256
readonly RB_RERUN=quick
# the threat model's choices the source's scan reads (docs/design.md): setuid/setgid/world-write entries, links that leave the tree
readonly RB_SPECIAL_MODES=refuse
readonly RB_OUTSIDE_LINKS=refuse
# gpu: declared: the report says whether the checks proved it (a skip is not a pass)
readonly RB_GPU_DECLARED=1
# the static checks on the source before anything moves: the kernel audit for this arch (empty: no gpu:, or gpu.kernel_audit: false), and the references that leave the venv
readonly RB_AUDIT_ARCH=sm_90
# a re-run that finds changes sends only them (see docs/design.md)
readonly RB_INCREMENTAL=1
# hashing threads on each host (auto: one per CPU); one stream per two where the sending end starts the receiving ends (one host, direct)
readonly RB_JOBS=auto
# The install engine's choices, as one JSON document for the engine on the target (rbkit/choices.py), one key a line.
readonly RB_ENGINE_CHOICES='{
  "cuda_home":"/usr/local/cuda-13.0",
  "env":{},
  "env_file":"",
  "jobs":"auto",
  "keep_backups":2,
  "library_path_first":["nvidia/cu13/lib"],
  "on_existing":"backup",
  "on_failed_checks":"rollback",
  "origin":"runbook cluster8 (specs/cluster8.yaml)",
  "rerun":"quick",
  "schema":1,
  "shared_parent":"refuse",
  "special_modes":"refuse",
  "swap_atomic":"allow",
  "timeout":900,
  "verify":"sha256"
}'
# fanout: the cluster's engine
readonly RB_FAN_ENGINE=slurm
# 8 nodes
readonly RB_FAN_NODES='gpu[01-08]'
# all, or how many nodes must pass
readonly RB_FAN_SUCCESS=7
# seconds for each engine call (copy, install)
readonly RB_FAN_TIMEOUT=900
readonly RB_FAN_CONNECT_TIMEOUT=30
# on each node: the bundle, as BASE-<16 random hex digits, new for each copy>.tar, moved into a new private directory (mktemp -d) and checked there
readonly RB_FAN_SCRATCH_BASE=/tmp/rbfan-cluster8
# The checks, as one JSON document for the probe on the target, one key (and one check) a line.
readonly RB_PROBE_CONFIG='{
  "checks":[
    {"allow_skip":false,"id":"relocation","params":{"old":"/opt/sglang/.venv"},"type":"relocation"},
    {"allow_skip":false,"id":"kernel_audit","params":{},"type":"kernel_audit"},
    {"allow_skip":false,"id":"torch","params":{"version":"2.11.0"},"type":"torch"},
    {"allow_skip":false,"id":"devices","params":{"count":8},"type":"devices"},
    {"allow_skip":false,"id":"imports","params":{"modules":["torch","sglang"]},"type":"imports"},
    {"allow_skip":false,"id":"libraries","params":{"expect_dirs":[]},"type":"libraries"},
    {"allow_skip":false,"id":"matmul","params":{"dtype":"bfloat16","every_device":true,"size":4096},"type":"matmul"}
  ],
  "cuda":{"home":"/usr/local/cuda-13.0","library_dirs":[],"library_path_first":["nvidia/cu13/lib"],"version":"13.0"},
  "gpu":{"arch":"sm_90","capability":"9.0","count":8,"model":"H200","names":["H200","H200-SXM","H200-NVL"]},
  "host":"login",
  "schema":1,
  "venv":null
}'
# the kernel audit's options from the spec's kernel_audit check
readonly -a RB_AUDIT_ARGS=()
# Each file of the spec, three words each: its name, its path from this runbook's folder, its sha256: a run refuses to start when one changed.
readonly -a RB_SPEC_FILES=(specs/cluster8.yaml ../specs/cluster8.yaml f6850164418f58204549a9ade51db3f0388f567ac9b27ff0797e516c0330fd10)
# Hosts this runbook touches.
readonly -a RB_HOSTS=(build login)
readonly -a RB_STEPS=(fan_preflight fan_pack fan_copy fan_install fan_compare)
# transfer.exclude
readonly -a RB_EXCLUDE_ARGS=(--exclude __pycache__ --exclude '*.pyc')
# cuda.library_path_first: the exports step puts these dirs of site-packages first; preflight and --plan check that the source has them
readonly -a RB_LIBRARY_DIRS=(nvidia/cu13/lib)
# compression auto: the first of these every end of the stream has, else none
readonly -a RB_AUTO_COMPRESSION=(zstd lz4)
# fanout.nodes, expanded
readonly -a RB_FAN_NODE_LIST=(gpu01 gpu02 gpu03 gpu04 gpu05 gpu06 gpu07 gpu08)
# sbcast options
readonly -a RB_FAN_COPY_OPTS=(--fanout=2)

#######################################
# How this runbook starts Python: the boot below needs it before the runtime is read.
#######################################
RB_LOCAL_PY=python3
# how every Python this runbook starts on a host is started (rbrules.launch): isolated, by the
# path of the kit's entry file in a private directory, from a private working directory
readonly -a RB_PY_FLAGS=(-I -S -B)
readonly RB_PY_START=rbrules/start.py
# this machine's Python for the kit's local tools: the first python3 on PATH that is a program,
# not a script (a version manager's shim, pyenv's, runs a shell and its resolver at every start:
# docs/benchmarks.md); `python3` when every one is a script. The start that reads
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

#######################################
# The runtime: logging, the step runner, host access, the failure report. The same bash in every
# runbook, so it is not written here: it is runtime.sh of the kit this runbook pins, read from
# RB_KIT_FILE beside this runbook and run only when the bytes read have the sha256 RB_KIT_SHA256
# (one read: what is checked is what runs). `compile --standalone` writes it here instead.
# The same Python start checks this runbook's seal (rb::check_sealed says what it found).
#######################################
rb::boot() {
  cd / && "$1" "${RB_PY_FLAGS[@]}" - "$2" "${RB_KIT_SHA256}" "${RB_SELF_ABS}" "${RB_SPEC_FILES[@]}" <<'PY'
import sys

if sys.version_info < (3, 9):
    sys.exit(3)
import hashlib
import os
import shlex


def refuse(why):
    sys.stderr.write(why + "\n")
    sys.exit(4)


path, want = sys.argv[1], sys.argv[2]
try:
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
        data = f.read()
except OSError as exc:
    refuse(f"the kit {path} is not beside this runbook ({exc.strerror}): copy it along with "
           "the runbook, or compile --standalone for a runbook that carries its kit")
got = hashlib.sha256(data).hexdigest()
if got != want:
    refuse(f"the kit {path} has sha256 {got}, not the {want} this runbook pins: compile again "
           "(compile writes the kit this runbook was reviewed with)")
# runtime.sh and seal.py (partials/seal_check.py.j2, the seal check a standalone runbook holds in
# place), members of this ustar archive: the bytes checked above (tarfile's import costs more than
# this walk over its headers)
found, at = {}, 0
while at + 512 <= len(data) and data[at:at + 512].strip(b"\0"):
    head = data[at:at + 512]
    size = int(head[124:136].strip(b" \0") or b"0", 8)
    name, kind, prefix = head[:100].rstrip(b"\0"), head[156:157], head[345:500].strip(b"\0")
    if kind == b"0" and not prefix and name in (b"runtime.sh", b"seal.py"):
        found.setdefault(name, data[at + 512:at + 512 + size].decode("utf-8"))
    at += 512 + -(-size // 512) * 512
if len(found) != 2:
    refuse(f"the kit {path} has no runtime.sh or no seal.py")
sys.stdout.write(found[b"runtime.sh"])
# and the interpreter behind `python3` (a version manager's shim costs a start each time)
print("RB_LOCAL_PY=" + shlex.quote(sys.executable))
seal = {}
exec(compile(found[b"seal.py"], "seal.py", "exec"), seal)
print("RB_SEAL_OUT=" + shlex.quote("\n".join(seal["seal_findings"](sys.argv[3], sys.argv[4:]))))
print("RB_SEAL_DONE=1")
PY
}
RB_KIT_PATH=${RB_SELF_ABS%/*}/${RB_KIT_FILE}
RB_BOOT_RC=0
RB_RUNTIME=$(rb::boot "${RB_LOCAL_PY}" "${RB_KIT_PATH}") || RB_BOOT_RC=$?
if ((RB_BOOT_RC != 4)) && [[ "${RB_RUNTIME}" != *RB_SEAL_DONE=1 && "${RB_LOCAL_PY}" != python3 ]]; then
  # that program is older than 3.9, or no Python at all: the python3 a shim starts may do
  RB_LOCAL_PY=python3
  RB_BOOT_RC=0
  RB_RUNTIME=$(rb::boot python3 "${RB_KIT_PATH}") || RB_BOOT_RC=$?
fi
if ((RB_BOOT_RC == 3)); then
  echo "refusing to run: python3 here is older than 3.9 (the kit's tools need 3.9 or newer)" >&2
  exit 2
elif ((RB_BOOT_RC != 0)) || [[ "${RB_RUNTIME}" != *RB_SEAL_DONE=1 ]]; then
  echo "refusing to run: no runtime from the kit (above)" >&2
  exit 2
fi
eval "${RB_RUNTIME}"
unset RB_RUNTIME RB_KIT_PATH RB_BOOT_RC

#######################################
# Host build (specs/cluster8.yaml:7): root@ct200 over ssh
# Sets RB_HOST_SSH to the ssh options from the spec and RB_HOST_TARGET to user@host (both empty:
# this machine).
#######################################
rb::host_build() {
  RB_HOST_SSH=(-o ConnectTimeout=10 -o StrictHostKeyChecking=yes)
  RB_HOST_TARGET=root@ct200
}

#######################################
# Host login (specs/cluster8.yaml:8): this machine
# Sets RB_HOST_SSH to the ssh options from the spec and RB_HOST_TARGET to user@host (both empty:
# this machine).
#######################################
rb::host_login() {
  RB_HOST_SSH=()
  RB_HOST_TARGET=''
}

#######################################
# What every fan-out node runs, and where: the scratch directory on each node.
#######################################
# What every node runs (issue 44 R3: a bundle is ours when proven, never because of its name).
# $1: the bundle the engine just copied (SCRATCH/rbfan-NAME-<random>.tar, a name never used
# before), $2: its sha256, which this run holds (rb::fan_send); the rest go to `rbkit.fanout
# node`. The bundle is moved at once into a directory made for it (mktemp -d: new, 0700), so its
# name is never read again; opened there, it must be a regular file of this user or root, one
# link, not writable by group or others (so nothing can change it after), and hash to $2. Only
# then is the rule of rbrules.private, unpacked from the proven bundle, run on its directory (every
# directory above it changeable only by this user or root, or sticky with ours next), the rest
# unpacked (all but the payload, which the install streams from the bundle into staging) and the
# kit run. A refusal names why; nothing of a refused bundle is unpacked or run.
readonly RB_FAN_NODE_SCRIPT='b=$1 pin=$2 d=
shift 2
no() {
  echo "refusing the bundle $b: $1; nothing of it was unpacked or run" >&2
  if [ -n "$d" ]; then rm -rf -- "$d"; fi
  exit 1
}
if [ -L "$b" ] || [ ! -f "$b" ]; then no "no regular file there (missing, a link or another type)"; fi
d=$(umask 077 && mktemp -d "${b%.tar}.XXXXXX") || no "no directory for it"
mv -- "$b" "$d/bundle.tar" && exec 3<"$d/bundle.tar" || no "it cannot be moved into $d"
st=$(stat -L -c "%f %u %a %h %d:%i" /dev/fd/3) || no "no stat"
set -f
set -- $st "$@"
set +f
if [ $((0x$1 & 0170000)) -ne $((0100000)) ]; then no "not a regular file"; fi
if [ "$2" != 0 ] && [ "$2" != "$(id -u)" ]; then no "owned by uid $2, not by this user or root"; fi
if [ $((0$3 & 022)) -ne 0 ]; then no "mode $3: group or others may write it"; fi
if [ "$4" != 1 ]; then no "$4 links to it"; fi
inode=$5
shift 5
sum=$(sha256sum </dev/fd/3) || no "it cannot be read"
if [ "${sum%% *}" != "$pin" ]; then no "sha256 ${sum%% *}, not the pinned $pin"; fi
tar -xf /dev/fd/3 -C "$d" --no-same-owner ./kit/rbrules || no "no rules in it"
cd "$d" || no "cannot enter $d"
python3 -I -S -B "$d/kit/rbrules/start.py" rbrules.private --file --what "the bundle" "$d/bundle.tar" || no "(above)"
if [ "$(stat -c %d:%i -- "$d/bundle.tar")" != "$inode" ]; then no "replaced while checked"; fi
tar -xf /dev/fd/3 -C "$d" --exclude=./payload --no-same-owner || exit 1
exec 3<&-
exec python3 -I -S -B "$d/kit/rbrules/start.py" rbkit.fanout node --dir "$d" "$@"'
RB_FAN_RC=0
# this run's scratch name on the nodes, new for each copy, and its bundle's sha256 (rb::fan_send)
RB_FAN_SCRATCH=''
RB_FAN_PIN=''

#######################################
# Send the bundle $2 to the nodes $3 ($1: the output's name) under a new scratch name, never one
# used before (another user of a node can see the name, and make a file there once the node has
# moved the bundle away): RB_FAN_SCRATCH, and RB_FAN_PIN, the bundle's sha256, which each node
# checks before it unpacks anything (RB_FAN_NODE_SCRIPT).
#######################################
rb::fan_send() {
  local hex
  hex=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n') || rb::fail "no random bytes for the scratch name"
  RB_FAN_SCRATCH="${RB_FAN_SCRATCH_BASE}-${hex}"
  RB_FAN_PIN=$(rb::sha256 "$2") || rb::fail "cannot hash the bundle $2"
  rb::fan_copy "$1" "$2" "$3"
}
RB_FAN_FULL=''
# the source's hostfs.identity (fan_preflight's scan), for every node's bundle
RB_SRC_IDENTITY=''

#######################################
# Fan-out helpers both engines share (what every node runs: fanout_node.sh.j2). The engine's own
# commands (rb::fan_ready, rb::fan_copy, rb::fan_install) are in the engine's partial after this.
#######################################

#######################################
# Run an engine command here under a hard timeout (the engine's own timeouts come first), output
# to $1.out and $1.err in the run directory. Sets RB_FAN_RC; never fails the step by itself.
#######################################
rb::fan_run() {
  local name=$1
  shift
  RB_LAST_CMD="here: $(rb::shq "$@")"
  rb::log "$ $*"
  RB_FAN_RC=0
  timeout --kill-after=10 "$((RB_FAN_TIMEOUT + 30))" "$@" >"${RB_STATE_DIR}/fanout/${name}.out" \
    2>"${RB_STATE_DIR}/fanout/${name}.err" || RB_FAN_RC=$?
  if ((RB_FAN_RC != 0)) && [[ -s "${RB_STATE_DIR}/fanout/${name}.err" ]]; then
    rb::log "${1} exited ${RB_FAN_RC}; what it said:"
    tail -n 20 "${RB_STATE_DIR}/fanout/${name}.err" | rb::printable_lines '    ' >&2 || true
  elif ((RB_FAN_RC != 0)); then
    rb::log "${1} exited ${RB_FAN_RC} (nothing on stderr; the nodes' reports say why)"
  fi
}

#######################################
# rb::fan_run for an install round, its progress logged as the nodes finish (rbkit.fanout watch
# reads the engine's output as it grows: each node's verdict, nodes done / total, and a line at
# least every 10 s; it ends with the round, or when this run is stopped). $1 the output's name,
# $2 the round's nodes (comma-separated), the rest the engine's command.
#######################################
rb::fan_run_watched() {
  local name=$1 nodes=$2 out watcher
  shift 2
  out="${RB_STATE_DIR}/fanout/${name}.out"
  rm -f "${out}.ended"
  : >"${out}"
  {
    rb::fan_kit watch --nodes "${nodes}" --engine-out "${out}" --stop "${out}.ended" \
      --limit "$((RB_FAN_TIMEOUT + 60))" | while IFS= read -r line; do rb::log "${line}"; done
  } || true &
  watcher=$!
  RB_BG_PIDS+=("${watcher}")
  rb::fan_run "${name}" "$@"
  : >"${out}.ended"
  wait "${watcher}" || true
}

#######################################
# Fail unless every tool named is installed here.
#######################################
rb::fan_need() {
  local tool
  for tool in "$@"; do
    if ! command -v "${tool}" >/dev/null; then
      rb::fail "engine ${RB_FAN_ENGINE}: ${tool} is not installed here"
    fi
  done
}

#######################################
# Pack a bundle for the nodes: $1 its directory here (manifest.jsonl, and delta.names for a
# re-run's, already in it), $2 the names file on the source (what the payload carries). Writes the
# payload (the source engine's stream, compressed as chosen), the kit, the source's identity (a
# node refuses a destination that is the source, inside it or around it), the bundle $1.tar.
#######################################
rb::fan_bundle_make() {
  local dir=$1 list=$2
  mkdir -p "${dir}/kit"
  printf '%s\n' "${RB_SRC_IDENTITY}" >"${dir}/source-identity.json"
  rb::kit "${RB_SRC_HOST}" engine send "${RB_SRC_ABS}" "${list}" \
    --compression "${RB_COMPRESSION_USED}" >"${dir}/payload"
  rb::fan_kit_copy "${dir}/kit"
  tar -C "${dir}" -cf "${dir}.tar" .
}

#######################################
# The kit here (the head): rbkit.fanout ARGS, isolated (rb::py_argv).
#######################################
rb::fan_kit() {
  rb::py_argv "${RB_LOCAL_PY}" "${RB_LOCAL_KIT}" rbkit.fanout
  "${RB_KIT_ARGV[@]}" "$@"
}

#######################################
# After a re-run's round: the nodes that could not take the changes alone (no earlier install, a
# file changed there) get the whole bundle, copied and installed on them only. $@: the install's
# arguments. Sets RB_FAN_FULL (the nodes, comma-separated; empty when none).
#######################################
rb::fan_full_round() {
  local dir="${RB_STATE_DIR}/fanout/rbfan-${RB_NAME}-full" src_kit rc size
  local -a need=()
  RB_FAN_FULL=$(rb::fan_kit nodes --which needs-full \
    --nodes "$(IFS=,; printf '%s' "${RB_FAN_NODE_LIST[*]}")" \
    --engine-out "${RB_STATE_DIR}/fanout/install.out")
  if [[ -z "${RB_FAN_FULL}" ]]; then
    return 0
  fi
  IFS=, read -ra need <<<"${RB_FAN_FULL}"
  rb::log "${#need[@]} nodes could not take the changes alone (${RB_FAN_FULL}: no earlier install," \
    "or files changed there): the whole bundle goes to them"
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  mkdir -p "${dir}"
  cp "${RB_STATE_DIR}/fanout/rbfan-${RB_NAME}/manifest.jsonl" "${dir}/"
  rb::fan_bundle_make "${dir}" "${src_kit}/${RB_NAME}.names"
  size=$(stat -c %s "${dir}.tar")
  rb::fact full_bundle_bytes "${size}"
  rb::fan_send copy-full "${dir}.tar" "${RB_FAN_FULL}"
  rb::fan_install install-full "${RB_FAN_FULL}" "${#need[@]}" "${RB_FAN_FULL}" "$@"
  rc=${RB_FAN_RC}
  rb::fan_full_done
  RB_FAN_RC=${rc}
}

#######################################
# The Slurm engine: inside an allocation, sbcast carries the bundle, one srun task per node installs.
#######################################
rb::fan_ready() {
  rb::fan_need srun sbcast scontrol
  rb::fan_allocation
}

#######################################
# Slurm: the runbook runs inside an allocation that holds every node of the spec. Says how to get
# one when it does not; names the nodes the allocation lacks. sbcast copies to every node of the
# allocation, so extra nodes are named too.
#######################################
rb::fan_allocation() {
  local node alloc list folded
  local -a missing=() extra=() held=()
  if [[ -z "${SLURM_JOB_ID:-}" ]]; then
    rb::fail "engine slurm runs inside an allocation: salloc -N ${#RB_FAN_NODE_LIST[@]} -w" \
      "${RB_FAN_NODES} --no-kill bash ${0##*/} (--no-kill: a node that fails does not end the" \
      "allocation, the others finish)"
  fi
  list=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-}") ||
    rb::fail "scontrol cannot expand this allocation's nodes (${SLURM_JOB_NODELIST:-none})"
  read -ra held <<<"${list//$'\n'/ }"
  alloc=" ${held[*]} "
  for node in "${RB_FAN_NODE_LIST[@]}"; do
    if [[ "${alloc}" != *" ${node} "* ]]; then
      missing+=("${node}")
    fi
  done
  if ((${#missing[@]})); then
    list=$(IFS=,; printf '%s' "${missing[*]}")
    folded=$(scontrol show hostlist "${list}") || folded=${list}
    rb::fail "nodes ${folded} are not in" \
      "this allocation (job ${SLURM_JOB_ID}: ${SLURM_JOB_NODELIST:-none}): salloc -N" \
      "${#RB_FAN_NODE_LIST[@]} -w ${RB_FAN_NODES} --no-kill bash ${0##*/}"
  fi
  for node in "${held[@]}"; do
    if [[ " ${RB_FAN_NODE_LIST[*]} " != *" ${node} "* ]]; then
      extra+=("${node}")
    fi
  done
  if ((${#extra[@]})); then
    rb::log "note: the allocation also holds ${extra[*]}; sbcast copies the bundle there too," \
      "nothing is installed there"
  fi
  rb::log "slurm job ${SLURM_JOB_ID}: ${SLURM_JOB_NODELIST}"
}

#######################################
# Copy the bundle: $1 the output's name, $2 the bundle here, $3 the nodes that need it. sbcast
# copies to every node of the allocation (through Slurm's message tree), whatever $3 says; never
# over a file already at the new name (no -f: that node then has no bundle of ours, and says so).
#######################################
rb::fan_copy() {
  rb::fan_run "$1" sbcast -t "${RB_FAN_CONNECT_TIMEOUT}" "${RB_FAN_COPY_OPTS[@]}" \
    "$2" "${RB_FAN_SCRATCH}.tar"
}

#######################################
# One task per node: check the bundle rb::fan_send copied (its sha256 pinned), unpack it, install
# and probe. $1 the output's name, $2 the nodes,
# $3 how many, $4 the nodes comma-separated (the progress); the rest go to `rbkit.fanout node`.
#######################################
rb::fan_install() {
  local name=$1 nodes=$2 count=$3 listed=$4
  shift 4
  rb::fan_run_watched "${name}" "${listed}" srun -N "${count}" -n "${count}" --ntasks-per-node=1 -w "${nodes}" \
    --chdir=/ --immediate="${RB_FAN_CONNECT_TIMEOUT}" \
    --time="$(((RB_FAN_TIMEOUT + 59) / 60))" -K0 sh -c "${RB_FAN_NODE_SCRIPT}" rb "${RB_FAN_SCRATCH}.tar" "${RB_FAN_PIN}" "$@"
}

#######################################
# After the whole bundle's round: sbcast copied that bundle to every node of the allocation, not
# only to the round's. Remove it where it serves nothing: the nodes that passed the first round
# and the allocation's nodes outside the spec (a node of the round moved it away at once).
#######################################
rb::fan_full_done() {
  local node passed
  local -a drop=()
  passed=$(rb::fan_kit nodes --which passed \
    --nodes "$(IFS=,; printf '%s' "${RB_FAN_NODE_LIST[*]}")" \
    --engine-out "${RB_STATE_DIR}/fanout/install.out")
  for node in $(scontrol show hostnames "${SLURM_JOB_NODELIST}"); do
    if [[ ",${passed}," == *",${node},"* || " ${RB_FAN_NODE_LIST[*]} " != *" ${node} "* ]]; then
      drop+=("${node}")
    fi
  done
  if ((${#drop[@]})); then
    rb::fan_run clean-full srun -N "${#drop[@]}" -n "${#drop[@]}" --ntasks-per-node=1 \
      -w "$(IFS=,; printf '%s' "${drop[*]}")" --immediate="${RB_FAN_CONNECT_TIMEOUT}" --time=1 -K0 \
      rm -f -- "${RB_FAN_SCRATCH}.tar"
  fi
}

#######################################
# The live plan of a fan-out (--plan, --apply PLAN; docs/liveplan.md): every node asked through
# the engine, read-only, for its destination's state; rbkit.fanplan groups them. Here first:
# copy the kit's host packages (compiler.kit.HOST_PACKAGES) into $1, a bundle's kit/.
#######################################
rb::fan_kit_copy() {
  cp -R "${RB_LOCAL_KIT}/"rbkit "${RB_LOCAL_KIT}/"rbprobes "${RB_LOCAL_KIT}/"rbrules "$1/"
}

#######################################
# Every node's destination, read-only, through the engine as a run reaches the nodes: a bundle
# of the kit alone copied to a scratch name of its own, then `rbkit.fanout node --state` on every
# node (no lock, nothing beside the destination; the node removes the kit after). $1: the
# round's name (plan, apply); its output is fanout/$1-state.out. The run's scratch name and pin
# are kept.
#######################################
rb::fan_state() {
  local name=$1 dir="${RB_STATE_DIR}/fanout/rbfan-${RB_NAME}-$1" keep=${RB_FAN_SCRATCH}
  local pin=${RB_FAN_PIN}
  rm -rf "${dir}" "${dir}.tar"
  mkdir -p "${dir}/kit"
  rb::fan_kit_copy "${dir}/kit"
  tar -C "${dir}" -cf "${dir}.tar" .
  rb::fan_send "${name}-copy" "${dir}.tar" "${RB_FAN_NODES}"
  rb::fan_install "${name}-state" "${RB_FAN_NODES}" "${#RB_FAN_NODE_LIST[@]}" \
    "$(IFS=,; printf '%s' "${RB_FAN_NODE_LIST[*]}")" --state --dest "${RB_DST_ABS}" \
    --choices "${RB_ENGINE_CHOICES}"
  RB_FAN_SCRATCH=${keep} RB_FAN_PIN=${pin}
  rm -rf "${dir}" "${dir}.tar"
}

#######################################
# --plan on a fan-out (rb::plan, runtime/install.sh.j2, calls it for a fan-out): the hosts
# prepared and the source scanned as fan_preflight does, every node's state read (rb::fan_state),
# the plan composed here (rbkit.fanplan compose): the screen on stdout; plan.json, changes-G.txt
# per group and, with $1 = 1, plan.md in this run's directory. Exits 1 naming every host or node
# it cannot reach, or when something blocks the run.
#######################################
rb::fan_plan() {
  local markdown=$1 src_kit rc=0 out
  RB_STEP=plan
  mkdir -p "${RB_STATE_DIR}/fanout"
  rb::fan_need timeout tar
  rb::fan_ready
  rb::plan_hosts
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  rb::source_start "${src_kit}/${RB_NAME}.names"
  # meanwhile every node's destination, through the engine
  rb::fan_state plan
  rb::source_finish ''
  rb::plan_source
  rb::choose_compression "${RB_SRC_HOST}" "${RB_DST_HOST}" 2>"${RB_WORK}/plan-how"
  cat "${RB_WORK}/plan-how" >>"${RB_RUN_DIR}/run.log"
  rb::on_host "${RB_SRC_HOST}" cat "${src_kit}/${RB_NAME}.names.stat" >"${RB_RUN_DIR}/source.scan"
  rb::plan_args "${markdown}"
  out="${RB_STATE_DIR}/fanout/plan-state"
  rb::py_argv "${RB_LOCAL_PY}" "${RB_LOCAL_KIT}" rbkit.fanplan
  "${RB_KIT_ARGV[@]}" compose "${RB_PLAN_ARGS[@]}" --dest "${RB_DST_ABS}" \
    --engine "${RB_FAN_ENGINE}" --nodes "$(IFS=,; printf '%s' "${RB_FAN_NODE_LIST[*]}")" \
    --engine-out "${out}.out" --engine-err "${out}.err" \
    --engine-err "${RB_STATE_DIR}/fanout/plan-copy.err" || rc=$?
  rb::plan_end "${rc}" "${markdown}"
}

#######################################
rb::fan_apply_check() {
  local src_kit out rc=0 now="${RB_RUN_DIR}/apply-source.scan"
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  rb::on_host "${RB_SRC_HOST}" cat "${src_kit}/${RB_NAME}.names.stat" >"${now}"
  rb::fan_state apply
  rb::py_argv "${RB_LOCAL_PY}" "${RB_LOCAL_KIT}" rbkit.fanplan
  out=$("${RB_KIT_ARGV[@]}" drift --plan "${RB_APPLY_PLAN}" --dir "${RB_RUN_DIR}/apply" \
    --nodes "$(IFS=,; printf '%s' "${RB_FAN_NODE_LIST[*]}")" --source-now "${now}" \
    --engine-out "${RB_STATE_DIR}/fanout/apply-state.out") || rc=$?
  if ((rc == 1)); then
    out=$(sed -n 's/^moved\t//p' <<<"${out}")
    rb::fail "refusing to apply ${RB_APPLY_PLAN}: changed since the plan was made: ${out//$'\n'/; };" \
      "nothing was sent to a node; make a new plan: bash ${RB_SELF} --plan"
  elif ((rc != 0)); then
    rb::fail "cannot compare the nodes with the plan ${RB_APPLY_PLAN} (above); nothing was sent"
  fi
  rb::log "the plan holds: the source and every node are as the plan saw them"
  out=$(sed -n 's/^compression\t//p' <<<"${out}")
  rb::apply_compression "${out}"
}

#######################################
# The steps, in the order they run: what each does for this spec, on which hosts (--dry-run and
# --list print these). Their bodies are step_<id>: the runtime's, the same in every runbook, unless written below.
#   1/5 fan_preflight (specs/cluster8.yaml:15)
#   2/5 fan_pack (specs/cluster8.yaml:9)
#   3/5 fan_copy (specs/cluster8.yaml:15)
#   4/5 fan_install (specs/cluster8.yaml:15)
#   5/5 fan_compare (specs/cluster8.yaml:15)
#######################################
declare -rA RB_STEP_DOC=(
  [fan_preflight]='Reach the source, check the engine and its tools here, list the nodes.'
  [fan_pack]='Pack the source once: manifest, tar with the chosen compression, the kit: one bundle (on a re-run: only what changed since the last fan-out).'
  [fan_copy]='Let the engine carry the bundle to every node (sbcast, or clush --copy).'
  [fan_install]='On every node at once, the install engine: stage, receive, verify, relocate, prove, swap, exports, probe (a node the changes alone cannot serve gets the whole bundle).'
  [fan_compare]='Fetch every node'"'"'s report and compare: nodes x checks, odd and missing nodes named.'
)
declare -rA RB_STEP_PREVIEW=(
  [fan_preflight]='on build: connect; ship the kit; rbkit engine scan /opt/sglang/.venv
here: sbcast, srun, SLURM_JOB_ID present; nodes gpu[01-08] (8)'
  [fan_pack]='on build: rbkit manifest build /opt/sglang/.venv --algo sha256
on build: tar -C /opt/sglang/.venv -b 256 -cf - <names> | <compress: zstd (preflight fails if an end lacks it)> > here: runs/cluster8/fanout/rbfan-cluster8.tar (with the manifest and the kit)
re-run (runs/cluster8/fanout-base.jsonl, the last fan-out'"'"'s manifest, exists): <names> are only what changed since (rbkit manifest delta)'
  [fan_copy]='here: timeout 900 sbcast -t 30 --fanout=2 runs/cluster8/fanout/rbfan-cluster8.tar /tmp/rbfan-cluster8-<random>.tar'
  [fan_install]='here: timeout 900 srun -N 8 -n 8 --ntasks-per-node=1 -w gpu[01-08] --chdir=/ --immediate=30 --time=15 -K0 sh -c '"'"'D=$(mktemp -d /tmp/rbfan-cluster8-<random>.XXXXXX) && mv /tmp/rbfan-cluster8-<random>.tar $D/bundle.tar && <check it: owner, mode, one link, sha256 = <pin>, rbrules.private> && tar -xf $D/bundle.tar -C $D --exclude=./payload && cd $D && python3 -I -S -B $D/kit/rbrules/start.py rbkit.fanout node --dir $D --dest /opt/sglang/.venv --old /opt/sglang/.venv ...'"'"'
re-run: nodes that lack what the changes-only bundle leaves out (no earlier install, a file changed there) get the whole bundle: copy and install again, on them only'
  [fan_compare]='here: python3 -I -S -B <kit>/rbrules/start.py rbkit.fanout compare (nodes x checks, identical rows folded)
success: at least 7 nodes must pass'
)
declare -rA RB_STEP_HOST=(
  [fan_preflight]=login
  [fan_pack]=login
  [fan_copy]=login
  [fan_install]=login
  [fan_compare]=login
)

#######################################
# Step 1/5: fan_preflight (specs/cluster8.yaml:15)
#######################################
step_fan_preflight() {
  local record='' stat
  rb::fan_need timeout tar
  rb::fan_ready
  # every host at once: tools, python3, compressors, the kit (one command and reply each)
  rb::hosts_prepare "${RB_HOSTS[@]}"
  # refused unless what the excludes leave is a venv with files (pyvenv.cfg and bin/python
  # sent); then the static checks, in the same engine process
  if [[ -n "${RB_APPLY_PLAN}" ]]; then
    # --apply: the scan's record, to name what moved since the plan
    record=$(rb::kit_dir "${RB_SRC_HOST}")
    record+="/${RB_NAME}.names"
  fi
  rb::source_start "${record}"
  rb::source_finish ''
  # each node compares its destination with it (rbkit.fanout node, in the bundle)
  RB_SRC_IDENTITY=${RB_J[identity]}
  stat=${RB_J[stat_fingerprint]}
  rb::preflight_audit
  # packed on the source, unpacked on the nodes (tar -I: a node without the tool fails its
  # extract and is named); this machine, the head, stands in for them here
  rb::choose_compression "${RB_SRC_HOST}" "${RB_DST_HOST}"
  if [[ -n "${RB_APPLY_PLAN}" ]]; then
    # every node's state and the source against the plan's: what moved ends the run here
    rb::fan_apply_check "${stat}"
  fi
  rb::log "source: ${RB_ENGINE_DETAIL}; ${#RB_FAN_NODE_LIST[@]} nodes ${RB_FAN_NODES} through" \
    "${RB_FAN_ENGINE}; compression ${RB_COMPRESSION_USED}"
  rb::fact nodes "${#RB_FAN_NODE_LIST[@]}"
  RB_STEP_DETAIL="${#RB_FAN_NODE_LIST[@]} nodes, engine ${RB_FAN_ENGINE}, compression ${RB_COMPRESSION_USED}"
}

#######################################
# Step 2/5: fan_pack (specs/cluster8.yaml:9)
#######################################
step_fan_pack() {
  local src_kit dir="${RB_STATE_DIR}/fanout/rbfan-${RB_NAME}" base="${RB_STATE_DIR}/fanout-base.jsonl"
  local what=bundle names rerun=0 size human unchanged
  local -a reuse=()
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  names="${src_kit}/${RB_NAME}.names"
  rm -rf "${RB_STATE_DIR}/fanout"
  mkdir -p "${dir}"
  if ((RB_INCREMENTAL)) && [[ -f "${base}" ]]; then
    # a re-run: the manifest of the last fan-out is the base; only what changed since is packed
    rerun=1
    rb::pipe_on_host "${RB_SRC_HOST}" sh -c 'cat >"$1"' rb "${src_kit}/${RB_NAME}.base.jsonl" \
      <"${base}"
    if [[ "${RB_RERUN}" == quick ]]; then
      reuse=(--reuse "${src_kit}/${RB_NAME}.base.jsonl")
    fi
  fi
  rb::engine_once "${RB_SRC_HOST}" hash "${RB_SRC_ABS}" "${RB_EXCLUDE_ARGS[@]}" \
    --algo "${RB_VERIFY}" --jobs "${RB_JOBS}" --out "${src_kit}/${RB_NAME}.manifest.jsonl" \
    --names "${names}" --special-modes "${RB_SPECIAL_MODES}" "${reuse[@]}"
  rb::log "manifest: ${RB_ENGINE_DETAIL}; ${RB_J[reused]} digests reused from the last fan-out"
  rb::fact manifest_files "${RB_J[files]}"
  rb::on_host "${RB_SRC_HOST}" cat "${src_kit}/${RB_NAME}.manifest.jsonl" >"${dir}/manifest.jsonl"
  if ((rerun)); then
    rb::engine_once "${RB_SRC_HOST}" delta "${src_kit}/${RB_NAME}.manifest.jsonl" \
      "${src_kit}/${RB_NAME}.base.jsonl" --names-out "${src_kit}/${RB_NAME}.delta.names"
    if [[ "${RB_J[usable]}" == 1 ]]; then
      rb::on_host "${RB_SRC_HOST}" cat "${src_kit}/${RB_NAME}.delta.names" >"${dir}/delta.names"
      names="${src_kit}/${RB_NAME}.delta.names"
      what="changes-only bundle"
      rb::fact delta_files "${RB_J[send_files]}"
      rb::fact delta_bytes "${RB_J[send_bytes]}"
      rb::human human "${RB_J[send_bytes]}"
      rb::human unchanged "${RB_J[unchanged_bytes]}"
      rb::log "re-run: ${RB_J[send_files]} files (${human}) go to the nodes: what changed since" \
        "the last fan-out, and bin/ and pyvenv.cfg (relocated on every install);" \
        "${RB_J[unchanged_files]} unchanged files (${unchanged}) are linked from each node's install"
    else
      rb::log "re-run: ${RB_J[why]}; the whole tree goes to the nodes"
    fi
  fi
  rb::fan_bundle_make "${dir}" "${names}"
  size=$(stat -c %s "${dir}.tar")
  rb::fact bundle_bytes "${size}"
  rb::human human "${size}"
  RB_STEP_DETAIL="${what} ${human} (${RB_COMPRESSION_USED})"
}

#######################################
# Step 3/5: fan_copy (specs/cluster8.yaml:15)
#######################################
step_fan_copy() {
  rb::fan_send copy "${RB_STATE_DIR}/fanout/rbfan-${RB_NAME}.tar" "${RB_FAN_NODES}"
  if ((RB_FAN_RC != 0)); then
    rb::log "the copy did not reach every node (exit ${RB_FAN_RC}); the install goes on, and the" \
      "comparison names the nodes without a report"
  fi
  RB_STEP_DETAIL="${RB_FAN_ENGINE} exit ${RB_FAN_RC}"
}

#######################################
# Step 4/5: fan_install (specs/cluster8.yaml:15)
#######################################
step_fan_install() {
  # the spec's choices are one document (RB_ENGINE_CHOICES); the rest are this run's facts
  local -a args=(--dest "${RB_DST_ABS}" --old "${RB_SRC_ABS}" --choices "${RB_ENGINE_CHOICES}"
    --compression "${RB_COMPRESSION_USED}" --probe-config "${RB_PROBE_CONFIG:-}")
  local bundle="${RB_STATE_DIR}/fanout/rbfan-${RB_NAME}.tar"
  # a whole-bundle round's output is this step's alone (a --from run may find an earlier one)
  rm -f "${RB_STATE_DIR}/fanout/"{copy,install}-full.{out,err}
  if [[ -z "${RB_FAN_PIN}" ]]; then
    # this run copied nothing yet (--from fan_install): the bundle goes again, under a new name;
    # a name an earlier run used is never looked at (another user may have put a file there)
    [[ -f "${bundle}" ]] || rb::fail "no bundle at ${bundle}: run the runbook from fan_pack"
    rb::log "a new copy of the bundle for this run (a name used before is never trusted)"
    rb::fan_send copy "${bundle}" "${RB_FAN_NODES}"
  fi
  rb::fan_install install "${RB_FAN_NODES}" "${#RB_FAN_NODE_LIST[@]}" \
    "$(IFS=,; printf '%s' "${RB_FAN_NODE_LIST[*]}")" "${args[@]}"
  RB_STEP_DETAIL="${RB_FAN_ENGINE} exit ${RB_FAN_RC}"
  if [[ -f "${RB_STATE_DIR}/fanout/rbfan-${RB_NAME}/delta.names" ]]; then
    # the bundle held only the changes (fan_pack)
    rb::fan_full_round "${args[@]}"
    RB_STEP_DETAIL+="${RB_FAN_FULL:+; whole bundle to ${RB_FAN_FULL} (exit ${RB_FAN_RC})}"
  fi
}

#######################################
# Step 5/5: fan_compare (specs/cluster8.yaml:15)
#######################################
step_fan_compare() {
  local rc=0 info node nodes
  nodes=$(IFS=,; printf '%s' "${RB_FAN_NODE_LIST[*]}")
  local -a rounds=(--engine-out "${RB_STATE_DIR}/fanout/install.out"
    --engine-err "${RB_STATE_DIR}/fanout/install.err")
  if [[ -f "${RB_STATE_DIR}/fanout/install-full.out" ]]; then
    # this run's whole-bundle round (fan_pack empties fanout/): its reports replace those of the
    # nodes that asked for it
    rounds+=(--engine-out "${RB_STATE_DIR}/fanout/install-full.out"
      --engine-err "${RB_STATE_DIR}/fanout/install-full.err")
  fi
  info=$(rb::fan_kit compare --nodes "${nodes}" "${rounds[@]}" --success "${RB_FAN_SUCCESS}" \
    --out-dir "${RB_STATE_DIR}/fanout") || rc=$?
  for node in "${RB_FAN_NODE_LIST[@]}"; do
    if [[ -f "${RB_STATE_DIR}/fanout/probe-${node}.json" ]]; then
      RB_PROBE_REPORTS+=("${node}=${RB_STATE_DIR}/fanout/probe-${node}.json")
    fi
  done
  rb::engine_read <<<"${info}" || true
  rb::fact nodes_ok "${RB_J[ok]}"
  if ((RB_J[ok] > 0)); then
    # what the nodes that passed now hold: the next run sends only what changes from it
    cp "${RB_STATE_DIR}/fanout/rbfan-${RB_NAME}/manifest.jsonl" "${RB_STATE_DIR}/fanout-base.jsonl"
  fi
  RB_STEP_DETAIL="${RB_J[ok]}/${RB_J[nodes]} nodes passed${RB_J[odd]:+; odd: ${RB_J[odd]}}${RB_J[missing]:+; no report: ${RB_J[missing]}}${RB_J[rolled_back]:+; rolled back: ${RB_J[rolled_back]}}"
  if ((rc != 0)); then
    rb::fail "success policy ${RB_FAN_SUCCESS} not met: ${RB_STEP_DETAIL} (table above;" \
      "${RB_STATE_DIR}/fanout/fanout.json)"
  fi
}

#######################################
# main: the command line (rb::main, the runtime's: every option of Usage: above), then the steps
# of RB_STEPS in order.
#######################################
main() {
  rb::main "$@"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
