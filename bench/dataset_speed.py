"""How fast ``plan --dataset`` reads and tokenizes 100k examples on this machine (issue 28: "100k examples in
seconds").

A long-tail dataset (lognormal lengths: median ~120 words, a few thousand words at the tail, as instruction data
has) is written four ways: JSON lines of ``text`` (TRL SFT: + EOS), parquet of ``text``, JSON lines of
``messages`` (through a chat template) and parquet of ``input_ids`` (no tokenizer). The tokenizer is a byte-level
BPE of 16k tokens trained here with ``tokenizers`` on the same words (no hub download), saved as tokenizer.json
with a chat template. Each case runs :func:`vramscope.dataset.dataset_plan_input` in a fresh process (imports
included, as the CLI pays them), ``--repeat`` times, interleaved. Nothing is asserted.

Usage: ``python bench/dataset_speed.py [--rows 100000] [--repeat 3] [--out bench/results]``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, log, write_result

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
CASE_CODE = """
import json, resource, sys, time
t0 = time.perf_counter()
from vramscope.dataset import dataset_plan_input
d = dataset_plan_input(sys.argv[1], sys.argv[2] or None, batch=8, max_length=4096)
seconds = time.perf_counter() - t0
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu = usage.ru_utime + usage.ru_stime  # all threads (the tokenizer's Rust workers too): the load-free cost
from vramscope.dataset.files import locate
from vramscope.dataset.readers import read_rows
t1 = time.perf_counter()
read_rows(locate(sys.argv[1]).files)  # the read alone, a second time (the files are in the page cache)
read_seconds = time.perf_counter() - t1
print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "inside_seconds": d.seconds, "read_seconds": read_seconds,
                  "examples": d.examples,
                  "longest_tokens": d.longest_tokens, "p50_tokens": d.p50_tokens, "p99_tokens": d.p99_tokens,
                  "truncated_examples": d.truncated_examples, "peak_batch": [d.peak_batch_rows, d.peak_batch_seq],
                  "how": d.how}))
"""


def corpus(rows: int, seed: int) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(seed)
    vocab = ["".join(chr(97 + c) for c in rng.integers(0, 26, size=int(n))) for n in rng.integers(2, 10, 20000)]
    zipf = 1.0 / np.arange(1, len(vocab) + 1)
    zipf /= zipf.sum()
    lengths = np.clip(rng.lognormal(np.log(120), 0.9, rows).astype(int), 3, 6000)
    ids = rng.choice(len(vocab), size=int(lengths.sum()), p=zipf)
    texts, at = [], 0
    for n in lengths:
        texts.append(" ".join(vocab[i] for i in ids[at:at + n]))
        at += n
    return texts, vocab


def build(root: Path, rows: int) -> tuple[dict[str, tuple[str, str]], dict[str, int]]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    texts, _ = corpus(rows, 0)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>"]
    tok.train_from_iterator(texts[:20000], trainers.BpeTrainer(vocab_size=16000, special_tokens=specials))
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    folder = root / "tokenizer"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                              "chat_template": TEMPLATE}))
    with open(root / "text.jsonl", "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    pq.write_table(pa.table({"text": texts}), root / "text.parquet")
    with open(root / "messages.jsonl", "w", encoding="utf-8") as f:
        for t in texts:
            cut = len(t) // 3
            f.write(json.dumps({"messages": [{"role": "user", "content": t[:cut]},
                                             {"role": "assistant", "content": t[cut:]}]}) + "\n")
    ids = [enc.ids for enc in tok.encode_batch(texts)]
    pq.write_table(pa.table({"input_ids": ids}), root / "input_ids.parquet")
    totals = {"words": sum(t.count(" ") + 1 for t in texts), "tokens": sum(len(i) for i in ids)}
    return {"jsonl text (TRL SFT + EOS)": (str(root / "text.jsonl"), str(folder)),
            "parquet text (TRL SFT + EOS)": (str(root / "text.parquet"), str(folder)),
            "jsonl messages (chat template)": (str(root / "messages.jsonl"), str(folder)),
            "parquet input_ids (no tokenizer)": (str(root / "input_ids.parquet"), "")}, totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    src = Path(__file__).resolve().parent.parent / "src"
    env = {**os.environ, "PYTHONPATH": str(src) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    load_at_start = list(os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        log(f"writing {args.rows:,} examples four ways and training the tokenizer")
        cases, totals = build(Path(tmp), args.rows)
        log(f"{totals['words']:,} words, {totals['tokens']:,} tokens (BOS and EOS not counted)")
        sizes = {name: os.path.getsize(path) for name, (path, _) in cases.items()}
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in cases}
        for r in range(args.repeat):
            for name, (path, tok) in cases.items():
                done = subprocess.run([sys.executable, "-c", CASE_CODE, path, tok], capture_output=True, text=True,
                                      env=env, timeout=600, check=True)
                runs[name].append(json.loads(done.stdout))
                log(f"repeat {r + 1}: {name}: {runs[name][-1]['seconds']:.2f} s")
    results = []
    for name, reps in runs.items():
        seconds = [x["seconds"] for x in reps]
        results.append({"case": name, "file_bytes": sizes[name], "median_s": statistics.median(seconds),
                        "min_s": min(seconds), "max_s": max(seconds),
                        "median_inside_s": statistics.median(x["inside_seconds"] for x in reps),
                        "median_read_s": statistics.median(x["read_seconds"] for x in reps),
                        "median_cpu_s": statistics.median(x["cpu_seconds"] for x in reps),
                        "examples_per_s": round(args.rows / statistics.median(seconds)),
                        "tokens_per_cpu_s": round(totals["tokens"] / statistics.median(x["cpu_seconds"] for x in reps)),
                        "repetitions": reps})
    versions = {}
    for name in ("tokenizers", "pyarrow", "transformers", "jinja2", "numpy"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    path = write_result(args.out, "dataset_speed", {
        "rows": args.rows, "repeat": args.repeat, "total_words": totals["words"], "total_tokens": totals["tokens"],
        "dataset_versions": versions,
        "what": "plan --dataset's reading and tokenizing, each case in a fresh process (imports included); "
                "seconds are wall time of the process's work, inside_s the time dataset_plan_input reports, "
                "cpu_s the CPU time of all its threads (what an idle machine of one core would take)",
        "load_average_at_start": load_at_start, "load_average_at_end": list(os.getloadavg()),
        "results": results, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }, tiny=False)
    print(path)
    for r in results:
        print(f"{r['case']:36} median {r['median_s']:6.2f} s wall, {r['median_cpu_s']:6.2f} s CPU "
              f"({r['examples_per_s']:,} examples/s)")


if __name__ == "__main__":
    main()
