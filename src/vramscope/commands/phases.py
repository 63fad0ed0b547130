"""What a pasted command says about its whole run, as the planner's :class:`~vramscope.planner.phases.RunPhases`.

The command reader records the trainer, its lengths and the evaluation settings (:mod:`vramscope.commands.types`);
this is the one place that turns them into the phases the planner plans. A field the command leaves unsaid keeps
the planner's default, which is the program's own (HF Trainer, TRL 1.16).
"""

from __future__ import annotations

from typing import Any

from vramscope.commands.types import ParsedCommand
from vramscope.planner.phases import GRPO_COMPLETION, RunPhases
from vramscope.trainers import trainer_of_kind

HF_EVAL_BATCH = 8  # TrainingArguments.per_device_eval_batch_size's default


def run_phases(command: ParsedCommand) -> RunPhases:
    """The phases ``command`` runs: its trainer (with its lengths) and, when it evaluates, its evaluation."""
    settings = command.trainer
    # The kind's row of the trainers' table (``Trainer.kinds``): "pretrain" is a supervised step, and ORPO (chosen
    # and rejected in one forward of 2b rows, no reference model) is closest to DPO with the reference precomputed.
    trainer = trainer_of_kind(settings.kind)
    fields: dict[str, Any] = {"trainer": trainer.name, "grad_accum": command.grad_accum}
    if settings.kind in trainer.kinds_without_reference:
        fields["precompute_ref"] = True
    elif settings.precompute_ref_log_probs:
        fields["precompute_ref"] = trainer.reference
    if trainer.generates:
        completion = settings.max_completion_length or GRPO_COMPLETION
        if settings.max_prompt_length is not None:
            fields["max_prompt_len"] = settings.max_prompt_length
        elif command.seq_len and command.seq_len > completion:
            # The reader's length is prompt + completion (a row of the policy step): the prompt is the rest.
            fields["max_prompt_len"] = command.seq_len - completion
        if settings.max_completion_length is not None:
            fields["max_completion_len"] = settings.max_completion_length
        if settings.num_generations is not None:
            fields["num_generations"] = settings.num_generations
        if settings.generation_batch_size is not None and command.batch_size:
            fields["steps_per_generation"] = max(1, settings.generation_batch_size // command.batch_size)
        if settings.beta is not None:
            fields["beta"] = settings.beta
    evaluation = command.eval
    if evaluation.evaluates:
        fields["eval_batch"] = evaluation.per_device_eval_batch_size or HF_EVAL_BATCH
        # A pasted command cannot say whether its script passes compute_metrics: loss only, unless it says so.
        fields["eval_logits"] = "none"
        if evaluation.eval_accumulation_steps is not None:
            fields["eval_accumulation_steps"] = evaluation.eval_accumulation_steps
    if command.launch.world_size:
        fields["world_size"] = command.launch.world_size
    return RunPhases(**fields)
