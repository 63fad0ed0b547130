#!/usr/bin/env bash
# H200 session 9 (one GPU, ~8 min): every gpu-marked test on the landing's tree, in two processes (the
# tune tests apart): the trial record's eval entry now typed (TrialEval) on its CUDA path, the planner's loading
# in the rehearsal's plan, the warnings file's typed owner under the loop and TRL, the monitor as it lands.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 \
  HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/g
cp tree.txt $OUT/g/tree.txt 2>/dev/null
TUNE="tests/test_tuner_gpu.py tests/test_command_tuner_gpu.py tests/test_tuner_eval_gpu.py"
REST="tests/test_framework_steps.py tests/test_gpu_foundation.py tests/test_loop.py tests/test_oom_gpu.py tests/test_peak_ledger.py tests/test_planner_calibrate.py tests/test_rehearse_gpu.py tests/test_trl.py"
timeout -k 10 560 python3 -m pytest -p no:cacheprovider -m gpu -rA --tb=short -W ignore --junitxml=$OUT/g/gpu-tune.xml $TUNE > $OUT/g/gpu-tune.log 2>&1 &
T1=$!
timeout -k 10 560 python3 -m pytest -p no:cacheprovider -m gpu -rA --tb=short -W ignore --junitxml=$OUT/g/gpu-rest.xml $REST > $OUT/g/gpu-rest.log 2>&1 &
T2=$!
wait $T1; echo "tune tests exit $? at ${SECONDS}s"
wait $T2; echo "rest tests exit $? at ${SECONDS}s"
grep -hE "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/g/gpu-tune.log $OUT/g/gpu-rest.log | cut -c1-200
(cd $OUT && tar czf /tmp/session9.tgz g && rm -rf g && mv /tmp/session9.tgz .)
ls -la $OUT
