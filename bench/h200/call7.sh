#!/usr/bin/env bash
# H200 session, part 7 (one GPU): the gpu-marked tests after the tuner test's bound was restated
# (part 6: the search answered 11 where 13 still ran under the 6 GiB per-process cap).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
mkdir -p $OUT
timeout -k 10 400 python3 -m pytest -p no:cacheprovider -m gpu -rA --tb=short -W ignore --durations=5 \
  --junitxml=$OUT/gpu-tests.xml tests > $OUT/gpu-tests.log 2>&1
echo "gpu tests exit $?"
grep -E "answer [0-9]+, single-step|PASSED|FAILED|ERROR|passed|failed" $OUT/gpu-tests.log | tail -30
