"""Mixture-of-experts under transformers 5 (issue 28 part 4): real tiny Mixtral, Qwen2-MoE and Qwen3-MoE models,
built from their configs on the meta device, counted by kind of parameter against the planner's shapes; what
transformers' own bitsandbytes replacement quantizes in them; and the plan's 16-bit expert bytes and its warning."""

from __future__ import annotations

from typing import Any

import pytest

from vramscope.cli import main
from vramscope.planner import plan
from vramscope.planner.shapes import shape_from_config
from vramscope.recipe import QLoraSpec

TINY: dict[str, dict[str, Any]] = {
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 96},
    "qwen2_moe": {"num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
                  "shared_expert_intermediate_size": 80, "intermediate_size": 128},
    "qwen3_moe": {"num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 48, "intermediate_size": 128,
                  "head_dim": 16},
}


def _meta_model(model_type: str) -> tuple[Any, Any]:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.for_model(model_type, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                            num_key_value_heads=2, vocab_size=1000, dtype="bfloat16",
                                            **TINY[model_type])
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    return cfg, model


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_the_shape_counts_a_real_moe_models_parameters_by_kind(model_type: str) -> None:
    torch = pytest.importorskip("torch")
    cfg, model = _meta_model(model_type)
    linear = {name for name, m in model.named_modules() if type(m) is torch.nn.Linear and name != "lm_head"}
    fused = router = linear_weights = 0
    for name, p in model.named_parameters():
        owner, _, leaf = name.rpartition(".")
        if p.dim() == 3:
            fused += p.numel()  # gate_up_proj [E, 2I, h], down_proj [E, h, I]
        elif owner.endswith("mlp.gate"):
            router += p.numel()  # a bare [E, h] parameter, read through F.linear
        elif owner in linear and leaf == "weight":
            linear_weights += p.numel()
    s = shape_from_config(cfg.to_dict())
    assert fused > 0 and s.routed_expert_params == fused
    assert s.router_params == router
    assert s.layers * sum(lin.params for lin in s.linears) == linear_weights
    assert s.total_params() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_bitsandbytes_4bit_leaves_the_fused_experts_in_bf16_and_the_plan_says_so(model_type: str) -> None:
    pytest.importorskip("bitsandbytes")
    transformers = pytest.importorskip("transformers")
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear

    cfg, model = _meta_model(model_type)
    import bitsandbytes as bnb

    model = replace_with_bnb_linear(model, modules_to_not_convert=["lm_head"],
                                    quantization_config=transformers.BitsAndBytesConfig(load_in_4bit=True))
    quantized = {f"{name}.weight" for name, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    assert quantized and not any(".experts." in q for q in quantized)  # only nn.Linear became Linear4bit
    left = {name: p for name, p in model.named_parameters() if name not in quantized}
    torch = pytest.importorskip("torch")
    # the experts and the routers were never touched: still the bf16 tensors from_config made
    assert all(p.dtype == torch.bfloat16 for n, p in left.items() if p.dim() == 3 or n.endswith("mlp.gate.weight"))
    s = shape_from_config(cfg.to_dict())
    # TRL loads as the checkpoint is (bf16) and does not upcast: 2 bytes for every parameter left unquantized
    # (Linear4bit's placeholder biases are fp32 until the bf16 checkpoint is loaded into them)
    p = plan(cfg.to_dict(), 1, 64, QLoraSpec(framework="trl"))
    assert p.breakdown.unquantized_params == sum(2 * t.numel() for t in left.values())
    quantized_params = sum(t.numel() for n, t in model.named_parameters() if n in quantized)
    assert quantized_params == s.layers * sum(lin.params for lin in s.linears)
    assert p.warnings and "stay bf16" in p.warnings[-1]
    # HF Trainer's prepare_model_for_kbit_training upcasts them to fp32: twice the bytes, said so
    hf = plan(cfg.to_dict(), 1, 64, QLoraSpec(framework="hf"))
    assert hf.breakdown.unquantized_params == 2 * p.breakdown.unquantized_params and "fp32" in hf.warnings[-1]


def test_the_registry_has_mixtral_and_the_qwen_moe_shapes() -> None:
    for name, billions, experts, shared in (("Mixtral-8x7B", 46.7, 8, 0), ("Qwen1.5-MoE-A2.7B", 14.3, 60, 5632),
                                            ("Qwen3-30B-A3B", 30.5, 128, 0)):
        p = plan(name, 1, 512, QLoraSpec(framework="trl"))
        assert p.total_params / 1e9 == pytest.approx(billions, rel=0.01)
        s = shape_from_config(__import__("vramscope.planner", fromlist=["get_config"]).get_config(name))
        assert s.experts == experts and s.shared_expert_intermediate == shared
        # the experts dominate the unquantized bytes: bf16, 2 bytes a parameter
        assert p.breakdown.unquantized_params >= 2 * s.expert_params


def test_a_moe_plan_says_first_that_the_experts_stay_16_bit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "Mixtral-8x7B", "--batch-size", "1", "--seq-len", "512",
                 "--framework", "trl"]) == 0
    lines = capsys.readouterr().out.splitlines()
    warning = next(i for i, line in enumerate(lines) if "WARNING" in line and "stay" in line)
    assert warning < next(i for i, line in enumerate(lines) if "breakdown at the peak" in line)
    assert "stay bf16" in lines[warning] and "Ways out" in lines[warning]
    assert not plan("Llama-2-7B", 1, 512).warnings
    # nothing was meant to be quantized (the one warning left: peft refuses the default dropout on the experts)
    assert [w for w in plan("Mixtral-8x7B", 1, 512, QLoraSpec(bits=16)).warnings if "stay" in w] == []


