"""``vramscope plan --trainer dpo --eval-batch 8 ...``: the whole run's phases, asked for on the command line.

Kept apart from :mod:`vramscope.cli.plan` (which calls :func:`add_arguments`, :func:`run_phases_from_args` and
:func:`format_lines`) so that the single-step output and the phases change independently.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

from vramscope.cli.common import UsageError, positive_int
from vramscope.cli.labels import BREAKDOWN_LABELS
from vramscope.planner.api import Plan
from vramscope.planner.loading import at_moment
from vramscope.planner.phases import EVAL_LOGITS, RunPhases, trainer_of
from vramscope.trainers import TRAINERS, Trainer, trainer_help
from vramscope.units import gib


def _beta(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--beta takes a number such as 0.04, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"--beta must be a finite number, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that describe the run beyond its training step (all optional; none = one SFT step)."""
    g = parser.add_argument_group("the whole run (trainer, evaluation, generation)")
    g.add_argument("--trainer", choices=tuple(TRAINERS), help=trainer_help())
    g.add_argument("--eval-batch", type=positive_int, metavar="N",
                   help="per_device_eval_batch_size: plan an evaluation phase at N rows")
    g.add_argument("--eval-seq-len", type=positive_int, metavar="S",
                   help="the longest padded eval row (default: --seq-len)")
    g.add_argument("--eval-logits", choices=EVAL_LOGITS,
                   help="what evaluation keeps per batch: none (no compute_metrics / prediction_loss_only, the "
                   "default), kept (compute_metrics: fp32 [b, s, V] logits gathered on the GPU), argmax "
                   "(preprocess_logits_for_metrics returns argmax ids)")
    g.add_argument("--eval-accumulation-steps", type=positive_int, metavar="N",
                   help="eval_accumulation_steps: predictions move to the host every N eval batches")
    g.add_argument("--eval-examples", type=positive_int, metavar="N",
                   help="the eval set's size (how many eval batches of predictions pile up)")
    g.add_argument("--grad-accum", type=positive_int, metavar="N",
                   help="gradient_accumulation_steps (GRPO generates for that many micro-batches at once)")
    g.add_argument("--max-prompt-len", type=positive_int, metavar="P",
                   help="GRPO: the longest prompt (default: --seq-len)")
    g.add_argument("--max-completion-len", type=positive_int, metavar="C",
                   help="GRPO: max_completion_length (TRL default 512)")
    g.add_argument("--num-generations", type=positive_int, metavar="G", help="GRPO: completions per prompt (8)")
    g.add_argument("--steps-per-generation", type=positive_int, metavar="N",
                   help="GRPO: micro-batches generated at once (default: --grad-accum)")
    g.add_argument("--beta", type=_beta, metavar="B",
                   help="GRPO: KL weight (TRL 1.16 default 0.0: no reference forward)")
    g.add_argument("--precompute-ref", action="store_true",
                   help="DPO/KTO precompute_ref_log_probs: the reference runs once before training")


_FIELDS = {"trainer": "trainer", "eval_batch": "eval_batch", "eval_seq_len": "eval_seq",
           "eval_logits": "eval_logits", "eval_accumulation_steps": "eval_accumulation_steps",
           "eval_examples": "eval_examples", "grad_accum": "grad_accum", "max_prompt_len": "max_prompt_len",
           "max_completion_len": "max_completion_len", "num_generations": "num_generations",
           "steps_per_generation": "steps_per_generation", "beta": "beta"}


_EVAL_FLAGS = ("eval_seq_len", "eval_logits", "eval_accumulation_steps", "eval_examples")
_GRPO_FLAGS = ("max_prompt_len", "max_completion_len", "num_generations", "steps_per_generation", "beta")


def run_phases_from_args(args: argparse.Namespace, base: RunPhases | None = None) -> RunPhases:
    """The :class:`RunPhases` the flags ask for, over ``base`` (what a pasted command set, when there is one).

    Raises:
        UsageError: a flag that belongs to a phase the run does not have (an eval setting without
            ``--eval-batch``, a GRPO length without ``--trainer grpo``).
    """
    changes = {field: getattr(args, flag) for flag, field in _FIELDS.items() if getattr(args, flag, None) is not None}
    if getattr(args, "precompute_ref", False):
        changes["precompute_ref"] = True
    run = dataclasses.replace(base or RunPhases(), **changes)
    flag = next((f for f in _EVAL_FLAGS if getattr(args, f, None) is not None), None)
    if flag is not None and run.eval_batch is None:
        raise UsageError(f"--{flag.replace('_', '-')} describes the evaluation: add --eval-batch N "
                         "(per_device_eval_batch_size)")
    trainer = trainer_of(run)
    flag = next((f for f in _GRPO_FLAGS if getattr(args, f, None) is not None), None)
    if flag is not None and not trainer.generates:
        raise UsageError(f"--{flag.replace('_', '-')} is a {_who(lambda t: t.generates)}")
    if run.precompute_ref and not trainer.reference:
        raise UsageError(f"--precompute-ref is a {_who(lambda t: t.reference)}")
    return run


def _who(has: Callable[[Trainer], bool]) -> str:
    """"GRPO setting: add --trainer grpo": the trainers a flag belongs to, and how to name one."""
    names = [name for name, t in TRAINERS.items() if has(t)]
    return f"{'/'.join(n.upper() for n in names)} setting: add {' or '.join(f'--trainer {n}' for n in names)}"


def refuse_phases(args: argparse.Namespace, what: str) -> None:
    """``--trace`` and ``--gpus`` plan the training step alone: a phase flag beside them is one line, exit 2."""
    if run_phases_from_args(args) != RunPhases():
        raise UsageError(f"{what} plans the SFT training step alone: drop --trainer, --eval-* and the GRPO flags "
                         f"(plan without {what} has them)")


def warning_lines(p: Plan) -> list[str]:
    """What must be read first (printed under the plan's title)."""
    return [f"  WARNING: {w}" for w in p.warnings]


def format_lines(p: Plan) -> list[str]:
    """The run's phases, one line each, the peak marked; then the events between steps. Empty for a plain SFT
    plan of one step, whose output stays as it was."""
    run = p.run
    if run is None:
        return []
    load = run.phases.get("load")
    quiet_load = load is None or load.peak_allocated_bytes <= run.phases["train"].peak_allocated_bytes
    if set(run.phases) - {"load"} == {"train"} and not TRAINERS[run.trainer].trl_step and quiet_load:
        return []
    lines = ["", f"  the whole run ({run.trainer}), peak allocated per phase:"]
    for name, ph in run.phases.items():
        mark = "  <- peak" if name == run.peak_phase else ""
        shape = f"{ph.rows:>5} x {ph.seq:<6}" if ph.rows else f"{'weights':>14}"  # loading has no batch
        lines.append(f"    {name:15} {shape} {gib(ph.peak_allocated_bytes):>11}  ({at_moment(ph.moment)}){mark}")
        extras = [(k, v) for k, v in ph.breakdown.to_dict().items() if k in ("kv_cache", "eval_predictions") and v]
        for key, value in extras:
            lines.append(f"      {BREAKDOWN_LABELS.get(key, key):40} {gib(value):>11}")
        lines += [f"      {note}" for note in ph.notes]
    lines.append("  between steps:")
    for event in run.events:
        lines.append(f"    {event.name.replace('_', ' ')}: +{gib(event.adds_bytes).strip()}: {event.why}")
    return lines
