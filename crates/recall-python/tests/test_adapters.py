"""The LangChain and LlamaIndex adapters with the real packages from PyPI
(scripts/python_test.sh installs them for a second run); without them,
importing an adapter says what to install."""

import asyncio
import importlib
import importlib.util
import os
import unittest
from pathlib import Path

import numpy as np

from recall_embed import SentenceTransformer

TINY = Path(__file__).resolve().parents[3] / "models" / "tiny-bge-m3"
TEXTS = ["the server ran out of space", "disk cleanup", "磁盘空间不足"]


def installed(module):
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


class Adapters(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.expected = SentenceTransformer(str(TINY)).encode(TEXTS)

    def check(self, documents, query):
        self.assertEqual(len(documents), len(TEXTS))
        self.assertTrue(all(isinstance(x, float) for x in documents[0]))
        self.assertLessEqual(float(np.max(np.abs(np.array(documents) - self.expected))), 1e-6)
        self.assertLessEqual(float(np.max(np.abs(np.array(query) - self.expected[0]))), 1e-6)

    def test_langchain(self):
        if not installed("langchain_core"):
            with self.assertRaisesRegex(ImportError, "pip install langchain-core"):
                importlib.import_module("recall_embed.langchain")
            return
        from langchain_core.embeddings import Embeddings

        from recall_embed.langchain import RecallEmbeddings

        e = RecallEmbeddings(str(TINY), batch_size=2)
        self.assertIsInstance(e, Embeddings)
        self.check(e.embed_documents(TEXTS), e.embed_query(TEXTS[0]))
        self.check(asyncio.run(e.aembed_documents(TEXTS)), asyncio.run(e.aembed_query(TEXTS[0])))

    def test_llama_index(self):
        if not installed("llama_index.core"):
            with self.assertRaisesRegex(ImportError, "pip install llama-index-core"):
                importlib.import_module("recall_embed.llama_index")
            return
        from llama_index.core.base.embeddings.base import BaseEmbedding

        from recall_embed.llama_index import RecallEmbedding

        e = RecallEmbedding(str(TINY), embed_batch_size=2)
        self.assertIsInstance(e, BaseEmbedding)
        self.check(e.get_text_embedding_batch(TEXTS), e.get_query_embedding(TEXTS[0]))
        self.check(
            asyncio.run(e.aget_text_embedding_batch(TEXTS)), asyncio.run(e.aget_query_embedding(TEXTS[0]))
        )

    def test_the_frameworks_are_there_when_ci_says_so(self):
        if os.environ.get("RECALL_TEST_ADAPTERS"):
            self.assertTrue(installed("langchain_core") and installed("llama_index.core"))


if __name__ == "__main__":
    unittest.main()
