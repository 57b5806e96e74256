"""``python -m directload``: the same command line as the ``directload`` entry point."""

from directload.harness.cli import main

raise SystemExit(main())
