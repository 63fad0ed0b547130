"""The analysis beside a log (``<log stem>.analysis.json``) reads back: ``AnalysisResult.from_json`` of what
``to_json`` wrote writes the same JSON again, byte for byte, and holds the same typed values but for what the
file does not keep (:func:`kept` says what that is, as the docstrings do); ``read_analysis`` reads the file
bounded; a bad file is one ``AnalysisFileError`` of one line.

The analyses are of real logs: the H200 traces in tests/data/traces, rank 0's log of the DDP run on the H200
(bench/results/ddp-qlora), logs written by vramscope's own sampler and CSV sink with NVML and torch's allocator
faked at their boundary (test_report_fixtures' way), nvidia-smi's own CSV, and a real ``MemoryMonitor`` on this
CPU, which writes the file itself.
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import fake_nvml
from test_report_fixtures import GIB, MIB, FakeAllocator, Run, write_nvidia_smi_log, write_training_log
from test_report_outlook import write_smi
from vramscope.analysis.results import (
    ANALYSIS_FILE_LIMIT,
    NOT_KEPT_ROW,
    AnalysisFileError,
    AnalysisResult,
    BatchPeak,
    DeviceAnalysis,
    DeviceDetail,
    DeviceForecast,
    DeviceLeak,
    DevicePeak,
    ForecastSummary,
    Fragmentation,
    Headroom,
    LeakSummary,
    PeakAt,
    PeakSummary,
    RankPeak,
    Severity,
    read_analysis,
)
from vramscope.analysis.summary import analyze, analyze_columns
from vramscope.backends.host import HostBackend
from vramscope.backends.nvml import NvmlBackend
from vramscope.cli import main
from vramscope.logs.reader import read_log
from vramscope.logs.sinks import log_sink
from vramscope.sampling.sampler import Collector, Sampler
from vramscope.types import AllocatorReading

ROOT = Path(__file__).resolve().parent.parent
H200_TRACES = sorted((ROOT / "tests" / "data" / "traces" / "h200").glob("*.csv"))
DDP = ROOT / "bench" / "results" / "ddp-qlora"
Bytes = Callable[[int], int]


def as_file(result: AnalysisResult) -> bytes:
    """The bytes ``MemoryMonitor.save_analysis`` writes for ``result`` (``training/ranks.write_json_beside``)."""
    return json.dumps(result.to_json(), indent=1, default=str).encode("utf-8")


def write_allocator_log(path: Path, steps: int, allocated: Bytes, reserved: Bytes, split: Bytes | None) -> Path:
    """A log of one GPU through vramscope's sampler and sink, torch's allocator giving ``allocated``,
    ``reserved`` and (unless None: the log then has no such column) ``split`` bytes at each step."""
    gpu = fake_nvml.FakeGpu(name="NVIDIA H200", total=141 * GIB)
    allocator = FakeAllocator()
    now = [1_764_000_000.0]
    collector = Collector(nvml=NvmlBackend(nvml=fake_nvml.FakeNvml([gpu])), allocator=allocator, clock=lambda: now[0])
    sampler = Sampler(collector, [log_sink(path)], interval=1.0)
    for step in range(1, steps + 1):
        gpu.used = reserved(step) + 560 * MIB
        allocator.readings = (AllocatorReading(
            device=0, allocated_bytes=allocated(step), reserved_bytes=reserved(step),
            peak_allocated_bytes=allocated(step) + GIB, active_bytes=allocated(step),
            inactive_split_bytes=None if split is None else split(step), num_alloc_retries=0, num_ooms=0,
            uuid=gpu.uuid),)
        sampler.sample_now(step=step, phase="train", tokens=2048)
        now[0] += 0.5
    sampler.close()
    return path


def write_host_log(path: Path, samples: int) -> Path:
    """What ``vramscope run`` logs of a run without a GPU: this process's host memory, no steps."""
    now = [1_764_000_000.0]
    sampler = Sampler(Collector(host=HostBackend(), clock=lambda: now[0]), [log_sink(path)], interval=1.0)
    for _ in range(samples):
        sampler.sample_now()
        now[0] += 1.0
    sampler.close()
    return path


