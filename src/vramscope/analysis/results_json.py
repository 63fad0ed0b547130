"""Reading an analysis' JSON back (``<log stem>.analysis.json``, ``AnalysisResult.to_json``): the one error a bad
file raises and the typed reading of its fields, which every result's ``from_json`` goes through.

The shapes are not here: each result reads its own beside its ``to_json`` (:mod:`vramscope.analysis.results`,
:mod:`~vramscope.analysis.results_leak`, :mod:`~vramscope.analysis.results_forecast`). Numbers come back as the
file holds them (an int where it wrote an int, a float where a float), so that writing the result again gives
the file's bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

Json = dict[str, Any]

# What to do with a file that is not an analysis: it is made again from its log, never mended.
REDO = "analyse its log again instead ('vramscope report LOG'; MemoryMonitor.save_analysis() writes the file)"


class AnalysisFileError(ValueError):
    """An analysis (a file or its dict) that is not what ``AnalysisResult.to_json`` writes; its message is one
    line that names the field and says what to do."""


def not_an_analysis(where: str, problem: str) -> AnalysisFileError:
    """The error for ``where`` (``forecast.devices.0.capacity_bytes``; "" is the whole) and its ``problem``."""
    what = where or "the analysis"
    return AnalysisFileError(f"not an analysis as this vramscope writes it: {what} {problem}; {REDO}")


def shown(value: object) -> str:
    """A value as the error names it: short, on one line."""
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "a list"
    text = "null" if value is None else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Fields:
    """One JSON object of an analysis, read key by key: a key that is missing or of the wrong type raises
    :class:`AnalysisFileError` naming where it is."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, Mapping):
            raise not_an_analysis(where, f"is {shown(data)}, not a JSON object")
        self._data: Mapping[Any, Any] = data
        self.where = where

    def at(self, key: str) -> str:
        """Where ``key`` of this object is, for an error."""
        return f"{self.where}.{key}" if self.where else key

    def has(self, key: str) -> bool:
        return key in self._data

    def names(self) -> list[str]:
        return [str(k) for k in self._data]

    def raw(self, key: str) -> object:
        """The value of ``key`` as it is; a key that is missing is an error."""
        if key not in self._data:
            raise not_an_analysis(self.at(key), "is missing")
        value: object = self._data[key]
        return value

    def _bad(self, key: str, value: object, expected: str) -> AnalysisFileError:
        return not_an_analysis(self.at(key), f"is {shown(value)}, not {expected}")

    def whole(self, key: str) -> int:
        value = self.raw(key)
        if not _whole(value):
            raise self._bad(key, value, "a whole number")
        return value

    def whole_or_none(self, key: str) -> int | None:
        value = self.raw(key)
        if value is None:
            return None
        if not _whole(value):
            raise self._bad(key, value, "a whole number or null")
        return value

    def number(self, key: str) -> float:
        """A number as the file holds it (an int stays one)."""
        value = self.raw(key)
        if not _number(value):
            raise self._bad(key, value, "a number")
        return value

    def number_or_none(self, key: str) -> float | None:
        value = self.raw(key)
        if value is None:
            return None
        if not _number(value):
            raise self._bad(key, value, "a number or null")
        return value

    def text(self, key: str) -> str:
        value = self.raw(key)
        if not isinstance(value, str):
            raise self._bad(key, value, "text")
        return value

    def text_or_none(self, key: str) -> str | None:
        value = self.raw(key)
        if value is not None and not isinstance(value, str):
            raise self._bad(key, value, "text or null")
        return value

    def flag(self, key: str) -> bool:
        value = self.raw(key)
        if not isinstance(value, bool):
            raise self._bad(key, value, "true or false")
        return value

    def texts(self, key: str) -> tuple[str, ...]:
        value = self.raw(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._bad(key, value, "a list of text")
        return tuple(value)

    def wholes(self, key: str) -> tuple[int, ...]:
        value = self.raw(key)
        if not isinstance(value, list) or not all(_whole(v) for v in value):
            raise self._bad(key, value, "a list of whole numbers")
        return tuple(value)

    def entries(self, key: str) -> dict[str, object]:
        """An object of objects by name (``devices``, ``phases``), in the file's order."""
        value = self.raw(key)
        if not isinstance(value, Mapping):
            raise self._bad(key, value, "a JSON object")
        return {str(k): v for k, v in value.items()}

    def same(self, key: str, expected: object) -> None:
        """A key the result derives from others (a device's ``gpu`` from its ``key``): it must say the same."""
        value = self.raw(key)
        if value != expected or type(value) is not type(expected):
            raise self._bad(key, value, f"{shown(expected)} as the rest of it says")


def device_key(f: Fields) -> str:
    """A device's ``key`` ("0", "1", ... or "host"), held to the ``gpu`` that ``to_json`` derives from it."""
    key = f.text("key")
    if key != "host" and not (key.isascii() and key.isdigit()):
        raise not_an_analysis(f.at("key"), f"is {shown(key)}, not a GPU's index or 'host'")
    f.same("gpu", None if key == "host" else int(key))
    return key
