"""The files a command names (YAML and JSON configs, the script itself), read bounded; the one place vramscope
imports PyYAML.

Every file goes through :func:`read_command_file`, the bounded reading ``plan --config`` uses
(:func:`vramscope.logs.inputfile.read_regular_file`): regular files only, checked on a descriptor opened without
blocking, so ``/dev/zero`` is refused before a byte is read and a FIFO without a writer never hangs the plan; at
most :data:`MAX_CONFIG_BYTES`. A YAML document's aliases may add at most :data:`MAX_ALIAS_NODES` nodes when
expanded (a 600-byte "billion laughs" file would otherwise expand into gigabytes), and a number that is not finite
(``.inf``, ``.nan``, JSON's ``Infinity`` or ``1e999``) is refused, naming its key. Every failure is a
:class:`CommandReadError` that names the file and what to do.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vramscope.commands.errors import HOW_INSTEAD, CommandReadError
from vramscope.logs.inputfile import FileTooLargeError, NotRegularFileError, read_regular_file

MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a training config is a few KiB; refuse to read a data file by mistake
MAX_ALIAS_NODES = 100_000  # what aliases may add to a document; a real config's anchors and merges add hundreds


def read_command_file(path: str | Path, what: str, *, limit: int = MAX_CONFIG_BYTES, head: bool = False) -> bytes:
    """The bytes of a file a command names, bounded: regular files only, at most ``limit`` bytes (with
    ``head``, the first ``limit`` bytes of a larger file).

    Raises:
        CommandReadError: missing, a folder, a FIFO or a device, too large, unreadable; one line naming it.
    """
    try:
        return read_regular_file(path, f"the {what}", limit, head=head)
    except FileNotFoundError:
        raise CommandReadError(f"{what} {path} not found; check the path (relative paths are read from "
                               f"the current directory)") from None
    except IsADirectoryError:
        raise CommandReadError(f"{what} {path} is a folder, not a file") from None
    except NotRegularFileError as exc:
        raise CommandReadError(f"{what}: {exc}") from None
    except FileTooLargeError:
        raise CommandReadError(f"{what} {path} is larger than {limit >> 20} MiB; is it the config file?") from None
    except OSError as exc:
        raise CommandReadError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def script_text(path: str | Path, limit: int) -> str:
    """The first ``limit`` bytes of a training script, as text, to recognise it; "" when it is not here to read
    (a command planned away from its machine) or is a folder (``python pkg/`` runs its ``__main__.py``).

    Raises:
        CommandReadError: the script is a FIFO or a device: reading one would hang or never end.
    """
    try:
        return read_regular_file(path, "the training script", limit, head=True).decode("utf-8", errors="replace")
    except NotRegularFileError as exc:
        raise CommandReadError(f"training script: {exc}") from None
    except OSError:
        return ""


def _text(path: Path, what: str) -> str:
    try:
        return read_command_file(path, what).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CommandReadError(f"cannot read {what} {path}: it is not UTF-8 text ({exc.reason} at byte "
                               f"{exc.start})") from None


def load_yaml(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """A YAML file whose top level is a mapping."""
    import yaml

    p = Path(path)
    text = _text(p, what)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            added = _alias_nodes(node)
            if added is None:
                raise CommandReadError(f"{what} {p} has an anchor that contains itself (a recursive alias); "
                                       "a training config has none: fix it")
            if added > MAX_ALIAS_NODES:
                raise CommandReadError(f"{what} {p}: its aliases expand to more than {MAX_ALIAS_NODES:,} values "
                                       "(an alias bomb?); write the values out or use fewer aliases")
        data = None if node is None else loader.construct_document(node)
    except CommandReadError:
        raise
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise CommandReadError(f"{what} {p} is not valid YAML ({problem}{where}); fix it, or {HOW_INSTEAD}") from None
    except RecursionError:
        raise CommandReadError(f"{what} {p} is nested too deep to be a training config; fix it") from None
    except (ValueError, OverflowError, TypeError) as exc:  # a timestamp-looking value that is no date, ...
        raise CommandReadError(f"{what} {p} has a value YAML cannot read ({exc}); fix it, or {HOW_INSTEAD}") from None
    finally:
        loader.dispose()
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CommandReadError(f"{what} {p} must hold a YAML mapping (key: value lines), not a {type(data).__name__}")
    _refuse_non_finite(data, f"{what} {p}")
    return {str(k): v for k, v in data.items()}


def _children(node: Any) -> list[Any]:
    value = node.value
    if isinstance(value, list):  # a sequence's items, a mapping's (key, value) pairs
        return [n for item in value for n in (item if isinstance(item, tuple) else (item,))]
    return []  # a scalar


def _alias_nodes(root: Any) -> int | None:
    """How many nodes the aliases of the document under ``root`` add when expanded (capped just past
    :data:`MAX_ALIAS_NODES`), or None for an anchor that contains itself. Iterative: a deep document is
    refused by the composer's own recursion, not here."""
    order: list[Any] = []  # every distinct node, children before parents
    done: set[int] = set()
    open_nodes: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if children_done:
            open_nodes.discard(id(node))
            done.add(id(node))
            order.append(node)
            continue
        if id(node) in done:
            continue
        open_nodes.add(id(node))
        stack.append((node, True))
        for child in _children(node):
            if id(child) in open_nodes:
                return None
            if id(child) not in done:
                stack.append((child, False))
    cap = len(order) + MAX_ALIAS_NODES + 1  # keeps the sums small: an alias bomb's would have thousands of digits
    expanded: dict[int, int] = {}
    for node in order:
        expanded[id(node)] = min(cap, 1 + sum(expanded[id(c)] for c in _children(node)))
    return expanded[id(root)] - len(order)


def _refuse_non_finite(data: Any, where: str) -> None:
    for key, value in _numbers(data):
        if not math.isfinite(value):
            raise CommandReadError(f"{where}: {key} is {value}, not a finite number; write a number there")


def _numbers(data: Any) -> Iterator[tuple[str, float]]:
    """Every float in ``data`` with the key that holds it (``zero_optimization.stage``, ``layers[2]``)."""
    stack: list[tuple[str, Any]] = [("", data)]
    seen: set[int] = set()
    while stack:
        key, value = stack.pop()
        if isinstance(value, float):
            yield key or "the value", value
        elif isinstance(value, (dict, list)) and id(value) not in seen:
            seen.add(id(value))  # an alias is the same object: once is enough
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for k, v in reversed(list(items)):
                stack.append((f"{key}[{k}]" if isinstance(value, list) else f"{key}.{k}" if key else str(k), v))


def load_json(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """A JSON file whose top level is an object."""
    p = Path(path)
    return _json_object(_text(p, what), f"{what} {p}")


def load_json_or_text(value: str, what: str) -> dict[str, Any]:
    """A JSON object given inline (``--deepspeed '{"zero_optimization": ...}'``) or as a file path."""
    if value.lstrip().startswith("{"):
        return _json_object(value, what)
    return load_json(value, what)


def _json_object(text: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise CommandReadError(f"{where} is not valid JSON ({exc}); fix it, or {HOW_INSTEAD}") from None
    if not isinstance(data, dict):
        raise CommandReadError(f"{where} must hold a JSON object")
    _refuse_non_finite(data, where)  # Infinity and NaN, which Python's json accepts, and 1e999
    return data
