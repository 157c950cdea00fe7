"""Holds the sitecustomize.py that `diag run` puts first on PYTHONPATH (a package so wheels ship it)."""
