"""Read a Hugging Face config.json into the shapes the memory model needs.

Only the fields that decide memory are read; each is checked for presence and type so that a broken
config.json gives one line that names the field, not a KeyError deep inside the arithmetic. Model
families differ in how a decoder layer is wired (fused q/k/v, gated or plain MLP, parallel residual,
mixture of experts); :class:`ModelShape` records those differences as plain data.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vramscope.logs.inputfile import FileTooLargeError, NotRegularFileError, read_json_file
from vramscope.planner.errors import PlanInputError

# model_type -> how its decoder layer is built. Anything else is read as a LLaMA-style layer.
CONFIG_LIMIT = 16 << 20  # bytes of a config.json read at most; real ones are a few kB
_FUSED_QKV = {"phi3", "falcon", "gpt_neox"}
_FUSED_GATE_UP = {"phi3"}
_PLAIN_MLP = {"falcon", "gpt_neox"}  # up -> GELU -> down, no gate
_LAYERNORM = {"falcon", "gpt_neox"}  # LayerNorm (weight and bias) rather than RMSNorm
_QKV_BIAS = {"qwen2"}  # q/k/v projections carry a bias (qwen2_moe: its ``qkv_bias`` field, default true)
_MOE = {"mixtral", "qwen2_moe", "qwen3_moe"}


@dataclass(frozen=True)
class Linear:
    """One ``nn.Linear`` inside a decoder layer (the modules bitsandbytes quantizes and LoRA targets)."""

    name: str
    in_features: int
    out_features: int
    bias: bool = False
    source: str = ""  # which activation feeds it; modules with one source share their input

    @property
    def params(self) -> int:
        return self.in_features * self.out_features


@dataclass(frozen=True)
class ModelShape:
    """The memory-relevant shape of a decoder-only transformer."""

    model_type: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    max_positions: int | None = None
    experts: int = 0  # 0 = dense MLP
    experts_per_token: int = 0
    norms_per_layer: int = 2
    norm_bias: bool = False
    gated_mlp: bool = True
    parallel_block: bool = False  # attention and MLP read the same normalised input (Falcon, GPT-NeoX)
    logit_softcap: bool = False  # Gemma-2's final_logit_softcapping: tanh over the logits
    attn_softcap: bool = False  # Gemma-2's attn_logit_softcapping: tanh over every layer's attention scores
    sliding_window: int | None = None  # attention window, when transformers applies one
    linears: tuple[Linear, ...] = field(default=())
    # Qwen2-MoE's shared expert: a dense gated MLP of nn.Linear beside the routed experts (0 = none); its
    # gate_proj/up_proj/down_proj and shared_expert_gate are in ``linears``, so 4-bit loading quantizes them.
    shared_expert_intermediate: int = 0
    qk_norm: bool = False  # Qwen3: an RMSNorm over head_dim on the queries and on the keys of every layer

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_names(self) -> list[str]:
        return [lin.name for lin in self.linears]

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        """Parameters of the output layer that are not shared with the input embedding."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def norm_params(self) -> int:
        per_norm = self.hidden * (2 if self.norm_bias else 1)
        qk = self.layers * 2 * self.head_dim if self.qk_norm else 0
        return (self.layers * self.norms_per_layer + 1) * per_norm + qk

    @property
    def expert_params(self) -> int:
        """Mixture-of-experts weights. transformers 5 stores them as fused 3-D parameters, not ``nn.Linear``
        (``gate_up_proj`` [E, 2I, h] and ``down_proj`` [E, h, I] per layer) and the router as a bare [E, h]
        parameter, so bitsandbytes leaves them unquantized; LoRA reaches them only through peft's MoE conversion
        (``layer.expert_lora``)."""
        return self.routed_expert_params + self.router_params

    @property
    def routed_expert_params(self) -> int:
        """The fused 3-D expert tensors of every layer (``gate_up_proj`` and ``down_proj``)."""
        return self.layers * self.experts * 3 * self.hidden * self.intermediate if self.experts else 0

    @property
    def router_params(self) -> int:
        """The routers' [E, h] weights of every layer (a bare parameter read through F.linear)."""
        return self.layers * self.experts * self.hidden if self.experts else 0

    @property
    def bias_params(self) -> int:
        return self.layers * sum(lin.out_features for lin in self.linears if lin.bias)

    def total_params(self) -> int:
        linear = self.layers * sum(lin.params for lin in self.linears)
        return (linear + self.embedding_params + self.lm_head_params + self.norm_params + self.expert_params
                + self.bias_params)


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a config.json (or a model directory that holds one).

    Raises:
        PlanInputError: the file is missing, unreadable or not a JSON object.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        # A regular file of at most 16 MiB (a config.json is a few kB): /dev/zero or a FIFO is refused at once.
        data = read_json_file(p, "a Hugging Face config.json", CONFIG_LIMIT)
    except (NotRegularFileError, FileTooLargeError) as exc:
        raise PlanInputError(str(exc)) from None
    except FileNotFoundError:
        raise PlanInputError(f"config file {str(p)!r} not found; pass the path of a Hugging Face config.json") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanInputError(f"cannot read {str(p)!r}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise PlanInputError(f"{str(p)!r} is not valid JSON ({exc.msg} at line {exc.lineno}); "
                             "pass a Hugging Face config.json") from None
    except (ValueError, RecursionError) as exc:  # a number of 5000 digits, arrays nested 100000 deep
        raise PlanInputError(f"{str(p)!r} is not a config.json vramscope can read ({type(exc).__name__}); "
                             "pass a Hugging Face config.json") from None
    if not isinstance(data, dict):
        raise PlanInputError(f"{str(p)!r} holds a JSON {type(data).__name__}, not an object; "
                             "pass a Hugging Face config.json")
    return data


