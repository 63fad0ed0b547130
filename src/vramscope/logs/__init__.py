"""The memory log in one place: its schema, writing it (rotation included), reading it back into columns
(vramscope CSV, JSON Lines, nvidia-smi's CSV, hand-written logs) through one table of formats.

The modules, in the order data flows: ``schema`` (a Sample -> rows), ``files`` (append-only log files and
their rotated parts), ``csv_sink`` / ``jsonl_sink`` (the writers), ``inputfile`` and ``source`` (a file
opened bounded, its BOM skipped, its width checked), ``formats`` (the table: sniff, read, and what each format says),
``csv_reader`` / ``jsonl_reader`` / ``smi_reader`` / ``imports`` (the readers, on pyarrow),
``arrow_columns`` / ``table`` / ``cells`` (a log's columns, as numpy arrays when asked), ``reader``
(``read_log``, ``read_any_log``). Nothing is imported here, so writing a log never loads numpy or pyarrow.
"""
