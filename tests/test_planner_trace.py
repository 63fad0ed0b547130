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


@pytest.mark.slow  # a fake and a real step, each traced
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


# -- the HF Trainer's autocast, the model's own attention, progress ---------------------------------------------
# Small configs of the three architectures (Llama-2-13B, Mistral-Nemo-12B with head_dim != hidden/heads,
# Gemma-2-9B with soft-capping, a sliding window and no SDPA in transformers 5).
ARCH_BASE: dict[str, Any] = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2048,
                             "max_position_embeddings": 1024}
ARCHS: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", **ARCH_BASE},
    "mistral": {"model_type": "mistral", **ARCH_BASE, "head_dim": 96, "sliding_window": None},
    "gemma2": {"model_type": "gemma2", **ARCH_BASE, "head_dim": 64, "sliding_window": 512,
               "query_pre_attn_scalar": 64, "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0},
}


def test_cuda_autocast_casts_as_cuda_does() -> None:
    import torch

    from vramscope.planner.trace.autocast import cuda_autocast, outputs_to_fp32

    x = torch.randn(4, 8)
    w = torch.nn.Parameter(torch.randn(6, 8))
    assert not torch.is_autocast_enabled()
    with cuda_autocast(torch.bfloat16):
        assert torch.is_autocast_enabled()  # what peft asks before casting the LoRA input itself
        y = torch.nn.functional.linear(x, w)
        assert y.dtype == torch.bfloat16  # a matmul runs in half
        assert torch.softmax(y, -1).dtype == torch.float32  # CUDA's fp32_set_opt_dtype (the CPU keeps bf16)
        assert y.sum().dtype == torch.float32 and y.pow(2).dtype == torch.float32 and y.exp().dtype == torch.float32
        assert torch.rsqrt(y.abs() + 1).dtype == torch.float32
        assert (y * 2).dtype == torch.bfloat16 and torch.tanh(y).dtype == torch.bfloat16  # outside every list
        with torch.autocast("cpu", enabled=False):  # transformers' rotary embedding turns autocast off
            assert torch.matmul(x, x.T).dtype == torch.float32
            assert y.sum().dtype == torch.bfloat16
    assert not torch.is_autocast_enabled()
    assert torch.nn.functional.linear(x, w).dtype == torch.float32
    out = outputs_to_fp32({"logits": y, "loss": y.float().sum(), "ids": torch.zeros(2, dtype=torch.long)})
    assert out["logits"].dtype == torch.float32 and out["ids"].dtype == torch.long


@pytest.mark.slow  # a real HF step traced per case
@pytest.mark.parametrize(("arch", "ckpt"), [("llama", False), ("mistral", False), ("mistral", True),
                                            ("gemma2", False)])
def test_traced_hf_step_under_autocast_matches_the_analytic_plan(arch: str, ckpt: bool) -> None:
    pytest.importorskip("bitsandbytes")
    spec = QLoraSpec(framework="hf", gradient_checkpointing=ckpt, lora_r=8)
    traced = trace_plan(ARCHS[arch], 2, 256, spec)
    analytic = plan(ARCHS[arch], 2, 256, traced.spec)
    # what the step itself holds (both add the same modelled cuBLAS workspaces on top)
    workspaces = traced.breakdown["cublas_workspaces"]
    step = analytic.peak_allocated_bytes - workspaces
    assert abs(traced.traced_peak_bytes - step) / step < 0.05, (traced.traced_peak_bytes, step)
    assert any("autocast" in t for t in traced.traced)
    # without autocast the fp32 stream that prepare_model_for_kbit_training leaves reaches the LoRA matmuls and
    # SDPA in fp32 (on the full Mistral-Nemo-12B, 1 x 2048: SDPA's math kernel, +62% against the H200)
    plain = trace_step(ARCHS[arch], 2, 256, QLoraSpec(framework="loop-loss", gradient_checkpointing=ckpt, lora_r=8))
    assert plain.peak_bytes > traced.traced_peak_bytes


def test_gemma2_is_traced_with_its_own_eager_attention() -> None:
    pytest.importorskip("bitsandbytes")
    traced = trace_plan(ARCHS["gemma2"], 1, 128, QLoraSpec(framework="hf", lora_r=8))  # the recipe says sdpa
    assert traced.spec.attn == "eager"
    assert "no sdpa attention" in traced.notes[0] and "eager" in traced.notes[0]
    assert not any("SDPA kernels" in t for t in traced.traced)  # eager attention calls no SDPA


def test_flash_attention_2_is_traced_as_sdpas_flash_kernel() -> None:
    pytest.importorskip("bitsandbytes")
    traced = trace_plan(ARCHS["llama"], 1, 128, QLoraSpec(framework="hf", lora_r=8, attn="flash_attention_2"))
    assert traced.spec.attn == "sdpa" and "flash_attention_2 traced as SDPA's flash kernel" in traced.notes[0]
    assert any("flash x" in t for t in traced.traced)


def _plan_in_a_pty(tmp_path: Path, extra: list[str]) -> tuple[int, str, str]:
    """``vramscope plan --trace`` in a child whose stderr is a terminal; returns (code, stdout, stderr)."""
    import os
    import pty

    (tmp_path / "config.json").write_text(json.dumps(TINY))
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "vramscope", "plan", "--config", str(tmp_path), "--batch-size",
                             "1", "--seq-len", "16", "--lora-r", "4", "--trace", *extra],
                            stdout=subprocess.PIPE, stderr=slave, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out, b"".join(chunks).decode()


@pytest.mark.slow  # a child Python with torch, transformers and peft on a pty
def test_plan_trace_shows_progress_on_a_terminal(tmp_path: Path) -> None:
    pytest.importorskip("bitsandbytes")
    code, out, err = _plan_in_a_pty(tmp_path, [])
    assert code == 0 and "peak allocated" in out
    shown = [part.removeprefix("\x1b[K") for part in err.split("\r") if part.strip("\x1b[K")]
    assert shown[0].startswith("tracing: building the model on the meta device")
    assert any(s.startswith("tracing: preparing it as hf does") for s in shown)
    for step in ("1/2", "2/2"):
        for what in ("forward", "backward", "optimizer step"):
            assert any(s.startswith(f"tracing: step {step}: {what} (") for s in shown), (step, what)
    assert any(s.startswith("tracing: step 2/2: forward, layer 2/2 (") for s in shown)  # the decoder layers
    assert err.endswith("\r\x1b[K")  # the line is cleared before the table prints


def test_plan_trace_shows_no_progress_with_json_or_off_a_terminal(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("bitsandbytes")
    code, out, err = _plan_in_a_pty(tmp_path, ["--json"])
    assert code == 0 and json.loads(out)["engine"] == "trace" and err == ""
    code, _, err = _plan(["--config", str(tmp_path), "--batch-size", "1", "--seq-len", "16", "--lora-r", "4",
                          "--trace"], capsys)
    assert code == 0 and err == ""


def test_frameworks_the_trace_does_not_run_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from vramscope.cli import main

    for framework in ("qlora", "unsloth"):
        code = main(["plan", "--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "128", "--framework",
                     framework, "--trace"])
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1 and f"not {framework}'s" in err
