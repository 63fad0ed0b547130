"""One table of exporters (issue 23): the CLI's flags, the monitor and the callbacks all open its rows."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

import fake_nvml
from test_prometheus import training_sample
from vramscope.cli.common import add_exporter_flags, open_exporters_from_args
from vramscope.exporters import EXPORTERS, ExportContext, PrometheusSink, PushgatewaySink, open_exporters
from vramscope.exporters.registry import flags, run_name
from vramscope.training.monitor import MemoryMonitor


@pytest.mark.parametrize("command", ["run", "watch"])
def test_run_and_watch_have_every_exporters_flags(command: str) -> None:
    result = subprocess.run([sys.executable, "-m", "vramscope", command, "--help"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0
    for flag in flags():
        assert flag.name in result.stdout, flag.name


def test_the_flags_parse_into_the_options_the_table_opens() -> None:
    parser = argparse.ArgumentParser()
    add_exporter_flags(parser)
    parser.add_argument("--log")
    args = parser.parse_args(["--prometheus", "127.0.0.1:0", "--push", "http://127.0.0.1:9", "--push-interval", "60",
                              "--push-job", "nightly", "--push-label", "team=nlp", "--push-label", "site=a",
                              "--log", "runs/llama.csv"])
    assert args.push_labels == [("team", "nlp"), ("site", "a")]
    sinks = open_exporters_from_args(args, announce=False, run=True)
    try:
        prometheus, push = sinks
        assert isinstance(prometheus, PrometheusSink) and isinstance(push, PushgatewaySink)
        assert push.job == "nightly" and push.interval == 60
        push.write(training_sample())
        assert push.grouping_key() == {"instance": push.collector.base_labels()["host"], "run": "llama",
                                       "team": "nlp", "site": "a", "rank": "1"}
        assert 'run="llama"' in prometheus.exposition().decode()  # the scraped series say the same run
        assert push.where.endswith("(job 'nightly', run 'llama', team 'nlp', site 'a')")
    finally:
        for sink in sinks:
            sink.close()


def test_nothing_asked_opens_nothing_and_a_bad_option_opens_nothing() -> None:
    assert open_exporters({}) == []
    with pytest.raises(ValueError, match="unknown export option 'prometheus_port'"):
        open_exporters({"prometheus_port": 19400})
    with pytest.raises(ValueError, match="needs a Pushgateway"):
        open_exporters({"prometheus": "127.0.0.1:0", "push_interval": 5.0})  # checked before a server starts


def test_every_row_has_a_name_and_unique_flags() -> None:
    names = [e.name for e in EXPORTERS]
    assert len(names) == len(set(names)) == 3
    dests = [f.dest for f in flags()]
    assert len(dests) == len(set(dests))


def test_the_monitor_opens_any_row_by_its_options() -> None:
    with MemoryMonitor(export={"prometheus": "127.0.0.1:0"}, warn=False, nvml=fake_nvml.no_driver()) as mon:
        mon.step(1)
        sink = mon.prometheus_sink
        assert isinstance(sink, PrometheusSink)
        assert "vramscope_training_step" in sink.exposition().decode()
    with pytest.raises(ValueError, match="unknown export option"):
        MemoryMonitor(export={"promethus": "0"}, warn=False, nvml=fake_nvml.no_driver()).start()


def test_a_run_is_named_by_its_log_else_host_pid_start() -> None:
    assert run_name("runs/llama.qlora.csv") == "llama.qlora"
    name = run_name(None, started=0.0)
    assert name.endswith("-19700101T000000") and name.count("-") >= 2
    assert ExportContext().run is None


def test_what_waits_to_be_scraped_is_a_field_of_its_row() -> None:
    """``watch --once`` refuses an exporter that waits for a scraper by its row's ``scraped``, not by its flag's
    name; a pushed one still sends its reading."""
    from dataclasses import replace

    from vramscope.exporters.registry import PROMETHEUS, PUSHGATEWAY, Flag, scraped_flags

    assert scraped_flags({"prometheus": "9464"}) == ["--prometheus"]
    assert scraped_flags({"push": "http://gw:9091"}) == [] and scraped_flags({}) == []
    other = replace(PUSHGATEWAY, name="otel", flags=(Flag("--otel", "otel", "URL", "serve OTLP"),),
                    asked=lambda options: options.get("otel") is not None, scraped=True)
    table = (PROMETHEUS, PUSHGATEWAY, other)
    assert scraped_flags({"otel": "x", "push": "y"}, table) == ["--otel"]
    assert scraped_flags({"otel": "x", "prometheus": "9464"}, table) == ["--prometheus", "--otel"]
