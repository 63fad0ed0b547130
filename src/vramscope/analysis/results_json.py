"""The analysis' JSON: the type of its objects, shared by the results' modules."""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]
