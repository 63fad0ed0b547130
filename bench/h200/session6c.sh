#!/usr/bin/env bash
# H200 session 6, call C (one GPU, ~8 min): the 12-block overhead benchmark again, alone on the GPU, on the tree
# with the cheaper step path and the per-hook timing (issue 24); then side by side: the TRL rehearsals of issue 27
# (`tune --gpus 2` behind accelerate FSDP and torchrun; call B's passed a bare --bf16, which TRL 1.16 refuses under
# transformers 5.17), the two gpu tests call B had no time for, and the mixture-of-experts points of issue 28.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 \
  HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false NCCL_NVLS_ENABLE=0
mkdir -p $OUT/bench
git log -1 --format=%H > $OUT/tree.txt; git status --short >> $OUT/tree.txt
timeout -k 10 290 python3 bench/overhead.py --out $OUT/bench --arms none,hf_callback,loop_monitor,run_10hz \
  --min-blocks 12 --max-blocks 12 --budget-s 0 > $OUT/overhead.log 2>&1
echo "overhead exit $? at ${SECONDS}s"; grep -v -i warn $OUT/overhead.log | tail -n 9
left=$((570 - SECONDS))
TRL=$(mktemp -d)
python3 bench/rehearsal_grid.py --trl $TRL > $OUT/trl.commands 2> $OUT/trl-make.log || cat $OUT/trl-make.log
while read -r name cmd; do
  (cd $TRL && timeout -k 10 $((left - 20)) bash -c "$cmd" > $OUT/trl-$name.txt 2>&1; echo "exit $?" >> $OUT/trl-$name.txt) &
done < $OUT/trl.commands
timeout -k 10 $((left - 20)) python3 -m pytest -p no:cacheprovider -m gpu -rA --tb=short -W ignore \
  "tests/test_command_tuner_gpu.py::test_tune_a_trl_sft_command" \
  "tests/test_tuner_eval_gpu.py::test_tune_names_the_evaluation_that_limits_the_batch" > $OUT/gpu-tune.log 2>&1 &
WR_EXTRA="--jobs 3 --gpu-budget-gib 60" OUT=$OUT timeout -k 5 $((left - 10)) bash .gpu_truth/bench/h200/whole_run.sh \
  Qwen1.5-MoE-A2.7B-4L,Mixtral-8x7B-2L 30 $((left - 25)) "MoE|Mixtral" > $OUT/moe.txt 2>&1
echo "moe done at ${SECONDS}s"; tail -n 25 $OUT/moe.txt | cut -c1-300
wait
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/gpu-tune.log | cut -c1-300
for f in $OUT/trl-*.txt; do echo "== $f"; grep -v -i "warn" "$f" | tail -n 25 | cut -c1-300; done
(cd $OUT && tar czf /tmp/session6c.tgz . && find . -mindepth 1 ! -name overhead.json ! -name bench -delete; mv /tmp/session6c.tgz .)
ls -laR $OUT | head
