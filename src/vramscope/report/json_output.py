"""What ``vramscope report --json`` prints: the summary of one log, or of several with their comparison.

The JSON edge of the report: the summary is data already (dataclasses stop here); this module only
puts the schema version on top, so that a consumer can tell which shape it reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vramscope.report.compare import compare
from vramscope.report.model import LogReport

# The version of the shape of ``report --json``: raised when a key is removed or changes its meaning
# (a new key is not a new version). Swapped for vramscope.analysis.results.SCHEMA_VERSION once it exists.
SCHEMA_VERSION = 1


def json_document(reports: Sequence[LogReport]) -> dict[str, Any]:
    """``{"schema_version": 1, **summary}`` for one log; ``{"schema_version", "logs", "comparison"}`` for several."""
    if len(reports) == 1:
        return {"schema_version": SCHEMA_VERSION, **reports[0].summary}
    return {"schema_version": SCHEMA_VERSION, "logs": [r.summary for r in reports], "comparison": compare(reports)}
