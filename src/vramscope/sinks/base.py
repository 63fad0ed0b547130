"""What a sink is: something that takes samples, one at a time, and can be closed."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path
from typing import IO, Protocol, runtime_checkable

from vramscope.types import Sample

log = logging.getLogger(__name__)


@runtime_checkable
class Sink(Protocol):
    """Receives every sample. ``write`` may raise; the sampler reports it once and carries on."""

    def write(self, sample: Sample) -> None: ...

    def close(self) -> None: ...


class LogPathError(ValueError):
    """A log file cannot be created where the user asked."""


def open_log(path: str | os.PathLike[str], append: bool = False) -> IO[str]:
    """Open a log for line-at-a-time writing, with an error that says what to do when it cannot be."""
    target = Path(path)
    _check_folder(target)
    try:
        # newline="" so that the csv module controls line ends; line buffering is not enough for
        # CSV rows, so sinks flush explicitly after each sample.
        return open(target, "a" if append else "w", encoding="utf-8", newline="")
    except OSError as exc:
        raise LogPathError(f"cannot write log {target}: {exc.strerror or exc}; choose a writable path") from exc


def part_path(path: str | os.PathLike[str], part: int) -> str:
    """The file of part ``part`` of a rotated log: part 0 is ``path`` itself, then ``path.1``, ``path.2``...

    Parts are numbered in the order they were written, and a part is never renamed: a reader (or a
    crash) never sees a set in the middle of a reshuffle.
    """
    base = os.fspath(path)
    return base if part == 0 else f"{base}.{part}"


def log_parts(path: str | os.PathLike[str]) -> list[str]:
    """``path`` and the parts that follow it (``path.1``, ``path.2``, ... up to the first gap), in order."""
    parts = [os.fspath(path)]
    while os.path.isfile(part_path(path, len(parts))):
        parts.append(part_path(path, len(parts)))
    return parts


class LogFile:
    """A log file written one whole sample at a time, straight to the OS (no Python-side buffer).

    What it guarantees, and why:

    * Every :meth:`append` reaches the kernel before it returns, so ``kill -9`` of the writer loses
      nothing already appended (``fsync=True`` also survives a power cut).
    * A failed append (disk full, quota) leaves no torn row behind: the file is cut back to its length
      before the append, so the rows after the disk frees up start on a line of their own.
    * A log deleted while it is written (``rm`` of the file) is re-created at its path with everything
      written so far, copied from the still-open deleted file, so the run's rows are not lost with it.
    * With ``max_bytes``, a part that would grow past it is closed and the next one started:
      ``mem.csv``, ``mem.csv.1``, ``mem.csv.2``... each starting with ``header``. A sample's rows are
      never split over two parts. Nothing is ever deleted, so rotation loses no row.

    Opening truncates ``path`` and removes the parts of an earlier log of the same name (which a
    reader would otherwise take for a continuation), like opening a file for writing does.

    Args:
        path: the log (part 0).
        header: written at the start of every part ("" for none).
        max_bytes: start a new part before one would exceed this; None for a single file.
        fsync: force every append to the disk.

    Raises:
        LogPathError: the log cannot be created or its header written, with what to do.
    """

    def __init__(
        self, path: str | os.PathLike[str], header: str = "", max_bytes: int | None = None, fsync: bool = False
    ) -> None:
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.path = os.fspath(path)
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.part = 0
        self.recovered = 0  # times the file was found deleted and re-created
        self._told_unrecoverable = False
        self._header = header.encode("utf-8")
        self._fd: int | None = None
        _check_folder(Path(self.path))
        self._fd = self._create(self.path)
        self._remove_stale_parts()

    @property
    def current_path(self) -> str:
        """The part being written now."""
        return part_path(self.path, self.part)

    def _create(self, path: str) -> int:
        flags = os.O_CREAT | os.O_TRUNC | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        try:
            try:
                # Readable too, so that a log deleted under us can be copied back (see _recreate).
                fd = os.open(path, os.O_RDWR | flags, 0o644)
            except PermissionError:  # a write-only file: fine, just not recoverable
                fd = os.open(path, os.O_WRONLY | flags, 0o644)
        except OSError as exc:
            raise LogPathError(f"cannot write log {path}: {exc.strerror or exc}; choose a writable path") from exc
        try:
            if self._header:
                _write_all(fd, self._header)
            if self.fsync:
                os.fsync(fd)
                _fsync_folder(path)  # a new file's name is only durable once its folder is
        except OSError as exc:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
            os.close(fd)
            if regular:  # no half-made log left behind; never unlink a device (/dev/full) or a pipe
                with contextlib.suppress(OSError):
                    os.unlink(path)
            raise LogPathError(f"cannot write log {path}: {exc.strerror or exc}; free some space or choose "
                               "another path") from exc
        return fd

    def _remove_stale_parts(self) -> None:
        for stale in log_parts(self.path)[1:]:
            try:
                with open(stale, "rb") as old:
                    ours = old.read(len(self._header) or 1) == (self._header or b"{")
                if not ours:  # not a part of a vramscope log: not ours to delete, and readers stop there
                    break
                os.unlink(stale)
            except OSError:
                break

    def append(self, text: str) -> None:
        """Write ``text`` (whole rows) to the log; on failure nothing of it stays in the file.

        Raises:
            OSError: the write failed (disk full, ...); the file is as it was before the call.
            LogPathError: the next part of a rotated log cannot be started; the rows stay unwritten.
        """
        fd = self._fd
        if fd is None:
            raise ValueError(f"log {self.path} is closed")
        data = text.encode("utf-8")
        status = os.fstat(fd)
        if status.st_nlink == 0:
            fd = self._recreate(fd)
            status = os.fstat(fd)
        size = status.st_size
        if self.max_bytes is not None and size > len(self._header) and size + len(data) > self.max_bytes:
            fd = self._rotate(fd)
            size = len(self._header)
        try:
            _write_all(fd, data)
        except OSError:
            # A partial write (the disk filled mid-row) would leave half a row for the next one to
            # continue: cut the file back so that every line in it stays a whole row.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
        if self.fsync:
            os.fsync(fd)

    def _rotate(self, fd: int) -> int:
        new_fd = self._create(part_path(self.path, self.part + 1))
        self.part += 1
        self._fd = new_fd
        with contextlib.suppress(OSError):
            if self.fsync:
                os.fsync(fd)
            os.close(fd)
        return new_fd

    def _recreate(self, fd: int) -> int:
        """The file was deleted under us: put it back, with its content, and carry on writing there."""
        path = self.current_path
        try:
            new_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND | getattr(os, "O_CLOEXEC", 0),
                             0o644)
        except OSError as exc:
            # The folder went too: keep writing to the deleted file (its rows live on while we run).
            if not self._told_unrecoverable:
                self._told_unrecoverable = True
                log.warning("vramscope: log %s was deleted and cannot be re-created (%s); rows written from now "
                            "on are kept only until the run ends", path, exc.strerror or exc)
            return fd
        try:
            offset = 0
            while chunk := os.pread(fd, 1 << 20, offset):
                _write_all(new_fd, chunk)
                offset += len(chunk)
        except OSError as exc:  # the disk is full too: try again at the next append
            os.close(new_fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise OSError(exc.errno, f"cannot re-create deleted log {path}: {exc.strerror}") from exc
        os.close(fd)
        self._fd = new_fd
        self.recovered += 1
        log.warning("vramscope: log %s was deleted while being written; re-created it with every row so far",
                    path)
        return new_fd

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                if self.fsync:
                    os.fsync(fd)
                os.close(fd)

    @property
    def closed(self) -> bool:
        return self._fd is None


def _check_folder(target: Path) -> None:
    if target.is_dir():
        raise LogPathError(f"log path {target} is a directory; give a file name such as {target / 'memory.csv'}")
    if not target.parent.exists():
        raise LogPathError(f"cannot write log {target}: folder {target.parent} does not exist; create it first")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_folder(path: str) -> None:
    with contextlib.suppress(OSError):
        folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
