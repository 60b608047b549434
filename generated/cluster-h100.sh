#!/usr/bin/env bash
# @generated from specs/cluster-h100.yaml (sha256 51612bff75ddfea52430bb3a7c7595bb5fb2d4c4a045d43c14c7b3162db17525) by runbook-compiler 0.1.0 -- DO NOT EDIT.
# Edit the spec and recompile: compile specs/cluster-h100.yaml
# sha256 of this file with these 64 digits zeroed: ae6ceea7f5d468545d86db80f88323f567421b4ba2220b39880ec102aa7baa84
# It extends specs/base.yaml (the sha256 above covers the whole chain).
# Move the SGLang venv from ct200 to the 8x H100 node and prove it works on sm_90.
#
# Usage: bash cluster-h100.sh [--list | --dry-run | --plan [--markdown] | --apply PLAN | --only STEP | --from STEP]
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
readonly RB_NAME=cluster-h100
readonly RB_SPEC=specs/cluster-h100.yaml
readonly RB_SPEC_SHA256=51612bff75ddfea52430bb3a7c7595bb5fb2d4c4a045d43c14c7b3162db17525
readonly RB_COMPILER_VERSION=0.1.0
# The kit (hostkit/): .kit/<sha256>.tar beside this runbook, checked against this hash.
readonly RB_KIT_SHA256=e032bccef9ec3d4d624597e95700ec257547d3b55ce90891f858fed5fbf3c092
readonly RB_KIT_FILE=.kit/e032bccef9ec3d4d624597e95700ec257547d3b55ce90891f858fed5fbf3c092.tar
# AES-GCM first: the relay is CPU-bound.
readonly RB_SSH_CIPHERS=aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com
# transfer (specs/cluster-h100.yaml:8)
readonly RB_SRC_HOST=ct200
readonly RB_SRC_PATH=/opt/sglang/.venv
readonly RB_DST_HOST=h100
readonly RB_DST_PATH=/opt/sglang/.venv
readonly RB_ROUTE=relay
readonly RB_COMPRESSION=auto
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
  "cuda_home":"/usr/local/cuda",
  "env":{},
  "env_file":"",
  "jobs":"auto",
  "keep_backups":2,
  "library_path_first":["nvidia/cu13/lib"],
  "on_existing":"backup",
  "on_failed_checks":"rollback",
  "origin":"runbook cluster-h100 (specs/cluster-h100.yaml)",
  "rerun":"quick",
  "schema":1,
  "shared_parent":"refuse",
  "special_modes":"refuse",
  "swap_atomic":"allow",
  "timeout":null,
  "verify":"sha256"
}'
# The checks, as one JSON document for the probe on the target, one key (and one check) a line.
readonly RB_PROBE_CONFIG='{
  "checks":[
    {"allow_skip":false,"id":"relocation","params":{"old":"/opt/sglang/.venv"},"type":"relocation"},
    {"allow_skip":false,"id":"kernel_audit","params":{},"type":"kernel_audit"},
    {"allow_skip":false,"id":"torch","params":{"cuda":"13.0","version":"2.11.0"},"type":"torch"},
    {"allow_skip":false,"id":"devices","params":{},"type":"devices"},
    {"allow_skip":false,"id":"matmul","params":{"dtype":"bfloat16","every_device":true,"size":4096},"type":"matmul"},
    {"allow_skip":false,"id":"imports","params":{"modules":["sglang","flashinfer","sgl_kernel"]},"type":"imports"}
  ],
  "cuda":{"home":"/usr/local/cuda","library_dirs":[],"library_path_first":["nvidia/cu13/lib"],"version":"13.0"},
  "gpu":{"arch":"sm_90","capability":"9.0","count":8,"model":"H100","names":["H100","H100-SXM","H100-SXM5","H100-PCIE","H100-NVL"]},
  "host":"h100",
  "schema":1,
  "venv":null
}'
# the kernel audit's options from the spec's kernel_audit check
readonly -a RB_AUDIT_ARGS=()
# Each file of the spec, three words each: its name, its path from this runbook's folder, its sha256: a run refuses to start when one changed.
readonly -a RB_SPEC_FILES=(specs/cluster-h100.yaml ../specs/cluster-h100.yaml c36d36eaa82ec84f8df6d2a7ed87081bba6a22c572c79b5d75aa1ea106e5e436 specs/base.yaml ../specs/base.yaml e7be93981a5525fd6d23d625ce96de38430b0e4b1a9a1a12558ba12dab60482b)
# Hosts this runbook touches.
readonly -a RB_HOSTS=(ct200 h100)
readonly -a RB_STEPS=(preflight manifest transfer verify relocate prove swap exports probe)
# transfer.exclude
readonly -a RB_EXCLUDE_ARGS=(--exclude __pycache__ --exclude '*.pyc')
# cuda.library_path_first: the exports step puts these dirs of site-packages first; preflight and --plan check that the source has them
readonly -a RB_LIBRARY_DIRS=(nvidia/cu13/lib)
# compression auto: the first of these every end of the stream has, else none
readonly -a RB_AUTO_COMPRESSION=(lz4 zstd)
# route direct/auto: ssh arguments the source uses to reach the destination
readonly -a RB_DIRECT_SSH=()

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
# Host ct200 (specs/base.yaml:8): root@ct200.lab.internal over ssh
# Sets RB_HOST_SSH to the ssh options from the spec and RB_HOST_TARGET to user@host (both empty:
# this machine).
#######################################
rb::host_ct200() {
  RB_HOST_SSH=(-o ConnectTimeout=10 -o StrictHostKeyChecking=yes)
  RB_HOST_TARGET=root@ct200.lab.internal
}

