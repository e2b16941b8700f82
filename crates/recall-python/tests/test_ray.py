"""A corpus beyond one process, on an engine that exists: Ray Data's
`map_batches` with a callable class (each of two workers loads its own
model), and a model object shipped to a Ray task by pickling. Runs where
`ray[data]` is installed (scripts/python_test.sh installs it for its second
run); RECALL_TEST_RAY makes its absence a failure."""

import os
import sys
import unittest
from pathlib import Path

import numpy as np

from recall_embed import BGEM3

TINY = str(Path(__file__).resolve().parents[3] / "models" / "tiny-bge-m3")
TEXTS = [f"message {i}: the server ran out of space on disk {i % 7}" for i in range(40)]

try:
    import ray

    ray.init  # a directory named ray (Ray's temporary files) imports too
except (ImportError, AttributeError):
    ray = None


class Embed:
    """What docs/python.md shows: one model per worker, loaded once."""

    def __init__(self):
        self.model = BGEM3(TINY, threads=1)

    def __call__(self, batch):
        batch["dense"] = self.model.encode(list(batch["text"]))["dense_vecs"]
        return batch


@unittest.skipIf(ray is None and not os.environ.get("RECALL_TEST_RAY"), "ray is not installed")
class OnRay(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        # Workers cannot import this test module: ship `Embed` by value.
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        cls.expected = BGEM3(TINY).encode(TEXTS)["dense_vecs"]

    @classmethod
    def tearDownClass(cls):
        ray.shutdown()

    def test_map_batches_on_two_workers_agrees_with_one_process(self):
        ds = ray.data.from_items([{"text": t} for t in TEXTS])
        rows = ds.map_batches(Embed, concurrency=2, batch_size=8, batch_format="numpy").take_all()
        got = {r["text"]: r["dense"] for r in rows}
        self.assertEqual(len(got), len(TEXTS))
        for text, expected in zip(TEXTS, self.expected):
            self.assertLessEqual(float(np.max(np.abs(got[text] - expected))), 1e-6)

    def test_a_model_travels_to_a_task_by_pickling(self):
        @ray.remote
        def embed(model, texts):
            return model.encode(texts)["dense_vecs"]

        got = ray.get(embed.remote(BGEM3(TINY), TEXTS[:5]))
        self.assertLessEqual(float(np.max(np.abs(got - self.expected[:5]))), 1e-6)


if __name__ == "__main__":
    unittest.main()
