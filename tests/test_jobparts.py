"""kvasym.real.jobparts: a job's units split round robin into parts, and joined back row for row."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvasym.errors import KvasymError
from kvasym.real.jobparts import check_parts, join_by_units, part_of, part_slice, select_round_robin


def _job_frame(unit_rows: list[int]) -> pd.DataFrame:
    """One job's rows: unit u (ascending) writes unit_rows[u] rows together, each with its own value."""
    units = np.repeat(np.arange(len(unit_rows)), unit_rows)
    within = np.concatenate([np.arange(n) for n in unit_rows]) if unit_rows else np.array([], int)
    return pd.DataFrame({"depth": units // 3 * 0.5, "trial": units % 3, "row": within,
                         "value": np.random.default_rng(len(unit_rows)).standard_normal(len(units))})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=12), st.integers(1, 12))
def test_round_robin_parts_joined_are_the_job_row_for_row(unit_rows, total):
    """Property: cut a job's frame into the units each part runs (select_round_robin) and join the
    parts (in any order): the job's frame, bit for bit (a unit's rows keep their order)."""
    total = min(total, len(unit_rows))
    whole = _job_frame(unit_rows)
    keys = list(whole[["depth", "trial"]].drop_duplicates().itertuples(index=False, name=None))
    parts = []
    for p in range(total):
        mine = set(select_round_robin(keys, (p, total)))
        parts.append(whole[[k in mine for k in zip(whole["depth"], whole["trial"])]])
    assert sum(len(f) for f in parts) == len(whole)
    pd.testing.assert_frame_equal(join_by_units(parts[::-1], ["depth", "trial"]), whole, check_exact=True)


def test_select_round_robin_by_hand():
    assert select_round_robin(list("abcdefg"), (0, 3)) == ["a", "d", "g"]
    assert select_round_robin(list("abcdefg"), (2, 3)) == ["c", "f"]
    assert select_round_robin(list("ab"), (0, 1)) == ["a", "b"]
    with pytest.raises(KvasymError, match=r"the job has 2 windows, fewer than its 3 parts"):
        select_round_robin(["a", "b"], (0, 3), "windows")
    for bad in ((3, 3), (-1, 2), ("x", 2), (1,)):
        with pytest.raises(KvasymError, match="part must be"):
            select_round_robin(list("abc"), bad)


def test_part_slices_and_their_check():
    job = {"length": 96, "trials": 2}
    assert part_slice(job, (0, 1)) == job and part_of(job) == (0, 1)
    assert part_slice(job, (1, 3)) == {**job, "part": [1, 3]} and part_of(part_slice(job, (1, 3))) == (1, 3)
    other = {"length": 128, "trials": 2}
    check_parts([part_slice(job, (p, 3)) for p in (2, 0, 1)] + [other], ["c", "a", "b", "d"])
    with pytest.raises(KvasymError, match=r"the parts \['a', 'c'\] are parts \[0, 2\] of \[3\]"):
        check_parts([part_slice(job, (0, 3)), part_slice(job, (2, 3))], ["a", "c"])
    with pytest.raises(KvasymError, match="b and a are both part 1 of one job"):
        check_parts([part_slice(job, (1, 2)), part_slice(job, (1, 2))], ["a", "b"])
    with pytest.raises(KvasymError, match=r"parts \[0, 1\] of \[2, 3\]"):
        check_parts([part_slice(job, (0, 3)), part_slice(job, (1, 2))], ["a", "b"])


def test_join_refuses_a_unit_split_between_parts_and_a_missing_unit_column():
    whole = _job_frame([2, 2])
    with pytest.raises(KvasymError, match=r"unit \{'depth': 0.0, 'trial': 0\} has rows in parts 0 and 1"):
        join_by_units([whole.iloc[:1], whole.iloc[1:]], ["depth", "trial"])
    with pytest.raises(KvasymError, match=r"part 0 lacks the unit columns \['window'\]"):
        join_by_units([whole], ["window"])
    with pytest.raises(KvasymError, match="no frames"):
        join_by_units([], ["window"])
