"""Stage e2e_join: a text's parts (rule e2e) joined row for row, each part's provenance checked."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from kvasym.dataset import provenance, read_metadata, write_frame_atomic
from kvasym.errors import KvasymError
from kvasym.stages.e2e_join import join_text, part_slice

SLICE = {"text": "t", "max_tokens": 8, "schemes": [], "budgets": [2], "base_seed": 1, "norm_dtype": "float32",
         "e2e": {"draws": 1}}
N = 3  # scored positions per pass


def _pass(i: int) -> pd.DataFrame:
    return pd.DataFrame({"text": ["t"] * N, "scheme": [f"S{i}"] * N, "position": np.arange(N, dtype=np.int32),
                         "kl": np.arange(N) + 10.0 * i})


def _write_parts(tmp_path, passes: int, parts: int, slices=None, models=None) -> list[str]:
    paths = []
    for p in range(parts):
        frame = pd.concat([_pass(i) for i in range(p, passes, parts)], ignore_index=True)
        path = tmp_path / f"part{p}.parquet"
        meta = provenance(slices[p] if slices else part_slice(SLICE, p, parts))
        write_frame_atomic(frame, path, {**meta, "model_sha256": (models or ["m"] * parts)[p]})
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("parts", [1, 2, 3, 7])
def test_parts_are_joined_in_the_plans_order_with_the_texts_provenance(tmp_path, parts) -> None:
    out = tmp_path / "text.parquet"
    join_text(SLICE, _write_parts(tmp_path, 7, parts), str(out))
    joined = pd.read_parquet(out)
    pd.testing.assert_frame_equal(joined, pd.concat([_pass(i) for i in range(7)], ignore_index=True))
    meta = read_metadata(out)
    assert json.loads(meta["config_slice"]) == SLICE and meta["model_sha256"] == "m"


def test_a_part_of_another_text_count_or_model_is_refused_and_nothing_written(tmp_path) -> None:
    out = tmp_path / "text.parquet"
    wrong = [part_slice(SLICE, 0, 2), part_slice({**SLICE, "base_seed": 2}, 1, 2)]
    with pytest.raises(KvasymError, match=r"part1.parquet: not part 1 of 2 of text 't' under this configuration"):
        join_text(SLICE, _write_parts(tmp_path, 4, 2, slices=wrong), str(out))
    with pytest.raises(KvasymError, match=r"part0.parquet: not part 0 of 3"):
        join_text(SLICE, _write_parts(tmp_path, 4, 2)[:2] + _write_parts(tmp_path / ".." / tmp_path.name, 4, 2)[:1],
                  str(out))
    with pytest.raises(KvasymError, match="run on different model files"):
        join_text(SLICE, _write_parts(tmp_path, 4, 2, models=["m", "other"]), str(out))
    assert not out.exists()
