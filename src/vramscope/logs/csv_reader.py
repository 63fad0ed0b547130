"""vramscope's CSV log read into columns by pyarrow, the schema's number columns typed as they are read.

The file's complete lines are streamed through ``pyarrow.csv.open_csv`` a block at a time: a row of
another width (a torn or foreign line in the middle) is skipped, an empty cell is unknown, and a
column that holds nothing in a block keeps no memory for it (:mod:`vramscope.logs.arrow_columns`).
A large file's two halves are streamed at once, on two cores (:mod:`vramscope.logs.halves`), and the
second's columns put after the first's: the same table, cell for cell.
What pyarrow refuses falls back, step by step:

1. a number column's cell that is not a plain number ("1.2e9" from another writer, damage), or bytes
   that are not UTF-8: every column read as text (the bytes repaired) and the schema's number columns
   made numbers by the per-cell rules (:func:`~vramscope.logs.cells.int_of`);
2. anything pyarrow cannot parse (a quote left open over the rest of the file): the csv module.

A last line cut by a crash is dropped (:meth:`~vramscope.logs.source.LogSource.lines`).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator
from functools import partial
from typing import BinaryIO

import pyarrow as pa
import pyarrow.csv as pacsv

from vramscope.logs.arrow_columns import ArrowColumn, NumberBuilder, Piece, TextBuilder, _floats, _ints
from vramscope.logs.errors import LogFormatError
from vramscope.logs.halves import halves, read_at_once
from vramscope.logs.label_columns import LABEL_TYPE, LabelBuilder
from vramscope.logs.schema import FLOAT_COLUMNS, INT_COLUMNS
from vramscope.logs.source import LineStream, LogSource
from vramscope.logs.table import ColumnData, LogTable

BLOCK_BYTES = 1 << 20  # pyarrow's block: 1 MiB of lines (4 MiB blocks in flight cost 110 MB more peak RSS on 189 MB)
_NULLS = [""]
# One of pyarrow's threads a stream: its streaming reader gained nothing from a second one here (the same CPU and
# wall time on 2 cores, a day's log of 800k rows), and the blocks it parses ahead cost 10-20 MB more peak RSS.
# A large file's halves are two streams read at once instead (vramscope.logs.halves).
THREADS = False
LABEL_COLUMNS = frozenset({"phase", "gpu_uuid"})  # text of a few distinct cells (train/eval; one UUID a GPU)


def sniff(source: LogSource) -> bool:
    """vramscope's own header: ``time`` and ``gpu`` among its cells."""
    cells = source.header.split(",")
    return "time" in cells and "gpu" in cells


def read_csv(source: LogSource) -> LogTable:
    """A vramscope CSV log (header first); only the columns of ``source.only`` when it names some."""
    header = _header_cells(source.name, source.header)
    winner = {h: j for j, h in enumerate(header)}  # a name twice: the last one wins, as it always did
    if source.only is not None:
        winner = {h: j for h, j in winner.items() if h in source.only}
    if source.header_end < 0:  # a header without its line end: the columns, no rows
        return LogTable(source.name, {h: ArrowColumn([], _kind(h)) for h in winner}, rows=0)
    start = source.header_end + 1
    body = max(0, source.last_line_end - start)
    threads = THREADS
    # Lines split at every line end first (a third faster); a file with a quote is read again, a quoted
    # cell's line ends kept in it, as it always was.
    streams = halves(source, start)
    try:
        table = _read_quote_free(source.name, winner, streams, len(header), body)
        if not any(s.quoted or s.hex_prefixed for s in streams):
            return table
    except pa.ArrowInvalid:
        pass  # a cell that is no plain number, or bytes that are not UTF-8: the per-cell rules below
    quoted, hex_prefixed = any(s.quoted for s in streams), any(s.hex_prefixed for s in streams)
    if quoted and not hex_prefixed:
        again = source.lines(start)
        try:
            table = _table(source.name, winner, _blocks(again, len(header), winner, typed=True, threads=threads),
                           body)
            if not again.hex_prefixed:
                return table
        except pa.ArrowInvalid:
            pass
    repaired = source.data()[start - source.offset :]
    repaired = repaired[: repaired.rfind(b"\n") + 1]
    repaired = repaired.decode("utf-8", errors="replace").encode("utf-8")
    try:
        return _table(source.name, winner, _blocks(io.BytesIO(repaired), len(header), winner, typed=False,
                                                   threads=THREADS), len(repaired))
    except pa.ArrowInvalid:
        pass
    header, rows = csv_columns(source.name, source.header + "\n" + repaired.decode("utf-8"), "is it a vramscope log?")
    winner = {h: j for j, h in enumerate(header) if source.only is None or h in source.only}
    columns = {h: _typed(h, pa.array([c or None for c in rows[j]], type=pa.string())) for h, j in winner.items()}
    return LogTable(source.name, columns, rows=len(rows[0]) if rows else 0)


