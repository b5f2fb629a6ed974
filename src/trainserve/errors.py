"""The one exception type the CLI turns into a one-line error and a non-zero exit."""


class TrainserveError(Exception):
    """A user-facing failure: bad input, missing file, unreachable server.

    The message is printed as is, on one line, so it must name what was expected.
    """


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (TensorFlow's run to pages), or its type's name."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
