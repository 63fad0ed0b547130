"""FSDP1 or FSDP2, as the command says it (issue 27): accelerate's ``fsdp_config.fsdp_version`` / ``--fsdp_version``,
TrainingArguments' ``--fsdp_config`` ``version``, axolotl's ``fsdp_version``; read into the launch, planned (the
host memory under parameter offload differs), an ``ASSUMED:`` line when unsaid and it matters, one line and exit 2
for a version that is neither.

The commands are the corpus's (tests/data/commands/: verbatim from public repositories, with their commits); where a
test changes one line of such a file to say another version, it says so.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from test_commands_corpus import ENTRIES, load, materialise
from vramscope.cli import main
from vramscope.commands import CommandReadError, parse_command

SRC = Path(__file__).resolve().parent.parent / "src"

# Corpus commands that were there before the version was read, with the version they run and whether they say it.
KNOWN = {
    "swift_qwen25_7b_lora_fsdp2": (2, True),  # fsdp2.json: "fsdp_version": 2
    "swift_qwen25_72b_fsdp_qlora_offload": (1, False),  # fsdp_offload.json says none: accelerate's 1
    "peft_sft_run_peft_qlora_fsdp_llama2_70b": (1, False),
    "llamafactory_llama3_8b_fsdp_qlora_accelerate": (1, False),
    "axolotl_llama3_qlora_fsdp_70b": (1, False),  # axolotl pins 1 when the config gives none
    "llama_cookbook_fsdp_qlora_int4_70b_4gpu": (1, True),  # finetuning.py wraps in FullyShardedDataParallel
    "fsdp_qlora_readme_llama2_70b_2x24gb": (1, True),  # Answer.AI's train.py, the same
}
SWIFT_OFFLOAD = "swift_qwen25_72b_fsdp_qlora_offload"


def parsed(name: str, tmp: Path, edit: Any = None) -> Any:
    entry = load(name)
    if edit is not None:
        edit(entry)
    return parse_command(materialise(entry, tmp), cwd=tmp, environ={"HOME": str(tmp)})


def fsdp_assumptions(p: Any) -> list[str]:
    return [a for a in p.assumed if "fsdp_version" in a]


@pytest.mark.parametrize("name", sorted({*KNOWN, *(n for n in ENTRIES if "fsdp_version" in load(n).get("facts", {}))}))
def test_the_corpus_commands_read_their_fsdp_version(name: str, tmp_path: Path) -> None:
    entry = load(name)
    version, said = KNOWN.get(name, (entry["facts"].get("fsdp_version"), True))
    p = parsed(name, tmp_path)
    assert p.launch.strategy == "fsdp" and p.launch.fsdp_version == version
    assert p.to_dict()["launch"]["fsdp_version"] == version
    if said:
        assert fsdp_assumptions(p) == []
    elif p.launch.offload:  # unsaid and it changes the host figure: the plan's first line says which
        assert fsdp_assumptions(p) == [a for a in p.assumed if a.startswith(f"FSDP{version}: the command does not "
                                                                           "say fsdp_version")] != []
    else:  # unsaid and it changes nothing: among the defaults
        assert fsdp_assumptions(p) == [] and p.defaults["fsdp_version"].startswith(f"{version} (")


def plan_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    code = main(["plan", "--json", "--gpu-memory", "24GiB", "--", *argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)  # type: ignore[no-any-return]


def swift_argv(tmp: Path, extra: list[str] | None = None, config_version: Any = None) -> list[str]:
    """ms-swift's FSDP-QLoRA with offload (fsdp_offload.json, no version: FSDP1), with accelerate launch flags
    added after ``accelerate launch``, or the JSON's ``fsdp_config`` given ``"fsdp_version"``."""
    entry = load(SWIFT_OFFLOAD)
    if config_version is not None:
        (path, text), = entry["files"].items()
        cfg = json.loads(text)
        cfg["fsdp_config"]["fsdp_version"] = config_version  # the one line changed
        entry["files"][path] = json.dumps(cfg, indent=2)
    argv = materialise(entry, tmp)
    at = argv.index("launch") + 1
    return argv[:at] + (extra or []) + argv[at:]


