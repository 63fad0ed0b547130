"""Log files written one whole sample at a time: durable appends, rotation into parts, and their names.

A log is ``mem.csv`` and, once rotated, ``mem.csv.1``, ``mem.csv.2``... (:func:`part_path`); the readers
in this package read such a set back as one log (:func:`log_parts`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


class LogPathError(ValueError):
    """A log file cannot be created where the user asked."""


class LogExistsError(LogPathError):
    """The log already exists and overwriting it was not asked for (``--overwrite``)."""


class LogLockedError(LogPathError):
    """Another process is writing the same log (it holds the file's lock)."""


def free_log_name(path: str | os.PathLike[str], taken: Callable[[str], bool] | None = None) -> str:
    """A name beside ``path`` that nothing uses yet: ``mem.csv`` -> ``mem-2.csv``, ``mem-3.csv``...

    ``taken`` says whether a candidate is in use (default: it, or a rotated part of it, exists).
    """
    is_taken = taken or (lambda name: any(os.path.lexists(p) for p in (name, part_path(name, 1))))
    base = os.fspath(path)
    folder, name = os.path.split(base)
    stem, dot, suffix = name.partition(".")
    for number in range(2, 10_000):
        candidate = os.path.join(folder, f"{stem}-{number}{dot}{suffix}")
        if not is_taken(candidate):
            return candidate
    return os.path.join(folder, f"{stem}-{os.getpid()}{dot}{suffix}")


def existing_log_files(path: str | os.PathLike[str]) -> list[str]:
    """The files a new log at ``path`` would replace: ``path`` and its rotated parts, if not empty.

    An empty regular file holds nothing to lose (``mktemp`` makes one), and a FIFO, a terminal or
    ``/dev/stdout`` is not truncated by writing to it, so neither counts.
    """
    found = []
    for candidate in log_parts(path):
        try:
            status = os.stat(candidate)
        except OSError:
            continue
        if stat.S_ISREG(status.st_mode) and status.st_size > 0:
            found.append(candidate)
    return found


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
      never split over two parts. Nothing is ever deleted, so rotation loses no row. A part is only ever
      a new file (``O_EXCL``): when the next name is taken by a file this log did not write (someone's
      ``mem.csv.1``, a ``mem.csv.3`` left after a gap), it is left alone and the current part grows past
      ``max_bytes`` instead, with one warning.

    * The log is locked (``flock`` on its first part, held until :meth:`close`): a second writer of
      the same log is refused before it writes or truncates anything, instead of interleaving rows.

    Opening truncates ``path`` and removes the parts of an earlier log of the same name (which a
    reader would otherwise take for a continuation), like opening a file for writing does, but only
    parts that look like one (they start as this log's header does, or as a vramscope JSONL row) and
    only up to the first that does not, or the first gap; with ``overwrite=False`` a log that already
    holds data is refused instead (:class:`LogExistsError`).

    Args:
        path: the log (part 0).
        header: written at the start of every part ("" for none).
        max_bytes: start a new part before one would exceed this; None for a single file.
        fsync: force every append to the disk.
        overwrite: replace a log that exists and holds data (False: refuse it).

    Raises:
        LogPathError: the log cannot be created or its header written, with what to do.
        LogExistsError: ``overwrite`` is False and the log holds data.
        LogLockedError: another process is writing this log.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        header: str = "",
        max_bytes: int | None = None,
        fsync: bool = False,
        overwrite: bool = True,
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
        self._rotation_blocked = False  # the next part's name is someone else's file
        self._lock_fd: int | None = None  # part 0, open while we write any part: it holds the lock
        _check_folder(Path(self.path))
        if not overwrite:
            existing = existing_log_files(self.path)
            if existing:
                raise LogExistsError(_exists_message(self.path, existing))
        self._fd = self._create(self.path, first=True)
        self._remove_stale_parts()

    @property
    def current_path(self) -> str:
        """The part being written now."""
        return part_path(self.path, self.part)

    def _create(self, path: str, first: bool = False) -> int:
        # Not O_TRUNC: the lock is taken first, so that a second writer truncates nothing. A later part is
        # always a new file (O_EXCL, which also never follows a symbolic link): a file already at its name is
        # not this log's to overwrite (FileExistsError, for _rotate).
        flags = os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0) | (0 if first else os.O_EXCL)
        try:
            try:
                # Readable too, so that a log deleted under us can be copied back (see _recreate).
                fd = os.open(path, os.O_RDWR | flags, 0o644)
            except PermissionError:  # a write-only file: fine, just not recoverable
                if not first:
                    raise
                fd = os.open(path, os.O_WRONLY | flags, 0o644)
        except FileExistsError:
            raise
        except OSError as exc:
            raise LogPathError(f"cannot write log {path}: {exc.strerror or exc}; choose a writable path") from exc
        try:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
            if first and regular:
                _lock(fd, path)
                self._lock_fd = os.dup(fd)
            if regular:
                os.ftruncate(fd, 0)
        except OSError as exc:
            os.close(fd)
            raise LogPathError(f"cannot write log {path}: {exc.strerror or exc}; choose a writable path") from exc
        except BaseException:
            os.close(fd)
            raise
        try:
            if self._header:
                _write_all(fd, self._header)
            if self.fsync:
                os.fsync(fd)
                _fsync_folder(path)  # a new file's name is only durable once its folder is
        except OSError as exc:
            os.close(fd)
            if first and self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
            if regular:  # no half-made log left behind; never unlink a device (/dev/full) or a pipe
                with contextlib.suppress(OSError):
                    os.unlink(path)
            raise LogPathError(f"cannot write log {path}: {exc.strerror or exc}; free some space or choose "
                               "another path") from exc
        return fd

    def _remove_stale_parts(self) -> None:
        # log_parts stops at the first gap: a mem.csv.3 after a missing mem.csv.2 is no part of this log.
        for stale in log_parts(self.path)[1:]:
            try:
                if not _starts_with(stale, _part_signature(self._header)):
                    break  # not a part of a vramscope log: not ours to delete, and readers stop there
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
        if (self.max_bytes is not None and not self._rotation_blocked and size > len(self._header)
                and size + len(data) > self.max_bytes):
            part = self.part
            fd = self._rotate(fd)
            if self.part != part:
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
        following = part_path(self.path, self.part + 1)
        try:
            new_fd = self._create(following)
        except FileExistsError:
            self._rotation_blocked = True
            log.warning("vramscope: %s already exists and this log did not write it; it is left alone, and the "
                        "log carries on in %s past its size limit", following, self.current_path)
            return fd
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
        if self.part == 0 and self._lock_fd is not None:  # the lock moves to the file now at the path
            with contextlib.suppress(OSError):
                fcntl.flock(new_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.close(self._lock_fd)
                self._lock_fd = os.dup(new_fd)
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
        lock_fd, self._lock_fd = self._lock_fd, None
        if lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(lock_fd)  # releases the lock

    @property
    def closed(self) -> bool:
        return self._fd is None


def _lock(fd: int, path: str) -> None:
    """Take the log's writer lock, or raise :class:`LogLockedError` when another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise LogLockedError(
                f"log {path} is being written by another process (it holds the log's lock); "
                f"give this run its own log, e.g. --log {free_log_name(path)}"
            ) from None
        # A file system without locks (some network mounts): write unlocked rather than not at all.
        log.debug("vramscope: cannot lock %s (%s); writing it unlocked", path, exc)


_JSONL_ROW_START = b'{"time":'  # every row of a vramscope JSONL log (logs/schema.py's sample_rows)


def _part_signature(header: bytes) -> bytes:
    """How a part of a log with ``header`` starts: the header's first two fields (``time,elapsed_s,``), so
    that a part written with other extra columns (an older run) is still known as vramscope's; a log
    without a header is JSONL, whose rows start alike."""
    if not header:
        return _JSONL_ROW_START
    first = header.split(b"\n", 1)[0]
    fields = first.split(b",")
    return b",".join(fields[:2]) + b"," if len(fields) > 2 else first


def _starts_with(path: str, signature: bytes) -> bool:
    """Whether the regular file ``path`` starts with ``signature`` (a FIFO put there is not waited on)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        return os.pread(fd, len(signature), 0) == signature
    finally:
        os.close(fd)


def _exists_message(path: str, existing: list[str]) -> str:
    more = f" (and {len(existing) - 1} rotated part{'s' if len(existing) > 2 else ''})" if len(existing) > 1 else ""
    return (f"log {path} already exists{more}; give a new name, e.g. --log {free_log_name(path)}, "
            "or add --overwrite to replace it")


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
