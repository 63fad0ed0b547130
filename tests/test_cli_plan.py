"""`vramscope plan`: output (table and --json) and one-line errors with exit 2 for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vramscope.cli import main
from vramscope.planner import registry


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_has_totals_breakdown_and_fit(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--model", "Llama-2-7B", "--batch-size", "4", "--seq-len", "1024",
                         "--gpu-memory", "24GiB", "--target-batch", "32", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "process_bytes", "breakdown", "fits",
                "max_batch_size", "max_seq_len", "grad_accum_steps", "micro_batch_size", "recommendations"):
        assert key in data
    assert data["peak_allocated_bytes"] < data["peak_reserved_bytes"] < data["process_bytes"]
    assert data["fits"] is True and data["max_batch_size"] >= 4
    assert data["micro_batch_size"] * data["grad_accum_steps"] == 32
    assert sum(data["breakdown"][k] for k in ("quantized_weights", "quantization_constants", "unquantized_params",
                                               "lora_weights", "lora_gradients", "optimizer_states", "activations",
                                               "logits_and_loss", "temporaries", "cublas_workspaces")) == data[
        "peak_allocated_bytes"]


def test_json_without_gpu_has_no_fit_fields(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--model", "tinyllama-1.1b", "--batch-size", "1", "--seq-len", "512", "--json")
    data = json.loads(out)
    assert code == 0 and "fits" not in data and data["model"] == "TinyLlama-1.1B"


def test_recipe_flags_reach_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--model", "Mistral-7B", "--batch-size", "2", "--seq-len", "512", "--lora-r", "16",
                       "--lora-targets", "q_proj,v_proj", "--optim", "adamw_torch", "--no-gradient-checkpointing",
                       "--bits", "8", "--no-double-quant", "--compute-dtype", "fp16", "--attn", "eager",
                       "--lora-dropout", "0", "--json")
    spec = json.loads(out)["spec"]
    assert code == 0
    assert spec == {**spec, "lora_r": 16, "lora_targets": ["q_proj", "v_proj"], "optim": "adamw_torch",
                    "gradient_checkpointing": False, "bits": 8, "double_quant": False, "compute_dtype": "fp16",
                    "attn": "eager", "lora_dropout": 0.0}


def test_table_names_the_three_totals(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--model", "Llama-3-8B", "--batch-size", "2", "--seq-len", "2048", "--gpu", "A100-40GB")
    assert code == 0
    for text in ("peak allocated", "peak reserved", "process memory", "4-bit weights", "fits in",
                 "optimizer states (paged, unified memory)"):
        assert text in out


def test_config_file_is_read(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(registry.get_config("Qwen2.5-1.5B")))
    _, by_file, _ = run(capsys, "--config", str(cfg), "--batch-size", "2", "--seq-len", "512", "--json")
    _, by_name, _ = run(capsys, "--model", "Qwen2.5-1.5B", "--batch-size", "2", "--seq-len", "512", "--json")
    assert json.loads(by_file)["peak_allocated_bytes"] == json.loads(by_name)["peak_allocated_bytes"]
    code, _, _ = run(capsys, "--config", str(tmp_path), "--batch-size", "2", "--seq-len", "512")  # a directory
    assert code == 0


def test_list_models(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--list-models")
    assert code == 0 and "Llama-3-8B" in out and "Mixtral-8x7B" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "Llama-2-8B", "--batch-size", "1", "--seq-len", "8"], "closest: Llama-3-8B"),
    (["--model", "Llama-2-7B", "--batch-size", "0", "--seq-len", "8"], "positive"),
    (["--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "-3"], "positive"),
    (["--model", "Llama-2-7B", "--batch-size", "two", "--seq-len", "8"], "whole number"),
    (["--model", "Llama-2-7B", "--batch-size", "1"], "--seq-len required"),
    (["--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "8", "--gpu-memory", "24 gigs"], "memory size"),
    (["--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "8", "--gpu-memory", "0GiB"], "positive"),
    (["--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "8", "--gpu", "RTX-9999"], "unknown GPU"),
    (["--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "8", "--target-batch", "8"], "needs a GPU"),
    (["--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "8", "--lora-targets", "wq"], "matches no linear"),
    (["--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "8", "--lora-dropout", "1.5"], "in \\[0, 1\\)"),
    (["--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "8", "--optim", "lion"], "invalid choice"),
    (["--batch-size", "1", "--seq-len", "8"], "one of the arguments"),
])
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("vramscope: error:")
    assert __import__("re").search(message, err)


@pytest.mark.parametrize(("content", "message"), [
    (None, "not found"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not an object"),
    (json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10}),
     "no 'num_hidden_layers'"),
    (json.dumps({"model_type": "llama", "hidden_size": 64.5, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "vocab_size": 10, "intermediate_size": 128}), "'hidden_size' must be a whole number"),
    (json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "vocab_size": 10, "intermediate_size": 128, "tie_word_embeddings": "yes"}), "true or false"),
    (json.dumps({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 6,
                 "num_key_value_heads": 4, "vocab_size": 10, "intermediate_size": 128}), "multiple"),
])
def test_bad_config_file_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                content: str | None, message: str) -> None:
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    code, _, err = run(capsys, "--config", str(path), "--batch-size", "1", "--seq-len", "8")
    assert code == 2 and err.count("\n") == 1 and message in err
