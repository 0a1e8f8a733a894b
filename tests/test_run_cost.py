"""The cost line every successful stage job ends its log with, and benchmarks/run_cost.py, which
sums those lines by rule."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from kvasym.cli import main
from kvasym.real.capture import write_capture
from test_real_evaluate import make_capture

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("run_cost", ROOT / "benchmarks" / "run_cost.py")
run_cost = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_cost)


def test_a_stage_ends_its_log_with_its_cost_and_a_failed_one_does_not(tmp_path, capsys):
    capture = write_capture(make_capture(seed=0), tmp_path / "alpha.npz")
    assert main(["stage", "real_cachestats", "--captures", str(capture), "--out", str(tmp_path / "c.parquet")]) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    match = run_cost.DONE.match(last)
    assert match, last
    assert match[1] == "real_cachestats" and float(match[2]) > 0 and int(match[3]) > 0
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"PK\x03\x04 not a zip")
    assert main(["stage", "real_cachestats", "--captures", str(broken), "--out", str(tmp_path / "d.parquet")]) == 2
    assert "done:" not in capsys.readouterr().err


def _log(root: Path, rel: str, rule: str, cpu: float | None, rss: int = 100) -> None:
    path = root / "logs" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    tail = "" if cpu is None else f"kvasym: stage {rule} done: cpu_s={cpu:.2f} max_rss_mib={rss}\n"
    path.write_text(f"kvasym 0.1.0 stage {rule}\nwrote something\n{tail}", encoding="utf-8")


def test_sums_by_rule_and_gives_the_rest_to_snakemake(tmp_path, capsys):
    _log(tmp_path, "cells/t3/d128.log", "cells", 10.5, 300)
    _log(tmp_path, "cells/t3/d1024.log", "cells", 30.25, 900)
    _log(tmp_path, "stats/t3/d128.log", "stats", 4.0)
    _log(tmp_path, "stats/t3/d1024.log", "stats", None)  # failed or still running: no line
    assert run_cost.main(["--results", str(tmp_path), "--total-cpu", "60"]) == 0
    out = capsys.readouterr().out
    cells = re.search(r"^cells\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)%\s+([0-9.]+)\s+(\d+)$", out, re.M)
    assert cells and cells.groups() == ("2", "40.8", "91.1", "30.2", "900"), out  # 40.75 / 44.75
    assert re.search(r"^stats\s+1\s+4\.0\s", out, re.M), out
    assert re.search(r"^all kvasym jobs\s+3\s+44\.8$", out, re.M), out
    assert "15.2 of 60.0 in all (25.4%)" in out, out
    assert out.index("cells") < out.index("stats")  # the costliest rule first


def test_refuses_a_folder_without_logs(tmp_path, capsys):
    assert run_cost.main(["--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("run_cost: error:") and str(tmp_path / "logs") in err, err
    _log(tmp_path, "stats/t3/d128.log", "stats", None)
    assert run_cost.main(["--results", str(tmp_path)]) == 2
    assert "no log under" in capsys.readouterr().err
