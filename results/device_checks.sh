#!/usr/bin/env bash
# The open issues' GPU checks, each step with its own limit (together 2 830 s at most: more than
# a session's 15 minutes of device time, machine start included; name the steps a session still
# needs). Run so far (results/gpu_runs/):
#   - H100, 2026-11-28: every step but compile, sac_kinds, host_tiny and fake_pg_memory (the
#     repeats at 40 iterations);
#   - H200, 2026-11-27: all but reprofile, expandable, sac_host_llama, sac_kinds, host_tiny and
#     fake_pg_memory;
#   - H200, 2026-11-30 (at 664c165, torch 2.11): gpu, torch, gpu_tests, reprofile, repeat (200
#     iterations), compile, host_tiny, sac_host, sac_host_llama and fake_pg_memory (not oom_pairs,
#     expandable). sac_kinds failed there (torch 2.11's SelectiveCheckpointContext has no
#     op_output; fixed since, not yet run). compile ran but measured an eager block: the
#     workloads' CUDA flash branch calls is_fake, which Dynamo will not trace, and in the
#     checkpointed block that runs it all eagerly (results/fidelity/HISTORY.md, "A compiled block
#     on an H200, measured eagerly"; the workloads ask a check Dynamo traces since, not yet run).
#     fake_pg_memory there: the meta-built ranks predicted to the byte in reserved
#     (results/fidelity/fake_pg_memory.md); needed again only where the memory model or the
#     workloads' build change.
# Still needed, as calls of under 10 minutes each:
#   1. `gpu torch sac_host sac_host_llama sac_kinds` (300 s at most): whether op-level SAC's host
#      cost follows its calls' kinds on a GPU's host, against that same host's full-size figures
#      (sac_kinds still needs a device run: it has never run on one);
#   2. `compile` (240 s): the compiled block again; compile_gpu.json now says per row what Dynamo
#      compiled, which must be one graph and no break for the check to mean anything;
#   3. `host_tiny` on an H100's host (240 s), the host the model's figures come from: the H200's
#      host of 2026-11-30 was 1.4-1.8x faster at plain eager dispatch, so its tiny jobs bound
#      the model's excess only through that speed ratio (results/calibration/README.md, "Host
#      time without the profiler"); its records now count launches and calls per phase;
#   4. `rope reprofile` (about 250 s with one profiled iteration a job; with the 8 it takes now,
#      not yet timed: its limit went 360 -> 480 s, so give this call 540 s): why RoPE's
#      compiled kernel runs 4.5-5x its price (new,
#      2026-11-30: three variants against a copy's floor), and the eight jobs again since the
#      ALiBi slopes are made on the device (the H200's MPT profile waited 4.6-5.5 ms a layer
#      for their host copy); each job's profile now holds 8 iterations (issue 18: each kernel's
#      spread over time at its place, `variability-table` from the recordings and profiles).
#   5. `calibrate` (240 s): the calibration grid with its fp8, fp16/fp32, non-causal and
#      grouped-query cases, and `calibrate --job`: neither has run on a GPU.
# On the H100: gpu, torch, oom_pairs, reprofile and expandable took 456 s with the machine's
# start, repeat (40) 40 s, gpu_tests 43 s. On the H200 of 2026-11-30: 388 + 93 + 143 s of
# commands, 684 s of device time with the start.
# The script goes on after a failure.
# From the repository root on the device machine, with $OUT the folder that comes back, and
# .whl/ carried (below):
#     bash results/device_checks.sh [STEP...]      (default: every step, in this order;
#     --help prints this header; a step not named below is refused before anything runs)
# Writes $OUT/device_checks.log (every step's output) and, where the steps get that far,
# oom_pairs_gpu.json, repeat_<job>.json, reprofile.tar.gz, compile_gpu.json, expandable_gpu.json,
# sac_host.json / .txt, llama/sac_host.json / .txt, sac_kinds.md, host_tiny.md / .json,
# fake_pg_memory.tar.gz and rope_kernel_gpu.json / .md: 17 files if every step runs, nine more than the device tool brings back (oom_pairs_gpu.md is removed: the json and the log hold its
# table; compile_gpu.py prints each row's figures into the log too).
#   1. the GPU as nvidia-smi reports it, the machine's torch, and the preset `record` takes it for;
#   2. issues 14/15: the `gpu`-marked tests (CUDA attention kernels, the custom ops' compiled
#      CUDA kernels, kernel-only timing, compiled kernel counts, record on cuda);
#   3. issue 15: the eight shared jobs profiled again with the production frameworks' kernels
#      (results/calibration/reprofile_gpu.py), to commit beside the shared profiles (the
#      recordings as results/baselines/recorded/<prefix>__<case>.toml, scored by
#      results/calibration/reprofile_compare.py --prefix <prefix> --profiles <dir>);
#   4. issue 14: one compiled torchtitan Llama 3 8B block (bf16 and fp8, op-level SAC) profiled
#      forward and backward (results/fidelity/compile_gpu.py; --compare scores it here against
#      the compile rule's price, which compile_vs_inductor.md found 1.3-1.75 x Inductor's bytes);
#   5. issue 18: 200 timed iterations of two shared jobs (results/fidelity/repeat_gpu.py), the
#      repeated measurements its KS goal is scored against;
#   6. issue 16: the OOM pairs predicted here (results/fidelity/oom_pairs_predicted/<gpu>.json,
#      made by oom_pairs_gpu.py --dry-run under the project's torch) run for real;
#   7. issue 16: steady peaks under torch's default allocator and under expandable segments,
#      four shared jobs (results/fidelity/expandable_gpu.py; --compare scores them here);
#   8. issue 14: where selective recompute's host time goes in the 760M job's forward, and in
#      Llama 2's (results/calibration/sac_host_gpu.py);
#   9. issue 14: SAC's host cost per call kind on this GPU's host, tiny blocks of the same two
#      jobs, and its model against step 8's full-size figures (results/calibration/
#      sac_host_kinds.py --device cuda; on a CPU the same script made sac_host_cpu.md);
#  10. issue 14: the eight shared jobs' programs at tiny sizes, host-bound, timed without and
#      with the profiler beside the calls their captures count (results/calibration/
#      host_tiny_gpu.py).
#  11. issue 15: `prism::rope`'s compiled kernel against a variant reading precomputed angle
#      tables and a copy of the same bytes (results/calibration/rope_kernel_gpu.py);
#  12. issue 16: rank 0 of the four shared fake-process-group jobs under torch's fake backend,
#      each built on the device and on meta in a process of its own, with the allocator's
#      history from before the build (results/fidelity/fake_pg_memory.py; --compare scores the
#      unpacked archive here, part by part).
#  13. issue 14: `prismbench calibrate`'s quick grid with the rest of its ops (fp8 `_scaled_mm`,
#      fp16/fp32 GEMMs, casts, causal, non-causal and grouped-query SDPA forward and backward;
#      every case must run) and `calibrate --job` on a tiny gpt-debug job (world size 1): a
#      profile and rows (the `gpu` tests of tests/prismbench/test_calibrate_grid.py and
#      test_calibrate_job.py; they write nothing here but the log).
# The machine's python3 has torch (2.11, not the project's 2.13) but not this project's other
# dependencies: the steps use only torch, numpy, rich and the repository (PYTHONPATH). torchao
# travels as a wheel in .whl/ because a capture's cache key reads its version, and duckdb for
# the tests that touch the harness's history (`record` itself no longer needs it):
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#         --implementation cp --platform manylinux_2_28_x86_64 -d .whl torchao==0.18.0 duckdb==2.0.1
set -u
# every step, in the order the script runs them
ALL_STEPS="gpu torch gpu_tests reprofile compile repeat oom_pairs expandable sac_host sac_host_llama sac_kinds host_tiny rope fake_pg_memory calibrate"
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    sed -n '2,/^set -u$/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
fi
# a misspelt step would run nothing, found only after the machine's start was paid for
for name in "$@"; do
    [[ " $ALL_STEPS " == *" $name "* ]] || { echo "error: no step '$name' (steps: $ALL_STEPS)" >&2; exit 2; }
