#!/usr/bin/env bash
# H200 session 8, call B (one GPU, ~8 min): the check of the loading region and the expert upcast's holes on
# architectures none of it was read from (issue 28; planner/pool.loading_region, memory.expert_upcast_holes):
# Mistral-Nemo-12B, Gemma-2-9B and Llama-3.2-3B under HF Trainer (argmax and kept-logits evaluations) and TRL's
# sft with evaluation, and Qwen3-30B-A3B with 2 of its 48 layers under both (all-linear reaches its fused experts).
# Each HF run records the allocator's history (WR_SNAPSHOT_DIR: bench/h200/whole_run_snapshot.py).
set -u
mkdir -p $OUT/b
cp tree.txt $OUT/b/tree.txt 2>/dev/null
WR_SNAPSHOT_DIR=$OUT/b/snap WR_EXTRA="--jobs 6 --gpu-budget-gib 125" OUT=$OUT/b timeout -k 5 560 \
  bash .gpu_truth/bench/h200/whole_run.sh "Mistral-Nemo-12B,Gemma-2-9B,Llama-3.2-3B,Qwen3-30B-A3B-2L" 330 540 \
  "(Mistral-Nemo-12B|Gemma-2-9B|Llama-3.2-3B|Qwen3-30B-A3B-2L)$" > $OUT/b/wr.txt 2>&1
echo "whole_run done at ${SECONDS}s"; tail -n 16 $OUT/b/wr.txt | cut -c1-300
(cd $OUT && tar czf /tmp/session8b.tgz b && rm -rf b && mv /tmp/session8b.tgz .)
ls -la $OUT
