#!/usr/bin/env bash
# H200 session 4, call A (one GPU, ~7 min): what never ran on a GPU before.
#  1. The gpu tests that never ran there: TRL's tokens on a Qwen2.5-7B shape (tests/test_trl.py, issue 19) and
#     `plan --calibrate` per framework (tests/test_planner_calibrate.py).
#  2. The three breakdown runs of docs/training.md again, after the optimizer-state fix (they lost the optimizer
#     when TRL freed its trainer at exit): bench/framework_measure.py --only, logs in $OUT/logs.tar.gz.
#  3. `vramscope tune --` around a multi-process launch (torchrun, one worker) of the HF Trainer example.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 \
  HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p $OUT
ONLY='^(hf-default-Llama-2-7B-b4-s1024-gc1|trl-bf16-Llama-3-8B-b1-s4096-gc1|trl-default-Qwen2.5-1.5B-b2-s1024-gc0)$'
(timeout -k 10 300 python3 bench/framework_measure.py --out $OUT/fw --only "$ONLY" --jobs 3 --budget-s 100 \
  --point-timeout-s 240 > $OUT/fw.log 2>&1; echo "framework_measure exit $?" >> $OUT/fw.log) &
timeout -k 10 330 python3 -m pytest -p no:cacheprovider -m gpu -rA --tb=short -W ignore --durations=8 \
  --junitxml=$OUT/gpu-new.xml tests/test_trl.py tests/test_planner_calibrate.py > $OUT/gpu-new.log 2>&1
echo "gpu tests exit $?"
grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/gpu-new.log | cut -c1-300 | tail -14
W=$(mktemp -d)
timeout -k 10 60 python3 examples/hf_trainer_lora.py --model_name_or_path $W/m --write_random_model --output_dir $W/o \
  --max_steps 1 --report_to none > /dev/null 2>&1
timeout -k 10 200 python3 -m vramscope tune --gpu-memory 3GiB -- torchrun --nproc_per_node 1 --master_port 29533 \
  examples/hf_trainer_lora.py --model_name_or_path $W/m --output_dir $W/o --per_device_train_batch_size 2 \
  --max_seq_length 1024 --bf16 --gradient_checkpointing --report_to none --max_steps 100 > $OUT/tune-torchrun.txt 2>&1
echo "tune torchrun exit $?"; tail -14 $OUT/tune-torchrun.txt
wait
grep -E "checkpoint|: (ok|oom|error|no-data|not-run)|points ok|exit" $OUT/fw.log | tail -8
ls $OUT $OUT/fw
