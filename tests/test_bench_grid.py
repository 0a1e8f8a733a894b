"""benchmarks/bench_grid.py: per-rule sums of benchmark files, common-job ratios, the undercount
flags, and one-line refusals of what is not a benchmark directory."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_grid", ROOT / "benchmarks" / "bench_grid.py")
bench_grid = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_grid)

HEAD = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def _write(root: Path, rel: str, wall: float, cpu: float) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEAD + f"{wall}\t0:00:01\t1\t1\t1\t1\t0\t0\t0\t{cpu}\n")


def test_sums_per_rule_and_the_common_jobs_ratio(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _write(a, "metrics/t3/d128/KV/n2.tsv", 2.0, 1.5)
    _write(a, "metrics/t3/d128/KV/n3.tsv", 2.5, 2.0)
    _write(a, "real/metrics/smollm2/d64/KV/n2.tsv", 20.0, 14.0)  # long: sampled until 15 s
    _write(a, "quantize/t3/d128/KV/n2.tsv", 0.4, 0.0)  # ended before the first reading
    _write(b, "metrics/t3/d128/KV/n2.tsv", 1.0, 0.5)
    _write(b, "metrics/gaussian/d128/KV/n2.tsv", 9.0, 9.0)  # only in b
    rows = {r["rule"]: r for r in bench_grid.summarize(bench_grid.load_benchmarks(a), bench_grid.load_benchmarks(b))}
    assert set(rows) == {"metrics", "real_metrics", "quantize", "total"}
    m = rows["metrics"]
    assert (m["jobs"], m["cpu"], m["wall"]) == (2, 3.5, 4.5)
    assert (m["jobs_b"], m["cpu_b"], m["common"], m["cpu_common_a"], m["cpu_common_b"]) == (2, 9.5, 1, 1.5, 0.5)
    assert rows["real_metrics"]["long"] == 1 and rows["quantize"]["cpu_zero"] == 1
    total = rows["total"]
    assert (total["jobs"], total["cpu"], total["common"], total["long"], total["cpu_zero"]) == (4, 17.5, 1, 1, 1)
    text = bench_grid.render(list(rows.values()), two=True)
    assert "| metrics | 2 | 3.5 | 4.5 | 0 | 0 | 2 | 9.5 |" in text and "0.33x" in text


def test_refuses_what_is_not_a_benchmark_directory(tmp_path):
    with pytest.raises(SystemExit, match="is not a directory"):
        bench_grid.load_benchmarks(tmp_path / "absent")
    with pytest.raises(SystemExit, match="no benchmark file"):
        bench_grid.load_benchmarks(tmp_path)
    (tmp_path / "x.tsv").write_text("a\tb\n1\t2\n")
    with pytest.raises(SystemExit, match=r"x\.tsv is not a Snakemake benchmark file"):
        bench_grid.load_benchmarks(tmp_path)


def test_the_target_line_is_marked_as_measured():
    total = {"common": 3, "cpu_common_a": 30.0, "cpu_common_b": 10.0}
    assert bench_grid.target_line(total, 1 / 3).startswith("[MET]")
    assert bench_grid.target_line({**total, "cpu_common_b": 10.5}, 1 / 3).startswith("[NOT MET]")
    assert "= 0.350x" in bench_grid.target_line({**total, "cpu_common_b": 10.5}, 1 / 3)
    assert bench_grid.target_line({"common": 0}, 1 / 3).startswith("[NOT MEASURED]")
