"""vramscope resets torch's peak counters for its per-step peaks; the user's own readings must not notice (issue 24.8).

The ledger is driven here by a simulated caching allocator (the hardware boundary: a counter with torch's nested
stats layout); the gpu test runs a real HF Trainer on CUDA with the callback and reads the user's view.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from vramscope.backends.torch_allocator import PeakLedger


class SimulatedAllocator:
    """One device's counters, laid out as ``torch.cuda.memory_stats_as_nested_dict`` lays them out."""

    def __init__(self) -> None:
        self.current = 0
        self.peak = 0

    def alloc(self, n: int) -> None:
        self.current += n
        self.peak = max(self.peak, self.current)

    def free(self, n: int) -> None:
        self.current -= n

    def nested(self, device: int) -> dict[str, Any]:
        assert device == 0
        pool = {"current": self.current, "peak": self.peak, "allocated": 0, "freed": 0}
        return {"allocated_bytes": {"all": dict(pool), "large_pool": dict(pool)}, "num_ooms": 0}

    def reset(self, device: int) -> None:
        self.peak = self.current


def user_peak(ledger: PeakLedger) -> int:
    return int(ledger.user_stats(0)["allocated_bytes"]["all"]["peak"])


def own_peak(ledger: PeakLedger) -> int:
    return int(ledger.own_stats(0)["allocated_bytes"]["all"]["peak"])


def test_the_users_peak_survives_vramscopes_resets() -> None:
    sim = SimulatedAllocator()
    ledger = PeakLedger(sim.nested, sim.reset)
    sim.alloc(100)
    sim.alloc(900)  # the run's peak: 1000
    sim.free(900)
    assert own_peak(ledger) == 1000
    ledger.own_reset(0)  # vramscope's row
    sim.alloc(300)
    sim.free(300)
    assert own_peak(ledger) == 400  # the step's own peak
    assert user_peak(ledger) == 1000  # what torch.cuda.max_memory_allocated() says without vramscope
    ledger.own_reset(0)
    assert user_peak(ledger) == 1000
    assert ledger.user_stats(0)["allocated_bytes"]["large_pool"]["peak"] == 1000  # every pool, not one key


def test_a_users_reset_starts_the_users_peak_and_keeps_vramscopes_step_peak() -> None:
    sim = SimulatedAllocator()
    ledger = PeakLedger(sim.nested, sim.reset)
    sim.alloc(500)
    sim.free(400)
    ledger.user_reset(0)  # HF's TrainerMemoryTracker, or the user's own code, mid-step
    assert user_peak(ledger) == 100
    sim.alloc(50)
    assert user_peak(ledger) == 150
    assert own_peak(ledger) == 500  # the step's peak came before the user's reset: it is not lost
    ledger.own_reset(0)
    assert own_peak(ledger) == 150
    assert user_peak(ledger) == 150


def test_other_stats_pass_through_unchanged() -> None:
    sim = SimulatedAllocator()
    ledger = PeakLedger(sim.nested, sim.reset)
    sim.alloc(7)
    stats = ledger.user_stats(0)
    assert stats["num_ooms"] == 0 and stats["allocated_bytes"]["all"]["current"] == 7


