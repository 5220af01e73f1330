#!/usr/bin/env bash
# The open issues' GPU checks as one prepared run, sized for one device call: steps 1-4 at most
# about 9 minutes after the machine's start, step 5 in what is left of 10 (each step has its own
# limit; the script goes on after a failure). From the repository root on the device machine,
# with $OUT the folder that comes back:
#     bash results/device_checks.sh
# Writes $OUT/device_checks.log (every step's output) and, where the steps get that far,
# oom_pairs_gpu.json / .md, repeat_<job>.json and sac_host.json / .txt: at most 7 files (the
# device tool brings 8 back).
#   1. the GPU as nvidia-smi reports it;
#   2. issue 16: the predicted OOM pairs run for real (results/fidelity/oom_pairs_gpu.py);
#   3. issue 18: 40 timed iterations of two shared jobs (results/fidelity/repeat_gpu.py), the
#      repeated measurements its KS goal is scored against;
#   4. issues 14/15: the `gpu`-marked tests (CUDA attention kernels, kernel-only timing,
#      compiled kernel counts, record on cuda);
#   5. issue 14: where selective recompute's host time goes in the 760M job's forward
#      (results/calibration/sac_host_gpu.py). Steps 1-4 fit in 9 minutes; this last one uses
#      what is left of a 10-minute call, and a cut leaves the earlier steps' files intact.
# The machine's python3 has torch but not this project's other dependencies: the steps use
# only torch, numpy, rich and the repository (PYTHONPATH); fp8 jobs would need torchao carried.
set -u
: "${OUT:?set OUT to the folder that comes back}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PRISMBENCH_CACHE=/tmp/prismbench-cache
LOG="$OUT/device_checks.log"
py=python3

step() {  # step NAME LIMIT_S COMMAND...: run it, log it, say how it ended
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit} s, $(date -u +%H:%M:%S))" | tee -a "$LOG"
    timeout "$limit" "$@" >> "$LOG" 2>&1
    echo "== $name: exit $?" | tee -a "$LOG"
}

step gpu 30 nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm,driver_version \
    --format=csv
step oom_pairs 330 $py results/fidelity/oom_pairs_gpu.py --out "$OUT"

for job in gpt3-125m-s2048-mb8-none llama3-8b-l2-s8192-mb2-none; do
    step "repeat_$job" 60 $py results/fidelity/repeat_gpu.py --out "$OUT" --iterations 40 "$job"
done

step gpu_tests 90 $py -m pytest -q -m gpu -p no:cacheprovider \
    tests/workloads/test_attention_ops.py tests/workloads/test_context_parallel.py \
    tests/emulator/costs/test_calibrate.py \
    tests/emulator/capture/test_compile_fusion.py tests/prismbench/test_record.py
step sac_host 60 $py results/calibration/sac_host_gpu.py --out "$OUT"
tail -n 40 "$LOG"
