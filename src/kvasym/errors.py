"""The one exception type the library raises for bad input.

Anything the user controls (a config value, a file, an array they pass) that is wrong raises
:class:`KvasymError` with a message naming the offending key, file or value. The CLI turns it
into one line on stderr and a non-zero exit; it is never left to surface as a numpy traceback.
"""

from __future__ import annotations


class KvasymError(ValueError):
    """Bad input: the message names what is wrong and where."""


def write_failed(path: object, exc: OSError) -> OSError:
    """The OSError of a failed write (full disk, read-only folder) re-aimed at the final path.

    Atomic writers fail on a hidden temporary name, and pyarrow's OSErrors carry no file at all;
    the CLI prints ``kvasym: error: <path>: <reason>`` from this.
    """
    return OSError(exc.errno, exc.strerror or str(exc), str(path))