def _read_quote_free(name: str, winner: dict[str, int], streams: list[LineStream], width: int,
                     body: int) -> LogTable:
    """The typed, quote-free pass over the streams' lines; the halves of a large log (:mod:`vramscope.logs.halves`)
    are read at once, and the second's columns then put after the first's (:meth:`_Columns.extend`)."""

    def blocks(stream: LineStream) -> Iterator[dict[str, pa.Array]]:
        return _blocks(stream, width, winner, typed=True, threads=THREADS, quotes=False)

    if len(streams) == 1:
        return _table(name, winner, blocks(streams[0]), body)
    parts = [_Columns(winner, body), *(_Columns(winner, stream.length) for stream in streams[1:])]
    # blocks() is a generator: each stream is opened and parsed where its part is fed, on its own thread.
    read_at_once([partial(part.feed, blocks(stream)) for part, stream in zip(parts, streams, strict=True)])
    for part in parts[1:]:
        parts[0].extend(part)
    return parts[0].table(name)


def _header_cells(name: str, line: str) -> list[str]:
    if '"' not in line:
        return line.split(",")
    try:
        return next(csv.reader([line]), [])
    except csv.Error as exc:
        raise LogFormatError(f"{name}'s header cannot be read as CSV ({exc}); is it a vramscope log?") from None


def _kind(name: str) -> pa.DataType:
    return pa.int64() if name in INT_COLUMNS else pa.float64() if name in FLOAT_COLUMNS else pa.string()


def _typed(name: str, texts: pa.Array) -> ArrowColumn:
    """A column read as text, the schema's number columns made numbers by the per-cell rules."""
    kind = _kind(name)
    if pa.types.is_string(kind):
        return ArrowColumn([texts], kind)
    number = _ints(texts, texts.type) if pa.types.is_integer(kind) else _floats(texts, texts.type)
    return ArrowColumn.of_numbers(number)


def _blocks(stream: BinaryIO | LineStream, width: int, winner: dict[str, int], typed: bool, threads: bool,
            quotes: bool = True) -> Iterator[dict[str, pa.Array]]:
    """Each block's columns (header name -> array); ``quotes``: quotes are heeded (a line end inside them is a
    cell's). Without, a ``"`` is a character like any other: only for a LineStream whose ``quoted`` the caller
    checks afterwards."""
    names = [f"c{j}" for j in range(width)]
    wanted = {h: f"c{j}" for h, j in winner.items()}
    # The quote-free pass reads the phase (and the GPU's UUID) as pyarrow's dictionary type: cheaper than text,
    # and the labels the analysis asks for are then made as the blocks come (vramscope.logs.label_columns).
    types = {wanted[h]: (LABEL_TYPE if h in LABEL_COLUMNS and not quotes else _kind(h)) if typed else pa.string()
             for h in wanted}
    paced = stream if isinstance(stream, LineStream) else None
    torn = False

    def skip_row(_row: object) -> str:
        # A row of another width is skipped by a call into Python, which costs ten times as much on pyarrow's
        # reading thread, where a paced read moves the parse (a torn MiB 0.18 s against 0.015 s): not paced then.
        nonlocal torn
        if not torn and paced is not None:
            torn = True
            paced.unpace()  # for good: also when the first blocks' rows come before pace() below
        return "skip"  # a row of another width would shift every column after it

    try:
        reader = pacsv.open_csv(
            stream,
            read_options=pacsv.ReadOptions(column_names=names, block_size=BLOCK_BYTES, use_threads=threads),
            # Without quotes the tokenizer need not look for them at all (a tenth faster): that pass's rows are
            # kept only when no quote went by (LineStream.quoted).
            parse_options=pacsv.ParseOptions(newlines_in_values=quotes, quote_char='"' if quotes else False,
                                             invalid_row_handler=skip_row),
            convert_options=pacsv.ConvertOptions(column_types=types, include_columns=list(types),
                                                 null_values=_NULLS, strings_can_be_null=True,
                                                 quoted_strings_can_be_null=True),
        )
    except pa.ArrowInvalid as exc:
        if "Empty CSV file" in str(exc):
            return  # no complete line after the header
        raise
    if paced is not None:
        # A few blocks read ahead of the batches taken, not pyarrow's 32; from here on: the first blocks are read
        # in this thread, before any batch can be taken (a wait there waited for nothing: 0.25 s a blank MiB).
        paced.pace()
    for batch in reader:
        yield {h: batch.column(wanted[h]) for h in winner}
        if paced is not None:
            paced.took_block()


def _table(name: str, winner: dict[str, int], blocks: Iterable[dict[str, pa.Array]], body_bytes: int) -> LogTable:
    """The blocks' columns end to end (:class:`_Columns`)."""
    columns = _Columns(winner, body_bytes)
    columns.feed(blocks)
    return columns.table(name)


