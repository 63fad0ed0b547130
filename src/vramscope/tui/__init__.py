"""``vramscope watch`` in a terminal: samples drawn, never read (this package touches no backend).

* :mod:`~vramscope.tui.dashboard`: the live dashboard, drawn with rich.
* :mod:`~vramscope.tui.text`: plain text, for pipes, logs and ``--once`` without a terminal.
* :mod:`~vramscope.tui.snapshot`: one reading as a JSON object (``watch --once --json``).

rich is imported in ``tui/dashboard.py``, in :mod:`vramscope.report.terminal` (the report in a terminal) and in
``cli/report.py`` (the console the report prints to); no rule of ``tests/test_layering.py`` (``LIBRARY_PLACES``)
holds it to a place.
"""
