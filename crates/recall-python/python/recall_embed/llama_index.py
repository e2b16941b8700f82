"""LlamaIndex's `BaseEmbedding` over recall's engine: `RecallEmbedding`.

Needs llama-index-core (`pip install llama-index-core`); importing this
module without it raises ImportError saying so.
"""

from typing import Any, List, Optional

try:
    from llama_index.core.base.embeddings.base import BaseEmbedding
    from llama_index.core.bridge.pydantic import PrivateAttr
except ImportError as e:
    raise ImportError(
        "recall_embed.llama_index needs llama-index-core: pip install llama-index-core"
    ) from e

from recall_embed import SentenceTransformer


class RecallEmbedding(BaseEmbedding):
    """Dense vectors from a model recall's engine runs in-process. The
    model as `recall_embed.BGEM3` takes it (None: `RECALL_MODEL`, then
    BAAI/bge-m3 in the Hugging Face cache)."""

    _model: SentenceTransformer = PrivateAttr()

    def __init__(
        self,
        model_name_or_path: Optional[str] = None,
        dtype: str = "f32",
        threads: Optional[int] = None,
        max_length: Optional[int] = None,
        embed_batch_size: int = 32,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            model_name=str(model_name_or_path or "BAAI/bge-m3"),
            embed_batch_size=embed_batch_size,
            **kwargs,
        )
        self._model = SentenceTransformer(model_name_or_path, dtype, threads, max_length)

    @classmethod
    def class_name(cls) -> str:
        return "RecallEmbedding"

    def _get_query_embedding(self, query: str) -> List[float]:
        return self._model.encode(query).tolist()

    async def _aget_query_embedding(self, query: str) -> List[float]:
        return self._get_query_embedding(query)

    def _get_text_embedding(self, text: str) -> List[float]:
        return self._model.encode(text).tolist()

    def _get_text_embeddings(self, texts: List[str]) -> List[List[float]]:
        return self._model.encode(texts, batch_size=self.embed_batch_size).tolist()
