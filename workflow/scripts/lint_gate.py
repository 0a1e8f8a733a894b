"""Gate on ``snakemake --lint``, less one lint we answer on purpose.

Every rule would need a ``conda:`` directive to please Snakemake's linter, but the project's code
is one package that every rule imports: ``--sdm conda`` would build each environment from its own
copy of the environment file, where ``pip: -e .`` cannot find the project, and nothing here can
test a conda build (no conda channel is reachable from CI). So the rules carry no directive and
conda users run Snakemake inside ``environment.yml``'s environment (README, "Quick start"). This
script runs the linter and fails on any other lint, or when the linter itself fails to run.

Usage (from the repository's root): ``python3 workflow/scripts/lint_gate.py``.
"""

from __future__ import annotations

import re
import subprocess
import sys

#: The lint that the design above answers; every other lint fails the gate.
ACCEPTED = ("Specify a conda environment or container for each rule.",)


def main() -> int:
    run = subprocess.run(["snakemake", "--lint"], capture_output=True, text=True)
    text = run.stdout + run.stderr
    items = re.findall(r"^\s+\* (.+?):?$", text, re.M)
    others = [item for item in items if not any(item.startswith(a.rstrip(".")) for a in ACCEPTED)]
    if run.returncode != 0 and not items:
        print(f"snakemake --lint failed to run (status {run.returncode}):\n{text[-3000:]}", file=sys.stderr)
        return 1
    if others:
        print(text, file=sys.stderr)
        print(f"lint gate: {len(others)} lint(s) besides the accepted ones: {others}", file=sys.stderr)
        return 1
    print(f"lint gate: clean ({len(items)} accepted 'conda environment' lints, see workflow/scripts/lint_gate.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
