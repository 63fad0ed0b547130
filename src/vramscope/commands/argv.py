"""Reading ``--flag value`` argv the way ``HfArgumentParser`` (and so TRL's parser) reads it, without its dataclasses.

``--name value``, ``--name=value``, ``--name`` alone (a boolean set to true), ``--no_name`` (a boolean
that defaults to true, set to false), dashes and underscores alike (``--lora-r`` is ``--lora_r``), several
values after one flag (``--lora_target_modules q_proj v_proj``). A config file's mapping (TRL's
``--config``, axolotl's YAML) becomes the same options, so one reader takes both, the command line
winning. :class:`Reader` records what it took (``read``) and leaves the rest to be listed as not
understood.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vramscope.commands.errors import CommandReadError

_NUMBER = re.compile(r"^-\d+(\.\d*)?([eE][-+]?\d+)?$")
_TRUE = {"true", "yes", "t", "y", "1", "on"}
_FALSE = {"false", "no", "f", "n", "0", "off"}


@dataclass
class Option:
    """One flag as the command gives it: its normalised name, its values and how it was written."""

    name: str  # no leading dashes, dashes as underscores: "per_device_train_batch_size"
    values: list[str]
    written: str  # "--lora-r" on the command line, "lora_r (sft.yaml)" from a config file


def is_flag(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not _NUMBER.match(token)


def normalise(name: str) -> str:
    return name.lstrip("-").replace("-", "_")


def split_options(tokens: Sequence[str]) -> tuple[list[Option], list[str]]:
    """``(options, positionals)`` of a program's argv."""
    options: list[Option] = []
    positionals: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token == "--":  # everything after is positional
            positionals.extend(tokens[i:])
            break
        if not is_flag(token):
            positionals.append(token)
            continue
        if "=" in token and token.startswith("--"):
            name, value = token.split("=", 1)
            options.append(Option(normalise(name), [value], name))
            continue
        values: list[str] = []
        while i < len(tokens) and not is_flag(tokens[i]) and tokens[i] != "--":
            values.append(tokens[i])
            i += 1
        options.append(Option(normalise(token), values, token))
    return options, positionals


def options_from_mapping(mapping: Mapping[str, Any], source: str) -> list[Option]:
    """A config file's top-level keys as options (lists as several values, booleans as true/false)."""
    out: list[Option] = []
    for key, value in mapping.items():
        if isinstance(value, bool):
            values = ["true" if value else "false"]
        elif value is None:
            values = ["none"]
        elif isinstance(value, (list, tuple)):
            values = [str(v) for v in value]
        else:
            values = [str(value)]
        out.append(Option(normalise(str(key)), values, f"{key} ({source})"))
    return out


def shown(option: Option) -> str:
    """How an option reads back: ``--lora_r 16``."""
    return " ".join([option.written, *option.values]) if "(" not in option.written else option.written


