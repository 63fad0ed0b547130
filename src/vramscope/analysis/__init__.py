"""Analysis: a log's samples judged once into typed results, which the report, the CLI and the live monitor read.

Pure functions over the columns (``summary.analyze``: peaks, the leak's trend, the OOM forecast, fragmentation,
each device's details and verdicts), with the results and their JSON (``results``, ``results_leak``,
``results_forecast``, ``results_json``), an OOM snapshot's facts (``oom``), and one stateful part: ``alerts``,
which throttles the warnings the in-process monitor shows and appends them to ``<log>.warnings.jsonl``.
"""
