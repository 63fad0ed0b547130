"""The records a framework module fills in: what the training program keeps and casts (:class:`Framework`),
how it builds and steps its model (:class:`Build`), and whose keys its users write settings in (:class:`Style`).

Pure data: nothing here imports torch, nor any other module of the package (the framework modules import this).
"""

from __future__ import annotations

from dataclasses import dataclass

# TRL's fused LM head (trl/kernels/chunked_logprob.py) projects TOKEN_TILE tokens x VOCAB_TILE vocabulary
# entries at a time into one reused buffer in the compute dtype, in forward and again in backward.
TOKEN_TILE = 4096
VOCAB_TILE = 32768
# Unsloth offloads checkpoints only for runs of at least this many tokens (below it, ordinary checkpointing).
OFFLOAD_MIN_SEQ = 512

# The breakdown lines whose size depends on the framework (``Plan.framework_components``).
FRAMEWORK_COMPONENTS = ("unquantized_params", "lora_weights", "lora_gradients", "activations", "logits_and_loss",
                        "temporaries")


@dataclass(frozen=True)
class Build:
    """How the program loads, prepares and steps its model, as vramscope reproduces it: for real in
    :mod:`vramscope.tune.qlora` (``tune``, ``plan --calibrate``) and on fake tensors in
    :mod:`vramscope.planner.trace.engine` (``plan --trace``). The step's other choices are the
    :class:`Framework`'s own facts: ``autocast`` (the forward's autocast on a GPU), ``logits`` (``chunked``: TRL's
    fused LM head is installed and called; ``kept``: the step holds its output until the next forward),
    ``adapters_half`` and ``reentrant``.

    Attributes:
        peft_kbit: a quantized base goes through peft's ``prepare_model_for_kbit_training`` (and an unquantized
            one through ``gradient_checkpointing_enable()`` with torch's default, reentrant); otherwise TRL's
            SFTTrainer's way: no preparation, input gradients, non-reentrant checkpointing, and the adapters of a
            quantized model cast to bf16 where ``Framework.adapters_half`` says so.
        casts_back: after the preparation, LoRA, ``embed_tokens`` and ``lm_head`` go back to the compute dtype
            (qlora.py with ``--bf16``).
        trainer: runs under transformers' ``Trainer``: its checkpointing call, ``use_cache=False``, the labels a
            copy of the ids (the collator's), gradients clipped at ``max_grad_norm=1.0``.
        trace_autocast: the trace runs the forward under CUDA's autocast policy (the HF Trainer's ``bf16=True``);
            TRL's bf16 model and adapters leave autocast nothing to cast, so its step is traced without.
        traced: ``plan --trace`` reproduces this step (qlora.py's casts and Unsloth's offloaded checkpoints are
            not reproduced on fake tensors).
    """

    peft_kbit: bool
    trainer: bool
    casts_back: bool = False
    trace_autocast: bool = False
    traced: bool = False


