"""``vramscope plan``: predict a QLoRA/LoRA run's peak GPU memory before it starts.

A thin wrapper over :func:`vramscope.planner.plan`: parse, plan, print (a table, or ``--json``).
``--calibrate`` runs a few tiny real steps on the GPU and refits the per-token terms first.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from vramscope.cli import command as training_command
from vramscope.cli import plan_gpus, plan_phases
from vramscope.cli.common import CommandError, UsageError, positive_int, set_examples
from vramscope.cli.labels import breakdown_labels, totals_lines
from vramscope.cli.plan_dataset import add_dataset_arguments, fallback_line, format_dataset, read_dataset
from vramscope.cli.plan_trace import add_trace_arguments, run_trace
from vramscope.cli.recipe import add_recipe_arguments, spec_from_args
from vramscope.commands import phases as command_phases
from vramscope.planner import PlanInputError, load_config_file, plan, registry
from vramscope.planner.api import Plan
from vramscope.planner.document import CommandSection, dataset_failure, plan_document
from vramscope.planner.memory import OPTIMIZERS
from vramscope.planner.phases import GRPO_COMPLETION, RunPhases
from vramscope.planner.settings import style_of
from vramscope.trainers import TOKENIZATIONS, TRAINERS, reading_trainer
from vramscope.units import gib

if TYPE_CHECKING:
    from vramscope.dataset import DatasetLengths


def register(parser: argparse.ArgumentParser) -> None:
    model = parser.add_mutually_exclusive_group()
    model.add_argument("--model", metavar="NAME",
                       help="a registry name or hub id, e.g. Llama-2-7B, meta-llama/Llama-2-7b-hf (see --list-models)")
    model.add_argument("--config", metavar="PATH", help="a Hugging Face config.json (or its directory)")
    model.add_argument("--list-models", action="store_true", help="print the registry's model names and exit")
    parser.add_argument("--batch-size", type=positive_int, metavar="B", help="micro-batch size (required)")
    parser.add_argument("--seq-len", type=positive_int, metavar="S", help="tokens per sequence (required)")
    add_recipe_arguments(parser, optimizers=OPTIMIZERS)
    gpu = parser.add_mutually_exclusive_group()
    gpu.add_argument("--gpu-memory", metavar="SIZE",
                     help="GPU memory to fit in, with its unit: 24GiB, 80GB, or nvidia-smi's 24564MiB")
    gpu.add_argument("--gpu", metavar="NAME",
                     help="a GPU by name: RTX-4090, A100-80GB, or as nvidia-smi names it ('NVIDIA GeForce RTX 3090')")
    parser.add_argument("--target-batch", type=positive_int, metavar="N",
                        help="effective batch to reach by gradient accumulation (needs --gpu-memory or --gpu)")
    parser.add_argument("--calibrate", action="store_true",
                        help="run a few tiny real steps on this machine's GPU to fit the per-token terms")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    plan_gpus.add_arguments(parser)
    plan_phases.add_arguments(parser)
    add_trace_arguments(parser)
    add_dataset_arguments(parser)
    training_command.add_command_argument(parser, "plan without running it")  # last: it tracks the flags above
    set_examples(parser,
                 "vramscope plan --model Llama-2-7B --batch-size 4 --seq-len 2048 --gpu RTX-4090",
                 "vramscope plan --model Llama-2-13B --batch-size 2 --seq-len 4096 --gpus 2 --strategy fsdp",
                 "vramscope plan --gpu-memory 24GiB -- trl sft --model_name_or_path Qwen/Qwen2.5-0.5B "
                 "--dataset_name trl-lib/Capybara --use_peft --output_dir out")


def run(args: argparse.Namespace) -> int:
    if args.list_models:
        for name in registry.names():
            print(f"{name:16} {registry.source(name)}")
        return 0
    argv = training_command.command_argv(args)
    command = None if argv is None else training_command.read_command(args, argv)
    if command is not None:
        command = training_command.apply_to_plan_args(args, command)
        training_command.apply_dataset(args, command)  # the command's own local data, as --dataset would
    elif args.model is None and args.config is None:
        raise UsageError("one of the arguments --model --config --list-models or '-- COMMAND' is required")
    # With --dataset, --seq-len is the truncation (max_length), and none means the trainer does not truncate.
    sizes = [("--batch-size", args.batch_size)] + ([] if args.dataset else [("--seq-len", args.seq_len)])
    missing = [flag for flag, value in sizes if value is None]
    if missing:
        raise UsageError(f"{' and '.join(missing)} required, e.g. --batch-size 4 --seq-len 2048")
    multi = plan_gpus.wanted(args)
    step_alone = "--trace" if getattr(args, "trace", False) else "--gpus" if multi else None
    data, data_failed = _dataset(args, command, step_alone is not None)
    if command is not None and not args.dataset and command.parsed.dataset.names:
        # The command names its data, but not as a local path or a hub id: say it was not read, once.
        names = command.parsed.dataset.names
        args.dataset = names[0]
        pathlike = names[0].startswith((".", "/", "~")) or names[0].endswith("/")
        data_failed = (f"{names[0]}: no such file or folder" if pathlike else
                       f"{', '.join(names)}: not a local path, nor a hub id (owner/name) to look up in the local "
                       "cache; pass --dataset PATH before '--' to plan at the data")
    if command is not None:
        command = _with_data(command, data, step_alone)
    try:
        model: Any = args.model if args.model is not None else load_config_file(args.config)
        spec = command.spec if command is not None else spec_from_args(args)
        if getattr(args, "trace", False):
            plan_phases.refuse_phases(args, "--trace")
            if command is not None and not args.json:
                print(training_command.format_command(command) + "\n")
            _print_dataset(args, data, data_failed)
            return _trace(args, model, spec, multi, None if command is None else _command_section(command, [], None),
                          _dataset_json(args, data, data_failed))
        if multi:
            plan_phases.refuse_phases(args, "--gpus")
        hardware = None
        if args.calibrate:
            from vramscope.tune.calibrate import CalibrationError, calibrate

            try:
                hardware, report = calibrate(model, spec)
            except CalibrationError as exc:
                raise CommandError(str(exc)) from None
            if not args.json:
                print(report, file=sys.stderr)
        run_phases = _eval_at_data(plan_phases.run_phases_from_args(
            args, base=None if command is None or multi else command_phases.run_phases(command.parsed)), data)
        # advice in the command's own keys, keeping its accumulation (same effective batch)
        style = None if command is None else style_of(command.parsed.program, command.spec.framework)
        result = plan(model, args.batch_size, args.seq_len, spec, gpu_memory=args.gpu_memory, gpu=args.gpu,
                      target_batch=args.target_batch, hardware=hardware, read_from_command=command is not None,
                      run=run_phases, style=style, grad_accum=1 if command is None else command.parsed.grad_accum)
        others = [] if command is None else training_command.alternative_plans(
            command, args, model,
            lambda alt, seq: plan(model, args.batch_size, seq or args.seq_len, alt, gpu_memory=args.gpu_memory,
                                  gpu=args.gpu, hardware=hardware, read_from_command=True, run=run_phases),
            lambda alt, n: _per_gpu(model, alt, args, hardware, n))
    except PlanInputError as exc:
        inferred = getattr(args, "trainer_from_data", None)
        why = (f" ({args.dataset} was planned as {inferred.upper()} because of its columns; --dataset-field NAME "
               "tokenizes one column as supervised text instead)" if inferred else "")
        raise UsageError(f"{exc}{why}") from None
    dist, table = plan_gpus.plan_gpus(model, spec, args, hardware) if multi else (None, None)
    if args.json:
        dataset = _dataset_json(args, data, data_failed)
        section = None if command is None else _command_section(command, others, result.gpu_memory_bytes)
        print(plan_document(result, distributed=dist, table=table, command=section, dataset=dataset).dumps())
        return 0
    if command is not None:
        print(training_command.format_command(command) + "\n")
        if others:
            print(training_command.format_alternatives(others, result.gpu_memory_bytes) + "\n")
    _print_dataset(args, data, data_failed)
    print(plan_gpus.format_gpus(result, dist, table) if table is not None else format_plan(result))
    return 0


def _command_section(command: training_command.CommandInputs, others: list[tuple[str, Any, int | None]],
                     capacity: int | None) -> CommandSection:
    """The document's part for a pasted command: its reading, what was assumed, and the other readings."""
    fields = training_command.json_fields(command)
    return CommandSection(command.to_dict(), tuple(fields["assumed"]), tuple(fields["unsupported"]),
                          training_command.alternatives_of(others, capacity))


