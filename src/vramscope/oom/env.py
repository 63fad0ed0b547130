"""How ``vramscope run --oom-snapshot DIR`` tells the training process where post-mortems go."""

from __future__ import annotations

from pathlib import Path

from vramscope.output.names import OOM_SUFFIX, sibling

ENV_VAR = "VRAMSCOPE_OOM_SNAPSHOT"
"""``vramscope run --oom-snapshot DIR`` sets this to DIR's absolute path for the child; a training
process that sees it records allocator history and writes OOM post-mortems into DIR."""
ENV_MAX_ENTRIES = "VRAMSCOPE_OOM_MAX_ENTRIES"
"""Optional: the history ring buffer's size (alloc/free events kept), default :data:`DEFAULT_MAX_ENTRIES`."""

DEFAULT_MAX_ENTRIES = 100_000
DEFAULT_DIR = "vramscope-oom"


def snapshot_env(out_dir: str | None, log_path: str | None = None) -> dict[str, str]:
    """The child environment for ``vramscope run --oom-snapshot [DIR]``: ``{ENV_VAR: absolute DIR}``.

    Without DIR the post-mortems go beside the log (``mem.csv`` -> ``mem.oom/``), else into
    ``./vramscope-oom``. The folder is created now, so a path that cannot be written fails before
    the command starts.

    Raises:
        ValueError: with a message that says what to do.
    """
    if out_dir:
        target = Path(out_dir)
    elif log_path:
        target = Path(sibling(log_path, suffix=OOM_SUFFIX))
    else:
        target = Path(DEFAULT_DIR)
    target = target.resolve()  # the child may change directory
    if target.exists() and not target.is_dir():
        raise ValueError(f"--oom-snapshot {target} is a file; give a folder for the OOM post-mortems")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(
            f"cannot create {target} for OOM post-mortems: {exc.strerror or exc}; choose a writable folder"
        ) from None
    return {ENV_VAR: str(target)}
