#!/usr/bin/env bash
# The prepared check for a lent GPU machine (issue "Truth"): one script, one call of the device
# tool, results under $OUT.  Run from the repository root on the GPU machine:
#   bash scripts/device_check.sh            (OUT defaults to ./device-out)
# 1. GEMM sweep: every GEMM shape the cost model prices for OPT-350M and Llama-3-8B blocks,
#    timed with CUDA events, beside gemm.py's prediction (planner/profile/gemm_sweep.py).
# 2. planner profile: embedding / block / head of OPT-350M at micro-batch 1-8, tp 1 (bf16),
#    then --calibrate to fit this GPU's own curve to it.
# 3. One plan on this one GPU (scripts/device-h200-1gpu.yaml), trained with the reference runner
#    on nccl for a few steps: measured step time against the plan's prediction.
# Each step writes its own files and a line to $OUT/summary.txt; a failing step does not stop
# the next one.
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
PY=${PY:-.venv/bin/python}
PLANNER=${PLANNER:-.venv/bin/planner}
GPU=${GPU_TYPE:-H200-SXM-141GB}
log() { echo "$*" | tee -a "$OUT/summary.txt"; }

if [ ! -x "$PY" ]; then
  python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev,torch]' > "$OUT/install.log" 2>&1
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
"$PY" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())" \
  > "$OUT/torch.txt" 2>&1
log "torch: $(cat "$OUT/torch.txt")"

for dtype in bf16 tf32; do
  for model in opt-350m llama3-8b; do
    timeout 240 "$PY" -m planner.profile.gemm_sweep --model "$model" --gpu-type "$GPU" --device cuda \
      --dtype "$dtype" --micro-batch 1,2,4 --tp 1,2,4,8 -o "$OUT/gemms-$model-$dtype.json" \
      2>> "$OUT/summary.txt" || log "gemm sweep $model $dtype failed"
  done
done

timeout 300 "$PLANNER" profile --model opt-350m --device cuda --dtype bf16 --micro-batch 1,2,4,8 \
  --tp 1 --gpu-type "$GPU" --note "device check, $(date -u +%F)" -o "$OUT/profile-opt-350m-bf16.yaml" \
  > "$OUT/profile.log" 2>&1 || log "profile failed (see profile.log)"
timeout 120 "$PLANNER" profile --calibrate "$OUT/profile-opt-350m-bf16.yaml" --gpu-type "$GPU" \
  -o "$OUT/calibration-$GPU.yaml" >> "$OUT/summary.txt" 2>&1 || log "calibrate failed"

timeout 120 "$PLANNER" plan scripts/device-h200-1gpu.yaml --model opt-350m --global-batch-size 8 \
  --seq-len 2048 --precision tf32 --time-limit 30 -o "$OUT/plan.json" --quiet \
  > "$OUT/plan.log" 2>&1 || log "plan failed (see plan.log)"
timeout 300 "$PLANNER" run "$OUT/plan.json" --backend nccl --steps 5 --json > "$OUT/run.json" \
  2> "$OUT/run.log" || log "run failed (see run.log)"
"$PY" - "$OUT" <<'PYEOF' >> "$OUT/summary.txt" 2>&1
import json, sys
out = sys.argv[1]
plan = json.load(open(f"{out}/plan.json"))
run = json.load(open(f"{out}/run.json"))
print("predicted iteration s:", plan["predicted"]["iteration_time_s"])
print("run:", {k: v for k, v in run.items() if "time" in k or "step" in k or "loss" in k})
PYEOF
log "done: $(ls "$OUT" | tr '\n' ' ')"
