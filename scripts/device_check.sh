#!/usr/bin/env bash
# The prepared check for a lent GPU machine (issue "Truth"): one script, one call of the device
# tool, results under $OUT.  Run from the repository root on the GPU machine:
#   bash scripts/device_check.sh            (OUT defaults to ./device-out)
# The lent machine has PyTorch but no network: the planner's own dependencies travel as wheels in
# .whl/ (see .library/device/README.md) and are installed to /tmp/site; a local .venv is used
# when there is one.
# 1. GEMM sweep: every GEMM shape the cost model prices for OPT-350M and Llama-3-8B blocks,
#    timed with CUDA events, beside gemm.py's prediction (planner/profile/gemm_sweep.py).
# 1b. Micro-benchmarks of the memory-bound terms (planner/profile/micro.py).
# 2. planner profile: embedding / block / head of OPT-350M (micro-batch 1-8) and Llama-3-8B
#    (micro-batch 1-2), tp 1, bf16; then --calibrate to fit this GPU's own curve to OPT's.
# 3. One plan on this one GPU (scripts/device-h200-1gpu.yaml), trained with the reference runner
#    on nccl for a few steps: measured step time against the plan's prediction.
# Each step writes its own files and a line to $OUT/summary.txt; a failing step does not stop
# the next one, and each has its own time limit so the whole fits one 10-minute call.
set -uo pipefail
# The device tool brings back at most 8 files: the steps write to a work folder, and after each
# step it is packed into $OUT/results.tgz (so a run stopped at its limit still returns the rest).
RESULTS=${OUT:-device-out}
OUT=$(mktemp -d /tmp/device-check.XXXX)
mkdir -p "$RESULTS"
GPU=${GPU_TYPE:-H200-SXM-141GB}
DEVICE=${DEVICE:-cuda}
log() {
  echo "[$(date -u +%T)] $*" | tee -a "$OUT/summary.txt"
  cp "$OUT/summary.txt" "$RESULTS/summary.txt"
  tar czf "$RESULTS/results.tgz" -C "$OUT" .
}

if [ -x .venv/bin/python ]; then
  PY=.venv/bin/python
else
  PY=python3
  if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl > "$OUT/install.log" 2>&1 || log "wheel install failed"
    export PYTHONPATH=/tmp/site:$PWD
  else
    export PYTHONPATH=$PWD
  fi
fi
PLANNER=("$PY" -c 'import sys; from planner.cli.main import run; sys.argv[0] = "planner"; run()')
export PYTHONUNBUFFERED=1

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
"$PY" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name())" \
  > "$OUT/torch.txt" 2>&1
log "torch: $(cat "$OUT/torch.txt")"

for dtype in bf16 tf32; do
  for model in opt-350m llama3-8b; do
    timeout 60 "$PY" -m planner.profile.gemm_sweep --model "$model" --gpu-type "$GPU" --device "$DEVICE" \
      --dtype "$dtype" --micro-batch 1,2,4 --tp 1,2,4,8 -o "$OUT/gemms-$model-$dtype.json" \
      2>> "$OUT/summary.txt" || log "gemm sweep $model $dtype failed"
  done
done
log "gemm sweeps done"

# 1b. the memory-bound terms beside the GEMMs: HBM copy, fused AdamW, attention core, launches
for dtype in bf16 fp32; do
  timeout 120 "$PY" -m planner.profile.micro --device "$DEVICE" --dtype "$dtype" -o "$OUT/micro-$dtype.json" \
    2>> "$OUT/summary.txt" || log "micro-benchmarks $dtype failed"
done

timeout 100 "${PLANNER[@]}" profile --model opt-350m --device "$DEVICE" --dtype bf16 --micro-batch 1,2,4,8 \
  --tp 1 --gpu-type "$GPU" --note "device check, $(date -u +%F)" -o "$OUT/profile-opt-350m-bf16.yaml" \
  > "$OUT/profile.log" 2>&1 || log "profile opt-350m failed (see profile.log)"
timeout 30 "${PLANNER[@]}" profile --calibrate "$OUT/profile-opt-350m-bf16.yaml" --gpu-type "$GPU" \
  -o "$OUT/calibration-$GPU.yaml" >> "$OUT/summary.txt" 2>&1 || log "calibrate failed"
log "profile opt-350m done"

timeout 45 "${PLANNER[@]}" plan scripts/device-h200-1gpu.yaml --model opt-350m --global-batch-size 8 \
  --seq-len 2048 --precision tf32 --time-limit 20 -o "$OUT/plan.json" --quiet \
  > "$OUT/plan.log" 2>&1 || log "plan failed (see plan.log)"
timeout 120 "${PLANNER[@]}" run "$OUT/plan.json" --backend nccl --steps 8 --json > "$OUT/run.json" \
  2> "$OUT/run.log" || log "run failed (see run.log)"
"$PY" - "$OUT" <<'PYEOF' >> "$OUT/summary.txt" 2>&1
import json, sys
out = sys.argv[1]
plan = json.load(open(f"{out}/plan.json"))
run = json.load(open(f"{out}/run.json"))
print("predicted iteration s:", plan["predicted"]["iteration_time_s"])
print("run:", {k: v for k, v in run.items() if "time" in k or "step" in k or "loss" in k})
PYEOF
log "plan and run done"

timeout 90 "${PLANNER[@]}" profile --model llama3-8b --device "$DEVICE" --dtype bf16 --micro-batch 1,2 \
  --tp 1 --gpu-type "$GPU" --note "device check, $(date -u +%F)" -o "$OUT/profile-llama3-8b-bf16.yaml" \
  > "$OUT/profile-llama.log" 2>&1 || log "profile llama3-8b failed (see profile-llama.log)"
log "done: $(ls "$OUT" | tr '\n' ' ')"
