#!/usr/bin/env bash
# H200 session 3, part 8 (one GPU): the per-framework ground truth for the planner (issue 13): TRL's own
# trl.scripts.sft, an HF Trainer qlora.py-recipe script and a hand-written loop, each point a fresh process
# under `vramscope run` (bench/framework_measure.py). Wheels: bitsandbytes 0.50.2, trl 1.16.0, datasets 5.2.0,
# dill 0.4.1, multiprocess 0.70.19 (../shared/gpu/wheels.sh).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout -k 10 570 python3 bench/framework_measure.py --out $OUT --jobs 7 --budget-s 390 --point-timeout-s 160 \
  2>&1 | tee $OUT/run.log | grep -E "checkpoint|: (ok|oom|error|no-data|not-run)|points ok" | tail -80
