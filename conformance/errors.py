"""The one exception the CLI turns into a one-line message and exit status 2."""


class UsageError(ValueError):
    """A bad request: an unknown name, a malformed argument, an unusable or unreadable run folder."""
