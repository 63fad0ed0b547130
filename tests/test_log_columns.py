"""The log's columns as numpy arrays (the whole-column API the analysis reads)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vramscope.logfile import LogTable, read_log


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
