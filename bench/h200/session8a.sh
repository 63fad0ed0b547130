#!/usr/bin/env bash
# H200 session 8, call A (one GPU, ~6 min): the HF Trainer evaluations of Llama-3.1-8B (argmax, kept logits) and
# Phi-3-mini (argmax, loss with saves) again, each with the allocator's history from before its load
# (WR_SNAPSHOT_DIR: bench/h200/whole_run_snapshot.py), to see what the loading segment's free region holds after a
# step and which of the evaluation's tensors it takes (issue 28: the process plan of an evaluation, planner/pool.py).
set -u
mkdir -p $OUT/a
cp tree.txt $OUT/a/tree.txt 2>/dev/null
WR_SNAPSHOT_DIR=$OUT/a/snap WR_EXTRA="--jobs 4 --gpu-budget-gib 120" OUT=$OUT/a timeout -k 5 420 \
  bash .gpu_truth/bench/h200/whole_run.sh "Llama-3.1-8B,Phi-3-mini" 200 400 \
  "hf-eval(argmax|logits)-Llama-3.1-8B|hf-eval(argmax|loss-save-epochs)-Phi-3-mini" > $OUT/a/wr.txt 2>&1
echo "whole_run done at ${SECONDS}s"; tail -n 8 $OUT/a/wr.txt | cut -c1-300
(cd $OUT && tar czf /tmp/session8a.tgz a && rm -rf a && mv /tmp/session8a.tgz .)
ls -la $OUT
