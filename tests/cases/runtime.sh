#######################################
# The run's state: logging, the step runner, host access.
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
# the stream's compression, and the relay's streams compression auto's model chose (0: its rule)
RB_COMPRESSION_USED=none RB_RELAY_STREAMS=0
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
# the single-host install's (a fan-out runbook's partials/fanout_node.sh.j2 sets its own); a
# fan-out has no route setting: its stream comes through this machine
if [[ ! -v RB_ROUTE ]]; then
  RB_ROUTE=relay
  RB_DIRECT_SSH=()
fi
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
# beside the destination, by the engine's one rule (rbkit.engine.staging_path): preflight asks it
RB_STAGING=''
# the destination holds an earlier install (preflight); the engine's private state dir there
RB_DST_INSTALLED=0
RB_ENGINE_STATE=''

#######################################
# Set RB_COMPRESSION_USED from the spec's compression and what the given hosts (the stream's ends)
# have (RB_HOST_COMP, said by rb::hosts_prepare): auto takes the first of RB_AUTO_COMPRESSION that
# every end has, else none; a named tool one end lacks fails.
#######################################
rb::choose_compression() {
  local tool host missing=''
  local -a tools=("${RB_COMPRESSION}")
  RB_COMPRESSION_USED=none
  RB_COMPRESSION_WHY="none (the spec says none)"
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
        missing+="; ${tool} missing on ${host}"
        continue 2
      fi
    done
    RB_COMPRESSION_USED=${tool}
    rb::compression_said "${tool} (every end has it)${missing}"
    return 0
  done
  rb::compression_said "none (no end-to-end compressor of ${tools[*]})${missing}"
}

#######################################
# Say the stream's compression and why (the words, joined as rb::log joins them): one line a run,
# `compression: WHY`, with why it was not measured when it was not (RB_COMPRESSION_NOTE, said by
# rb::measure_finish, which logs nothing itself: issue 45, the line came twice); kept in
# RB_COMPRESSION_WHY (the live plan's reason).
#######################################
rb::compression_said() {
  RB_COMPRESSION_WHY="$*"
  rb::log "compression: ${RB_COMPRESSION_WHY}${RB_COMPRESSION_NOTE:+; ${RB_COMPRESSION_NOTE}}"
  RB_COMPRESSION_NOTE=''
}

#######################################
# Widen the pipe on stdout to 1 MiB (Linux's F_SETPIPE_SZ; pipe-max-size is 1 MiB for any user),
# where there is one; else leave it. Between the two ssh clients of the relay, a 64 KiB pipe makes
# them take turns (the figure: docs/benchmarks.md, "Figures behind choices in the code").
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
# Log a line to stderr: time, runbook, step, message. A control character in the message (a file
# name's ESC, BEL or newline, issue 44 R8) is written as an escape (rb::printable), never raw.
#######################################
rb::log() {
  local text="$*"
  rb::printable text
  printf '%(%H:%M:%S)T %s [%s] %s\n' -1 "${RB_NAME}" "${RB_STEP:-main}" "${text}" >&2
}

#######################################
# The variable named $1, each control character in it escaped as rbrules.shown.printable writes
# it (\n, \t, \r, \xNN; a backslash kept): text for a terminal or a file a person reads.
#######################################
rb::printable() {
  local -n _rb_text=$1
  local out='' c i
  [[ "${_rb_text}" == *[[:cntrl:]]* ]] || return 0
  for ((i = 0; i < ${#_rb_text}; i++)); do
    c=${_rb_text:i:1}
    if [[ "${c}" == [[:cntrl:]] ]]; then
      case "${c}" in
        $'\n') c='\n' ;;
        $'\t') c='\t' ;;
        $'\r') c='\r' ;;
        *) printf -v c '\\x%02x' "'${c}" ;;
      esac
    fi
    out+=${c}
  done
  _rb_text=${out}
}

#######################################
# Each line of stdin to stdout after $1, escaped as rb::log escapes a message (rb::printable).
#######################################
rb::printable_lines() {
  local line
  while IFS= read -r line || [[ -n "${line}" ]]; do
    rb::printable line
    printf '%s%s\n' "$1" "${line}"
  done
}

#######################################
# A line for the run's log only (run.log), never the terminal: figures behind a line said there.
#######################################
rb::log_only() {
  if [[ -n "${RB_RUN_DIR:-}" && -f "${RB_RUN_DIR}/run.log" ]]; then
    printf '%(%H:%M:%S)T %s [%s] %s\n' -1 "${RB_NAME}" "${RB_STEP:-main}" "$*" \
      >>"${RB_RUN_DIR}/run.log"
  fi
}