class _Columns:
    """A table's columns made from a reader's blocks as they come: text as pyarrow's pieces, numbers straight
    into numpy (:class:`NumberBuilder`: no second copy of the cells, and a column never logged costs nothing).
    ``body_bytes``: the lines the blocks will hold, for each column's expected rows."""

    def __init__(self, winner: dict[str, int], body_bytes: int) -> None:
        self.winner = winner
        self.body_bytes = body_bytes
        self.pieces: dict[str, list[Piece]] = {h: [] for h in winner if pa.types.is_string(_kind(h))}
        self.numbers = {h: NumberBuilder(_kind(h)) for h in winner if h not in self.pieces}
        self.texts: dict[str, TextBuilder | None] = {h: TextBuilder() for h in self.pieces}
        self.labels: dict[str, LabelBuilder] = {}  # the text columns read as dictionaries
        self.rows = 0

    def _expected(self, size: int) -> int:
        return size * (self.body_bytes // BLOCK_BYTES + 1) * 9 // 8 + 1024

    def feed(self, blocks: Iterable[dict[str, pa.Array]]) -> None:
        numbers, texts, labels, pieces = self.numbers, self.texts, self.labels, self.pieces
        rows = self.rows
        for block in blocks:
            size = 0
            for h, array in block.items():
                size = len(array)
                builder = numbers.get(h)
                if builder is not None:
                    if builder.capacity == 0:  # rows expected: this block's share of the whole
                        builder.capacity = self._expected(size)
                    builder.add(rows, array)
                    continue
                if pa.types.is_dictionary(array.type):
                    label = labels.get(h)
                    if label is None:
                        label = labels[h] = LabelBuilder()
                        label.capacity = self._expected(size)
                    label.add(rows, array)
                    continue
                text = texts[h]
                if text is not None and pa.types.is_string(array.type):
                    text.capacity = text.capacity or self._expected(size)
                    if text.add(rows, array):
                        continue
                    texts[h] = None  # past 2 GiB of text: pieces from here on, the rows so far one of them
                    pieces[h] = [p for p in (text.array(rows),) if p is not None] or ([rows] if rows else [])
                kept = pieces[h]
                if array.null_count == size:  # nothing in this block: a count, not an array of nulls
                    if kept and isinstance(kept[-1], int):
                        kept[-1] += size
                    else:
                        kept.append(size)
                else:
                    kept.append(array)
            rows += size
            self.rows = rows

    def extend(self, other: _Columns) -> None:
        """``other``'s rows (the same columns, read from the lines after this one's) after this one's, as feeding
        its blocks here would have made them, a column at a time (each of ``other``'s arrays let go as it is
        copied)."""
        at = self.rows
        for h, number in other.numbers.items():
            self.numbers[h].extend(at, number)
        for h, label in other.labels.items():
            mine = self.labels.get(h)
            if mine is None:
                mine = self.labels[h] = LabelBuilder()
            mine.extend(at, label, other.rows)
        for h, text in other.texts.items():
            whole = text.array(other.rows) if text is not None else None
            other.texts[h] = None
            mine_text = self.texts[h]
            if text is not None and mine_text is not None and (whole is None or mine_text.add(at, whole)):
                continue
            # Past 2 GiB of text, in either or together: pieces, this one's rows so far the first of them.
            if mine_text is not None:
                self.texts[h] = None
                self.pieces[h] = [p for p in (mine_text.array(at),) if p is not None] or ([at] if at else [])
            theirs: list[Piece] = (other.pieces[h] if text is None else
                                   [whole] if whole is not None else [other.rows] if other.rows else [])
            kept = self.pieces[h]
            for piece in theirs:
                if isinstance(piece, int) and kept and isinstance(kept[-1], int):
                    kept[-1] += piece
                else:
                    kept.append(piece)
        self.rows = at + other.rows

    def table(self, name: str) -> LogTable:
        rows = self.rows
        for h, text in self.texts.items():
            whole = text.array(rows) if text is not None else None
            if text is not None:
                self.pieces[h] = [whole] if whole is not None else ([rows] if rows else [])
        columns: dict[str, ColumnData] = {
            h: self.labels[h].column(rows) if h in self.labels
            else ArrowColumn(self.pieces[h], _kind(h)) if h in self.pieces
            else self.numbers[h].column(rows) for h in self.winner}
        return LogTable(name, columns, rows=rows)


def complete_lines(text: str) -> str:
    """The text up to its last line end: a crash can cut the last line mid-row."""
    if text.endswith("\n"):
        return text
    cut = text.rfind("\n")
    return text[: cut + 1] if cut >= 0 else ""


def csv_columns(name: str, text: str, hint: str, skip_initial_space: bool = False) -> tuple[list[str], list[list[str]]]:
    """The header and the columns of the complete lines of the header's width, by the csv module.

    Raises:
        LogFormatError: the csv module refuses the text (a cell over its size limit), with ``hint``.
    """
    # newline="": the csv module finds line ends itself (a stray "\r" is then a line end, not an error).
    reader = csv.reader(io.StringIO(complete_lines(text), newline=""), skipinitialspace=skip_initial_space)
    try:
        header = next(reader, [])
        width = len(header)
        columns: list[list[str]] = [[] for _ in header]
        appends = [c.append for c in columns]
        for row in reader:
            if len(row) == width:  # a torn or foreign row would shift every column after it
                for append, cell in zip(appends, row, strict=True):
                    append(cell)
    except csv.Error as exc:  # e.g. a cell over the csv module's size limit: not a log we wrote
        raise LogFormatError(f"{name} cannot be read as CSV ({exc}); {hint}") from None
    return header, columns
