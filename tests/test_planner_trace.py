"""``plan --trace``: the traced step counts what a real step holds, the 4-bit stand-in holds what
bitsandbytes holds, and the CLI prints the result or a one-line error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from vramscope.cli import main
from vramscope.planner import plan
from vramscope.planner.trace.engine import trace_plan, trace_step
from vramscope.recipe import QLoraSpec

REPO = Path(__file__).resolve().parent.parent
TINY: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 384, "max_position_embeddings": 256,
}


@pytest.fixture(scope="module")
def warm() -> None:
    # The first fake trace in a process keeps a few lifted constants (2 KiB) that later ones share; a real
    # process pays them once too. Warm up so that the comparison below is between steady processes.
    trace_step(TINY, 1, 8, QLoraSpec(bits=16, attn="eager", lora_r=4))


@pytest.mark.parametrize(("framework", "ckpt", "optim"), [
    ("hf", True, "adamw_torch"),
    ("trl", True, "paged_adamw_32bit"),
    ("loop", False, "adamw_torch"),
])
def test_fake_trace_counts_what_a_real_cpu_step_holds(warm: None, framework: str, ckpt: bool, optim: str) -> None:
    spec = QLoraSpec(bits=16, attn="eager", framework=framework, gradient_checkpointing=ckpt, optim=optim, lora_r=8)
    fake = trace_step(TINY, 2, 24, spec, fake=True, cuda_sdpa=False)
    real = trace_step(TINY, 2, 24, spec, fake=False, cuda_sdpa=False)
    assert fake.peak_bytes == real.peak_bytes
    assert fake.phases == real.phases
    assert fake.breakdown == real.breakdown
    # the steady-state step holds the model, its LoRA gradients or activations, and the optimizer's states
    assert fake.breakdown["lora_weights"] > 0 and fake.breakdown["optimizer_states"] > 0
    assert fake.peak_bytes > sum(v for k, v in fake.breakdown.items() if k != "activations") // 2


@pytest.mark.parametrize("double_quant", [True, False])
@pytest.mark.parametrize(("out_features", "in_features"), [(96, 64), (100, 70), (300, 256)])
def test_linear4bit_standin_holds_what_params4bit_holds(double_quant: bool, out_features: int,
                                                        in_features: int) -> None:
    bnb = pytest.importorskip("bitsandbytes")
    import torch

    from vramscope.planner.trace.counter import block_bytes
    from vramscope.planner.trace.standins import make_linear4bit_standin

    w = torch.randn(out_features, in_features, dtype=torch.bfloat16)
    real = bnb.nn.Params4bit(w, requires_grad=False, compress_statistics=double_quant, quant_type="nf4").to("cpu")
    qs = real.quant_state
    real_tensors = [real.data, qs.absmax, qs.code]
    if double_quant:
        real_tensors += [qs.offset, qs.state2.absmax, qs.state2.code]
    standin = make_linear4bit_standin(torch.nn.Linear(in_features, out_features, bias=False), torch.bfloat16,
                                      "nf4", double_quant)
    mine = standin.quant_tensors()
    assert sorted((tuple(t.shape), t.dtype) for t in mine) == sorted((tuple(t.shape), t.dtype) for t in real_tensors)
    assert sum(block_bytes(t.nbytes) for t in mine) == sum(block_bytes(t.nbytes) for t in real_tensors)


def test_traced_static_memory_matches_the_analytic_model() -> None:
    pytest.importorskip("bitsandbytes")
    spec = QLoraSpec(lora_r=8)
    traced = trace_plan(TINY, 1, 32, spec)
    analytic = plan(TINY, 1, 32, spec).breakdown.to_dict()
    for part in ("quantized_weights", "lora_weights"):
        assert traced.breakdown[part] == analytic[part], part
    # bitsandbytes also keeps each weight's 16-value code and its offset, a 512-byte block each, which the
    # analytic model leaves out (1 KiB per 4-bit linear)
    linears = 7 * TINY["num_hidden_layers"]
    assert traced.breakdown["quantization_constants"] - analytic["quantization_constants"] == linears * 1024
    # the trace rounds each norm weight to its own 512-byte block; the analytic model rounds them together
    norms = 2 * TINY["num_hidden_layers"] + 1
    assert 0 <= traced.breakdown["unquantized_params"] - analytic["unquantized_params"] < norms * 512
    assert traced.peak_allocated_bytes <= traced.peak_reserved_bytes < traced.process_bytes
    assert traced.trace_seconds > 0 and traced.modelled


def _plan(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_trace_cli_prints_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("bitsandbytes")
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    code, out, _ = _plan(["--config", str(tmp_path), "--batch-size", "2", "--seq-len", "16", "--lora-r", "8",
                          "--trace", "--framework", "loop", "--gpu", "RTX-4090", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["schema_version"] == 1 and data["engine"] == "trace" and data["framework"] == "loop"
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "process_bytes", "peak_phase", "breakdown",
                "phases", "trace_seconds", "traced", "modelled", "fits", "notes"):
        assert key in data, key
    assert data["fits"] is True
    assert data["peak_allocated_bytes"] == data["traced_peak_bytes"] + data["breakdown"]["cublas_workspaces"]


def test_plan_trace_cli_prints_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("bitsandbytes")
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    code, out, _ = _plan(["--config", str(tmp_path), "--batch-size", "1", "--seq-len", "16", "--lora-r", "8",
                          "--trace", "--framework", "trl"], capsys)
    assert code == 0
    assert "framework trl (traced in" in out and "peak allocated" in out and "modelled, not traced" in out


@pytest.mark.parametrize("extra", [["--bits", "8"], ["--calibrate"], ["--target-batch", "8", "--gpu", "H200"],
                                   ["--gpus", "2"]])
def test_plan_trace_bad_input_is_one_line_and_exit_2(extra: list[str], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    code, out, err = _plan(["--config", str(tmp_path), "--batch-size", "1", "--seq-len", "16", "--trace", *extra],
                           capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_plan_trace_without_peft_names_the_install_command(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    script = ("import sys; sys.modules['peft'] = None\n"
              "from vramscope.cli import main\n"
              f"sys.exit(main(['plan', '--config', {str(tmp_path)!r}, '--batch-size', '1', '--seq-len', '8', "
              "'--trace']))")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'vramscope[hf]'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
