"""User-facing errors: bad data, bad config, missing files. Shown as one line, never a traceback."""

import contextlib
import sys
from collections.abc import Iterator


class RagLabError(ValueError):
    """An error in the user's input; its message names the file / line / field or config key."""


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """Turn a ``RagLabError`` (also when Hydra's instantiate wraps it) into ``error: ...`` + exit 1."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - unwrap, then re-raise anything that is not ours
        cause: BaseException | None = e
        while cause is not None and not isinstance(cause, RagLabError):
            cause = cause.__cause__
        if cause is None:
            raise
        print(f"error: {cause}", file=sys.stderr)
        raise SystemExit(1) from None
