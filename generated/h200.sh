#!/usr/bin/env bash
# @generated from specs/h200.yaml (sha256 51665d1bd3efa80fae4b3b9f067d9addd2ac273046a116851e73fe8e549494ec) by runbook-compiler 0.1.0 -- DO NOT EDIT.
# Edit the spec and recompile: compile specs/h200.yaml
# sha256 of this file with these 64 digits zeroed: b66c31f8336b3d370655141c0dcd5c74c7c78e3f9e260c69ec34a583f663f975
# Move the H200 machine's torch venv to a new path on it and prove it on the GPU (sm_90).
#
# Usage: bash h200.sh [--list | --dry-run | --plan | --apply PLAN | --only STEP | --from STEP] [--report PATH] [--version]
#
# ShellCheck exclusions, for the whole file, each for a reason:
#   SC2016: scripts run by `sh -c` on a host (here or over ssh) are single-quoted on purpose, so
#     that `$1` in them expands there; their arguments travel quoted by rb::shq.
#   SC1003: spec values are single-quoted by the compiler (Python's shlex.quote), right by
#     construction; a value may hold a backslash, which this check takes for a mistyped
#     escape.
#   SC2034: settings and state variables that only the runtime reads (runtime.sh of the pinned
#     kit) look unused in this file; compile lints the runbook with the runtime in place,
#     where this check runs.
# shellcheck disable=SC2016,SC1003,SC2034
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
readonly RB_KIT_SHA256=29fd204acb78576019f19bdf8eff8d64e97ed9b695bb9068a882ca77ce1ddbc3
readonly RB_KIT_FILE=.kit/29fd204acb78576019f19bdf8eff8d64e97ed9b695bb9068a882ca77ce1ddbc3.tar
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
# The install engine's choices, as one JSON document for the engine on the target (rbkit/choices.py).
readonly RB_ENGINE_CHOICES='{"cuda_home":"/usr/local/cuda","env":{"NCCL_NVLS_ENABLE":"0","NVSHMEM_DISABLE_NVLS":"1","TORCH_SYMM_MEM_DISABLE_MULTICAST":"1"},"env_file":"","jobs":8,"keep_backups":2,"library_path_first":["nvidia/cu13/lib"],"on_existing":"replace","on_failed_checks":"keep","origin":"runbook h200 (specs/h200.yaml)","rerun":"quick","schema":1,"shared_parent":"refuse","special_modes":"strip","swap_atomic":"allow","timeout":null,"verify":"sha256"}'
# The checks, as one JSON document for the probe on the target.
readonly RB_PROBE_CONFIG='{"checks":[{"allow_skip":false,"id":"relocation","params":{"old":"/opt/torch/.venv"},"type":"relocation"},{"allow_skip":false,"id":"kernel_audit","params":{"paths":["lib/python3.12/site-packages/torch/lib"],"strict":false},"type":"kernel_audit"},{"allow_skip":false,"id":"libraries","params":{"expect_dirs":[]},"type":"libraries"},{"allow_skip":false,"id":"torch","params":{"cuda":"13.0","version":"2.11"},"type":"torch"},{"allow_skip":false,"id":"devices","params":{},"type":"devices"},{"allow_skip":false,"id":"imports","params":{"modules":["torch","triton","numpy"]},"type":"imports"},{"allow_skip":false,"id":"matmul_5","params":{"dtype":"bfloat16","every_device":true,"size":8192},"type":"matmul"},{"allow_skip":false,"id":"matmul_6","params":{"dtype":"float32","every_device":true,"size":2048},"type":"matmul"},{"allow_skip":false,"id":"nccl","params":{},"type":"nccl"},{"allow_skip":false,"id":"command","params":{"expect_exit":0,"name":"console script","run":"torchrun --help >/dev/null","timeout_s":300},"type":"command"}],"cuda":{"home":"/usr/local/cuda","library_dirs":[],"library_path_first":["nvidia/cu13/lib"],"version":"13.0"},"gpu":{"arch":"sm_90","capability":"9.0","count":1,"model":"H200","names":["H200","H200-SXM","H200-NVL"]},"host":"here","schema":1,"venv":null}'
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
on here: rbkit engine serve --dest /opt/torch-moved/.venv: refuses a parent of it another user can write (shared_parent: refuse); takes /opt/torch-moved/.venv.rb-lock for the run (a second run is refused, naming this one)
on here: engine preflight: on_existing replace; free space for /opt/torch-moved/.venv.rb-staging
on here: rbprobes preflight --venv /opt/torch/.venv --arch sm_90 --path lib/python3.12/site-packages/torch/lib (refused with the files and packages named unless --force; on one machine, references outside the venv are said, not refused)
compression: none'
  [manifest]='on here: rbkit engine hash /opt/torch/.venv --exclude __pycache__ --exclude '"'"'*.pyc'"'"' --algo sha256 --jobs 8 --scanned <preflight'"'"'s scan of it>
