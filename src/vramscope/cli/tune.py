"""``vramscope tune --model-dir DIR --seq-len S``: the largest batch that fits, in a few real steps.

Parses and prints: :func:`vramscope.tune.model_dir.tune_model_dir` builds the model as the QLoRA options say and
runs the search on real training steps over random tokens. ``--find-seq-len`` searches the longest sequence for
a fixed ``--batch-size`` instead (up to ``--max-seq-len N``). Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from vramscope.cli.command import add_command_argument, command_argv
from vramscope.cli.common import (
    TUNE_SCHEMA_VERSION,
    CommandError,
    UsageError,
    add_renamed,
    note_renamed,
    one_device,
    plain_number,
    positive_int,
    set_examples,
    shown,
)
from vramscope.cli.recipe import add_recipe_arguments, spec_from_args
from vramscope.cli.tune_command import check_lengths
from vramscope.units import gib, human_fixed


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-dir", metavar="DIR", help="a Hugging Face model folder (config.json and weights); or give '-- COMMAND'"
    )
    parser.add_argument(
        "--seq-len",
        type=positive_int,
        metavar="S",
        help="tokens per sequence (with --find-seq-len: the first length to measure, default 256)",
    )
    parser.add_argument(
        "--find-seq-len",
        dest="max_seq_len",
        action="store_true",
        help="find the longest sequence for --batch-size instead of the largest batch",
    )
    parser.add_argument(
        "--batch-size", type=positive_int, default=1, metavar="B",
        help="with --find-seq-len: the batch size (default 1)",
    )
    parser.add_argument(
        "--target-batch",
        type=positive_int,
        metavar="N",
        help="the effective batch you want: prints the micro-batch and gradient accumulation",
    )
    parser.add_argument(
        "--margin",
        type=_fraction,
        default=0.05,
        metavar="F",
        help="fraction of the memory to keep free at the peak (default 0.05)",
    )
    capacity = parser.add_mutually_exclusive_group()
    add_renamed(
        capacity,
        "--gpu-memory",
        ["--memory-limit"],
        dest="gpu_memory",
        type=_size,
        metavar="SIZE",
        help="pretend the GPU has only this much (e.g. 24GiB; enforced with torch's per-process limit); with "
             "--gpus: the memory of each of the N GPUs, NCCL's share held back",
    )
    capacity.add_argument("--gpu", dest="gpu_memory", type=_gpu_size, metavar="NAME",
                          help="pretend the GPU is this card (RTX-3090, A100-40GB): --gpu-memory of its size")
    parser.add_argument(
        "--start", type=positive_int, default=1, metavar="N", help="the first batch size to measure (default 1)"
    )
    parser.add_argument(
        "--max-batch", type=positive_int, default=4096, metavar="N", help="never try a larger batch (default 4096)"
    )
    add_renamed(
        parser,
        "--max-seq-len",
        ["--max-len"],
        dest="max_len",
        type=positive_int,
        nargs="?",
        action=_MaxSeqLen,
        metavar="N",
        help="with --find-seq-len: never try longer (default: the model's max_position_embeddings)",
    )
    parser.add_argument(
        "--multiple-of",
        type=positive_int,
        default=64,
        metavar="N",
        help="with --find-seq-len: lengths are multiples of this (default 64)",
    )
    parser.add_argument(
        "--max-trials",
        type=positive_int,
        default=5,
        metavar="N",
        help="real steps at most (default 5, with a command 3; usually 3 are needed)",
    )
    parser.add_argument("--trial-steps", type=positive_int, default=2, metavar="N",
                        help="with a command: optimizer steps per trial child (default 2)")
    parser.add_argument("--trial-timeout", type=positive_int, default=900, metavar="S",
                        help="with a command: seconds a trial child may run (default 900)")
    parser.add_argument("--gpus", type=positive_int, metavar="N",
                        help="with a launcher command: rehearse it as rank 0 of N GPUs on this one (fake process "
                             "group) and find the micro-batch per GPU")
    add_renamed(parser, "--devices", ["--device"], dest="device", type=one_device, default=0, metavar="I",
                help="the GPU to run on, by its index as torch counts them (default 0)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_recipe_arguments(parser)
    add_command_argument(parser, "tune by running trial steps of it")  # last: it tracks the flags above
    set_examples(parser,
                 "vramscope tune --model-dir ./llama-2-7b --seq-len 2048 --gpu-memory 24GiB",
                 "vramscope tune --model-dir ./llama-2-7b --find-seq-len --batch-size 4 --max-seq-len 8192",
                 "vramscope tune --gpu RTX-3090 -- trl sft --model_name_or_path Qwen/Qwen2.5-0.5B "
                 "--dataset_name trl-lib/Capybara --use_peft --output_dir out")


class _MaxSeqLen(argparse.Action):
    """``--max-seq-len N``: the longest length ``--find-seq-len`` tries. Bare ``--max-seq-len`` was that
    search's switch until this release: it still switches it on, with the one-line note of a renamed flag."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if values is None and option_string != "--max-seq-len":  # --max-len was never a switch
            parser.error(f"{option_string} needs a length, e.g. --max-seq-len 8192")
        elif values is None:
            note_renamed(namespace, f"{option_string} (the switch)", "--find-seq-len")
            namespace.max_seq_len = True
        else:
            setattr(namespace, self.dest, values)


