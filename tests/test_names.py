"""Names as people paste them: hub ids for --model, nvidia-smi's GPU names for --gpu, sizes with their unit,
and "did you mean" for a mistyped flag on every subcommand. The real CLI runs in a subprocess for exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vramscope.planner import PlanInputError, UnknownModelError, gpus, plan, registry

VRAMSCOPE = [sys.executable, "-m", "vramscope"]
MIB = 1024**2
GIB = 1024**3


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*VRAMSCOPE, *args], capture_output=True, text=True, timeout=120)


def refused(*args: str) -> str:
    done = cli(*args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# -- models ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pasted", "canonical"),
    [("meta-llama/Llama-2-7b-hf", "Llama-2-7B"), ("Llama-2-7b-hf", "Llama-2-7B"), ("Qwen/Qwen2.5-0.5B", "Qwen2.5-0.5B"),
     ("qwen/qwen2.5-0.5b", "Qwen2.5-0.5B"), ("QWEN2.5-0.5B", "Qwen2.5-0.5B"), ("llama-2-7b", "Llama-2-7B"),
     ("meta-llama/Llama-2-7b-chat-hf", "Llama-2-7B"), ("Qwen/Qwen2.5-7B-Instruct", "Qwen2.5-7B"),
     ("meta-llama/Meta-Llama-3-8B-Instruct", "Llama-3-8B"), ("google/gemma-2-9b-it", "Gemma-2-9B"),
     ("huggyllama/llama-30b", "LLaMA-33B"), ("microsoft/Phi-3-mini-4k-instruct", "Phi-3-mini")],
)
def test_hub_ids_and_config_names_resolve(pasted: str, canonical: str) -> None:
    assert registry.resolve(pasted) == canonical
    assert plan(pasted, 1, 128).model == canonical


def test_every_id_list_models_prints_is_accepted() -> None:
    done = cli("plan", "--list-models")
    assert done.returncode == 0, done.stderr
    printed = [token for line in done.stdout.splitlines() for token in line.split()]
    assert "meta-llama/Llama-2-7b-hf" in printed and "Qwen/Qwen2.5-0.5B" in printed
    for token in printed:
        registry.resolve(token)  # raises for any it would refuse


@pytest.mark.parametrize("model", ["meta-llama/Llama-2-7b-hf", "Qwen/Qwen2.5-0.5B"])
def test_plan_takes_a_hub_id(model: str) -> None:
    done = cli("plan", "--model", model, "--batch-size", "1", "--seq-len", "256")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(registry.resolve(model) + ":")


def test_an_unknown_hub_id_names_the_closest() -> None:
    # v0.2 has another context and rope than v0.1: it plans as its own entry, never as v0.1 (issue 25)
    assert registry.resolve("mistralai/Mistral-7B-Instruct-v0.2") == "Mistral-7B-v0.2"
    with pytest.raises(UnknownModelError, match=r"closest: .*Mistral-7B-v0\.3"):
        registry.resolve("mistralai/Mistral-7B-Instruct-v0.9")
    line = refused("plan", "--model", "meta-llama/Llama-9-7b-hf", "--batch-size", "1", "--seq-len", "8")
    assert "closest: Llama-2-7B" in line


def test_calibrate_and_report_resolve_the_same_names(tmp_path: Path) -> None:
    # --calibrate checks the name before it looks for a GPU: a typo is exit 2 on any machine.
    assert "closest: Llama-2-7B" in refused("plan", "--calibrate", "--model", "meta-llama/Llama-9-7b-hf",
                                            "--batch-size", "1", "--seq-len", "8")
    done = cli("plan", "--calibrate", "--model", "meta-llama/Llama-2-7b-hf", "--batch-size", "1", "--seq-len", "8")
    assert "unknown model" not in done.stderr
    log = tmp_path / "memory.log"  # a hand-written loop log, GiB
    log.write_text("".join(f"2026-12-01 08:00:{s:02d}.000001,{s},{9.5 + s / 100:.2f},{12.0:.2f}\n" for s in range(30)))
    done = cli("report", str(log), "--model", "meta-llama/Llama-2-7b-hf", "--batch-size", "4", "--seq-len", "1024",
               "--json")
    assert done.returncode == 0, done.stderr
    sources = {r["source"] for r in json.loads(done.stdout)["recommendations"]}
    assert "planner" in sources


# -- GPUs ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("smi_name", "canonical"),
    [("NVIDIA GeForce RTX 3090", "RTX-3090"), ("NVIDIA GeForce RTX 4090", "RTX-4090"),
     ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
     ("NVIDIA A100 80GB PCIe", "A100-80GB"), ("NVIDIA H100 80GB HBM3", "H100-80GB"), ("NVIDIA H100 PCIe", "H100-80GB"),
     ("NVIDIA H100 NVL", "H100-94GB"), ("NVIDIA H200", "H200"), ("Tesla T4", "T4"), ("NVIDIA L4", "L4"),
     ("NVIDIA RTX A6000", "A6000"), ("Tesla V100-SXM2-16GB", "V100-16GB"), ("NVIDIA A10G", "A10G"),
     ("NVIDIA L40S", "L40S"), ("NVIDIA GH200 480GB", "GH200"), ("rtx_4090", "RTX-4090"), ("4090", "RTX-4090")],
)
def test_nvidia_smi_gpu_names_are_taken(smi_name: str, canonical: str) -> None:
    assert gpus.get_gpu(smi_name).name == canonical


def test_a_laptop_card_is_not_taken_for_the_desktop_one() -> None:
    with pytest.raises(PlanInputError, match="closest: RTX-4090"):
        gpus.get_gpu("NVIDIA GeForce RTX 4090 Laptop GPU")  # 16 GB, not 24


def test_plan_with_nvidia_smis_gpu_name_states_the_unit() -> None:
    done = cli("plan", "--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "512",
               "--gpu", "NVIDIA GeForce RTX 3090")
    assert done.returncode == 0, done.stderr
    assert "fits in 24.00 GiB" in done.stdout
    assert "GPU RTX-3090: 24576 MiB = 24.00 GiB, the memory.total nvidia-smi shows" in done.stdout


# -- sizes -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "says"),
    [("24", "write 24GiB (binary, as nvidia-smi and torch count) or 24GB (10^9 bytes), or name the card: "
            "--gpu RTX-3090 or RTX-4090"),
     ("24564", "nvidia-smi's unit is MiB: write 24564MiB"), ("6442450944", "if it counts bytes, write 6GiB"),
     ("0", "must be positive")],
)
def test_a_size_without_a_unit_is_refused_with_its_readings(size: str, says: str) -> None:
    with pytest.raises(PlanInputError, match=r"no unit|positive"):
        gpus.parse_gpu_memory(size)
    line = refused("plan", "--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "512", "--gpu-memory", size)
    assert says in line
    assert "0.00 GiB" not in line


def test_tune_memory_limit_follows_the_same_rule() -> None:
    line = refused("tune", "--model-dir", ".", "--seq-len", "64", "--gpu-memory", "24")
    assert "no unit" in line and "24GiB" in line


def test_gb_and_gib_are_told_apart_in_the_output() -> None:
    done = cli("plan", "--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "512", "--gpu-memory", "48GB")
    assert done.returncode == 0, done.stderr
    assert "fits in 44.70 GiB" in done.stdout
    assert ("GPU memory 48GB is 48 GB = 44.70 GiB (1 GB = 10^9 bytes; sizes here are GiB, 1024^3 bytes); a card sold "
            "as 48 GB, such as A6000, has 47.99 GiB (49140 MiB in nvidia-smi): --gpu A6000") in done.stdout
    assert gpus.parse_gpu_memory("48GB") == 48 * 10**9
    assert gpus.parse_gpu_memory("24564MiB") == 24564 * MIB
    assert gpus.capacity_note(None, "24GiB") is None  # GiB is what is printed: nothing to explain


# -- did you mean -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "meant"),
    [(["plan", "--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "8", "--lora-rank", "16"], "--lora-r"),
     (["plan", "--modle", "Llama-2-7B", "--batch-size", "1", "--seq-len", "8"], "--model"),
     (["tune", "--model-dir", ".", "--seqlen", "64"], "--seq-len"),
     (["report", "x.csv", "--jsn"], "--json"),
     (["report", "x.csv", "--colums", "time=0"], "--columns"),
     (["watch", "--onse"], "--once"),
     (["run", "--logg", "x.csv", "--", "true"], "--log")],
)
def test_a_mistyped_flag_gets_did_you_mean(args: list[str], meant: str) -> None:
    line = refused(*args)
    assert f"did you mean {meant}?" in line
    assert f"see 'vramscope {args[0]} --help'" in line


def test_a_flag_like_nothing_gets_no_guess() -> None:
    line = refused("plan", "--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "8", "--bogus")
    assert "unrecognized arguments: --bogus" in line and "did you mean" not in line


def test_the_commands_own_flags_after_double_dash_are_left_alone() -> None:
    # Flags after "--" are the child's: a required-argument error says nothing about them.
    done = cli("run", "--", sys.executable, "-c", "pass", "--lgo")
    assert "did you mean" not in done.stderr
