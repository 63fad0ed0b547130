"""Write a file whole or not at all: a temporary file in the same folder, renamed over the target.

Why: ``Path.write_text`` truncates the target first, so a full disk (or a crash) mid-write leaves a
0-byte or half file where an earlier good one was. Written beside it and renamed, the target is either
the old file or the new one; the temporary file is removed on any failure, so nothing is left behind.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Put ``data`` at ``path`` in one rename; the file keeps an existing file's mode (new: 0666 less umask).

    Raises:
        OSError: the folder cannot take the file (full disk, no permission); ``path`` is then unchanged
            and no temporary file remains.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        if target.exists():
            os.chmod(tmp, target.stat().st_mode & 0o777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a report or an analysis is meant to be shared
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