def write_smi_without_memory_on_one_gpu(path: Path, rows: int = 40) -> Path:
    """nvidia-smi's CSV where GPU 1 gives "[N/A]" for its memory (as it does where it cannot read it)."""
    lines = ["timestamp, name, memory.used [MiB], memory.total [MiB]"]
    for t in range(rows):
        lines.append(f"2026/11/29 10:00:{t:02d}.000, NVIDIA H200, {800 + t} MiB, 143771 MiB")
        lines.append(f"2026/11/29 10:00:{t:02d}.000, NVIDIA H200, [N/A], [N/A]")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def analyses(tmp: Path) -> dict[str, AnalysisResult]:
    """Analyses of real logs, by name, that between them hold every optional part of ``to_json``."""
    out = {f"h200/{p.stem}": analyze(read_log(p)) for p in H200_TRACES}
    out["ddp rank 0 of 2"] = analyze(read_log(DDP / "ddp_memory.csv"))
    out["eval phases, tokens"] = analyze(read_log(write_training_log(tmp / "clean.csv", Run(steps=300))))
    leak = write_training_log(tmp / "leak.csv", Run(steps=400, gpus=2, leak_per_step=20 * MIB, leak_from=100))
    out["leak on two GPUs"] = analyze(read_log(leak))
    out["leak over a given capacity"] = analyze(read_log(leak), capacity_bytes=8 * GIB)
    out["longest batch at risk"] = analyze(read_log(tmp / "clean.csv"), max_batch_tokens=40_000)
    out["nvidia-smi"] = analyze(read_log(write_nvidia_smi_log(tmp / "smi.csv")))
    out["nvidia-smi, growing per second"] = analyze(read_log(write_smi(tmp / "grow.csv", 300, 2000, 40)))
    out["nvidia-smi, a GPU without memory"] = analyze(read_log(write_smi_without_memory_on_one_gpu(tmp / "na.csv")))
    flat = 10 * GIB
    out["caching"] = analyze(read_log(write_allocator_log(
        tmp / "caching.csv", 300, lambda s: flat, lambda s: 12 * GIB + s * 8 * MIB, None)))
    out["fragmentation"] = analyze(read_log(write_allocator_log(
        tmp / "fragments.csv", 300, lambda s: flat, lambda s: 12 * GIB + s * 8 * MIB, lambda s: s * 8 * MIB)))
    out["host only"] = analyze(read_log(write_host_log(tmp / "host.csv", 30)))
    out["no rows"] = analyze_columns({})
    return out


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory) -> dict[str, AnalysisResult]:
    return analyses(tmp_path_factory.mktemp("logs"))


# -- what the file keeps: the contract the docstrings state -----------------------------------------------


def kept_peak(p: PeakAt) -> PeakAt:
    return replace(p, row=NOT_KEPT_ROW, since_start_s=None)


def kept_device_peak(p: DevicePeak) -> DevicePeak:
    return replace(p, at=None if p.at is None else kept_peak(p.at),
                   phases={k: kept_peak(v) for k, v in p.phases.items()})


def kept_leak(lk: DeviceLeak, log_unit: str) -> DeviceLeak:
    out = replace(lk, trend=None)
    if out.caching is not None:
        out = replace(out, kind=out.caching.kind, verdict=out.caching.verdict)
    if out.slope_per_x is None and out.start_x is None:
        out = replace(out, unit=log_unit)
    if out.unit == "step" and out.start_x is not None:
        out = replace(out, start_x=float(round(out.start_x)))
    return out


def kept_forecast(f: DeviceForecast) -> DeviceForecast:
    return replace(f, severity=None)


def kept(r: AnalysisResult) -> AnalysisResult:
    """``r`` as its file keeps it: what each ``from_json`` says the file does not keep, left out."""
    unit = "step" if r.steps.first is not None else "s"
    worst, soonest, overall = r.leak.worst, r.forecast.soonest, r.peak.overall
    leak = LeakSummary(None if worst is None else kept_leak(worst, unit),
                       {k: kept_leak(v, unit) for k, v in r.leak.devices.items()})
    peak = PeakSummary({k: kept_device_peak(v) for k, v in r.peak.devices.items()},
                       None if overall is None else kept_device_peak(overall))
    forecast = replace(r.forecast, soonest=None if soonest is None else kept_forecast(soonest),
                       devices={k: kept_forecast(v) for k, v in r.forecast.devices.items()})
    devices = tuple(DeviceAnalysis(d.key, peak.devices[d.key], leak.devices[d.key], forecast.devices[d.key],
                                   DeviceDetail.not_kept(d.key)) for d in r.devices)
    return replace(r, leak=leak, peak=peak, forecast=forecast, devices=devices, ranks=None, phases=(), start=None,
                   clock_duration_s=None)


