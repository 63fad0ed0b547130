"""The local datasets of the whole-run truth (issue 28), written the same way on the H200 and on a CPU.

Every dataset is a folder of JSON lines (``train.jsonl``, and ``test.jsonl`` where the run evaluates), so that
``datasets.load_dataset(folder)`` gives the splits ``train`` and ``test`` and ``vramscope plan --dataset`` can read
the same file afterwards. The generator is committed, not the data: rerun it to plan a point again::

    python bench/h200/whole_run_data.py --out /tmp/wr-data            # every dataset below
    python bench/h200/whole_run_data.py --out /tmp/wr-data --only longtail

Token-id datasets (``input_ids``) hold ids in ``[FIRST_ID, FIRST_ID + WORDS)``, inside every model's vocabulary,
so that a Qwen2 checkpoint (whose tokenizer transformers 5 loads as ``Qwen2Tokenizer``, turning a word-level
vocabulary into nothing) trains on exactly these lengths. Text datasets use the words ``w0 .. w2999`` of the
word-level tokenizer that bench/framework_measure.py writes beside each checkpoint (one token a word).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

WORDS = 3000
FIRST_ID = 4  # after [UNK] [PAD] <s> </s> of the word-level tokenizer

# name -> what it is (the keys of DATASETS)
LONGTAIL_SHORT = (1000, 50, 300)  # examples, shortest, longest
LONGTAIL_LONG = (5, 3000, 6000)


def _ids(rng: random.Random, n: int) -> list[int]:
    return [FIRST_ID + rng.randrange(WORDS) for _ in range(n)]


def _words(rng: random.Random, n: int) -> str:
    return " ".join(f"w{rng.randrange(WORDS)}" for _ in range(n))


def _write(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
            n += 1
    return n


def fixed_ids(folder: Path, seq: int, train: int, test: int, seed: int = 0) -> dict[str, Any]:
    """``train`` and ``test`` rows of exactly ``seq`` token ids (no padding anywhere: batch x seq tokens)."""
    rng = random.Random(seed)
    _write(folder / "train.jsonl", ({"input_ids": _ids(rng, seq)} for _ in range(train)))
    _write(folder / "test.jsonl", ({"input_ids": _ids(rng, seq)} for _ in range(test)))
    return {"format": "input_ids", "train_examples": train, "test_examples": test, "train_lengths": [seq],
            "test_lengths": [seq]}


def longtail(folder: Path, seed: int = 1) -> dict[str, Any]:
    """Most examples short, a few long, shuffled: the longest batch is wherever the sampler puts a long one."""
    rng = random.Random(seed)
    n_short, lo, hi = LONGTAIL_SHORT
    n_long, llo, lhi = LONGTAIL_LONG
    lengths = [rng.randint(lo, hi) for _ in range(n_short)] + [rng.randint(llo, lhi) for _ in range(n_long)]
    rng.shuffle(lengths)
    _write(folder / "train.jsonl", ({"input_ids": _ids(rng, n)} for n in lengths))
    longest = sorted(((n, i) for i, n in enumerate(lengths)), reverse=True)[:n_long]
    return {"format": "input_ids", "train_examples": len(lengths), "train_lengths_summary": _summary(lengths),
            "longest_examples": [{"index": i, "tokens": n} for n, i in longest]}


def dpo_text(folder: Path, prompt: int, chosen: int, rejected: int, rows: int, seed: int = 2) -> dict[str, Any]:
    """Preference pairs (``prompt``/``chosen``/``rejected``, plain text), each part a fixed number of words."""
    rng = random.Random(seed)
    make: Callable[[], dict[str, str]] = lambda: {  # noqa: E731 - one row, read once
        "prompt": _words(rng, prompt), "chosen": _words(rng, chosen), "rejected": _words(rng, rejected)}
    _write(folder / "train.jsonl", (make() for _ in range(rows)))
    return {"format": "prompt/chosen/rejected", "train_examples": rows,
            "words": {"prompt": prompt, "chosen": chosen, "rejected": rejected}}


def grpo_prompts(folder: Path, prompt: int, rows: int, seed: int = 3) -> dict[str, Any]:
    rng = random.Random(seed)
    _write(folder / "train.jsonl", ({"prompt": _words(rng, prompt)} for _ in range(rows)))
    return {"format": "prompt", "train_examples": rows, "words": {"prompt": prompt}}


def qlora_input_output(folder: Path, rows: int, seed: int = 4) -> dict[str, Any]:
    """qlora.py's local format (``input``/``output`` text, dataset_format input-output); lengths in words."""
    rng = random.Random(seed)
    lengths = [(rng.randint(4, 40), rng.randint(50, 700)) for _ in range(rows)]
    _write(folder / "train.jsonl", ({"input": _words(rng, a), "output": _words(rng, b)} for a, b in lengths))
    return {"format": "input/output", "train_examples": rows,
            "input_words_summary": _summary([a for a, _ in lengths]),
            "output_words_summary": _summary([b for _, b in lengths])}


