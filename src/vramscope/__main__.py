"""``python -m vramscope``."""

from vramscope.cli import main

raise SystemExit(main())
