"""The wheel as a Python user meets it: parity with FlagEmbedding's and
sentence-transformers' reference outputs (tests/fixtures, written by the
real packages), FlagEmbedding's shapes, errors, pickling and threads.

Run by scripts/python_test.sh in a venv holding only the wheel and numpy.
"""

import contextlib
import importlib.util
import io
import json
import os
import pickle
import shutil
import signal
import tempfile
import threading
import unittest
from pathlib import Path
from unittest import mock

import numpy as np

from recall_embed import BGEM3, SentenceTransformer

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "models" / "tiny-bge-m3"
TOLERANCE = 1e-5


def reference(name):
    return json.loads((ROOT / "tests" / "fixtures" / name).read_text())


def max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a, dtype=np.float32) - np.asarray(b, dtype=np.float32))))


class TinyBgeM3(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ref = reference("tiny_bge_m3_reference.json")
        cls.model = BGEM3(str(TINY))
        cls.texts = [c["text"] for c in cls.ref["cases"]]
        cls.out = cls.model.encode(
            cls.texts, batch_size=3, return_dense=True, return_sparse=True, return_colbert_vecs=True
        )

    def test_no_pytorch_is_needed(self):
        self.assertIsNone(importlib.util.find_spec("torch"))

    def test_every_output_matches_flagembedding(self):
        self.assertEqual(self.model.info["max_length"], self.ref["max_length"])
        dense = self.out["dense_vecs"]
        self.assertEqual(dense.dtype, np.float32)
        self.assertEqual(dense.shape, (len(self.texts), len(self.ref["cases"][0]["dense"])))
        for i, case in enumerate(self.ref["cases"]):
            with self.subTest(case=case["name"]):
                self.assertLessEqual(max_diff(dense[i], case["dense"]), TOLERANCE)
                weights = self.out["lexical_weights"][i]
                self.assertEqual(set(weights), set(case["sparse"]))
                for token, weight in case["sparse"].items():
                    self.assertLessEqual(abs(weights[token] - weight), TOLERANCE, token)
                colbert = self.out["colbert_vecs"][i]
                self.assertEqual(colbert.shape, np.asarray(case["colbert"]).shape)
                self.assertLessEqual(max_diff(colbert, case["colbert"]), TOLERANCE)

    def test_scores_match_flagembedding(self):
        scores = self.ref["scores"]
        a, b = (self.texts.index(self.ref["cases"][[c["name"] for c in self.ref["cases"]].index(n)]["text"]) for n in scores["pair"])
        self.assertAlmostEqual(float(self.out["dense_vecs"][a] @ self.out["dense_vecs"][b]), scores["dense"], delta=TOLERANCE)
        lw = self.out["lexical_weights"]
        self.assertAlmostEqual(self.model.compute_lexical_matching_score(lw[a], lw[b]), scores["sparse"], delta=TOLERANCE)
        cv = self.out["colbert_vecs"]
        self.assertAlmostEqual(self.model.colbert_score(cv[a], cv[b]), scores["colbert"], delta=TOLERANCE)

    def test_only_what_is_asked_and_one_string_gives_one(self):
        out = self.model.encode(self.texts[0])
        self.assertEqual(out["lexical_weights"], None)
        self.assertEqual(out["colbert_vecs"], None)
        self.assertEqual(out["dense_vecs"].shape, (self.out["dense_vecs"].shape[1],))
        self.assertLessEqual(max_diff(out["dense_vecs"], self.out["dense_vecs"][0]), 1e-6)
        out = self.model.encode(self.texts[:2], return_dense=False, return_sparse=True)
        self.assertEqual(set(out), {"dense_vecs", "lexical_weights", "colbert_vecs"})
        self.assertIsNone(out["dense_vecs"])
        self.assertEqual(len(out["lexical_weights"]), 2)

    def test_sentence_transformers_habit_gives_one_array(self):
        st = SentenceTransformer(str(TINY))
        vectors = st.encode(self.texts, batch_size=4)
        self.assertIsInstance(vectors, np.ndarray)
        self.assertLessEqual(max_diff(vectors, self.out["dense_vecs"]), 1e-6)
        self.assertEqual(st.encode(self.texts[0]).shape, (st.get_sentence_embedding_dimension(),))
        self.assertEqual(st.max_seq_length, self.ref["max_length"])
        again = pickle.loads(pickle.dumps(st))
        self.assertLessEqual(max_diff(again.encode(self.texts), vectors), 1e-6)

    def test_progress_is_reported_after_each_batch(self):
        done = []
        self.model._model.encode(self.texts, 4, None, (True, False, False), done.append)
        self.assertEqual(done, [4, 8, len(self.texts)])
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.model.encode(self.texts, batch_size=4, show_progress_bar=True)
        if importlib.util.find_spec("tqdm") is None:
            self.assertIn(f"{len(self.texts)}/{len(self.texts)}", err.getvalue())

    def test_max_length_per_call_cuts_as_loading_does(self):
        cut = self.model.encode(self.texts, max_length=8, return_colbert_vecs=True)
        loaded = BGEM3(str(TINY), max_length=8).encode(self.texts, return_colbert_vecs=True)
        self.assertLessEqual(max_diff(cut["dense_vecs"], loaded["dense_vecs"]), 1e-6)
        for a, b in zip(cut["colbert_vecs"], loaded["colbert_vecs"]):
            self.assertEqual(a.shape, b.shape)
            self.assertLessEqual(a.shape[0], 7)

    def test_ctrl_c_stops_between_batches(self):
        texts = [f"text {i} about disk space" for i in range(2000)]
        done = []
        main = threading.get_ident()
        timer = threading.Timer(0.05, signal.pthread_kill, (main, signal.SIGINT))
        timer.start()
        try:
            with self.assertRaises(KeyboardInterrupt):
                # `done.append` is C: no Python bytecode runs inside this
                # call, so only the check between batches can see the
                # signal before the last batch.
                self.model._model.encode(texts, 1, None, (True, False, False), done.append)
        finally:
            timer.cancel()
        self.assertLess(len(done), len(texts))

    def test_a_pickled_model_loads_again_and_agrees(self):
        again = pickle.loads(pickle.dumps(self.model))
        out = again.encode(self.texts)
        self.assertLessEqual(max_diff(out["dense_vecs"], self.out["dense_vecs"]), 1e-6)

    def test_threads_embed_at_once_and_agree(self):
        results = {}

        def work(k):
            results[k] = self.model.encode(self.texts, batch_size=2)["dense_vecs"]

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k in range(4):
            self.assertLessEqual(max_diff(results[k], self.out["dense_vecs"]), 1e-6)

    def test_other_dtypes_stay_close(self):
        for dtype in ("bf16", "q8"):
            with self.subTest(dtype=dtype):
                out = BGEM3(str(TINY), dtype=dtype, threads=1).encode(self.texts)["dense_vecs"]
                cosines = np.sum(out * self.out["dense_vecs"], axis=1)
                self.assertGreater(float(cosines.min()), 0.98)

    def test_bad_input_says_what_is_wrong(self):
        with self.assertRaisesRegex(ValueError, "unknown dtype"):
            BGEM3(str(TINY), dtype="f16x")
        with self.assertRaisesRegex(ValueError, "threads"):
            BGEM3(str(TINY), threads=0)
        with self.assertRaisesRegex(FileNotFoundError, "no-such-model: no such directory"):
            BGEM3(str(ROOT / "no-such-model"))
        # A directory that holds no model: the engine's whole message.
        with self.assertRaisesRegex(RuntimeError, "config.json"):
            BGEM3(str(ROOT / "docs"))
        with self.assertRaisesRegex(TypeError, r"sentences\[1\] is int"):
            self.model.encode(["fine", 3])
        with self.assertRaisesRegex(ValueError, "batch_size"):
            self.model.encode(["fine"], batch_size=0)
        with self.assertRaisesRegex(ValueError, "max_length 2"):
            self.model.encode(["fine"], max_length=2)
        with self.assertRaisesRegex(ValueError, "output"):
            self.model.encode(["fine"], return_dense=False)


class ModelLookup(unittest.TestCase):
    """Names resolve as the `recall` command resolves them: a directory, a
    repository or short name in the Hugging Face cache, RECALL_MODEL."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.cache = Path(self.tmp.name) / "hub"
        repo = self.cache / "models--BAAI--bge-m3"
        shutil.copytree(TINY, repo / "snapshots" / "abc123")
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("abc123")
        self.env = mock.patch.dict(os.environ, {"HF_HUB_CACHE": str(self.cache)})
        self.env.start()
        os.environ.pop("RECALL_MODEL", None)

    def tearDown(self):
        self.env.stop()
        self.tmp.cleanup()

    def test_a_repository_a_short_name_and_none_find_the_cache(self):
        for name in ("BAAI/bge-m3", "bge-m3", None):
            with self.subTest(name=name):
                self.assertEqual(Path(BGEM3(name).info["path"]).parts[-2:], ("snapshots", "abc123"))

    def test_recall_model_comes_before_the_cache(self):
        os.environ["RECALL_MODEL"] = str(TINY)
        self.assertEqual(Path(BGEM3().info["path"]), TINY)

    def test_a_missing_model_says_how_to_fetch_it(self):
        with self.assertRaisesRegex(FileNotFoundError, "recall model fetch all-MiniLM-L6-v2"):
            BGEM3("all-MiniLM-L6-v2")
        with self.assertRaisesRegex(FileNotFoundError, "huggingface-cli download someone/model"):
            BGEM3("someone/model")
        with self.assertRaisesRegex(FileNotFoundError, "no such directory"):
            BGEM3(str(Path(self.tmp.name) / "nothing" / "here"))


class MiniLM(unittest.TestCase):
    """The real all-MiniLM-L6-v2 (RECALL_TEST_MINILM, fetched by the test
    command) against sentence-transformers' outputs."""

    @classmethod
    def setUpClass(cls):
        path = os.environ.get("RECALL_TEST_MINILM")
        if not path:
            if os.environ.get("CI"):
                raise RuntimeError("RECALL_TEST_MINILM is not set: run scripts/fetch_test_models.sh")
            raise unittest.SkipTest("RECALL_TEST_MINILM is not set: run scripts/fetch_test_models.sh")
        cls.model = BGEM3(path)

    def test_dense_matches_sentence_transformers(self):
        ref = reference("minilm_reference.json")
        out = self.model.encode([c["text"] for c in ref["cases"]])["dense_vecs"]
        for i, case in enumerate(ref["cases"]):
            self.assertLessEqual(max_diff(out[i], case["dense"]), TOLERANCE, case["text"])

    def test_sparse_is_refused_by_name(self):
        with self.assertRaisesRegex(ValueError, "sparse"):
            self.model.encode(["a"], return_sparse=True)


if __name__ == "__main__":
    unittest.main()
