"""The panels of `diag top`."""
