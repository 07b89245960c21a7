"""The two exceptions the CLI turns into one line: a bad request (exit status 2) and a run that
could not write its records (exit status 3)."""


class UsageError(ValueError):
    """A bad request: an unknown name, a malformed argument, an unusable or unreadable run folder."""


class RunStopped(Exception):
    """The run could not go on (its records cannot be written); the records before it are valid."""
