"""The QLoRA/LoRA recipe flags shared by ``plan`` and ``tune``: one flag per
:class:`~vramscope.recipe.QLoraSpec` field, with the QLoRA reference recipe as defaults."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from vramscope.cli.common import plain_number, positive_int, shown
from vramscope.planner.frameworks import FRAMEWORKS, framework_help
from vramscope.recipe import OPTIMIZERS, QLoraSpec


def _dropout(text: str) -> float:
    try:
        value = float(plain_number(text, "--lora-dropout"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--lora-dropout is a probability like 0.05, got {shown(text)}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"--lora-dropout must be in [0, 1), got {shown(text)}")
    return value


def _targets(text: str) -> tuple[str, ...] | None:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise argparse.ArgumentTypeError("--lora-targets takes all-linear or a list such as q_proj,v_proj")
    return None if names == ("all-linear",) else names


def add_recipe_arguments(parser: argparse.ArgumentParser, optimizers: Sequence[str] = OPTIMIZERS) -> None:
    """Add the recipe flags to ``parser`` (in their own help group)."""
    d = QLoraSpec()
    g = parser.add_argument_group("recipe (defaults: the QLoRA reference recipe)")
    g.add_argument("--bits", type=int, choices=(4, 8, 16), default=d.bits,
                   help=f"base weights: 4 (NF4), 8 (LLM.int8) or 16 (plain LoRA) (default {d.bits})")
    g.add_argument("--quant-type", choices=("nf4", "fp4"), default=d.quant_type, help="4-bit data type (default nf4)")
    g.add_argument("--no-double-quant", dest="double_quant", action="store_false",
                   help="do not quantize the quantization constants")
    g.add_argument("--compute-dtype", choices=("bf16", "fp16", "fp32"), default=d.compute_dtype,
                   help="bitsandbytes' compute dtype, and the dtype the model loads in (default bf16; "
                        "trl.scripts.sft's own default --dtype is float32)")
    g.add_argument("--lora-r", type=positive_int, default=d.lora_r, metavar="R", help=f"LoRA rank (default {d.lora_r})")
    g.add_argument("--lora-alpha", type=positive_int, default=d.lora_alpha, metavar="A",
                   help=f"LoRA alpha (default {d.lora_alpha}; does not change memory)")
    g.add_argument("--lora-dropout", type=_dropout, default=d.lora_dropout, metavar="P",
                   help=f"LoRA dropout (default {d.lora_dropout})")
    g.add_argument("--lora-targets", type=_targets, default=None, metavar="all-linear|q_proj,v_proj,...",
                   help="modules LoRA wraps (default all-linear: every linear layer but lm_head)")
    g.add_argument("--optim", choices=tuple(optimizers), default=d.optim, help=f"default {d.optim}")
    g.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction,
                   default=d.gradient_checkpointing, help="recompute layers in backward (default on)")
    g.add_argument("--attn", choices=("sdpa", "eager", "flash_attention_2"), default=d.attn,
                   help="attention implementation (default sdpa)")
    add_framework_argument(g)


def add_framework_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--framework``: the training program, which decides dtypes, logits and kept outputs (the choices are the
    planner's table of frameworks as it is when the parser is built)."""
    parser.add_argument("--framework", choices=FRAMEWORKS, default=QLoraSpec().framework, help=framework_help())


def spec_from_args(args: argparse.Namespace) -> QLoraSpec:
    """The :class:`QLoraSpec` the recipe flags describe."""
    return QLoraSpec(
        bits=args.bits,
        double_quant=args.double_quant,
        quant_type=args.quant_type,
        compute_dtype=args.compute_dtype,
        lora_r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        lora_targets=args.lora_targets,
        gradient_checkpointing=args.gradient_checkpointing,
        attn=args.attn,
        optim=args.optim,
        framework=args.framework,
    )
