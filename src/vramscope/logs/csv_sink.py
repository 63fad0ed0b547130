"""The CSV log: one row per GPU per sample, each sample's rows handed to the OS before the next sample.

A crash or ``kill -9`` loses at most the sample being written, and never leaves half a row in the
middle of the file (see :class:`~vramscope.logs.files.LogFile`); ``fsync=True`` also forces the rows to
the disk. With ``max_bytes`` the log rotates into ``mem.csv``, ``mem.csv.1``, ... each with the header;
:func:`vramscope.logs.reader.read_log` reads the set back as one log.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence

from vramscope.logs.files import LogFile
from vramscope.logs.schema import COLUMNS, Row, sample_rows
from vramscope.types import Sample


class CsvSink:
    """Writes the long CSV log.

    Args:
        path: the file; created (or truncated) on construction, so a bad path fails at once.
        extra_columns: more columns after the standard ones (values come from ``Sample.extra``).
        fsync: force every sample's rows to the disk, for those who cannot lose a row to a power cut.
        max_bytes: rotate to ``path.1``, ``path.2``, ... before a file would grow past this.
        overwrite: replace a log that exists and holds data (False: refuse it with ``LogExistsError``).

    Raises:
        LogPathError: the file cannot be created, is another process's log, or (``overwrite=False``)
            exists; with what to do.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        extra_columns: Sequence[str] = (),
        fsync: bool = False,
        max_bytes: int | None = None,
        overwrite: bool = True,
    ) -> None:
        self.path = os.fspath(path)
        self.columns = list(COLUMNS) + [c for c in extra_columns if c not in COLUMNS]
        # Rows are formatted into a buffer and written with one call, so that a sample's rows reach the
        # file together (and a failed write can be undone whole).
        self._buffer = io.StringIO()
        self._writer = csv.DictWriter(self._buffer, fieldnames=self.columns, extrasaction="ignore")
        self._writer.writeheader()
        self._log = LogFile(self.path, header=self._take(), max_bytes=max_bytes, fsync=fsync,
                            overwrite=overwrite)

    @property
    def parts(self) -> int:
        """How many files the log spans so far (1 until it rotates)."""
        return self._log.part + 1

    def write(self, sample: Sample) -> None:
        self.write_rows(sample_rows(sample))

    def write_rows(self, rows: list[Row]) -> None:
        self._writer.writerows(_clean(row) for row in rows)
        self._log.append(self._take())

    def _take(self) -> str:
        text = self._buffer.getvalue()
        self._buffer.seek(0)
        self._buffer.truncate()
        return text

    def close(self) -> None:
        self._log.close()


def _clean(row: Row) -> Row:
    # None -> empty cell (unknown); csv would write the text "None" otherwise.
    return {k: ("" if v is None else v) for k, v in row.items()}
