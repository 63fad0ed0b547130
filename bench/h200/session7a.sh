#!/usr/bin/env bash
# H200 session 7, call A (one GPU, ~8 min):
#  1. alone first: bench/hook_profile.py, where MemoryMonitor.step's ~1.3 ms per logged step goes (issue 24);
#  2. then side by side: the rehearsal grid's CPU-offload cases (issue 27: the child now counts the pinned and
#     CPU-optimizer bytes directly; 70B x 8 with offload, cut by the budget last time), and the whole-run points
#     whose process memory the plan misses (issue 28: Qwen2.5-7B's argmax and kept-logits evaluations) with the
#     allocator's segments and who opened them (WR_SNAPSHOT_DIR), and Mixtral-8x7B-2L under HF Trainer at
#     lora_dropout 0 (peft refuses its fused experts otherwise).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 \
  HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/a
cat tree.txt > $OUT/a/tree.txt 2>/dev/null
timeout -k 5 90 python3 bench/hook_profile.py --out $OUT/a/hook --calls 300 > $OUT/a/hook.log 2>&1
echo "hook_profile exit $? at ${SECONDS}s"; grep -v -i warn $OUT/a/hook.log | tail -n 20
timeout -k 10 430 python3 bench/rehearsal_grid.py --out $OUT/a/multigpu --only offload --budget 400 --parallel 5 \
  --gpu-budget 60 > $OUT/a/grid.log 2>&1 &
GRID=$!
WR_SNAPSHOT_DIR=$OUT/a/snap WR_EXTRA="--jobs 3 --gpu-budget-gib 55" OUT=$OUT/a timeout -k 5 440 \
  bash .gpu_truth/bench/h200/whole_run.sh Qwen2.5-7B,Mixtral-8x7B-2L 300 430 \
  "hf-evalargmax-Qwen2.5-7B|hf-evallogits-Qwen2.5-7B|hf-evalloss-Mixtral-8x7B-2L" > $OUT/a/wr.txt 2>&1
echo "whole_run done at ${SECONDS}s"; tail -n 30 $OUT/a/wr.txt | cut -c1-300
wait $GRID; echo "grid exit $? at ${SECONDS}s"
grep -v -i "warn" $OUT/a/grid.log | tail -n 30 | cut -c1-300
(cd $OUT && tar czf /tmp/session7a.tgz a && rm -rf a && mv /tmp/session7a.tgz .)
ls -la $OUT
