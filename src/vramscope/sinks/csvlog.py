"""The CSV log: one row per GPU per sample, flushed after every sample.

A crash or ``kill -9`` loses at most the row being written: each sample's rows are written and
flushed to the OS before the next sample is taken (``fsync=True`` also forces them to the disk).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence

from vramscope.schema import COLUMNS, Row, sample_rows
from vramscope.sinks.base import open_log
from vramscope.types import Sample


class CsvSink:
    """Writes the long CSV log.

    Args:
        path: the file; created (or truncated) on construction, so a bad path fails at once.
        extra_columns: more columns after the standard ones (values come from ``Sample.extra``).
        fsync: force every sample's rows to the disk, for those who cannot lose a row to a power cut.
    """

    def __init__(self, path: str | os.PathLike[str], extra_columns: Sequence[str] = (), fsync: bool = False) -> None:
        self.path = os.fspath(path)
        self.columns = list(COLUMNS) + [c for c in extra_columns if c not in COLUMNS]
        self._fsync = fsync
        self._file = open_log(self.path)
        self._writer = csv.DictWriter(self._file, fieldnames=self.columns, extrasaction="ignore")
        self._writer.writeheader()
        self._file.flush()

    def write(self, sample: Sample) -> None:
        self.write_rows(sample_rows(sample))

    def write_rows(self, rows: list[Row]) -> None:
        self._writer.writerows(_clean(row) for row in rows)
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def _clean(row: Row) -> Row:
    # None -> empty cell (unknown); csv would write the text "None" otherwise.
    return {k: ("" if v is None else v) for k, v in row.items()}
