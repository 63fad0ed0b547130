"""The rehearsal's fake process group (issue 27): a real child process started through the start-up hook with
VRAMSCOPE_REHEARSAL=4 opens what it thinks is a gloo group at MASTER_ADDR:MASTER_PORT (where nothing listens)
and gets rank 0 of 4 on torch's fake backend; FSDP2's fully_shard on a tiny LoRA Llama then holds a quarter of
every parameter and runs forward and backward on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vramscope.run.inject import SITE_DIR
from vramscope.tune.rehearsal_pg import ENV_REHEARSAL, install, rehearsal_environment, world_size_of

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("transformers")

SRC = str(Path(__file__).resolve().parents[1] / "src")

CHILD = textwrap.dedent("""
    import json, os
    import torch
    import torch.distributed as dist
    from peft import LoraConfig, get_peft_model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    dist.init_process_group("gloo")  # env://: MASTER_ADDR/PORT, RANK, WORLD_SIZE as torchrun sets them
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=512, max_position_embeddings=64)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=8, target_modules="all-linear"))
    full = {n: p.numel() for n, p in model.named_parameters()}
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.base_model.model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    local = {n: p.to_local().numel() for n, p in model.named_parameters()}
    ids = torch.randint(0, 512, (2, 16))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.to_local().numel() for n, p in model.named_parameters() if p.grad is not None}
    print("RESULT " + json.dumps({"backend": dist.get_backend(), "world": dist.get_world_size(),
                                  "rank": dist.get_rank(), "full": full, "local": local, "grads": grads,
                                  "loss_shape": list(loss.shape)}))
""")


def _child_env(world: int | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMSCOPE_")}
    env.update(PYTHONPATH=os.pathsep.join([SITE_DIR, SRC]), RANK="0", WORLD_SIZE=str(world or 4), LOCAL_RANK="0",
               MASTER_ADDR="127.0.0.1", MASTER_PORT="9", TORCH_DIST_INIT_BARRIER="0", CUDA_VISIBLE_DEVICES="")
    if world is not None:
        env.update(rehearsal_environment(world), VRAMSCOPE_PACKAGE_PARENT=SRC)
    return env


@pytest.mark.slow  # a child Python with torch, peft and transformers
def test_fsdp2_under_the_fake_group_holds_a_quarter_of_a_lora_llama_and_trains(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(CHILD, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], env=_child_env(4), capture_output=True, text=True,
                          timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert (out["backend"], out["world"], out["rank"]) == ("fake", 4, 0)
    full, local = out["full"], out["local"]
    assert set(full) == set(local) and len(full) > 20  # embeddings, norms, 7 projections x 2 layers, their LoRA
    # Every size here divides by 4: each parameter's shard is exactly a quarter, and so is the whole model.
    for name, numel in full.items():
        assert local[name] * 4 == numel, name
    assert sum(local.values()) * 4 == sum(full.values())
    # Backward ran: the LoRA weights (and only trainable ones) have gradients, sharded like them.
    lora = {n for n in full if "lora_" in n}
    assert lora and set(out["grads"]) == lora
    assert all(out["grads"][n] * 4 == full[n] for n in lora)
    assert out["loss_shape"] == []


@pytest.mark.slow  # a child Python with torch; gloo's 1 s timeout
def test_without_the_variable_nothing_is_patched_and_the_real_group_is_asked_for(tmp_path: Path) -> None:
    assert world_size_of({}) is None and world_size_of({ENV_REHEARSAL: "x"}) is None
    assert world_size_of({ENV_REHEARSAL: "8"}) == 8
    assert install({}) is False
    script = tmp_path / "init.py"
    script.write_text("import datetime, torch.distributed as dist\n"
                      "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=1))\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], env=_child_env(None), capture_output=True, text=True,
                          timeout=120)
    # A real gloo group at a port where nothing listens: it fails (with the fake group it would have opened).
    assert proc.returncode != 0