@dataclass(frozen=True)
class Framework:
    """One training program's memory-relevant behaviour.

    Attributes:
        name: ``hf``, ``trl``, ``qlora`` (qlora.py with --bf16), ``unsloth``, ``loop`` or ``loop-loss``.
        title: one line for people.
        prepares_kbit: calls ``prepare_model_for_kbit_training``: every bf16/fp16 parameter that is not
            4-bit (embeddings, norms, lm_head) becomes fp32, so the residual stream is fp32.
        autocast: the forward runs under bf16/fp16 autocast (HF Trainer with ``bf16=True`` through accelerate's
            mixed precision), so every matmul and SDPA sees half-precision inputs (copies of fp32 tensors).
        adapters_half: LoRA weights (and their gradients) are cast to the compute dtype (TRL does for quantized
            models); otherwise peft's ``autocast_adapter_dtype`` keeps them fp32.
        logits: ``dropped`` (the model's output is released before backward: HF Trainer's compute_loss),
            ``kept`` (the caller holds ``out`` with its logits through backward and the next forward), or
            ``chunked`` (TRL's fused LM head: per-token log-probabilities, entropy and top-1 from tiles, never
            the batch x sequence x vocabulary logits), or ``score`` (a reward model's Linear(h, 1) head).
        keeps_kv_cache: with checkpointing off the model builds a DynamicCache (``use_cache`` stays on in train
            mode) and the kept output holds it; TRL and HF Trainer's loss path pass ``use_cache=False`` or drop it.
        reentrant: reentrant gradient checkpointing (peft's own ``gradient_checkpointing_enable({})`` leaves
            torch's default) rather than the non-reentrant kind HF Trainer enables.
        fragmentation: reserved-but-unallocated bytes at the peak per byte of (one layer's saved activations,
            the materialised logits), with and without checkpointing. The caching allocator's splitting is not
            derived; these are fitted to this framework's H200 points (``fit_framework_constants`` in
            bench/planner_accuracy.py reproduces them) and used unless ``Hardware.fragmentation`` is given.
        offloads_checkpoints: with gradient checkpointing on, each layer's input (the checkpoint) is copied to
            pinned host memory as the forward leaves the layer and copied back for its backward (Unsloth's
            ``use_gradient_checkpointing="unsloth"``), from :data:`OFFLOAD_MIN_SEQ` tokens on.
        cuda_context_bytes: the process's GPU memory outside torch's allocator (CUDA context, kernels, cuBLAS
            handles; TRL's and accelerate's extra kernels): the largest NVML process - peak reserved seen on the
            H200 for this framework; used unless ``Hardware.cuda_context_bytes`` is given.
        build: how vramscope builds and steps this program's model (:class:`Build`).
        style: the :class:`Style` (by name) its users write settings in, for a plan's advice.
        summary: a few words for ``--framework``'s help.
        programs: the command readers (``vramscope.commands.dispatch.PROGRAMS``) whose readings plan with this
            framework unless the command says more (:func:`~vramscope.planner.frameworks.registry.
            framework_of_program`; a reader overrides it only then: Unsloth's checkpoints on the host, qlora.py's
            ``--bf16``, an HF script that builds TRL's trainer). Each program is in one framework's; the table
            refuses a second, and ``tests/test_frameworks_registry.py`` holds them to the readers that exist.
        output_dropped: the framework this one becomes when the step keeps only the loss (a loop's
            ``drop_output`` advice), by name; None: this one with ``logits="dropped"``.
        switch_to: the framework a quantized run of this one is advised to switch to (its fused LM head), by name.
        switch_advice: the advice's text when another framework is advised to switch to this one
            (``{saving:.2f}`` is the saving in GiB).
        switch_line: how the user switches to this one, in their own words (a plan's ``how``).
        dtype_advice: the program loads the model in fp32 unless told otherwise: the advice to load it in bf16 when
            the plan's compute dtype is fp32 (``{saving:.2f}`` is the saving in GiB).
        defaults_note: a bf16 plan of a quantized model typed as flags (not read from the command) says this:
            the program's own defaults differ (trl.scripts.sft loads fp32).
        dataset_trainer: how its trainer tokenizes and batches a dataset, in :mod:`vramscope.dataset`'s words
            (``sft``: TRL's SFTTrainer, ``hf``: HF Trainer's), for ``plan --dataset``.
        compute_dtype_only: the one compute dtype this framework is planned in (qlora.py casts back only under
            ``--bf16``); None: any.
        other_dtype_refusal: the planner's one-line refusal of a plan in another compute dtype, saying what to
            plan instead (``{name}`` is this framework's name, ``{only}`` its dtype, ``{dtype}`` the one asked for).
    """

    name: str
    title: str
    prepares_kbit: bool
    autocast: bool
    adapters_half: bool
    logits: str
    keeps_kv_cache: bool
    reentrant: bool
    fragmentation: tuple[float, float, float, float] = (0.615, 0.269, 1.037, 0.026)
    cuda_context_bytes: int = 745 * 1024**2
    offloads_checkpoints: bool = False
    build: Build = Build(peft_kbit=True, trainer=True)
    style: str = "hf"
    summary: str = ""
    programs: tuple[str, ...] = ()
    output_dropped: str | None = None
    switch_to: str | None = None
    switch_advice: str = ""
    switch_line: str = ""
    dtype_advice: str = ""
    defaults_note: str = ""
    dataset_trainer: str = "hf"
    compute_dtype_only: str | None = None
    other_dtype_refusal: str = ("framework {name} is planned in --compute-dtype {only} only, not {dtype}; "
                                "plan it in {only}, or with another --framework")


@dataclass(frozen=True)
class Style:
    """Whose keys a plan's advice is written in: the user's program's own settings
    (:func:`vramscope.planner.settings.written_as` writes a neutral change in them).

    Attributes:
        name: the name ``--settings-style`` takes (``hf``, ``trl``, ``loop``, ``axolotl``).
        form: ``arguments`` (a config dataclass's fields: ``config(k=v, ...)``), ``yaml`` (a YAML file's keys),
            ``flags`` (a script's command-line flags: ``--k v``) or ``code`` (lines of a hand-written loop).
        config: the config dataclass of the ``arguments`` form (``TrainingArguments``, ``SFTConfig``).
        length_field: the config has a field for the maximum length (``max_length``); without one the
            tokenizer's truncation decides it (HF Trainer).
        dtype_flag: the program loads the model in the dtype of a ``--dtype`` flag (trl.scripts.sft); otherwise
            ``from_pretrained(..., dtype=...)``.
        renamed: (a neutral trainer or LoRA key, this style's name for it) pairs (axolotl's YAML).
        not_offered: neutral keys of changes this style has no setting for (such a change is not advice there).
        programs: the command readers whose users write in this style whatever the framework (axolotl's YAML).
        split_length: the ``flags`` form's two flags whose sum is the maximum length (qlora.py's source and target
            cuts); empty: one ``--max_length``.
        no_flag: keys the ``flags`` form has no flag for: said as the code the script builds them in.
    """

    name: str
    form: str = "arguments"
    config: str = "TrainingArguments"
    length_field: bool = False
    dtype_flag: bool = False
    renamed: tuple[tuple[str, str], ...] = ()
    not_offered: frozenset[str] = frozenset()
    programs: tuple[str, ...] = ()
    split_length: tuple[str, ...] = ()
    no_flag: tuple[str, ...] = ()
