"""The paper's figures: one module per figure family, drawn from the DAG's tables.

- :mod:`~kvasym.render.figures.registry`: every family (its figures, the inputs it reads, its
  report heading and its drawing callable) and the figure stage's slice; Snakemake imports it
  when it parses the workflow, so it imports matplotlib only when a family is drawn.
- one module per family (``shannon_phi``, ``kl_ecdf``, ``budget_crossover``, ``tail_sweep``,
  ``rank_sweep``, ``query_model``, ``sharpness_sweep``, ``theory_check``, ``marginals``,
  ``jensen_bias``, ``real_heatmap``, ``e2e``, ``frontier``): figure functions that take
  DataFrames with the pipeline's columns and return a :class:`matplotlib.figure.Figure`.
- :mod:`~kvasym.render.figures.captions`: the factual part of each caption, read back from the
  drawn figure; :mod:`~kvasym.render.figures.files`: the PDF, PNG and caption files.
- ``_style`` (private): the rc parameters, widths, colours and the helpers every family draws with.

Rendering computes no statistic: every interval, ratio or aggregate that a claim also reports
is read from the table of the stage that computes it (the gathered comparisons, theory and
query-model tables), never recomputed here. Nothing is imported here, so that importing the
registry stays cheap.
"""
