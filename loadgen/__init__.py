"""loadgen: the quickmap benchmark client (see loadgen/README.md)."""

__version__ = "0.1.0"
