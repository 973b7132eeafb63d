#!/bin/bash
# Issue 20 item 2: NCCL all-reduce / all-gather at TP message sizes on 2, 4 and 8 GPUs of this host (as
# many as it has), complete per-rank NCCL logs, and host-trimmed copies of those logs to commit as
# parser fixtures. One command, from the repository root of a machine with several GPUs and torch:
#   bash enginesim/calibrate/collectives_run.sh            # results in $OUT (default ./collectives-out)
# Through the workplace device tool: run(kind="nvidia-h200-x8", command="bash enginesim/calibrate/collectives_run.sh")
# ($OUT is then the folder that comes back). NVLink multicast stays off (NCCL_NVLS_ENABLE=0), as those
# machines require; the program sets it for every rank as well.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/collectives-out}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
nvidia-smi topo -m > "$OUT/nvidia-smi-topo.txt" 2>&1
python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda,
torch.cuda.nccl.version(), torch.cuda.device_count(), torch.cuda.get_device_name(0))' | tee "$OUT/versions.txt"
t0=$(date +%s)
timeout 560 python3 -m enginesim.calibrate.collectives --out "$OUT/collectives" --trim-into "$OUT/nccl-trimmed"
echo "rc=$? seconds=$(( $(date +%s) - t0 ))"
# Trimmed copies replace host names (node0, ...) and IPv4 addresses (10.0.0.N); commit them under
# tests/modules/fixtures/nccl_intra/ and the timings under enginesim/data/measured/collectives/.
ls -R "$OUT/nccl-trimmed" | head -40
