#!/usr/bin/env bash
# H200 (one GPU, under 8 minutes): the multi-GPU planner's truth grid, rehearsed (issue 27).
#  1. bench/rehearsal_grid.py: FSDP-QLoRA (FSDP2 fully_shard, NF4 with bf16 quant storage) at world sizes 2, 4, 8,
#     16 with and without CPU offload, and DDP, on Llama-2-7B and -13B shapes (random checkpoints in /dev/shm) and a
#     70B shape built on meta and quantized layer by layer (no checkpoint: 138 GB of bf16 fits neither the 64 GB
#     disk nor beside the runs in memory), each case a fresh process as rank 0 of N on torch's fake process group,
#     several at once on the one GPU; writes $OUT/multigpu/rehearsal_grid.json (one object per case) and prints
#     the Markdown table of docs/distributed.md.
#  2. beside it, `vramscope tune --gpus 2 --gpu-memory 24GiB -- ...` against TRL's sft (a random TinyLlama-shaped
#     4-bit model) behind `accelerate launch --config_file fsdp.yaml` (PEFT's FSDP-QLoRA config) and behind
#     torchrun: $OUT/trl-accelerate.txt and $OUT/trl-torchrun.txt, for docs/distributed.md.
# Needs the bitsandbytes, trl, datasets, dill and multiprocess wheels in .whl/ (../shared/gpu/wheels.sh
#   bitsandbytes==0.50.2 trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19).
# Run from the repo root: run(command="bash bench/h200/rehearsal_grid.sh", carry=[".whl"], timeout_s=540).
#   --dry-run: build every command and plan, run nothing (CPU; what tests/test_rehearsal_grid.py checks).
set -u
DRY=${1:-}
if [ "$DRY" != "--dry-run" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
fi
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 \
  HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/rehearsal-out}
mkdir -p $OUT/multigpu
PY=${PYTHON:-python3}
TRL=$(mktemp -d)

# The TRL rehearsals first build their model (about 10 s), then run in the background beside the grid: 24 GiB
# each at most (--gpu-memory), while the grid keeps to 80 GiB of the GPU (--gpu-budget).
$PY bench/rehearsal_grid.py --trl $TRL $DRY > $OUT/trl.commands 2> $OUT/trl-make.log || { cat $OUT/trl-make.log; exit 1; }
while read -r name cmd; do
  echo "$name: $cmd" | cut -c1-400
  if [ -z "$DRY" ]; then
    (cd $TRL && timeout -k 10 400 bash -c "$cmd" > $OUT/trl-$name.txt 2>&1; echo "exit $?" >> $OUT/trl-$name.txt) &
  fi
done < $OUT/trl.commands

timeout -k 10 430 $PY bench/rehearsal_grid.py --out $OUT/multigpu --budget 380 --parallel 6 --gpu-budget ${GRID_GPU_BUDGET:-80} $DRY \
  2>&1 | grep -v -i "warnings.warn\|UserWarning\|FutureWarning\|Writing model shards" | tee $OUT/multigpu/grid.log \
  | tail -n 40
echo "grid exit ${PIPESTATUS[0]}"
wait
for f in $OUT/trl-*.txt; do
  [ -f "$f" ] || continue
  echo "== $f"; grep -v -i "warn" "$f" | tail -n 30
done
rm -rf $TRL
