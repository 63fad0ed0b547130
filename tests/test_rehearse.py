"""`vramscope tune --gpus N -- <launcher command>` on the CPU (issue 27): the launcher's worker runs once as rank 0
of N under the trial machinery with the launcher's variables and the fake process group (a real HF Trainer, a
real child process, DDP over the fake group); DeepSpeed is planned, not rehearsed, in one line; every bad input
is one line and exit 2. The memory figures and the search need CUDA: tests/test_rehearse_gpu.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vramscope.cli import main
from vramscope.tune.command import run_trial_child
from vramscope.tune.command_trial import TrialRequest
from vramscope.tune.launch_env import worker_launch
from vramscope.tune.rehearsal_pg import rehearsal_environment
from vramscope.tune.rehearse import CANNOT_SEE, DEEPSPEED_NOT_REHEARSED, RehearsalRefused, nccl_share, refuse

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hf_trainer_lora.py"
LLAMA_7B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
            "max_position_embeddings": 4096, "architectures": ["LlamaForCausalLM"]}


@pytest.mark.slow  # a child Python with transformers and peft: 15-20 s here
def test_a_torchrun_command_rehearses_as_rank_0_of_4_on_the_fake_group(tmp_path: Path, tiny_llama_dir: Path) -> None:
    argv = ["torchrun", "--standalone", "--nproc_per_node", "2", str(EXAMPLE), "--model_name_or_path",
            str(tiny_llama_dir), "--output_dir", str(tmp_path / "out"), "--per_device_train_batch_size", "2",
            "--max_steps", "50", "--report_to", "none", "--use_cpu", "--rows", "8", "--max_seq_length", "16"]
    launch = worker_launch(argv, 4, environ=os.environ, cwd=tmp_path)
    assert launch.argv[1:3] == ("-u", str(EXAMPLE)) and launch.strategy == "ddp"
    env = {**os.environ, **launch.env, **rehearsal_environment(4)}
    request = TrialRequest(batch_size=3, seq_len=24, max_steps=2, record=str(tmp_path / "trial.json"))
    outcome = run_trial_child(launch.argv, request, log_path=str(tmp_path / "trial.log"), environ=env, timeout_s=300)
    log = (tmp_path / "trial.log").read_text()
    assert outcome.trial.ok, log[-2000:]
    # The Trainer asked accelerate for a gloo group of WORLD_SIZE=4 at MASTER_ADDR:MASTER_PORT, where nothing
    # listens and no other rank comes: it got rank 0 of 4 on the fake group, and DDP trained over it.
    assert "rehearsal: rank 0 of 4 on torch's fake process group (asked for gloo)" in log
    record = outcome.record
    assert record.status == "done" and [s.inputs for s in record.steps] == [((3, 24),), ((3, 24),)]
    assert record.model_class == "DistributedDataParallel" or (record.parameters or 0) > 0
    assert all((s.rss_bytes or 0) > 50 * 2**20 for s in record.steps)  # the host memory, for CPU offload
    assert not list((tmp_path / "out").glob("checkpoint-*")) if (tmp_path / "out").exists() else True


def _zero3_command(folder: Path, config: dict[str, object], batch: int, seq: int) -> list[str]:
    """A 4-bit HF Trainer command under DeepSpeed ZeRO-3 on 4 GPUs, its model a local config.json."""
    model = folder / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config), encoding="utf-8")
    ds = folder / "ds.json"
    ds.write_text('{"zero_optimization": {"stage": 3}}', encoding="utf-8")
    return ["deepspeed", "--num_gpus", "4", str(EXAMPLE), "--model_name_or_path", str(model), "--deepspeed", str(ds),
            "--output_dir", str(folder / "o"), "--per_device_train_batch_size", str(batch), "--max_seq_length",
            str(seq), "--load_in_4bit", "--bf16", "--gradient_checkpointing"]


def test_deepspeed_is_planned_not_rehearsed_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _zero3_command(tmp_path, LLAMA_7B, batch=2, seq=1024)
    code = main(["tune", "--gpus", "4", "--gpu-memory", "24GiB", "--", *argv])
    out = capsys.readouterr()
    assert code == 0
    assert out.err.count("\n") == 1 and "DeepSpeed is not rehearsed" in out.err and "planned only" in out.err
    assert out.out.startswith("planned per GPU of 4 (zero3, batch 2 x 1024): peak allocated ")
    assert "fits in 24.00 GiB per GPU" in out.out
    code = main(["tune", "--gpus", "4", "--json", "--", *argv])
    data = json.loads(capsys.readouterr().out)
    assert data["schema_version"] == 1 and data["rehearsed"] is False
    assert data["plan"]["strategy"] == "zero3" and data["plan"]["world_size"] == 4
    assert data["peak_allocated_bytes"] == data["plan"]["per_gpu"][0]["peak_allocated_bytes"]


def test_a_deepspeed_plan_fits_only_where_its_loading_fits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Under transformers 5 each ZeRO-3 rank loads the whole 4-bit 70B (about 36 GiB) onto its own GPU before it is
    # partitioned: the step, a quarter of the model a rank, fits 24 GiB; the run does not. The verdict was the step's.
    config = {**LLAMA_7B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
              "num_attention_heads": 64, "num_key_value_heads": 8}
    argv = _zero3_command(tmp_path, config, batch=1, seq=128)
    assert main(["tune", "--gpus", "4", "--gpu-memory", "24GiB", "--json", "--", *argv]) == 0
    data = json.loads(capsys.readouterr().out)
    worst = data["plan"]["per_gpu"][0]
    assert data["loading_sets_peak"] is True and data["fits"] is False
    assert data["peak_device_bytes"] == data["load_device_bytes"] == worst["load_device_bytes"] > 24 * 2**30
    assert worst["device_bytes"] < 24 * 2**30  # the step alone would have fitted
    assert main(["tune", "--gpus", "4", "--gpu-memory", "24GiB", "--", *argv]) == 0
    text = capsys.readouterr().out
    assert "; loading the model holds more: " in text and "does NOT fit in 24.00 GiB per GPU" in text


def test_what_is_refused_and_the_nccl_share(tmp_path: Path) -> None:
    launch = worker_launch(["torchrun", "--nproc_per_node", "8", "t.py"], 8, environ={}, cwd=tmp_path)
    assert nccl_share(launch) == 688 * 1000**2  # the planner's figure for more than two ranks
    assert nccl_share(worker_launch(["torchrun", "t.py"], 2, environ={}, cwd=tmp_path)) == 585_105_408
    with pytest.raises(RehearsalRefused, match="DeepSpeed is not rehearsed"):
        refuse(worker_launch(["deepspeed", "t.py"], 2, environ={}, cwd=tmp_path))
    with pytest.raises(RehearsalRefused, match="--gpus 1"):
        refuse(worker_launch(["torchrun", "t.py"], 1, environ={}, cwd=tmp_path))
    assert len(CANNOT_SEE) >= 2 and "NCCL" in CANNOT_SEE[0] and "rank 0" in CANNOT_SEE[1]
    assert "\n" not in DEEPSPEED_NOT_REHEARSED and DEEPSPEED_NOT_REHEARSED.endswith("planned only")  # one line


@pytest.mark.parametrize(("argv", "says"), [
    (["--gpus", "2"], "rehearses a launcher command"),
    (["--gpus", "0", "--", "torchrun", "t.py"], "--gpus"),
    (["--gpus", "2", "--gpu-memory", "24", "--", "torchrun", "t.py"], "unit"),
    (["--gpus", "2", "--devices", "1", "--", "torchrun", "t.py"], "--devices do not apply"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:  # argparse's own refusals (a bad --gpus, a size without a unit) exit from inside main
        code = main(["tune", *argv])
    except SystemExit as exc:
        code = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert code == 2 and says in err, err
    assert err.strip().splitlines()[-1].count(says) == 1 or len(err.strip().splitlines()) <= 2


def test_without_a_cuda_gpu_the_rehearsal_says_to_plan(tiny_llama_dir: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    code = main(["tune", "--gpus", "2", "--", "torchrun", "--nproc_per_node", "2", str(EXAMPLE),
                 "--model_name_or_path", str(tiny_llama_dir), "--output_dir", str(tmp_path / "o"),
                 "--max_seq_length", "64"])
    err = capsys.readouterr().err
    assert code == 2 and "torch sees none" in err and "vramscope plan --gpus 2 -- <command>" in err


def test_the_result_names_rank_0s_peaks_nccl_the_plan_and_what_it_cannot_see(tmp_path: Path) -> None:
    """The result and its text, from a trial record of the shape the trial child writes (its CUDA fields)."""
    from vramscope.cli.tune_rehearse import format_rehearsal
    from vramscope.commands import parse_command
    from vramscope.tune.command import CommandTrial, CommandTuneResult
    from vramscope.tune.rehearse import RehearsalResult, _rank_peak, plan_for, worker_of
    from vramscope.tune.search import Trial, TuneResult
    from vramscope.tune.trial_record import TrialRecord

    model = tmp_path / "llama7b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_7B), encoding="utf-8")
    config = tmp_path / "fsdp.yaml"
    config.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\nnum_processes: 4\n", encoding="utf-8")
    parsed = parse_command(["accelerate", "launch", "--config_file", str(config), str(EXAMPLE), "--model_name_or_path",
                            str(model), "--output_dir", "o", "--max_seq_length", "2048", "--load_in_4bit", "--bf16",
                            "--gradient_checkpointing"], cwd=tmp_path)
    launch = worker_of(parsed, 4, environ={}, cwd=str(tmp_path))
    gib = 2**30
    steps = [{"step": 1, "peak_allocated_bytes": 5 * gib, "peak_reserved_bytes": 6 * gib,
              "device_used_bytes": 9 * gib, "process_gpu_bytes": 7 * gib, "rss_bytes": 3 * gib},
             {"step": 2, "peak_allocated_bytes": 5 * gib + 1, "peak_reserved_bytes": 6 * gib,
              "device_used_bytes": 9 * gib, "process_gpu_bytes": 7 * gib, "rss_bytes": 3 * gib}]
    record = TrialRecord.from_json({"status": "done", "steps": steps, "parameters": 6_900_000_000,
                                    "parameters_held": 1_725_000_000})
    trial = Trial(size=3, ok=True, base_bytes=gib, peak_bytes=5 * gib + 1, seconds=30.0, peak_reserved_bytes=6 * gib)
    done = CommandTrial(trial, 20 * gib, record, "trial1.log")
    tune = CommandTuneResult(
        result=TuneResult(size=3, margin=0.05, margin_bytes=gib, capacity_bytes=20 * gib, peak_bytes=5 * gib + 1,
                          headroom_bytes=14 * gib, limit_size=3, predicted_max=9, fixed_bytes=None,
                          bytes_per_unit=None, trials=(trial,), ooms=0, seconds=30.0, peak_reserved_bytes=6 * gib),
        unit="batch", batch_size=3, seq_len=2048, setting="--per_device_train_batch_size 3", keep_effective=None,
        trials=(done,), notes=())
    nccl = 688 * 1000**2
    result = RehearsalResult(launch=launch, tune=tune, ranks=(_rank_peak(done, nccl),), gpu_memory_bytes=24 * gib,
                             planned=plan_for(parsed, launch, 3, 2048), notes=("a note",))
    out = result.to_dict()
    r = out["rehearsal"]
    rank = r["ranks"][0]
    # NVML's figure for the process wins over the GPU's whole use; the NCCL share is added to it.
    assert rank["device_used_bytes"] == 7 * gib and rank["process_bytes"] == 7 * gib + nccl
    assert rank["peak_allocated_bytes"] == 5 * gib + 1 and rank["host_rss_bytes"] == 3 * gib
    assert (r["how"], r["world_size"], r["strategy"], r["fsdp_version"]) == ("fake_pg", 4, "fsdp", 2)
    assert r["planned"]["strategy"] == "fsdp" and r["planned"]["peak_allocated_bytes"] > 0
    text = format_rehearsal(out)
    for line in ("per GPU of 4 (fsdp, rehearsed as rank 0 on torch's fake process group):",
                 "largest per-device batch at 2048 tokens: 3", "set: --per_device_train_batch_size 3",
                 "rank 0 holds 1725.0M of the model's 6900.0M parameters",
                 "planned (vramscope plan, fsdp over 4, batch 3 x 2048)",
                 "a rehearsal cannot see:", "NCCL's own buffers", "note: a note"):
        assert line in text, line
    assert "+ NCCL 0.64 GiB (modelled) = process 7.64 GiB" in text


@pytest.mark.parametrize("fsdp_version", [1, 2])
@pytest.mark.parametrize(("batch", "seq", "loading_sets_it"), [(1, 128, True), (3, 2048, False)])
def test_the_rehearsals_plan_is_the_planners_with_the_runs_peak_and_what_set_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], batch: int, seq: int, loading_sets_it: bool,
        fsdp_version: int) -> None:
    """A 4-bit base under FSDP: every rank loads the whole quantized model before it is sharded, which at a small
    step holds more than the step. The step's figures stay what they were (a trial's peaks are its steps'); the
    run's peak and what set it are beside them, each the same as ``vramscope plan --gpus 4 --json -- CMD``'s for
    the launch's FSDP version (FSDP1 flattens a unit beside the loaded model; FSDP2 does not)."""
    from vramscope.commands import parse_command
    from vramscope.tune.rehearse import plan_for, worker_of

    model = tmp_path / "llama7b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_7B), encoding="utf-8")
    config = tmp_path / "fsdp.yaml"
    config.write_text(f"distributed_type: FSDP\nfsdp_config:\n  fsdp_version: {fsdp_version}\nnum_processes: 4\n",
                      encoding="utf-8")
    argv = ["accelerate", "launch", "--config_file", str(config), str(EXAMPLE), "--model_name_or_path", str(model),
            "--output_dir", "o", "--max_seq_length", str(seq), "--per_device_train_batch_size", str(batch),
            "--load_in_4bit", "--bf16", "--gradient_checkpointing"]
    parsed = parse_command(argv, cwd=tmp_path)
    planned = plan_for(parsed, worker_of(parsed, 4, environ={}, cwd=str(tmp_path)), batch, seq)
    assert planned is not None
    assert main(["plan", "--gpus", "4", "--strategy", "fsdp", "--json", "--", *argv]) == 0
    document = json.loads(capsys.readouterr().out)
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "process_bytes", "device_bytes", "host_bytes",
                "load_device_bytes", "loading_sets_peak"):
        assert planned[key] == document[key], key
    assert planned["loading_sets_peak"] is loading_sets_it
    assert planned["peak_device_bytes"] == max(planned["device_bytes"], planned["load_device_bytes"])
    assert (planned["peak_device_bytes"] > planned["device_bytes"]) is loading_sets_it
    assert planned["load_moment"] == document["gpus"]["plan"]["per_gpu"][0]["load_moment"] != ""
