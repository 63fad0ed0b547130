"""`vramscope tune --gpus N -- <launcher command>` on a real GPU (issue 27): an HF Trainer script behind torchrun
(DDP) and behind accelerate launch with TRL's FSDP2 config, rehearsed as rank 0 of N on the fake process group,
the micro-batch searched under --gpu-memory per GPU with NCCL's share held back."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from vramscope.cli import main  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hf_trainer_lora.py"
GPU_MEMORY = 8 * 2**30


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random ~0.3B Llama in bf16."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("gpu") / "model"
    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                         num_key_value_heads=4, vocab_size=32000, max_position_embeddings=8192)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    del model
    torch.cuda.empty_cache()
    return out


def rehearse(capsys: pytest.CaptureFixture[str], gpus: int, argv: list[str]) -> dict:  # type: ignore[type-arg]
    code = main(["tune", "--gpus", str(gpus), "--gpu-memory", f"{GPU_MEMORY >> 20}MiB", "--json", "--", *argv])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)  # type: ignore[no-any-return]


def script(model_dir: Path, tmp_path: Path) -> list[str]:
    return [str(EXAMPLE), "--model_name_or_path", str(model_dir), "--output_dir", str(tmp_path / "out"),
            "--per_device_train_batch_size", "1", "--max_seq_length", "1024", "--bf16", "--gradient_checkpointing",
            "--report_to", "none", "--max_steps", "1000", "--rows", "32"]


def check(out: dict, gpus: int) -> dict:  # type: ignore[type-arg]
    r = out["rehearsal"]
    assert r["how"] == "fake_pg" and r["world_size"] == gpus and len(out["trials"]) <= 3
    rank = r["ranks"][0]
    cap = GPU_MEMORY - rank["nccl_bytes_modelled"]
    assert rank["peak_reserved_bytes"] is not None and rank["peak_reserved_bytes"] <= cap
    assert rank["process_bytes"] == rank["device_used_bytes"] + rank["nccl_bytes_modelled"]
    assert out["size"] >= 1 and out["setting"] == f"--per_device_train_batch_size {out['size']}"
    return rank  # type: ignore[no-any-return]


def test_a_torchrun_ddp_command_rehearsed_at_2(model_dir: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = rehearse(capsys, 2, ["torchrun", "--nproc_per_node", "2", *script(model_dir, tmp_path)])
    rank = check(out, 2)
    assert out["rehearsal"]["launcher"] == "torchrun" and out["rehearsal"]["strategy"] == "ddp"
    assert rank["parameters_held"] == rank["parameters"]  # DDP: every rank holds the whole model
    print(f"\ntorchrun DDP x2: batch {out['size']}, rank 0 peak allocated {rank['peak_allocated_bytes']}")


@pytest.mark.parametrize("gpus", [2, 4])
def test_an_accelerate_fsdp2_command_shards_the_model_n_ways(gpus: int, model_dir: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("TRL's accelerate configs need trl")
    config = Path(next(iter(spec.submodule_search_locations))) / "accelerate_configs" / "fsdp2.yaml"
    argv = ["accelerate", "launch", "--config_file", str(config), *script(model_dir, tmp_path)]
    out = rehearse(capsys, gpus, argv)
    rank = check(out, gpus)
    assert out["rehearsal"]["fsdp_version"] == 2 and out["rehearsal"]["launcher_env"]["ACCELERATE_USE_FSDP"] == "true"
    # FSDP2 keeps 1/N of every parameter on a rank (up to the padding of uneven shards).
    assert rank["parameters_held"] * gpus == pytest.approx(rank["parameters"], rel=0.01)
    print(f"\naccelerate FSDP2 x{gpus}: batch {out['size']}, rank 0 peak allocated {rank['peak_allocated_bytes']}, "
          f"holds {rank['parameters_held']} of {rank['parameters']}", file=sys.stderr)
