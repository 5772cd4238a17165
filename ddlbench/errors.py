"""Errors that the user caused: reported as one line and a non-zero exit, never a traceback."""


class UsageError(Exception):
    """Bad input (an unknown model, a batch size <= 0, a missing host file, ...)."""


EXIT_USAGE = 2


def fail(message: str) -> "NoReturn":  # noqa: F821 - typing only
    raise UsageError(message)
