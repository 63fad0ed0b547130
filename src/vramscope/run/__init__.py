"""``vramscope run -- CMD``: a command under the monitor.

* :mod:`~vramscope.run.runner`: start the command, sample its process tree, forward signals, exit as it did.
* :mod:`~vramscope.run.inject`: attach the memory callback to every HF or Lightning ``Trainer`` the command makes,
  with no code change, through the start-up hook in ``_sitecustomize/`` (standard library only).

Importing this package imports nothing.
"""
