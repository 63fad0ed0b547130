"""Build and step a real QLoRA/LoRA model: what ``tune``, ``plan --calibrate``, the demo and the H200
benchmarks all train.

One recipe, the QLoRA reference one by default: NF4 with double quantization, bf16 compute, LoRA on
every linear layer but ``lm_head``, peft's ``prepare_model_for_kbit_training``, gradient
checkpointing, paged AdamW 32-bit. Without CUDA (or with ``bits=16``) the base stays unquantized, so
the same code runs on a CPU. Imports transformers, peft and bitsandbytes lazily.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vramscope.planner.frameworks import framework_for
from vramscope.recipe import OPTIMIZERS, QLoraSpec

__all__ = ["OPTIMIZERS", "QLoraSpec", "build_trainer", "load_model", "make_optimizer", "write_random_checkpoint"]


def require(*modules: str, extra: str = "hf") -> None:
    """Raise an ImportError that names the install command when an optional library is missing."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(f"{', '.join(missing)} not installed; run: pip install 'vramscope[{extra}]'")


def torch_dtype(name: str) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def write_random_checkpoint(
    config: dict[str, Any] | Any, out_dir: str | os.PathLike[str], dtype: str = "bf16", device: str | None = None
) -> Path:
    """Save a randomly initialised model built from ``config`` (a config.json dict or a PretrainedConfig).

    Memory does not depend on the weights' values, so a random checkpoint measures like the real one.
    ``device="cuda"`` initialises on the GPU, which is minutes faster for a 7B model than the CPU.
    """
    require("torch", "transformers")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = Path(out_dir)
    if isinstance(config, dict):
        cfg = AutoConfig.for_model(**config)
    else:
        cfg = config
    torch.manual_seed(0)
    # No device given: keep the caller's default device (a caller may already have set CUDA).
    with torch.device(device) if device else contextlib.nullcontext():
        model: Any = AutoModelForCausalLM.from_config(cfg, dtype=torch_dtype(dtype))
    model.save_pretrained(out, safe_serialization=True)
    del model
    if device and device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


def load_model(model_dir: str | os.PathLike[str], spec: QLoraSpec, device: str | None = None) -> Any:
    """Load ``model_dir`` for LoRA training as ``spec`` says; returns a peft model in train mode."""
    require("torch", "transformers", "peft")
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM

    cuda = torch.cuda.is_available() and device != "cpu"
    dtype = torch_dtype(spec.compute_dtype) if cuda else torch.float32
    kwargs: dict[str, Any] = {"attn_implementation": spec.attn, "dtype": dtype}
    quantized = cuda and spec.bits in (4, 8)
    if quantized:
        require("bitsandbytes")
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=spec.bits == 4,
            load_in_8bit=spec.bits == 8,
            bnb_4bit_quant_type=spec.quant_type,
            bnb_4bit_use_double_quant=spec.double_quant,
            bnb_4bit_compute_dtype=dtype,
        )
        kwargs["device_map"] = {"": device or torch.cuda.current_device()}
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
    if not quantized and cuda:
        model = model.to(device or "cuda")
    # How the framework builds its model (planner.frameworks' Build): qlora.py is an HF Trainer script whose bf16
    # casts are made at load, Unsloth a TRL SFTTrainer (its offloaded checkpoints are host memory, not a step).
    fw = framework_for(spec)
    if quantized and fw.build.peft_kbit:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=spec.gradient_checkpointing)
        if fw.build.casts_back and spec.compute_dtype != "fp32":
            # qlora.py with --bf16 casts LoRA, embed_tokens and lm_head back to bf16 after the preparation
            for name, module in model.named_modules():
                if "lora_" in name or name.endswith(("embed_tokens", "lm_head")):
                    module.to(torch_dtype(spec.compute_dtype))
    elif spec.gradient_checkpointing:
        # TRL (through HF Trainer) enables non-reentrant checkpointing and input gradients, and no kbit preparation;
        # peft's way leaves torch's default (reentrant)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": fw.build.peft_kbit})
        model.enable_input_require_grads()
    if fw.logits == "chunked":
        require("trl", extra="trl")
        from trl.trainer.utils import add_fused_lm_head

        # SFTTrainer's loss: per-token log-probabilities, entropy and top-1 from tiles, never the full logits
        add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    if spec.gradient_checkpointing:
        model.config.use_cache = False
    lora = LoraConfig(
        r=spec.lora_r,
        lora_alpha=spec.lora_alpha,
        lora_dropout=spec.lora_dropout,
        target_modules=list(spec.lora_targets) if spec.lora_targets else "all-linear",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, lora)
    if quantized and not fw.build.peft_kbit and fw.adapters_half:
        # SFTTrainer casts the adapters of a quantized model to bf16 (the QLoRA paper's choice)
        for param in model.parameters():
            if param.requires_grad:
                param.data = param.data.to(torch.bfloat16)
    model.train()  # HF gradient checkpointing is off in eval mode
    return model


