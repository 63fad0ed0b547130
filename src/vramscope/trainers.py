"""The trainers a run can have, one typed record each: what the planner, the command readers, the dataset reading
and the CLI ask of a trainer, read by its fields and never by comparing its name.

:data:`TRAINERS` holds the planner's trainers (``sft``, and TRL's ``dpo``, ``grpo``, ``reward``, ``kto``): a
row says how its step is planned (its rows per example, its head, its reference model, its generation), which
config class its advice is written in, how it reads a dataset and which command readers' kinds plan as it.
:data:`TOKENIZATIONS` holds the ways a trainer turns an example into tokens (:mod:`vramscope.dataset`'s words:
``sft``, ``hf``, ``dpo``, ``grpo``), which a trainer's ``dataset`` and a framework's ``dataset_trainer`` name.

Pure data, on the bottom floor: ``dataset/`` (floor 7), ``planner/`` (9), ``commands/`` (10) and ``cli/`` all
read it, so it sits below the lowest of them. :func:`registered` adds a trainer for a while (the tests' way).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Tokenization:
    """How a trainer turns an example into tokens (TRL 1.16's dataset preparation, or the HF Trainer's usual map).

    Attributes:
        name: the key (``DatasetLengths.trainer``, ``plan --json``'s ``dataset.trainer``).
        label: the first words of the reading's ``how`` ("TRL SFT").
        trl: TRL prepares the dataset (its rules for padding_free apply).
        eos: EOS is appended to plain text (a completion, an answer).
        pairs: chosen and rejected, every pair's two rows padded together (TRL's DPOTrainer: no packing and no
            padding_free).
        prompts: the prompts alone; the completions are generated, so ``max_length`` does not cut them.
    """

    name: str
    label: str
    trl: bool
    eos: bool
    pairs: bool = False
    prompts: bool = False


TOKENIZATIONS: dict[str, Tokenization] = {t.name: t for t in (
    Tokenization("sft", "TRL SFT", trl=True, eos=True),
    Tokenization("hf", "HF Trainer", trl=False, eos=False),
    Tokenization("dpo", "TRL DPO", trl=True, eos=True, pairs=True),
    Tokenization("grpo", "TRL GRPO", trl=True, eos=False, prompts=True),
)}
DEFAULT_TOKENIZATION = "sft"
"""What the rest of a dataset is read as where neither the run nor the columns say."""
PAIRS_TOKENIZATION = "dpo"
"""What chosen/rejected columns are read as where the run asks for no reading of pairs of its own."""
PROMPTS_TOKENIZATION = "grpo"
"""What a column of prompts alone is read as, likewise."""


@dataclass(frozen=True)
class Trainer:
    """One trainer: what its step is made of, the config its settings go in, how it reads a dataset.

    Attributes:
        name: ``plan --trainer``'s word and ``RunPhases.trainer``.
        summary: a word or two ``--trainer``'s help adds ("no vLLM").
        trl_step: the step is TRL's trainer's own, planned with TRL's dtypes and fused LM head whatever framework
            the recipe names (False: the recipe's framework's supervised step, HF Trainer or SFTTrainer, whose
            own batch and length advice stands).
        rows_per_example: rows of the step per example of the batch (chosen and rejected stacked: 2).
        score_head: a ``Linear(h, 1)`` score head in place of the LM head (a reward model): no vocabulary-sized
            logits.
        generates: the run generates completions (GRPO without vLLM): a generation phase, and an evaluation that
            generates; the step's rows are prompt + completion long.
        reference: a reference model (the adapter switched off) scores each step's rows, or once before training
            (``precompute_ref_log_probs``).
        kl_batch: a mismatched KL batch through the policy, no grad (KTO's ``loss_type="kto"``).
        config: TRL's config class its settings are written in (None: the style's own, TrainingArguments or
            SFTConfig).
        step_note: the training phase's note; ``{rows}``, ``{seq}`` and ``{batch}`` are the step's.
        dataset: the :data:`TOKENIZATIONS` row a dataset is read as for its run (None: the framework's
            ``dataset_trainer``).
        label: the first words of a dataset's reading for its run, where the reading is another trainer's (a
            reward run reads DPO's pairs); None: the reading's own.
        kinds: the command readers' trainer kinds (``commands.types.TrainerKind``) planned as this trainer.
        kinds_without_reference: of those, the kinds with no reference model, planned with the reference
            precomputed (ORPO, until a trainer of its own plans it).
    """

    name: str
    summary: str = ""
    trl_step: bool = True
    rows_per_example: int = 1
    score_head: bool = False
    generates: bool = False
    reference: bool = False
    kl_batch: bool = False
    config: str | None = None
    step_note: str = ""
    dataset: str | None = None
    label: str | None = None
    kinds: tuple[str, ...] = ()
    kinds_without_reference: tuple[str, ...] = ()


TRAINERS: dict[str, Trainer] = {t.name: t for t in (
    Trainer("sft", trl_step=False, kinds=("sft", "pretrain")),
    Trainer("dpo", rows_per_example=2, reference=True, config="DPOConfig", dataset="dpo",
            step_note="DPO: chosen and rejected together, one forward of {rows} rows x {seq} tokens",
            kinds=("dpo", "orpo"), kinds_without_reference=("orpo",)),
    Trainer("grpo", summary="no vLLM", generates=True, config="GRPOConfig", dataset="grpo",
            step_note="the loss step: {batch} completions of prompt + completion = {seq} tokens through the fused "
                      "head", kinds=("grpo",)),
    Trainer("reward", rows_per_example=2, score_head=True, config="RewardConfig", dataset="dpo", label="TRL reward",
            step_note="RewardTrainer: chosen and rejected as one forward of 2 x batch rows, a Linear(h, 1) score "
                      "head: no vocabulary-sized logits", kinds=("reward",)),
    Trainer("kto", reference=True, kl_batch=True, config="KTOConfig", label="TRL KTO",
            step_note="KTO: one forward of the batch", kinds=("kto",)),
)}
DEFAULT_TRAINER = "sft"
"""A run that names no trainer (``RunPhases()``), and a command whose kind no row plans (PPO)."""

_COUNTS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def trainer_of_kind(kind: str) -> Trainer:
    """The trainer a command reader's kind plans as (``Trainer.kinds``); the default one for a kind no row has."""
    return next((t for t in TRAINERS.values() if kind in t.kinds), TRAINERS[DEFAULT_TRAINER])


def reading_trainer(tokenization: str) -> Trainer | None:
    """The trainer a dataset read as ``tokenization`` implies where the run names none (pairs: DPO; prompts alone:
    GRPO); None where the reading implies no trainer of its own (SFT's, the HF Trainer's)."""
    return next((t for t in TRAINERS.values() if t.dataset == tokenization), None)


def trainer_help() -> str:
    """``plan --trainer``'s help: each trainer, the default marked, and which are TRL's."""
    listed = [f"{name} ({'default' if name == DEFAULT_TRAINER else t.summary})"
              if name == DEFAULT_TRAINER or t.summary else name for name, t in TRAINERS.items()]
    trl = [name for name, t in TRAINERS.items() if t.trl_step]
    if trl and list(TRAINERS)[-len(trl):] == trl:
        whose = f"the last {_COUNTS[len(trl)] if len(trl) < len(_COUNTS) else len(trl)} are TRL's"
    else:
        whose = f"{', '.join(trl)} are TRL's"
    return f"the trainer: {', '.join(listed)}; {whose}"


def _check(trainer: Trainer) -> None:
    """A trainer names only readings the table has, and no command kind another trainer plans already."""
    if trainer.rows_per_example < 1:
        raise ValueError(f"trainer {trainer.name!r}: rows_per_example must be at least 1")
    if trainer.dataset is not None and trainer.dataset not in TOKENIZATIONS:
        raise ValueError(f"trainer {trainer.name!r} reads its data as {trainer.dataset!r}, which is no tokenization")
    if not set(trainer.kinds_without_reference) <= set(trainer.kinds):
        raise ValueError(f"trainer {trainer.name!r}: kinds_without_reference must be among its kinds")
    for kind in trainer.kinds:
        owner = next((o.name for o in TRAINERS.values() if o is not trainer and kind in o.kinds), None)
        if owner is not None:
            raise ValueError(f"trainer {trainer.name!r} names the kind {kind!r}, which {owner!r} plans already")


@contextlib.contextmanager
def registered(*trainers: Trainer) -> Iterator[None]:
    """The table with ``trainers`` in it for the ``with`` block (one with a name the table has replaces that row),
    then as before.

    Raises:
        ValueError: a trainer naming a reading the table has not, or a command kind another row plans.
    """
    before = dict(TRAINERS)
    try:
        TRAINERS.update({t.name: t for t in trainers})
        for trainer in (*trainers, *TRAINERS.values()):  # the new rows first: the refusal names them
            _check(trainer)
        yield
    finally:
        TRAINERS.clear()
        TRAINERS.update(before)


for _trainer in TRAINERS.values():
    _check(_trainer)
