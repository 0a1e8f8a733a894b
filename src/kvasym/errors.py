"""The one exception type the library raises for bad input.

Anything the user controls (a config value, a file, an array they pass) that is wrong raises
:class:`KvasymError` with a message naming the offending key, file or value. The CLI turns it
into one line on stderr and a non-zero exit; it is never left to surface as a numpy traceback.
"""

from __future__ import annotations


class KvasymError(ValueError):
    """Bad input: the message names what is wrong and where."""
