# shellcheck shell=bash disable=SC2154  # src, streams: the sourcing script's
# Sourced by benchmarks/device_relay.sh and benchmarks/device_three.sh: the device host's tools
# and two sshd on it (the device has no ssh, sshd, lz4, zstd, pv, ip or tc). Each .deb of
# benchmarks/device/debs (benchmarks/device/fetch_debs.sh fetches them here) is unpacked into one
# prefix (dpkg-deb -x); each tool missing from PATH gets a wrapper there (its libraries from the
# prefix, only for it); FORCE_PREFIX=1 takes the prefix's even where the machine has its own
# (to test the device's path elsewhere). The two sshd listen on 127.0.0.2:2222 (host a, the
# source) and 127.0.0.3:2222 (host b, the destination), each with its own config, host key and
# log, optionally pinned to a CPU set with taskset (its sessions inherit it). Needs: DEV_TOP (a
# scratch directory, removed first), DEV_HERE (this script's folder, benchmarks/), DEV_SRC (the
# source venv: its python, where the machine has no python3 >= 3.9), log (a function). Then the
# payload (dev_payload: the destination's parent on a tmpfs, the source's tar stream counted and
# its files in the page cache) and the hand rows both harnesses time (row_*: the null relays,
# the seed's one-liner, the hand pipelines), which read src, hand, bytes and streams.

dev_prefix=${DEV_TOP}/prefix
dev_bin=${DEV_TOP}/bin
dev_libs=${dev_prefix}/lib/x86_64-linux-gnu:${dev_prefix}/usr/lib/x86_64-linux-gnu
# tool name, its path in the prefix
DEV_TOOLS=(ssh:usr/bin/ssh ssh-keygen:usr/bin/ssh-keygen sshd:usr/sbin/sshd lz4:usr/bin/lz4
  zstd:usr/bin/zstd pv:usr/bin/pv ip:bin/ip tc:sbin/tc taskset:usr/bin/taskset
  unshare:usr/bin/unshare)

