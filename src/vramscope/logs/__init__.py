"""The memory log in one place: its schema, writing it (rotation included), reading it back into numpy
columns (vramscope CSV, JSON Lines, nvidia-smi's CSV) and importing logs vramscope did not write.

The modules, in the order data flows: ``schema`` (a Sample -> rows), ``files`` (append-only log files and
their rotated parts), ``csv_sink`` / ``jsonl_sink`` (the writers), ``inputfile`` (bounded reading),
``locate`` and ``cells`` (cells found and parsed in a file's bytes), ``table`` (a log's columns),
``csv_reader`` / ``jsonl_reader`` / ``smi_reader`` / ``reader`` (the formats; ``read_log``), ``imports``
(hand-written and header-less logs). Nothing is imported here, so writing a log never loads numpy.
"""
