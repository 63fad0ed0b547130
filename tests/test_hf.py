"""MemoryMonitorCallback in a real transformers.Trainer run on a tiny CPU model (a few seconds)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vramscope.integrations import hf  # noqa: E402
from vramscope.integrations.hf import MemoryMonitorCallback, prometheus_address  # noqa: E402
from vramscope.logs.reader import read_log  # noqa: E402

VOCAB = 128


def tiny_llama() -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, vocab_size=VOCAB,
                                      max_position_embeddings=128)
    return transformers.LlamaForCausalLM(config)


def dataset(lengths: list[int]) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(1)
    return [{"input_ids": torch.randint(0, VOCAB, (n,), generator=gen)} for n in lengths]


def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Pad to the longest item: the batch's shape is what its memory follows."""
    width = max(len(i["input_ids"]) for i in items)
    ids = torch.zeros(len(items), width, dtype=torch.long)
    labels = torch.full((len(items), width), -100, dtype=torch.long)
    for row, item in enumerate(items):
        ids[row, : len(item["input_ids"])] = item["input_ids"]
        labels[row, : len(item["input_ids"])] = item["input_ids"]
    return {"input_ids": ids, "labels": labels}


class SeesLogs(transformers.TrainerCallback):  # type: ignore[misc]
    """Stands for a report_to integration: registered before ours, it records what on_log gets."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
        self.seen.append(dict(logs or {}))


def train(tmp_path: Path, callback: MemoryMonitorCallback, steps: int = 10) -> tuple[Any, SeesLogs]:
    lengths = [8 + (7 * i) % 24 for i in range(2 * steps)]  # batches of 2, padded to 8..31 tokens
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=2,
        per_device_eval_batch_size=4, eval_strategy="steps", eval_steps=5, logging_steps=5,
        save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, learning_rate=1e-3,
        dataloader_num_workers=0, remove_unused_columns=False,
    )
    sees = SeesLogs()
    trainer = transformers.Trainer(model=tiny_llama(), args=args, train_dataset=dataset(lengths),
                                   eval_dataset=dataset([40] * 8), data_collator=collate,
                                   callbacks=[sees, callback])
    trainer.train()
    return trainer, sees


def test_a_trainer_run_logs_every_step_with_tokens_and_eval_as_its_own_phase(tmp_path: Path) -> None:
    log = tmp_path / "mem.csv"
    callback = MemoryMonitorCallback(log=log, warn=False)
    train(tmp_path, callback)
    table = read_log(log)
    rows = list(zip(table.ints("step"), table.strings("phase"), table.ints("tokens"), strict=True))
    train_rows = [(s, t) for s, p, t in rows if p == "train"]
    assert [s for s, _ in train_rows] == list(range(1, 11))
    # tokens: batch x padded length, read by the forward hook (2 x 8..31).
    assert all(t is not None and 16 <= t <= 62 and t % 2 == 0 for _, t in train_rows)
    assert len({t for _, t in train_rows}) > 3
    eval_rows = [(s, t) for s, p, t in rows if p == "eval"]
    assert eval_rows == [(5, 160), (10, 160)]  # eval batches of 4 x 40, after steps 5 and 10
    analysis = json.loads((tmp_path / "mem.analysis.json").read_text())
    assert analysis["steps"]["last"] == 10
    assert set(analysis["peak"]["devices"]["host"]["phases"]) >= {"train", "eval"}
    callback.close()


def test_figures_reach_the_trainers_logs_before_the_report_integrations(tmp_path: Path) -> None:
    callback = MemoryMonitorCallback(warn=False)
    trainer, sees = train(tmp_path, callback)
    handler = trainer.callback_handler.callbacks
    assert handler[0] is callback  # moved in front of the integrations
    loss_logs = [logs for logs in sees.seen if "loss" in logs]
    assert loss_logs and all(logs["mem/host_rss_gib"] > 0 for logs in loss_logs)
    assert all("mem/peak_rss_gib" in logs for logs in loss_logs)
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert all("mem/host_rss_gib" in h for h in history)  # in trainer_state.json too
    callback.close()


def test_bad_arguments_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="every_n_steps"):
        MemoryMonitorCallback(every_n_steps=0)


def test_without_transformers_the_error_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hf, "_CallbackBase", object)
    with pytest.raises(ImportError, match=r"pip install 'vramscope\[hf\]'"):
        MemoryMonitorCallback()


def test_prometheus_port_or_address() -> None:
    assert prometheus_address(19400) == "127.0.0.1:19400"
    assert prometheus_address("0.0.0.0:19400") == "0.0.0.0:19400"
    assert prometheus_address(None) is None


def test_the_public_path_is_the_training_callback_itself() -> None:
    # Users import vramscope.integrations.hf (README, docs); vramscope run's injection and isinstance checks
    # see vramscope.integrations.hf: one class, so a callback added by hand is never added a second time.
    assert MemoryMonitorCallback is hf.MemoryMonitorCallback and prometheus_address is hf.prometheus_address


def test_evaluation_memory_is_logged_under_eval_and_each_step_once(tmp_path: Path) -> None:
    callback = MemoryMonitorCallback(warn=False)
    _, sees = train(tmp_path, callback)
    eval_logs = [logs for logs in sees.seen if "eval_loss" in logs]
    assert len(eval_logs) == 2
    for logs in eval_logs:  # HF files keys that do not start with eval_ under train/: none of ours may
        ours = [k for k in logs if "mem/" in k]
        assert ours and all(k.startswith("eval_mem/") for k in ours), ours
        assert logs["eval_mem/peak_rss_gib"] > 0
    loss_logs = [logs for logs in sees.seen if "loss" in logs]
    assert all(not any(k.startswith("eval_mem/") for k in logs) for logs in loss_logs)
    summary = next(logs for logs in sees.seen if "train_runtime" in logs)
    # The last step (10) went out with its own log: the summary carries the run's peak and nothing twice.
    assert set(k for k in summary if k.startswith("mem/")) == {"mem/peak_rss_gib"}
    assert summary["mem/peak_rss_gib"] == max(logs["mem/peak_rss_gib"] for logs in loss_logs)


def test_train_twice_writes_a_new_log_and_keeps_the_first(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = tmp_path / "mem.csv"
    callback = MemoryMonitorCallback(log=log, warn=False)
    trainer, _ = train(tmp_path, callback)
    assert callback.monitor.closed  # closed at train end: the lock is released
    first = read_log(log)
    with caplog.at_level("WARNING", logger="vramscope.integrations.loop"):
        trainer.train()
    assert [r.getMessage() for r in caplog.records if "mem-2.csv" in r.getMessage()]
    assert read_log(log).ints("step") == first.ints("step")  # the first run's rows are whole
    second = read_log(tmp_path / "mem-2.csv")
    assert [s for s, p in zip(second.ints("step"), second.strings("phase"), strict=True) if p == "train"]
    callback.close()


def test_a_new_callback_on_a_log_still_open_in_this_process_closes_the_old_one(tmp_path: Path,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    log = tmp_path / "mem.csv"
    interrupted = MemoryMonitorCallback(log=log, warn=False)
    interrupted.monitor.start()  # a cell whose train() was interrupted: on_train_end never came
    interrupted.monitor.step(1)
    rerun = MemoryMonitorCallback(log=log, warn=False)
    with caplog.at_level("WARNING", logger="vramscope.integrations.loop"):
        train(tmp_path, rerun)
    assert interrupted.monitor.closed
    messages = [r.getMessage() for r in caplog.records]
    assert any("still being written" in m and "mem-2.csv" in m for m in messages), messages
    assert not any("another process" in m for m in messages)
    assert 1 in read_log(log).ints("step")  # the interrupted run's row survived
    assert 10 in read_log(tmp_path / "mem-2.csv").ints("step")


def test_the_monitor_takes_overwrite(tmp_path: Path) -> None:
    from vramscope.integrations.loop import MemoryMonitor
    from vramscope.logs.files import LogExistsError

    log = tmp_path / "theirs.csv"
    log.write_text("time,elapsed_s\n2026-01-01T00:00:00.000+00:00,0\n")
    with pytest.raises(LogExistsError):
        MemoryMonitor(log=log, overwrite=False).start()
    assert "2026-01-01" in log.read_text()
    with MemoryMonitor(log=tmp_path / "fresh.csv", overwrite=False) as monitor:
        monitor.step(1)
    assert read_log(tmp_path / "fresh.csv").ints("step")
