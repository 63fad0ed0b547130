#!/usr/bin/env bash
# H200 session 4, call B (one GPU, ~5 min): every gpu-marked test on the rebuilt tree (issue 15 moved the
# monitor, the sampler, the tuner, the log reader and the analysis), in two pytest processes side by side: the
# `tune --` tests (each trial is its own child under a 6 GiB cap) and all the others.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 \
  HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p $OUT
timeout -k 10 540 python3 -m pytest -p no:cacheprovider -m gpu -rA --tb=short -W ignore --durations=5 \
  --junitxml=$OUT/gpu-tune.xml tests/test_command_tuner_gpu.py > $OUT/gpu-tune.log 2>&1 &
timeout -k 10 540 python3 -m pytest -p no:cacheprovider -m gpu -rA --tb=short -W ignore --durations=10 \
  --junitxml=$OUT/gpu-rest.xml tests --deselect tests/test_command_tuner_gpu.py \
  --ignore tests/test_command_tuner_gpu.py > $OUT/gpu-rest.log 2>&1
echo "gpu tests (all but tune --) exit $?"
wait
echo "gpu tests (tune --) done"
for f in $OUT/gpu-rest.log $OUT/gpu-tune.log; do grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $f | cut -c1-250; done