# -- round trips --------------------------------------------------------------------------------------------


def test_every_analysis_reads_back_to_the_same_bytes_and_typed_values(found: dict[str, AnalysisResult]) -> None:
    for name, result in found.items():
        written = as_file(result)
        back = AnalysisResult.from_json(json.loads(written))
        assert as_file(back) == written, name
        assert back == kept(result), name


def _paths(value: Any, at: str = "") -> set[str]:
    """Every key path of a JSON value, devices' names as ``*``."""
    if not isinstance(value, dict):
        return set()
    out = set()
    for k, v in value.items():
        here = f"{at}.{'*' if k.isdigit() or k == 'host' else k}"
        out |= {here} | _paths(v, here)
    return out


def test_the_round_trips_cover_every_optional_part_of_the_file(found: dict[str, AnalysisResult]) -> None:
    paths = set().union(*(_paths(r.to_json()) for r in found.values()))
    assert {".leak.devices.*.reserved_slope_bytes_per_step", ".leak.key", ".forecast.key",
            ".forecast.longest_batch.points", ".forecast.devices.*.longest_batch.points"} <= paths
    results = list(found.values())
    leaks = [lk for r in results for lk in r.leak.devices.values()]
    assert {lk.unit for lk in leaks if lk.detected} == {"step", "s"}  # a leak per step and one per second
    assert {lk.shown_kind for lk in leaks} >= {"leak", "caching", "fragmentation", "insufficient"}
    batches = [b for r in results for b in (f.longest_batch for f in r.forecast.devices.values())]
    assert {b.brief for b in batches} == {True, False} and any(b.at_risk for b in batches)
    outlooks = {f.outlook.kind for r in results for f in r.forecast.devices.values()}
    assert {"leak", "over_capacity", "longest_batch", "none"} <= outlooks
    peaks = [p for r in results for p in r.peak.devices.values()]
    assert any(p.at is None for p in peaks) and "host" in {p.key for p in peaks}
    assert any(r.leak.worst is None and r.forecast.soonest is None and r.peak.overall is None for r in results)
    assert any(len(r.devices) > 1 for r in results) and any(r.warnings for r in results)


def test_the_typed_fields_read_back(found: dict[str, AnalysisResult]) -> None:
    leak = AnalysisResult.from_json(found["leak on two GPUs"].to_json())
    assert leak.keys == ["0", "1"] and leak.rows == 800 and leak.steps.logged == 400
    worst = leak.leak.worst
    assert worst is not None and worst.detected and worst.unit == "step"
    assert worst.slope_bytes_per_step == pytest.approx(20 * MIB, rel=0.05)
    assert worst.start_step == pytest.approx(100, abs=10)
    soonest = leak.forecast.soonest
    assert soonest is not None and soonest == leak.forecast.devices[soonest.key]
    assert soonest.oom.steps_to_oom is not None and soonest.severity is None  # not kept: the outlook's level says it
    assert leak.device("1").detail == DeviceDetail.not_kept("1") and leak.device("1").detail.rows == 0

    per_second = AnalysisResult.from_json(found["nvidia-smi, growing per second"].to_json()).leak.devices["0"]
    assert per_second.unit == "s" and per_second.slope_bytes_per_second is not None and per_second.start_step is None

    caching = AnalysisResult.from_json(found["fragmentation"].to_json()).leak.devices["0"]
    assert caching.caching is not None and caching.shown_kind == "fragmentation" and not caching.detected
    assert caching.caching.reserved_slope_bytes_per_step == pytest.approx(8 * MIB, rel=0.05)

    gpu = AnalysisResult.from_json(found["ddp rank 0 of 2"].to_json()).peak.devices["0"]
    assert gpu.at is not None and gpu.at.phase == "train" and gpu.at.row == NOT_KEPT_ROW
    assert list(gpu.phases) == ["start", "train"] and gpu.total_bytes == 150754820096
    no_memory = AnalysisResult.from_json(found["nvidia-smi, a GPU without memory"].to_json()).peak.devices["1"]
    assert no_memory.metric is None and no_memory.at is None and no_memory.gpu == 1


