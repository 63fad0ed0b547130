"""Which FSDP a command runs: 1 (``FullyShardedDataParallel``, flat parameters) or 2 (``fully_shard``).

The planner keeps the two apart only where they differ, under parameter offload: FSDP1 pins a CPU gradient for
every flat parameter, frozen ones too, and copies the next unit's shard to the GPU before its all-gather
(:mod:`vramscope.planner.distributed`). Each tool says the version its own way:

- accelerate: ``fsdp_config: {fsdp_version: 2}`` in the ``--config_file`` YAML (a bare ``version`` key too:
  accelerate reads ``fsdp_config.x`` as ``fsdp_x``), ``--fsdp_version 2`` (beats the file), ``FSDP_VERSION=2``;
  unsaid, 1 (``FullyShardedDataParallelPlugin``: ``FSDP_VERSION`` defaults to ``"1"``).
- TrainingArguments (TRL, HF scripts, LLaMA-Factory): ``--fsdp "full_shard auto_wrap"`` builds the Trainer's own
  plugin from ``--fsdp_config`` (a JSON file, inline JSON, or a mapping in a YAML config), whose ``version`` or
  ``fsdp_version`` (the ``fsdp_`` prefix is stripped) replaces accelerate's. Unsaid, 2 from transformers 5.10
  (``int(self.fsdp_config.get("version", 2))``), 1 before: the default is the installed transformers'.
- axolotl: ``fsdp_version: 2`` at the top or in ``fsdp_config`` (``fsdp_version`` or ``version``); unsaid, axolotl
  pins 1 (``check_fsdp_version_in_fsdp_config``).
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vramscope.commands.errors import CommandReadError
from vramscope.commands.files import load_json_or_text

FSDP_VERSIONS = (1, 2)
ACCELERATE_DEFAULT = (1, "accelerate's default")
# transformers' TrainingArguments defaults fsdp_config["version"] to 2 from 5.10 (axolotl's validation pins 1 for
# configs without one because of it; the 5.24 source reads .get("version", 2)).
TRAINER_DEFAULT_FROM = (5, 10)


def fsdp_version_of(value: Any, where: str) -> int:
    """``value`` (``2``, ``"2"``) as 1 or 2.

    Raises:
        CommandReadError: anything else, in one line naming ``where``.
    """
    text = str(value).strip() if isinstance(value, (int, str)) and not isinstance(value, bool) else None
    if text in ("1", "2"):
        return int(text)
    shown = text if text is not None and text.isdigit() else repr(value)
    raise CommandReadError(f"{where}: {shown} is not an FSDP version; set it to 1 (FullyShardedDataParallel) or 2 "
                           "(fully_shard)")


def trainer_default() -> tuple[int, str]:
    """TrainingArguments' FSDP version when ``--fsdp_config`` gives none, for the transformers installed here."""
    try:
        installed = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return 1, ("TrainingArguments' default: 2 from transformers 5.10, 1 before; transformers is not installed "
                   "here, so the one that pins more host memory")
    numbers = [int(n) for n in re.findall(r"\d+", installed)[:2]]
    if tuple(numbers) >= TRAINER_DEFAULT_FROM:
        return 2, f"TrainingArguments' default from transformers 5.10; {installed} here"
    return 1, f"TrainingArguments' default before transformers 5.10; {installed} here"


def trainer_fsdp_config(text: str | None, nested: Any, cwd: Path) -> tuple[dict[str, Any], str | None]:
    """TrainingArguments' ``fsdp_config`` with the ``fsdp_`` prefixes stripped, as the Trainer reads it, and a note
    when it names a file that is not here (a command planned away from its machine).

    ``text`` is the value as the reader took it; ``nested`` the config file's own ``fsdp_config`` (a YAML mapping
    arrives as its text), used when ``text`` is that mapping.
    """
    if text is None:
        return {}, None
    if isinstance(nested, Mapping) and text == str(nested):
        settings: Mapping[str, Any] = nested
    elif text.lstrip().startswith("{"):
        settings = load_json_or_text(text, "--fsdp_config")
    else:
        path = Path(text).expanduser()
        path = path if path.is_absolute() else cwd / path
        if not path.exists():
            return {}, f"--fsdp_config {text} is not here: its FSDP settings (version, offload) are not read"
        settings = load_json_or_text(str(path), "--fsdp_config")
    return {(str(k)[5:] if str(k).startswith("fsdp_") else str(k)): v for k, v in settings.items()}, None


def axolotl_version(cfg: Mapping[str, Any]) -> tuple[int | None, str]:
    """axolotl's ``fsdp_version`` (top level first, then ``fsdp_config``'s ``fsdp_version`` or ``version``) and
    where it was read; None when the config says none."""
    if cfg.get("fsdp_version") is not None:
        return fsdp_version_of(cfg["fsdp_version"], "fsdp_version"), "fsdp_version"
    nested = cfg.get("fsdp_config")
    if isinstance(nested, Mapping):
        for key in ("fsdp_version", "version"):
            if nested.get(key) is not None:
                return fsdp_version_of(nested[key], f"fsdp_config.{key}"), f"fsdp_config.{key}"
    return None, ""
