"""The package version: written here only (pyproject.toml reads it), and read by `mcr.__version__`
and the tuning tables' fingerprint without importing the package's front door."""

__version__ = "0.1.0"
