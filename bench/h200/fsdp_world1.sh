#!/usr/bin/env bash
# H200 (one GPU, under 4 minutes): a strategy's per-rank memory at world size 1 against the
# distributed plan (bench/fsdp_world1.py): no wrapper, DDP, FSDP2 fully_shard and FSDP1 over an NCCL group of
# one rank, on TinyLlama-1.1B QLoRA with bnb_4bit_quant_storage=bfloat16, 4 x 512 tokens, three steps each.
# Writes $OUT/fsdp_world1.csv (planned vs measured), $OUT/fsdp_world1.json (raw) and $OUT/fsdp_world1.log.
# Run from the repo root with the wheels in .whl: run(command="bash bench/h200/fsdp_world1.sh", carry=[".whl"]).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT
timeout -k 10 235 python3 bench/fsdp_world1.py --out $OUT 2>&1 | grep -v -i "warnings.warn\|UserWarning\|FutureWarning" \
  | tee $OUT/fsdp_world1.log | tail -n 20
echo "fsdp_world1 exit ${PIPESTATUS[0]}"
