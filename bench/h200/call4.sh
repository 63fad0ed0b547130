#!/usr/bin/env bash
# H200 session, part 4 (two GPUs, after fixing the random-weight init that had fallen back to the CPU):
#   GPU 0: the training-overhead benchmark; GPU 1: more of the leak-trace corpus.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
R=/tmp/results; mkdir -p $R/bench $R/traces $R/logs
pack() { tar czf $OUT/results.tgz -C $R . 2>/dev/null; }
quiet() { grep -v -i "Loading weights\|Writing model\|warnings.warn\|UserWarning\|FutureWarning\|return fn"; }
( CUDA_VISIBLE_DEVICES=0 timeout 215 python3 bench/overhead.py --out $R/bench --budget-s 60 2>&1 | quiet > $R/logs/gpu0.log; pack ) &
( CUDA_VISIBLE_DEVICES=1 timeout 215 python3 bench/record_traces.py --out $R/traces --budget-s 165 --steps 220 \
    --only clean_varlen,leak_loss_graph,leak_eval_logits,clean_eval 2>&1 | quiet > $R/logs/gpu1.log; pack ) &
wait; pack
echo "----- GPU 0"; tail -30 $R/logs/gpu0.log; echo "----- GPU 1"; tail -20 $R/logs/gpu1.log
