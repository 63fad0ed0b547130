"""``vramscope run -- CMD``: a command under the monitor.

* :mod:`~vramscope.run.runner`: start the command, sample its process tree, exit as it did.
* :mod:`~vramscope.run.spawn`: start it as a shell would exec it (inherited descriptors, argv[0], exit codes).
* :mod:`~vramscope.run.signals`: pass signals on to it once, as if exec'd; follow its job-control stops.
* :mod:`~vramscope.run.inject`: attach the memory callback to every HF or Lightning ``Trainer`` the command makes,
  with no code change, through the start-up hook in ``_sitecustomize/`` (standard library only).
* :mod:`~vramscope.run.relay`: the parent's end of the relay: the command's Trainers' series in the run's own
  exporters (``--prometheus``, ``--push``).

Importing this package imports nothing.
"""