@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe"])
def test_one_moe_layers_saved_activations_match_a_real_forward(model_type: str) -> None:
    # What one decoder layer keeps for backward: the model's forward with two layers less the one with one,
    # under a LoRA adapter (the experts frozen, so the grouped matmuls keep no input), counted on the CPU.
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from vramscope.planner.memory import layer_bytes
    from vramscope.planner.trace.counter import LiveBytes

    kept: dict[int, int] = {}
    for layers in (1, 2):
        torch.manual_seed(0)
        cfg = transformers.AutoConfig.for_model(model_type, hidden_size=64, num_hidden_layers=layers,
                                                num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                                                **TINY[model_type])
        model = peft.get_peft_model(transformers.AutoModelForCausalLM.from_config(cfg),
                                    peft.LoraConfig(r=8, target_modules=["q_proj"], lora_dropout=0.0))
        model.train()
        counter = LiveBytes()
        for t in [*model.parameters(), *model.buffers()]:
            counter.track(t)
        start = counter.now
        with counter:
            out = model.base_model.model.model(input_ids=torch.randint(0, 100, (2, 64)), use_cache=False)
        kept[layers] = counter.now - start
        del out
    spec = QLoraSpec(bits=16, compute_dtype="fp32", lora_r=8, lora_dropout=0.0, lora_targets=("q_proj",),
                     framework="loop-loss")
    planned = layer_bytes(shape_from_config(cfg.to_dict()), spec, 2, 64)
    assert planned == pytest.approx(kept[2] - kept[1], rel=0.02)


def _tiny_peft(model_type: str, layers: int, targets: Any, dropout: float = 0.0, **wide: int) -> Any:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(model_type, hidden_size=64, num_hidden_layers=layers,
                                            num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                                            **{**TINY[model_type], **wide})
    model = peft.get_peft_model(transformers.AutoModelForCausalLM.from_config(cfg),
                                peft.LoraConfig(r=8, target_modules=targets, lora_dropout=dropout))
    model.train()
    return cfg, model


