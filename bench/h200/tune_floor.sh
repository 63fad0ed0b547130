#!/usr/bin/env bash
# The tune floor (issue 15) on one H200: tune/ (search, cuda, trials, find, model_dir, command, calibrate) and the
# OOM post-mortem whose advice moved to advice/. Run from the repo root on the GPU machine with the wheels in .whl;
# writes $OUT/tune_floor.log and $OUT/tune_floor.xml. About 5 minutes.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
timeout 540 python3 -m pytest -q -p no:cacheprovider -m gpu --durations=10 --junitxml=$OUT/tune_floor.xml \
  tests/test_tuner_gpu.py tests/test_oom_gpu.py tests/test_planner_calibrate.py tests/test_command_tuner_gpu.py \
  > $OUT/tune_floor.log 2>&1
tail -30 $OUT/tune_floor.log
