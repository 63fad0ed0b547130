"""Batch-size search and what it shares with the rest of vramscope (the search itself is still ``vramscope.tuner``)."""
