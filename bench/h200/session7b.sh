#!/usr/bin/env bash
# H200 session 7, call B (one GPU, alone, ~8 min): the overhead benchmark on the step path as it lands (issue 24),
# 12 blocks of 1 settling + 7 timed steps per arm (84 timed steps an arm, where session 6 had 56), the ratio of
# mean step times as the headline (bench/overhead.py's analyse() says why).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/bitsandbytes*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
mkdir -p $OUT/bench
cp tree.txt $OUT/tree.txt 2>/dev/null
timeout -k 10 540 python3 bench/overhead.py --out $OUT/bench --arms none,hf_callback,loop_monitor,run_10hz \
  --min-blocks 12 --max-blocks 12 --steps-per-block 7 --budget-s 0 > $OUT/overhead.log 2>&1
echo "overhead exit $? at ${SECONDS}s"; grep -v -i warn $OUT/overhead.log | tail -n 12
ls -la $OUT $OUT/bench
