"""LangChain's `Embeddings` over recall's engine: `RecallEmbeddings`.

Needs langchain-core (`pip install langchain-core`); importing this module
without it raises ImportError saying so.
"""

from typing import List, Optional

try:
    from langchain_core.embeddings import Embeddings
except ImportError as e:
    raise ImportError("recall_embed.langchain needs langchain-core: pip install langchain-core") from e

from recall_embed import SentenceTransformer


class RecallEmbeddings(Embeddings):
    """Dense vectors from a model recall's engine runs in-process. The
    model as `recall_embed.BGEM3` takes it (None: `RECALL_MODEL`, then
    BAAI/bge-m3 in the Hugging Face cache)."""

    def __init__(
        self,
        model_name_or_path: Optional[str] = None,
        dtype: str = "f32",
        threads: Optional[int] = None,
        max_length: Optional[int] = None,
        batch_size: int = 32,
    ) -> None:
        self.model = SentenceTransformer(model_name_or_path, dtype, threads, max_length)
        self.batch_size = batch_size

    def embed_documents(self, texts: List[str]) -> List[List[float]]:
        return self.model.encode(list(texts), batch_size=self.batch_size).tolist()

    def embed_query(self, text: str) -> List[float]:
        return self.model.encode(text).tolist()
