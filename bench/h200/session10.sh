#!/usr/bin/env bash
# H200 session 10 (one GPU, ~5 min): the gpu-marked tests of what this landing changed on the GPU path, in three
# processes at once: tune -- CMD and tune --gpus N (the search's settings now one SearchSettings; the rehearsal
# reading the command through the launcher's one reader), the rehearsal of torchrun and accelerate FSDP2.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 \
  HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p $OUT/g
cp tree.txt $OUT/g/tree.txt 2>/dev/null
python3 -c "import accelerate, torch, transformers, peft; print('accelerate', accelerate.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)" > $OUT/g/versions.txt 2>&1
A="tests/test_command_tuner_gpu.py"
B="tests/test_rehearse_gpu.py"
C="tests/test_tuner_eval_gpu.py tests/test_tuner_gpu.py"
run() { timeout -k 10 ${LIMIT:-330} python3 -m pytest -p no:cacheprovider -m gpu -rA --tb=short -W ignore --junitxml=$OUT/g/$1.xml ${@:2} > $OUT/g/$1.log 2>&1; echo "$1 exit $? at ${SECONDS}s"; }
run command-tuner $A &
run rehearse $B &
run tuner $C &
wait
grep -hE "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/g/*.log | cut -c1-200
(cd $OUT && tar czf /tmp/session10.tgz g && rm -rf g && mv /tmp/session10.tgz .)
ls -la $OUT
