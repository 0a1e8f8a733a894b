"""Atomic file writes: every result file appears complete under its final name, or not at all.

A job killed mid-write, a full disk or an exception leaves at most a hidden temporary file
(``.<name>.<random>.tmp`` beside the target, ignored by every reader), never a truncated file
that looks finished. One helper serves every writer of the library (Parquet tables, packed
caches, manifests and text, figures, real-model captures).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import KvasymError, write_failed


def _default_mode(bits: int = 0o666) -> int:
    """``bits`` for whom the umask allows (mkstemp creates 0600 files and mkdtemp 0700 folders;
    results are ordinary files and folders): rw for files, rwx (0o777) for folders."""
    umask = os.umask(0)
    os.umask(umask)
    return bits & ~umask


@contextmanager
def atomic_target(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write to; when the block succeeds, rename it
    onto ``path`` (atomic on POSIX within one filesystem); when it fails, delete it. An OSError
    (full disk, read-only folder) is re-raised naming ``path``, not the temporary name."""
    if str(path).endswith(("/", os.sep)):
        # Path() drops the slash: "out/" would become a file named "out"
        raise KvasymError(f"{path}: names a folder (ends with /), not a file")
    path = Path(path)
    if path.exists() and not path.is_file():
        # renaming over /dev/null (as root) or a fifo would replace it with a regular file
        raise KvasymError(f"{path}: exists and is not a regular file (a device, fifo or folder); give a file path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        # a folder that cannot hold files (/proc, a read-only mount): the error names the target,
        # not the hidden temporary name the user never gave
        raise write_failed(path, exc) from exc
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, _default_mode())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise write_failed(path, exc) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(text: str, path: str | os.PathLike) -> None:
    """Write a UTF-8 text file via a temporary name and a rename (no half-written file, ever)."""
    with atomic_target(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(data: object, path: str | os.PathLike) -> None:
    """:func:`write_text_atomic` of ``data`` as indented JSON with sorted keys."""
    import json

    write_text_atomic(json.dumps(data, indent=1, sort_keys=True) + "\n", path)


#: The hidden file :func:`atomic_folder` leaves in every folder it writes (readers of Parquet
#: datasets skip names that start with a dot).
FOLDER_MARKER = ".kvasym-folder"


@contextmanager
def atomic_folder(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a hidden temporary folder beside ``path`` to fill; when the block succeeds, rename
    it onto ``path``; when it fails, delete it. A folder of results (a Snakemake ``directory()``
    output) thus appears complete or not at all. An existing empty folder at ``path`` is
    replaced; anything else there is refused, naming it (this never deletes what it did not
    write)."""
    import shutil

    path = Path(path)
    if path.exists() and not (path.is_dir() and not any(path.iterdir())):
        raise KvasymError(f"{path}: exists and is not an empty folder; remove it or give another output folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    except OSError as exc:
        raise write_failed(path, exc) from exc
    try:
        (tmp / FOLDER_MARKER).write_text("written whole by a kvasym stage (kvasym.atomic.atomic_folder); a damaged "
                                         "file in it sends the whole folder aside to be rebuilt\n", encoding="utf-8")
        yield tmp
        os.chmod(tmp, _default_mode(0o777))
        if path.is_dir():
            path.rmdir()  # empty (checked above): Snakemake may have made it
        os.replace(tmp, path)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_failed(path, exc) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

