#!/usr/bin/env bash
# Ground truth for the probes on a GPU host (not pytest). Run it in a folder that holds
# rbprobes/ (the package), fixtures/ (truth_fixtures.py's output), launch_all.py,
# truth_fixtures.py, numeric_faults.py, calibrate_matmul.py, crosscheck_cuobjdump.py:
#   OUT=/tmp/out PY=python3 VENV=/opt/torch/.venv bash truth_run.sh
# Writes into $OUT: log.txt, truth.json (every fixture kernel launched vs kernel_audit),
# matmul.json (margins and planted faults), report.json (`run` over the venv with the new
# checks), audits.json (the venv audited for sm_90/sm_103/sm_120), preflight.json,
# crosscheck.json (fixtures vs cuobjdump). Each phase is bounded by `timeout`.
set -uo pipefail
out=${OUT:?set OUT}
py=${PY:-python3}
venv=${VENV:-/opt/torch/.venv}
mkdir -p "${out}"
export PYTHONPATH="${PWD}" PYTHONUNBUFFERED=1
exec > >(tee -a "${out}/log.txt") 2>&1

phase() { echo "== $1 ($(date +%T))"; }
phase host
nvidia-smi -L
nvidia-smi --query-gpu=driver_version --format=csv,noheader
cat /proc/driver/nvidia/version 2>/dev/null | head -1
"${py}" -c 'import sys; print(sys.version)'
ls -l /lib/x86_64-linux-gnu/libzstd.so.1 /usr/lib/x86_64-linux-gnu/libzstd.so.1 2>&1 | head -2
"${py}" -c 'from rbprobes import decompress, driver; print("zstd decoder:", decompress.zstd_decoder()); print(driver.host_driver())'

phase truth
timeout 100 "${py}" launch_all.py fixtures --out "${out}/truth.json"
echo "truth rc=$?"

phase matmul
timeout 110 "${py}" calibrate_matmul.py --out "${out}/matmul.json"
echo "matmul rc=$?"

phase audits
timeout 60 "${py}" - "${venv}" "${out}/audits.json" <<'PY'
import json, sys, time
from rbprobes import run_check
from rbprobes.result import Context
venv, dest = sys.argv[1], sys.argv[2]
doc = {}
for arch in ("sm_90", "sm_103", "sm_120"):
    t0 = time.monotonic()
    r = run_check({"type": "kernel_audit", "params": {"arch": arch}}, Context(venv=venv))
    v = r["values"]
    doc[arch] = {
        "status": r["status"], "reason": r["reason"], "seconds": round(time.monotonic() - t0, 2),
        "files_scanned": v.get("files_scanned"), "gpu_files": v.get("gpu_files"),
        "driver": v.get("driver"), "zstd_decoder": v.get("zstd_decoder"),
        "failing": [{k: f.get(k) for k in ("path", "package", "verdict", "problems", "units",
                                           "units_without_path", "units_kernel_free")}
                    | {"missing": (f.get("missing") or [])[:3]}
                    for f in v.get("files", []) if f.get("fails")],
        "partial_waived": ["%s (%s of %s units)" % (f["path"].split("site-packages/")[-1],
                                                    f["units_without_path"], f["units"])
                           for f in v.get("files", []) if f.get("waived_by")],
        "arch_specific": ["%s (%s units: %s)" % (f["path"].split("site-packages/")[-1],
                                                 f["units_arch_specific"],
                                                 "+".join(f["arch_specific_archs"]))
                          for f in v.get("files", []) if f.get("units_arch_specific")],
        "jit_ptx_versions": {f["path"].split("site-packages/")[-1]: f.get("jit_ptx_versions")
                             for f in v.get("files", []) if f.get("jit_ptx_versions")},
        "ptx_only": v.get("ptx_only"), "kernel_free": v.get("kernel_free"),
        "unreadable": v.get("unreadable"), "unknown_kinds": v.get("unknown_kinds"),
        "errors": (v.get("errors") or [])[:20]}
    print(arch, r["status"], doc[arch]["seconds"], "s:", r["reason"][:400])
json.dump(doc, open(dest, "w"), indent=1)
PY
echo "audits rc=$?"

phase run
config=$(cat <<JSON
{"schema": 1, "host": "h200", "venv": "${venv}",
 "gpu": {"model": "H200", "count": 1, "capability": "9.0", "arch": "sm_90"},
 "cuda": {"version": "13.0", "home": "/usr/local/cuda", "library_dirs": []},
 "checks": [
  {"id": "kernel_audit", "type": "kernel_audit", "params": {}},
  {"id": "relocation", "type": "relocation", "params": {"old": "/opt/torch-old/.venv"}},
  {"id": "outside", "type": "outside", "params": {}},
  {"id": "torch", "type": "torch", "params": {"cuda": "13.0"}},
  {"id": "devices", "type": "devices", "params": {}},
  {"id": "libraries", "type": "libraries", "params": {}},
  {"id": "matmul_bf16", "type": "matmul", "params": {"dtype": "bfloat16", "size": 8192}},
  {"id": "matmul_fp32", "type": "matmul", "params": {"dtype": "float32", "size": 8192}},
  {"id": "torchrun", "type": "command", "params": {"run": "torchrun --help", "timeout_s": 60}}]}
JSON
)
timeout 100 "${venv}/bin/python" -m rbprobes run --config-json "${config}" --report "${out}/report.json"
echo "run rc=$?"

phase preflight
timeout 60 "${py}" -m rbprobes preflight --venv "${venv}" --arch sm_103 --driver-cuda 13.0 \
  > "${out}/preflight.json"
echo "preflight rc=$?"

phase crosscheck
cuobjdump=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
timeout 60 "${py}" crosscheck_cuobjdump.py ${cuobjdump:+--cuobjdump "${cuobjdump}"} --budget-s 40 \
  --out "${out}/crosscheck.json" fixtures > /dev/null
echo "crosscheck rc=$?"
phase end