USER_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, TrainerCallback
    from peft import LoraConfig, get_peft_model

    with_vramscope = sys.argv[1] == "1"
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4)).cuda()
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    model.train()
    data = [{"input_ids": torch.randint(0, 512, (64 * (1 + i % 3),)).tolist()} for i in range(12)]

    def collate(rows):
        ids = torch.tensor([r["input_ids"] for r in rows])
        return {"input_ids": ids, "labels": ids.clone()}

    seen = []

    class Reader(TrainerCallback):  # the user's own code, reading torch's peak as it always has
        def on_step_end(self, args, state, control, **kw):
            seen.append(int(torch.cuda.max_memory_allocated()))

    callbacks = [Reader()]
    if with_vramscope:
        from vramscope.integrations.hf import MemoryMonitorCallback
        callbacks.insert(0, MemoryMonitorCallback(log=sys.argv[2]))
    args = TrainingArguments(output_dir=sys.argv[3], per_device_train_batch_size=1, max_steps=12, report_to=[],
                             logging_steps=1, save_strategy="no", remove_unused_columns=False,
                             skip_memory_metrics=True)
    Trainer(model=model, args=args, train_dataset=data, data_collator=collate, callbacks=callbacks).train()
    print(json.dumps({"steps": seen, "end": int(torch.cuda.max_memory_allocated())}))
    """
)


@pytest.mark.gpu
def test_the_users_max_memory_allocated_reads_as_without_vramscope(tmp_path: Path) -> None:
    script = tmp_path / "user.py"
    script.write_text(USER_SCRIPT)
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
    results = []
    for flag in ("0", "1"):
        out = subprocess.run([sys.executable, str(script), flag, str(tmp_path / "mem.csv"), str(tmp_path / f"o{flag}")],
                             capture_output=True, text=True, env=env, timeout=300, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    plain, watched = results
    # Without vramscope the peak never drops between steps; with it, the user must read the same figures.
    assert plain["steps"] == sorted(plain["steps"])
    assert watched["steps"] == sorted(watched["steps"]), watched["steps"]
    assert watched["end"] == pytest.approx(plain["end"], rel=0.02)
    assert (tmp_path / "mem.csv").exists()


def test_a_rows_read_and_reset_is_the_read_then_the_reset() -> None:
    sim = SimulatedAllocator()
    ledger = PeakLedger(sim.nested, sim.reset)
    sim.alloc(800)
    sim.free(700)
    ledger.user_reset(0)  # the user's reset mid-step: vramscope's row still sees 800
    sim.alloc(50)
    stats = ledger.own_read_and_reset(0)
    assert stats["allocated_bytes"]["all"]["peak"] == 800 and stats["allocated_bytes"]["all"]["current"] == 150
    assert own_peak(ledger) == 150  # reset: the next row starts from what is held now
    assert user_peak(ledger) == 150  # the user's own peak since their reset survives vramscope's


class SimulatedCuda:
    """torch.cuda at the allocator boundary for the backend: two devices, the process allocates on device 0 only.

    Each reading is counted, so that a row's cost (one nested reading per device) is what the test holds.
    """

    def __init__(self) -> None:
        self.device0 = SimulatedAllocator()
        self.readings: list[int] = []
        self.resets: list[int] = []

    def nested(self, device: int | None = None) -> dict[str, Any]:
        index = 0 if device is None else int(device)
        self.readings.append(index)
        if index != 0:  # a device torch knows and this process never touched
            pool = {"current": 0, "peak": 0, "allocated": 0, "freed": 0}
            return {"allocated_bytes": {"all": pool}, "reserved_bytes": {"all": dict(pool)}, "num_device_alloc": 0}
        stats = self.device0.nested(0)
        reserved = {"current": 2048, "peak": 2048, "allocated": 2048, "freed": 0}
        return {**stats, "reserved_bytes": {"all": reserved}, "num_device_alloc": 1, "num_alloc_retries": 0}

    def reset(self, device: int | None = None) -> None:
        index = 0 if device is None else int(device)
        self.resets.append(index)
        if index == 0:
            self.device0.reset(0)

    def module(self) -> Any:
        from types import SimpleNamespace

        nested, reset = self.nested, self.reset  # one object each, as torch.cuda and torch.cuda.memory share them
        memory = SimpleNamespace(memory_stats_as_nested_dict=nested, reset_peak_memory_stats=reset)
        cuda = SimpleNamespace(
            memory=memory, memory_stats_as_nested_dict=nested, reset_peak_memory_stats=reset,
            is_available=lambda: True, is_initialized=lambda: True, device_count=lambda: 2,
            _utils=SimpleNamespace(_get_device_index=lambda device, optional: 0 if device is None else int(device)),
            get_device_properties=lambda device: SimpleNamespace(uuid=f"0000000{device}-aaaa"),
        )
        return SimpleNamespace(cuda=cuda)


def test_a_row_reads_each_device_once_and_the_user_still_sees_the_runs_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    from vramscope.backends import torch_allocator

    cuda = SimulatedCuda()
    torch = cuda.module()
    monkeypatch.setattr(torch_allocator, "_LEDGER", None)  # this process's ledger is the simulated torch's here
    monkeypatch.setitem(sys.modules, "torch", torch)
    backend = torch_allocator.TorchAllocatorBackend(reset_peak=True)
    sim = cuda.device0
    sim.alloc(100)
    sim.alloc(900)  # the run's peak: 1000
    sim.free(900)
    cuda.readings.clear()
    (first,) = backend.read()  # device 1 is not in use: no reading of it, and no reset
    assert cuda.readings == [0, 1] and cuda.resets == [0]
    assert (first.device, first.peak_allocated_bytes, first.allocated_bytes) == (0, 1000, 100)
    assert (first.reserved_bytes, first.num_alloc_retries, first.uuid) == (2048, 0, "GPU-00000000-aaaa")
    sim.alloc(300)
    sim.free(300)
    cuda.readings.clear()
    (second,) = backend.read()
    assert cuda.readings == [0, 1]  # one reading per device and row, the search for devices included
    assert second.peak_allocated_bytes == 400  # the step's own peak
    assert torch.cuda.memory_stats_as_nested_dict(0)["allocated_bytes"]["all"]["peak"] == 1000  # the user's view
    (pinned,) = torch_allocator.TorchAllocatorBackend(devices=[0], reset_peak=False).read()
    assert pinned.peak_allocated_bytes == 100  # vramscope's view since its last reset, without resetting it
    assert cuda.resets == [0, 0]
