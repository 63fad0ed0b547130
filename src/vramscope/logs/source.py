"""A log file opened for reading, as every format's reader sees it: checked, its BOM skipped, its head known.

The file is opened once as a regular file (:mod:`vramscope.logs.inputfile`: no FIFO, no device), a
UTF-8 BOM at its start is skipped (Excel and Windows editors write one; left in, it made vramscope's
own header read as someone else's), and the first line is counted before any reader builds anything
per column: a line of millions of cells is no log, and refused at once (:data:`MAX_COLUMNS`).
A reader takes the whole text (:meth:`LogSource.data`) or a stream of its complete lines
(:meth:`LogSource.lines`: a crash can cut the last line mid-row, and a cut row is dropped).
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Collection
from typing import BinaryIO

from vramscope.logs.errors import LogFormatError
from vramscope.logs.inputfile import NotRegularFileError, open_regular_file

BOM = b"\xef\xbb\xbf"
# vramscope's schema has 22 columns and nvidia-smi's --query-gpu a few dozen fields; a log with more than
# this is no memory log (a 3M-column header cost 2.75 GB before it was refused), so the first line is
# counted first, without building anything per column.
MAX_COLUMNS = 4096
HEAD_BYTES = 1 << 16  # what format sniffing looks at
_SCAN_BYTES = 1 << 16
_LINE_BYTES = 1 << 12  # what line_at looks at: a log's line is a few hundred bytes
_DELIMITERS = (b",", b"\t", b";")
READ_AHEAD = 3  # blocks a paced stream hands out beyond those used (LineStream.pace)
PACE_WAIT_S = 0.25  # the longest a paced read waits for the caller: a batch that needs more blocks goes on


class LogSource:
    """One log file: ``name`` as given, ``head`` (its first bytes, no BOM), ``header`` (its first line), ``only``
    (the columns wanted, None for all)."""

    def __init__(self, name: str, what: str, only: Collection[str] | None = None) -> None:
        self.name = name
        # The columns the caller will read (a report reads 17 of the 22): a reader that can leave the others
        # out of the table does; None: all of them.
        self.only = frozenset(only) if only is not None else None
        self._handle = _open(name, what)
        self.size = os.fstat(self._handle.fileno()).st_size
        start = self._handle.read(len(BOM))
        self.offset = len(BOM) if start == BOM else 0  # where the text begins
        self._handle.seek(self.offset)
        self.head = self._handle.read(HEAD_BYTES)
        self.header_end = self._first_line_end()  # the offset of the first "\n" after self.offset, or -1
        end = self.header_end - self.offset if self.header_end >= 0 else len(self.head)
        self.header = self.head[:end].decode("utf-8", errors="replace").rstrip("\r")
        self.last_line_end = self._last_line_end()  # the offset after the last "\n", or self.offset

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> LogSource:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def data(self) -> bytes:
        """The whole text (without its BOM): for the readers of small or irregular files."""
        self._handle.seek(self.offset)
        return self._handle.read()

    def lines(self, start: int | None = None, end: int | None = None) -> LineStream:
        """A stream of the file's complete lines, from ``start`` (default: the text's start) to ``end`` (a line's
        start; default: the end of the last complete line)."""
        begin = self.offset if start is None else start
        return LineStream(self._handle, begin, max(begin, self.last_line_end if end is None else end))

    def line_start_after(self, at: int) -> int:
        """The start of the first line that begins after offset ``at`` (the end of the last complete line when
        none does)."""
        while at < self.last_line_end:
            chunk = os.pread(self._handle.fileno(), _SCAN_BYTES, at)
            if not chunk:  # the file shrank under us
                break
            cut = chunk.find(b"\n")
            if cut >= 0:
                return min(at + cut + 1, self.last_line_end)
            at += len(chunk)
        return self.last_line_end

    def line_at(self, at: int) -> bytes:
        """The line that starts at offset ``at``, without its line end, when its first :data:`_LINE_BYTES` hold
        one; else those bytes."""
        chunk = os.pread(self._handle.fileno(), min(_LINE_BYTES, max(0, self.last_line_end - at)), at)
        cut = chunk.find(b"\n")
        return chunk if cut < 0 else chunk[:cut]

    def _first_line_end(self) -> int:
        """Find the first line end, counting cells as it goes: refused past :data:`MAX_COLUMNS`."""
        counts = dict.fromkeys(_DELIMITERS, 0)
        at = self.offset
        chunk = self.head
        # JSON Lines are not counted: a row's commas are not columns, and keys that come and go cost
        # only their cells (vramscope.logs.jsonl_reader).
        counting = self.head.lstrip()[:1] != b"{"
        while True:
            newline = chunk.find(b"\n")
            line = chunk if newline < 0 else chunk[:newline]
            for delimiter in _DELIMITERS:
                counts[delimiter] += line.count(delimiter) if counting else 0
            if max(counts.values()) >= MAX_COLUMNS:
                raise LogFormatError(
                    f"{self.name}'s first line has more than {MAX_COLUMNS} columns; no memory log has as many "
                    "(vramscope's has 22): give a log written by vramscope or nvidia-smi")
            if newline >= 0:
                return at + newline
            if len(chunk) < (HEAD_BYTES if at == self.offset else _SCAN_BYTES):
                return -1  # the file ends within its first line
            at += len(chunk)
            self._handle.seek(at)
            chunk = self._handle.read(_SCAN_BYTES)

    def _last_line_end(self) -> int:
        if self.size - self.offset <= len(self.head):
            cut = self.head.rfind(b"\n")
            return self.offset + cut + 1 if cut >= 0 else self.offset
        at = self.size
        while at > self.offset:
            begin = max(self.offset, at - _SCAN_BYTES)
            self._handle.seek(begin)
            cut = self._handle.read(at - begin).rfind(b"\n")
            if cut >= 0:
                return begin + cut + 1
            at = begin
        return self.offset


def _open(name: str, what: str) -> BinaryIO:
    try:
        return open_regular_file(name, what)
    except NotRegularFileError as exc:  # /dev/zero would be read until memory ran out; a FIFO blocks
        raise LogFormatError(str(exc)) from None
    except FileNotFoundError:
        raise LogFormatError(f"log {name} does not exist; check the path") from None
    except IsADirectoryError:
        raise LogFormatError(f"{name} is a folder; give {what}") from None
    except OSError as exc:
        raise LogFormatError(f"cannot read log {name}: {exc.strerror or exc}") from None


class LineStream(io.RawIOBase):
    """Bytes ``begin`` to ``end`` of an open file, read in the caller's blocks (pyarrow's).

    ``quoted`` says whether a ``"`` went by: a CSV reader may split lines without looking for line ends
    inside quotes (faster) and read again, quotes heeded, only a file that has one. ``hex_prefixed`` says
    whether a ``0x`` or ``0X`` went by: pyarrow's integer parser takes ``0x10`` for 16, the per-cell rules
    (``logs.cells.int_of``) take it for no number, so a file with one is read by those rules.
    """

    def __init__(self, handle: BinaryIO, begin: int, end: int) -> None:
        super().__init__()
        self._fd = handle.fileno()
        self._at = begin
        self._end = end
        self.length = max(0, end - begin)  # the bytes it holds
        self._paced = False
        self._unpaced = False  # for good (unpace)
        self._pace = threading.Condition()
        self._reads = 0  # blocks handed out
        self._taken = 0  # blocks the reader's caller has used (paced streams)
        self.quoted = False
        self.hex_prefixed = False
        self._last = b""  # the byte before this block: a "0x" may straddle two

    def readable(self) -> bool:
        return True

    def pace(self) -> None:
        """Hand out at most :data:`READ_AHEAD` blocks more than the caller has used (:meth:`took_block`).

        pyarrow's streaming CSV reader reads on a thread of its own, up to 32 blocks ahead of the batches taken
        from it: 32 MiB of lines held a stream, the most of a large log's read's memory beyond its columns."""
        with self._pace:
            self._paced = not self._unpaced

    def unpace(self) -> None:
        """Hand out blocks as they are asked for again, from now on (a waiting read goes on at once; a later
        :meth:`pace` is none)."""
        with self._pace:
            self._paced = False
            self._unpaced = True
            self._pace.notify_all()

    @property
    def paced(self) -> bool:
        return self._paced

    def took_block(self) -> None:
        """The caller used one more block's rows (a paced stream reads one more ahead)."""
        with self._pace:
            self._taken += 1
            self._pace.notify_all()

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (the rest when negative): what pyarrow calls, the block read into one bytes
        object (``os.pread``: one copy, no seek; RawIOBase's own ``read`` copied each block twice more)."""
        want = self._end - self._at if size is None or size < 0 else min(size, self._end - self._at)
        if want <= 0:
            return b""
        if self._paced:
            with self._pace:  # never for long: a line longer than the blocks ahead goes on after the wait
                self._pace.wait_for(lambda: self._reads - self._taken < READ_AHEAD, timeout=PACE_WAIT_S)
                self._reads += 1
        data = os.pread(self._fd, want, self._at)
        self.quoted = self.quoted or b'"' in data  # at memchr speed
        if not self.hex_prefixed and (b"x" in data or b"X" in data):  # memchr first: "0x" itself is searched
            # for at a tenth of that speed (every "0" a candidate: 0.8 s a million rows), and a log has no x
            self.hex_prefixed = (b"0x" in data or b"0X" in data or (self._last == b"0" and data[:1] in b"xX"))
        self._last = data[-1:]
        self._at += len(data)
        return data

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)
