#!/usr/bin/env bash
# One stream's stages, each alone on one machine's CPUs (issue 47: what bounds one relay stream),
# on the device from the repository root, with benchmarks/device/debs carried:
#   bash benchmarks/device/stages.sh
# The device's venv (SRC, /opt/torch/.venv) as one tar stream and as zstd -3 of it in a private
# directory under /dev/shm; then each stage of the relay's stream as the kit runs it, timed on the
# CPUs of the machine that runs it (SRC_CPUS 0-3, DST_CPUS 4-7): the source's tar (the kit's
# record), tar into each packing; the destination's unpacking, the kit's reader
# (rbkit.tarstream.Digester between two pipes, with the hashing threads the destination's 4 CPUs
# give it, and with none), tar extracting, and the three together. Every stage writes into a pipe
# (GNU tar skips reading what goes to /dev/null). One TSV line a stage on stdout and in
# $OUT/stages.tsv: its wall time, CPU seconds, the tree's MB/s through it; and one core's
# hashlib sha256 rate.
set -Eeuo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src=${SRC:-/opt/torch/.venv}
src_cpus=${SRC_CPUS:-0-3}
dst_cpus=${DST_CPUS:-4-7}
out=${OUT:-${PWD}/stages-out}
mkdir -p "${out}"
log() { printf '%(%H:%M:%S)T %s\n' -1 "$*" >&2; }
# shellcheck disable=SC2034 # read by common.sh
DEV_TOP=/tmp/rb-stages DEV_HERE=${here} DEV_SRC=${src}
# shellcheck source=benchmarks/device/common.sh
source "${here}/device/common.sh"
dev_tools
dev_tree_tar rb-stages -b 256
packed=${scratch}/tree.zst
into=${scratch}/x
zstd -q -3 -T0 -c <"${tarball}" >"${packed}"
log "tree ${total} bytes, zstd -3 $(stat -c %s "${packed}") bytes; $(nproc) CPUs"
log "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-); sha_ni: $(grep -c -m1 -w sha_ni /proc/cpuinfo || true)"
kit=${here}/../hostkit
export src tarball packed into kit
reader() { # the kit's reader between two pipes, with $1 hashing threads
  python3 -I -c 'import sys
sys.path.insert(0, sys.argv[1])
from rbkit.tarstream import Digester
d = Digester("sha256", int(sys.argv[2]))
d.stage(0, 1)
sys.exit(0 if d.ended and d.result() else 1)' "${kit}" "$1"
}
tarx() { rm -rf "${into}"; mkdir "${into}"; tar -x -b 256 -f - -C "${into}"; }
stage_tar() { tar -C "${src%/*}" -b 256 -cf - "${src##*/}" | cat >/dev/null; }
stage_tar_zstd3T3() { tar -C "${src%/*}" -b 256 -cf - "${src##*/}" | zstd -q -3 -T3 | cat >/dev/null; }
stage_tar_zstd3T2() { tar -C "${src%/*}" -b 256 -cf - "${src##*/}" | zstd -q -3 -T2 | cat >/dev/null; }
stage_tar_zstd1T2() { tar -C "${src%/*}" -b 256 -cf - "${src##*/}" | zstd -q -1 -T2 | cat >/dev/null; }
stage_unzstd() { zstd -q -d -c <"${packed}" | cat >/dev/null; }
stage_reader3() { cat "${tarball}" | reader 3 | cat >/dev/null; }
stage_reader0() { cat "${tarball}" | reader 0 | cat >/dev/null; }
stage_tarx() { cat "${tarball}" | tarx; }
stage_receive() { zstd -q -d -c <"${packed}" | reader 3 | tarx; }
stage_receive_none() { cat "${tarball}" | reader 3 | tarx; }
printf 'stage\tcpus\twall_s\tcpu_s\tMBps\n' | tee "${out}/stages.tsv"
TIMEFORMAT='%R %U %S'
for pair in tar:src tar_zstd3T3:src tar_zstd3T2:src tar_zstd1T2:src unzstd:dst reader3:dst \
  reader0:dst tarx:dst receive:dst receive_none:dst; do
  name=${pair%%:*}
  cpus=${src_cpus}
  [[ "${pair#*:}" == src ]] || cpus=${dst_cpus}
  rc=0
  timing=$( { time taskset -c "${cpus}" bash -c "set -o pipefail; $(declare -f reader tarx "stage_${name}"); stage_${name}"; } 2>&1 ) || rc=$?
  read -r wall user sys <<<"${timing##*$'\n'}"
  awk -v n="${name}" -v c="${cpus}" -v w="${wall}" -v u="${user}" -v s="${sys}" -v t="${total}" -v rc="${rc}" \
    'BEGIN { printf "%s%s\t%s\t%.2f\t%.2f\t%.0f\n", n, (rc ? " FAILED" : ""), c, w, u + s, t / w / 1e6 }' |
    tee -a "${out}/stages.tsv"
done
rm -rf "${into}"
taskset -c "${dst_cpus%%-*}" python3 -I -c 'import hashlib, time
data = bytes(range(256)) * (4 << 12)
start, h = time.monotonic(), hashlib.sha256()
for _ in range(256):
    h.update(data)
took = time.monotonic() - start
print("sha256 one core\t%.0f MB/s" % (len(data) * 256 / took / 1e6))' | tee -a "${out}/stages.tsv"
# the tree's files of one content more than once: what sending each content once would save
python3 -I - "${src}" <<'PY' | tee -a "${out}/stages.tsv"
import hashlib, os, sys
by_size = {}
for top, dirs, files in os.walk(sys.argv[1]):
    for name in files:
        path = os.path.join(top, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if os.path.isfile(path) and not os.path.islink(path) and st.st_size >= 4096:
            by_size.setdefault(st.st_size, {}).setdefault((st.st_dev, st.st_ino), path)
seen, dup_bytes, dup_files, total = {}, 0, 0, 0
for size, inodes in by_size.items():
    total += size * len(inodes)
    if len(inodes) < 2:
        continue
    for path in inodes.values():
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        key = (size, h.digest())
        if key in seen:
            dup_bytes += size
            dup_files += 1
        else:
            seen[key] = path
print("duplicates\t%d files, %d bytes of %d (%.1f%%)" % (dup_files, dup_bytes, total, 100.0 * dup_bytes / max(total, 1)))
PY