#######################################
# Fail the current step with a message, said here once (the ERR trap then adds only the hint,
# RB_FAIL_HINT when the caller set one, the event and the report's row).
#######################################
rb::fail() {
  RB_LAST_CMD="$*"
  if [[ -n "${RB_WORK}" ]]; then
    # the third line marks a failure in words: the failure block shows it as the cause; the
    # fourth is what to do (RB_FAIL_HINT, set just before; empty: none)
    printf '%s\n%s\nfail\n%s\n' "${RB_HOST}" "${RB_LAST_CMD}" "${RB_FAIL_HINT//$'\n'/ }" \
      >"${RB_WORK}/last-command"
  fi
  RB_FAIL_HINT=''
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
  elif [[ -z "${RB_SSH_READY[${host}]:-}" ]]; then
    # what ssh would read for the host was refused, or never judged (rb::ssh_files_ready)
    rb::fail "not reaching ${host}: the files ssh reads for it were not accepted"
    return 1
  else
    # the spec's options first: for ssh the first value of an option wins; the command starts in
    # this run's private kit directory there (`/` before it is made), never the login's
    # directory, with TMPDIR there too (what the kit makes in a temporary directory is in it)
    words=$(rb::shq cd "${RB_KIT_DIR[${host}]:-/}")
    if [[ -n "${RB_KIT_DIR[${host}]:-}" ]]; then
      words+=" && TMPDIR=$(rb::shq "${RB_KIT_DIR[${host}]}") && export TMPDIR"
    fi
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
# The cause and the fix when ssh refused the host key of HOST ($1), and of every other host whose
# preparation failed the same way: RB_KEY_WORDS (what is wrong, each other host named) and
# RB_HINT (what to do, for each). RB_HOST_SSH and RB_HOST_TARGET are HOST's again after: the
# cause names HOST's own address.
#######################################
rb::host_keys_cause() {
  local host=$1 h
  RB_HINT=''
  rb::host_key_hint "${host}"
  RB_KEY_WORDS=${RB_KH_WORDS}
  for h in "${RB_PREPARE_HOSTS[@]}"; do
    if [[ "${h}" != "${host}" ]] && grep -qE 'verification failed|host key is known|HAS CHANGED' \
      "${RB_WORK}/prepare-${h}.err" 2>/dev/null; then
      RB_HINT+=". For ${h}: "
      rb::host_key_hint "${h}"
      if ((RB_KH_CHANGED)); then
        RB_KEY_WORDS+="; ${h}'s host key changed"
      else
        RB_KEY_WORDS+="; nor ${h}'s"
      fi
    fi
  done
  "rb::host_${host}"
}

#######################################
# Add to RB_HINT what to do about HOST's ($1) host key, which ssh refused; RB_KH_WORDS what is
# wrong with it, RB_KH_CHANGED 1 when it changed. A key ssh knows another key for (its
# preparation's words say it changed, or the file ssh records keys in holds one for the name ssh
# looks up) changed: that is what an attack looks like, so the new key is checked with the host's
# owner before the old line is replaced (accept-new takes only keys no file knows: it cannot
# help). A key no file knows: check it and add it to the file ssh reads (rb::known_hosts_of),
# under the name ssh looks up (its HostKeyAlias, if any), or accept-new for a first contact.
#######################################
rb::host_key_hint() {
  local port='' check add
  rb::known_hosts_of "$1"
  if [[ "${RB_KH_PORT}" != 22 ]]; then
    port=" -p ${RB_KH_PORT}"
  fi
  check="ssh-keyscan${port} ${RB_KH_HOST} | ssh-keygen -lf -"
  add="ssh-keyscan${port} ${RB_KH_HOST}${RB_KH_ALIAS:+ | sed 's/^[^ ]*/${RB_KH_ALIAS}/'} >> ${RB_KH_FILE}"
  RB_KH_CHANGED=0
  if grep -qE 'IDENTIFICATION HAS CHANGED|Host key for .* has changed' "${RB_WORK}/prepare-$1.err" \
    2>/dev/null || ssh-keygen -F "${RB_KH_NAME}" -f "${RB_KH_FILE}" >/dev/null 2>&1; then
    RB_KH_CHANGED=1
    RB_KH_WORDS="its host key changed: it is not the key this machine knows for it"
    RB_HINT+="$1's host key is not the one ${RB_KH_FILE} holds for ${RB_KH_NAME}: it changed,"
    RB_HINT+=" which is what an attack looks like. Ask the host's owner whether it was"
    RB_HINT+=" re-keyed and check the new key's fingerprint with them (${check}); only then"
    RB_HINT+=" remove the old key (ssh-keygen -R ${RB_KH_NAME} -f ${RB_KH_FILE}) and add the"
    RB_HINT+=" new one (${add})"
    return 0
  fi
  RB_KH_WORDS="this machine does not trust its host key"
  RB_HINT+="this machine does not trust $1's host key. Check its fingerprint with the host's"
  RB_HINT+=" owner (${check}), then add it to the known_hosts file ssh reads for it (${add}),"
  RB_HINT+=" or set hosts.$1.host_keys: accept-new in the spec for a first contact"
}

# the ssh hosts whose files rb::ssh_files_ready passed: the only ones ssh is ever run for
declare -A RB_SSH_READY=()

#######################################
# Before HOST ($1) is reached over ssh, what ssh will read for it is judged here
# (rbrules.sshfiles, once for the host): the ssh config file its spec names (`-F`: ssh runs the
# commands it names, ProxyCommand, Match exec, LocalCommand, on this machine, even `ssh -G`) is
# a regular file that only this user or root can change, nor any directory above it; then, as
# `ssh -G` says after -F, the alias and Match, host keys are checked and every known_hosts file
# is one no other user can change (with accept-new, the first user file may be missing where ssh
# can make it in a folder of this user). Sets RB_SSH_READY[HOST]; otherwise fails (rb::fail)
# naming the file, the host and the fix, and ssh is never run for the host: not to connect, not
# to close (rb::close_master), not `-G`. Every failure returns 1 (also where errexit is off).
#######################################
rb::ssh_files_ready() {
  local host=$1 why rc=0 line
  "rb::host_${host}"
  if [[ -z "${RB_HOST_TARGET}" || -n "${RB_SSH_READY[${host}]:-}" ]]; then
    return 0
  fi
  rb::py_argv "${RB_LOCAL_PY}" "${RB_LOCAL_KIT}" rbrules.sshfiles
  why=$("${RB_KIT_ARGV[@]}" --host "${host}" --target "${RB_HOST_TARGET}" -- "${RB_HOST_SSH[@]}" \
    2>&1) || rc=$?
  RB_HOST=${host}
  if ((rc == 3)); then
    # ssh cannot read its options for the host (a bad config file): its words, with the host's name
    while IFS= read -r line; do
      [[ -z "${line}" ]] || rb::log "${host}: ${line}"
    done <<<"${why}"
    rb::fail "ssh cannot read its options for ${host} (it said why above): fix" \
      "hosts.${host}.ssh_config or the spec's options"
    return 1
  elif ((rc != 0)); then
    rb::fail "${why:-the files ssh reads for ${host} could not be checked (rbrules.sshfiles exited ${rc})}"
    return 1
  fi
  RB_SSH_READY[${host}]=1
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
  conf=''
  if [[ -n "${RB_SSH_READY[$1]:-}" ]]; then
    conf=$(ssh "${RB_HOST_SSH[@]}" -G -- "${RB_HOST_TARGET}" 2>/dev/null) || true
  fi
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
  RB_KH_NAME=${alias:-${RB_KH_HOST}} RB_KH_ALIAS=${alias}
  if [[ -z "${alias}" && "${port}" != 22 ]]; then
    RB_KH_NAME="[${RB_KH_NAME}]:${port}"
  fi
}

#######################################
# Prepare HOSTS... for the run, all at once (one background job each), one command and one reply
# per host: tar and python3 >= 3.9 are there, which compressors it has (RB_HOST_COMP), and the
# kit: this machine uses the run directory's copy; an ssh host gets a private directory made for
# this run (mktemp -d: 0700, owned by the ssh user), into which the kit's tar is sent and checked
# against its sha256 there before it is unpacked. Nothing is reused from an earlier run, so
# nothing another user of the host planted is ever run. rb::cleanup removes it. A host that fails
# is named once every host's job has ended: every one in one line, the first's cause (FAILED);
# with --all first (a plan), none is a failure here: each failed host is left without a kit
# (RB_KIT_DIR), for the caller to name. Before ssh runs for a host, what it reads for it is
# judged (rb::ssh_files_ready): a refusal ends the run (or the plan) there, in every mode.
#######################################
rb::hosts_prepare() {
  local host tar=${RB_WORK}/kit.tar out=${RB_WORK}/prepare failed='' n=0 all=0
  local -A pids=() rcs=() down=()
  if [[ "$1" == --all ]]; then
    all=1
    shift
  fi
  # before ssh reads them: the files ssh reads for each host (an early connection's job judged
  # them already)
  for host in "$@"; do
    if [[ -z "${RB_KIT_DIR[${host}]:-}" ]] && ! rb::connected "${host}" "${out}-${host}.err"; then
      down[${host}]=1         # ssh could not connect (rb::connect_early): said below
    fi
    rb::ssh_files_ready "${host}"
  done
  RB_PREPARE_HOSTS=("$@")
  rb::known_hosts_before "$@"
  for host in "$@"; do
    [[ -z "${RB_KIT_DIR[${host}]:-}" ]] || continue
    if [[ -n "${down[${host}]:-}" ]]; then
      rcs[${host}]=255
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
        RB_HOST_BOOT["${host}"] RB_HOST_CPUS["${host}"] <"${out}-${host}" || true
    fi
    rb::said_on "${host}" "${out}-${host}.err" "${rcs[${host}]:-0}"
    [[ "${rcs[${host}]:-0}" == 0 ]] || failed+="${failed:+, }${host} (exit ${rcs[${host}]})" n=$((n + 1))
  done
  rb::known_hosts_after
  if ((n > 1)); then
    rb::log "${n} hosts could not be prepared: ${failed}; each said why above"
  fi
  for host in "$@"; do
    if [[ -z "${rcs[${host}]:-}" ]]; then
      continue
    fi
    RB_HOST=${host}
    RB_LAST_CMD="on ${host}: check tar and python3 >= 3.9, receive the kit (sha256 ${RB_KIT_TAR_SHA256:0:12})"
    printf '%s\n%s\n' "${RB_HOST}" "${RB_LAST_CMD}" >"${RB_WORK}/last-command"
    if ((rcs[${host}] != 0 && all)); then
      continue
    elif ((rcs[${host}] != 0)); then
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

# Give HOST the kit (and check its tools): rb::hosts_prepare of one host.
rb::kit_ship() {
  rb::hosts_prepare "$1"
}

#######################################
# One host's preparation (rb::hosts_prepare): $1 the host, $2 the kit's tar here. Prints
# `PYTHON<TAB>KIT_DIR<TAB>COMPRESSORS<TAB>BOOT_ID<TAB>CPUS` (KIT_DIR `-` for this machine: the run
# directory's copy; BOOT_ID the kernel's, CPUS its Cpus_allowed_list, `-` where unknown). A kit
# that arrives with another sha256 is removed unread; a kit directory's `owner` names its run.
#######################################
rb::host_prepare() {
  local host=$1 tar=$2 mode=ship
  if rb::is_local "${host}"; then
    mode=here
    tar=/dev/null
  fi
  rb::pipe_on_host "${host}" sh -c "${RB_PRIVATE_SH}"'for t in tar python3; do command -v "$t" >/dev/null ||
      { echo "missing tool on this host: $t" >&2; exit 1; }; done
    comp=none
    for t in gzip lz4 zstd; do if command -v "$t" >/dev/null; then comp="${comp},$t"; fi; done
    dir=-
    if [ "$1" = ship ]; then
      tmp=$(rb_private /tmp) || { echo "refusing /tmp on this host for the kit of this run: $tmp (chown root /tmp; chmod 1777 /tmp)" >&2; exit 1; }
      dir=$(umask 077 && mktemp -d "${tmp}/rbkit.XXXXXXXXXX") || exit 1
      trap "rm -rf -- \"${dir}\"" EXIT
      printf "%s\n" "$3" >"${dir}/owner" || exit 1
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
    printf "%s\t%s\t%s\t%s\t%s\n" "${py}" "${dir}" "${comp}" "${boot:--}" "$(sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status 2>/dev/null)"' rb "${mode}" "${RB_KIT_TAR_SHA256}" "${RB_HOLDER}" <"${tar}"
}

#######################################
# `rb_private DIR`, a POSIX sh function: DIR's physical path (links resolved, cd -P) on stdout
# when it and every directory above it is root's or this user's and not writable by group or
# others unless sticky (what rbrules.private judges along a path: in sh, since it runs where no
# kit is yet: the parent of this machine's scratch directory, and /tmp on a host before its
# kit's directory is made there); else why not on stdout, status 1. A sticky directory protects
# the names in it: the one made there (mktemp -d, 0700) is then this user's, which no one else
# can rename or replace.
#######################################
RB_PRIVATE_SH='rb_private() {
  real=$(cd -P -- "$1" 2>/dev/null && pwd -P) || { echo "$1 is not a directory here"; return 1; }
  me=$(id -u) at=$real
  while :; do
    st=$(stat -c "%u %a %U" -- "$at") || { echo "cannot stat $at"; return 1; }
    set -- $st
    mode=$(printf %04o $((0$2)))
    if [ "$1" != 0 ] && [ "$1" != "$me" ]; then
      echo "directory $at is owned by $3 (uid $1), mode $mode: that user can rename or replace what is in it"
      return 1
    fi
    wbits=$((0$2 & 18))
    if [ "$wbits" != 0 ] && [ $((0$2 & 512)) = 0 ]; then
      who=others
      [ "$wbits" = 16 ] && who=group
      [ "$wbits" = 18 ] && who="group and others"
      echo "directory $at is owned by $3 (uid $1), mode $mode: writable by $who without the sticky bit, so another user can rename or replace what is in it"
      return 1
    fi
    [ "$at" = / ] && break
    at=${at%/*}
    at=${at:-/}
  done
  printf "%s\n" "$real"
}
'

# RB_PRIVATE_SH's rule here: the physical path of the directory $1, or why it is not private
# (status 1)
rb::private_path() {
  sh -c "${RB_PRIVATE_SH}"$'\nrb_private "$1"' rb "$1"
}

#######################################
# This run's scratch directory, RB_WORK (mktemp -d: a new name, 0700), made in TMPDIR (default
# /tmp) when it is private (rb::private_path: neither it nor a directory above it can be changed
# by another user than root or this one, a sticky one aside), else in /tmp, saying so
# (rb::scratch_said, once the log is open); when neither is, the run stops here (exit 2) before
# anything is made. The kit that holds rbrules.private is written into it, so the rule is taken
# in sh here. TMPDIR is then RB_WORK, for all this run starts here.
#######################################
rb::scratch_dir() {
  local want=${TMPDIR:-/tmp} got rc=0 why me
  RB_SCRATCH_NOTE=''
  got=$(rb::private_path "${want}") || rc=$?
  if ((rc != 0)); then
    why=${got}
    if [[ "${want}" != /tmp ]]; then
      rc=0
      got=$(rb::private_path /tmp) || rc=$?
      RB_SCRATCH_NOTE="TMPDIR ${want} is not private: ${why}; this run's scratch directory is in"
      RB_SCRATCH_NOTE+=" /tmp instead"
      why+="; nor /tmp: ${got}"
    fi
  fi
  if ((rc != 0)); then
    me=$(id -un)
    echo "refusing to run: no private place for this run's scratch directory (TMPDIR ${want}:" \
      "${why}); another user could replace this run's kit there: set TMPDIR to a directory" \
      "only ${me} can write (its parents too)" >&2
    exit 2
  fi
  RB_WORK=$(umask 077 && mktemp -d "${got}/rb.XXXXXX")
  export TMPDIR=${RB_WORK}
}

# What rb::scratch_dir had to say (a TMPDIR that is not private), in the log.
rb::scratch_said() {
  if [[ -n "${RB_SCRATCH_NOTE}" ]]; then
    rb::log "${RB_SCRATCH_NOTE}"
  fi
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
# --plan: the connection of each ssh host of HOSTS... (the ControlMaster the run keeps) opened in
# the background as soon as this machine's kit is written, so that ssh's handshake is made while
# this machine checks the run directory; rb::hosts_prepare waits for it (rb::connected) and then
# prepares the host through it as before. Only a host without an ssh_config file or accept-new
# is connected early, and only once the job has judged what ssh reads for it
# (rb::ssh_files_ready; a host it refuses is not connected: rb::hosts_prepare says why). It
# runs nothing there but `true`, and what ssh says is said by rb::hosts_prepare, as before.
#######################################
rb::connect_early() {
  local host
  for host in "$@"; do
    "rb::host_${host}"
    if [[ -z "${RB_HOST_TARGET}" || " ${RB_HOST_SSH[*]} " == *" -F "* ||
      " ${RB_HOST_SSH[*]} " == *" StrictHostKeyChecking=accept-new "* ]]; then
      continue
    fi
    rb::connect_one "${host}" >/dev/null 2>"${RB_WORK}/early-${host}.err" &
    RB_EARLY[${host}]=$!
    RB_BG_PIDS+=("$!")
  done
}

#######################################
# The early connection of HOST ($1), a background job: exit 3 when what ssh reads for it was
# refused (nothing ran), else ssh's status.
#######################################
rb::connect_one() {
  # from the private directory; RB_WORK empty: it does not record itself as the command that
  # ran last
  cd "${RB_WORK}"
  RB_WORK=''
  if ! rb::ssh_files_ready "$1" 2>/dev/null; then
    exit 3
  fi
  rb::on_host "$1" true
}

#######################################
# Before rb::hosts_prepare reaches HOST ($1): its early connection, if any, waited for; what ssh
# reads for it passed there (RB_SSH_READY) when ssh ran (0 or 255); otherwise (refused: 3)
# rb::hosts_prepare judges it again and says why. Returns 1 when ssh could not connect (status 255), its words
# moved to $2, where the preparation's own would be: the host is not tried twice (nor its
# timeout waited twice).
#######################################
rb::connected() {
  local pid=${RB_EARLY[$1]:-} rc=0
  if [[ -z "${pid}" ]]; then
    return 0
  fi
  unset 'RB_EARLY[$1]'
  wait "${pid}" || rc=$?
  if ((rc == 0 || rc == 255)); then
    RB_SSH_READY[$1]=1
  fi
  if ((rc == 255)); then
    mv -f -- "${RB_WORK}/early-$1.err" "$2"
    return 1
  fi
  rm -f -- "${RB_WORK}/early-$1.err"
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
      rb::int_came
      msg+=" ${names[i]} exited ${codes[i]};"
    fi
  done
  rb::fail "${label} failed:${msg%;}"
}

#######################################
# Bytes as a short human figure into the variable named $1: 1234567 -> 1.2 MB.
#######################################
rb::human() {
  local n=$2 units=(B KB MB GB TB PB) i=0 tenths
  while ((n >= 1000000 && i < 4)); do
    n=$((n / 1000))
    i=$((i + 1))
  done
  if ((n >= 1000)); then
    # rounded to the tenth, as the kit's human() rounds (the report's figures are its)
    tenths=$(((n + 50) / 100))
    printf -v "$1" '%d.%d %s' $((tenths / 10)) $((tenths % 10)) "${units[i + 1]}"
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
# Say the route and why (the words, joined as rb::log joins them): logged as `route: WHY`, and
# kept in RB_ROUTE_WHY (the live plan's reason).
#######################################
rb::route_said() {
  RB_ROUTE_WHY="$*"
  rb::log "route: ${RB_ROUTE_WHY}"
}

#######################################
# compression: auto on the relay, measured beside the source's scan (in the background), started
# as the hosts are ready and told to go by rb::measure_go: the link's rate (rb::measure_link) and
# each compressor both ends have packing a sample of the source (rbkit measure, which also takes
# the choice) into RB_WORK/measure.out, side by side; where the machines share CPUs
# (rb::shared_cpus) the link waits for the scan (rb::measure_scanned), alone on the CPUs, and the
# tools for the link (rb::measure_run).
#######################################
rb::measure_start() {
  local tool src_kit
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
  if ((${#RB_MEASURE_ARGS[@]} == 0)); then
    return 0
  fi
  if rb::shared_cpus "${RB_SRC_HOST}" "${RB_DST_HOST}" relay >/dev/null; then
    src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
    RB_MEASURE_ARGS+=(--shared-cpu --scanned "${src_kit}/${RB_NAME}.names.stat")
  fi
  mkfifo -m 600 "${RB_WORK}/measure.go"
  # shellcheck disable=SC2034 # rb::measure_go (preflight) and rb::measure_scanned write to it
  exec {RB_MEASURE_GO}<>"${RB_WORK}/measure.go"
  rb::measure_run >"${RB_WORK}/measure.out" 2>"${RB_WORK}/measure.err" &
  RB_MEASURE_PID=$!
  RB_BG_PIDS+=("${RB_MEASURE_PID}")
}

#######################################
# The background job of rb::measure_start (RB_WORK empty: it records no command of its own): the
# link measured here (rb::measure_link), `rbkit measure` on the source told to go by its first
# line: its tools beside the link, or, where the machines share CPUs, after it and only if the
# link left CPU to spare (the sample then from the scan's record). The CPUs this machine may use
# (`rbkit cpus --token` here) go with it: the model counts the relay's streams and ciphers here.
#######################################
rb::measure_run() {
  local out=${RB_WORK}/measure.link go='' shared='' here
  RB_WORK=''
  [[ " ${RB_MEASURE_ARGS[*]} " != *" --shared-cpu "* ]] || shared=shared
  rb::py_argv "${RB_LOCAL_PY}" "${RB_LOCAL_KIT}" rbkit
  here=$("${RB_KIT_ARGV[@]}" cpus --token 2>/dev/null) || here=''
  rb::kit_argv "${RB_SRC_HOST}"
  rb::measure_link "${RB_SRC_HOST}" "${RB_DST_HOST}" "${out}" "${out%link}go" "${shared}" | {
    read -r go && [[ "${go}" == go ]] &&
      rb::pipe_on_host "${RB_SRC_HOST}" "${RB_KIT_ARGV[@]}" measure "${RB_SRC_ABS}" \
        "${RB_MEASURE_ARGS[@]}" "${RB_EXCLUDE_ARGS[@]}" --link - --jobs "${RB_JOBS}" \
        --here-cpus "${here}"
  } || true
}

#######################################
# The measurement's answer (rb::measure_start's job, waited for): RB_COMPRESSION_USED and its
# figures logged. Returns 1 (the caller falls back to the fixed order) when it did not run or
# could not measure, saying why.
#######################################
rb::measure_finish() {
  local key value choice='' why='' first clause short spaced
  # why it was not measured is said with the fallback's choice, in one line (rb::compression_said)
  if [[ -n "${RB_MEASURE_SKIP}" ]]; then
    RB_COMPRESSION_WHY=${RB_MEASURE_SKIP} RB_COMPRESSION_NOTE=${RB_MEASURE_SKIP}
    return 1
  fi
  if [[ -z "${RB_MEASURE_PID}" ]]; then
    RB_COMPRESSION_USED=none
    rb::compression_said "none (no compressor of ${RB_AUTO_COMPRESSION[*]} on both ends)"
    return 0
  fi
  wait "${RB_MEASURE_PID}" || true
  while IFS=$'\t' read -r key value; do
    case "${key}" in
      choice) choice=${value} ;;
      why) why=${value} ;;
      streams) [[ ! "${value}" =~ ^[1-9][0-9]?$ ]] || RB_RELAY_STREAMS=${value} ;;
      json) rb::fact compression_measured "${value}" ;;
      error) why=${value} ;;
      *) ;;
    esac
  done <"${RB_WORK}/measure.out"
  if [[ -z "${choice}" ]]; then
    RB_COMPRESSION_NOTE="not measured on ${RB_SRC_HOST} (${why:-no answer})"
    RB_COMPRESSION_WHY=${RB_COMPRESSION_NOTE}
    return 1
  fi
  RB_COMPRESSION_USED=${choice}
  RB_COMPRESSION_WHY="${choice} (auto, measured: ${why})"
  # the terminal: the choice and its deciding figures (the link's, and the chosen tool's); every
  # figure in run.log (issue 45: one line, hard to parse)
  first=${why%%; *}
  short=${first}
  # the chosen option's clause names it as the command reads it: zstd-3-T2 is `zstd -3 -T2`
  spaced=${choice/#zstd-/zstd -}
  spaced=${spaced/-T/ -T}
  while IFS= read -r clause; do
    [[ "${clause}" != "${spaced} "* ]] || short+="; ${clause}"
  done <<<"${why//; /$'\n'}"
  if [[ "${short}" != "${why}" ]]; then
    short+="; every figure in run.log"
    rb::log_only "compression: ${RB_COMPRESSION_WHY}"
  fi
  rb::log "compression: ${choice} (auto, measured: ${short})"
}

# The source's scan is done (rb::source_finish): on one kernel the link's measurement may start.
rb::measure_scanned() {
  if [[ -n "${RB_MEASURE_PID:-}" && -n "${RB_MEASURE_GO:-}" ]]; then
    printf 'scanned\n' >&"${RB_MEASURE_GO}" || true
    exec {RB_MEASURE_GO}>&-
    RB_MEASURE_GO=''
  fi
}

#######################################
# Whether the machines a stream from host $1 to host $2 passes through share CPUs: they run one
# kernel (the same boot id, RB_HOST_BOOT from rb::hosts_prepare: both hosts, and this machine
# when it relays, $3 `relay`) and the CPUs their commands may run on (RB_HOST_CPUS; this
# machine's own) overlap: there the stream's stages take turns on the same CPUs. Three sshd
# pinned to CPU sets of their own (taskset) on one kernel are three machines. Prints `BOOT_ID
# N` (how many CPUs two of them share, `-` where a set is not known: then one kernel is enough);
# returns 1 when they run apart.
#######################################
rb::shared_cpus() {
  local boot=${RB_HOST_BOOT[$1]:--} here='' line i j got c unknown=''
  local -a sets=("${RB_HOST_CPUS[$1]:--}" "${RB_HOST_CPUS[$2]:--}")
  local -A shared=()
  if [[ "${boot}" == - || "${RB_HOST_BOOT[$2]:--}" != "${boot}" ]]; then
    return 1
  fi
  if [[ "$3" == relay ]]; then
    IFS= read -r here 2>/dev/null </proc/sys/kernel/random/boot_id || return 1
    [[ "${here}" == "${boot}" ]] || return 1
    here=-
    while IFS= read -r line; do
      [[ "${line}" != Cpus_allowed_list:* ]] || read -r _ here <<<"${line}"
    done 2>/dev/null </proc/self/status
    sets+=("${here}")
  fi
  for ((i = 0; i < ${#sets[@]}; i++)); do
    for ((j = i + 1; j < ${#sets[@]}; j++)); do
      got=$(rb::cpus_common "${sets[i]}" "${sets[j]}") || continue
      if [[ "${got}" == - ]]; then
        unknown=-
        continue
      fi
      for c in ${got//,/ }; do
        shared[${c}]=1
      done
    done
  done
  if [[ -n "${unknown}" ]]; then
    printf '%s -\n' "${boot}"
  elif ((${#shared[@]} > 0)); then
    printf '%s %s\n' "${boot}" "${#shared[@]}"
  else
    return 1
  fi
}

#######################################
# The CPUs two lists as the kernel writes them (`0-3,8-11`) have in common, listed one by one
# (`2,3`), or `-` when either is `-` (not known); returns 1 when they have none.
#######################################
rb::cpus_common() {
  local part lo hi c got=''
  local -a parts
  local -A in_a=()
  if [[ "$1" == - || "$2" == - ]]; then
    printf -- '-\n'
    return 0
  fi
  IFS=, read -r -a parts <<<"$1"
  for part in "${parts[@]}"; do
    lo=${part%-*} hi=${part#*-}
    [[ "${lo}" =~ ^[0-9]+$ && "${hi}" =~ ^[0-9]+$ ]] || { printf -- '-\n'; return 0; }
    for ((c = lo; c <= hi; c++)); do
      in_a[${c}]=1
    done
  done
  IFS=, read -r -a parts <<<"$2"
  for part in "${parts[@]}"; do
    lo=${part%-*} hi=${part#*-}
    [[ "${lo}" =~ ^[0-9]+$ && "${hi}" =~ ^[0-9]+$ ]] || { printf -- '-\n'; return 0; }
    for ((c = lo; c <= hi; c++)); do
      [[ -z "${in_a[${c}]:-}" ]] || got+="${got:+,}${c}"
    done
  done
  [[ -n "${got}" ]] || return 1
  printf '%s\n' "${got}"
}

#######################################
# The relay's own rate: zeros from $1 through this machine (a 1 MiB pipe, as the stream's) to $2
# over the run's ssh connections (the stream's, with its cipher), timed on $2 by `rbkit
# measure-link`: it says `ready` before the sending end starts (a late session is not the link),
# stops once the rate is stable (rbrules.linkrate.link_stable), at most 0.6 s after the first
# byte, and the sending end ends on the broken pipe. $3: a scratch path. The receiving end starts
# at once, the zeros once the gate $4 says `go` (then `go` is printed first); with $5 `shared`
# (one kernel) only once the gate also said `scanned` (the link alone on the CPUs), and the
# receiving end watches this machine's ssh masters (rb::link_pids: it stops early when they had
# no CPU to spare). Prints `RATE SECONDS IDLE BYTES CPUS` (IDLE: the CPUs $2's kernel left idle
# meanwhile, or -; CPUS: those $2 may use, rbrules.cpus.token) and the masters' `CPU WAIT WALL
# COUNT` (ns: as the receiving end saw them over its later windows, else here over the whole
# measurement, rb::link_cpu_since, or -), or `error WHY`.
#######################################
rb::measure_link() {
  local from=$1 to=$2 out=$3 ready='' line='' go='' fd rfd pid was=- since
  local -a watch=()
  rm -f "${out}.in" "${out}.out" && mkfifo -m 600 "${out}.in" "${out}.out"
  rb::link_pids "${from}" "${to}"
  if [[ "${5:-}" == shared ]]; then
    watch=("${RB_LINK_WATCH[@]}")
  fi
  rb::kit_argv "${to}"
  rb::pipe_on_host "${to}" "${RB_KIT_ARGV[@]}" measure-link "${watch[@]}" <"${out}.in" \
    >"${out}.out" 2>/dev/null &
  pid=$!
  exec {fd}>"${out}.in" {rfd}<"${out}.out"
  read -r -t 10 -u "${rfd}" ready || true
  read -r -t 600 go <"$4" || true
  [[ "${go}" != go ]] || printf 'go\n'
  if [[ "${5:-}" == shared && "${go}" == go ]]; then
    read -r -t 600 line <"$4" || true
    line=''
  fi
  if [[ "${ready}${go}" == readygo ]]; then
    rb::wide_pipe >&"${fd}"
    rb::link_cpu
    was=${RB_LINK_CPU}
    rb::on_host "${from}" timeout 2 cat /dev/zero 1>&"${fd}" 2>/dev/null || true
  fi
  since=$(rb::link_cpu_since "${was}")
  exec {fd}>&-
  read -r -t 10 -u "${rfd}" line || true
  exec {rfd}<&-
  wait "${pid}" || true
  [[ "${go}" == go ]] || return 0
  line=${line:-error no answer from ${to}}
  if [[ "${line}" =~ ^[0-9]+\ [0-9.]+\ ([0-9.]+|-)\ [0-9]+\ [0-9]+:[0-9.]+:[-0-9,]+:[0-9]+$ ]]; then
    line+=" ${since}"     # the receiving end did not read the masters' figures: these
  elif [[ ! "${line}" =~ ^[0-9]+\ [0-9.]+\ ([0-9.]+|-)\ [0-9]+\ [0-9]+:[0-9.]+:[-0-9,]+:[0-9]+(\ [0-9]+){4}$ ]]; then
    line="error the link's rate could not be measured (${line#error })"
  fi
  printf '%s\n' "${line}"
}

#######################################
# This machine's ssh masters to the hosts $@ (the relay's connections: one cipher process a
# leg here, as many on the hosts), their pids into RB_LINK_PIDS and as `--watch PID:START` (the
# start time names the process: /proc/PID/stat's 22nd field) into RB_LINK_WATCH; a host reached
# without ssh, or whose master does not answer, is left out.
#######################################
rb::link_pids() {
  local host out stat
  local -a statf
  RB_LINK_PIDS=()
  RB_LINK_WATCH=()
  for host in "$@"; do
    "rb::host_${host}"
    [[ -n "${RB_HOST_TARGET}" ]] || continue
    out=$(ssh "${RB_HOST_SSH[@]}" "${RB_SSH_COMMON[@]}" -O check -- "${RB_HOST_TARGET}" 2>&1) ||
      continue
    [[ "${out}" =~ pid=([0-9]+) ]] || continue
    { stat=$(<"/proc/${BASH_REMATCH[1]}/stat"); } 2>/dev/null || continue
    read -r -a statf <<<"${stat##*) }"
    RB_LINK_PIDS+=("${BASH_REMATCH[1]}")
    RB_LINK_WATCH+=(--watch "${BASH_REMATCH[1]}:${statf[19]}")
  done
}

#######################################
# The CPU time and the run-queue wait (ns, /proc/PID/schedstat) of the processes RB_LINK_PIDS so
# far, and the clock (ns), into RB_LINK_CPU as `CPU WAIT NOW COUNT`; `-` when one cannot be read.
#######################################
rb::link_cpu() {
  local pid cpu wait_ns sum=0 waited=0 now=${EPOCHREALTIME/./}
  RB_LINK_CPU=-
  ((${#RB_LINK_PIDS[@]} > 0)) || return 0
  for pid in "${RB_LINK_PIDS[@]}"; do
    { read -r cpu wait_ns _ </proc/"${pid}"/schedstat; } 2>/dev/null || return 0
    sum=$((sum + cpu))
    waited=$((waited + wait_ns))
  done
  RB_LINK_CPU="${sum} ${waited} ${now}000 ${#RB_LINK_PIDS[@]}"
}

#######################################
# What RB_LINK_PIDS used between rb::link_cpu's reading $1 (`CPU WAIT NOW COUNT`) and now:
# `CPU_NS WAIT_NS WALL_NS COUNT`, or `-` when either reading is missing.
#######################################
rb::link_cpu_since() {
  local -a was now_
  rb::link_cpu
  if [[ "$1" == - || "${RB_LINK_CPU}" == - ]]; then
    printf -- '-\n'
    return 0
  fi
  read -r -a was <<<"$1"
  read -r -a now_ <<<"${RB_LINK_CPU}"
  printf '%s %s %s %s\n' "$((now_[0] - was[0]))" "$((now_[1] - was[1]))" "$((now_[2] - was[2]))" \
    "${now_[3]}"
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
    --streams "${RB_RELAY_STREAMS}" --src-name "${RB_SRC_HOST}" --src-ssh="${ssh_of[src]}"
    --src-kit "${src_kit}" --src-words="${words_of[src]}" --dst-name "${RB_DST_HOST}" --dst-ssh="${ssh_of[dst]}"
    --dst-kit "${dst_kit}" --dst-words="${words_of[dst]}" --send="${send_words}"
    --receive="${recv_words}" --parts "${list}.parts")
  RB_RELAY_CODES=()
  "${relay[@]}" </dev/null | rb::progress "${total}" "${start}" >"${RB_WORK}/receive.out" ||
    RB_RELAY_CODES=("${PIPESTATUS[@]}")
  ((${#RB_RELAY_CODES[@]} == 0))
}

#######################################
# The runbook's directory (RB_STATE_DIR, default runs/NAME: what later runs go on from, the kept
# manifest, the audit's pass, the fan-out's bundle) and this run's own (RB_RUN_DIR: its log,
# events, report, probe reports): by default runs/NAME/<UTC time>-<pid>, with runs/NAME/latest
# naming the newest and the oldest past RB_KEEP_RUNS (default 20) removed (rb::prune_runs); an
# RB_RUN_DIR set by hand is both. Each made private or refused (exit 2); the runbook's directory held (rb::run_lock)
# before anything is written in either.
#######################################
rb::run_dirs() {
  local me stamp
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
    rb::prune_runs
  fi
  # the default report is in this run's directory, made above (0700, in a private one)
  if [[ -n "${RB_REPORT}" ]]; then
    rb::private_dir "${RB_REPORT%/*}" "the directory of --report" "give --report a path in a" \
      "directory only ${me} can write"
  fi
  RB_REPORT=${RB_REPORT:-${RB_RUN_DIR}/report.json}
  # this run, as what it leaves on a host names it (the destination's lock, a kit's owner file)
  RB_HOLDER="runbook ${RB_NAME} run from ${HOSTNAME%%.*} (pid $$, run dir ${RB_RUN_DIR})"
}

#######################################
# The oldest runs' directories past RB_KEEP_RUNS (the names sort by their UTC time), removed by a
# run that holds the runbook's directory (rb::run_lock); a plan holds nothing and removes none.
# Never one whose run or plan is still going (its name ends in its pid: a plan runs beside a
# run), nor the one of the plan this run applies.
#######################################
rb::prune_runs() {
  local old
  local -a runs=()
  if [[ -z "${RB_RUN_LOCK}" ]]; then
    return 0
  fi
  shopt -s nullglob
  runs=("${RB_STATE_DIR}"/[0-9]*T[0-9]*Z-[0-9]*)
  shopt -u nullglob
  if ((${#runs[@]} <= RB_KEEP_RUNS)); then
    return 0
  fi
  for old in "${runs[@]:0:${#runs[@]}-RB_KEEP_RUNS}"; do
    if [[ -d "/proc/${old##*-}" || "${RB_APPLY_PLAN}" == "${old}"/* ]]; then
      continue
    fi
    rm -rf -- "${old}"
  done
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
  local rc=$? line=$1 what said='' hint=''
  trap - ERR
  if ((BASHPID != $$)); then
    exit "${rc}"
  fi
  if ((RB_SIGNALLED)); then
    return 0     # a signal is being handled (rb::on_signal): it reports and exits
  fi
  if rb::witness_saw; then
    rb::on_signal INT     # the witness saw the SIGINT this shell lost: this failure is its doing
  fi
  rb::signal_status "${rc}"
  set +e
  # the command that ran last, also when it ran in a subshell (whose variables are gone)
  if [[ -n "${RB_WORK}" && -f "${RB_WORK}/last-command" ]]; then
    { read -r RB_HOST; read -r RB_LAST_CMD; read -r said; read -r hint; } <"${RB_WORK}/last-command" ||
      true
  fi
  what=$(rb::short "${RB_LAST_CMD:-${BASH_COMMAND}}") || true
  if [[ "${said:-}" == fail ]]; then
    RB_CAUSE=${RB_LAST_CMD}   # rb::fail said it in words, logged above as FAILED
    RB_HINT=${hint}           # and what to do, when it knew (RB_FAIL_HINT)
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
    if ((RB_STEP_START == 0)); then
      RB_STEP_START=${RB_NOW}   # a part of the run that is no step (--restore) and set no start
    fi
    rb::event step "${RB_STEP}" failed "${RB_STEP_START}" "${RB_NOW}" "${RB_HOST}" "${RB_CAUSE}"
  fi
  rb::finish failed
  # the documented statuses: 1 a step or a check failed (the tool's own status is in the log)
  exit 1
}

#######################################
# Whether the witness (rb::witness) saw a SIGINT: it said so in RB_WORK/signal, or the signal is
# still pending there, or it is awake (not asleep in its read): then it says so within 1 s. A
# failure that a lost SIGINT caused (the ssh clients died of it) comes before a witness that
# another job's load kept off the CPU has written its word.
#######################################
rb::witness_saw() {
  local i line state='' pending=0
  if rb::int_sentinel_gone; then
    RB_INT_UNTRAPPED=1     # a SIGINT this shell could not trap (started with it ignored)
    return 0
  fi
  for ((i = 0; i < 10; i++)); do
    if [[ -n "${RB_WORK}" && -s "${RB_WORK}/signal" ]]; then
      return 0
    fi
    if [[ -z "${RB_WITNESS_PID}" || ! -r "/proc/${RB_WITNESS_PID}/status" ]]; then
      return 1
    fi
    while read -r line; do
      case "${line}" in
        State:*) state=${line#State:} ;;
        SigPnd:* | ShdPnd:*) ((16#${line: -1} & 2)) && pending=1 ;;
        *) ;;
      esac
    done <"/proc/${RB_WITNESS_PID}/status" || true
    if ((!pending)) && [[ "${state}" == *S* ]]; then
      return 1
    fi
    sleep 0.1
  done
  return 1
}

#######################################
# --plan: every host reached read-only (the kit in a private directory made for this run there,
# removed after), the route and compression chosen as a run chooses them, the source scanned and
# its static checks run, the destination's state read by `rbkit liveplan state` (no lock taken,
# nothing written beside it; compared there with its install's manifest, which stays there)
# meanwhile, then the plan composed here: the screen on stdout; plan.json,
# changes.txt (one line a path, rsync -i like) and, with $1 = 1, plan.md in this run's
# directory. Exits 1 naming every host it cannot reach, or when something blocks the run.
#######################################
rb::live_plan() {
  local markdown=$1 dir=${RB_RUN_DIR} how=${RB_WORK}/plan-how src_kit rc=0 line installed=''
  local skipped
  local -a flags=()
  RB_STEP=plan
  rb::plan_hosts
  # the route and the compression as preflight chooses them, said in the log (RB_*_WHY: the screen)
  rb::preflight_route 2>"${how}"
  rb::preflight_compression 2>>"${how}"
  src_kit=$(rb::kit_dir "${RB_SRC_HOST}")
  rb::source_start "${src_kit}/${RB_NAME}.names"
  rb::measure_start      # compression: auto on the relay: measured beside the scan (rb::measure_go)
  # meanwhile the destination, read-only, in one kit call: its entries, free space, backups, and
  # what differs from its install's manifest (read there by safefs, never through a link)
  RB_HOST=${RB_DST_HOST}
  rb::kit "${RB_DST_HOST}" liveplan state "${RB_DST_ABS}" --choices "${RB_ENGINE_CHOICES}" \
    --against-install >"${dir}/dest.state"
  IFS= read -r line <"${dir}/dest.state" || line=''
  if [[ "${line}" =~ \"installed_source_stat\":\ \"([0-9a-f]+)\" ]]; then
    installed=${BASH_REMATCH[1]}
  fi
  # the measurement goes on unless the destination holds an install (a re-run sends what changed,
  # if anything), as in preflight
  rb::measure_go "${installed}"
  # the static checks are skipped, as preflight skips them, for the tree they passed with here
  rb::source_finish "${installed}"
  rb::plan_source
  if ((RB_MEASURING)) && ! rb::measure_finish 2>>"${how}"; then
    skipped=${RB_COMPRESSION_WHY}
    rb::compression_fallback 2>>"${how}"
    RB_COMPRESSION_WHY="${skipped}; ${RB_COMPRESSION_WHY}"
  fi
  cat "${how}" >>"${dir}/run.log"
  rb::on_host "${RB_SRC_HOST}" cat "${src_kit}/${RB_NAME}.names.stat" >"${dir}/source.scan"
  # both hosts' records are here: their kits are removed while the plan is composed
  rb::close_start
  [[ "${RB_SRC_HOST}" == "${RB_DST_HOST}" ]] && flags+=(--same-host)
  rb::plan_args "${markdown}"
  rb::py_argv "${RB_LOCAL_PY}" "${RB_LOCAL_KIT}" rbkit
  "${RB_KIT_ARGV[@]}" liveplan compose "${RB_PLAN_ARGS[@]}" --route "${RB_ROUTE_USED:-}" \
    --route-why "${RB_ROUTE_WHY}" "${flags[@]}" || rc=$?
  rb::plan_end "${rc}" "${markdown}"
}

#######################################
# The hosts a plan reaches first (single-host and fan-out): each prepared as a run prepares it,
# every one that cannot be reached named at once (rb::fail, nothing planned); RB_PLAN_UP: the
# others, for the screen. A host whose ssh files are refused ends the plan there, as it ends a
# run (rb::ssh_files_ready): nothing is planned, and ssh is never run for it.
#######################################
rb::plan_hosts() {
  local host down=''
  RB_PLAN_UP=''
  rb::hosts_prepare --all "${RB_HOSTS[@]}"
  for host in "${RB_HOSTS[@]}"; do
    if [[ -n "${RB_KIT_DIR[${host}]:-}" ]]; then
      RB_PLAN_UP+="${RB_PLAN_UP:+, }${host}"
    else
      down+="${down:+, }${host}"
    fi
  done
  if [[ -n "${down}" ]]; then
    RB_HOST=${down}
    rb::fail "cannot reach ${down} (each said why above); nothing was planned"
  fi
}

# The source's figures as rb::source_finish left them in RB_J: the start of RB_PLAN_ARGS.
rb::plan_source() {
  RB_PLAN_ARGS=(--source-files "${RB_J[files]:-0}" --source-bytes "${RB_J[bytes]:-0}"
    --need-bytes "${RB_J[need_bytes]:-0}" --audit-rc "${RB_J[audit_rc]:-2}"
    --audit-failed "${RB_J[audit_failed]:-}" --audit-skipped "${RB_J[audit_skipped]:-}"
    --library-missing "${RB_J[library_missing]:-}")
}

# The rest of what both composes take (rbkit liveplan, rbkit.fanplan); $1 = 1: --markdown.
rb::plan_args() {
  RB_PLAN_ARGS+=(--dir "${RB_RUN_DIR}" --name "${RB_NAME}" --spec-sha "${RB_SPEC_SHA256}"
    --kit-sha "${RB_KIT_SHA256}" --made "$(TZ=UTC0 printf '%(%Y-%m-%dT%H:%M:%SZ)T' -1)"
    --src-host "${RB_SRC_HOST}" --src-path "${RB_SRC_ABS}" --dst-host "${RB_DST_HOST}"
    --compression "${RB_COMPRESSION_USED}" --compression-why "${RB_COMPRESSION_WHY}"
    --hosts "${RB_PLAN_UP}: reachable (kit in a private directory, removed after)"
    --choices "${RB_ENGINE_CHOICES}" --arch "${RB_AUDIT_ARCH}" --checks "${RB_PROBE_CONFIG:-}"
    --runbook "${RB_SELF}")
  ((RB_INCREMENTAL)) && RB_PLAN_ARGS+=(--incremental)
  ((RB_FORCE)) && RB_PLAN_ARGS+=(--force)
  (($1)) && RB_PLAN_ARGS+=(--markdown)
  return 0
}

# The plan's last line (where it is, how to apply it), and the end: exit $1 (compose's status).
rb::plan_end() {
  local also=''
  (($2)) && also=', plan.md'
  rb::close_wait
  printf '\nplan: %s/plan.json%s; to run exactly it: bash %s --apply %s/plan.json\n' \
    "${RB_RUN_DIR}" "${also}" "${RB_SELF}" "${RB_RUN_DIR}"
  RB_FINISHED=1
  exit "$1"
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
    RB_APPLY_REFUSED=1
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
  # the tool of a measured word (zstd-3-T2: zstd)
  if [[ ",${RB_HOST_COMP[${RB_SRC_HOST}]:-}," == *",${want%%-*},"* &&
    ",${RB_HOST_COMP[${RB_DST_HOST}]:-}," == *",${want%%-*},"* ]]; then
    rb::log "compression: ${want}, as the plan chose (preflight chose ${RB_COMPRESSION_USED} now)"
    RB_COMPRESSION_USED=${want}
    RB_RELAY_STREAMS=0 # the model's streams were for its own choice
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
  # the witness first: a SIGINT it sends while `trap ''` changes INT's handler aborts bash 5.2
  # (`trap_handler: bad signal 2`, then SIGABRT)
  if ((BASHPID == $$)); then
    rb::witness_stop
  fi
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
  if ((RB_INT_UNTRAPPED)); then
    rb::log "a SIGINT reached this run's processes but not this shell: it was started with SIGINT" \
      "ignored (nohup, cron, a script's background job, some CI runners), and bash cannot trap a" \
      "signal ignored on entry; the stream's ssh clients died of it (not the receiving end's" \
      "doing). To stop a run started so, send SIGTERM to its group (kill -TERM -- -PGID)"
  fi
  rb::log "interrupted ${where} (SIG$1); the destination was not replaced unless the swap step" \
    "had finished"
  if [[ -n "${RB_STEP}" ]]; then
    rb::now
    if ((RB_STEP_START == 0)); then
      RB_STEP_START=${RB_NOW}
    fi
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
# The witness of SIGINT, a background job of this shell's (rb::init starts it, rb::on_signal and
# rb::cleanup stop it). Bash can lose a SIGINT sent to the run's process group: one that lands as
# a foreground child (a command substitution's too) is being reaped, after wait_for checked for it
# and before it put the trap's handler back (bash 5.2, jobs.c; seen under load: 2 in 40 in a loop
# of `x=$(f)`; TERM and HUP are not lost there). The run then went on with its ssh clients dead of
# the signal. The witness waits in `read` (a builtin: its trap runs at once), records the signal in
# RB_WORK/signal (rb::on_err: a failure after it is the interruption) and sends it again to this
# shell and what it runs, every 0.5 s until this shell acts on it (a second Ctrl-C, as it were).
#######################################
rb::witness_start() {
  local fifo="${RB_WORK}/witness"
  mkfifo -m 600 "${fifo}"
  rb::witness "${fifo}" &
  RB_WITNESS_PID=$!
  # not a job of this shell's: its end (rb::witness_stop's SIGKILL) is no `Killed` line on the
  # terminal, which reads like a crash (issue 45)
  disown "${RB_WITNESS_PID}"
  if rb::int_ignored; then
    # started with SIGINT ignored (nohup, cron, a script's background job): neither this shell
    # nor the witness can trap it, but a multiplexed ssh client still dies of it. A process of
    # the run's group with SIGINT at its default dies of it too: its death says a SIGINT came
    # (rb::witness_saw). It ignores TERM and HUP, which this shell traps.
    "${RB_LOCAL_PY}" "${RB_PY_FLAGS[@]}" -c 'import signal
signal.signal(signal.SIGINT, signal.SIG_DFL)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
while True:
    signal.pause()' </dev/null >/dev/null 2>&1 &
    RB_INT_SENTINEL=$!
    disown "${RB_INT_SENTINEL}"
  fi
}

# A SIGINT this shell could not trap came (its sentinel died): handled as the signal itself.
rb::int_came() {
  if rb::int_sentinel_gone; then
    RB_INT_UNTRAPPED=1
    rb::on_signal INT
  fi
}

# Whether this shell was started with SIGINT ignored (its SigIgn mask, bit 2).
rb::int_ignored() {
  local key value=0
  while read -r key value; do
    if [[ "${key}" == SigIgn: ]]; then
      ((16#${value: -1} & 2)) && return 0
      return 1
    fi
  done </proc/$$/status 2>/dev/null || true
  return 1
}

# Whether the SIGINT sentinel (rb::witness_start) died: a SIGINT came this shell cannot trap.
rb::int_sentinel_gone() {
  local line
  [[ -n "${RB_INT_SENTINEL}" ]] || return 1
  [[ -r "/proc/${RB_INT_SENTINEL}/status" ]] || return 0
  while read -r line; do
    if [[ "${line}" == State:* ]]; then
      [[ "${line}" == *Z* ]] && return 0
      return 1
    fi
  done <"/proc/${RB_INT_SENTINEL}/status" || true
  return 1
}

rb::witness() {
  trap - ERR
  exec {RB_WITNESS_FD}<>"$1"
  trap rb::witnessed INT
  while :; do
    read -r -u "${RB_WITNESS_FD}" _ || true
  done
}

# A SIGINT came: this shell and what it runs get it again 0.5 s later, and every 0.5 s, until
# this shell acts on it (its trap stops the witness first) or is gone. Not at once: the group's
# signal has just reached them, and a second one while a trap changes INT's handler aborts bash.
rb::witnessed() {
  trap '' INT
  printf 'INT\n' >"${RB_WORK}/signal"
  while read -r -t 0.5 -u "${RB_WITNESS_FD}" _ || true; kill -0 "$$" 2>/dev/null; do
    RB_TREE=()
    rb::tree_pids "$$"
    kill -s INT "${RB_TREE[@]}" 2>/dev/null || true
  done
  exit 0
}

# (not waited for: in an EXIT trap after a TERM, bash 5.2 can wait for it forever, reaped unseen)
rb::witness_stop() {
  if [[ -n "${RB_WITNESS_PID}" ]]; then
    kill -KILL "${RB_WITNESS_PID}" 2>/dev/null || true
    RB_WITNESS_PID=''
  fi
  if [[ -n "${RB_INT_SENTINEL}" ]]; then
    kill -KILL "${RB_INT_SENTINEL}" 2>/dev/null || true
    RB_INT_SENTINEL=''
  fi
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

#######################################
# A plan lets its hosts go once it has fetched their records: rb::close_hosts in the background
# (RB_CLOSING: its pid), its log kept aside (RB_WORK/closing.log). rb::close_wait (rb::plan_end
# after the compose, or rb::cleanup) waits for it and says that log; one a signal ended before
# it was through is done again here.
#######################################
rb::close_start() {
  local log=${RB_WORK}/closing.log
  # RB_WORK empty: it does not record itself as the command that ran last
  RB_WORK='' rb::close_hosts 2>"${log}" &
  RB_CLOSING=$!
}

rb::close_wait() {
  local rc=0
  if [[ -n "${RB_CLOSING}" && "${RB_CLOSING}" != waited ]]; then
    wait "${RB_CLOSING}" || rc=$?
    cat "${RB_WORK}/closing.log" >&2
    RB_CLOSING=waited
    if ((rc > 128)); then
      rb::close_hosts
    fi
  fi
}

rb::close_master() {
  "rb::host_$1"
  # a config file not accepted (refused, or never judged) is never given to ssh, even to close:
  # ssh reads it for -O exit too (Match exec); a host without one may have an early connection
  # open before it was judged (rb::connect_early)
  if [[ -n "${RB_HOST_TARGET}" ]] && { [[ -n "${RB_SSH_READY[$1]:-}" ]] ||
    [[ " ${RB_HOST_SSH[*]} " != *" -F "* ]]; }; then
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
  local rc=$1 why port host=${RB_HOST:-} name said words=''
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
      rb::host_keys_cause "${host}"
      words=${RB_KEY_WORDS}
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
  rb::library_args      # the exports step's dirs: said when the source lacks one (RB_LIB_ARGS)
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
    "${RB_LIB_ARGS[@]}" --audit "${audit[@]}" \
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
  rb::measure_scanned
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
    --holder "${RB_HOLDER}")
  if [[ -n "${RB_ENGINE_PID}" ]]; then
    return 0
  fi
  args+=(--lock-wait "${RB_LOCK_WAIT}")   # set once in state, checked by rb::run_dirs
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
  RB_J=()
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
  if [[ -n "${RB_J[install_stays]:-}" ]]; then
    # a step failed past the swap and its install stays (nothing to put back, or
    # on_failed_checks: keep): rb::finish's last lines say so, and how to go back
    RB_STAYS=${RB_J[install_stays]}
    RB_STAYS_WHY=${RB_J[stays_why]:-}
    RB_STAYS_PREVIOUS=${RB_J[previous]:-none}
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
    trap 'late=INT; rb::witness_stop; trap "" INT TERM HUP' INT
    trap 'late=TERM; rb::witness_stop; trap "" INT TERM HUP' TERM
    trap 'late=HUP; rb::witness_stop; trap "" INT TERM HUP' HUP
    rb::engine_stop
  fi
  rb::hosts_let_go
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
  elif ((RB_APPLY_REFUSED)); then
    # nothing was written: going on --from a step would run what no plan showed
    rb::log "${outcome}: the plan no longer holds (above): make a new one, read it, and apply" \
      "that: bash ${RB_SELF} --plan"
  elif ((RB_ROLLED_BACK)); then
    # --from probe would check the install put back, not this spec's
    rb::log "${outcome}: rolled back (above); after fixing it, run every step again: bash ${RB_SELF}"
  elif [[ "${RB_FAILED_STEP}" == restore && "${outcome}" != ok ]]; then
    # not a step of a run: no --from goes on from it
    rb::log "${outcome}: see above; what there is to put back: bash ${RB_SELF} --list-backups"
  elif [[ -n "${RB_GO_ON}" && "${outcome}" != ok ]]; then
    # the failed step named the one command that goes on (a full disk: a plain run resumes)
    rb::log "${outcome}: see the step named above; after fixing it, go on with: ${RB_GO_ON}"
  elif [[ "${outcome}" != ok ]]; then
    rb::log "${outcome}: see the step named above; re-run with --from ${from:-${RB_STEPS[0]}}" \
      "after fixing it (relocate, prove and swap install only a staging this run verified: they" \
      "go on from verify)"
  fi
  if [[ -z "${RB_STAYS}" && -n "${RB_SWAPPED}" && "${RB_FAILED_STEP}" == probe && \
    "${RB_ENGINE_CHOICES}" == *'"on_failed_checks":"keep"'* ]]; then
    RB_STAYS=${RB_DST_ABS} RB_STAYS_WHY="its checks failed; on_failed_checks: keep"
    RB_STAYS_PREVIOUS=${RB_SWAPPED}
  fi
  if [[ -n "${RB_STAYS}" && "${outcome}" != ok ]]; then
    rb::stays_said
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
  rb::py_argv "${RB_LOCAL_PY}" "${RB_LOCAL_KIT}" rbview
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
# Let the hosts go before the summary (their kits removed, their connections closed:
# rb::close_hosts, which rb::cleanup then need not run), so that what a host that stopped
# answering keeps is named with the run's end, not after its report lines (issue 45), and
# recorded for report.json (notes: left_on_HOST): this run's kit there and, on the destination,
# the engine's private state (removed by the engine unless it was cut off too).
#######################################
rb::hosts_let_go() {
  local log=${RB_WORK}/closing.log line host path n=0
  if [[ -n "${RB_CLOSING}" ]]; then
    return 0                   # a plan's, let go already
  fi
  RB_CLOSING=waited
  rb::close_hosts 2>"${log}" || true
  while IFS= read -r line || [[ -n "${line}" ]]; do
    printf '%s\n' "${line}" >&2
    if [[ "${line}" =~ \]\ left\ on\ ([^:]+):\ (/[^ ]+)\  ]]; then
      host=${BASH_REMATCH[1]} path=${BASH_REMATCH[2]}
      n=$((n + 1))
      if [[ "${host}" == "${RB_DST_HOST}" && -n "${RB_ENGINE_STATE:-}" ]]; then
        rb::log "left on ${host}: ${RB_ENGINE_STATE} (the engine's private state, unless its" \
          "engine removed it as it stopped): remove it there"
        path+=" ${RB_ENGINE_STATE}"
      fi
      rb::event fact main "left_on_${host}" "${path}"
    fi
  done <"${log}"
  return 0
}

#######################################
# The last lines of a run whose failed step left its new install in place (RB_STAYS): that it
# stays, unproven, and how to go back (issue 45: only report.json said so).
#######################################
rb::stays_said() {
  rb::log "the new install stays at ${RB_STAYS}, unproven (${RB_STAYS_WHY})"
  if [[ "${RB_STAYS_PREVIOUS}" == none || "${RB_STAYS_PREVIOUS}" == removed ]]; then
    rb::log "to go back to nothing there: rm -rf -- ${RB_STAYS@Q} (and its env file); a run" \
      "installs it again: bash ${RB_SELF}"
  elif [[ "${RB_STAYS_PREVIOUS}" == transient ]]; then
    rb::log "the install it replaced is removed (on_existing: replace): nothing to go back to"
  else
    rb::log "to put the install it replaced back: bash ${RB_SELF} --restore (--list-backups" \
      "shows what there is)"
  fi
}

#######################################
# The destination's side of preflight (rbkit engine preflight: never into the source, its state,
# room for the staging; what a staging there holds already is counted): $1 the room the tree
# needs, $2 the source's identity. Too little room: rb::no_room_hint says what to do, and names
# the one command that drops a kept staging where there is one (it gives its room back, though a
# run that resumes it needs less).
#######################################
rb::engine_preflight() {
  # (source: what a staging kept from a cut stream must be for, to be counted as staged)
  rb::engine_call preflight "need=$1" "source_identity=$2" \
    "source=${RB_SRC_STAT} ${RB_SRC_HOST}:${RB_SRC_ABS}"
  if [[ "${RB_ENGINE_STATUS}" == failed ]]; then
    if [[ -n "${RB_J[short_bytes]:-}" ]]; then
      rb::no_room_hint
    fi
    rb::fail "${RB_ENGINE_DETAIL}"
  fi
}

rb::no_room_hint() {
  local short staged
  rb::human short "${RB_J[short_bytes]}"
  RB_FAIL_HINT="free at least ${short} there, then run again: bash ${RB_SELF}"
  if ((${RB_J[staged_bytes]:-0} > 0)); then
    rb::human staged "${RB_J[staged_bytes]}"
    RB_FAIL_HINT+="; the ${staged} staged there are counted"
    if [[ "${RB_J[resumable]:-0}" == 1 ]]; then
      RB_FAIL_HINT+=" (a run resumes them: only the rest is sent)"
    fi
    RB_FAIL_HINT+=". To give the move up and that room back: bash ${RB_SELF} --discard-staging"
  fi
}

#######################################
# The library dirs the exports step puts first (cuda.library_path_first): a source without one
# (after the excludes) is refused here, before anything moves, not by the exports step after the
# swap (issue 45). RB_J: the source's answer (rb::source_finish).
#######################################
rb::library_args() {
  local lib
  RB_LIB_ARGS=()
  for lib in "${RB_LIBRARY_DIRS[@]}"; do
    RB_LIB_ARGS+=(--library-dir "${lib}")
  done
}

rb::library_dirs_check() {
  if [[ -z "${RB_J[library_missing]:-}" ]]; then
    return 0
  fi
  RB_HOST=${RB_SRC_HOST}
  RB_FAIL_HINT="fix cuda.library_path_first in the spec (dirs under ${RB_J[site_packages]:-site-packages}"
  RB_FAIL_HINT+=" of the venv; [] for none), compile again, then run"
  rb::fail "the exports step would refuse this source: it has no ${RB_J[library_missing]//,/, }" \
    "under ${RB_J[site_packages]:-its site-packages} (cuda.library_path_first); nothing was moved"
}

#######################################
# A step of the staging's (verify, relocate, prove, swap: $1) through the engine. With no staging
# there (a --from or --only on a finished install, or before anything was staged), the way on is
# named instead of the same --from again (issue 45: `--from verify` answered `re-run with --from
# verify`).
#######################################
rb::staged_step() {
  local go="bash ${RB_SELF}"
  rb::engine_call "$1"
  if [[ "${RB_ENGINE_STATUS}" != failed ]]; then
    if [[ "$1" == swap ]]; then
      # what the swap replaced, and where it went: what a later failure that keeps the new
      # install (on_failed_checks: keep) goes back to (rb::stays_said)
      RB_SWAPPED="${RB_J[backup]:+backup}"
      if [[ -z "${RB_SWAPPED}" ]]; then
        case "${RB_J[previous]:-none}" in
          none | removed) RB_SWAPPED=none ;;
          *) RB_SWAPPED=transient ;;
        esac
      fi
    fi
    return 0
  fi
  if [[ "${RB_J[no_staging]:-0}" == 1 ]]; then
    RB_GO_ON=${go}
    if ((${RB_DST_INSTALLED:-0})); then
      RB_FAIL_HINT="nothing is staged and the destination holds an install: ${go} checks it"
      RB_FAIL_HINT+=" against the source and sends only what changed (nothing, when it is"
      RB_FAIL_HINT+=" current); ${go} --only probe runs the checks on it"
    else
      RB_FAIL_HINT="nothing is staged: run every step, ${go}"
    fi
    rb::fail "nothing to $1 (--from and --only go on from a staging a run made): ${RB_ENGINE_DETAIL}"
  fi
  rb::fail "${RB_ENGINE_DETAIL}"
}

#######################################
# --discard-staging: remove what a cut or failed stream kept beside the destination for a re-run
# to resume (the staging and its mark), under the destination's lock, giving its room back; the
# destination is never touched. The way to give a move up when its disk cannot take the rest.
#######################################
rb::discard_staging() {
  RB_STEP=discard
  rb::now
  RB_STEP_START=${RB_NOW}
  if [[ -n "${RB_FAN_ENGINE:-}" ]]; then
    rb::log "--discard-staging is for one destination; a fan-out's nodes remove their stagings" \
      "on the next run"
    RB_FINISHED=1
    exit 2
  fi
  rb::kit_ship "${RB_DST_HOST}"
  rb::engine_start
  rb::engine discard
  rb::log "${RB_ENGINE_DETAIL} (${RB_DST_HOST})"
  rb::engine_stop
  RB_FINISHED=1
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
    --special-modes "${RB_SPECIAL_MODES}" --scanned "${src_kit}/${RB_NAME}.names.stat" \
    --beside-stream >"${out}.part"
  mv -f -- "${out}.part" "${out}"
  rb::manifest_share -
}

#######################################
# The stream failed and its receiving end's answer says so (RB_J, RB_ENGINE_DETAIL), or it said
# nothing: the cause in words and the way on. A file system that filled at the destination
# (no_space: where, what is free, what is still to come) and a connection that closed (lost: the
# ssh to a host exited 255) are named as such, not by a tool's exit status (issue 45).
#######################################
rb::stream_failed() {
  local go="bash ${RB_SELF}" more staged where lost
  local -a hosts=()
  RB_HOST=${RB_DST_HOST}
  if [[ "${RB_J[no_space]:-0}" == 1 ]]; then
    rb::human more "${RB_J[need_more]:-0}"
    rb::human staged "${RB_J[staged_bytes]:-0}"
    where=${RB_J[fs_mount]:-${RB_STAGING}}
    RB_FAIL_HINT="free at least ${more} on ${RB_DST_HOST} at ${where}, then re-run: ${go} (it"
    RB_FAIL_HINT+=" resumes: the ${staged} staged are kept and checked, only the rest is sent);"
    RB_FAIL_HINT+=" to give the move up and that room back instead: ${go} --discard-staging"
    RB_GO_ON=${go}
    if [[ "${RB_J[quota]:-0}" == 1 ]]; then
      rb::fail "the disk quota is used up on ${RB_DST_HOST}: ${RB_ENGINE_DETAIL}"
    fi
    rb::fail "no space left on ${RB_DST_HOST}: ${RB_ENGINE_DETAIL}"
  fi
  read -r -a hosts <<<"${RB_J[lost]:-}"
  lost=$(rb::connections_lost "${hosts[@]}") || lost=''
  if [[ -n "${lost}" ]]; then
    RB_HOST=${lost%% *}
    lost=${lost// / and }
    RB_FAIL_HINT="check that ${lost} is up and its sshd runs, then re-run: ${go} (it resumes"
    RB_FAIL_HINT+=" what the staging holds)"
    RB_GO_ON=${go}
    rb::fail "the connection to ${lost} closed (ssh exited 255) during the transfer"
  fi
  rb::fail "the receiving end on ${RB_DST_HOST}: ${RB_ENGINE_DETAIL:-no answer (above)}"
}

#######################################
# Of the hosts whose ssh exited 255 in the stream (the relay's `lost`), those whose connection
# closed (a killed sshd, a cut link): this run's shared connection to it is gone. A far command
# that died of a signal leaves the connection up: not lost (its end is named as it failed).
#######################################
rb::connections_lost() {
  local host out=''
  for host in "$@"; do
    "rb::host_${host}"
    if [[ -n "${RB_HOST_TARGET}" ]] && ! timeout 5 ssh "${RB_HOST_SSH[@]}" "${RB_SSH_COMMON[@]}" \
      -O check -- "${RB_HOST_TARGET}" 2>/dev/null; then
      out+="${out:+ }${host}"
    fi
  done
  printf '%s\n' "${out}"
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
  --discard-staging  remove what a cut or failed stream kept beside the destination (a run
                  resumes it otherwise), giving its room back; the destination is untouched
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
# Paths on the destination are the engine's (the staging, the env file): nothing to set here (a
# fan-out's every node stages beside its own destination).
#######################################
rb::install_paths() {
  :
}

#######################################
# --plan: the live plan of the one destination (runtime/liveplan.sh.j2), or of a fan-out's nodes
# (partials/fanplan.sh.j2); $1 = 1: plan.md too.
#######################################
rb::plan() {
  if [[ -n "${RB_FAN_ENGINE:-}" ]]; then
    rb::fan_plan "$1"
  else
    rb::live_plan "$1"
  fi
}

#######################################
# The kit: Python tools this runbook runs on each host (hostkit/rbkit, rbprobes, rbrules) and here
# (hostkit/rbview, the pictures: never sent to a host), pinned by RB_KIT_SHA256 and read from
# RB_KIT_FILE beside this runbook (compile writes it; `compile --standalone` embeds the kit
# instead: rb::kit_embedded_write). A file whose hash differs is refused.
# Arguments: the directory to write them into.
#######################################
rb::kit_write() {
  if [[ -z "${RB_KIT_FILE}" ]]; then
    rb::kit_embedded_write "$@"     # the kit in the runbook (compile --standalone)
    return
  fi
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
  # the real interpreter behind `python3` (a version-manager shim costs every start); the
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
  # (the witness stopped first: rb::on_signal says why)
  rb::witness_stop
  trap 'rb::cleanup_signal INT' INT
  trap 'rb::cleanup_signal TERM' TERM
  trap 'rb::cleanup_signal HUP' HUP
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
# Parse the command line, then run the chosen steps in order (the runbook's main).
#######################################
rb::main() {
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
    # the live plan (rb::plan: runtime/install.sh.j2, a fan-out's fanplan.sh.j2): every step
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

#######################################
# Step preflight: what it does for a spec is the runbook's RB_STEP_DOC, RB_STEP_PREVIEW.
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
# Step manifest: what it does for a spec is the runbook's RB_STEP_DOC, RB_STEP_PREVIEW.
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
# Step transfer: what it does for a spec is the runbook's RB_STEP_DOC, RB_STEP_PREVIEW.
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
  for k in stream_bytes packed_bytes; do # the tar stream's bytes, what came on the wire packed
    [[ ! "${RB_J[${k}]:-}" =~ ^[0-9]+$ ]] || rb::fact "${k}" "${RB_J[${k}]}"
  done
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
# Step verify: what it does for a spec is the runbook's RB_STEP_DOC, RB_STEP_PREVIEW.
#######################################
step_verify() {
  # every entry of this run's staging; files linked unchanged from the current install by stat.
  # The engine leaves its stamp: relocate, prove and swap install only what this run verified.
  rb::staged_step verify
  RB_STEP_DETAIL=${RB_ENGINE_DETAIL}
}

#######################################
# Step relocate: what it does for a spec is the runbook's RB_STEP_DOC, RB_STEP_PREVIEW.
#######################################
step_relocate() {
  rb::staged_step relocate
  rb::fact rewritten "${RB_J[rewritten]:-0}"
  RB_STEP_DETAIL=${RB_ENGINE_DETAIL}
}

#######################################
# Step prove: what it does for a spec is the runbook's RB_STEP_DOC, RB_STEP_PREVIEW.
#######################################
step_prove() {
  # the staged interpreter must run here before anything is installed (a venv whose base
  # interpreter this host lacks stops here)
  rb::staged_step prove
  RB_STEP_DETAIL=${RB_ENGINE_DETAIL}
}

#######################################
# Step swap: what it does for a spec is the runbook's RB_STEP_DOC, RB_STEP_PREVIEW.
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
# Step exports: what it does for a spec is the runbook's RB_STEP_DOC, RB_STEP_PREVIEW.
#######################################
step_exports() {
  # a failure past this run's swap puts back what was there (the engine)
  rb::engine exports
  RB_STEP_DETAIL=${RB_ENGINE_DETAIL}
}

#######################################
# Step probe: what it does for a spec is the runbook's RB_STEP_DOC, RB_STEP_PREVIEW.
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