def _spec(targets: Any) -> QLoraSpec:
    return QLoraSpec(bits=16, compute_dtype="fp32", lora_r=8, lora_dropout=0.0, framework="loop-loss",
                     lora_targets=None if targets == "all-linear" else tuple(targets))


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_peft_adapts_the_fused_experts_of_mixtral_and_qwen3_moe_under_all_linear(model_type: str) -> None:
    # peft 0.21's MoE conversion moves Mixtral's and Qwen3-MoE's experts and router into target_parameters
    # (ParamWrapper); Qwen2-MoE is not in its table, its experts stay frozen. The plan counts what peft made.
    from vramscope.planner.layer import expert_lora

    cfg, model = _tiny_peft(model_type, 2, "all-linear")
    wrapped = {type(m).__name__ for m in model.modules()}
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    shape = shape_from_config(cfg.to_dict())
    assert plan(cfg.to_dict(), 1, 64, _spec("all-linear")).trainable_params == trainable
    assert ("ParamWrapper" in wrapped) == (model_type != "qwen2_moe") == expert_lora(shape, _spec("all-linear")).experts
    # naming only attention leaves the experts alone, in peft and in the plan
    _, attn_only = _tiny_peft(model_type, 2, ["q_proj", "v_proj"])
    assert plan(cfg.to_dict(), 1, 64, _spec(["q_proj", "v_proj"])).trainable_params == sum(
        p.numel() for p in attn_only.parameters() if p.requires_grad)


def test_peft_refuses_expert_adapters_with_dropout_and_the_plan_has_none() -> None:
    # the H200's Mixtral under HF Trainer's qlora recipe (dropout 0.05) stopped here, in get_peft_model
    with pytest.raises(ValueError, match="ParamWrapper does not work with lora_dropout"):
        _tiny_peft("mixtral", 1, "all-linear", dropout=0.05)
    from vramscope.planner.layer import expert_lora, expert_lora_tensors

    shape = shape_from_config(__import__("vramscope.planner", fromlist=["get_config"]).get_config("Mixtral-8x7B"))
    spec = QLoraSpec(lora_dropout=0.05)
    assert not expert_lora(shape, spec).experts and expert_lora_tensors(shape, spec) == []


def _kept_and_backward(model: Any) -> tuple[int, int]:
    """(bytes the forward keeps, the most the backward adds on top), counted on the CPU."""
    torch = pytest.importorskip("torch")
    from vramscope.planner.trace.counter import LiveBytes

    counter = LiveBytes()
    for t in [*model.parameters(), *model.buffers()]:
        counter.track(t)
    start = counter.now
    with counter:
        out = model.base_model.model.model(input_ids=torch.randint(0, 100, (2, 16)), use_cache=False)
        kept = counter.now - start
        counter.peak = counter.now
        out.last_hidden_state.float().pow(2).mean().backward()
        return kept, counter.peak - start - kept


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe"])
def test_adapted_experts_keep_their_merged_weights_and_backward_makes_their_gradients(model_type: str) -> None:
    # Experts wide enough that their weights dominate (intermediate 512): what all-linear's expert adapters add
    # to one layer's saved tensors (the merged gate_up and down stacks, grouped_mm's inputs, the router's input)
    # and the layer backward's peak over them (a merged stack's gradient, the factors' gradients).
    from vramscope.planner.frameworks import precision
    from vramscope.planner.layer import backward_temporaries
    from vramscope.planner.memory import layer_bytes

    wide = {"intermediate_size": 512, "moe_intermediate_size": 512}
    kept = {}
    for targets in ("all-linear", ["q_proj", "k_proj", "v_proj", "o_proj"]):
        cfg, model = _tiny_peft(model_type, 1, targets, **wide)
        shape, spec = shape_from_config(cfg.to_dict()), _spec(targets)
        kept[str(targets)], over = _kept_and_backward(model)
        if targets == "all-linear":
            assert backward_temporaries(shape, spec, 2, 16, precision(spec)) == pytest.approx(over, rel=0.02)
            adapted = layer_bytes(shape, spec, 2, 16)
        else:
            attention = layer_bytes(shape, spec, 2, 16)
    measured = kept["all-linear"] - kept[str(["q_proj", "k_proj", "v_proj", "o_proj"])]
    assert measured > 4 * 3 * 64 * 512 * 4  # at least the merged stacks (4 or 6 experts x 3 x 64 x 512, fp32)
    assert adapted - attention == pytest.approx(measured, rel=0.01)