def _per_gpu(model: Any, spec: Any, args: argparse.Namespace, hardware: Any, gpus: int) -> int:
    """What must fit on the worst GPU of ``gpus`` under the command's strategy (for an alternative reading)."""
    alt = argparse.Namespace(**vars(args))
    alt.gpus, alt.strategy = gpus, args.strategy or "ddp"
    dist, _ = plan_gpus.plan_gpus(model, spec, alt, hardware)
    if dist is None:  # plan_gpus returns one whenever a strategy is given, as here
        raise UsageError(f"cannot plan {gpus} GPUs under {alt.strategy}")
    return int(dist.worst.device_bytes)


def _dataset(args: argparse.Namespace, command: training_command.CommandInputs | None, step_alone: bool
             ) -> tuple[DatasetLengths | None, str | None]:
    """``--dataset``: read it and make the plan's batch its longest batch (``args.batch_size``/``seq_len`` become
    its rows and padded length); a dataset that cannot be read leaves batch x max_length, with the reason.

    The trainer is ``--trainer``, else the pasted command's (a ``trl reward`` run on chosen/rejected pairs stays a
    reward run), else what the columns say (pairs: DPO, prompts alone: GRPO). With ``step_alone`` (``--trace``, or
    several GPUs) the plan is the SFT step alone, so no phase flag is set for it here (both refuse them)."""
    if not args.dataset:
        return None, None
    trainer = _run_trainer(args, command)
    data, why = read_dataset(args, trainer)
    if data is None:
        if args.seq_len is None:
            raise UsageError(f"cannot read the dataset ({why}), and there is no --seq-len to plan at instead")
        return None, why or "unreadable"
    args.batch_size, args.seq_len = data.peak_batch_rows, data.peak_batch_seq
    reading = TOKENIZATIONS[data.trainer]
    # the run's trainer, else the one the reading implies (pairs: DPO; prompts alone: GRPO)
    planned = TRAINERS[trainer] if trainer is not None else reading_trainer(data.trainer)
    if planned is not None and planned.dataset == data.trainer:
        if reading.pairs:
            # The planner's DPO and reward phases stack chosen and rejected themselves: they take the pairs, at
            # the longest's length.
            args.batch_size = max(1, data.peak_batch_rows // planned.rows_per_example)
        if reading.prompts:
            # The data holds the prompts; a row of the policy step is a prompt and its completion.
            args.seq_len = data.peak_batch_seq + _completion(args, command)
        if trainer is None and not step_alone:
            args.trainer = args.trainer_from_data = planned.name
        if reading.prompts and not step_alone and getattr(args, "max_prompt_len", None) is None:
            args.max_prompt_len = data.longest_tokens  # the longest prompt the data holds
    return data, None


def _eval_at_data(run: RunPhases, data: DatasetLengths | None) -> RunPhases:
    """The eval phase's rows at the data's longest example: an eval batch pads its rows to its longest (a packed
    one fills rows of max_length); the training batch's length is no measure of it when that batch is one
    padding-free row of many examples."""
    if data is None or run.eval_batch is None or run.eval_seq is not None or TOKENIZATIONS[data.trainer].prompts:
        return run
    packed = data.batching == "packed" and data.max_length is not None
    return replace(run, eval_seq=data.max_length if packed else data.longest_tokens)


def _run_trainer(args: argparse.Namespace, command: training_command.CommandInputs | None) -> str | None:
    """The trainer the flags or the pasted command name (None: neither does)."""
    if getattr(args, "trainer", None) is not None:
        return str(args.trainer)
    if command is None:
        return None
    return command_phases.run_phases(command.parsed).trainer


def _completion(args: argparse.Namespace, command: training_command.CommandInputs | None) -> int:
    """GRPO's max_completion_length: the flag's, the command's, else TRL's default."""
    given = getattr(args, "max_completion_len", None)
    if given is not None:
        return int(given)
    said = None if command is None else command.parsed.trainer.max_completion_length
    return int(said) if said is not None else GRPO_COMPLETION


def _with_data(command: training_command.CommandInputs, data: DatasetLengths | None, step_alone: str | None
               ) -> training_command.CommandInputs:
    """The command's reading, less the guesses its data answered, plus what a plan of the training step alone
    (``step_alone``: ``--trace``, or ``--gpus`` for a command over several GPUs) leaves out of the run."""
    parsed = command.parsed
    changes: dict[str, Any] = {}
    if data is not None and TOKENIZATIONS[data.trainer].prompts:
        # The prompts were read: their length is no longer a guess, nor worth a second reading.
        changes["assumed"] = tuple(a for a in parsed.assumed if not a.startswith("GRPO prompt length"))
        changes["alternatives"] = tuple(a for a in parsed.alternatives if a.seq_len is None)
    run = command_phases.run_phases(parsed)
    trl_step = TRAINERS[run.trainer].trl_step
    if step_alone is not None and (trl_step or run.eval_batch is not None):
        what = [f"the {run.trainer.upper()} trainer"] if trl_step else []
        what += [f"evaluation at {run.eval_batch} rows"] if run.eval_batch is not None else []
        how = ("--trace traces one SFT training step, without the whole run's phases (plan without --trace has "
               "them)" if step_alone == "--trace" else
               "over several GPUs the plan is one SFT training step per GPU, without the whole run's phases (under "
               "DDP each GPU holds the whole model: plan the command as one process for them)")
        changes["unsupported"] = (*parsed.unsupported, f"{' and '.join(what)}: {how}")
    return replace(command, parsed=replace(parsed, **changes)) if changes else command


def _print_dataset(args: argparse.Namespace, data: DatasetLengths | None, failed: str | None) -> None:
    if args.json:
        return
    if data is not None:
        print(format_dataset(data) + "\n")
    elif failed is not None:
        print(fallback_line(args, failed) + "\n")


def _dataset_json(args: argparse.Namespace, data: DatasetLengths | None, failed: str | None) -> dict[str, Any] | None:
    """``plan --json``'s ``dataset``: the lengths, or why the data was not read and what was planned instead."""
    if not args.dataset:
        return None
    if data is not None:
        return data.to_json()
    return dataset_failure(args.dataset, failed, args.batch_size, args.seq_len)


def _trace(args: argparse.Namespace, model: Any, spec: Any, multi: bool, command: CommandSection | None,
           dataset: dict[str, Any] | None) -> int:
    """``--trace``: the traced step instead of the analytic model (cli/plan_trace.py)."""
    if multi and "gpus" not in training_command.explicit(args):
        raise UsageError(f"the command runs {args.gpus} processes and --trace traces one GPU's step alone: plan it "
                         "without --trace for each GPU's plan")
    if args.calibrate or args.target_batch is not None or multi:
        raise UsageError("--trace traces one GPU's step alone: drop --calibrate, --target-batch and --gpus "
                         "(plan without --trace has them)")
    return run_trace(args, model, spec, command=command, dataset=dataset)


def format_plan(p: Plan) -> str:
    """The plan as a short table for a terminal."""
    s = p.spec
    quant = {4: f"NF4{' + double quant' if s.double_quant else ''}", 8: "LLM.int8", 16: f"{s.compute_dtype} (no quant)"}
    lines = [
        f"{p.model}: {p.total_params / 1e9:.2f}B params, batch {p.batch_size} x {p.seq_len} tokens",
        f"  {quant[s.bits]}, LoRA r={s.lora_r} on {','.join(s.lora_targets) if s.lora_targets else 'all linear'} "
        f"({p.trainable_params / 1e6:.1f}M trainable), {s.optim}, "
        f"gradient checkpointing {'on' if s.gradient_checkpointing else 'off'}, {s.attn}",
        f"  framework {p.framework}: {p.framework_title}",
        *plan_phases.warning_lines(p),
        "",
        f"  breakdown at the peak ({_peak_name(p)}; [{p.framework}] = set by the framework):",
    ]
    labels = breakdown_labels(s.bits, s.compute_dtype, p.moe)
    for name, value in p.breakdown.to_dict().items():
        if value:
            label = labels.get(name, name)
            dtype = (p.from_framework.get(name, "").split() or [""])[0].rstrip(":")
            if name in ("unquantized_params", "lora_weights", "lora_gradients") and dtype:
                label = f"{label} ({dtype})"
            tag = f"  [{p.framework}]" if name in p.from_framework else ""
            lines.append(f"    {label:42} {gib(value):>11}{tag}")
    lines += ["", *totals_lines(p), *_run_allocated_line(p)]
    lines += plan_phases.format_lines(p)
    if p.gpu_memory_bytes is not None:
        verdict = "fits" if p.fits else "does NOT fit"
        lines += ["", f"  {verdict} in {gib(p.gpu_memory_bytes)}; {_limits(p)}"]
        if p.cannot_fit_reason:
            lines.append(f"  why: {p.cannot_fit_reason}")
        if p.target_batch is not None and p.grad_accum_steps is not None:
            lines.append(f"  target batch {p.target_batch}: micro-batch {p.micro_batch_size} x "
                         f"{p.grad_accum_steps} accumulation steps")
    if p.recommendations:
        lines += ["", "  what would fit:" if p.cannot_fit_reason and not p.max_batch_size
                  else "  to use less memory (predicted saving):"]
        for rec in p.recommendations:
            lines.append(f"    - {rec.text}")
            if rec.how:
                lines.append(f"        {rec.how}")
    for note in p.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines)


