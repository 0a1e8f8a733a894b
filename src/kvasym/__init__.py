"""kvasym: reproducible statistics of KV-cache quantization and its damage to attention.

The library holds all the maths of the study; the Snakemake workflow only calls it.
Modules, one job each:

- :mod:`kvasym.rotation`      randomized Walsh-Hadamard transform
- :mod:`kvasym.codebook`      Lloyd-Max codebooks for the Beta coordinate law
- :mod:`kvasym.scalar`        fast exact scalar encoding against a codebook
- :mod:`kvasym.packing`       bit packing of codes and signs
- :mod:`kvasym.sketch`        1-bit QJL residual sketch
- :mod:`kvasym.schemes`       quantization schemes as declarative data
- :mod:`kvasym.rows`          input checks, row norms and the storage of side floats
- :mod:`kvasym.plan`          a side's quantization resolved and validated once (QuantizePlan)
- :mod:`kvasym.backends`      the numpy reference and numba backends that execute a plan
- :mod:`kvasym.composed`      the composed sides' pipeline (centre, KLT, water-filling, min-max...)
- :mod:`kvasym.cache`         packed K/V caches (quantize, dequantize, save, load)
- :mod:`kvasym.distributions` seeded synthetic K, V and queries
- :mod:`kvasym.attention`     float64 reference and quantized attention
- :mod:`kvasym.metrics`       KL, routing recall, six-dimensional error framework
- :mod:`kvasym.seeds`         seeds derived from a cell's identity
"""

__version__ = "0.1.0"
