#!/usr/bin/env bash
# H200 session 7, call C (one GPU, ~9 min), side by side:
#  1. every gpu-marked test on the landing's tree, in two processes (the tune tests apart): issue 24 item 8's
#     peak ledger on the step path as it lands, issue 28's tuner-eval tests, issue 27's rehearsal tests;
#  2. the Qwen2.5-7B argmax evaluation again with the allocator's history: who holds the loading segment's
#     1646 MiB free block, and when it is let go (issue 28, the process point the plan misses);
#  3. the rehearsal grid under bf16 autocast (issue 27: 7B and 13B, FSDP2 at 2-16 ranks and DDP, no offload).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 \
  HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/c
cp tree.txt $OUT/c/tree.txt 2>/dev/null
TUNE="tests/test_tuner_gpu.py tests/test_command_tuner_gpu.py tests/test_tuner_eval_gpu.py"
REST="tests/test_framework_steps.py tests/test_gpu_foundation.py tests/test_loop.py tests/test_oom_gpu.py tests/test_peak_ledger.py tests/test_planner_calibrate.py tests/test_rehearse_gpu.py tests/test_trl.py"
timeout -k 10 540 python3 -m pytest -p no:cacheprovider -m gpu -rA --tb=short -W ignore --junitxml=$OUT/c/gpu-tune.xml $TUNE > $OUT/c/gpu-tune.log 2>&1 &
T1=$!
timeout -k 10 540 python3 -m pytest -p no:cacheprovider -m gpu -rA --tb=short -W ignore --junitxml=$OUT/c/gpu-rest.xml $REST > $OUT/c/gpu-rest.log 2>&1 &
T2=$!
timeout -k 10 480 python3 bench/rehearsal_grid.py --out $OUT/c/multigpu --arch 7b 13b --precision autocast \
  --only 'b-(fsdp|ddp)[0-9]+-autocast$' --budget 420 --parallel 3 --gpu-budget 30 > $OUT/c/grid.log 2>&1 &
G=$!
WR_SNAPSHOT_DIR=$OUT/c/snap WR_EXTRA="--jobs 1 --gpu-budget-gib 30" OUT=$OUT/c timeout -k 5 300 \
  bash .gpu_truth/bench/h200/whole_run.sh Qwen2.5-7B 120 280 "hf-evalargmax-Qwen2.5-7B" > $OUT/c/wr.txt 2>&1
echo "whole_run done at ${SECONDS}s"; tail -n 4 $OUT/c/wr.txt | cut -c1-300
wait $G; echo "grid exit $? at ${SECONDS}s"; grep -v -i "warn" $OUT/c/grid.log | tail -n 16 | cut -c1-250
wait $T1; echo "tune tests exit $? at ${SECONDS}s"
wait $T2; echo "rest tests exit $? at ${SECONDS}s"
grep -hE "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/c/gpu-tune.log $OUT/c/gpu-rest.log | cut -c1-200
(cd $OUT && tar czf /tmp/session7c.tgz c && rm -rf c && mv /tmp/session7c.tgz .)
ls -la $OUT
