#!/usr/bin/env bash
# What each compression makes of the whole tree on the device (issue 47), from the repository
# root, with benchmarks/device/debs carried:
#   bash benchmarks/device/levels.sh
# The device's venv (SRC, /opt/torch/.venv) as one tar stream in /dev/shm, then each word of
# WORDS packing it on the CPUs of one of the three machines (CPUS, 0-3: 4 CPUs, -T4 where zstd):
# its wall time, CPU seconds (user + sys), packed bytes, ratio and rate; beside it the ratio the
# kit's own sample (rbkit.measure.sample_of, MEASURE_SAMPLE bytes spread over the tree) gives
# for the same words on one core. One TSV line a word on stdout and in $OUT/levels.tsv.
set -Eeuo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src=${SRC:-/opt/torch/.venv}
cpus=${CPUS:-0-3}
out=${OUT:-${PWD}/levels-out}
mkdir -p "${out}"
log() { printf '%(%H:%M:%S)T %s\n' -1 "$*" >&2; }
# shellcheck disable=SC2034 # read by common.sh
DEV_TOP=/tmp/rb-levels DEV_HERE=${here} DEV_SRC=${src}
# shellcheck source=benchmarks/device/common.sh
source "${here}/device/common.sh"
dev_tools
dev_tree_tar rb-levels
packed_file=${scratch}/packed
log "tar stream: ${total} bytes ($(nproc) CPUs here; packing on ${cpus})"
WORDS=${WORDS:-"lz4 -1|zstd -1|zstd -2|zstd -3|zstd -4|zstd -5|zstd -6|zstd -7|zstd -1 --long=27|zstd -3 --long=27|zstd -5 --long=27"}
printf 'word\twall_s\tcpu_s\tpacked\tratio\tin_MBps\tcpu_MBps_per_core\tunpack_cpu_s\n' | tee "${out}/levels.tsv"
IFS='|' read -r -a words <<<"${WORDS}"
TIMEFORMAT='%R %U %S'
for word in "${words[@]}"; do
  read -r -a argv <<<"${word}"
  [[ "${argv[0]}" != zstd ]] || argv+=(-T4)
  timing=$( { time taskset -c "${cpus}" "${argv[@]}" -q -c <"${tarball}" >"${packed_file}"; } 2>&1 )
  read -r wall user sys <<<"${timing##*$'\n'}"
  packed=$(stat -c %s "${packed_file}")
  untime=$( { time taskset -c "${cpus}" "${argv[0]}" -q -d -c <"${packed_file}" >/dev/null; } 2>&1 )
  read -r _ uuser usys <<<"${untime##*$'\n'}"
  rm -f -- "${packed_file}"
  awk -v w="${word}" -v wall="${wall}" -v u="${user}" -v s="${sys}" -v p="${packed}" -v t="${total}" \
    -v uu="${uuser}" -v us="${usys}" 'BEGIN { cpu = u + s; printf "%s\t%.2f\t%.2f\t%d\t%.3f\t%.0f\t%.0f\t%.2f\n", w, wall, cpu, p, t / p, t / wall / 1e6, t / cpu / 1e6, uu + us }' |
    tee -a "${out}/levels.tsv"
done
# the kit's sample of the same tree, packed by the same words on one core
"${src}/bin/python" -I - "${here}/../hostkit" "${src}" "${WORDS}" <<'PY' | tee "${out}/sample.tsv"
import subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from rbkit import measure
from rbrules.linkrate import MEASURE_SAMPLE
root, words = sys.argv[2], sys.argv[3].split("|")
for size in (MEASURE_SAMPLE, 4 * MEASURE_SAMPLE):
    data = measure.sample_of(measure.listing(root, [], None), size)
    for word in words:
        argv = word.split() + (["-T1"] if word.startswith("zstd") else []) + ["-q", "-c"]
        start = time.monotonic()
        packed = subprocess.run(argv, input=data, stdout=subprocess.PIPE, check=True).stdout
        took = time.monotonic() - start
        print("sample %d MiB\t%s\t%.3f\t%.0f MB/s" % (len(data) >> 20, word, len(data) / len(packed), len(data) / took / 1e6))
PY
