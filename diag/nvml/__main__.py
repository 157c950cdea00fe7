"""`python -m diag.nvml [trace_dir]`: run the sidecar, or without a folder print every field once."""

from diag.nvml.sidecar import main

raise SystemExit(main())
