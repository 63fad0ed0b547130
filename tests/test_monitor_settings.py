"""One list of the monitor's options (``MonitorSettings``) for ``MemoryMonitor`` and both callbacks, and the live
analysis handed on typed (``AnalysisResult``) down to the side file, where it becomes JSON once.

The front-ends are the real ones (HF's and Lightning's callbacks need their libraries installed); the rows come
from this process's real host memory, with a real planted leak (fresh anonymous memory) where one is needed.
"""

from __future__ import annotations

import dataclasses
import io
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

import fake_nvml
from test_loop import MIB, HostLeak
from vramscope.analysis.leak import LeakConfig
from vramscope.analysis.results import AnalysisResult
from vramscope.exporters.relay import RelayReceiver
from vramscope.integrations.loop import MemoryMonitor
from vramscope.training.settings import MonitorSettings

# A value other than the default for every option; a new option must add its own here (the test below says so),
# and from then on this file checks that it reaches all three front-ends.
NOT_DEFAULT: dict[str, Any] = {
    "log": "runs/mem.csv",
    "every_n_steps": 7,
    "interval": 0.5,
    "gpus": (1, 0),
    "oom_snapshot": "runs/oom",
    "prometheus": "127.0.0.1:19999",
    "export": {"push": "http://gw:9091", "push_job": "llama"},
    "warn": False,
    "analyze_every": 3,
    "analyze_min_interval_s": 0.25,
    "analyze_max_share": 0.5,
    "capacity_bytes": 12 * 1024**3,
    "max_batch_tokens": 4096,
    "total_steps": 900,
    "leak_config": LeakConfig(min_growth_bytes=1 * MIB),
    "history": 1000,
    "gather": False,
    "rank_logs": False,
    "overwrite": False,
}


def _front_ends() -> list[tuple[str, Any]]:
    """(name, a constructor taking the options as keywords and returning an object with ``.monitor``) for each
    front-end whose library is installed; MemoryMonitor's 'monitor' is itself."""

    class Loop:
        def __init__(self, **options: Any) -> None:
            self.monitor = MemoryMonitor(**options)

    found: list[tuple[str, Any]] = [("loop", Loop)]
    for module in ("hf", "lightning"):
        try:
            mod = __import__(f"vramscope.integrations.{module}", fromlist=["MemoryMonitorCallback"])
            found.append((module, mod.MemoryMonitorCallback))
        except ImportError:  # pragma: no cover - the library is missing
            continue
    return found


FRONT_ENDS = _front_ends()


def test_the_table_of_values_names_every_option() -> None:
    # A new field without a line in NOT_DEFAULT fails here: add one, and the tests below carry it to every front-end.
    assert set(NOT_DEFAULT) == set(MonitorSettings.names())
    defaults = MonitorSettings()
    for name, value in NOT_DEFAULT.items():
        assert getattr(defaults, name) != value, name


@pytest.mark.parametrize(("front", "make"), FRONT_ENDS, ids=[name for name, _ in FRONT_ENDS])
def test_every_option_reaches_every_front_end(front: str, make: Any) -> None:
    built = make(**NOT_DEFAULT, nvml=fake_nvml.no_driver())
    settings = built.monitor.settings
    for name, value in NOT_DEFAULT.items():
        expected = {**value, "prometheus": NOT_DEFAULT["prometheus"]} if name == "export" else value
        got = getattr(settings, name)
        assert (dict(got) if name == "export" else got) == expected, (front, name)
    assert settings == MonitorSettings(**NOT_DEFAULT)
    # A whole MonitorSettings is taken as it is, keywords over it.
    given = MonitorSettings(**NOT_DEFAULT)
    again = make(settings=given, every_n_steps=2, nvml=fake_nvml.no_driver()).monitor.settings
    assert again == dataclasses.replace(given, every_n_steps=2)