#######################################
# Host h100 (specs/cluster-h100.yaml:7): ubuntu@h100-01.lab.internal over ssh
# Sets RB_HOST_SSH to the ssh options from the spec and RB_HOST_TARGET to user@host (both empty:
# this machine).
#######################################
rb::host_h100() {
  RB_HOST_SSH=(-o ConnectTimeout=10 -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes -i "${HOME}"/.ssh/id_h100)
  RB_HOST_TARGET=ubuntu@h100-01.lab.internal
}

#######################################
# The steps, in the order they run: what each does for this spec, on which hosts (--dry-run and
# --list print these). Their bodies are step_<id>: the runtime's, the same in every runbook, unless written below.
#   1/9 preflight (specs/cluster-h100.yaml:6)
#   2/9 manifest (specs/base.yaml:14)
#   3/9 transfer (specs/cluster-h100.yaml:8)
#   4/9 verify (specs/base.yaml:14)
#   5/9 relocate (specs/cluster-h100.yaml:9)
#   6/9 prove (specs/cluster-h100.yaml:9)
#   7/9 swap (specs/base.yaml:15)
#   8/9 exports (specs/cluster-h100.yaml:10)
#   9/9 probe (specs/base.yaml:20)
#######################################
declare -rA RB_STEP_DOC=(
  [preflight]='Reach every host, ship the kit, check the source is a venv after the excludes, take the destination'"'"'s lock, check its state and free space.'
  [manifest]='Hash every file of the source (in parallel) into a manifest; detect a re-run and what an incremental one must send.'
  [transfer]='Stream the source into a staging directory beside the destination.'
  [verify]='Check the staging against the manifest: every file, mode, link and digest.'
  [relocate]='Rewrite what names the old path (shebangs, activate scripts) for the new one.'
  [prove]='The staged interpreter runs here and reports the staging as sys.prefix.'
  [swap]='Put the proven copy in place in one rename, then prove it there (sys.prefix, the console scripts); a failure puts back what was there.'
  [exports]='Write the env file: CUDA_HOME, PATH, LD_LIBRARY_PATH with the venv'"'"'s libs first.'
  [probe]='Run the checks with the moved interpreter on the target; fetch the report.'
)
declare -rA RB_STEP_PREVIEW=(
  [preflight]='on ct200: connect; copy the kit to a private directory (mktemp -d), checked by its sha256; check tar and python3 >= 3.9
on h100: connect; copy the kit to a private directory (mktemp -d), checked by its sha256; check tar and python3 >= 3.9
on ct200: rbkit engine scan /opt/sglang/.venv --exclude __pycache__ --exclude '"'"'*.pyc'"'"' (refused unless pyvenv.cfg, bin/python and files are sent)
on h100: rbkit engine serve --dest /opt/sglang/.venv (refuses a parent of it another user can write (shared_parent: refuse); takes /opt/sglang/.venv.rb-lock for the run (a second run is refused, naming this one))
on h100: rbkit engine preflight (on_existing backup; free space for /opt/sglang/.venv.rb-staging)
on ct200: rbprobes preflight --venv /opt/sglang/.venv --arch sm_90 (refused with the files and packages named unless --force; on one machine, references outside the venv are said, not refused)
compression: decided at run time: on the relay, measured: the link'"'"'s rate (zeros through this machine for 0.6 s) against each compressor both ends have, packing a 8 MiB sample of the source on the source: the fastest way through; where that cannot run, and on the direct route, none if every machine the stream passes through runs one kernel (the same boot id: no link to save), else lz4 -1 if both ends have lz4, else zstd -1 if both ends have zstd, else none'
  [manifest]='on ct200: rbkit engine hash /opt/sglang/.venv --exclude __pycache__ --exclude '"'"'*.pyc'"'"' --algo sha256 --jobs auto --scanned <preflight'"'"'s scan of it>
here: keep a copy in runs/cluster-h100/manifest.jsonl; send it to h100
on h100: rbkit engine current (if /opt/sglang/.venv/.rb-manifest.jsonl matches, skip the install)
on h100: rbkit engine stage (if it differs, link unchanged files from /opt/sglang/.venv into /opt/sglang/.venv.rb-staging, send only the rest)'
  [transfer]='on h100: rbkit engine stage (rm -rf /opt/sglang/.venv.rb-staging && mkdir /opt/sglang/.venv.rb-staging)
on ct200: tar -C /opt/sglang/.venv -b 256 --null --no-recursion -T <names to send> -cf - | <compress: decided at run time: on the relay, measured: the link'"'"'s rate (zeros through this machine for 0.6 s) against each compressor both ends have, packing a 8 MiB sample of the source on the source: the fastest way through; where that cannot run, and on the direct route, none if every machine the stream passes through runs one kernel (the same boot id: no link to save), else lz4 -1 if both ends have lz4, else zstd -1 if both ends have zstd, else none> (rbkit engine send)
  | through this machine (relay; streams side by side from 256 MB: one per two of the auto jobs, at most 8, jobs: the fewest of the three machines; each stream its own ssh clients here) |
on h100: <decompress> | tar -C /opt/sglang/.venv.rb-staging -b 256 -xf - --no-same-owner (rbkit engine receive; how much tar has read, every 5 s)'
  [verify]='on h100: rbkit engine verify /opt/sglang/.venv.rb-staging --jobs auto (against the manifest; the stamp relocate, prove and swap require)'
  [relocate]='on h100: rbkit engine relocate /opt/sglang/.venv.rb-staging --old /opt/sglang/.venv --new /opt/sglang/.venv'
  [prove]='on h100: /opt/sglang/.venv.rb-staging/bin/python -I -B -c '"'"'import sys; print(sys.prefix)'"'"' (within 120 s)'
  [swap]='on h100: rbkit engine swap (/opt/sglang/.venv.rb-staging into /opt/sglang/.venv; on_existing: backup, from the engine'"'"'s choices)
on h100: /opt/sglang/.venv/bin/python -c '"'"'import sys; print(sys.prefix)'"'"' (then each console script (one per interpreter line) started to its sys.prefix; on failure put back what was there)'
  [exports]='on h100: rbkit engine exports (write /opt/sglang/.venv.env.sh)
  CUDA_HOME=/usr/local/cuda; LD_LIBRARY_PATH: nvidia/cu13/lib (in site-packages), then $CUDA_HOME/lib64'
  [probe]='on h100: rbkit engine probe (source the env file; /opt/sglang/.venv/bin/python -I -B <kit>/rbrules/start.py rbprobes run: relocation, kernel_audit, torch, devices, matmul, imports)
here: fetch the report to runs/cluster-h100/<run>/probe-h100.json'
)
declare -rA RB_STEP_HOST=(
  [preflight]='ct200->h100'
  [manifest]=ct200
  [transfer]='ct200->h100'
  [verify]=h100
  [relocate]=h100
  [prove]=h100
  [swap]=h100
  [exports]=h100
  [probe]=h100
)

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
