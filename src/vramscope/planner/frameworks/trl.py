"""``trl``: TRL's ``SFTTrainer`` with its defaults (no kbit preparation, bf16 LoRA on a quantized model, TRL's fused
chunked LM head); and the ``trl`` settings style, ``SFTConfig``'s fields and trl.scripts.sft's ``--dtype``.

TRL's other trainers (DPO, GRPO, KTO, reward) plan with this framework too (:data:`~vramscope.planner.frameworks.
registry.TRL_TRAINERS`).
"""

from __future__ import annotations

from vramscope.planner.frameworks.record import Build, Framework, Style

STYLE = Style(name="trl", form="arguments", config="SFTConfig", length_field=True, dtype_flag=True,
              programs=("trl",))

FRAMEWORK = Framework(
    name="trl", title="TRL SFTTrainer defaults (no kbit preparation, bf16 LoRA, fused chunked LM head)",
    prepares_kbit=False, autocast=True, adapters_half=True, logits="chunked", keeps_kv_cache=False,
    reentrant=False, fragmentation=(0.808, 0.0, 1.411, 0.0), cuda_context_bytes=758 * 1024**2,
    build=Build(peft_kbit=False, trainer=True, traced=True),
    style=STYLE.name, summary="TRL's SFTTrainer defaults",
    programs=("trl", "unsloth"),  # Unsloth trains with TRL's trainers; an HF script that builds one says so
    switch_advice="train with TRL's SFTTrainer (TRL keeps LoRA in bf16, skips the fp32 upcast and never builds the "
                  "batch x sequence x vocabulary logits): saves {saving:.2f} GiB",
    switch_line="trl.SFTTrainer(model, args=SFTConfig(...), peft_config=LoraConfig(...)) with the same quantization "
                "and LoRA settings",
    dtype_advice="load the model in bf16 (trl.scripts.sft's default float32 keeps embeddings, norms and lm_head in "
                 "fp32 and dequantizes to fp32): saves {saving:.2f} GiB",
    dataset_trainer="sft",
    defaults_note="trl.scripts.sft loads the model in float32 unless given --dtype bfloat16: plan its defaults "
                  "with --compute-dtype fp32 (and --no-double-quant --lora-r 16 --lora-alpha 32 "
                  "--lora-targets q_proj,v_proj --optim adamw_torch_fused)",
)