def _run_allocated_line(p: Plan) -> list[str]:
    """When the phase that needs the most process memory is not the one that allocates the most, the totals above
    (that phase's) are not what ``torch.cuda.max_memory_allocated()`` reads after the run: say which is."""
    if p.run is None:
        return []
    top = max(p.run.phases.values(), key=lambda ph: ph.peak_allocated_bytes)
    if p.max_allocated_bytes <= p.peak_allocated_bytes:
        return []
    return [f"  (the run's largest allocated is the {top.name} phase's, {gib(top.peak_allocated_bytes).strip()}: "
            f"torch.cuda.max_memory_allocated() reads that after the run; the totals are the {p.run_peak_phase} "
            "phase's, which needs the most memory on the GPU)"]


def _peak_name(p: Plan) -> str:
    """The training step's moment, or the run's phase and its moment when another phase sets the peak."""
    if p.run is None or p.run_peak_phase == "train":
        return p.peak_phase
    return f"{p.run_peak_phase}: {p.run.peak.moment}"


def _limits(p: Plan) -> str:
    """``largest batch at 2048 tokens: 3; longest sequence at batch 4: 1570``, in words when nothing fits or the
    sequence stops at the model's context."""
    if not p.max_batch_size:
        load = None if p.run is None else p.run.phases.get("load")
        if load is not None and p.gpu_memory_bytes is not None and load.device_bytes > p.gpu_memory_bytes:
            # loading holds the same at every batch and length
            return "no batch or sequence length fits: loading the model alone overflows the GPU"
        if p.run_peak_phase in ("train", "load"):
            beside = ""
        else:
            beside = f" beside the {p.run_peak_phase} phase as planned"
        return f"no batch fits at {p.seq_len} tokens{beside}" + ("" if p.max_seq_len else ", nor any sequence length")
    seq = (f"up to its {p.max_seq_len}-token context" if p.max_seq_len_at_context
           else str(p.max_seq_len) if p.max_seq_len else "none")
    return f"largest batch at {p.seq_len} tokens: {p.max_batch_size}; longest sequence at batch {p.batch_size}: {seq}"