def test_fsdp_version_1_and_2_change_the_plans_host_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    unsaid = plan_json(capsys, swift_argv(tmp_path))
    one = plan_json(capsys, swift_argv(tmp_path, ["--fsdp_version", "1"]))
    two = plan_json(capsys, swift_argv(tmp_path, ["--fsdp_version", "2"]))
    two_in_file = plan_json(capsys, swift_argv(tmp_path, config_version=2))
    for data, version in ((unsaid, 1), (one, 1), (two, 2), (two_in_file, 2)):
        assert data["per_gpu"] and data["world_size"] == 2 and data["offload"] == "params"
        assert data["command"]["launch"]["fsdp_version"] == version
        assert data["gpus"]["plan"]["fsdp_version"] == version
    # Unsaid: planned as accelerate's FSDP1 and said so; stated: no guess.
    assert [a for a in unsaid["assumed"] if a.startswith("FSDP1: the command does not say fsdp_version")]
    assert not [a for d in (one, two, two_in_file) for a in d["assumed"] if "fsdp_version" in a]
    assert unsaid["command"]["read"].get("--fsdp_version") is None and two["command"]["read"]["--fsdp_version"] == "2"
    assert two_in_file["command"]["read"]["fsdp_version (fsdp_offload.json)"] == "2"
    # FSDP1 pins a CPU gradient for every flat parameter, frozen ones too; FSDP2 does not: the host figure halves.
    assert unsaid["host_bytes"] == one["host_bytes"] and two["host_bytes"] == two_in_file["host_bytes"]
    host1, host2 = one["gpus"]["plan"]["per_gpu"][0]["host_breakdown"], two["gpus"]["plan"]["per_gpu"][0][
        "host_breakdown"]
    assert host1["frozen_gradient_buffers"] > 0 and "frozen_gradient_buffers" not in host2
    assert one["host_bytes"] > 1.8 * two["host_bytes"]
    assert one["host_bytes_machine"] == 2 * one["host_bytes"]
    # FSDP1 also copies the next unit's CPU shard to the GPU before its all-gather: a little more on the GPU.
    assert one["peak_allocated_bytes"] > two["peak_allocated_bytes"]