# The prefix and the wrappers; PATH gains DEV_TOP/bin first.
dev_tools() {
  local deb pair tool have
  rm -rf "${DEV_TOP}"
  mkdir -p "${dev_prefix}" "${dev_bin}" "${DEV_TOP}/a" "${DEV_TOP}/b"
  chmod 755 "${DEV_TOP}"
  if compgen -G "${DEV_HERE}/device/debs/*.deb" >/dev/null; then
    for deb in "${DEV_HERE}"/device/debs/*.deb; do dpkg-deb -x "${deb}" "${dev_prefix}"; done
  fi
  for pair in "${DEV_TOOLS[@]}"; do
    tool=${pair%%:*}
    have=$(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin command -v "${tool}" || true)
    if [[ -n "${have}" && "${FORCE_PREFIX:-0}" != 1 ]]; then
      ln -s "${have}" "${dev_bin}/${tool}"
    elif [[ -x "${dev_prefix}/${pair#*:}" ]]; then
      printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "${dev_libs}" "${dev_prefix}/${pair#*:}" \
        >"${dev_bin}/${tool}"
      chmod 755 "${dev_bin}/${tool}"
      log "${tool}: from the prefix (${dev_prefix}/${pair#*:})"
    else
      log "${tool}: neither on this machine nor in ${DEV_HERE}/device/debs"
    fi
  done
  # the hosts' python3 (>= 3.9): the system's, else the venv's own interpreter
  if ! PATH=/usr/local/bin:/usr/bin:/bin python3 -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
    ln -s "$(readlink -f "${DEV_SRC}/bin/python")" "${dev_bin}/python3"
    log "python3: $(readlink -f "${DEV_SRC}/bin/python")"
  fi
  export PATH=${dev_bin}:${PATH}
  ssh -V 2>/dev/null || { log "ssh does not start: $(ssh -V 2>&1 | tail -n 1)"; return 1; }
  log "ssh: $(ssh -V 2>&1); lz4: $(command -v lz4 || echo none); zstd: $(command -v zstd || echo none)"
}

# sshd's privilege separation user, the client's key and an empty known_hosts file.
dev_keys() {
  id sshd >/dev/null 2>&1 || useradd -r -M -d /run/sshd -s /usr/sbin/nologin sshd ||
    echo 'sshd:x:64999:65534::/run/sshd:/usr/sbin/nologin' >>/etc/passwd
  mkdir -p /run/sshd
  chmod 755 /run/sshd
  ssh-keygen -q -t ed25519 -N '' -f "${DEV_TOP}/id"
  cp "${DEV_TOP}/id.pub" "${DEV_TOP}/authorized_keys"
  : >"${DEV_TOP}/known_hosts"
  DEV_SSHOPT=(-i "${DEV_TOP}/id" -p 2222 -o BatchMode=yes -o UserKnownHostsFile="${DEV_TOP}/known_hosts"
    -o GlobalKnownHostsFile=/dev/null -o ControlPath=none -o ControlMaster=no)
}

# dev_sshd HOST ADDR [CPUS]: host HOST's sshd on ADDR:2222 (pinned to CPUS with taskset), and it
# answers (with lz4, tar and python3 on its PATH).
dev_sshd() {
  local h=$1 addr=$2 cpus=${3:-}
  local -a run=()
  if [[ -L "${dev_bin}/sshd" ]]; then
    run=("$(readlink -f "${dev_bin}/sshd")")
  else     # sshd re-execs itself by its absolute path: the prefix's, with the prefix's libraries
    run=(env "LD_LIBRARY_PATH=${dev_libs}" "${dev_prefix}/usr/sbin/sshd")
  fi
  [[ -z "${cpus}" ]] || run=(taskset -c "${cpus}" "${run[@]}")
  ssh-keygen -q -t ed25519 -N '' -f "${DEV_TOP}/${h}/host_key"
  printf '[%s]:2222 %s\n' "${addr}" "$(cut -d' ' -f1,2 "${DEV_TOP}/${h}/host_key.pub")" >>"${DEV_TOP}/known_hosts"
  cat >"${DEV_TOP}/${h}/sshd_config" <<EOF
ListenAddress ${addr}
Port 2222
HostKey ${DEV_TOP}/${h}/host_key
PidFile ${DEV_TOP}/${h}/sshd.pid
PermitRootLogin prohibit-password
PubkeyAuthentication yes
AuthorizedKeysFile ${DEV_TOP}/authorized_keys
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
MaxStartups 100:30:200
MaxSessions 100
SetEnv PATH=${dev_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
EOF
  "${run[@]}" -f "${DEV_TOP}/${h}/sshd_config" -E "${DEV_TOP}/${h}/sshd.log"
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    ssh "${DEV_SSHOPT[@]}" "root@${addr}" true 2>"${DEV_TOP}/probe.err" && break
    sleep 0.3
  done
  ssh "${DEV_SSHOPT[@]}" "root@${addr}" 'command -v lz4 tar python3' >&2 || {
    log "ssh root@${addr}:2222 fails: $(tail -n 3 "${DEV_TOP}/probe.err")"; cat "${DEV_TOP}/${h}/sshd.log" >&2; return 1; }
}

# Stop both sshd (their pid files); their logs into $1.
dev_stop() {
  local h pid
  for h in a b; do
    if [[ -s "${DEV_TOP}/${h}/sshd.pid" ]]; then
      read -r pid <"${DEV_TOP}/${h}/sshd.pid" || true
      [[ -n "${pid}" ]] && kill "${pid}" 2>/dev/null || true
      rm -f "${DEV_TOP}/${h}/sshd.pid"
    fi
    cp -f "${DEV_TOP}/${h}/sshd.log" "$1/sshd-${h}.log" 2>/dev/null || true
  done
}

# The destination's ($1) parent on a tmpfs (TMPFS=0: as it is), `hand` beside it for the hand
# rows, and `bytes`: the source's tar stream (DEV_EXCLUDE=1: without __pycache__ and *.pyc), which
# also reads every file into the page cache.
dev_payload() {
  local dst_root t
  local -a ex=()
  [[ -z "${DEV_EXCLUDE:-}" ]] || ex=(--exclude=__pycache__ '--exclude=*.pyc')
  dst_root=$(dirname "$1")
  if [[ "${TMPFS:-1}" == 1 ]] && ! mountpoint -q "${dst_root}"; then
    mkdir -p "${dst_root}"
    # mode 0755: a tmpfs's root is 1777 by default, a parent the runbook refuses (issue 44 R1)
    mount -t tmpfs -o size=48g,mode=0755 tmpfs "${dst_root}" || log "no tmpfs at ${dst_root}: on its disk"
  fi
  mkdir -p "${dst_root}"
  hand=${dst_root}/hand
  t=${SECONDS}
  bytes=$(tar -C "${DEV_SRC}" "${ex[@]}" -cf - . | wc -c)
  log "payload: ${DEV_SRC}, tar stream ${bytes} bytes (read in $((SECONDS - t)) s); nproc $(nproc)"
}

# dev_tree_tar NAME [TAR OPTION]...: the source's tree (DEV_SRC) as one tar stream in a private
# scratch directory (mktemp -d under /dev/shm, 0700: no fixed name another user could plant
# first), removed at exit (its EXIT trap replaces the caller's: for scripts without one); sets
# `scratch`, `tarball` and `total` (its bytes).
dev_tree_tar() {
  local name=$1
  shift
  scratch=$(mktemp -d "/dev/shm/${name}.XXXXXX")
  # shellcheck disable=SC2064 # the directory made now
  trap "rm -rf '${scratch}'" EXIT
  tarball=${scratch}/tree.tar
  tar -C "${DEV_SRC%/*}" "$@" -cf "${tarball}" "${DEV_SRC##*/}"
  # shellcheck disable=SC2034 # read by the sourcing script
  total=$(stat -c %s "${tarball}")
}

