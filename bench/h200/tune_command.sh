#!/usr/bin/env bash
# H200 (one GPU): `vramscope tune -- CMD` for real (issue 13 item 3). The gpu-marked tests of
# tests/test_command_tuner_gpu.py tune an HfArgumentParser QLoRA script (batch and length) and TRL's sft under a
# 6 GiB per-process cap, each answer verified by one more real run; then the CLI's own text output for the docs.
# Needs the bitsandbytes, trl, datasets, dill and multiprocess wheels in .whl/ (../shared/gpu/wheels.sh).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 \
  HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p $OUT
timeout -k 10 330 python3 -m pytest -p no:cacheprovider -m gpu -rA -s --tb=short -W ignore --durations=5 \
  --junitxml=$OUT/tune-command.xml tests/test_command_tuner_gpu.py > $OUT/tune-command.log 2>&1
echo "gpu tests exit $?"
grep -E "answer|longest sequence|PASSED|FAILED|ERROR|passed|failed|skipped" $OUT/tune-command.log | tail -20
# The text a user sees (stderr: the trials; stdout: the answer), on a tiny random model: about a minute.
W=$(mktemp -d)
timeout -k 10 60 python3 examples/hf_trainer_lora.py --model_name_or_path $W/m --write_random_model --output_dir $W/o \
  --max_steps 1 --report_to none > /dev/null 2>&1
timeout -k 10 170 python3 -m vramscope tune --gpu-memory 3GiB -- python3 examples/hf_trainer_lora.py \
  --model_name_or_path $W/m --output_dir $W/o --per_device_train_batch_size 2 --gradient_accumulation_steps 8 \
  --max_seq_length 2048 --bf16 --gradient_checkpointing --report_to none --max_steps 100 > $OUT/tune-cli.txt 2>&1
echo "cli exit $?"; cat $OUT/tune-cli.txt | tail -12