def _summary(xs: list[int]) -> dict[str, Any]:
    s = sorted(xs)
    return {"n": len(s), "min": s[0], "p50": s[len(s) // 2], "p99": s[min(len(s) - 1, int(len(s) * 0.99))],
            "max": s[-1], "mean": round(sum(s) / len(s), 1)}


def mmlu_five_shot_standin(zero_shot_val: Path, out_dir: Path, shots: int = 5) -> dict[str, Any]:
    """qlora.py's --do_mmlu_eval reads data/mmlu/five_shot_mmlu_{val,test}.json; the stored snapshot of
    artidoro/qlora lacks both (only zero_shot_mmlu_val.json is there). A stand-in in the five-shot form: each
    zero-shot question with the ``shots`` next questions of its subject, answered, before it (qlora.py's mmlu-zs
    branch cannot stand in: it drops the ``subject`` column its own callback then reads). test = val (qlora.py
    reads only the split named by --mmlu_split, eval by default)."""
    rows = [json.loads(line) for line in zero_shot_val.open() if line.strip()]
    by_subject: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_subject.setdefault(r["subject"], []).append(r)
    out = []
    for r in rows:
        head, _, question = r["input"].partition("\n\n")
        others = [o for o in by_subject[r["subject"]] if o is not r][:shots]
        examples = "".join(o["input"].partition("\n\n")[2] + " " + o["output"] + "\n\n" for o in others)
        out.append({"subject": r["subject"], "input": f"{head}\n\n{examples}{question}", "output": r["output"]})
    out_dir.mkdir(parents=True, exist_ok=True)
    for split in ("val", "test"):
        (out_dir / f"five_shot_mmlu_{split}.json").write_text("".join(json.dumps(o) + "\n" for o in out))
    return {"questions": len(out), "shots": shots, "source": str(zero_shot_val)}


# name -> writer(folder) -> description; the truth's driver (whole_run.py) names these folders in its commands.
DATASETS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "ids-1024": lambda f: fixed_ids(f, 1024, train=8, test=8),  # 2 x 1024, 4 steps an epoch, eval 2 batches of 4
    "ids-512-eval16": lambda f: fixed_ids(f, 512, train=16, test=16),  # logits kept over 4 eval batches of 4
    "longtail": longtail,
    "dpo-100-300-400": lambda f: dpo_text(f, 100, 300, 400, rows=16),
    "grpo-64": lambda f: grpo_prompts(f, 64, rows=32),
    "qlora-io": lambda f: qlora_input_output(f, rows=1300),  # > eval_dataset_size 1024 after qlora.py's 10% split
}


def write_all(out: Path, only: list[str] | None = None) -> dict[str, Any]:
    described = {}
    for name, writer in DATASETS.items():
        if only and name not in only:
            continue
        described[name] = writer(out / name)
    (out / "datasets.json").write_text(json.dumps(described, indent=1))
    return described


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--only", default=None, help="comma-separated names of DATASETS")
    args = ap.parse_args()
    described = write_all(args.out, args.only.split(",") if args.only else None)
    print(json.dumps(described, indent=1))


if __name__ == "__main__":
    main()
