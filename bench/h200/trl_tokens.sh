#!/usr/bin/env bash
# H200 check for issue 19 (one GPU, ~3 min): TRL's SFTTrainer on a Qwen2.5-7B-shaped random model (bf16, LoRA
# on every linear, gradient checkpointing) at 4 x 1024 and 1 x 4096. The step log must say 4096 tokens per step,
# as TRL's own num_tokens does, and train()'s summary must carry the run's allocator peak (it said 0).
set -u
if ls .whl/*.whl >/dev/null 2>&1; then  # trl, datasets (and bitsandbytes) travel as wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
fi
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
mkdir -p $OUT
timeout -k 10 500 python3 -m pytest -p no:cacheprovider -m gpu -rA --tb=short -W ignore --durations=5 \
  --junitxml=$OUT/trl-tokens.xml tests/test_trl.py > $OUT/trl-tokens.log 2>&1
echo "trl tokens tests exit $?"
grep -E "step log|PASSED|FAILED|ERROR|SKIPPED|passed|failed" $OUT/trl-tokens.log | cut -c1-600 | tail -20
