"""What ``vramscope report --json`` prints: the summary of one log, or of several with their comparison.

The JSON edge of the report: the summary is data already (dataclasses stop here); this module only
puts the schema version on top, so that a consumer can tell which shape it reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vramscope.analysis.results import SCHEMA_VERSION
from vramscope.report.compare import compare
from vramscope.report.model import LogReport

__all__ = ["SCHEMA_VERSION", "json_document"]


def json_document(reports: Sequence[LogReport]) -> dict[str, Any]:
    """``{"schema_version": 1, **summary}`` for one log; ``{"schema_version", "logs", "comparison"}`` for several."""
    if len(reports) == 1:
        return {"schema_version": SCHEMA_VERSION, **reports[0].summary}
    return {"schema_version": SCHEMA_VERSION, "logs": [r.summary for r in reports],
            "comparison": [row.to_json() for row in compare(reports)]}
