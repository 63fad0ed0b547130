#!/usr/bin/env bash
# H200 session 3, part 12 (one GPU), on the merged tree: held-out framework points (Mistral-7B, which nothing
# in the planner was fitted on; bench/framework_measure.py --held-out), `vramscope watch --once --json` while they
# train, and `vramscope run --json` around a child that holds 2 GiB on the GPU.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
mkdir -p $OUT
(sleep 75; python3 -m vramscope watch --once --json > $OUT/watch-once.json) &
timeout -k 10 250 python3 bench/framework_measure.py --out $OUT --held-out --jobs 6 --budget-s 200 \
  --point-timeout-s 150 2>&1 | tee $OUT/run.log | grep -E "checkpoint|: (ok|oom|error|no-data|not-run)|points ok"
wait
python3 -c "import json; d=json.load(open('$OUT/watch-once.json')); print('watch:', [(g['index'], g.get('used_bytes'), len(g.get('processes') or [])) for g in d['gpus']])"
python3 -m vramscope run --json -- python3 -c "import torch, time; x = torch.empty(2 << 30, dtype=torch.uint8, device='cuda'); time.sleep(3)" \
  > $OUT/run-json.txt 2> $OUT/run-json.err
echo "run --json exit $?"; tail -c 1500 $OUT/run-json.txt
