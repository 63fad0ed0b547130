#!/usr/bin/env bash
# H200 truth of issue 28, one device call (one GPU): bench/h200/whole_run.py's points, several processes at once.
# The device runs a copy of the lead's checkout; this session's scripts travel in the ignored folder .gpu_truth
# (src/, bench/, and qlora/ = artidoro/qlora's qlora.py and data/mmlu/zero_shot_mmlu_val.json, never committed),
# the wheels in .whl (../shared/gpu/wheels.sh bitsandbytes==0.50.2 trl==1.16.0 datasets==5.2.0 dill==0.4.1
# multiprocess==0.70.19). From the repository root there:
#   bash .gpu_truth/bench/h200/whole_run.sh ARCHS BUDGET_S DEADLINE_S [ONLY_REGEX] [SKIP_REGEX]
set -u
G=$PWD/.gpu_truth
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$G/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 \
  HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p $OUT/wr
{ nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv; df -h /dev/shm /tmp; free -g; nproc
  python3 -c "import vramscope,torch,transformers,trl,bitsandbytes,peft;print(vramscope.__file__,torch.__version__,transformers.__version__,trl.__version__,bitsandbytes.__version__,peft.__version__)"
} > $OUT/machine.txt 2>&1
# qlora.py's five-shot MMLU files are not in the stored snapshot: the stand-in (whole_run_data.py says how).
python3 -c "import sys; sys.path.insert(0, '$G/bench/h200'); import whole_run_data as w; from pathlib import Path; \
print(w.mmlu_five_shot_standin(Path('$G/qlora/data/mmlu/zero_shot_mmlu_val.json'), Path('$G/qlora/data/mmlu')))" \
  >> $OUT/machine.txt 2>&1
python3 $G/bench/h200/whole_run.py --out $OUT/wr --archs "$1" --budget-s "$2" --deadline-s "$3" --qlora-dir $G/qlora \
  ${4:+--only "$4"} ${5:+--skip "$5"} ${WR_EXTRA:-} > $OUT/wr.log 2>&1
echo "whole_run exit $?"
cat $OUT/machine.txt | head -20
grep -v " start " $OUT/wr.log | tail -45
