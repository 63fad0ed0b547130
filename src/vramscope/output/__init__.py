"""What vramscope puts out, made safe: one place for each rule that every writer and printer follows.

* :mod:`~vramscope.output.atomic`: a file written whole or not at all (reports, analyses, sidecars).
* :mod:`~vramscope.output.names`: the names of the files beside a log (``mem.rank3.csv``, ``mem.steps.csv``,
  ``mem.analysis.json``, ``mem.oom/``), which the writers use and the report reads back.
* :mod:`~vramscope.output.safetext`: text from logs and processes made inert before it reaches a terminal.

Standard library only, and importing this package imports nothing: the log reader, the report, the TUI, the
CLI and the training callbacks all use these, so they sit below all of them.
"""
