#!/bin/bash
# Device run of enginesim.calibrate (issue 16 item 3): the full calibration with the default step model
# (Qwen3-0.6B), then whole steps of Llama-3.1-8B. Each bounded by its own timeout.
set -u
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw,power.limit --format=csv
python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
t0=$(date +%s)
timeout 300 python3 -m enginesim.calibrate --out "$OUT/h200"
echo "rc_full=$? seconds=$(( $(date +%s) - t0 ))"
t1=$(date +%s)
timeout 200 python3 -m enginesim.calibrate --sections model --model meta-llama/Llama-3.1-8B-Instruct --out "$OUT/llama8b"
echo "rc_llama8b=$? seconds=$(( $(date +%s) - t1 ))"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
