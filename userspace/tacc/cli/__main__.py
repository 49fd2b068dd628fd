"""``python -m tacc.cli``: the ``tacc`` command."""

from tacc.cli import main

raise SystemExit(main())
