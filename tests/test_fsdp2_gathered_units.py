"""What FSDP2 (``fully_shard``) holds gathered at each point of a step, read off torch's own FSDP state in a real
child: a tiny LoRA Llama, every decoder layer and the root wrapped, non-reentrant gradient checkpointing, rank 0
of 4 on torch's fake process group, on the CPU. The planner's FSDP2 rank (``planner/distributed.py``) counts the
same units: at the loss, the root and the last layer's all-gather output (its free is deferred to the root's
post-forward, ``FSDPCommContext.all_gather_state``), not the layer itself; in the loss backward, the root and the
last layer prefetched by the root's pre-backward; in a layer's backward (its recompute), that layer unsharded and
the layer before it prefetched."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vramscope.planner.api import resolve_model
from vramscope.planner.distributed import Parallelism, _shard_phase, _sizes, estimate_distributed
from vramscope.planner.memory import estimate
from vramscope.recipe import QLoraSpec

SRC = str(Path(__file__).resolve().parents[1] / "src")

CHILD = textwrap.dedent("""
    import json
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from peft import LoraConfig, get_peft_model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    N = 4
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=N)
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=512, max_position_embeddings=64)
    base = LlamaForCausalLM(config)
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    base.config.use_cache = False
    model = get_peft_model(base, LoraConfig(r=8, target_modules="all-linear"))
    model.train()
    mesh = init_device_mesh("cpu", (N,))
    layers = list(model.base_model.model.model.layers)
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)

    def groups(module):
        state = module._get_fsdp_state()
        return list(getattr(state, "_fsdp_param_groups", None) or [state._fsdp_param_group])

    def nbytes(t):
        return t.numel() * t.element_size()

    root_state = model._get_fsdp_state()
    # A unit's all-gather output: every parameter's padded shard, times the world size.
    unit = {i: sum(nbytes(p._sharded_param_data) for g in groups(m) for p in g.fsdp_params) * N
            for i, m in enumerate(layers)}
    seen = {}

    def snapshot(name):
        held = root_state._comm_ctx.all_gather_state
        seen[name] = {
            "unsharded": [i for i, m in enumerate(layers) if any(g.is_unsharded for g in groups(m))],
            "pending": [i for i, m in enumerate(layers) if any(g._all_gather_result is not None for g in groups(m))],
            "pending_bytes": [nbytes(g._all_gather_result.all_gather_output) for m in layers for g in groups(m)
                              if g._all_gather_result is not None],
            "deferred_bytes": nbytes(held.all_gather_result.all_gather_output) if held is not None else 0,
            "root_unsharded": all(g.is_unsharded for g in groups(model)),
        }

    def at_loss(module, args, output):
        snapshot("loss")
        output.register_hook(lambda grad: snapshot("loss_backward"))

    model.base_model.model.lm_head.register_forward_hook(at_loss)

    def in_layer(module, args):
        if torch._C._current_graph_task_id() != -1:  # the recompute, inside the backward
            snapshot("layer_backward")
    layers[1].self_attn.register_forward_pre_hook(in_layer)

    ids = torch.randint(0, 512, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    print("RESULT " + json.dumps({"seen": seen, "unit": unit}))
""")


@pytest.mark.slow  # one child importing torch, transformers and peft: about 15 s here
def test_fsdp2_holds_what_the_planner_counts_at_the_loss_and_in_backward(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    pytest.importorskip("transformers")
    script = tmp_path / "child.py"
    script.write_text(CHILD, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    seen, unit = result["seen"], {int(k): v for k, v in result["unit"].items()}
    last = max(unit)
    # At the loss: every layer resharded, the root gathered, and one unit's all-gather output still held.
    assert seen["loss"]["unsharded"] == [] and seen["loss"]["root_unsharded"]
    assert seen["loss"]["pending"] == [] and seen["loss"]["deferred_bytes"] == unit[last]
    # The loss backward: the root's pre-backward has prefetched the last layer (one unit, not yet copied out).
    lb = seen["loss_backward"]
    assert lb["unsharded"] == [] and lb["pending"] == [last] and lb["pending_bytes"] == [unit[last]]
    assert lb["deferred_bytes"] == 0 and lb["root_unsharded"]
    # A layer's backward (its recompute): that layer unsharded and the one before it prefetched: two units.
    mid = seen["layer_backward"]
    assert mid["unsharded"] == [1] and mid["pending"] == [0] and mid["pending_bytes"] == [unit[0]]
    assert mid["root_unsharded"]


def test_the_fsdp2_rank_gathers_one_unit_at_the_loss_and_two_in_the_layers_backward() -> None:
    shape = resolve_model("Llama-3-8B")[1]  # a 128k vocabulary: the logits make the loss the peak
    spec = QLoraSpec(optim="adamw_torch")
    single = estimate(shape, spec, 1, 2048)
    assert single.peak_phase in ("forward", "loss backward") and single.breakdown.logits_and_loss > 0
    sz = _sizes(shape, single.breakdown)
    gathered = {}
    for version in (1, 2):
        par = Parallelism(4, "fsdp", fsdp_version=version)
        gathered[version] = {phase: _shard_phase(par, shape, bd, phase, sz, 4.0)[0]["gathered_params"]
                             for phase, bd in single.phase_breakdowns.items()}
    root, unit = sz.root_unquant, sz.unit
    assert gathered[2]["forward"] == gathered[2]["loss backward"] == root + unit
    assert gathered[2]["layer backward (last)"] == gathered[2]["layer backward (first)"] == root + 2 * unit
    assert gathered[1]["forward"] == gathered[1]["layer backward (last)"] == root + 2 * unit  # FSDP1 unchanged
    assert gathered[1]["optimizer step"] == gathered[2]["optimizer step"] == 0
    # One rank defers no all-gather free (FSDP2 copies at world size 1): the count stays as it was.
    one = _shard_phase(Parallelism(1, "fsdp", fsdp_version=2), shape, single.phase_breakdowns["forward"], "forward",
                       sz, 4.0)[0]
    assert one["gathered_params"] == root + 2 * unit
    v1, v2 = (estimate_distributed(shape, spec, 1, 2048, Parallelism(4, "fsdp", fsdp_version=v), single=single).worst
              for v in (1, 2))
    assert v1.peak_phase == v2.peak_phase == single.peak_phase  # the loss stays the peak, one unit lower
    assert v2.peak_allocated_bytes == v1.peak_allocated_bytes - unit


def test_a_layers_own_forward_peak_keeps_two_units_under_fsdp2() -> None:
    # A forward whose peak is a layer's temporaries (no logits term) is inside a layer: it and its all-gather.
    shape = resolve_model("Llama-2-7B")[1]
    single = estimate(shape, QLoraSpec(optim="adamw_torch"), 1, 512)
    bd = dataclasses.replace(single.phase_breakdowns["forward"], logits_and_loss=0)
    sz = _sizes(shape, single.breakdown)
    parts, _ = _shard_phase(Parallelism(4, "fsdp", fsdp_version=2), shape, bd, "forward", sz, 4.0)
    assert parts["gathered_params"] == sz.root_unquant + 2 * sz.unit
