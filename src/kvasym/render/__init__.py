"""Rendering: what people read, made from numbers the computing stages wrote.

``format`` (the one number formatter), ``tables``, ``numbers``, ``claims``, ``ledger`` and
``reproduce`` (the paper's generated parts and the ledger), ``figures`` (one module per figure
family and the registry), ``crate`` (the run's RO-Crate). Nothing here computes a statistic.
"""
