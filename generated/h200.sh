#!/usr/bin/env bash
# @generated from specs/h200.yaml (sha256 51665d1bd3efa80fae4b3b9f067d9addd2ac273046a116851e73fe8e549494ec) by runbook-compiler 0.1.0 -- DO NOT EDIT.
# Edit the spec and recompile: compile specs/h200.yaml
# sha256 of this file with these 64 digits zeroed: d825b9b4e5f2d668112c8d931f1494d8a3de5f08576d42301b50e0cd7f5a6553
# Move the H200 machine's torch venv to a new path on it and prove it on the GPU (sm_90).
#
# Usage: bash h200.sh [--list | --dry-run | --plan [--markdown] | --apply PLAN | --only STEP | --from STEP]
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
readonly RB_NAME=h200
readonly RB_SPEC=specs/h200.yaml
readonly RB_SPEC_SHA256=51665d1bd3efa80fae4b3b9f067d9addd2ac273046a116851e73fe8e549494ec
readonly RB_COMPILER_VERSION=0.1.0
# The kit (hostkit/): .kit/<sha256>.tar beside this runbook, checked against this hash.
readonly RB_KIT_SHA256=e032bccef9ec3d4d624597e95700ec257547d3b55ce90891f858fed5fbf3c092
readonly RB_KIT_FILE=.kit/e032bccef9ec3d4d624597e95700ec257547d3b55ce90891f858fed5fbf3c092.tar
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
readonly RB_RERUN=quick
# the threat model's choices the source's scan reads (docs/design.md): setuid/setgid/world-write entries, links that leave the tree
readonly RB_SPECIAL_MODES=strip
readonly RB_OUTSIDE_LINKS=refuse
# gpu: declared: the report says whether the checks proved it (a skip is not a pass)
readonly RB_GPU_DECLARED=1
# the static checks on the source before anything moves: the kernel audit for this arch (empty: no gpu:, or gpu.kernel_audit: false), and the references that leave the venv
readonly RB_AUDIT_ARCH=sm_90
# a re-run that finds changes sends only them (see docs/design.md)
readonly RB_INCREMENTAL=1
# hashing threads on each host (auto: one per CPU); one stream per two where the sending end starts the receiving ends (one host, direct)
readonly RB_JOBS=8
# The install engine's choices, as one JSON document for the engine on the target (rbkit/choices.py), one key a line.
readonly RB_ENGINE_CHOICES='{
  "cuda_home":"/usr/local/cuda",
  "env":{"NCCL_NVLS_ENABLE":"0","NVSHMEM_DISABLE_NVLS":"1","TORCH_SYMM_MEM_DISABLE_MULTICAST":"1"},
  "env_file":"",
  "jobs":8,
  "keep_backups":2,
  "library_path_first":["nvidia/cu13/lib"],
  "on_existing":"replace",
  "on_failed_checks":"keep",
  "origin":"runbook h200 (specs/h200.yaml)",
  "rerun":"quick",
  "schema":1,
  "shared_parent":"refuse",
  "special_modes":"strip",
  "swap_atomic":"allow",
  "timeout":null,
  "verify":"sha256"
}'
# The checks, as one JSON document for the probe on the target, one key (and one check) a line.
readonly RB_PROBE_CONFIG='{
  "checks":[
    {"allow_skip":false,"id":"relocation","params":{"old":"/opt/torch/.venv"},"type":"relocation"},
    {"allow_skip":false,"id":"kernel_audit","params":{"paths":["lib/python3.12/site-packages/torch/lib"],"strict":false},"type":"kernel_audit"},
    {"allow_skip":false,"id":"libraries","params":{"expect_dirs":[]},"type":"libraries"},
    {"allow_skip":false,"id":"torch","params":{"cuda":"13.0","version":"2.11"},"type":"torch"},
    {"allow_skip":false,"id":"devices","params":{},"type":"devices"},
    {"allow_skip":false,"id":"imports","params":{"modules":["torch","triton","numpy"]},"type":"imports"},
    {"allow_skip":false,"id":"matmul_5","params":{"dtype":"bfloat16","every_device":true,"size":8192},"type":"matmul"},
    {"allow_skip":false,"id":"matmul_6","params":{"dtype":"float32","every_device":true,"size":2048},"type":"matmul"},
    {"allow_skip":false,"id":"nccl","params":{},"type":"nccl"},
    {"allow_skip":false,"id":"command","params":{"expect_exit":0,"name":"console script","run":"torchrun --help >/dev/null","timeout_s":300},"type":"command"}
  ],
  "cuda":{"home":"/usr/local/cuda","library_dirs":[],"library_path_first":["nvidia/cu13/lib"],"version":"13.0"},
  "gpu":{"arch":"sm_90","capability":"9.0","count":1,"model":"H200","names":["H200","H200-SXM","H200-NVL"]},
  "host":"here",
  "schema":1,
  "venv":null
}'
# the kernel audit's options from the spec's kernel_audit check
readonly -a RB_AUDIT_ARGS=(--path lib/python3.12/site-packages/torch/lib)
# Each file of the spec, three words each: its name, its path from this runbook's folder, its sha256: a run refuses to start when one changed.
readonly -a RB_SPEC_FILES=(specs/h200.yaml ../specs/h200.yaml 51665d1bd3efa80fae4b3b9f067d9addd2ac273046a116851e73fe8e549494ec)
# Hosts this runbook touches.
readonly -a RB_HOSTS=(here)
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
# Host here (specs/h200.yaml:8): this machine
# Sets RB_HOST_SSH to the ssh options from the spec and RB_HOST_TARGET to user@host (both empty:
# this machine).
#######################################
rb::host_here() {
  RB_HOST_SSH=()
  RB_HOST_TARGET=''
}