done
: "${OUT:?set OUT to the folder that comes back}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PRISMBENCH_CACHE=/tmp/prismbench-cache
LOG="$OUT/device_checks.log"
py=python3
if compgen -G ".whl/*.whl" > /dev/null; then
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl >> "$LOG" 2>&1 && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

STEPS=" ${*:-$ALL_STEPS} "

wanted() { [[ $STEPS == *" $1 "* ]]; }

declare -A EXIT  # step name -> its exit status
step() {  # step NAME LIMIT_S COMMAND...: run it, log it, say how it ended
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit} s, $(date -u +%H:%M:%S))" | tee -a "$LOG"
    timeout "$limit" "$@" >> "$LOG" 2>&1
    EXIT[$name]=$?
    echo "== $name: exit ${EXIT[$name]}" | tee -a "$LOG"
}

wanted gpu && step gpu 30 nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm,driver_version \
    --format=csv
wanted torch && step torch 30 $py -c "import torch; from prismbench.record import local_gpu
print(torch.__version__, local_gpu())"  # the GPU as record tells it (preset by arch, SMs, capacity)
wanted gpu_tests && step gpu_tests 150 $py -m pytest -q -m gpu -p no:cacheprovider \
    tests/workloads/test_attention_ops.py tests/workloads/test_context_parallel.py \
    tests/workloads/test_cuda_kernels.py \
    tests/emulator/costs/test_calibrate.py \
    tests/emulator/capture/test_compile_fusion.py tests/prismbench/test_record.py