@pytest.mark.parametrize(("front", "make"), FRONT_ENDS, ids=[name for name, _ in FRONT_ENDS])
def test_a_new_option_reaches_every_front_end(front: str, make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Add a field to the dataclass, and change nothing else: every front-end takes it and hands it on."""
    extended = dataclasses.make_dataclass(
        "MonitorSettings", [("probe", int, dataclasses.field(default=0))], bases=(MonitorSettings,), frozen=True)
    build = MonitorSettings.__dict__["build"].__func__  # the front-ends build through it: now the extended class
    monkeypatch.setattr(MonitorSettings, "build", classmethod(
        lambda cls, settings=None, /, **options: build(extended, settings, **options)))
    built = make(probe=41, warn=False, nvml=fake_nvml.no_driver())
    assert built.monitor.settings.probe == 41


@pytest.mark.parametrize(("front", "make"), FRONT_ENDS, ids=[name for name, _ in FRONT_ENDS])
def test_an_unknown_option_is_one_line_naming_the_options(front: str, make: Any) -> None:
    with pytest.raises(TypeError, match=r"^unknown monitor option 'every_n_step'; the options are: log, every_n_steps"):
        make(every_n_step=10)


@pytest.mark.parametrize(("front", "make"), FRONT_ENDS, ids=[name for name, _ in FRONT_ENDS])
def test_out_of_range_options_fail_in_every_front_end(front: str, make: Any) -> None:
    with pytest.raises(ValueError, match="analyze_max_share must be in"):
        make(analyze_max_share=0)


def test_the_old_prometheus_port_warns_at_the_users_line_in_the_loop_monitor_too() -> None:
    with pytest.warns(FutureWarning) as caught:
        mon = MemoryMonitor(prometheus_port=9464, warn=False)
    assert caught[0].filename == __file__
    assert mon.settings.prometheus == "127.0.0.1:9464" and dict(mon.settings.export) == {"prometheus": "127.0.0.1:9464"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert MemoryMonitor(prometheus="9464").settings.prometheus == "127.0.0.1:9464"  # as the exporter binds it


def test_a_bare_port_takes_the_exporters_own_default_host(monkeypatch: pytest.MonkeyPatch) -> None:
    from vramscope.exporters import collector
    from vramscope.training.settings import prometheus_address

    assert prometheus_address(9464) == f"{collector.DEFAULT_HOST}:9464"
    assert prometheus_address("0.0.0.0:1") == "0.0.0.0:1" and prometheus_address(None) is None
    monkeypatch.setattr(collector, "DEFAULT_HOST", "localhost")  # one host for the exporter and the monitor's option
    assert prometheus_address("9464") == "localhost:9464"


def test_settings_are_frozen_and_change_only_before_the_start(tmp_path: Path) -> None:
    mon = MemoryMonitor(log=tmp_path / "mem.csv", warn=False, nvml=fake_nvml.no_driver())
    with pytest.raises(dataclasses.FrozenInstanceError):
        mon.settings.every_n_steps = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        mon.settings.export["push"] = "http://gw:9091"  # type: ignore[index]
    mon.configure(total_steps=50, history=300)
    assert (mon.settings.total_steps, mon.settings.history) == (50, 300)
    with mon, pytest.raises(RuntimeError, match="has started"):
        mon.configure(total_steps=60)
    assert mon.settings.total_steps == 50


def test_the_monitor_keeps_its_options_in_one_place() -> None:
    mon = MemoryMonitor(warn=False, nvml=fake_nvml.no_driver())
    held = set(vars(mon))
    assert not held & set(MonitorSettings.names()), held & set(MonitorSettings.names())
    assert len(held) <= 20, sorted(held)  # 39 before the settings and the open parts were grouped


class RelayTarget:
    """What the relay's receiver hands on to (an exporter's collector): every relayed sample and analysis."""

    def __init__(self) -> None:
        self.collector = self
        self.samples = 0
        self.analyses: list[dict[Any, tuple[float | None, float | None]]] = []

    def update_rank(self, rank: str, sample: Any) -> None:
        self.samples += 1

    def set_rank_analysis(self, rank: str, analysis: dict[Any, tuple[float | None, float | None]]) -> None:
        self.analyses.append(dict(analysis))


def test_the_live_analysis_stays_typed_until_the_side_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real planted leak, analysed live every 5 steps, warned about, put in the figures and relayed to an
    exporter through the real relay socket: no dict is made of the analysis until the side file is written."""
    calls: list[int] = []
    to_json = AnalysisResult.to_json

    def counted(self: AnalysisResult) -> dict[str, Any]:
        calls.append(self.rows)
        return to_json(self)

    monkeypatch.setattr(AnalysisResult, "to_json", counted)
    target = RelayTarget()
    receiver = RelayReceiver([target])
    stream = io.StringIO()
    leak = HostLeak()
    try:
        with MemoryMonitor(log=tmp_path / "mem.csv", analyze_every=5, analyze_min_interval_s=0,
                           analyze_max_share=1.0, warn_stream=stream, capacity_bytes=1024**4,
                           export={"relay": receiver.path}, nvml=fake_nvml.no_driver()) as mon:
            for step in range(1, 121):
                if step >= 30:
                    leak(2 * MIB)
                mon.step(step)
                figures = mon.figures()
            assert calls == []  # many live analyses, warnings, figures and relayed series: no dict made of one
    finally:
        leak.close()
        receiver.close()
    result = mon.last_result
    assert isinstance(result, AnalysisResult) and result.leak.detected
    assert len(calls) == 1  # the side file: the one JSON edge
    saved = json.loads((tmp_path / "mem.analysis.json").read_text())
    assert saved == json.loads(json.dumps(to_json(result), default=str))
    # What the typed result told the warnings, the trainer's figures and the exporter at the relay's far end.
    assert "leak:" in stream.getvalue()
    worst = result.leak.worst
    assert worst is not None and worst.slope_bytes_per_step is not None
    assert figures["mem/leak_mib_per_step"] == pytest.approx(worst.slope_bytes_per_step / MIB, abs=1e-3)
    soonest = result.forecast.soonest
    assert soonest is not None and soonest.oom.steps_to_oom is not None
    assert target.samples > 100 and target.analyses
    slope, steps_to_oom = target.analyses[-1][None]  # the host's series (no GPU here)
    assert slope == pytest.approx(worst.slope_bytes_per_step)
    assert steps_to_oom == pytest.approx(soonest.oom.steps_to_oom)
