#!/usr/bin/env bash
# What a device call of benchmarks/device_relay.sh or benchmarks/device_three.sh carries, made
# here (this machine: Debian 12, as the debs must be), from the repository root:
#   bash benchmarks/device/fetch_debs.sh
# 1. benchmarks/device/debs/ (git-ignored): the Debian packages of the tools the device lacks
#    (ssh, sshd, lz4, zstd, pv, ip and tc, taskset and unshare) and the libraries they link that
#    a bare image may not have, downloaded with apt-get download (no install; apt-get update
#    first only when apt has no package lists);
# 2. benchmarks/device/relay.sh (git-ignored): the runbook of benchmarks/device/relay.yaml,
#    compiled --standalone by this checkout's compiler (.venv, else python3 -m compiler).
# Then carry both: run's `carry` ["benchmarks/device/debs", "benchmarks/device/relay.sh"].
set -Eeuo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
debs=${repo}/benchmarks/device/debs
# the tools, then what they link (ldd on this machine: openssh's, iproute2's, lz4's, zstd's)
packages=(openssh-client openssh-server openssh-sftp-server lz4 zstd pv iproute2 util-linux
  libnsl2 libtirpc3 libtirpc-common libaudit1 libcap-ng0 libcap2 libcom-err2 libcrypt1
  libgcrypt20 libgpg-error0 libgssapi-krb5-2 libk5crypto3 libkeyutils1 libkrb5-3
  libkrb5support0 liblz4-1 liblzma5 libpam0g libpcre2-8-0 libselinux1 libssl3 libsystemd0
  libwrap0 libzstd1 zlib1g libbpf1 libbsd0 libelf1 libmd0 libmnl0 libxtables12
  libsmartcols1 libudev1 libblkid1 libmount1 libuuid1)
mkdir -p "${debs}"
if ! compgen -G "/var/lib/apt/lists/*_Packages" >/dev/null; then
  apt-get update -qq
fi
rm -f "${debs}"/*.deb
(cd "${debs}" && apt-get download -qq "${packages[@]}")
printf '%s: %d debs, %s\n' "${debs#"${repo}"/}" "$(find "${debs}" -name '*.deb' | wc -l)" \
  "$(du -sh "${debs}" | cut -f1)"
py=${repo}/.venv/bin/python
[[ -x "${py}" ]] || py=python3
(cd "${repo}" && "${py}" -m compiler benchmarks/device/relay.yaml -o benchmarks/device --standalone)
printf 'benchmarks/device/relay.sh: %s lines\n' "$(wc -l <"${repo}/benchmarks/device/relay.sh")"
