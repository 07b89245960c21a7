"""The two exceptions the CLI turns into one line: a bad request (exit status 2) and a run that
could not write its records (exit status 3); ``needs``, a command's optional dependencies; ``shown``
and ``escaped``, untrusted text (ids, backend names, file keys read from files) as the console shows
it: escape sequences, line breaks and other unprintable characters written as Python escapes, so a
name can neither retitle, clear nor split the terminal's lines."""
import importlib


SHOWN_CHARS = 200


def escaped(text: str) -> str:
    """``text`` with every unprintable character (controls, ESC, line and paragraph separators,
    lone surrogates) written as its Python escape; printable text, non-ASCII letters included, as it is."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def shown(name) -> str:
    """One untrusted name for the console: quoted, ``escaped``, cut to ``SHOWN_CHARS`` characters."""
    text = str(name)
    cut = text[:SHOWN_CHARS] + (f"...[{len(text) - SHOWN_CHARS} more characters]" if len(text) > SHOWN_CHARS else "")
    return repr(cut)


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
