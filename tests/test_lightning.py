"""The Lightning callback in a real Lightning Trainer run on a tiny CPU model."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning.pytorch")

from vramscope.integrations import lightning as vs_lightning  # noqa: E402
from vramscope.integrations.lightning import MemoryMonitorCallback  # noqa: E402
from vramscope.logs.reader import read_log  # noqa: E402

VOCAB = 64


class TinyLM(L.LightningModule):  # type: ignore[misc,name-defined]
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, VOCAB)

    def _loss(self, batch: dict[str, Any]) -> Any:
        ids = batch["input_ids"]
        logits = self.head(self.embed(ids))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids.reshape(-1))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
        return self._loss(batch)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader(lengths: list[int], batch: int) -> Any:
    gen = torch.Generator().manual_seed(0)
    items = [{"input_ids": torch.randint(0, VOCAB, (n,), generator=gen)} for n in lengths]

    def collate(group: list[dict[str, Any]]) -> dict[str, Any]:
        width = max(len(i["input_ids"]) for i in group)
        ids = torch.zeros(len(group), width, dtype=torch.long)
        for row, item in enumerate(group):
            ids[row, : len(item["input_ids"])] = item["input_ids"]
        return {"input_ids": ids}

    return torch.utils.data.DataLoader(items, batch_size=batch, collate_fn=collate)


def test_lightning_fit_logs_optimizer_steps_validation_and_figures(tmp_path: Path) -> None:
    torch.manual_seed(0)
    log = tmp_path / "mem.csv"
    callback = MemoryMonitorCallback(log=log, warn=False)
    trainer = L.Trainer(
        max_steps=6, accumulate_grad_batches=2, val_check_interval=4, limit_val_batches=2, num_sanity_val_steps=1,
        accelerator="cpu", logger=L.loggers.CSVLogger(tmp_path / "logs"), log_every_n_steps=1,
        enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False, callbacks=[callback],
    )
    lengths = [4 + i % 9 for i in range(40)]  # 2 x 4..12 tokens per micro-batch
    trainer.fit(TinyLM(), loader(lengths, 2), loader([20] * 8, 4))
    table = read_log(log)
    rows = list(zip(table.ints("step"), table.strings("phase"), table.ints("tokens"), strict=True))
    train = [(s, t) for s, p, t in rows if p == "train"]
    # One row per optimizer step, not per micro-batch (accumulate_grad_batches=2) ...
    assert [s for s, _ in train] == [1, 2, 3, 4, 5, 6]
    # ... carrying the larger of its two micro-batches.
    assert all(t is not None and 8 <= t <= 24 for _, t in train)
    evals = [(s, t) for s, p, t in rows if p == "eval"]
    assert len(evals) >= 2 and all(t == 80 for _, t in evals)  # sanity check + validation, 4 x 20
    assert callback.monitor.closed and (tmp_path / "mem.analysis.json").is_file()
    # what held memory: the module's parameters, and SGD without momentum keeps no states
    held = json.loads((tmp_path / "mem.breakdown.json").read_text())
    assert held["trainable_params"] == (VOCAB * 16) + (16 * VOCAB + VOCAB)
    assert held["lora_weights"] == 4 * held["trainable_params"] and held["optimizer_states"] == 0
    metrics = next((tmp_path / "logs").rglob("metrics.csv"))
    with metrics.open() as handle:
        header = next(csv.reader(handle))
    assert "mem/host_rss_gib" in header


def test_without_lightning_the_error_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vs_lightning, "_CallbackBase", object)
    with pytest.raises(ImportError, match=r"pip install 'vramscope\[lightning\]'"):
        MemoryMonitorCallback()


HELD_BYTES = 256 * 1024**2


class HoldsMemoryOnce(TinyLM):
    """Holds 256 MiB (touched, so resident) from training step 3 until step 4 begins: only step 3 sees it."""

    def __init__(self) -> None:
        super().__init__()
        self.held: Any = None

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
        self.held = torch.ones(HELD_BYTES // 4) if batch_idx == 2 else None
        return self._loss(batch)


def logged_metrics(folder: Path) -> list[dict[str, str]]:
    with next(folder.rglob("metrics.csv")).open() as handle:
        return list(csv.DictReader(handle))


def test_a_peak_on_an_unlogged_step_reaches_the_next_logged_step(tmp_path: Path) -> None:
    """Lightning logs every 5th step here; the memory held during step 3 only is in step 5's figures.

    On this CPU the per-step rows carry the process's RSS at the end of each step (no allocator
    peak without CUDA), so step 3's row holds the 256 MiB; on a GPU the same code carries the
    allocator's peak of each row. The logged figure is the largest row since the last logged step.
    """
    torch.manual_seed(0)
    log = tmp_path / "mem.csv"
    trainer = L.Trainer(
        max_steps=7, accelerator="cpu", logger=L.loggers.CSVLogger(tmp_path / "logs"), log_every_n_steps=5,
        limit_val_batches=0, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
        callbacks=[MemoryMonitorCallback(log=log, warn=False)],
    )
    trainer.fit(HoldsMemoryOnce(), loader([8] * 16, 2))
    table = read_log(log)
    rss = {s: r for s, p, r in zip(table.ints("step"), table.strings("phase"), table.ints("host_rss_bytes"),
                                    strict=True) if p in ("start", "train") and r is not None}
    assert rss[3] - rss[5] > HELD_BYTES * 0.9  # the step log saw it at step 3, and it was gone by step 5
    rows = [r for r in logged_metrics(tmp_path / "logs") if r.get("mem/peak_rss_gib")]
    by_step = {int(r["step"]): r for r in rows}
    at_five = by_step[4]  # Lightning's steps are 0-based: this is step 5
    assert float(at_five["mem/peak_rss_gib"]) == round(max(rss[s] for s in (None, 1, 2, 3, 4, 5)) / 1024**3, 4)
    assert float(at_five["mem/peak_rss_gib"]) - float(at_five["mem/host_rss_gib"]) > 0.2  # not step 5's own
    assert sorted(by_step) == [4, 6]  # and steps 6-7, after the last logging step, at the end of fit
    assert float(by_step[6]["mem/peak_rss_gib"]) == round(max(rss[6], rss[7]) / 1024**3, 4)


def _trainer(tmp_path: Path, callbacks: list[Any] | None = None) -> Any:
    return L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                     enable_checkpointing=False, enable_model_summary=False, callbacks=callbacks,
                     default_root_dir=tmp_path)


def test_attach_lightning_adds_the_callback_once_and_leaves_the_users_own(tmp_path: Path) -> None:
    from vramscope.run.inject import ENV_STEP_LOG, attach_lightning

    env = {ENV_STEP_LOG: str(tmp_path / "mem.steps.csv")}
    trainer = _trainer(tmp_path)
    callback = attach_lightning(trainer, environ=env)
    assert isinstance(callback, MemoryMonitorCallback) and trainer.callbacks[0] is callback
    assert callback.monitor.settings.log is not None
    assert attach_lightning(trainer, environ=env) is None  # already there
    mine = MemoryMonitorCallback(warn=False)
    assert attach_lightning(_trainer(tmp_path, callbacks=[mine]), environ=env) is None  # the user's own one wins


LIGHTNING_SCRIPT = textwrap.dedent(
    """
    import lightning.pytorch as L
    import torch

    torch.set_num_threads(1)

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(32, 8)
            self.head = torch.nn.Linear(8, 32)

        def training_step(self, batch, batch_idx):
            ids = batch[0]
            return torch.nn.functional.cross_entropy(self.head(self.embed(ids)).reshape(-1, 32), ids.reshape(-1))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randint(0, 32, (8, 6)))
    trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=L.loggers.CSVLogger("logs"), log_every_n_steps=1,
                        enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=2))
    print("first callback:", type(trainer.callbacks[0]).__name__)
    """
)


@pytest.mark.slow
def test_vramscope_run_attaches_the_callback_to_an_unmodified_lightning_script(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(LIGHTNING_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMSCOPE_")}
    command = [sys.executable, "-m", "vramscope", "run", "--quiet", "--log", "mem.csv", "--",
               sys.executable, "train.py"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "first callback: MemoryMonitorCallback" in result.stdout
    steps = read_log(tmp_path / "mem.steps.csv")
    rows = list(zip(steps.ints("step"), steps.strings("phase"), steps.ints("tokens"), strict=True))
    assert [(s, t) for s, p, t in rows if p == "train"] == [(1, 12), (2, 12), (3, 12)]  # 2 x 6 tokens
    assert (tmp_path / "mem.steps.analysis.json").is_file()
    assert all(r.get("mem/host_rss_gib") for r in logged_metrics(tmp_path / "logs") if r.get("mem/peak_rss_gib"))
    assert any(r.get("mem/peak_rss_gib") for r in logged_metrics(tmp_path / "logs"))


def test_batch_tokens_come_from_token_ids_only() -> None:
    from vramscope.integrations.lightning import lightning_batch_tokens

    ids = torch.zeros(4, 16, dtype=torch.long)
    assert lightning_batch_tokens({"input_ids": ids, "labels": ids}) == (64, (4, 16))
    assert lightning_batch_tokens([ids, ids]) == (64, (4, 16))  # a TensorDataset's (ids, labels)
    assert lightning_batch_tokens(ids) == (64, (4, 16))
    assert lightning_batch_tokens({"inputs_embeds": torch.zeros(2, 8, 32)}) == (16, (2, 8))
    # Not token ids: left empty, never a count of pixels or features.
    assert lightning_batch_tokens((torch.zeros(4, 3, 32, 32), torch.zeros(4, dtype=torch.long))) == (None, None)
    assert lightning_batch_tokens({"pixel_values": torch.zeros(4, 3, 8, 8)}) == (None, None)
    assert lightning_batch_tokens([]) == (None, None)


def test_a_log_that_cannot_be_created_never_stops_the_fit(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "mem.csv").mkdir()  # a folder where the log should go: the monitor cannot start
    callback = MemoryMonitorCallback(log=tmp_path / "mem.csv", warn=False)
    trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, enable_model_summary=False, callbacks=[callback])
    with caplog.at_level("WARNING", logger="vramscope"):
        trainer.fit(TinyLM(), loader([8] * 12, 2))
    assert trainer.global_step == 3  # all steps trained
    assert sum("memory callback stopped" in r.getMessage() for r in caplog.records) == 1


def test_the_public_path_is_the_training_callback_itself() -> None:
    # Users import vramscope.integrations.lightning (README, docs); the injection sees vramscope.integrations.lightning.
    assert MemoryMonitorCallback is vs_lightning.MemoryMonitorCallback


def test_figures_reach_callback_metrics_so_early_stopping_can_watch_them(tmp_path: Path) -> None:
    torch.manual_seed(0)
    callback = MemoryMonitorCallback(log=tmp_path / "mem.csv", warn=False)
    # EarlyStopping on a memory figure: it raises at the first check if the figure is not in callback_metrics.
    stop = L.callbacks.EarlyStopping(monitor="mem/host_rss_gib", mode="min", patience=100,
                                     check_on_train_epoch_end=True, strict=True)
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, log_every_n_steps=1, enable_progress_bar=False,
                        enable_checkpointing=False, enable_model_summary=False, callbacks=[callback, stop],
                        limit_val_batches=0)
    trainer.fit(TinyLM(), loader([6] * 8, 2))
    assert trainer.current_epoch == 2  # both epochs ran: the monitored figure was there at each check
    assert float(trainer.callback_metrics["mem/host_rss_gib"]) > 0


def test_validate_and_test_are_monitored_and_each_is_its_own_log(tmp_path: Path) -> None:
    torch.manual_seed(0)
    log = tmp_path / "mem.csv"
    callback = MemoryMonitorCallback(log=log, warn=False)

    class WithTest(TinyLM):
        def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
            self.log("test_loss", self._loss(batch))

    module = WithTest()
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, enable_model_summary=False, callbacks=[callback],
                        num_sanity_val_steps=0, limit_val_batches=1)
    trainer.fit(module, loader([6] * 8, 2), loader([10] * 4, 2))
    trainer.validate(module, loader([12] * 4, 2), verbose=False)
    trainer.test(module, loader([14] * 4, 2), verbose=False)
    fitted = read_log(log)
    assert 2 in fitted.ints("step")
    validated = read_log(tmp_path / "mem-2.csv")
    assert "eval" in validated.strings("phase") and 24 in validated.ints("tokens")
    tested = read_log(tmp_path / "mem-3.csv")
    assert "test" in tested.strings("phase") and 28 in tested.ints("tokens")
    assert callback.monitor.closed
