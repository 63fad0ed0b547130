#!/usr/bin/env bash
# One H200, ~3 minutes: the gpu-marked tests of the per-framework step (issue 13): each framework's 4-bit step
# through integrations.qlora (TRL's bf16 adapters and fused LM head, HF Trainer's autocast, the loop's kept
# output) and `plan --calibrate` per framework, whose calibrated plan must land within 10% of a larger shape.
# Carries trl, datasets and their wheels like call9.sh (../shared/gpu/wheels.sh puts them in .whl/).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
mkdir -p $OUT
timeout -k 10 500 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_framework_steps.py \
  tests/test_planner_calibrate.py 2>&1 | tee $OUT/frameworks_gpu_tests.log | tail -30