AES=aes128-gcm@openssh.com
# on HOST CIPHER COMMAND: a fresh connection (no master), CIPHER '' for ssh's default
on() {
  local host=$1 cipher=$2
  shift 2
  ssh "${DEV_SSHOPT[@]}" ${cipher:+-c "${cipher}"} "root@${host}" "$@"
}
wide() { python3 -S -c 'import fcntl; fcntl.fcntl(1, 1031, 1 << 20)' 2>/dev/null || true; }

row_null1() { { wide; on 127.0.0.2 "${AES}" "head -c ${bytes} /dev/zero"; } | on 127.0.0.3 "${AES}" 'cat >/dev/null'; }
row_nullN() {
  local part=$(((bytes + streams - 1) / streams)) i
  for ((i = 0; i < streams; i++)); do
    { { wide; on 127.0.0.2 "${AES}" "head -c ${part} /dev/zero"; } | on 127.0.0.3 "${AES}" 'cat >/dev/null'; } &
  done
  wait
}
row_seed() { on 127.0.0.2 '' "tar cf - -C '${src}' ." | on 127.0.0.3 '' "tar xf - -C '${hand}'"; }
row_lz4() {
  on 127.0.0.2 "${AES}" "tar cf - -C '${src}' . | lz4 -q -1 -c" |
    on 127.0.0.3 "${AES}" "lz4 -q -d -c | tar xf - -C '${hand}'"
}
# zstd -1 with ZSTD_T threads (4: the source's CPUs of the three-machine harness)
row_zstd() {
  on 127.0.0.2 "${AES}" "tar cf - -C '${src}' . | zstd -q -1 -T${ZSTD_T:-4} -c" |
    on 127.0.0.3 "${AES}" "zstd -q -d -c | tar xf - -C '${hand}'"
}
prep() { rm -rf "${hand}"; mkdir -p "${hand}"; sync; }