def test_a_no_grad_forward_holds_both_merged_expert_stacks_unless_the_adapters_are_off() -> None:
    # evaluation (adapters on) against the reference's forward (peft's disable_adapter): the peak of a no-grad
    # forward differs by the two merged stacks ParamWrapper's baddbmm makes for the experts' call (at 4 tokens,
    # so that the activations, whose fullest moment moves with the stacks, are small beside them)
    torch = pytest.importorskip("torch")
    from vramscope.planner.frameworks import precision
    from vramscope.planner.layer import merged_expert_bytes
    from vramscope.planner.phases import nograd_layer_bytes
    from vramscope.planner.trace.counter import LiveBytes

    cfg, model = _tiny_peft("mixtral", 1, "all-linear", intermediate_size=512)
    model.eval()
    ids = torch.randint(0, 100, (1, 4))

    def peak(adapters: bool) -> int:
        counter = LiveBytes()
        for t in [*model.parameters(), *model.buffers()]:
            counter.track(t)
        start = counter.now
        with counter, torch.no_grad():
            if adapters:
                model.base_model.model.model(input_ids=ids, use_cache=False)
            else:
                with model.disable_adapter():
                    model.base_model.model.model(input_ids=ids, use_cache=False)
        return counter.peak - start

    shape, spec = shape_from_config(cfg.to_dict()), _spec("all-linear")
    pr = precision(spec)
    merged = sum(merged_expert_bytes(shape, spec, pr))
    assert merged == 4 * 3 * 64 * 512 * 4  # 4 experts, gate_up and down, fp32
    assert peak(True) - peak(False) == pytest.approx(merged, rel=0.03)
    assert (nograd_layer_bytes(shape, spec, 2, 16, pr) - nograd_layer_bytes(shape, spec, 2, 16, pr, adapters=False)
            == merged)


@pytest.mark.slow  # real MoE models built and loaded on the CPU
@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe"])
def test_the_loaders_worst_moment_is_the_last_layers_expert_stack(model_type: str, tmp_path: Any) -> None:
    # A real from_pretrained of a per-expert checkpoint (what save_pretrained writes) with on-the-fly 4-bit
    # quantization (transformers 5's synchronous path), counted on the CPU target by target: each target's rise
    # above the level before it, less what it and every later target leave loaded, at its worst. The checkpoint is
    # fp32 and loads as bf16, so that each source is copied as it is on a GPU (a same-dtype CPU load aliases it).
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("bitsandbytes")
    import transformers.core_model_loading as loading

    from vramscope.planner.memory import loading_transient_bytes
    from vramscope.planner.trace.counter import LiveBytes

    wide = {"mixtral": {"num_local_experts": 8, "intermediate_size": 1024},
            "qwen2_moe": {"num_experts": 16, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 256,
                          "intermediate_size": 1024}}[model_type]
    cfg = transformers.AutoConfig.for_model(model_type, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                            num_key_value_heads=2, vocab_size=100, num_experts_per_tok=2, **wide)
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(tmp_path)
    counter = LiveBytes()
    steps: list[tuple[int, int]] = []  # (peak rise, bytes left) per target, in load order
    level: list[int] = []
    original = loading.set_param_for_module

    def watched(*args: Any, **kwargs: Any) -> Any:
        peak = counter.peak
        out = original(*args, **kwargs)
        if level:
            steps.append((peak - level[-1], counter.now - level[-1]))
        level.append(counter.now)
        counter.peak = counter.now
        return out

    quant = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)
    loading.set_param_for_module = watched
    try:
        with counter:
            transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16, device_map="cpu",
                                                              quantization_config=quant)
    finally:
        loading.set_param_for_module = original
    worst = after = 0
    for rise, left in reversed(steps):
        after += left
        worst = max(worst, rise - after)
    spec = QLoraSpec(bits=4, double_quant=False, compute_dtype="bf16")
    assert worst > 2**20 and loading_transient_bytes(shape_from_config(cfg.to_dict()), spec) == pytest.approx(
        worst, rel=0.01)


