"""The log's columns as numpy arrays (the whole-column API the analysis reads)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vramscope.logs.mapping import parse_columns
from vramscope.logs.reader import read_any_log, read_log
from vramscope.logs.table import LogTable


def test_columns_carry_values_and_known_masks(tmp_path: Path) -> None:
    log = tmp_path / "mem.csv"
    log.write_text("time,gpu,elapsed_s,phase,allocated_bytes\n"
                   "2026-12-01T10:00:00,0,0.5,train,1024\n"
                   "2026-12-01T10:00:01,,x,,\n"
                   "2026-12-01T10:00:02,1,2,eval,4096\n")
    table = read_log(log)
    gpu = table.int_column("gpu")
    assert gpu.values.dtype == np.int64
    assert gpu.tolist() == [0, None, 1]
    assert table.int_column("allocated_bytes").values[gpu.known].tolist() == [1024, 4096]
    assert table.float_column("elapsed_s").tolist() == [0.5, None, 2.0]
    assert not table.int_column("reserved_bytes").any_known()
    phase = table.labels("phase")
    assert phase.names == ["train", "eval"]
    assert phase.codes.tolist() == [0, -1, 1]
    assert phase.tolist() == ["train", None, "eval"]


def test_a_missing_column_is_all_unknown() -> None:
    table = LogTable("x", {"gpu": ["0", "1"]})
    assert table.int_column("tokens").tolist() == [None, None]
    assert table.labels("phase").tolist() == [None, None]


def _lists_agree(table: LogTable) -> None:
    """Every column's arrays and its list views say the same, cell for cell."""
    for name in table.columns:
        ints, floats, labels = table.int_column(name), table.float_column(name), table.labels(name)
        assert ints.values.dtype == np.int64 and floats.values.dtype == np.float64 and labels.codes.dtype == np.int32
        assert len(ints) == len(floats) == len(labels) == len(table), name
        assert ints.tolist() == table.ints(name), name
        assert floats.tolist() == table.floats(name), name
        assert labels.tolist() == table.strings(name), name
        assert table.has(name) == any(s is not None for s in table.strings(name)), name


def test_jsonl_columns_with_nulls_late_keys_and_a_key_per_row(tmp_path: Path) -> None:
    log = tmp_path / "mem.jsonl"
    log.write_text('{"time": "t0", "gpu": 0, "allocated_bytes": 1024, "phase": "train", "elapsed_s": 0.5}\n'
                   '{"time": "t1", "gpu": null, "allocated_bytes": null, "late": 3}\n'
                   '{"time": "t2", "gpu": 1, "allocated_bytes": 4096, "phase": "eval", "loss_2": 0.25}\n'
                   '{"time": "t3", "gpu": 1, "allo')  # torn
    table = read_log(log)
    assert table.kind == "jsonl" and len(table) == 3
    assert table.int_column("allocated_bytes").tolist() == [1024, None, 4096]
    assert table.int_column("late").tolist() == [None, 3, None]
    assert table.float_column("loss_2").tolist() == [None, None, 0.25]
    assert table.labels("phase").names == ["train", "eval"]
    assert table.gpus() == [0, None, 1]
    _lists_agree(table)


def test_rotated_parts_are_one_column_each(tmp_path: Path) -> None:
    header = "time,gpu,phase,reserved_bytes\n"
    (tmp_path / "mem.csv").write_text(header + "t0,0,train,10\nt1,0,train,20\n")
    (tmp_path / "mem.csv.1").write_text(header + "t2,0,eval,30\nt3,1,,x\n")
    (tmp_path / "mem.csv.2").write_text(header + "t4,1,train,50\n")
    table = read_log(tmp_path / "mem.csv")
    assert len(table) == 5
    assert table.int_column("reserved_bytes").tolist() == [10, 20, 30, None, 50]
    phase = table.labels("phase")
    assert phase.names == ["train", "eval"] and phase.codes.tolist() == [0, 0, 1, -1, 0]
    assert table.select(gpu=1).strings("time") == ["t3", "t4"]
    assert table.select(phase=None).int_column("gpu").tolist() == [1]
    _lists_agree(table)
    _lists_agree(table.select(gpu=0))


def test_nvidia_smi_columns_are_numbers_already(tmp_path: Path) -> None:
    log = tmp_path / "smi.csv"
    log.write_text("timestamp, index, memory.used [MiB], memory.total [MiB], utilization.gpu [%]\n"
                   "2026/11/29 10:00:00.000, 0, 100 MiB, 200 MiB, 5 %\n"
                   "2026/11/29 10:00:00.000, 1, [N/A], 200 MiB, [Not Supported]\n"
                   "2026/11/29 10:00:01.250, 0, 1.5 MiB, 200 MiB, 7 %\n")
    table = read_log(log)
    assert table.int_column("device_used_bytes").tolist() == [100 * 2**20, None, int(1.5 * 2**20)]
    assert table.float_column("elapsed_s").tolist() == [0.0, 0.0, 1.25]
    assert table.int_column("utilization_pct").tolist() == [5, None, 7]
    assert table.labels("time").names == ["2026-11-29T10:00:00.000+00:00", "2026-11-29T10:00:01.250+00:00"]
    assert table.int_column("time").tolist() == [None, None, None]  # a time is no number
    _lists_agree(table)
    _lists_agree(table.select(gpu=0))


def test_hand_written_and_mapped_logs_have_the_same_columns(tmp_path: Path) -> None:
    log = tmp_path / "loop.log"
    log.write_text("2026-12-01 08:00:00.000000,0,1.50,2.00\n2026-12-01 08:00:01.500000,1,1.75,2.25\n")
    table = read_any_log(log)
    assert table.int_column("allocated_bytes").tolist() == [int(1.5 * 2**30), int(1.75 * 2**30)]
    assert table.float_column("elapsed_s").tolist() == [0.0, 1.5]
    assert table.int_column("gpu").tolist() == [0, 0]
    _lists_agree(table)
    mapped = read_any_log(log, parse_columns("step=1,reserved=3:GiB"))
    assert mapped.int_column("reserved_bytes").tolist() == [2 * 2**30, int(2.25 * 2**30)]
    _lists_agree(mapped)


def test_a_column_is_converted_once_and_kept(tmp_path: Path) -> None:
    log = tmp_path / "mem.csv"
    log.write_text("time,gpu,reserved_bytes\nt0,0,10\nt1,0,20\n")
    table = read_log(log)
    assert table.int_column("reserved_bytes") is table.int_column("reserved_bytes")
    assert table.labels("time") is table.labels("time")