def make_optimizer(model: Any, spec: QLoraSpec) -> Any:
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    name = spec.optim
    if name == "adamw_torch":
        return torch.optim.AdamW(params, lr=spec.learning_rate)
    if name == "adamw_torch_fused":  # HF's name for AdamW(fused=True): one kernel, CUDA tensors only
        fused = bool(params) and all(p.is_cuda for p in params)
        return torch.optim.AdamW(params, lr=spec.learning_rate, fused=fused or None)
    if name == "sgd":
        return torch.optim.SGD(params, lr=spec.learning_rate)
    if name in ("paged_adamw_32bit", "paged_adamw_8bit", "adamw_8bit"):
        if not torch.cuda.is_available():  # bitsandbytes' optimizers need CUDA; same update rule on CPU
            return torch.optim.AdamW(params, lr=spec.learning_rate)
        require("bitsandbytes")
        import bitsandbytes as bnb

        optims: Any = bnb.optim  # bitsandbytes does not re-export its optimizers for type checkers
        cls = {
            "paged_adamw_32bit": optims.PagedAdamW32bit,
            "paged_adamw_8bit": optims.PagedAdamW8bit,
            "adamw_8bit": optims.AdamW8bit,
        }[name]
        return cls(params, lr=spec.learning_rate)
    raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")


@dataclass
class Trainer:
    """A minimal causal-LM training step over random tokens (shapes are what memory depends on)."""

    model: Any
    optimizer: Any
    vocab_size: int
    device: Any = None
    generator_seed: int = 0
    spec: QLoraSpec | None = None
    _gen: Any = field(default=None, repr=False)
    _kept: Any = field(default=None, repr=False)

    def batch(self, batch_size: int, seq_len: int) -> Any:
        import torch

        if self._gen is None:
            self._gen = torch.Generator().manual_seed(self.generator_seed)
        ids = torch.randint(0, self.vocab_size, (batch_size, seq_len), generator=self._gen)
        return ids.to(self.device) if self.device is not None else ids

    def step(self, batch_size: int, seq_len: int) -> float:
        """One step the way ``spec.framework`` runs it: the HF Trainer's (``hf``, ``trl``, ``qlora``, ``unsloth``)
        under the compute dtype's autocast (bf16 mixed precision) with the output dropped before backward
        (through TRL's fused LM head where the framework's logits are ``chunked``), a ``loop`` keeping the whole
        output until the next step's forward has returned."""
        import torch

        spec = self.spec or QLoraSpec()
        fw = framework_for(spec)
        ids = self.batch(batch_size, seq_len)
        autocast = fw.autocast and ids.is_cuda
        dtype = torch_dtype(spec.compute_dtype)
        with torch.autocast("cuda", dtype=dtype if dtype != torch.float32 else torch.bfloat16, enabled=autocast):
            if fw.logits == "chunked":
                out = self.model(input_ids=ids, labels=ids, fused_lm_head=True, use_cache=False)
            else:
                out = self.model(input_ids=ids, labels=ids)
        loss = out.loss
        if fw.logits == "kept":
            self._kept = out  # the loop's `out` lives on until the next forward returns
        del out  # HF Trainer's compute_loss keeps only the loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())


def build_trainer(model_dir: str | os.PathLike[str], spec: QLoraSpec, device: str | None = None) -> Trainer:
    import torch

    model = load_model(model_dir, spec, device)
    # The random ids index the embedding transformers built from the folder's config.json (its text model's, for
    # a multimodal one): its rows, rather than a second read of the file with a vocabulary rule of our own.
    vocab = int(model.get_input_embeddings().num_embeddings)
    dev = next(model.parameters()).device if torch.cuda.is_available() and device != "cpu" else None
    return Trainer(model=model, optimizer=make_optimizer(model, spec), vocab_size=vocab, device=dev, spec=spec)
