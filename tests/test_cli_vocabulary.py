"""One vocabulary across the subcommands (issue 25): --devices, --gpus N, --log, --gpu-memory, --seq-len.

Each old spelling still works for a release and says so in exactly one line on stderr; every --help ends with
examples that parse (and, where this CPU machine can, run); plan --json carries schema_version. Through the real
CLI: ``main([...])`` in this process, ``python -m vramscope`` in a child where a run's own output matters.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import fake_nvml
from vramscope.backends import nvml as nvml_backend
from vramscope.cli import build_parser, main
from vramscope.cli.common import renamed_note
from vramscope.cli.completion import command_flags
from vramscope.planner.gpus import get_gpu

SRC = str(Path(__file__).resolve().parent.parent / "src")
TRACES = Path(__file__).parent / "data" / "traces"
LOG = TRACES / "h200" / "clean_eval.csv"
GIB = 1024**3


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "vramscope", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def parsed(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[dict[str, object], list[str]]:
    """The namespace the real parser builds (without its bookkeeping) and the lines it wrote on stderr."""
    args = build_parser().parse_args(list(argv))
    values = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    return values, capsys.readouterr().err.splitlines()


# (subcommand and fixed arguments, old spelling and value, new spelling and value)
RENAMED = [
    (["watch"], ["--gpus", "0,1"], ["--devices", "0,1"]),
    (["watch"], ["--csv", "w.csv"], ["--log", "w.csv"]),
    (["run"], ["--gpus", "1"], ["--devices", "1"]),
    (["report", "x.csv"], ["--capacity", "24GiB"], ["--gpu-memory", "24GiB"]),
    (["tune", "--model-dir", "m"], ["--device", "1"], ["--devices", "1"]),
    (["tune", "--model-dir", "m"], ["--memory-limit", "24GiB"], ["--gpu-memory", "24GiB"]),
    (["tune", "--model-dir", "m", "--find-seq-len"], ["--max-len", "4096"], ["--max-seq-len", "4096"]),
    (["tune", "--model-dir", "m", "--batch-size", "2"], ["--max-seq-len"], ["--find-seq-len"]),
]


@pytest.mark.parametrize(("base", "old", "new"), RENAMED, ids=[" ".join(r[1]) for r in RENAMED])
def test_an_old_spelling_means_the_new_one_and_says_so_in_one_line(
    capsys: pytest.CaptureFixture[str], base: list[str], old: list[str], new: list[str]
) -> None:
    with_old, err_old = parsed(capsys, *base, *old)
    with_new, err_new = parsed(capsys, *base, *new)
    assert with_old == with_new
    assert err_new == []
    shown = f"{old[0]} (the switch)" if old == ["--max-seq-len"] else old[0]
    assert err_old == [renamed_note(shown, new[0])]
    assert err_old[0].endswith("the old spelling works until the next release")


def test_an_old_spelling_given_twice_is_noted_once(capsys: pytest.CaptureFixture[str]) -> None:
    values, err = parsed(capsys, "watch", "--csv", "a.csv", "--csv", "b.csv", "--gpus", "0")
    assert values["log"] == "b.csv" and values["gpus"] == [0]
    assert err == [renamed_note("--csv", "--log"), renamed_note("--gpus", "--devices")]


def test_old_spellings_are_hidden_from_help_and_completion(capsys: pytest.CaptureFixture[str]) -> None:
    flags = command_flags()
    for command, old in (("watch", "--csv"), ("watch", "--gpus"), ("run", "--gpus"), ("report", "--capacity"),
                         ("tune", "--memory-limit"), ("tune", "--device"), ("tune", "--max-len")):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert not re.search(rf"{old}(?![-\w])", capsys.readouterr().out), (command, old)
        assert old not in flags[command]
    assert {"--devices", "--log"} <= set(flags["watch"]) and "--gpu-memory" in flags["report"]
    assert {"--devices", "--gpu-memory", "--gpu", "--find-seq-len", "--max-seq-len"} <= set(flags["tune"])


def test_a_mistyped_old_spelling_is_pointed_at_the_new_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--memory-limt", "3GiB"]) == 2
    assert "did you mean --gpu-memory?" in capsys.readouterr().err
    assert main(["report", str(LOG), "--capacty", "3GiB"]) == 2
    assert "did you mean --gpu-memory?" in capsys.readouterr().err


def test_watch_with_the_old_spellings_still_logs_the_selected_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = fake_nvml.two_healthy_gpus(pid=os.getpid())
    monkeypatch.setattr(nvml_backend, "_load_pynvml", lambda: fake)
    for flags, log in ((("--csv", "--gpus"), tmp_path / "old.csv"), (("--log", "--devices"), tmp_path / "new.csv")):
        assert main(["watch", "--count", "2", "--interval", "0.05", flags[0], str(log), flags[1], "1"]) == 0
        err = capsys.readouterr().err.splitlines()
        assert len(err) == (2 if flags[0] == "--csv" else 0), err
        rows = log.read_text().splitlines()
        header = rows[0].split(",")
        gpus = {row.split(",")[header.index("gpu")] for row in rows[1:]}
        assert gpus == {"1"}, rows


def test_run_with_the_old_gpus_flag_runs_the_command(tmp_path: Path) -> None:
    done = cli("run", "--gpus", "0", "--json", "--log", str(tmp_path / "m.csv"), "--", sys.executable, "-c",
               "print('hello')")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "hello"
    assert json.loads(done.stdout.splitlines()[-1])["schema_version"] == 1
    notes = [line for line in done.stderr.splitlines() if "is now" in line]
    assert notes == [renamed_note("--gpus", "--devices")]


def test_report_capacity_old_and_new_give_the_same_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(LOG), "--capacity", "22GiB", "--json"]) == 0
    old = capsys.readouterr()
    assert main(["report", str(LOG), "--gpu-memory", "22GiB", "--json"]) == 0
    new = capsys.readouterr()
    assert json.loads(old.out) == json.loads(new.out)
    assert json.loads(new.out)["devices"]["0"]["capacity_bytes"] == 22 * GIB
    assert old.err.splitlines() == [renamed_note("--capacity", "--gpu-memory")] and new.err == ""


def test_tune_old_spellings_reach_the_model_check_with_one_note_each(tmp_path: Path) -> None:
    # No CUDA here: the real CLI goes as far as the model folder, which has no config.json.
    done = cli("tune", "--model-dir", str(tmp_path), "--seq-len", "64", "--device", "0", "--memory-limit", "3GiB")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        renamed_note("--device", "--devices"), renamed_note("--memory-limit", "--gpu-memory"),
        f"vramscope: error: {tmp_path} has no config.json; give a Hugging Face model folder"]


def test_tune_max_seq_len_with_a_value_alone_says_both_readings(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    done = cli("tune", "--model-dir", str(tmp_path), "--max-seq-len", "4096")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "vramscope: error: --max-seq-len 4096 is the longest length --find-seq-len tries: add --find-seq-len to "
        "find the longest sequence up to 4096, or give --seq-len 4096 to find the largest batch at 4096 tokens"]


def test_tune_takes_a_gpu_by_name_and_the_fused_optimizer(capsys: pytest.CaptureFixture[str]) -> None:
    values, err = parsed(capsys, "tune", "--model-dir", "m", "--seq-len", "64", "--gpu", "RTX-3090",
                         "--optim", "adamw_torch_fused", "--devices", "0")
    assert values["gpu_memory"] == get_gpu("RTX-3090").memory_bytes and values["optim"] == "adamw_torch_fused"
    assert err == []
    # the advice for a size without a unit names --gpu, which tune now takes
    assert main(["tune", "--model-dir", "m", "--gpu-memory", "24"]) == 2
    line = capsys.readouterr().err
    assert "--gpu RTX-3090" in line and len(line.splitlines()) == 1
    assert main(["tune", "--model-dir", "m", "--devices", "0,1"]) == 2
    assert "runs on one GPU; give one index, e.g. --devices 0" in capsys.readouterr().err


def test_tune_an_unreadable_command_says_what_tune_needs(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('a script vramscope cannot read')\n")
    done = cli("tune", "--", "python", "train.py", cwd=tmp_path)
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1
    assert "--model-dir DIR --seq-len S" in done.stderr and "plan it with" not in done.stderr
    extra = cli("tune", "4096", cwd=tmp_path)
    assert "e.g. vramscope tune -- trl sft" in extra.stderr


def examples(capsys: pytest.CaptureFixture[str], command: str) -> list[str]:
    with pytest.raises(SystemExit) as stop:
        main([command, "--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out.rstrip("\n")
    _, sep, tail = text.rpartition("\nexamples:\n")
    assert sep, f"{command} --help has no examples at its end"
    lines = tail.splitlines()
    assert 2 <= len(lines) <= 3 and all(line.startswith(f"  vramscope {command} ") for line in lines), lines
    return [line.strip() for line in lines]


@pytest.mark.parametrize("command", ["watch", "run", "report", "plan", "tune", "completion"])
def test_every_help_ends_with_examples_that_parse(capsys: pytest.CaptureFixture[str], command: str) -> None:
    for line in examples(capsys, command):
        words = shlex.split(line.split(" > ")[0])  # completion's examples redirect into a file
        build_parser().parse_args(words[1:])  # a UsageError would fail the test
        assert "is now" not in capsys.readouterr().err, line  # examples use the current spelling


def test_the_examples_that_run_on_this_machine_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    runnable = [line for command in ("watch", "report", "plan") for line in examples(capsys, command)
                if "--devices" not in line and "--log" not in line]
    runnable += [line for line in examples(capsys, "run") if "train.py" not in line]
    for name in ("mem.csv", "run1.csv", "run2.csv"):
        shutil.copy(LOG, tmp_path / name)
    assert len(runnable) >= 7
    for line in runnable:
        done = cli(*shlex.split(line)[1:], cwd=tmp_path)
        assert done.returncode == 0, (line, done.stderr)
    assert (tmp_path / "mem.html").stat().st_size > 0


def test_plan_json_carries_schema_version(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--model", "Llama-2-7B", "--batch-size", "2", "--seq-len", "1024", "--json"]
    assert main(base) == 0
    assert json.loads(capsys.readouterr().out)["schema_version"] == 1
    assert main([*base, "--gpus", "2", "--strategy", "fsdp"]) == 0
    assert json.loads(capsys.readouterr().out)["schema_version"] == 1


@pytest.mark.parametrize("module", ["hf", "lightning"])
def test_both_callbacks_take_prometheus_and_the_old_prometheus_port(module: str) -> None:
    mod = pytest.importorskip(f"vramscope.integrations.{module}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the canonical keyword warns about nothing
        new = mod.MemoryMonitorCallback(prometheus=9464, warn=False)
    with pytest.warns(FutureWarning) as caught:
        old = mod.MemoryMonitorCallback(prometheus_port=9464, warn=False)
    assert [str(w.message) for w in caught] == [
        "prometheus_port= is now prometheus=; the old name works until the next release"]
    assert caught[0].filename == __file__  # it points at the line that built the callback
    assert new.settings.prometheus == old.settings.prometheus == "127.0.0.1:9464"
    with pytest.raises(TypeError, match="prometheus= only"):
        mod.MemoryMonitorCallback(prometheus=9464, prometheus_port=9464)
    new.monitor.close()
    old.monitor.close()


def test_the_fused_adamw_tune_now_offers_is_built_and_steps() -> None:
    torch = pytest.importorskip("torch")
    from vramscope.recipe import QLoraSpec
    from vramscope.tune.qlora import make_optimizer

    model = torch.nn.Linear(4, 4)
    optimizer = make_optimizer(model, QLoraSpec(optim="adamw_torch_fused"))
    assert isinstance(optimizer, torch.optim.AdamW)
    before = model.weight.detach().clone()
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    assert not torch.equal(before, model.weight)
