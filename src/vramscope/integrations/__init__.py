"""The paths users import: ``vramscope.integrations.hf``, ``.lightning`` and ``.loop``.

They re-export the callbacks and the monitor, which live in :mod:`vramscope.training`; these three stay as
the public API. The other modules here (``breakdown``, ``guard``, ``strategy``, ``inject``, ``qlora``,
``trial``) only keep old imports working while the house is rebuilt (issue 15). Never imported by
vramscope/__init__.py.
"""