def _int(cfg: Mapping[str, Any], key: str, default: int | None = None, *, where: str = "config") -> int:
    value = cfg.get(key)
    if value is None:  # absent, or null as transformers 5 writes an unset head_dim: the default stands
        value = default
    if value is None:
        raise PlanInputError(f"{where} has no {key!r}; a causal-LM config.json needs it (add it or use --model NAME)")
    # bool is an int subclass; a true/false here is a mistake in the file.
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanInputError(f"{where} field {key!r} must be a whole number, got {value!r}")
    if value <= 0:
        raise PlanInputError(f"{where} field {key!r} must be positive, got {value}")
    limit = _FIELD_LIMITS.get(key, _ANY_FIELD_LIMIT)
    if value > limit:
        # A damaged or fuzzed config (2.3 billion layers) would otherwise build per-layer tables until memory ran out.
        raise PlanInputError(f"{where} field {key!r} is {value}, more than any model has (at most {limit}); "
                             "check the config.json")
    return value


# Far above every published model (405B: 126 layers, hidden 16384, 128 heads; vocabularies up to ~260k) and far below
# what makes the planner's per-layer tables run out of memory.
_FIELD_LIMITS = {"num_hidden_layers": 10_000, "num_attention_heads": 100_000, "num_key_value_heads": 100_000,
                 "num_kv_heads": 100_000, "num_local_experts": 100_000, "num_experts": 100_000,
                 "num_experts_per_tok": 100_000}
_ANY_FIELD_LIMIT = 1 << 40  # hidden, intermediate, vocab, head_dim: sizes multiply into bytes, not into tables


def _bool(cfg: Mapping[str, Any], key: str, default: bool, *, where: str = "config") -> bool:
    value = cfg.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise PlanInputError(f"{where} field {key!r} must be true or false, got {value!r}")
    return value


