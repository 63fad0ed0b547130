#!/usr/bin/env bash
# H200 session, part 5 (two GPUs), all of it within about 8.7 minutes:
#   both GPUs, one after the other:
#     1. nvidia-smi, and `vramscope watch --once` on the idle GPUs exactly as a user sees it
#        (watch.txt; for the README), plus one frame of the live dashboard rendered to text and SVG;
#     2. the two-GPU QLoRA DDP job again (after the schema fix: a training process logs only the GPUs
#        its allocator uses), `vramscope report` on rank 0's log (.txt, --json, --html), and a check
#        that prints, for every log the job wrote, its gpu values, rank values and (rank, gpu) pairs;
#   then in parallel:
#     GPU 0: 3. `make demo`'s two commands, with the preinstalled packages (no venv, no setup.sh);
#            4. the tuner comparison on Llama-2-7B, seq 2048, 24 GiB cap;  5. the gpu-marked tests;
#     GPU 1: 6. the six leak-trace scenarios the H200 corpus lacks, as many as the time left allows
#            (--budget-s from the time left: a scenario takes ~85-110 s, so expect 3 or 4 of the 6);
#     and one more `watch --once` + dashboard frame while both GPUs train (watch_busy.*).
# Every step runs under `timeout`: its own limit, or the time left before one deadline (DEADLINE_S,
# default 505 s after the start) when that is less, and a step with too little time left is skipped.
# Results are packed into $OUT/results.tgz after every step (files over 20 MB and checkpoints left
# out), so a step cut short loses nothing already done. Run from the repo root on an nvidia-h200-x2
# machine with the wheels in .whl (run(..., carry=[".whl"], kind="nvidia-h200-x2")).
set -u
START=$(date +%s); END=$((START + ${DEADLINE_S:-505}))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/.site:$PWD/src PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1 NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=${RESULTS:-/tmp/results}; mkdir -p $R/ddp $R/demo $R/tune-7b $R/traces $R/tests $R/logs
CK1=/tmp/vs-tiny1b  # the DDP job's TinyLlama-1.1B random checkpoint, moved out of the pack and reused by the tests
TRACES=hf_leak_eval_logits,hf_clean_eval,clean_curriculum,leak_cache_4mib,clean_fixed,leak_slow_256k

# Atomic (tar to a temporary name, then rename): the GPU 0 and GPU 1 branches pack at the same time.
pack() {
  local tmp=$OUT/.results.$BASHPID.tgz
  (cd $R && find . -type f -size -20M ! -name '*.safetensors' ! -path '*/checkpoint*' ! -path '*/_work/*' -print0 |
    tar czf $tmp --null -T - 2>/dev/null) && mv -f $tmp $OUT/results.tgz
}
say() { echo "=== $1 ($(date +%T), +$(( $(date +%s) - START )) s)"; }
quiet() { grep -v -i "Loading weights\|Writing model\|warnings.warn\|UserWarning\|FutureWarning\|return fn"; }
# tmo WANT: WANT seconds, or the seconds left before the deadline when fewer.
tmo() { local left=$(( END - $(date +%s) )); (( left < $1 )) && echo $left || echo $1; }
# step OUT WANT MIN CMD...: CMD under `timeout` (tmo WANT), stdout+stderr through $FILTER (default
# quiet) appended to OUT; skipped when fewer than MIN seconds are left. How it ended goes to stdout
# (not into OUT, which holds only the command's output).
step() {
  local out=$1 want=$2 min=$3 t t0 rc; shift 3
  t=$(tmo $want)
  if (( t < min )); then echo "-> SKIPPED: $t s left before the deadline, $min needed: $*"; return 99; fi
  t0=$(date +%s)
  timeout -k 10 $t "$@" 2>&1 | ${FILTER:-quiet} >> $out
  rc=${PIPESTATUS[0]}
  echo "-> exit $rc after $(( $(date +%s) - t0 )) s (limit $t s)$( ((rc == 124 || rc == 137)) && echo ': TIMED OUT'): ${*:1:4} ..."
  return $rc
}
# snap NAME: `vramscope watch --once` (NAME.txt, exactly what it prints) and one frame of the live
# dashboard (what `vramscope watch` draws on a 120-column terminal) from 3 readings 1 s apart.
snap() {
  timeout 30 python3 -m vramscope watch --once > $R/$1.txt 2>&1
  COLUMNS=120 timeout 40 python3 - $R/${1}_dashboard <<'EOF' > $R/logs/${1}_dashboard.log 2>&1
import io, sys, time
from rich.console import Console
from vramscope.backends.host import HostBackend
from vramscope.backends.nvml import NvmlBackend
from vramscope.sampling.sampler import Collector, Sampler
from vramscope.tui.dashboard import render
nvml = NvmlBackend()
sampler = Sampler(Collector(nvml=nvml, host=HostBackend(), name_processes=True), [], interval=1.0, history=64)
history = []
for i in range(3):
    if i:
        time.sleep(1.0)
    history.append(sampler.sample_now())
sampler.close()
nvml.close()
console = Console(record=True, width=120, file=io.StringIO(), force_terminal=True, color_system="truecolor")
console.print(render(history, 1.0))
with open(sys.argv[1] + ".txt", "w", encoding="utf-8") as f:
    f.write(console.export_text(clear=False))
console.save_svg(sys.argv[1] + ".svg", title="vramscope watch")
print("wrote", sys.argv[1] + ".txt", ".svg")
EOF
}

