"""The one exception type the library raises for bad input.

Anything the user controls (a config value, a file, an array they pass) that is wrong raises
:class:`KvasymError` with a message naming the offending key, file or value. The CLI turns it
into one line on stderr and a non-zero exit; it is never left to surface as a numpy traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


class KvasymError(ValueError):
    """Bad input: the message names what is wrong and where."""


class DamagedFile(KvasymError):
    """A file that cannot be what it claims to be: truncated, not of its format, or failing its own
    digest. ``path`` names it. When the file is an intermediate of the DAG, ``kvasym stage`` moves
    it aside (:func:`kvasym.stages.move_aside_damaged`) so that the next run rebuilds it."""

    def __init__(self, path: object, reason: str, *, where: object | None = None) -> None:
        self.path = str(path)
        super().__init__(f"{path if where is None else where}: {reason}")


def write_failed(path: object, exc: OSError) -> OSError:
    """The OSError of a failed write (full disk, read-only folder) re-aimed at the final path.

    Atomic writers fail on a hidden temporary name, and pyarrow's OSErrors carry no file at all;
    the CLI prints ``kvasym: error: <path>: <reason>`` from this.
    """
    return OSError(exc.errno, exc.strerror or str(exc), str(path))


def exit_status(action: Callable[[], object]) -> int:
    """Run a command-line action: 0 when it returns, 2 and one ``kvasym: error:`` line for
    bad input (:class:`KvasymError`), 1 and the path for a failed write (OSError)."""
    try:
        action()
    except KvasymError as exc:
        print(f"kvasym: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"kvasym: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0
