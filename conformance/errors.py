"""The two exceptions the CLI turns into one line: a bad request (exit status 2) and a run that
could not write its records (exit status 3); ``needs``, a command's optional dependencies."""
import importlib


class UsageError(ValueError):
    """A bad request: an unknown name, a malformed argument, an unusable or unreadable run folder."""


class RunStopped(Exception):
    """The run could not go on (its records cannot be written); the records before it are valid."""


def needs(command: str, extra: str, *modules: str) -> None:
    """UsageError naming the missing modules and the extra that installs them, unless every one
    of ``modules`` imports."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            missing.append(name)
    if missing:
        raise UsageError(f"{command} needs {', '.join(missing)}, not installed here: "
                         f"pip install 'kernel-lab[{extra}]'")