def _gpu_size(text: str) -> int:
    from vramscope.planner.errors import PlanInputError
    from vramscope.planner.gpus import get_gpu

    try:
        return get_gpu(text).memory_bytes
    except PlanInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _fraction(text: str) -> float:
    try:
        value = float(plain_number(text, "--margin"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--margin is a fraction like 0.05, got {shown(text)}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"--margin must be at least 0 and below 1, got {shown(text)}")
    return value


def _size(text: str) -> int:
    from vramscope.planner.errors import PlanInputError
    from vramscope.planner.gpus import parse_gpu_memory

    try:  # the rule of plan's --gpu-memory: a number without a unit is refused, with what it could mean
        return parse_gpu_memory(text)
    except PlanInputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _check(args: argparse.Namespace) -> dict[str, Any]:
    """Validate what argparse cannot; returns the model's config.json."""
    check_lengths(args)
    model_dir = Path(args.model_dir)
    if not model_dir.is_dir():
        raise UsageError(f"--model-dir {model_dir} is not a folder; give a Hugging Face model folder")
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise UsageError(f"{model_dir} has no config.json; give a Hugging Face model folder")
    from vramscope.planner.errors import PlanInputError
    from vramscope.planner.shapes import load_config_file

    try:  # the planner's one bounded read: a huge file, a JSON list or bad JSON is one line that names the file
        config = load_config_file(config_path)
    except PlanInputError as exc:
        raise UsageError(f"cannot read the model's config.json: {exc}") from None
    if args.max_seq_len:
        if args.target_batch is not None:
            raise UsageError("--target-batch goes with the batch search, not with --find-seq-len")
        start = args.seq_len or 256
        if start < args.multiple_of:
            raise UsageError(f"--seq-len ({start}) must be at least --multiple-of ({args.multiple_of})")
        if args.max_len is not None and args.max_len < start:
            raise UsageError(f"--max-seq-len ({args.max_len}) must be at least the start length ({start})")
    else:
        if args.seq_len is None:
            raise UsageError(
                "--seq-len is required: the tokens per sequence to tune the batch for, e.g. --seq-len 2048"
            )
        if args.max_batch < args.start:
            raise UsageError(f"--max-batch ({args.max_batch}) must be at least --start ({args.start})")
    if args.bits == 8 and args.quant_type != "nf4":
        raise UsageError("--quant-type applies to 4-bit only; drop it or use --bits 4")
    return config


def run(args: argparse.Namespace) -> int:
    argv = command_argv(args)
    if args.gpus is not None:
        if argv is None:
            raise UsageError("--gpus N rehearses a launcher command: vramscope tune --gpus 2 "
                             "-- accelerate launch ...")
        from vramscope.cli.tune_rehearse import run_rehearsal

        return run_rehearsal(args, argv)
    if argv is not None:
        from vramscope.cli.tune_command import run_command

        return run_command(args, argv)
    if args.model_dir is None:
        raise UsageError("--model-dir DIR is required, or the training command after '--' "
                         "(vramscope tune -- python ...)")
    config = _check(args)
    spec = spec_from_args(args)
    from vramscope.tune.cuda import CudaSetupError, claim_device

    try:
        total = claim_device(args.device, args.gpu_memory)
    except CudaSetupError as exc:
        raise (UsageError(str(exc)) if exc.usage else CommandError(str(exc))) from None

    # Libraries print to stdout while loading; keep stdout for the result alone (e.g. for --json | jq).
    with contextlib.redirect_stdout(sys.stderr):
        result = _tune(args, config, spec)
    out = {"schema_version": TUNE_SCHEMA_VERSION, **result.to_dict()}
    out.update(
        model_dir=str(args.model_dir),
        spec=spec.to_dict(),
        device=args.device,
        memory_limit_bytes=args.gpu_memory,
        gpu_total_bytes=total,
    )
    if args.max_seq_len:
        out["batch_size_fixed"] = args.batch_size
    else:
        out["seq_len"] = args.seq_len
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        print(format_result(out))
    return 0


def _tune(args: argparse.Namespace, config: dict[str, Any], spec: Any) -> Any:
    """Run the search for the flags; progress on stderr."""
    from vramscope.tune.model_dir import ModelDirSearch, ModelLoadError, tune_model_dir
    from vramscope.tune.search import NoSizeFitsError, Trial

    def say(text: str) -> None:  # progress goes to stderr, and not at all with --json
        if not args.json:
            print(text, file=sys.stderr, flush=True)

    count = [0]
    noun = "length" if args.max_seq_len else "batch"

    def progress(trial: Trial) -> None:
        count[0] += 1
        if trial.ok and trial.peak_bytes is not None:
            say(f"  trial {count[0]}: {noun} {trial.size}: ok, peak {gib(trial.peak_bytes)} ({trial.seconds:.1f} s)")
        else:
            say(f"  trial {count[0]}: {noun} {trial.size}: out of memory ({trial.error}) ({trial.seconds:.1f} s)")

    request = ModelDirSearch(
        model_dir=str(args.model_dir), spec=spec, config=config, seq_len=args.seq_len, device=args.device,
        max_seq_len=args.max_seq_len, batch_size=args.batch_size, start=args.start, max_batch=args.max_batch,
        max_len=args.max_len, multiple_of=args.multiple_of, margin=args.margin, target_batch=args.target_batch,
        max_trials=args.max_trials, memory_limit_bytes=args.gpu_memory,
    )
    say(f"vramscope tune: loading {args.model_dir} ({_recipe(spec)})")
    try:
        return tune_model_dir(request, on_trial=progress)
    except ModelLoadError as exc:
        raise CommandError(str(exc)) from None
    except NoSizeFitsError as exc:
        raise CommandError(f"{exc}; try --bits 4, a shorter --seq-len or a smaller --lora-r") from None


def _recipe(spec: Any) -> str:
    quant = {4: f"4-bit {spec.quant_type}", 8: "8-bit", 16: "16-bit"}[spec.bits]
    gc = "gradient checkpointing" if spec.gradient_checkpointing else "no checkpointing"
    return f"{quant}, LoRA r={spec.lora_r}, {spec.optim}, {spec.attn}, {gc}"


def format_result(out: dict[str, Any]) -> str:
    """The human summary of a tune result dict (``TuneResult.to_dict()`` plus the run's settings)."""
    seq_mode = out.get("unit") == "seq_len"
    what = "longest sequence" if seq_mode else "largest batch"
    at = f"at batch {out.get('batch_size_fixed')}" if seq_mode else f"at {out.get('seq_len')} tokens"
    lines = [
        f"{what} {at}: {out['size']}"
        + (
            f" (peak {gib(out['peak_bytes'])}, {gib(out['headroom_bytes'])} free of {gib(out['capacity_bytes'])})"
            if out.get("peak_bytes") is not None
            else ""
        ),
        f"  margin kept: {out['margin']:.0%} ({gib(out['margin_bytes'])}); largest that ran at all: "
        f"{out['limit_size']}",
        f"  {len(out['trials'])} trials ({out['ooms']} out of memory), {out['seconds']:.1f} s",
    ]
    if out.get("bytes_per_unit") is not None and out.get("fixed_bytes") is not None:
        unit = "token" if seq_mode else "sample"
        lines.append(
            f"  fitted: {human_fixed(out['bytes_per_unit'])} per {unit} + {human_fixed(out['fixed_bytes'])} fixed; "
            f"with no margin the line allows {out.get('predicted_max')}"
        )
    if out.get("target_batch") is not None:
        lines.append(
            f"  target batch {out['target_batch']}: micro-batch {out['micro_batch']} x "
            f"{out['grad_accum_steps']} gradient accumulation steps = "
            f"{out['micro_batch'] * out['grad_accum_steps']}"
        )
    lines += [f"  note: {n}" for n in out.get("notes", ())]
    return "\n".join(lines)
