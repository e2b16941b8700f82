"""BGE-M3's dense, sparse and ColBERT embeddings in-process, on recall's CPU
kernels: no PyTorch, no server.

    from recall_embed import BGEM3
    m = BGEM3("/models/bge-m3", dtype="q8")
    out = m.encode(["the server ran out of space"], return_sparse=True)
    out["dense_vecs"], out["lexical_weights"]

`BGEM3` takes FlagEmbedding's `BGEM3FlagModel` arguments and returns its
shapes; `SentenceTransformer` takes sentence-transformers' and returns an
array: for either, switching is one import line. MiniLM-style models give
the dense vector only. Adapters: `recall_embed.langchain`,
`recall_embed.llama_index`.
"""

import os
from typing import Callable, Dict, Optional, Sequence, Union

import numpy as np

from recall_embed._locate import locate
from recall_embed._native import Model as _Model

__all__ = ["BGEM3", "SentenceTransformer", "locate"]


def _texts(sentences: Union[str, Sequence[str]]):
    """(the texts, whether one string was given)."""
    single = isinstance(sentences, str)
    texts = [sentences] if single else list(sentences)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"sentences[{i}] is {type(text).__name__}, not str")
    return texts, single


def _progress(total: int, show: bool) -> Optional[Callable[[int], None]]:
    """A progress bar's update function: tqdm's when it is installed, else
    a line on standard error; None when not shown."""
    if not show:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        import sys

        def line(done: int) -> None:
            end = "\n" if done >= total else ""
            sys.stderr.write(f"\rBatches: {done}/{total} texts{end}")
            sys.stderr.flush()

        return line
    bar = tqdm(total=total, desc="Batches", unit="text")

    def update(done: int) -> None:
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return update


class _Loaded:
    """A model loaded once by recall's engine; what both APIs share."""

    def __init__(
        self,
        model_name_or_path: Union[str, "os.PathLike[str]", None] = None,
        dtype: str = "f32",
        threads: Optional[int] = None,
        max_length: Optional[int] = None,
    ) -> None:
        self._model = _Model(locate(model_name_or_path), dtype, threads, max_length)

    @property
    def info(self) -> Dict[str, object]:
        """What was loaded: path, model type, dimensions, dtype, max length."""
        return self._model.info()

    def __reduce__(self):
        # By path and settings: each process that unpickles loads its own.
        return (type(self), self._model.settings())

    def __repr__(self) -> str:
        info = self.info
        return f"{type(self).__name__}({str(info['path'])!r}, dtype={info['dtype']!r})"


class BGEM3(_Loaded):
    """A model directory (Hugging Face layout) loaded once for embedding.

    The model: a directory, a hub repository or short name in the Hugging
    Face cache (`BAAI/bge-m3`, `bge-m3`), or None: `RECALL_MODEL`, then
    BAAI/bge-m3 in the cache (`recall_embed.locate`; never downloads).
    `dtype`: "f32" (the reference outputs), "bf16" or "q8" (quantised at
    load, measured against f32 on the model). `threads`: the cores the
    engine uses (None: all). `max_length`: inputs are cut at this many
    tokens (None: the model's limit, 8192 for BGE-M3).

    The GIL is released while the engine runs; a model is picklable (by its
    path and settings: each process loads its own).
    """

    def encode(
        self,
        sentences: Union[str, Sequence[str]],
        batch_size: int = 256,
        max_length: Optional[int] = None,
        return_dense: bool = True,
        return_sparse: bool = False,
        return_colbert_vecs: bool = False,
        show_progress_bar: bool = False,
    ) -> Dict[str, object]:
        """Embeds `sentences`, as FlagEmbedding's `BGEM3FlagModel.encode`:

        - "dense_vecs": float32 array (n, dim), L2-normalised;
        - "lexical_weights": a dict {token id as str: weight} per sentence;
        - "colbert_vecs": a float32 array (tokens, dim) per sentence.

        An output not asked for is None. One string in, one sentence's
        outputs out (no list around them).
        """
        texts, single = _texts(sentences)
        out = self._model.encode(
            texts,
            batch_size,
            max_length,
            (return_dense, return_sparse, return_colbert_vecs),
            _progress(len(texts), show_progress_bar),
        )
        if single:
            out = {key: None if value is None else value[0] for key, value in out.items()}
        return out

    def compute_lexical_matching_score(
        self, lexical_weights_1: Dict[str, float], lexical_weights_2: Dict[str, float]
    ) -> float:
        """The sparse score of two sentences: the sum, over the tokens both
        hold, of their weights' products (FlagEmbedding's definition)."""
        return float(
            sum(
                weight * lexical_weights_2[token]
                for token, weight in lexical_weights_1.items()
                if token in lexical_weights_2
            )
        )

    def colbert_score(self, q_reps: np.ndarray, p_reps: np.ndarray) -> float:
        """The ColBERT score of a query's vectors against a passage's: each
        query vector's best dot product, averaged (FlagEmbedding's definition)."""
        q, p = np.asarray(q_reps, dtype=np.float32), np.asarray(p_reps, dtype=np.float32)
        return float((q @ p.T).max(axis=1).sum() / q.shape[0])



class SentenceTransformer(_Loaded):
    """sentence-transformers' habits over the same engine: `encode` returns
    the dense vectors as one array. Arguments as `BGEM3`'s."""

    def encode(
        self,
        sentences: Union[str, Sequence[str]],
        batch_size: int = 32,
        show_progress_bar: bool = False,
        normalize_embeddings: bool = False,
    ) -> np.ndarray:
        """The dense vectors: float32 (n, dim), or (dim,) for one string.
        BGE-M3 and MiniLM vectors are L2-normalised already;
        `normalize_embeddings` normalises any other model's."""
        texts, single = _texts(sentences)
        vectors = self._model.encode(
            texts, batch_size, None, (True, False, False), _progress(len(texts), show_progress_bar)
        )["dense_vecs"]
        if normalize_embeddings and not self._model.info()["normalize"]:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors /= np.where(norms > 0, norms, 1)
        return vectors[0] if single else vectors

    def get_sentence_embedding_dimension(self) -> int:
        return int(self._model.info()["dense_dim"])

    @property
    def max_seq_length(self) -> int:
        return int(self._model.info()["max_length"])