def shape_from_config(config: Mapping[str, Any]) -> ModelShape:
    """Build a :class:`ModelShape` from config.json fields.

    Multimodal configs that nest the language model under ``text_config`` are read from there.

    Raises:
        PlanInputError: a required field is missing, not a number, or not positive.
    """
    if not isinstance(config, Mapping):
        raise PlanInputError(f"a model config must be a JSON object, got {type(config).__name__}")
    cfg: Mapping[str, Any] = config
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), Mapping):
        cfg = cfg["text_config"]
    model_type = cfg.get("model_type", "llama")
    if not isinstance(model_type, str):
        raise PlanInputError(f"config field 'model_type' must be a string, got {model_type!r}")

    hidden = _int(cfg, "hidden_size")
    layers = _int(cfg, "num_hidden_layers")
    heads = _int(cfg, "num_attention_heads")
    vocab = _int(cfg, "vocab_size")
    if model_type == "falcon":
        # Falcon-7B is multi-query (one K/V head); the new decoder architecture (40B) names its K/V heads.
        new_arch = _bool(cfg, "new_decoder_architecture", False)
        if new_arch:
            kv_heads = _int(cfg, "num_kv_heads", heads)
        else:
            kv_heads = 1 if _bool(cfg, "multi_query", True) else heads
        intermediate = _int(cfg, "ffn_hidden_size", 4 * hidden)
        parallel = _bool(cfg, "parallel_attn", True)
        norms = 2 if new_arch else (1 if parallel else 2)
    else:
        kv_heads = _int(cfg, "num_key_value_heads", heads)
        intermediate = _int(cfg, "intermediate_size", 4 * hidden if model_type in _PLAIN_MLP else None)
        parallel = model_type == "gpt_neox" and _bool(cfg, "use_parallel_residual", True)
        norms = 4 if model_type.startswith("gemma2") or model_type.startswith("gemma3") else 2
    if heads % kv_heads:
        raise PlanInputError(f"config has {heads} attention heads, not a multiple of its {kv_heads} key/value heads")
    head_dim = _int(cfg, "head_dim", hidden // heads)
    max_pos_raw = cfg.get("max_position_embeddings")
    max_pos = max_pos_raw if isinstance(max_pos_raw, int) and not isinstance(max_pos_raw, bool) else None
    tied = _bool(cfg, "tie_word_embeddings", model_type in ("falcon", "gemma", "gemma2", "gemma3_text"))

    experts = 0
    per_token = 0
    shared = 0
    if model_type in _MOE or "num_local_experts" in cfg or "num_experts" in cfg:
        # Mixtral names them num_local_experts, Qwen-MoE num_experts; the experts' width is intermediate_size
        # for Mixtral, moe_intermediate_size for Qwen-MoE (whose intermediate_size is a dense layer's).
        experts = _int(cfg, "num_local_experts" if "num_local_experts" in cfg else "num_experts")
        per_token = _int(cfg, "num_experts_per_tok", 2)
        if model_type != "mixtral":
            intermediate = _int(cfg, "moe_intermediate_size", intermediate)
        if model_type == "qwen2_moe":
            shared = _int(cfg, "shared_expert_intermediate_size", 5632)
        sparse_step = cfg.get("decoder_sparse_step", 1)
        if cfg.get("mlp_only_layers") or (isinstance(sparse_step, int) and sparse_step > 1):
            raise PlanInputError("config has dense MLP layers between its MoE layers (mlp_only_layers or "
                                 "decoder_sparse_step > 1), which the planner does not model; plan with every "
                                 "layer sparse by removing those fields")

    q, kv = heads * head_dim, kv_heads * head_dim
    bias_all = model_type in ("gpt_neox",) or (model_type == "falcon" and _bool(cfg, "bias", False))
    qkv_bias = (bias_all or model_type in _QKV_BIAS or _bool(cfg, "attention_bias", False)
                or (model_type == "qwen2_moe" and _bool(cfg, "qkv_bias", True)))
    mlp_bias = bias_all or _bool(cfg, "mlp_bias", False)
    attn_src = "norm_attn"
    mlp_src = attn_src if parallel and norms == 1 else "norm_mlp"
    lins: list[Linear] = []
    if model_type in _FUSED_QKV:
        name = "qkv_proj" if model_type == "phi3" else "query_key_value"
        lins.append(Linear(name, hidden, q + 2 * kv, qkv_bias, attn_src))
    else:
        lins += [Linear("q_proj", hidden, q, qkv_bias, attn_src), Linear("k_proj", hidden, kv, qkv_bias, attn_src),
                 Linear("v_proj", hidden, kv, qkv_bias, attn_src)]
    o_name = "dense" if model_type in ("falcon", "gpt_neox") else "o_proj"
    lins.append(Linear(o_name, q, hidden, bias_all, "attn_out"))
    gated = model_type not in _PLAIN_MLP
    if shared:
        lins += [Linear("gate_proj", hidden, shared, False, mlp_src), Linear("up_proj", hidden, shared, False, mlp_src),
                 Linear("down_proj", shared, hidden, False, "mlp_act"),
                 Linear("shared_expert_gate", hidden, 1, False, mlp_src)]
    if not experts:
        if model_type in ("falcon", "gpt_neox"):
            lins += [Linear("dense_h_to_4h", hidden, intermediate, mlp_bias, mlp_src),
                     Linear("dense_4h_to_h", intermediate, hidden, mlp_bias, "mlp_act")]
        elif model_type in _FUSED_GATE_UP:
            lins += [Linear("gate_up_proj", hidden, 2 * intermediate, mlp_bias, mlp_src),
                     Linear("down_proj", intermediate, hidden, mlp_bias, "mlp_act")]
        else:
            lins += [Linear("gate_proj", hidden, intermediate, mlp_bias, mlp_src),
                     Linear("up_proj", hidden, intermediate, mlp_bias, mlp_src),
                     Linear("down_proj", intermediate, hidden, mlp_bias, "mlp_act")]
    # transformers applies a sliding window for these when the config sets one (Qwen2 only with use_sliding_window).
    window_raw = cfg.get("sliding_window")
    window = window_raw if isinstance(window_raw, int) and not isinstance(window_raw, bool) and window_raw > 0 else None
    if model_type in ("qwen2", "qwen2_moe") and not _bool(cfg, "use_sliding_window", False):
        window = None
    if model_type not in ("mistral", "mixtral", "qwen2", "qwen2_moe", "phi3", "gemma2", "gemma3_text", "starcoder2"):
        window = None
    return ModelShape(
        model_type=model_type, hidden=hidden, intermediate=intermediate, layers=layers, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, vocab=vocab, tied_embeddings=tied, max_positions=max_pos,
        experts=experts, experts_per_token=per_token, norms_per_layer=norms, norm_bias=model_type in _LAYERNORM,
        gated_mlp=gated, parallel_block=parallel,
        logit_softcap=bool(cfg.get("final_logit_softcapping")), attn_softcap=bool(cfg.get("attn_logit_softcapping")),
        sliding_window=window, linears=tuple(lins),
        shared_expert_intermediate=shared, qk_norm=model_type.startswith("qwen3"),
    )