class Reader:
    """Takes typed values from options; what it takes goes into ``read``, the rest is ``unused()``.

    Later options win (as in argparse), so pass a config file's options before the command line's.
    """

    def __init__(self, options: Iterable[Option]) -> None:
        self._options: dict[str, Option] = {}
        for option in options:
            self._options[option.name] = option
        self._taken: set[str] = set()
        self._defaults: set[str] = set()  # names added by add_defaults: below every alias the command gives
        self.read: dict[str, str] = {}

    def add_defaults(self, options: Iterable[Option]) -> None:
        """Options below everything given so far (a script's own defaults): added only where none is."""
        for option in options:
            if option.name not in self._options and f"no_{option.name}" not in self._options:
                self._options[option.name] = option
                self._defaults.add(option.name)

    def has(self, *names: str) -> bool:
        return any(n in self._options or f"no_{n}" in self._options for n in names)

    def _find(self, names: Sequence[str]) -> Option | None:
        # The last one written wins among aliases too; dict order is insertion order.
        found = [self._options[n] for n in names if n in self._options]
        given = [o for o in found if o.name not in self._defaults]  # a flag beats another alias's default
        found = given or found
        return found[-1] if found else None

    def _take(self, option: Option, value: str) -> None:
        self._taken.add(option.name)
        self.read[option.written] = value

    def text(self, *names: str) -> str | None:
        option = self._find(names)
        if option is None:
            return None
        value = " ".join(option.values)
        if not option.values:
            raise CommandReadError(f"{option.written} needs a value")
        self._take(option, value)
        return value

    def words(self, *names: str) -> list[str] | None:
        """Several values (``--lora_target_modules q_proj v_proj``; one comma-separated value works too)."""
        option = self._find(names)
        if option is None:
            return None
        if not option.values:
            raise CommandReadError(f"{option.written} needs a value")
        out = [w.strip() for v in option.values for w in v.split(",") if w.strip()]
        self._take(option, " ".join(option.values))
        return out

    def integer(self, *names: str) -> int | None:
        number = self.number(*names)
        if number is None:
            return None
        if number != int(number):
            raise CommandReadError(f"{self._written(names)} {number:g} is not a whole number")
        return int(number)

    def number(self, *names: str) -> float | None:
        value = self.text(*names)
        if value is None or value.lower() in ("none", "null"):
            return None
        try:
            number = float(value)
        except ValueError:
            raise CommandReadError(f"{self._written(names)} {value!r} is not a number") from None
        if not math.isfinite(number):
            raise CommandReadError(f"{self._written(names)} {value!r} is not a finite number; give a number")
        return number

    def boolean(self, *names: str) -> bool | None:
        """``--name`` (true), ``--name false``, ``--no_name`` (false); None when the command does not say."""
        option = self._find(names)
        negated = self._find([f"no_{n}" for n in names])
        if negated is not None and (option is None or list(self._options).index(negated.name) >
                                    list(self._options).index(option.name)):
            self._taken.add(negated.name)
            self.read[negated.written] = "false"
            return False
        if option is None:
            return None
        if not option.values:
            self._take(option, "true")
            return True
        word = option.values[0].strip().lower()
        if word in _TRUE:
            self._take(option, "true")
            return True
        if word in _FALSE:
            self._take(option, "false")
            return False
        # "auto" (axolotl's bf16) or a word of its own: the caller decides; keep it as text.
        self._take(option, option.values[0])
        return None

    def raw(self, *names: str) -> str | None:
        """The first value as written, taking the option (for words such as ``auto``)."""
        option = self._find(names)
        if option is None:
            return None
        value = option.values[0] if option.values else "true"
        self._take(option, value)
        return value

    def silent(self, *names: str) -> str | None:
        """A value that does not shape the plan (the eval batch, the dataset): taken, but not listed in ``read``."""
        option = self._find(names)
        if option is None:
            return None
        self._taken.add(option.name)
        return " ".join(option.values) if option.values else "true"

    def list_as_read(self, *names: str) -> None:
        """Name an option taken with :meth:`silent` in ``read`` after all, once it is known to shape the plan."""
        option = self._find(names)
        if option is not None and option.name in self._taken:
            self.read[option.written] = " ".join(option.values) if option.values else "true"

    def silent_words(self, *names: str) -> list[str]:
        option = self._find(names)
        if option is None:
            return []
        self._taken.add(option.name)
        return list(option.values)

    def ignore(self, names: Iterable[str]) -> None:
        """Options known to the program that do not change memory: neither read nor unknown."""
        for n in names:
            if n in self._options:
                self._taken.add(n)
            if f"no_{n}" in self._options:
                self._taken.add(f"no_{n}")

    def unused(self) -> list[Option]:
        return [o for name, o in self._options.items() if name not in self._taken]

    def _written(self, names: Sequence[str]) -> str:
        option = self._find(names)
        return option.written if option is not None else f"--{names[0]}"


def to_bool(word: str) -> bool | None:
    w = word.strip().lower()
    return True if w in _TRUE else False if w in _FALSE else None
