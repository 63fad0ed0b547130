#!/usr/bin/env bash
# H200 session, part 2: tuner and OOM post-mortem, planner calibration, reading cost, peak capture.
# Run from the repo root on the GPU machine with the wheels in .whl; results go to $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
R=/tmp/results; mkdir -p $R/tune $R/oom $R/cal $R/bench
# Packed after every step, so that a run stopped at the time limit still brings back what it finished.
step() { tar czf $OUT/results.tgz -C $R . 2>/dev/null; echo "=== $1 ($(date +%T))"; }
step tune_compare
timeout 140 python3 bench/tune_compare.py --out $R/tune 2>&1 | grep -v -i "warn\|Loading weights\|Writing model" | tail -25
step oom_example
timeout 90 python3 bench/oom_example.py --out $R/oom --stacks-all 2>&1 | grep -v -i "warn\|Loading weights\|Writing model" | tail -15
step gpu-tests
VRAMSCOPE_TEST_CHECKPOINT=/tmp/vramscope-bench/TinyLlama-1.1B timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/test_tuner_gpu.py tests/test_oom_gpu.py tests/test_planner_calibrate.py 2>&1 | tail -15
step calibrate_eval
timeout 100 python3 bench/calibrate_eval.py --out $R/cal 2>&1 | grep -v -i "warn\|Loading weights\|Writing model" | tail -12
step reading_cost
timeout 60 python3 bench/reading_cost.py --out $R/bench 2>&1 | tail -15
step peak_capture
timeout 110 python3 bench/peak_capture.py --out $R/bench 2>&1 | grep -v -i "Loading weights\|Writing model" | tail -20
step done
find $R -type f | head -60
# The device tool brings back at most 8 files: pack them.
tar czf $OUT/results.tgz -C $R .
