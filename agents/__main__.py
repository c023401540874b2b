"""``python -m agents``: run the node agent (see :mod:`agents.cli`)."""

from agents.cli import main

raise SystemExit(main())