wanted reprofile && step reprofile 480 $py results/calibration/reprofile_gpu.py --out "$OUT"
wanted compile && step compile 240 $py results/fidelity/compile_gpu.py --out "$OUT"
wanted repeat && for job in gpt3-125m-s2048-mb8-none llama3-8b-l2-s8192-mb2-none; do
    step "repeat_$job" 100 $py results/fidelity/repeat_gpu.py --out "$OUT" --iterations 200 "$job"
done

wanted oom_pairs && gpu=$($py -c "import sys; sys.path[:0] = ['results']; import shared_gpu; print(shared_gpu.local_gpu_preset())")
wanted oom_pairs && step oom_pairs 260 $py results/fidelity/oom_pairs_gpu.py --out "$OUT" \
    --predicted "results/fidelity/oom_pairs_predicted/$gpu.json"

wanted expandable && step expandable 120 $py results/fidelity/expandable_gpu.py --out "$OUT"
wanted sac_host && step sac_host 60 $py results/calibration/sac_host_gpu.py --out "$OUT"
# the other selective job, whose ops the shared profiles show issued at no extra host cost
wanted sac_host_llama && step sac_host_llama 60 $py results/calibration/sac_host_gpu.py \
    --out "$OUT/llama" --case llama2-7b-l4-s4096-mb1-sel
# against step 8's figures when both ended well here (this host; a cut one leaves a file
# without its selective figure), else against the H100's of 2026-11-28
measured=()
[[ ${EXIT[sac_host]:-} == 0 && ${EXIT[sac_host_llama]:-} == 0 ]] &&
    measured=(--measured "$OUT/sac_host.json" "$OUT/llama/sac_host.json")
wanted sac_kinds && step sac_kinds 150 $py results/calibration/sac_host_kinds.py --device cuda \
    ${measured[@]+"${measured[@]}"} --out "$OUT/sac_kinds.md"
wanted host_tiny && step host_tiny 240 $py results/calibration/host_tiny_gpu.py --out "$OUT/host_tiny.md"
wanted rope && step rope 90 $py results/calibration/rope_kernel_gpu.py --out "$OUT"
wanted fake_pg_memory && step fake_pg_memory 480 $py results/fidelity/fake_pg_memory.py \
    --measure /tmp/fake_pg_memory
# one file back, with whatever cases finished
wanted fake_pg_memory && [[ -d /tmp/fake_pg_memory ]] &&
    tar -C /tmp -czf "$OUT/fake_pg_memory.tar.gz" fake_pg_memory
wanted calibrate && step calibrate 240 $py -m pytest -q -m gpu -p no:cacheprovider \
    tests/prismbench/test_calibrate_grid.py tests/prismbench/test_calibrate_job.py
rm -f "$OUT/oom_pairs_gpu.md"
tail -n 40 "$LOG"
