"""`python -m diag` is the same as the `diag` console script."""

from diag.cli import main

raise SystemExit(main())
