"""The config files a command names (YAML, JSON), read into mappings; the one place vramscope imports PyYAML.

Every failure is a :class:`CommandReadError` that names the file and what to do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vramscope.commands.errors import HOW_INSTEAD, CommandReadError

MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a training config is a few KiB; refuse to read a data file by mistake


def _text(path: Path, what: str) -> str:
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise CommandReadError(f"{what} {path} is larger than {MAX_CONFIG_BYTES >> 20} MiB; is it the config file?")
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CommandReadError(f"{what} {path} not found; check the path (relative paths are read from "
                               f"the current directory)") from None
    except IsADirectoryError:
        raise CommandReadError(f"{what} {path} is a folder, not a file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandReadError(f"cannot read {what} {path}: {exc}") from None


def load_yaml(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """A YAML file whose top level is a mapping."""
    import yaml

    p = Path(path)
    text = _text(p, what)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise CommandReadError(f"{what} {p} is not valid YAML ({problem}{where}); fix it, or {HOW_INSTEAD}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CommandReadError(f"{what} {p} must hold a YAML mapping (key: value lines), not a {type(data).__name__}")
    return {str(k): v for k, v in data.items()}


def load_json(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """A JSON file whose top level is an object."""
    p = Path(path)
    text = _text(p, what)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise CommandReadError(f"{what} {p} is not valid JSON ({exc}); fix it, or {HOW_INSTEAD}") from None
    if not isinstance(data, dict):
        raise CommandReadError(f"{what} {p} must hold a JSON object")
    return data


def load_json_or_text(value: str, what: str) -> dict[str, Any]:
    """A JSON object given inline (``--deepspeed '{"zero_optimization": ...}'``) or as a file path."""
    if value.lstrip().startswith("{"):
        try:
            data = json.loads(value)
        except ValueError as exc:
            raise CommandReadError(f"{what} is not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise CommandReadError(f"{what} must be a JSON object")
        return data
    return load_json(value, what)
