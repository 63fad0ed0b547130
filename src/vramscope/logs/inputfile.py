"""Reading a file someone handed to vramscope, bounded: regular files only, optionally up to a size.

A character device (/dev/zero, /dev/urandom) never ends and would be read until memory runs out; a
FIFO without a writer blocks forever. The file is opened without blocking (a FIFO's open would wait for
a writer) and checked on the open descriptor, so that what is read is what was checked. A regular
file's cost is then bounded by its size, which a caller can cap.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import BinaryIO


class NotRegularFileError(ValueError):
    """The path is a FIFO, a device or a socket (the message says which and what to give instead)."""


class FileTooLargeError(ValueError):
    """The file is larger than the caller's limit."""


def read_regular_file(name: str | os.PathLike[str], what: str, limit: int | None = None, *,
                      head: bool = False) -> bytes:
    """The bytes of ``name`` when it is a regular file (at most ``limit`` bytes, if given).

    Args:
        name: the path.
        what: what the file should be, for the message ("a log written by vramscope or nvidia-smi").
        limit: the most bytes to accept.
        head: a larger file gives its first ``limit`` bytes instead of :class:`FileTooLargeError`
            (a script read to recognise it).

    Raises:
        NotRegularFileError, FileTooLargeError: with one line that says what to give instead.
        OSError: FileNotFoundError, IsADirectoryError (a folder, "" included) and the like, for the caller.
    """
    shown = os.fspath(name)
    path = os.fspath(Path(name))  # "" is "." to pathlib: a folder, as reading it always said
    _check(shown, os.stat(path).st_mode, what)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with open(fd, "rb") as handle:
        status = os.fstat(fd)
        _check(shown, status.st_mode, what)
        if limit is not None and status.st_size > limit and not head:
            raise FileTooLargeError(f"{shown} is {status.st_size:,} bytes, more than the {limit:,} that {what} "
                                    "can be; check the path")
        return handle.read() if limit is None else handle.read(limit + 1)[:limit]


def read_json_file(name: str | os.PathLike[str], what: str, limit: int) -> object:
    """The JSON value in ``name``, read as :func:`read_regular_file` reads (a regular file of at most ``limit``
    bytes): what every side file and JSON input is read through, so that each has the same safety rules.

    Raises:
        NotRegularFileError, FileTooLargeError, OSError: as :func:`read_regular_file`.
        UnicodeDecodeError, ValueError (json.JSONDecodeError among them), RecursionError: not JSON in UTF-8.
    """
    return json.loads(read_regular_file(name, what, limit=limit).decode("utf-8"))


def open_regular_file(name: str | os.PathLike[str], what: str) -> BinaryIO:
    """``name`` opened for reading when it is a regular file (for readers that read it in blocks).

    Raises:
        NotRegularFileError: with one line that says what to give instead.
        OSError: FileNotFoundError, IsADirectoryError and the like, for the caller.
    """
    shown = os.fspath(name)
    path = os.fspath(Path(name))
    _check(shown, os.stat(path).st_mode, what)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        _check(shown, os.fstat(fd).st_mode, what)
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "rb")


def _check(name: str, mode: int, what: str) -> None:
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(name)
    if not stat.S_ISREG(mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
                else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "not a regular file")
        raise NotRegularFileError(f"{name} is {kind}, not a file; give the path of {what}")