#######################################
# The steps, in the order they run: what each does for this spec, on which hosts (--dry-run and
# --list print these). Their bodies are step_<id>: the runtime's, the same in every runbook, unless written below.
#   1/9 preflight (specs/h200.yaml:7)
#   2/9 manifest (specs/h200.yaml:14)
#   3/9 transfer (specs/h200.yaml:9)
#   4/9 verify (specs/h200.yaml:14)
#   5/9 relocate (specs/h200.yaml:11)
#   6/9 prove (specs/h200.yaml:11)
#   7/9 swap (specs/h200.yaml:15)
#   8/9 exports (specs/h200.yaml:19)
#   9/9 probe (specs/h200.yaml:28)
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
  [preflight]='on here: connect; use the kit here; check tar and python3 >= 3.9
on here: rbkit engine scan /opt/torch/.venv --exclude __pycache__ --exclude '"'"'*.pyc'"'"' (refused unless pyvenv.cfg, bin/python and files are sent)
on here: rbkit engine serve --dest /opt/torch-moved/.venv (refuses a parent of it another user can write (shared_parent: refuse); takes /opt/torch-moved/.venv.rb-lock for the run (a second run is refused, naming this one))
on here: rbkit engine preflight (on_existing replace; free space for /opt/torch-moved/.venv.rb-staging)
on here: rbprobes preflight --venv /opt/torch/.venv --arch sm_90 --path lib/python3.12/site-packages/torch/lib (refused with the files and packages named unless --force; on one machine, references outside the venv are said, not refused)
compression: none'
  [manifest]='on here: rbkit engine hash /opt/torch/.venv --exclude __pycache__ --exclude '"'"'*.pyc'"'"' --algo sha256 --jobs 8 --scanned <preflight'"'"'s scan of it>
here: keep a copy in runs/h200/manifest.jsonl; send it to here
on here: rbkit engine current (if /opt/torch-moved/.venv/.rb-manifest.jsonl matches, skip the install)
on here: rbkit engine stage (if it differs, link unchanged files from /opt/torch-moved/.venv into /opt/torch-moved/.venv.rb-staging, send only the rest)'
  [transfer]='on here: rbkit engine stage (rm -rf /opt/torch-moved/.venv.rb-staging && mkdir /opt/torch-moved/.venv.rb-staging)
on here: tar -C /opt/torch/.venv -b 256 --null --no-recursion -T <names to send> -cf - | <compress: none> (rbkit engine send)
  | a pipe on here, no ssh (streams side by side from 256 MB: one per two of the 8 jobs, at most 8) |
on here: <decompress> | tar -C /opt/torch-moved/.venv.rb-staging -b 256 -xf - --no-same-owner (rbkit engine receive; how much tar has read, every 5 s)'
  [verify]='on here: rbkit engine verify /opt/torch-moved/.venv.rb-staging --jobs 8 (against the manifest; the stamp relocate, prove and swap require)'
  [relocate]='on here: rbkit engine relocate /opt/torch-moved/.venv.rb-staging --old /opt/torch/.venv --new /opt/torch-moved/.venv'
  [prove]='on here: /opt/torch-moved/.venv.rb-staging/bin/python -I -B -c '"'"'import sys; print(sys.prefix)'"'"' (within 120 s)'
  [swap]='on here: rbkit engine swap (/opt/torch-moved/.venv.rb-staging into /opt/torch-moved/.venv; on_existing: replace, from the engine'"'"'s choices)
on here: /opt/torch-moved/.venv/bin/python -c '"'"'import sys; print(sys.prefix)'"'"' (then each console script (one per interpreter line) started to its sys.prefix; on failure put back what was there)'
  [exports]='on here: rbkit engine exports (write /opt/torch-moved/.venv.env.sh)
  CUDA_HOME=/usr/local/cuda; LD_LIBRARY_PATH: nvidia/cu13/lib (in site-packages), then $CUDA_HOME/lib64'
  [probe]='on here: rbkit engine probe (source the env file; /opt/torch-moved/.venv/bin/python -I -B <kit>/rbrules/start.py rbprobes run: relocation, kernel_audit, libraries, torch, devices, imports, matmul, matmul, nccl, command)
here: fetch the report to runs/h200/<run>/probe-here.json'
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
# main: the command line (rb::main, the runtime's: every option of Usage: above), then the steps
# of RB_STEPS in order.
#######################################
main() {
  rb::main "$@"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