# ---- 1. the GPUs, and `vramscope watch --once` as the README shows it
say gpus
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv | tee $R/nvidia-smi.txt
snap watch
echo "--- vramscope watch --once"; cat $R/watch.txt
pack

# ---- 2. the two-GPU DDP job; then rank 0's report and the (rank, gpu) check of every log it wrote
say ddp
step $R/logs/ddp.log 150 60 torchrun --standalone --nproc_per_node 2 bench/ddp_qlora.py --out $R/ddp
tail -n 22 $R/logs/ddp.log
rm -rf $CK1
if [ -f $R/ddp/checkpoint/config.json ] && ls $R/ddp/checkpoint/*.safetensors >/dev/null 2>&1; then
  mv $R/ddp/checkpoint $CK1  # 2 GiB of random weights: not a result, but the tuner tests can reuse it
fi
rm -rf $R/ddp/checkpoint
pack
say ddp-report
L0=$R/ddp/ddp_memory.csv
if [ -f $L0 ]; then
  COLUMNS=120 FILTER=cat step $R/ddp/report_rank0.txt 30 10 python3 -m vramscope report $L0
  FILTER=cat step $R/logs/ddp_report_json.log 30 10 sh -c "python3 -m vramscope report $L0 --json --html $R/ddp/report_rank0.html > $R/ddp/report_rank0.json"
  [ -f $R/ddp/ddp_memory.rank1.csv ] &&
    COLUMNS=120 FILTER=cat step $R/ddp/report_rank1.txt 30 10 python3 -m vramscope report $R/ddp/ddp_memory.rank1.csv
  FILTER=cat step $R/ddp/rank_gpu_check.txt 30 5 python3 - $R/ddp <<'EOF'
import collections, csv, json, re, sys
from pathlib import Path

# Every log the DDP job wrote (rank 0: ddp_memory.csv, rank k: ddp_memory.rank<k>.csv), not its
# analysis or warnings. Under torchrun with both GPUs visible, rank k trains on GPU k (NVML index k).
folder = Path(sys.argv[1])
logs = sorted(p for p in folder.iterdir() if p.suffix in (".csv", ".jsonl") and ".warnings" not in p.name)
bad = 0
for path in logs:
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    else:
        rows = [json.loads(line) for line in path.open(encoding="utf-8") if line.strip()]

    def val(row, key):
        v = row.get(key)
        return "" if v is None else str(v)

    own = re.search(r"\.rank(\d+)\.", path.name)
    file_rank = own.group(1) if own else "0"
    gpus = sorted({val(r, "gpu") for r in rows})
    ranks = sorted({val(r, "rank") for r in rows})
    pairs = collections.Counter((val(r, "rank"), val(r, "gpu")) for r in rows)
    print(f"{path.name}: {len(rows)} rows; gpu values {gpus}; rank values {ranks}")
    print("  (rank, gpu) pairs: " + ", ".join(f"({r or '-'}, {g or '-'}) x{n}" for (r, g), n in sorted(pairs.items())))
    odd = [r for r in rows if val(r, "rank") != val(r, "gpu")]
    for r in odd[:6]:
        print(f"  ODD: rank {val(r, 'rank') or '-'} row for GPU {val(r, 'gpu') or '-'} "
              f"(step {val(r, 'step') or '-'}, phase {val(r, 'phase') or '-'})")
    if len(odd) > 6:
        print(f"  ... {len(odd) - 6} more odd rows")
    foreign = sorted(set(ranks) - {file_rank}) if own else []  # rank k's own file holds only rank k
    if foreign:
        print(f"  ODD: rank {file_rank}'s log holds rows of rank(s) {foreign}")
    bad += bool(odd) or bool(foreign)
if not logs:
    print(f"no log in {folder}")
print("CHECK " + ("FAIL: some rows are for a GPU their rank does not use" if bad or not logs
                  else "OK: every row's GPU is its own rank's GPU"))
EOF
  cat $R/ddp/rank_gpu_check.txt
else
  echo "no $L0: the DDP job wrote no log"
fi
pack

# ---- 3-5 on GPU 0
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  say "demo (make demo's two commands)"
  # The Makefile's demo target, with the preinstalled python3 for .venv/bin/{vramscope,python}:
  #   vramscope run --log out/demo_memory.csv -- python examples/train_tiny_lora.py
  #   vramscope report out/demo_memory.steps.csv
  # Unfiltered and without TRANSFORMERS_VERBOSITY: the output a user of `make demo` sees.
  FILTER=cat step $R/demo/run.txt 150 60 env -u TRANSFORMERS_VERBOSITY \
    python3 -m vramscope run --log $R/demo/demo_memory.csv -- python3 examples/train_tiny_lora.py
  tr '\r' '\n' < $R/demo/run.txt | grep -v '^ *[0-9]*%|\|^ *$' | tail -n 12
  FILTER=cat step $R/demo/report.txt 30 10 python3 -m vramscope report $R/demo/demo_memory.steps.csv
  cat $R/demo/report.txt
  FILTER=cat step $R/logs/demo_html.log 30 10 python3 -m vramscope report $R/demo/demo_memory.steps.csv --html $R/demo/demo_report.html
  pack

  say "tune 7B"
  # /dev/shm when it has room for the 13.5 GB checkpoint (containers often give it 64 MiB), else /tmp.
  local ck=/dev/shm/vs-tune7b free
  free=$(df -P -B1G /dev/shm 2>/dev/null | awk 'NR==2 {print $4}')
  (( ${free:-0} >= 20 )) || ck=/tmp/vs-tune7b
  echo "checkpoint dir $ck"
  step $R/logs/tune-7b.log 240 90 python3 bench/tune_compare.py --out $R/tune-7b --model Llama-2-7B \
    --seq-len 2048 --memory-limit 24GiB --checkpoint-dir $ck
  tail -n 22 $R/logs/tune-7b.log
  rm -rf $ck
  pack

  say gpu-tests
  local reuse=""
  [ -f $CK1/config.json ] && reuse=VRAMSCOPE_TEST_CHECKPOINT=$CK1
  echo "tests ${reuse:-write their own TinyLlama checkpoint}"
  FILTER=cat step $R/logs/gpu-tests.log 150 40 env $reuse python3 -m pytest -q -p no:cacheprovider -m gpu \
    --continue-on-collection-errors --durations=8 --junitxml=$R/tests/gpu-tests.xml tests
  tail -n 30 $R/logs/gpu-tests.log
  rm -rf $CK1
  pack
}

# ---- 6 on GPU 1
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  say traces
  # record_traces starts no scenario after --budget-s, counted from just after `import torch` (the
  # model setup counts); 115 s of the step's limit are left for the last one started (~85-100 s) and
  # the imports, so it ends inside the limit instead of being cut short.
  local t; t=$(tmo 500)
  step $R/logs/traces.log 500 150 python3 bench/record_traces.py --out $R/traces --steps 220 \
    --budget-s $(( t - 115 )) --only $TRACES
  tail -n 12 $R/logs/traces.log
  echo "traces with a truth file (complete): $(cd $R/traces && ls *.truth.json 2>/dev/null | sed 's/.truth.json//' | tr '\n' ' ')"
  pack
}

say parallel
gpu0 > $R/logs/gpu0.log 2>&1 &
P0=$!
gpu1 > $R/logs/gpu1.log 2>&1 &
P1=$!
# While both GPUs train (GPU 0: the 7B tuner comparison, GPU 1: the traces): what `watch` shows then.
( sleep 120; (( $(tmo 60) >= 60 )) && snap watch_busy ) > $R/logs/watch_busy.log 2>&1 &
P2=$!
wait $P0 $P1 $P2
pack

echo "----- GPU 0"; tail -n 85 $R/logs/gpu0.log
echo "----- GPU 1"; tail -n 20 $R/logs/gpu1.log
echo "----- watch while training"; cat $R/watch_busy.txt 2>/dev/null
echo "----- DDP check"; head -n 30 $R/ddp/rank_gpu_check.txt 2>/dev/null
echo "----- results"; (cd $R && du -sh * 2>/dev/null | tr '\n\t' '  '); echo; ls -l $OUT
say done
