#!/usr/bin/env bash
# Run the probes against a real GPU host, from the repo root (not part of pytest).
#   tests/probes/gpu_smoke.sh PYTHON VENV OUTDIR
# Writes OUTDIR/report.json + table.txt (the `run` command over every check type),
# standalone.jsonl (single checks through the CLI), audit_<arch>.json, crosscheck.json
# (fatbin reader vs cuobjdump) and smoke.log. Each phase is bounded by `timeout`.
set -uo pipefail
py=$1
venv=$2
out=$3
mkdir -p "${out}"
export PYTHONUNBUFFERED=1
log="${out}/smoke.log"
exec > >(tee -a "${log}") 2>&1

probe() { timeout "$1" "${py}" -m rbprobes "${@:2}"; }

nvidia-smi -L
cap=$("${py}" -c 'import torch; p = torch.cuda.get_device_properties(0); print("%d.%d" % (p.major, p.minor))')
count=$("${py}" -c 'import torch; print(torch.cuda.device_count())')
arch="sm_${cap/./}"
nvcc_path=$(command -v nvcc || true)
cuda_home=${nvcc_path:+$(dirname "$(dirname "${nvcc_path}")")}
echo "capability ${cap} (${arch}), ${count} device(s), cuda home ${cuda_home:-?}"

config=$(cat <<JSON
{"schema": 1, "host": "gpu-smoke", "venv": "${venv}",
 "gpu": {"model": "gpu", "count": ${count}, "capability": "${cap}", "arch": "${arch}"},
 "cuda": {"version": "13.0", "home": "${cuda_home:-/usr/local/cuda}", "library_dirs": []},
 "checks": [
  {"id": "torch", "type": "torch", "params": {"cuda": "13.0"}, "allow_skip": false},
  {"id": "devices", "type": "devices", "params": {}, "allow_skip": false},
  {"id": "imports", "type": "imports", "params": {"modules": ["torch", "numpy", "triton"]}},
  {"id": "libraries", "type": "libraries", "params": {}, "allow_skip": false},
  {"id": "matmul_bf16", "type": "matmul", "params": {"dtype": "bfloat16", "size": 8192}},
  {"id": "matmul_fp16", "type": "matmul", "params": {"dtype": "float16", "size": 4096}},
  {"id": "matmul_fp32", "type": "matmul", "params": {"dtype": "float32", "size": 8192}},
  {"id": "nccl", "type": "nccl", "params": {}, "allow_skip": false},
  {"id": "snippet", "type": "python",
   "params": {"code": "import torch; assert torch.ones(4, device='cuda').sum().item() == 4"}},
  {"id": "smi", "type": "command", "params": {"run": "nvidia-smi -L", "timeout_s": 60}},
  {"id": "kernel_audit", "type": "kernel_audit", "params": {}, "timeout_s": 100}]}
JSON
)
echo "== run (config with every check type)"
time probe 170 run --config-json "${config}" --report "${out}/report.json" 2> >(tee "${out}/table.txt" >&2)
echo "rc=$?"

echo "== crosscheck vs cuobjdump"
site=$(echo "${venv}"/lib/python3*/site-packages)
cuobjdump=$(command -v cuobjdump || timeout 30 find / -xdev -name cuobjdump -type f 2>/dev/null | head -1)
echo "cuobjdump: ${cuobjdump:-not found}"
timeout 80 "${py}" tests/probes/crosscheck_cuobjdump.py --budget-s 45 --out "${out}/crosscheck.json" \
  ${cuobjdump:+--cuobjdump "${cuobjdump}"} \
  "${site}/torch/lib/libtorch_cuda.so" "${site}/nvidia" "${site}/torch/lib" > /dev/null
echo "crosscheck rc=$?"
"${py}" - "${out}/crosscheck.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("compared", d["files_compared"], "differ", d["differ"], "not compared", len(d["not_compared_budget"]))
for r in d["results"]:
    print("%-6s %8.1f MB %5d entries ours %.2fs cuobjdump %.2fs %s %s" % (
        "same" if r["same"] else "DIFF", r["size_mb"], r["entries"], r["ours_s"], r["cuobjdump_s"],
        r["file"].split("site-packages/")[-1], "" if r["same"] else (r["only_ours"], r["only_cuobjdump"])))
PY

echo "== standalone checks"
for args in "torch" "devices --count ${count} --capability ${cap}" \
            "matmul --dtype bfloat16 --size 4096" "nccl" "libraries --venv ${venv}" \
            "imports torch"; do
  # shellcheck disable=SC2086  # word splitting of args is wanted
  probe 40 ${args} >> "${out}/standalone.jsonl"
  echo "${args}: rc=$?"
done

echo "== kernel_audit for sm_103 (what a B300 would need)"
time probe 45 kernel_audit "${venv}" --arch sm_103 > "${out}/audit_sm_103.json"
echo "rc=$?"
