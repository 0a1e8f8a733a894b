"""Tools that check the pipeline, kept out of the library (``src/kvasym``): run them from the
repository's root as ``python3 -m tools.<name>``, with kvasym installed (``pip install -e .``).

- ``tools.expected``: the digest of a run's numbers and its comparison with
  ``tests/expected/tiny_grid.json``;
- ``tools.numeric_env``: run a command in the pinned numeric environment (OpenBLAS's Haswell
  kernels, numpy's loops at x86-64-v3) that the expected results are computed in;
- ``tools.report_check``: open the Snakemake report in headless Chromium and screenshot every view.

The tests import them as ``tools.*`` (pytest puts the repository's root on the path:
``pythonpath`` in pyproject.toml).
"""
