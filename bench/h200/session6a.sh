#!/usr/bin/env bash
# H200 session 6, call A (one GPU, ~8 min): first, alone on the GPU, the 12-block overhead benchmark of issue 24
# (the step path changed twice since 2026-11-29: the PeakLedger of item 8 and the relay); then every gpu-marked
# test but the `tune --` ones (those run in call B), the rehearsal's among them.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 \
  HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false NCCL_NVLS_ENABLE=0
mkdir -p $OUT/bench
git rev-parse HEAD > $OUT/tree.txt; git status --short >> $OUT/tree.txt
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> $OUT/tree.txt
timeout -k 10 300 python3 bench/overhead.py --out $OUT/bench --arms none,hf_callback,loop_monitor,run_10hz \
  --min-blocks 12 --max-blocks 12 --budget-s 0 > $OUT/overhead.log 2>&1
echo "overhead exit $?"; grep -v -i warn $OUT/overhead.log | tail -n 8
timeout -k 10 270 python3 -m pytest -p no:cacheprovider -m gpu -rA --tb=short -W ignore --durations=8 \
  --junitxml=$OUT/gpu-rest.xml tests --ignore tests/test_command_tuner_gpu.py > $OUT/gpu-rest.log 2>&1
echo "gpu tests exit $?"
grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed|Error" $OUT/gpu-rest.log | cut -c1-300 | tail -n 60
