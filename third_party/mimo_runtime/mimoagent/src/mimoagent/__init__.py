"""camg's implementation of the MiMo runtime interfaces (see README.md)."""

__version__ = "0.1.0+camg"