def test_the_terminal_says_the_version_and_the_guess(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["plan", "--gpu-memory", "24GiB", "--", *swift_argv(tmp_path)]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("ASSUMED: ") and "FSDP1: the command does not say fsdp_version (accelerate's default)" \
        in first
    assert "accelerate, 2 processes, fsdp with offload (FSDP1)" in out
    assert "frozen too (FSDP1)" in out
    assert main(["plan", "--gpu-memory", "24GiB", "--", *swift_argv(tmp_path, ["--fsdp_version=2"])]) == 0
    out = capsys.readouterr().out
    assert not out.startswith("ASSUMED") and "fsdp with offload (FSDP2)" in out and "(FSDP2)," in out


@pytest.mark.parametrize("how", ["file", "flag"])
def test_a_bad_fsdp_version_is_one_line_and_exit_2(how: str, tmp_path: Path) -> None:
    argv = swift_argv(tmp_path, config_version=3) if how == "file" else swift_argv(tmp_path, ["--fsdp_version", "3"])
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(SRC)}
    env.pop("HF_HOME", None)
    done = subprocess.run([sys.executable, "-m", "vramscope", "plan", "--json", "--", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "3 is not an FSDP version; set it to 1 (FullyShardedDataParallel) or 2 (fully_shard)" in lines[0]
    assert ("fsdp_offload.json: fsdp_config.fsdp_version" if how == "file" else "--fsdp_version") in lines[0]


def _axolotl_70b(edit: Any) -> Any:
    def change(entry: dict[str, Any]) -> None:
        (path, text), = entry["files"].items()
        cfg = yaml.safe_load(text)
        edit(cfg)
        entry["files"][path] = yaml.safe_dump(cfg, sort_keys=False)
    return change


def test_axolotl_says_the_version_at_the_top_or_in_fsdp_config(tmp_path: Path) -> None:
    name = "axolotl_llama3_qlora_fsdp_70b"  # FSDP with offload_params and no version: axolotl pins FSDP1
    top = parsed(name, tmp_path / "top", _axolotl_70b(lambda c: c.update(fsdp_version=2)))
    inner = parsed(name, tmp_path / "inner", _axolotl_70b(lambda c: c["fsdp_config"].update(version=2)))
    for p in (top, inner):
        assert p.launch.fsdp_version == 2 and p.launch.offload and fsdp_assumptions(p) == []
    assert inner.read["fsdp_config.version (axolotl config)"] == "2"
    assert "fsdp_version (qlora-fsdp-70b.yaml)" in top.read
    with pytest.raises(CommandReadError, match=r"^fsdp_config.fsdp_version: 'two' is not an FSDP version"):
        parsed(name, tmp_path / "bad", _axolotl_70b(lambda c: c["fsdp_config"].update(fsdp_version="two")))


def _trainer_default() -> int:
    try:
        numbers = tuple(int(n) for n in re.findall(r"\d+", importlib.metadata.version("transformers"))[:2])
    except importlib.metadata.PackageNotFoundError:
        return 1
    return 2 if numbers >= (5, 10) else 1


TRL_SFT = ["-m", "trl.scripts.sft", "--model_name_or_path", "Qwen/Qwen2.5-7B", "--use_peft", "--load_in_4bit",
           "--per_device_train_batch_size", "1", "--max_length", "2048", "--fsdp", "full_shard offload auto_wrap"]


def test_the_trainers_fsdp_config_version_replaces_the_launchers(tmp_path: Path) -> None:
    """TrainingArguments' --fsdp builds the Trainer's own FSDP plugin: --fsdp_config's version (or the Trainer's
    default) is what runs, whatever the accelerate config says."""
    launch = ["accelerate", "launch", "--config_file", "trl_fsdp2.yaml", "--num_processes", "2"]
    trl_fsdp2 = load("trl_skill_sft_lora_fsdp2")  # TRL ships fsdp2.yaml with fsdp_version: 2
    assert trl_fsdp2["facts"]["fsdp_version"] == 2
    trl = ["trl", "sft", "--model_name_or_path", "x", "--use_peft", "--accelerate_config", "fsdp2"]
    shipped = Path(str(parse_command(trl, cwd=tmp_path, environ={"HOME": str(tmp_path)}).launch.config_file))
    (tmp_path / "trl_fsdp2.yaml").write_text(shipped.read_text())
    (tmp_path / "v1.json").write_text(json.dumps({"fsdp_version": 1, "transformer_layer_cls_to_wrap": "X"}))

    def read(*argv: str) -> Any:
        return parse_command([*launch, *TRL_SFT, *argv], cwd=tmp_path, environ={"HOME": str(tmp_path)})

    v1 = read("--fsdp_config", "v1.json")
    assert v1.launch.fsdp_version == 1 and v1.launch.offload and v1.read["fsdp_version (--fsdp_config)"] == "1"
    assert "the launcher's fsdp_version 2 does not apply" not in " ".join(v1.notes)
    inline = read("--fsdp_config", '{"version": 2}')
    assert inline.launch.fsdp_version == 2 and fsdp_assumptions(inline) == []
    unsaid = read()
    default = _trainer_default()
    assert unsaid.launch.fsdp_version == default
    (guess,) = fsdp_assumptions(unsaid)
    assert guess.startswith(f"FSDP{default}: the command does not say fsdp_version (TrainingArguments' default")
    if default == 1:
        assert any("the launcher's fsdp_version 2 does not apply" in n for n in unsaid.notes)
    away = read("--fsdp_config", "/elsewhere/fsdp.json")
    assert any("--fsdp_config /elsewhere/fsdp.json is not here" in n for n in away.notes)
    with pytest.raises(CommandReadError, match="--fsdp_config version: 3 is not an FSDP version"):
        read("--fsdp_config", '{"fsdp_version": 3}')


def test_a_trl_yaml_config_holds_fsdp_config_as_a_mapping(tmp_path: Path) -> None:
    (tmp_path / "sft.yaml").write_text(yaml.safe_dump({
        "model_name_or_path": "Qwen/Qwen2.5-7B", "use_peft": True, "load_in_4bit": True, "max_length": 2048,
        "fsdp": "full_shard auto_wrap", "fsdp_config": {"fsdp_version": 2, "cpu_offload": True}}))
    p = parse_command(["accelerate", "launch", "--num_processes", "4", "-m", "trl.scripts.sft", "--config", "sft.yaml"],
                      cwd=tmp_path, environ={"HOME": str(tmp_path)})
    assert (p.launch.strategy, p.launch.offload, p.launch.fsdp_version, p.launch.world_size) == ("fsdp", True, 2, 4)


def test_the_environment_in_front_says_it_too(tmp_path: Path) -> None:
    p = parse_command(["ACCELERATE_USE_FSDP=1", "FSDP_OFFLOAD_PARAMS=1", "FSDP_VERSION=2", "torchrun",
                       "--nproc_per_node", "2", "-m", *TRL_SFT[1:-2]], cwd=tmp_path, environ={"HOME": str(tmp_path)})
    assert (p.launch.strategy, p.launch.offload, p.launch.fsdp_version) == ("fsdp", True, 2)
    with pytest.raises(CommandReadError, match=r"^FSDP_VERSION: 0 is not an FSDP version"):
        parse_command(["ACCELERATE_USE_FSDP=1", "FSDP_VERSION=0", "python", "-m", *TRL_SFT[1:-2]], cwd=tmp_path,
                      environ={"HOME": str(tmp_path)})


def test_plan_takes_fsdp_version_as_a_flag_with_or_without_a_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """`plan --gpus N --strategy fsdp --offload params --fsdp-version 2`: the plain CLI plans FSDP2 too; before a
    command's `--` the flag replaces the command's version (and answers the guess); with another strategy it is one
    line and exit 2."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    base = ["plan", "--json", "--model", "Llama-2-70B", "--gpus", "2", "--strategy", "fsdp", "--offload", "params",
            "--batch-size", "1", "--seq-len", "2048"]
    figures = {}
    for version in ("1", "2"):
        assert main([*base, "--fsdp-version", version]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["gpus"]["plan"]["fsdp_version"] == int(version)
        figures[version] = data["host_bytes"]
    assert main(base) == 0
    assert json.loads(capsys.readouterr().out)["host_bytes"] == figures["1"]  # no flag, no command: FSDP1
    assert figures["1"] > 1.8 * figures["2"]
    # Before a command that leaves it unsaid: the flag's version, and no guess about it.
    code = main(["plan", "--json", "--gpu-memory", "24GiB", "--fsdp-version", "2", "--", *swift_argv(tmp_path)])
    out = capsys.readouterr()
    assert code == 0, out.err
    data = json.loads(out.out)
    assert data["gpus"]["plan"]["fsdp_version"] == 2 and not [a for a in data["assumed"] if "fsdp_version" in a]
    assert main(["plan", "--model", "Llama-2-7B", "--batch-size", "1", "--seq-len", "512", "--gpus", "2", "--strategy",
                 "ddp", "--fsdp-version", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--fsdp-version is for --strategy fsdp" in err[0]
