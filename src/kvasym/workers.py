"""A job's independent units on several processes, results in the units' order.

A model-level job (a text's quantized passes, the card's evaluation passes, the greedy prompts)
is a loop over units whose results depend on each unit's identity only: its seeds come from the
unit's name, never from the units run before it (:mod:`kvasym.seeds`). Such a loop can run on
``workers`` processes and give, unit for unit, the results of the loop in one process:
:func:`map_ordered` forks the workers after the job has built what every unit reads (the model,
a reference pass), so they share it copy-on-write instead of loading it again, hands them the
units one at a time (``chunksize=1``: units of unequal cost balance), and returns the results in
the units' order. The floating-point work of a unit is the same in a worker as in the parent (the
same code on the same arrays, BLAS at one thread as every job runs it), so the job's output does
not depend on ``workers``; ``tests/test_workers.py`` checks it bit for bit on each stage that uses
it.

This is how a rule's ``threads:`` reach the stage: its command gets ``--workers {threads}``
(:meth:`kvasym.wiring.Wiring.stage_params`), so on a machine with idle cores, or as a Slurm job
with several CPUs, one long job at the end of the DAG uses them; with ``--cores 1`` it is the
plain loop.

Processes, not threads: the passes are numpy and numba code that holds the GIL between calls
for much of its time. Forking needs the ``fork`` start method (Linux); elsewhere (macOS, Windows)
the units run in the calling process, one after another, with the same results.
"""

from __future__ import annotations

import multiprocessing
import numbers
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from .errors import KvasymError

__all__ = ["check_workers", "imap_ordered", "map_ordered", "parse_workers", "usable_workers"]

T = TypeVar("T")
R = TypeVar("R")

#: The function and units of the pool being run, set in the parent just before the fork so that
#: the workers inherit them (a closure over a model cannot be pickled; it need not be).
_TASK: tuple[Callable[[Any], Any], Sequence[Any]] | None = None


def check_workers(workers: object, what: str = "workers") -> int:
    """``workers`` (an integer, numpy's too) as an int in 1..1024, or a
    :class:`~kvasym.errors.KvasymError` naming ``what`` (also the kernels' ``threads``,
    :func:`kvasym.kernels.check_threads`)."""
    if isinstance(workers, bool) or not isinstance(workers, numbers.Integral) or not 1 <= workers <= 1024:
        raise KvasymError(f"{what} must be an integer in 1..1024, got {workers!r}")
    return int(workers)


def parse_workers(text: str) -> int:
    """A ``--workers`` command-line value (an argparse ``type``): an int in 1..1024, or an
    :class:`argparse.ArgumentTypeError` saying what was given."""
    import argparse

    try:
        return check_workers(int(text), "--workers")
    except (ValueError, KvasymError):
        raise argparse.ArgumentTypeError(f"--workers must be an integer in 1..1024, got {text!r}") from None


def usable_workers(workers: int, n_units: int) -> int:
    """How many processes :func:`map_ordered` runs ``n_units`` units on: ``min(workers, n_units)``,
    and 1 where the platform cannot fork (the loop in the calling process)."""
    check_workers(workers)
    if sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return max(1, min(int(workers), int(n_units)))


def _run_unit(index: int) -> Any:
    assert _TASK is not None  # set by map_ordered before the fork
    fn, units = _TASK
    return fn(units[index])


def map_ordered(fn: Callable[[T], R], units: Sequence[T], workers: int = 1) -> list[R]:
    """``[fn(u) for u in units]``, computed on up to ``workers`` forked processes.

    Parameters
    ----------
    fn : callable
        What one unit gives; any callable (a closure over the model is fine: the workers are
        forked, not sent it). Its result must be picklable (arrays, frames, dicts).
    units : sequence
        The units, in the order of the results.
    workers : int
        Processes to use (1..1024); the effective number is :func:`usable_workers`.

    Returns
    -------
    list
        ``fn(u)`` for each unit, in ``units``' order, equal to the plain loop's whatever
        ``workers`` is (for an ``fn`` whose result depends on its unit only).

    Raises
    ------
    KvasymError
        For ``workers`` outside 1..1024; an exception a unit raises is raised here (the pool is
        closed and its workers reaped first).

    Notes
    -----
    The workers are joined before returning, so the CPU time they used is counted by the
    job's ``getrusage(RUSAGE_CHILDREN)`` (the cost line every stage ends its log with).
    """
    return list(imap_ordered(fn, units, workers))


def imap_ordered(fn: Callable[[T], R], units: Sequence[T], workers: int = 1) -> Iterator[R]:
    """:func:`map_ordered` as a generator: ``fn(u)`` for each unit, yielded in ``units``' order
    as soon as it and the units before it are done, so that the caller can write each result and
    drop it (a synthetic unit's packed caches, trial by trial) instead of holding them all.

    Same parameters, results and errors as :func:`map_ordered`. The pool lives while the
    generator does: it is closed and its workers joined when the last result is taken, and
    terminated when the generator is closed early (an exception in the caller's loop, or
    ``close()``), so no worker outlives the job. Results a worker finished before the caller
    took them wait in the parent (:meth:`multiprocessing.pool.Pool.imap`).
    """
    global _TASK
    n = usable_workers(workers, len(units))
    if n <= 1:
        yield from (fn(unit) for unit in units)
        return
    if _TASK is not None:
        raise KvasymError("map_ordered: a pool inside a pool's unit is not supported")
    _TASK = (fn, units)
    pool = multiprocessing.get_context("fork").Pool(n)
    try:
        yield from pool.imap(_run_unit, range(len(units)), chunksize=1)
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
        _TASK = None
