#!/usr/bin/env bash
# H200 session, part 3 (two GPUs): a two-GPU QLoRA DDP job, then in parallel
#   GPU 0: training-overhead and peak-capture benchmarks;
#   GPU 1: the leak-trace corpus, the training-integration GPU tests and the tuner comparison.
# Run from the repo root on an nvidia-h200-x2 machine with the wheels in .whl; results packed into $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=/tmp/results; mkdir -p $R/ddp $R/traces $R/bench $R/tune $R/logs
pack() { tar czf $OUT/results.tgz -C $R . 2>/dev/null; }
say() { echo "=== $1 ($(date +%T))"; }
quiet() { grep -v -i "Loading weights\|Writing model\|warnings.warn\|UserWarning\|FutureWarning"; }
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
say ddp
timeout 150 torchrun --standalone --nproc_per_node 2 bench/ddp_qlora.py --out $R/ddp 2>&1 | quiet | tail -30
rm -rf $R/ddp/checkpoint  # 2 GiB of random weights: not a result
pack
gpu0() {
  say overhead; CUDA_VISIBLE_DEVICES=0 timeout 200 python3 bench/overhead.py --out $R/bench --budget-s 80 2>&1 | quiet
  pack
  say peak_capture; CUDA_VISIBLE_DEVICES=0 timeout 170 python3 bench/peak_capture.py --out $R/bench 2>&1 | quiet
  pack
}
gpu1() {
  say traces; CUDA_VISIBLE_DEVICES=1 timeout 230 python3 bench/record_traces.py --out $R/traces --budget-s 170 2>&1 | quiet | tail -30
  pack
  say gpu-tests; CUDA_VISIBLE_DEVICES=1 timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_loop.py tests/test_hf.py tests/test_distributed.py 2>&1 | tail -8
  say tune; CUDA_VISIBLE_DEVICES=1 timeout 140 python3 bench/tune_compare.py --out $R/tune --checkpoint-dir /dev/shm/vs-tune 2>&1 | quiet | tail -14
  pack
}
gpu0 > $R/logs/gpu0.log 2>&1 &
gpu1 > $R/logs/gpu1.log 2>&1 &
wait
pack
echo "----- GPU 0"; tail -40 $R/logs/gpu0.log
echo "----- GPU 1"; tail -45 $R/logs/gpu1.log
say done