def report_json(capsys: pytest.CaptureFixture[str], log: Path) -> Any:
    assert main(["report", str(log), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_reports_own_parts_read_back(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``report --json``'s devices and ranks hold the parts with a to_json the analysis file has not: each
    reads back to the same JSON."""
    leak = write_training_log(tmp_path / "leak.csv", Run(steps=400, gpus=2, leak_per_step=20 * MIB, leak_from=100))
    plain = write_allocator_log(tmp_path / "plain.csv", 300, lambda s: 10 * GIB, lambda s: 12 * GIB, None)
    splits: set[bool] = set()
    severities = batches = ranks = 0
    for log in (leak, plain, DDP / "ddp_memory.csv"):
        doc = report_json(capsys, log)
        for dev in doc["devices"].values():
            frag = dev["fragmentation"]
            assert Fragmentation.from_json(frag).to_json() == frag
            splits.add(Fragmentation.from_json(frag).has_inactive_split)
            head = Headroom.from_json(dev).to_json()
            assert head == {k: dev[k] for k in head}
            for batch in dev["longest_batches"]:
                assert BatchPeak.from_json(batch).to_json() == batch
                batches += 1
            if dev["oom_severity"] is not None:
                assert Severity.from_json(dev["oom_severity"]).to_json() == dev["oom_severity"]
                severities += 1
        for rank in doc.get("ranks", []):
            assert RankPeak.from_json(rank).to_json() == rank
            ranks += 1
        assert LeakSummary.from_json(doc["leak"]).to_json() == doc["leak"]
        assert PeakSummary.from_json(doc["peak"]).to_json() == doc["peak"]
        assert ForecastSummary.from_json(doc["forecast"]).to_json() == doc["forecast"]
    # With and without the inactive split column; a leak's severity; the two ranks of the DDP run.
    assert splits == {True, False} and severities > 0 and batches > 0 and ranks == 2


def test_the_typed_report_parts_read_back_as_they_were(found: dict[str, AnalysisResult]) -> None:
    for name, result in found.items():
        for d in result.devices:
            if d.detail.fragmentation is not None:
                assert Fragmentation.from_json(d.detail.fragmentation.to_json()) == d.detail.fragmentation, name
            assert Headroom.from_json(d.detail.headroom.to_json()) == replace(d.detail.headroom, level=None)
            for b in d.detail.longest_batches:
                back = BatchPeak.from_json(b.to_json())
                assert back == replace(b, row=NOT_KEPT_ROW, since_start_s=back.since_start_s), name
                assert back.since_start_s == pytest.approx(b.since_start_s, abs=5e-4)
        if result.ranks is not None:
            assert [RankPeak.from_json(r.to_json()) for r in result.ranks.ranks] == list(result.ranks.ranks)


# -- the file a real monitor writes ------------------------------------------------------------------------


def test_the_file_a_real_monitor_writes_reads_back_byte_for_byte(tmp_path: Path) -> None:
    from vramscope.integrations.loop import MemoryMonitor

    log = tmp_path / "mem.csv"
    kept_blocks: list[mmap.mmap] = []
    try:
        with MemoryMonitor(log=log, analyze_every=10, analyze_min_interval_s=0, analyze_max_share=1.0,
                           warn=False) as mon:
            for step in range(1, 121):
                if step >= 30:  # a host leak the monitor sees: 2 MiB written each step
                    block = mmap.mmap(-1, 2 * MIB)
                    block.write(b"\x01" * (2 * MIB))
                    kept_blocks.append(block)
                mon.step(step)
    finally:
        for block in kept_blocks:
            block.close()
    saved = tmp_path / "mem.analysis.json"
    back = read_analysis(saved)
    assert as_file(back) == saved.read_bytes()
    assert mon.last_result is not None and back == kept(mon.last_result)
    assert back.keys == ["host"] and back.leak.detected and back.leak.devices["host"].gpu is None


# -- bad files ----------------------------------------------------------------------------------------------


def _one_line(exc: pytest.ExceptionInfo[AnalysisFileError]) -> str:
    message = str(exc.value)
    assert "\n" not in message and isinstance(exc.value, ValueError)
    return message


def _changed(data: Any, change: Callable[[Any], None]) -> Any:
    copy = json.loads(json.dumps(data))
    change(copy)
    return copy


def test_a_bad_dict_is_one_error_that_names_the_field_and_what_to_do(found: dict[str, AnalysisResult]) -> None:
    data = found["leak on two GPUs"].to_json()
    bad: dict[str, Callable[[Any], None]] = {
        "forecast.devices.0.capacity_bytes is '80GB', not a whole number or null":
            lambda d: d["forecast"]["devices"]["0"].update(capacity_bytes="80GB"),
        "peak.devices.1.total_bytes is missing": lambda d: d["peak"]["devices"]["1"].pop("total_bytes"),
        "rows is True, not a whole number": lambda d: d.update(rows=True),
        "leak.devices is a list, not a JSON object": lambda d: d["leak"].update(devices=[]),
        "warnings is a list, not a list of text": lambda d: d.update(warnings=[1]),
        "devices names '7', which leak.devices has not": lambda d: d["devices"].append("7"),
        "forecast.key is '5', a device that forecast.devices has not": lambda d: d["forecast"].update(key="5"),
        "leak.devices.0.gpu is 3, not 0 as the rest of it says": lambda d: d["leak"]["devices"]["0"].update(gpu=3),
        "peak.devices.0.key is 'gpu0', not a GPU's index or 'host'":
            lambda d: d["peak"]["devices"]["0"].update(key="gpu0"),
        "forecast.longest_batch.at_risk is 0, not true or false":
            lambda d: d["forecast"]["longest_batch"].update(at_risk=0),
    }
    for said, change in bad.items():
        with pytest.raises(AnalysisFileError) as exc:
            AnalysisResult.from_json(_changed(data, change))
        message = _one_line(exc)
        assert said in message and "analyse its log again" in message, message
    for not_a_dict in ([], "analysis", None, 3):
        with pytest.raises(AnalysisFileError, match=r"the analysis is .*, not a JSON object"):
            AnalysisResult.from_json(not_a_dict)


def test_read_analysis_refuses_what_is_not_an_analysis_file_in_one_line(tmp_path: Path) -> None:
    cases: dict[str, str] = {}
    (tmp_path / "folder").mkdir()
    cases[str(tmp_path / "folder")] = "is a folder, not a file"
    cases[str(tmp_path / "none.analysis.json")] = "no such file; the monitor writes it beside its log"
    (tmp_path / "log.csv").write_text("time,gpu\n", encoding="utf-8")
    cases[str(tmp_path / "log.csv")] = "cannot be read as JSON (JSONDecodeError); analyse its log again"
    (tmp_path / "latin1.json").write_bytes(b'{"rows": "\xe9"}')
    cases[str(tmp_path / "latin1.json")] = "cannot be read as JSON (UnicodeDecodeError)"
    (tmp_path / "deep.json").write_text("[" * 200_000, encoding="utf-8")
    cases[str(tmp_path / "deep.json")] = "cannot be read as JSON (RecursionError)"
    (tmp_path / "list.json").write_text("[]", encoding="utf-8")
    cases[str(tmp_path / "list.json")] = "the analysis is a list, not a JSON object"
    with open(tmp_path / "huge.analysis.json", "wb") as huge:
        huge.truncate(ANALYSIS_FILE_LIMIT + 1)  # sparse: nothing written, nothing read
    cases[str(tmp_path / "huge.analysis.json")] = f"more than the {ANALYSIS_FILE_LIMIT:,} that an analysis file"
    os.mkfifo(tmp_path / "fifo.analysis.json")  # no writer: reading it would wait for ever
    cases[str(tmp_path / "fifo.analysis.json")] = "is a FIFO"
    cases["/dev/zero"] = "/dev/zero is a character device, not a file"
    # A real file of an older vramscope (the DDP run on the H200): its forecasts have no per-second slope yet.
    old = str(DDP / "ddp_memory.analysis.json")
    cases[old] = "forecast.devices.0.slope_bytes_per_second is missing; analyse its log again"
    for path, said in cases.items():
        with pytest.raises(AnalysisFileError) as exc:
            read_analysis(path)
        message = _one_line(exc)
        assert said in message and path in message, message
