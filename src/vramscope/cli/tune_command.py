"""``vramscope tune [--find-seq-len] -- <training command>``: tune the user's own command (see
:mod:`vramscope.tune.command`) and print the flag to set, in the command's own spelling."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vramscope.cli.command import SPEC_FIELDS, explicit, read_command
from vramscope.cli.common import TUNE_SCHEMA_VERSION, CommandError, UsageError
from vramscope.commands.errors import HOW_INSTEAD
from vramscope.units import gib

if TYPE_CHECKING:
    from vramscope.tune.command import SearchSettings

# What tune takes when a command cannot be read: the model folder and the recipe as flags.
TUNE_INSTEAD = "tune the model itself with --model-dir DIR --seq-len S (and the recipe flags) instead"

_NOT_WITH_A_COMMAND = ("model_dir", "target_batch", "device", *SPEC_FIELDS)
_SHOWN = {"device": "--devices", "double_quant": "--no-double-quant", "attn": "--attn"}


def check_lengths(args: argparse.Namespace) -> None:
    """``--max-seq-len N`` bounds the length search: alone it would be ignored, so it is refused, with both
    readings (``--seq-len N`` tunes the batch at N tokens, as TRL's ``max_seq_length`` would mean)."""
    if args.max_len is not None and not args.max_seq_len:
        raise UsageError(f"--max-seq-len {args.max_len} is the longest length --find-seq-len tries: add "
                         f"--find-seq-len to find the longest sequence up to {args.max_len}, or give "
                         f"--seq-len {args.max_len} to find the largest batch at {args.max_len} tokens")


def search_settings(args: argparse.Namespace, given: set[str]) -> SearchSettings:
    """The search's settings from tune's flags: one reading for ``tune -- CMD`` and ``tune --gpus N -- CMD``."""
    from vramscope.tune.command import SearchSettings

    return SearchSettings(
        max_seq_len=args.max_seq_len,
        batch_size=args.batch_size if "batch_size" in given else None,
        seq_len=args.seq_len,
        start=args.start,
        max_size=args.max_len if args.max_seq_len else args.max_batch,
        multiple_of=args.multiple_of,
        margin=args.margin,
        max_trials=args.max_trials if "max_trials" in given else 3,  # a command's trial is a fresh run of it
        trial_steps=args.trial_steps,
        timeout_s=float(args.trial_timeout),
    )


def run_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    given = explicit(args)
    clash = [name for name in _NOT_WITH_A_COMMAND if name in given]
    if clash:
        flags = ", ".join(_SHOWN.get(n, "--" + n.replace("_", "-")) for n in clash)
        raise UsageError(f"{flags} do not apply with a command: its own flags set the model and the recipe "
                         "(edit the command instead)")
    check_lengths(args)
    try:
        inputs = read_command(args, argv)
    except UsageError as exc:  # the reading's advice names plan's flags; tune's own way round is another
        raise UsageError(str(exc).replace(HOW_INSTEAD, TUNE_INSTEAD)) from None
    parsed = inputs.parsed
    from vramscope.tune.cuda import cuda_missing

    why = cuda_missing()  # creates no CUDA context: that would take GPU memory from the trials
    if why is not None:
        raise UsageError(f"vramscope tune -- runs trial steps of the command on a CUDA GPU and {why}; "
                         "plan it without a GPU: vramscope plan -- <command>")

    from vramscope.tune.command import CommandTrial, TrialFailed, tune_command
    from vramscope.tune.search import NoSizeFitsError

    noun = "length" if args.max_seq_len else "batch"

    def say(text: str) -> None:
        if not args.json:
            print(text, file=sys.stderr, flush=True)

    count = [0]

    def progress(outcome: CommandTrial, size: int) -> None:
        count[0] += 1
        t = outcome.trial
        if t.ok and t.peak_reserved_bytes is not None:
            phases = outcome.phases
            where = ""
            if phases.eval_reserved is not None and phases.train_reserved is not None:
                where = (f" (train {gib(phases.train_reserved)}, eval {gib(phases.eval_reserved)}: "
                         f"{'evaluation' if phases.phase == 'eval' else 'the training step'} sets it)")
            say(f"  trial {count[0]}: {noun} {size}: ok, peak reserved {gib(t.peak_reserved_bytes)}{where} "
                f"({t.seconds:.0f} s, a fresh run of the command)")
        else:
            say(f"  trial {count[0]}: {noun} {size}: out of memory ({t.error}) ({t.seconds:.0f} s)")

    say(f"vramscope tune: trials of {' '.join(argv[:3])} ... ({parsed.program}, {args.trial_steps} steps each)")
    try:
        with contextlib.redirect_stdout(sys.stderr):
            result = tune_command(parsed, search_settings(args, given), memory_limit_bytes=args.gpu_memory,
                                  on_trial=progress)
    except TrialFailed as exc:
        raise CommandError(str(exc)) from None
    except NoSizeFitsError as exc:
        if "in evaluation" in str(exc):  # the evaluation pass ran out at every size: its own batch is the way out
            raise CommandError(f"{exc}; lower per_device_eval_batch_size, or set eval_accumulation_steps (or "
                               "preprocess_logits_for_metrics) so that the logits leave the GPU") from None
        raise CommandError(f"{exc}; lower the command's length or LoRA rank, or quantize the model") from None
    out: dict[str, Any] = {"schema_version": TUNE_SCHEMA_VERSION, **result.to_dict()}
    out["command"] = inputs.to_dict()
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        print(format_command_result(out))
    return 0


def format_command_result(out: dict[str, Any]) -> str:
    seq_mode = out["unit"] == "seq_len"
    what = "longest sequence" if seq_mode else "largest per-device batch"
    at = f"at batch {out['batch_size']}" if seq_mode else (
        f"at {out['seq_len']} tokens" if out.get("seq_len") else "at the data's own lengths")
    peak = out.get("peak_reserved_bytes")
    lines = [
        f"{what} {at}: {out['size']}" + (f" (peak reserved {gib(peak)} of {gib(out['capacity_bytes'])})"
                                         if peak is not None else ""),
        f"  set: {out['setting']}",
    ]
    if out.get("keep_effective"):
        lines.append(f"  to keep {out['keep_effective']}")
    lines += _phase_lines(out)
    lines.append(f"  {len(out['trials'])} trials ({out['ooms']} out of memory), each a fresh run of the command; "
                 f"margin kept {out['margin']:.0%}")
    lines += [f"  note: {n}" for n in out.get("notes", ())]
    return "\n".join(lines)


def _phase_lines(out: dict[str, Any]) -> list[str]:
    """The phase that limits the answer and the answer's per-phase peaks (when the command evaluates)."""
    limit = out.get("limit")
    if not limit:
        return []
    lines = [f"  limit: {limit['words']}"]
    peaks = out.get("phase_peaks") or {}
    shown = [f"{name} {gib(p['peak_reserved_bytes'])}" for name, p in
             (("training step", peaks.get("train") or {}), ("evaluation", peaks.get("eval") or {}))
             if p.get("peak_reserved_bytes") is not None]
    if shown:
        lines.append(f"  peak reserved at {out['size']}: " + ", ".join(shown))
    return lines
