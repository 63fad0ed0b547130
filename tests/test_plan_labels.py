"""`vramscope plan`'s labels say what is there (issue 25): a 16-bit plan has no "quantized" weights, an MoE
model's fused experts are named as the unquantized bulk they are, in the breakdown and in the no-fit reason.
Driven through the real CLI."""

from __future__ import annotations

import pytest

from vramscope.cli import main


def plan(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert main(["plan", *argv]) == 0
    return capsys.readouterr().out


def lines_of(out: str) -> list[str]:
    return [" ".join(line.split()) for line in out.splitlines()]


def test_a_16_bit_plan_has_plain_weights_not_quantized_ones(capsys: pytest.CaptureFixture[str]) -> None:
    out = plan(capsys, "--model", "Llama-2-7B", "--bits", "16", "--batch-size", "2", "--seq-len", "1024",
               "--gpu-memory", "24GiB")
    lines = lines_of(out)
    assert any(line.startswith("weights (bf16) 12.06 GiB") for line in lines)
    assert any(line.startswith("embeddings, lm_head, norms (bf16)") for line in lines)
    assert "quantized" not in out.split("peak allocated")[0].replace("(no quant)", "")
    assert "4-bit" not in out and "constants" not in out


def test_a_16_bit_fsdp_plan_shards_weights_not_4_bit_ones(capsys: pytest.CaptureFixture[str]) -> None:
    out = plan(capsys, "--model", "Llama-2-7B", "--bits", "16", "--batch-size", "2", "--seq-len", "1024",
               "--gpus", "2", "--strategy", "fsdp", "--gpu-memory", "24GiB")
    lines = lines_of(out)
    assert "weights sharded 1/2" in lines and "embeddings, lm_head, norms sharded 1/2" in lines
    assert "4-bit" not in out and "bf16 storage" not in out and "quantization constants" not in out
    assert any(line.startswith("weights (bf16) 6.03 GiB") for line in lines)


def test_a_4_bit_fsdp_plan_still_says_4_bit_weights_in_bf16_storage(capsys: pytest.CaptureFixture[str]) -> None:
    out = plan(capsys, "--model", "Llama-2-7B", "--batch-size", "2", "--seq-len", "1024",
               "--gpus", "2", "--strategy", "fsdp", "--gpu-memory", "24GiB")
    lines = lines_of(out)
    assert "4-bit weights (bf16 storage) sharded 1/2" in lines and "quantization constants replicated" in lines
    assert any(line.startswith("4-bit weights ") and "GiB" in line for line in lines)


def test_mixtral_names_its_unquantized_experts(capsys: pytest.CaptureFixture[str]) -> None:
    out = plan(capsys, "--model", "Mixtral-8x7B", "--batch-size", "1", "--seq-len", "1024", "--gpu-memory", "80GiB")
    lines = lines_of(out)
    assert "4-bit weights 0.62 GiB" in lines
    assert "experts unquantized (fp32) 168.98 GiB [hf]" in lines
    assert "quantized weights" not in out and "unquantized params" not in out
    why = next(line for line in lines if line.startswith("why: "))
    assert why.startswith("why: the weights alone need 169.6 GiB (of which ")
    assert "unquantized experts) of the GPU's 80.0 GiB" in why
    assert "4-bit weights alone" not in why
