"""The Lightning callback in a real Lightning Trainer run on a tiny CPU model."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning.pytorch")

from vramscope.integrations import lightning as vs_lightning  # noqa: E402
from vramscope.integrations.lightning import MemoryMonitorCallback  # noqa: E402
from vramscope.logfile import read_log  # noqa: E402

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
    metrics = next((tmp_path / "logs").rglob("metrics.csv"))
    with metrics.open() as handle:
        header = next(csv.reader(handle))
    assert "mem/host_rss_gib" in header


def test_without_lightning_the_error_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vs_lightning, "_CallbackBase", object)
    with pytest.raises(ImportError, match=r"pip install 'vramscope\[lightning\]'"):
        MemoryMonitorCallback()
