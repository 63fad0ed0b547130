"""``qlora``: qlora.py with ``--bf16`` (artidoro/qlora, ``get_accelerate_model``).

``prepare_model_for_kbit_training`` upcasts to fp32, then with ``--bf16`` it casts every LoraLayer,
``embed_tokens`` and ``lm_head`` back to bf16 (norms stay fp32); ``Seq2SeqTrainer`` is HF Trainer, so autocast,
the dropped output and HF Trainer's allocator behaviour are hf's, and so are its settings (``TrainingArguments``
flags).
"""

from __future__ import annotations

from vramscope.planner.frameworks import hf, trl
from vramscope.planner.frameworks.record import Build, Framework, Style

# qlora.py's own flags (HfArgumentParser over its ModelArguments, DataArguments and TrainingArguments): the
# trainer's fields under their names, --lora_r for the rank; its length is two flags (the input's and the output's
# cut); it has no flag for the LoRA targets (find_all_linear_names picks every linear layer but lm_head).
STYLE = Style(name="qlora", form="flags", renamed=(("r", "lora_r"),),
              split_length=("--source_max_len", "--target_max_len"), no_flag=("target_modules",),
              programs=("qlora",))

FRAMEWORK = Framework(
    name="qlora", title="qlora.py --bf16 (HF Trainer; LoRA, embeddings and lm_head cast back to bf16 after "
    "prepare_model_for_kbit_training)", prepares_kbit=False, autocast=True, adapters_half=True,
    logits="dropped", keeps_kv_cache=False, reentrant=False, fragmentation=(1.718, 0.442, 1.907, 0.468),
    cuda_context_bytes=758 * 1024**2,
    build=Build(peft_kbit=True, trainer=True, casts_back=True),
    style=STYLE.name, summary="qlora.py --bf16: LoRA, embeddings and lm_head back in bf16",
    switch_to=trl.FRAMEWORK.name,
    # qlora.py casts LoRA, embed_tokens and lm_head back only under `if args.bf16` (get_accelerate_model); with
    # --fp16 it loads fp32 (torch_dtype=float32) and casts nothing back, which its reader plans as hf
    compute_dtype_only="bf16",
    other_dtype_refusal="framework {name} is qlora.py with --bf16 (its cast back to bf16): it plans --compute-dtype "
    "{only} only; qlora.py with --fp16 or without either flag casts nothing back: plan it with --framework "
    f"{hf.FRAMEWORK.name} --compute-dtype {{dtype}}",
)  # no programs: qlora.py reads as hf; its reader plans with this one under --bf16
