#!/usr/bin/env bash
# H200 session, part 6 (two GPUs), within about 7.5 minutes:
#   GPU 0: the gpu-marked tests again, with their own TinyLlama checkpoint (part 5 reused the DDP job's
#          and ran out of time after 12 of 13 with one failure), verbose, with the failure's text;
#   GPU 1: the four leak-trace scenarios part 5 had no time for.
# Results packed into $OUT/results.tgz after each branch. Run from the repo root on an nvidia-h200-x2
# machine with the wheels in .whl (run(..., carry=[".whl"], kind="nvidia-h200-x2")).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
R=/tmp/results; mkdir -p $R/traces $R/tests $R/logs
pack() {
  local tmp=$OUT/.results.$BASHPID.tgz
  (cd $R && find . -type f -size -20M -print0 | tar czf $tmp --null -T - 2>/dev/null) && mv -f $tmp $OUT/results.tgz
}
quiet() { grep -v -i "Loading weights\|Writing model\|warnings.warn\|UserWarning\|FutureWarning\|return fn"; }
(
  CUDA_VISIBLE_DEVICES=0 timeout -k 10 400 python3 -m pytest -p no:cacheprovider -m gpu -rA -v --tb=short \
    --durations=8 --junitxml=$R/tests/gpu-tests.xml tests > $R/logs/gpu-tests.log 2>&1
  echo "gpu tests exit $?" >> $R/logs/gpu-tests.log; pack
) &
(
  CUDA_VISIBLE_DEVICES=1 timeout -k 10 420 python3 bench/record_traces.py --out $R/traces --steps 220 --budget-s 330 \
    --only clean_curriculum,leak_cache_4mib,clean_fixed,leak_slow_256k 2>&1 | quiet | tail -40 > $R/logs/traces.log
  pack
) &
wait; pack
echo "----- gpu tests"; grep -v "^tests/.*PASSED$" $R/logs/gpu-tests.log | tail -60
echo "----- traces"; tail -12 $R/logs/traces.log
