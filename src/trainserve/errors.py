"""The one exception type the CLI turns into a one-line error and a non-zero exit."""


class TrainserveError(Exception):
    """A user-facing failure: bad input, missing file, unreachable server.

    The message is printed as is, on one line, so it must name what was expected.
    """