here: keep a copy in runs/h200/manifest.jsonl; send it to here
on here: engine current: if /opt/torch-moved/.venv/.rb-manifest.jsonl matches, skip the install
on here: engine stage: if it differs, link unchanged files from /opt/torch-moved/.venv into /opt/torch-moved/.venv.rb-staging, send only the rest'
  [transfer]='on here: engine stage: rm -rf /opt/torch-moved/.venv.rb-staging && mkdir /opt/torch-moved/.venv.rb-staging
on here: tar -C /opt/torch/.venv -b 256 --null --no-recursion -T <names to send> -cf - | <compress: none> (rbkit engine send)
  | a pipe on here, no ssh (streams side by side from 256 MB: one per two of the 8 jobs, at most 8) |
on here: <decompress> | tar -C /opt/torch-moved/.venv.rb-staging -b 256 -xf - --no-same-owner (rbkit engine receive; how much tar has read, every 5 s)'
  [verify]='on here: engine verify /opt/torch-moved/.venv.rb-staging against the manifest (--jobs 8); the stamp relocate, prove and swap require'
  [relocate]='on here: engine relocate /opt/torch-moved/.venv.rb-staging --old /opt/torch/.venv --new /opt/torch-moved/.venv'
  [prove]='on here: /opt/torch-moved/.venv.rb-staging/bin/python -I -B -c '"'"'import sys; print(sys.prefix)'"'"' (within 120 s)'
  [swap]='on here: engine swap: /opt/torch-moved/.venv.rb-staging into /opt/torch-moved/.venv (on_existing: replace, from the engine'"'"'s choices)