@pytest.mark.parametrize(("model_type", "tied"), [("qwen2_moe", False), ("llama", False), ("llama", True),
                                                   ("mixtral-wide", False)])
def test_prepare_for_kbit_training_peaks_at_its_largest_late_cast(model_type: str, tied: bool, tmp_path: Any) -> None:
    # HF Trainer's recipe: peft's upcast of every 16-bit parameter to fp32, one at a time, after a real 4-bit load.
    # "mixtral-wide": experts wide enough that the last layer's stacks, not lm_head, are the worst moment; they are
    # two parameters (gate_up_proj, then down_proj), cast one after the other (the H200's Mixtral-2L load was
    # planned 14% high while they were counted as one).
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    from vramscope.planner.memory import upcast_transient_bytes
    from vramscope.planner.trace.counter import LiveBytes

    extra = TINY.get(model_type, {"intermediate_size": 512})
    if model_type == "mixtral-wide":
        model_type, extra = "mixtral", {**TINY["mixtral"], "intermediate_size": 2048}
    cfg = transformers.AutoConfig.for_model(model_type, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                            num_key_value_heads=2, vocab_size=3000, tie_word_embeddings=tied,
                                            **extra)
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(tmp_path)
    quant = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16, device_map="cpu",
                                                              quantization_config=quant)
    counter = LiveBytes()
    for t in model.parameters():
        counter.track(t)
    with counter:
        peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        final = counter.now
    assert upcast_transient_bytes(shape_from_config(cfg.to_dict())) == pytest.approx(counter.peak - final, rel=0.02)


def test_naming_mixtrals_transformers_4_expert_linears_adapts_the_fused_stacks() -> None:
    # peft maps w1 + w3 to gate_up_proj (rank doubled) and w2 to down_proj; the plan reads the same names
    targets = ["q_proj", "w1", "w3", "w2"]
    cfg, model = _tiny_peft("mixtral", 2, targets)
    assert {type(m).__name__ for m in model.modules()} >= {"ParamWrapper"}
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert plan(cfg.to_dict(), 1, 64, _spec(targets)).trainable_params == trainable


def test_a_plan_peft_would_refuse_says_so_first() -> None:
    """Dropout above 0 with targets that reach Mixtral's (or Qwen3-MoE's) fused experts or router: peft's
    ParamWrapper refuses it in get_peft_model (the H200's Mixtral under an HF Trainer recipe died there), so the
    plan's first warning says so, with the two ways out; dropout 0, attention-only targets, Qwen2-MoE (whose
    experts peft leaves alone) and a dense model get no such line."""
    refused = plan("Mixtral-8x7B", 1, 512, QLoraSpec(lora_dropout=0.05))
    assert refused.warnings[0].startswith("peft will refuse this run") and "lora_dropout to 0" in refused.warnings[0]
    assert "stay" in refused.warnings[1]  # the 16-bit experts, after it
    for name, spec in (("Mixtral-8x7B", QLoraSpec(lora_dropout=0.0)),
                       ("Mixtral-8x7B", QLoraSpec(lora_dropout=0.05, lora_targets=("q_proj", "k_proj", "v_proj",
                                                                                   "o_proj"))),
                       ("Qwen1.5-MoE-A2.7B", QLoraSpec(lora_dropout=0.05)),
                       ("Llama-2-7B", QLoraSpec(lora_dropout=0.05))):
        assert not [w for w in plan(name, 1, 512, spec).warnings if "refuse" in w], (name, spec)
    qwen3 = plan("Qwen3-30B-A3B", 1, 512, QLoraSpec(lora_dropout=0.1, lora_targets=("down_proj",)))
    assert qwen3.warnings[0].startswith("peft will refuse this run")
