#!/usr/bin/env bash
# plan --trace against the real step (issue 13, item 6): 20 points, real GPU steps in this process, traces on the
# CPU in parallel workers; about 3-4 minutes on one H200. Run from the repo root with the wheels in .whl
# (../shared/gpu/wheels.sh bitsandbytes==0.50.2 trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19);
# the CSV and the log go to $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout 280 python3 bench/trace_vs_real.py --out $OUT --workers 12 --budget-s 200 2>&1 \
  | grep -v -i "Loading weights\|Writing model\|warnings.warn\|UserWarning\|FutureWarning" | tee $OUT/trace_vs_real.log | tail -60