on here: /opt/torch-moved/.venv/bin/python -c '"'"'import sys; print(sys.prefix)'"'"'; each console script (one per interpreter line) started to its sys.prefix; on failure put back what was there'
  [exports]='on here: engine exports: write /opt/torch-moved/.venv.env.sh
  CUDA_HOME=/usr/local/cuda; LD_LIBRARY_PATH: nvidia/cu13/lib (in site-packages), then $CUDA_HOME/lib64'
  [probe]='on here: engine probe: source the env file; /opt/torch-moved/.venv/bin/python -I -B <kit>/rbrules/start.py rbprobes run: relocation, kernel_audit, libraries, torch, devices, imports, matmul, matmul, nccl, command
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
# Runtime: logging, the step runner, host access. The same in every runbook.
#######################################
RB_STEP=''
RB_HOST=''
RB_LAST_CMD=''
RB_RUN_DIR=${RB_RUN_DIR:-}
RB_REPORT=${RB_REPORT:-}
RB_HOLDER=''
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
# 1 once --apply's plan no longer holds (rb::apply_check): the next thing is a new plan, not --from
RB_APPLY_REFUSED=0
RB_EVENTS=''
RB_STEP_START=0
RB_FINISHED=0
RB_DRY_RUN=0
RB_FAILED_STEP=''
# the last step that finished ok; the signal that interrupted this run (rb::on_signal)
RB_STEP_DONE=''
RB_SIGNALLED=0
RB_WITNESS_PID='' RB_WITNESS_FD=''
# started with SIGINT ignored: a process that dies of it (rb::witness_start), and 1 once it did
RB_INT_SENTINEL='' RB_INT_UNTRAPPED=0
declare -a RB_TREE=() RB_KILLED=()
RB_COMPRESSION_USED=none
# the live plan: the hosts it reached, what its compose takes (runtime/liveplan.sh.j2)
RB_PLAN_UP=''
declare -a RB_PLAN_ARGS=()
# why the route and the compression are what they are (rb::route_said, rb::compression_said)
RB_ROUTE_WHY=''
RB_COMPRESSION_WHY=''
# why compression auto was not measured, said with the choice taken instead (one line)
RB_COMPRESSION_NOTE=''
declare -a RB_BG_PIDS=()
# a plan's hosts let go in the background (rb::close_start): its pid, `waited` once waited for
# (rb::close_wait, rb::cleanup)
RB_CLOSING=''
RB_STEP_DETAIL=''
declare -a RB_HOST_SSH=()
RB_HOST_TARGET=''
# the hosts preflight prepared; accept-new hosts whose key is new; where ssh records a host key
declare -a RB_PREPARE_HOSTS=() RB_KH_NEW=()
RB_KH_FILE='' RB_KH_NAME='' RB_KH_ALIAS=''
declare -a RB_PROBE_REPORTS=()
declare -A RB_KIT_DIR=() RB_EARLY=()
RB_KIT_TAR_SHA256=''
RB_ALLOW_EDITED=0
RB_FORCE=0
RB_EDITED=''
RB_SEAL_DONE=0
RB_SEAL_OUT=''
RB_CAUSE=''
RB_HINT=''
# what to do about the failure rb::fail says next (set just before it; it clears it), and the
# one command that goes on after it, when the step knows better than --from (rb::finish)
RB_FAIL_HINT=''
RB_GO_ON=''
# the install a failed step left in place (the engine's install_stays), why, what it replaced
RB_STAYS='' RB_STAYS_WHY='' RB_STAYS_PREVIOUS=''
# what this run's swap did with the install it replaced: backup, transient (replace), none
RB_SWAPPED=''
declare -A RB_PY=()
declare -A RB_HOST_COMP=()
declare -A RB_HOST_BOOT=()
declare -A RB_HOST_CPUS=()
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
# runtime.sh, a member of this ustar archive (the bytes checked above; tarfile's import costs
# more than this walk over its headers)
at = 0
while at + 512 <= len(data) and data[at:at + 512].strip(b"\0"):
    head = data[at:at + 512]
    size = int(head[124:136].strip(b" \0") or b"0", 8)
    name, kind, prefix = head[:100].rstrip(b"\0"), head[156:157], head[345:500].strip(b"\0")
    if (name, kind, prefix) == (b"runtime.sh", b"0", b""):
        sys.stdout.write(data[at + 512:at + 512 + size].decode("utf-8"))
        break
    at += 512 + -(-size // 512) * 512
else:
    refuse(f"the kit {path} has no runtime.sh")
# and the interpreter behind `python3` (a version manager's shim costs a start each time)
print("RB_LOCAL_PY=" + shlex.quote(sys.executable))


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


print("RB_SEAL_OUT=" + shlex.quote("\n".join(seal_findings(sys.argv[3], sys.argv[4:]))))
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
# State of the single-host install (a fan-out runbook installs on its nodes instead and has
# templates/partials/fanout.sh.j2 in this place).
#######################################
RB_SKIP_INSTALL=0
RB_SRC_BYTES=0
RB_SRC_FILES=0
RB_SRC_DISK=0
# the whole tree's bytes (preflight): what the staging holds once the stream arrived
RB_TREE_BYTES=0
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
# --plan: the live plan of the one destination (runtime/liveplan.sh.j2); $1 = 1: plan.md too.
#######################################
rb::plan() {
  rb::live_plan "$1"
}

#######################################
# The kit: Python tools this runbook runs on each host (hostkit/rbkit, rbprobes, rbrules) and here
# (hostkit/rbview, the pictures: never sent to a host), pinned by RB_KIT_SHA256 and read from
# RB_KIT_FILE beside this runbook (compile writes it; `compile --standalone` embeds the kit
# instead). A file whose hash differs is refused.
# Arguments: the directory to write them into.
#######################################
rb::kit_write() {
  local dir=$1 file got
  file=${RB_SELF_ABS%/*}/${RB_KIT_FILE}
  if [[ ! -f "${file}" || -L "${file}" ]]; then
    rb::fail "the kit ${RB_KIT_FILE} is not beside this runbook (${file}): copy it along with" \
      "the runbook, or compile --standalone for a runbook that carries its kit"
  fi
  cp -- "${file}" "${RB_WORK}/kit-pinned.tar"
  got=$(rb::sha256 "${RB_WORK}/kit-pinned.tar")
  if [[ "${got}" != "${RB_KIT_SHA256}" ]]; then
    rb::fail "the kit ${file} has sha256 ${got}, not the ${RB_KIT_SHA256} this runbook pins;" \
      "recompile (compile writes the kit this runbook was reviewed with)"
  fi
  mkdir -p "${dir}"
  tar -C "${dir}" -xf "${RB_WORK}/kit-pinned.tar" --no-same-owner --no-same-permissions
  # what the hosts are sent: the host packages only (the pictures' rbview stays here)
  tar -C "${dir}" -cf "${RB_WORK}/kit.tar" rbkit rbprobes rbrules
  RB_KIT_TAR_SHA256=$(rb::sha256 "${RB_WORK}/kit.tar")
}

#######################################
# Step 1/9: preflight (specs/h200.yaml:7)
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
  rb::measure_start      # compression: auto on the relay: measured beside the scan (rb::measure_go)
  # meanwhile the destination's engine for the run: from here on it holds the destination's
  # lock; it says what the install there recorded of its source (the same tree: no audit)
  rb::engine_start
  RB_ENGINE_STATE=${RB_J[state]}
  rb::measure_go "${RB_J[installed_stat]}"
  rb::source_finish "${RB_J[installed_stat]}"
  rb::library_dirs_check
  RB_SRC_BYTES=${RB_J[bytes]} RB_TREE_BYTES=${RB_J[bytes]}
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
  rb::engine_preflight "${need}" "${identity}"
  RB_DST_INSTALLED=${RB_J[installed]}
  RB_STAGING=${RB_J[staging]}
  if ((RB_MEASURING)) && ! rb::measure_finish; then
    rb::compression_fallback
  fi
  RB_STEP_DETAIL="route ${RB_ROUTE_USED}, compression ${RB_COMPRESSION_USED}"
}

#######################################
# Decide the stream's compression: with auto, on the relay by measurement (the link's rate
# against each compressor on the tree), started beside the scan (rb::measure_start, rb::measure_go)
# and taken at preflight's end (rb::measure_finish); else rb::compression_fallback.
#######################################
rb::preflight_compression() {
  RB_MEASURING=0
  if [[ "${RB_COMPRESSION}" == auto && "${RB_SRC_HOST}" == "${RB_DST_HOST}" ]] && rb::is_local "${RB_SRC_HOST}"; then
    RB_COMPRESSION_USED=none
    rb::compression_said "none (both ends are this machine: no link to save)"
    return 0
  fi
  if [[ "${RB_COMPRESSION}" == auto && "${RB_ROUTE_USED}" == relay ]]; then
    RB_MEASURING=1
    return 0
  fi
  rb::compression_fallback
}

#######################################
# Where the measurement cannot run, and on the direct route: with auto, none when the machines
# the stream passes through share CPUs (rb::shared_cpus: one host's namespaces or containers: no
# link to save, only CPU to spend); else from the spec and what both ends have.
#######################################
rb::compression_fallback() {
  local boot through=''
  if [[ "${RB_COMPRESSION}" == auto ]] && boot=$(rb::shared_cpus "${RB_SRC_HOST}" "${RB_DST_HOST}" "${RB_ROUTE_USED}"); then
    RB_COMPRESSION_USED=none
    if [[ "${RB_ROUTE_USED}" == relay ]]; then
      through=' and this machine'
    fi
    rb::compression_said "none (auto: ${RB_SRC_HOST} ${RB_DST_HOST}${through} run one kernel on shared" \
      "CPUs, boot id ${boot:0:8}: no link between them to save, only CPU to spend)"
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
    rb::route_said "one host (both ends on ${RB_SRC_HOST}: the stream stays there)"
    return 0
  fi
  if [[ "${RB_ROUTE}" == relay ]]; then
    rb::route_said "relay through this machine"
    return 0
  fi
  if rb::on_host "${RB_SRC_HOST}" ssh -o BatchMode=yes "${RB_DIRECT_SSH[@]}" true \
    2>"${RB_WORK}/direct.err"; then
    RB_ROUTE_USED=direct
    rb::route_said "direct (${RB_SRC_HOST} reaches ${RB_DST_HOST} over ssh itself)"
    return 0
  fi
  why=$(tail -n 1 "${RB_WORK}/direct.err")
  if [[ "${RB_ROUTE}" == direct ]]; then
    rb::fail "route direct: ${RB_SRC_HOST} cannot reach ${RB_DST_HOST} over ssh: ${why}"
  fi
  rb::route_said "relay through this machine, because ${RB_SRC_HOST} cannot reach ${RB_DST_HOST}" \
    "(${why:-ssh failed})"
}

# rb::measure_start's job goes, unless the destination holds an install ($1: a re-run sends what changed).
rb::measure_go() {
  local go=go
  if [[ -n "$1" && "${RB_MEASURING:-0}" == 1 ]]; then
    RB_MEASURE_SKIP="not measured: ${RB_DST_HOST} holds an install (a re-run sends what changed)"
    go=stop
  fi
  if [[ -n "${RB_MEASURE_PID}" ]]; then
    # shellcheck disable=SC2154 # opened by rb::measure_start
    printf '%s\n' "${go}" >&"${RB_MEASURE_GO}"
  fi
}

#######################################
# Step 2/9: manifest (specs/h200.yaml:14)
# Hash every file of the source (in parallel) into a manifest; detect a re-run and what an incremental one must send.
#######################################
step_manifest() {
  RB_SKIP_INSTALL=0
  if ((RB_DST_INSTALLED == 0)); then
    # a plain statement (inside `if`, bash would run it without set -e: an engine gone there went
    # on into an unset RB_J key, exit 1 with no report)
    rb::resume_plan
    if ((RB_RESUME)); then
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
    # read by the kit (safefs: never through a link, a FIFO or a device), not `cat` as root
    rb::kit "${RB_DST_HOST}" liveplan installed "${RB_DST_ABS}" >"${RB_STATE_DIR}/installed.jsonl"
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
# rest (engine.resume_stage): RB_RESUME=1. Nothing done (RB_RESUME stays 0) when there is none.
#######################################
rb::resume_plan() {
  rb::engine resumable "source=${RB_SRC_STAT} ${RB_SRC_HOST}:${RB_SRC_ABS}"
  if [[ "${RB_J[resumable]}" != 1 ]]; then
    if [[ "${RB_ENGINE_DETAIL}" == "an earlier staging"* ]]; then
      rb::log "${RB_ENGINE_DETAIL}: it is removed, and the whole tree sent"
    fi
    return 0
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
# Step 3/9: transfer (specs/h200.yaml:9)
# Stream the source into a staging directory beside the destination.
#######################################
step_transfer() {
  local src_kit start_ms ms bytes hash_pid='' names remote total streams code
  local -a send recv codes=() labels=()
  RB_RELAY_CODES=()
  if ((RB_SKIP_INSTALL)); then
    RB_STEP_DETAIL='skipped: destination already matches the source manifest'
    return 0
  fi
  if [[ " ${RB_RUN_STEPS[*]} " != *" manifest "* ]] && ((RB_DST_INSTALLED == 0)); then
    # --from transfer, --only transfer: the manifest step did not run; what a cut stream left
    # in the staging is resumed as a whole run resumes it (issue 45: the Ctrl-C hint's
    # --from transfer re-sent every byte)
    rb::resume_plan
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
  # (--need: the bytes the whole staging holds once it all arrived: a disk that fills says what
  # is still to come)
  recv=("${RB_KIT_ARGV[@]}" engine receive --dest "${RB_DST_ABS}" --state "${RB_ENGINE_STATE}"
    --compression "${RB_COMPRESSION_USED}" --choices "${RB_ENGINE_CHOICES}" --progress 5
    --need "${RB_TREE_BYTES:-0}")
  rb::log "streaming ${RB_SRC_HOST}:${RB_SRC_ABS} -> ${RB_DST_HOST}:${RB_STAGING} (${RB_ROUTE_USED}," \
    "compression ${RB_COMPRESSION_USED})"
  total=$((${RB_SRC_BYTES:-0} + 768 * ${RB_SRC_FILES:-0}))   # tar: a header and padding a file
  rb::now
  start_ms=${RB_NOW}
  # each route's stages' statuses are kept (codes), the receiving end's answer read first: it
  # says why in words (a full disk, a closed connection), where a status would not
  if [[ "${RB_ROUTE_USED}" == one-host ]]; then
    # both ends on one host: the sending end starts the receiving ends there, no ssh between
    # them; several streams side by side where the run may use the cores (rbkit send --jobs)
    labels=("send and receive on ${RB_SRC_HOST}" "progress here")
    rb::on_host "${RB_SRC_HOST}" "${send[@]}" --jobs "${RB_JOBS}" --local "${recv[@]}" |
      rb::progress "${total}" "${start_ms}" >"${RB_WORK}/receive.out" || codes=("${PIPESTATUS[@]}")
  elif [[ "${RB_ROUTE_USED}" == direct ]]; then
    labels=("send on ${RB_SRC_HOST} (ssh to ${RB_DST_HOST})" "progress here")
    remote=$(rb::shq "${recv[@]}")
    rb::on_host "${RB_SRC_HOST}" "${send[@]}" --jobs "${RB_JOBS}" --remote ssh -o BatchMode=yes \
      -c "${RB_SSH_CIPHERS}" "${RB_DIRECT_SSH[@]}" "${remote}" | rb::progress "${total}" "${start_ms}" \
      >"${RB_WORK}/receive.out" || codes=("${PIPESTATUS[@]}")
  else
    # through this machine: one pair of ssh clients a stream, side by side (rb::relay_streams);
    # a stream that failed is named by the answer, read below
    labels=("relay here (ssh to ${RB_SRC_HOST} and ${RB_DST_HOST})" "progress here")
    rb::relay_streams "${total}" "${start_ms}" "${names}" "${send[@]}" -- "${recv[@]}" ||
      codes=("${RB_RELAY_CODES[@]}")
  fi
  for code in "${codes[@]}"; do
    rb::signal_status "${code}"     # a stage that died of the run's signal: the interruption
  done
  if ((${#codes[@]} > 0)); then
    rb::int_came                    # or of a SIGINT this shell could not trap (ignored on entry)
  fi
  rb::now
  ms=$((RB_NOW - start_ms))
  if ! rb::engine_read <"${RB_WORK}/receive.out" || [[ "${RB_ENGINE_STATUS}" != ok ]]; then
    rb::stream_failed
  fi
  if ((${#codes[@]} > 0)); then
    rb::pipe_failed "stream" "${labels[@]}" "${codes[@]}"
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
# Step 4/9: verify (specs/h200.yaml:14)
# Check the staging against the manifest: every file, mode, link and digest.
#######################################
step_verify() {
  # every entry of this run's staging; files linked unchanged from the current install by stat.
  # The engine leaves its stamp: relocate, prove and swap install only what this run verified.
  rb::staged_step verify
  RB_STEP_DETAIL=${RB_ENGINE_DETAIL}
}

#######################################
# Step 5/9: relocate (specs/h200.yaml:11)
# Rewrite what names the old path (shebangs, activate scripts) for the new one.
#######################################
step_relocate() {
  rb::staged_step relocate
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
  rb::staged_step prove
  RB_STEP_DETAIL=${RB_ENGINE_DETAIL}
}

#######################################
# Step 7/9: swap (specs/h200.yaml:15)
# Put the proven copy in place in one rename, then prove it there (sys.prefix, the console scripts); a failure puts back what was there.
#######################################
step_swap() {
  # one rename, then the post-swap proof there (sys.prefix, the console scripts); the engine puts back what
  # was there when the proof fails
  rb::staged_step swap
  if [[ -n "${RB_J[backup]:-}" ]]; then
    rb::log "to put the previous destination back: bash ${RB_SELF} --restore"
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
  if [[ "${RB_ENGINE_STATUS}" == failed && -n "${RB_J[put_back_after]:-}" ]]; then
    RB_ROLLED_BACK=1
    rb::fail "${RB_ENGINE_DETAIL}: bash ${RB_SELF}"
  fi
  if [[ "${RB_ENGINE_STATUS}" == failed && -n "${RB_J[rolled_back]:-}" ]]; then
    RB_ROLLED_BACK=1
    rb::fail "checks failed on ${RB_DST_HOST} (table above; report ${report}); rolled back: the" \
      "previous install is in place again. After fixing it run every step again: bash ${RB_SELF}" \
      "(--from probe would check the install put back)"
  fi
  if [[ "${RB_ENGINE_STATUS}" == failed ]]; then
    rb::fail "checks failed on ${RB_DST_HOST} (table above; report ${report})"
  fi
  RB_STEP_DETAIL="${RB_ENGINE_DETAIL} on ${RB_DST_HOST}"
}

#######################################
# Set up this run: the private scratch directory and this machine's kit, the runbook's directory
# and this run's own (rb::run_dirs: private, or refused; held by one run at a time), the log, ssh
# multiplexing, absolute paths. Nothing is written in either before it is known private and this
# run holds it.
#######################################
rb::init() {
  # this run's scratch directory in a private parent (rb::scratch_dir): this machine's kit, the
  # ssh sockets, the working directory of every command this runbook starts from here on, and
  # their TMPDIR
  rb::scratch_dir
  RB_LOCAL_KIT=${RB_WORK}/kit
  RB_SSH_COMMON=(-o BatchMode=yes -o ControlMaster=auto -o "ControlPath=${RB_WORK}/ssh-%C"
    -o ControlPersist=300 -o ServerAliveInterval=15 -o ServerAliveCountMax=4
    -c "${RB_SSH_CIPHERS}")
  # the real interpreter behind `python3` (a version-manager shim can cost 0.2 s a start); the
  # pinned form's start found it already
  if [[ "${RB_LOCAL_PY}" == python3 ]]; then
    RB_LOCAL_PY=$(cd / && python3 "${RB_PY_FLAGS[@]}" -c 'import sys; print(sys.executable)')
  fi
  rb::kit_write "${RB_LOCAL_KIT}"
  # a plan's ssh connections are made while the run directory is checked (each judged first,
  # with the kit just written: rb::connect_early)
  if ((${RB_PLANNING:-0})); then
    rb::connect_early "${RB_HOSTS[@]}"
  fi
  rb::run_dirs
  RB_EVENTS="${RB_RUN_DIR}/events.tsv"
  rm -f -- "${RB_EVENTS}" "${RB_RUN_DIR}/run.log"
  : >"${RB_EVENTS}"
  : >"${RB_RUN_DIR}/run.log"
  # the log's copy: tee's status is no step's, and it ignores the signals a Ctrl-C sends the run's
  # whole process group (gone, the next line this shell writes would end it with SIGPIPE)
  # shellcheck disable=SC2312
  exec 2> >(trap '' INT TERM HUP && exec tee -a "${RB_RUN_DIR}/run.log" >&2)
  rb::witness_start
  RB_SRC_ABS=$(rb::abspath "${RB_SRC_HOST}" "${RB_SRC_PATH}")
  RB_DST_ABS=$(rb::abspath "${RB_DST_HOST}" "${RB_DST_PATH}")
  rb::install_paths
  cd "${RB_WORK}"
  rb::log "runbook ${RB_NAME} from ${RB_SPEC} (sha256 ${RB_SPEC_SHA256:0:12}); run dir ${RB_RUN_DIR}"
  rb::scratch_said
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
  # the run has ended and its report is written: a signal now is said, and cleaning up goes on
  trap 'rb::cleanup_signal INT' INT
  trap 'rb::cleanup_signal TERM' TERM
  trap 'rb::cleanup_signal HUP' HUP
  rb::witness_stop
  local running pid
  local -a live=()
  # the background jobs still running and what they started (an ssh client, a kit's Python, its
  # tar); one that ended has nothing left to stop (what it started went to init)
  running=$(jobs -pr)
  for pid in "${RB_BG_PIDS[@]}"; do
    if [[ $'\n'"${running}"$'\n' == *$'\n'"${pid}"$'\n'* ]]; then
      live+=("${pid}")
    fi
  done
  if ((${#live[@]} > 0)); then
    rb::kill_tree "${live[@]}"
  fi
  if [[ -n "${RB_CLOSING}" ]]; then
    rb::close_wait
  else
    rb::close_hosts
  fi
  rm -rf "${RB_WORK}"
  if [[ -n "${RB_RUN_LOCK}" ]]; then
    rm -rf -- "${RB_RUN_LOCK}"
  fi
}

#######################################
# A signal while cleaning up: the run's outcome and exit status stand (an ok run's install is done,
# verified and reported); what the cut cleanup could not remove is named by rb::close_hosts.
#######################################
rb::cleanup_signal() {
  trap '' INT TERM HUP
  RB_STEP=cleanup rb::log "SIG$1 while cleaning up after the run ended: its report and exit status" \
    "stand; cleaning up goes on"
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
  rb::now
  RB_STEP_START=${RB_NOW}     # its row's time (issue 45: 1796600526.5s, from the epoch)
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
  local only='' from='' id run=0 restore='' list_backups=0 plan=0 markdown=0 discard=0
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
      --discard-staging) discard=1 ;;
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
    # the live plan (rb::plan: the install's partial, install.sh.j2 or fanplan.sh.j2): every step
    if [[ -n "${only}${from}" ]]; then
      echo "--plan and --apply are for every step of a run (not with --only or --from);" \
        "--dry-run shows the steps" >&2
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
  if ((discard)); then
    rb::discard_staging
    return 0
  fi
  if ((plan)); then
    rb::plan "${markdown}"
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
