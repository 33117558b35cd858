"""CLIError: a failure the user can act on, printed as one `pagedeck: ...` line (exit status 1), no traceback."""


class CLIError(Exception):
    """A failure said in one line of words (the command's main prints it)."""
