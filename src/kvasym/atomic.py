"""Atomic file writes: every result file appears complete under its final name, or not at all.

A job killed mid-write, a full disk or an exception leaves at most a hidden temporary file
(``.<name>.<random>.tmp`` beside the target, ignored by every reader), never a truncated file
that looks finished. One helper serves every writer of the library (Parquet tables, packed
caches, manifests and text, figures, real-model captures). Files that make one whole (a model
card's tables and its ``card.json``) are written as a set (:func:`atomic_file_set`): the set's
index file stands only beside a complete set.
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



def _make_folders(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; the folders created, outermost first.

    The nearest existing ancestor must be a folder: a regular file, a symbolic link that leads
    nowhere or a fifo in the way is a KvasymError naming it (mkdir's own "File exists" or "Not a
    directory" would name only ``folder``)."""
    missing = []
    probe = folder
    while not os.path.lexists(probe):
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    if os.path.lexists(probe) and not probe.is_dir():
        what = "a symbolic link that leads to no folder" if probe.is_symlink() else "not a folder"
        where = "" if probe == folder else f" (its parent {probe})"
        raise KvasymError(f"{folder}: cannot be made a folder{where}: {probe} is {what}")
    created = []
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:  # made by a concurrent run meanwhile: not ours to remove
            continue
        except OSError as exc:
            _remove_empty_folders(created)
            raise write_failed(folder, exc) from exc
        created.append(path)
    return created


def _remove_empty_folders(created: list[Path]) -> None:
    """Remove the folders of ``created`` (outermost first) that are still empty, innermost first:
    they are this run's, and a folder someone put a file in meanwhile stays."""
    for path in reversed(created):
        try:
            path.rmdir()
        except OSError:
            return


class FileSet:
    """The files of one :func:`atomic_file_set`: :meth:`target` gives each one's temporary path."""

    def __init__(self, folder: Path, staging: Path, names: tuple[str, ...]) -> None:
        self.folder, self.staging, self.names = folder, staging, names

    @contextmanager
    def target(self, name: str) -> Iterator[Path]:
        """The temporary path to write file ``name`` of the set to; an OSError while writing it
        (a full disk) is re-raised naming ``folder/name``, not the staging name."""
        if name not in self.names:
            raise KeyError(f"{name} is not a file of this set ({', '.join(self.names)})")
        try:
            yield self.staging / name
        except OSError as exc:
            raise write_failed(self.folder / name, exc) from exc


@contextmanager
def atomic_file_set(folder: str | os.PathLike, names: tuple[str, ...] | list[str]) -> Iterator[FileSet]:
    """Write the files ``names`` into ``folder`` as one set: all of them, or none of this run.

    ``folder`` may hold other files (the user's own: never touched) and may not exist yet (it is
    created, with its parents; on failure the folders this call created are removed again when
    empty). The files are written into one hidden staging folder inside ``folder``
    (``.<last name>.<random>.tmp``, ignored by every reader, as :func:`atomic_target`'s names),
    created on entry, so an unwritable folder is refused before any work is done. When the block
    succeeds each file is renamed onto its name in the order given, after the older file of the
    *last* name is removed: the last name (a card's ``card.json``) is the set's index and stands
    in ``folder`` only when every file of this set does. A kill at any point thus leaves either
    the complete new set, or no index; a failed rename removes the files of the set already
    renamed. A file of ``names`` that exists and is not a regular file or a symbolic link (a
    folder, a fifo) is refused on entry, naming it.

    Yields
    ------
    FileSet
        ``target(name)``: the temporary path to write file ``name`` to.
    """
    import shutil

    folder, names = Path(folder), tuple(names)
    if not names or len(set(names)) != len(names) or any(Path(n).name != n or n in (".", "..") for n in names):
        raise ValueError(f"atomic_file_set: names must be distinct plain file names, got {names}")
    for name in names:
        target = folder / name
        if os.path.lexists(target) and not (target.is_symlink() or target.is_file()):
            raise KvasymError(f"{target}: exists and is not a regular file (a folder, device or fifo); "
                              "move it away or give another folder")
    created = _make_folders(folder)
    try:
        staging = Path(tempfile.mkdtemp(dir=folder, prefix=f".{names[-1]}.", suffix=".tmp"))
    except OSError as exc:
        _remove_empty_folders(created)
        raise write_failed(folder, exc) from exc
    done: list[Path] = []
    try:
        yield FileSet(folder, staging, names)
        unwritten = [name for name in names if not (staging / name).is_file()]
        if unwritten:
            raise RuntimeError(f"atomic_file_set: {', '.join(unwritten)} not written")  # a bug of the caller
        index = folder / names[-1]
        try:
            for name in names:
                os.chmod(staging / name, _default_mode())
            name = names[-1]
            if os.path.lexists(index):
                index.unlink()  # the older set loses its index before any of its files is replaced
            for name in names:
                os.replace(staging / name, folder / name)
                done.append(folder / name)
        except OSError as exc:
            for path in done:
                path.unlink(missing_ok=True)
            raise write_failed(folder / name, exc) from exc
        staging.rmdir()
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_empty_folders(created)
        raise
