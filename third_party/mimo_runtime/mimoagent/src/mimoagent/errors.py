"""Errors of the runtime."""


class TransportError(RuntimeError):
    """The execution channel itself failed (not the command): the caller
    must treat the result as an infrastructure failure, never as a score."""
