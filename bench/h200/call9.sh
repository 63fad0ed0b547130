#!/usr/bin/env bash
# H200 session 3, part 9 (one GPU): the framework points part 8 could not use or reach: TRL on Qwen2.5-1.5B again
# with a tokenizer transformers 5 really uses (part 8's was ignored for qwen2: 1 token per sequence), and the five
# points part 8's time budget left out. Each point's injected callback now also writes what held memory
# (mem.steps.breakdown.json), kept in logs.tar.gz for docs/training.md's breakdown-vs-plan table.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
mkdir -p $OUT
only='^trl-.*-Qwen2\.5-1\.5B-|^(hf|loop)-default-(Llama-3-8B|Qwen2\.5-1\.5B)-b2-s1024-gc0$|^trl-bf16-Llama-3-8B-b1-s4096-gc1$|^hf-default-Llama-2-7B-b4-s1024-gc1$'
timeout -k 10 420 python3 bench/framework_measure.py --out $OUT --jobs 7 --budget-s 330 --point-timeout-s 160 \
  --only "$only" 2>&1 | tee $OUT/run.log | grep -E "checkpoint|: (ok|oom|error|no-data|not-run)|points ok" | tail -40
