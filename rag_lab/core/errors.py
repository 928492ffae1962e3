"""User-facing errors: bad data, bad config, missing files. Shown as one line, never a traceback.

Every entry point (``run``, ``score``, ``serve``, ``index``, ``report``) runs inside
:func:`one_line_errors`. It prints ``error: <message>`` on one line and exits with status 1 for
what a user can fix: a :class:`RagLabError` (also when Hydra's ``instantiate`` wraps it), Hydra's
own composition errors (an unknown override, a missing config option, a malformed override) and
an operating-system error on a path the user named (an output dir that is read-only or a file).
Anything else is a bug in rag_lab and keeps its traceback.
"""

import contextlib
import sys
from collections.abc import Iterator


class RagLabError(ValueError):
    """An error in the user's input; its message names the file / line / field or config key."""


def _one_line(text: str) -> str:
    """Hydra's and OmegaConf's messages span lines (message, hint, ``full_key: ...``): join them."""
    parts = [line.strip() for line in str(text).splitlines() if line.strip()]
    parts = [p for p in parts if not p.startswith(("object_type=", "See https://hydra.cc"))]
    return " ".join(p if p.endswith((".", ":", ";")) else p + ";" for p in parts).rstrip(";")


def user_message(error: BaseException) -> str | None:
    """The one-line message for an error the user can fix, or None for a bug (keeps its traceback)."""
    from hydra.errors import (
        CompactHydraException,
        InstantiationException,
        MissingConfigException,
        OverrideParseException,
    )
    from omegaconf.errors import OmegaConfBaseException

    cause: BaseException | None = error
    while cause is not None:  # instantiate and logging.config wrap the error that says what happened
        if isinstance(cause, RagLabError):
            return str(cause)
        if isinstance(cause, OSError) and cause.filename:
            return f"{cause.filename}: {cause.strerror or cause}"
        cause = cause.__cause__
    if isinstance(error, MissingConfigException) and error.options:
        return f"{str(error).splitlines()[0]} (options: {', '.join(error.options)})"
    if isinstance(error, OverrideParseException):
        return f"malformed override '{error.override}' ({_one_line(error.message)})"
    if isinstance(error, ValueError | KeyError) and _raised_in(error, ("hydra.", "omegaconf.")):
        return _one_line(str(error))  # Hydra's own checks of the command line (e.g. `group=null`)
    if isinstance(error, ValueError) and _raised_in(error, ("joblib.",)) and _raised_in_launcher(error):
        return f"hydra.launcher: {_one_line(str(error))}"  # joblib's check of its settings (n_jobs=0)
    if isinstance(error, CompactHydraException) and not isinstance(error, InstantiationException):
        detail = _one_line(str(error))
        if isinstance(error.__cause__, OmegaConfBaseException):
            detail += f" ({_one_line(str(error.__cause__))})"
        return detail
    return None


def _raised_in_launcher(error: BaseException) -> bool:
    """Whether a Hydra launcher plugin is on ``error``'s traceback (the launcher's settings failed)."""
    tb = error.__traceback__
    while tb is not None:
        if str(tb.tb_frame.f_globals.get("__name__", "")).startswith("hydra_plugins."):
            return True
        tb = tb.tb_next
    return False


def _raised_in(error: BaseException, packages: tuple[str, ...]) -> bool:
    """Whether the innermost frame of ``error``'s traceback is in one of ``packages``."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and str(tb.tb_frame.f_globals.get("__name__", "")).startswith(packages)


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """Turn a user-fixable error (see :func:`user_message`) into ``error: ...`` + exit status 1."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - render what the user can fix, re-raise bugs
        message = user_message(e)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(1) from None
