#!/usr/bin/env bash
# H200 session 6, call B (one GPU, ~9.5 min), three things side by side, then one after:
#  - the multi-GPU rehearsal grid and the TRL rehearsals of issue 27 (bench/h200/rehearsal_grid.sh; 80 GiB + 2 x 24);
#  - the `tune` gpu tests that call A had no time for (each trial capped at 6 GiB);
#  - after the grid: the mixture-of-experts points of issue 28 again (Qwen-MoE and Mixtral with every linear layer
#    named, Mixtral without LoRA dropout), through .gpu_truth/bench/h200/whole_run.sh.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 \
  HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false NCCL_NVLS_ENABLE=0
mkdir -p $OUT
git rev-parse HEAD > $OUT/tree.txt; git status --short >> $OUT/tree.txt
timeout -k 10 330 python3 -m pytest -p no:cacheprovider -m gpu -rA --tb=short -W ignore --durations=8 \
  --junitxml=$OUT/gpu-tune.xml tests/test_tuner_gpu.py tests/test_command_tuner_gpu.py \
  "tests/test_tuner_eval_gpu.py::test_tune_names_the_evaluation_that_limits_the_batch" > $OUT/gpu-tune.log 2>&1 &
TUNE=$!
OUT=$OUT bash bench/h200/rehearsal_grid.sh > $OUT/grid.txt 2>&1
echo "grid done at ${SECONDS}s"; tail -n 60 $OUT/grid.txt | cut -c1-400
wait $TUNE; echo "tune tests exit $? at ${SECONDS}s"
grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $OUT/gpu-tune.log | cut -c1-300
left=$((585 - SECONDS))
if [ $left -gt 90 ]; then
  WR_EXTRA="--jobs 4 --gpu-budget-gib 90" OUT=$OUT timeout -k 5 $left bash .gpu_truth/bench/h200/whole_run.sh \
    Qwen1.5-MoE-A2.7B-4L,Mixtral-8x7B-2L 20 $((left - 15)) "MoE|Mixtral" > $OUT/moe.txt 2>&1
  tail -n 30 $OUT/moe.txt | cut -c1-300
fi
# At most 8 files come back: everything in one archive.
(cd $OUT && tar czf /tmp/session6b.tgz . && find . -mindepth 1 -delete && mv /tmp/session6b.tgz .)
ls -la $OUT
