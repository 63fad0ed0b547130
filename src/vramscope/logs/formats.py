"""The log formats vramscope reads, in one table: how each is recognised, read, and called, and what it says.

A new format is one module with a ``sniff(source) -> bool`` and a ``read(source) -> LogTable`` (see
:class:`~vramscope.logs.source.LogSource`) and one line in :data:`FORMATS`, whose words name it wherever formats are
named: ``called`` in the one-line refusals of an unknown file (:func:`refusal`, :func:`own_refusal`), ``made_by``
in ``read_log``'s, ``listed`` in ``vramscope report --help`` (:func:`listed`). The table is tried in order
(the first format whose sniff says yes reads the file); :func:`vramscope.logs.reader.read_log` takes
vramscope's own formats, :func:`~vramscope.logs.reader.read_any_log` the imported ones after them.
A reader does not name its format: :meth:`LogFormat.load` sets the table's
:attr:`~vramscope.logs.table.LogTable.log_format`, and whoever asks what a log is (the report, the reader
of rotated parts) reads the entry's fields, never its ``kind`` as a string.

The readers load numpy and pyarrow; this module does not, so that ``--help`` can name the formats without them
(every command builds every command's parser: tests/test_import.py). A line's sniff and read are its module's
functions through :func:`_later` (a new module takes a loader beside ``_csv_reader``): the module is imported the
first time its format is tried.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from vramscope.logs.errors import LogFormatError, UnknownLogError
from vramscope.logs.mapping import EXAMPLE
from vramscope.logs.source import LogSource

if TYPE_CHECKING:
    from vramscope.logs.table import LogTable

# How the parts a ``--max-log-mb`` rotation wrote (``LOG.1``, ``LOG.2``) join the first: "no" (never
# rotated), "same" (parts of the same format), "same-header" (and the same header line).
Rotated = Literal["no", "same", "same-header"]


@dataclass(frozen=True)
class LogFormat:
    """One format: ``kind`` (its name, as the report shows it), how to recognise it, how to read it, and what it
    says about a log.

    ``rotated``: how a rotation's parts join the first (:data:`Rotated`).
    ``imported``: not written by vramscope (tried only by ``read_any_log``, after vramscope's own).
    ``memory_column_needed``: its sniff sees only names that others' CSVs have too (vramscope's ``time`` and
    ``gpu``), so a file is this format only when it holds one of the memory columns; without one,
    ``read_any_log`` tries the imported formats.
    ``total_from``: what the log's GPU total (``device_total_bytes``) was read from, as the report's caption of
    a device's capacity names it ("GPU total, NVML"): vramscope's sampler reads NVML, nvidia-smi its
    ``memory.total``; a log that vramscope did not write says its own total, read from one of its columns.
    ``called``: how :func:`refusal` names it to someone whose file no format read ("an nvidia-smi --query-gpu
    CSV"); formats called the same are named once. Empty: never named (a format only asked for, as ``MAPPED``).
    ``made_by``: what writes one, for :func:`own_refusal` ("'vramscope run --log'"); empty for an imported format.
    ``listed``: how ``vramscope report --help`` lists it among the logs it reads (:func:`listed`: "nvidia-smi
    CSV"); listed the same, named once.
    """

    kind: str
    sniff: Callable[[LogSource], bool]
    read: Callable[[LogSource], LogTable]
    rotated: Rotated = "no"
    imported: bool = False
    memory_column_needed: bool = False
    total_from: str = "NVML"
    called: str = ""
    made_by: str = ""
    listed: str = ""

    def load(self, source: LogSource) -> LogTable:
        """The file read as this format, the table saying so."""
        return self.adopt(self.read(source))

    def adopt(self, table: LogTable) -> LogTable:
        """``table``, marked as read in this format: the one place a table's format is set."""
        table.log_format = self
        return table


# Each reader module, imported when first asked for (the imports are written out, so that tests/test_layering.py
# sees them as the deferred imports they are).
def _csv_reader() -> ModuleType:
    from vramscope.logs import csv_reader

    return csv_reader


def _jsonl_reader() -> ModuleType:
    from vramscope.logs import jsonl_reader

    return jsonl_reader


def _smi_reader() -> ModuleType:
    from vramscope.logs import smi_reader

    return smi_reader


def _imports() -> ModuleType:
    from vramscope.logs import imports

    return imports


def _later(module: Callable[[], ModuleType], name: str) -> Callable[[LogSource], Any]:
    """``module().name``, looked up when called: the reader module is imported the first time its format is tried."""
    def call(source: LogSource) -> Any:
        return getattr(module(), name)(source)

    call.__qualname__ = call.__name__ = name
    return call


def _needs_a_mapping(source: LogSource) -> LogTable:
    raise refusal(source)  # a CSV read "as mapped" without the mapping: what every unknown CSV is told


_NVIDIA_SMI_TOTAL = "nvidia-smi memory.total"
# The user's own log (their loop's, their CSV's): its total is whatever their code wrote in that column.
_HAND_WRITTEN_TOTAL = "your log's total column"  # a header cell naming a total (imports.guess_columns)
_MAPPED_TOTAL = "your log's --columns total= column"
_OWN_LOG = "a vramscope log"
_SMI_CSV = "an nvidia-smi --query-gpu CSV"
_OWN_MADE_BY = "'vramscope run --log'"
_SMI_MADE_BY = "'nvidia-smi --query-gpu=timestamp,name,memory.used,memory.total --format=csv'"
_OWN_LISTED = "vramscope .csv/.jsonl"
# vramscope's CSV: also what a table made in memory (a test's, a live monitor's columns) holds.
OWN_CSV = LogFormat("vramscope", _later(_csv_reader, "sniff"), _later(_csv_reader, "read_csv"), rotated="same-header",
                    memory_column_needed=True, called=_OWN_LOG, made_by=_OWN_MADE_BY, listed=_OWN_LISTED)
# Any CSV read through a ``--columns`` mapping (``read_any_log``'s ``columns``): never recognised, only asked for.
MAPPED = LogFormat("mapped", lambda _source: False, _needs_a_mapping, imported=True, total_from=_MAPPED_TOTAL)

FORMATS: tuple[LogFormat, ...] = (
    LogFormat("jsonl", _later(_jsonl_reader, "sniff"), _later(_jsonl_reader, "read"), rotated="same",
              called=_OWN_LOG, made_by=_OWN_MADE_BY, listed=_OWN_LISTED),
    LogFormat("nvidia-smi", _later(_smi_reader, "sniff"), _later(_smi_reader, "read"), total_from=_NVIDIA_SMI_TOTAL,
              called=_SMI_CSV, made_by=_SMI_MADE_BY, listed="nvidia-smi CSV"),
    OWN_CSV,
    LogFormat("nvidia-smi", _later(_imports, "sniff_headerless_smi"), _later(_imports, "read_headerless_smi"),
              imported=True, total_from=_NVIDIA_SMI_TOTAL, called=_SMI_CSV,
              listed="headerless nvidia-smi CSV (noheader, nounits)"),
    LogFormat("hand-written", _later(_imports, "sniff_hand_written"), _later(_imports, "read_hand_written"),
              imported=True, total_from=_HAND_WRITTEN_TOTAL, called="a datetime,step,allocated,reserved log",
              listed="datetime,step,allocated GiB,reserved GiB lines"),
)


def format_of(source: LogSource, imported: bool) -> LogFormat | None:
    """The first format that recognises the file (imported ones too when ``imported``)."""
    return next((f for f in FORMATS if (imported or not f.imported) and f.sniff(source)), None)


def refusal(source: LogSource) -> LogFormatError:
    """What no format read, in one line that names every format of :data:`FORMATS` (by its ``called``) and
    ``--columns``."""
    return LogFormatError(
        f"{source.name} is not {_one_of(f.called for f in FORMATS)} (its first line is {source.header[:80]!r}); "
        f"read any CSV with {EXAMPLE} (0-based columns or header names, a unit for each memory column)"
    )


def own_refusal(source: LogSource) -> UnknownLogError:
    """What none of vramscope's own formats (those :func:`~vramscope.logs.reader.read_log` reads) recognised, in one
    line that names each (by its ``called``) and what writes one (its ``made_by``)."""
    own = [f for f in FORMATS if not f.imported]
    return UnknownLogError(
        f"{source.name} is not {_one_of(f.called for f in own)} (its header is {source.header[:80]!r}); "
        f"use a file from {_one_of((f.made_by for f in own), comma=' or ')}",
        source.header,
    )


def own_called() -> str:
    """What :func:`~vramscope.logs.reader.read_log` reads, by each own format's ``called``: "a vramscope log or an
    nvidia-smi --query-gpu CSV" (what a folder given in its place is told to give instead)."""
    return _one_of(f.called for f in FORMATS if not f.imported)


def listed(imported: bool, last: str = " or ") -> str:
    """The formats of :data:`FORMATS` by their ``listed`` (the imported ones too when ``imported``), for ``--help``:
    "vramscope .csv/.jsonl or nvidia-smi CSV"; ``last`` joins the last two."""
    return _one_of((f.listed for f in FORMATS if imported or not f.imported), last=last)


def _one_of(words: Iterable[str], comma: str = ", ", last: str = " or ") -> str:
    """Each of ``words`` once, in order, the empty left out: "a, b or c"."""
    said = list(dict.fromkeys(w for w in words if w))
    return "" if not said else said[0] if len(said) == 1 else f"{comma.join(said[:-1])}{last}{said[-1]}"
