#!/usr/bin/env python3
"""How far vectors move when a model runs as Ollama runs it (F16 GGUF
weights; ggml's CPU matmuls also round activations to f16), measured as the
cosine between each text's f32 vector and its f16 one.

    f16_tolerance.py MODEL_DIR [cls|mean]

Prints min / mean cosine for f16 weights with f32 compute, and for f16
weights and activations (a pessimistic bound). recall's provider chain
requires a mean cosine of 0.99 (provider::SAME_SPACE_COSINE) before another
provider of the same model may write into an index.
"""

import sys

import torch
from transformers import AutoModel, AutoTokenizer

TEXTS = [
    "The build server says no space left on device, what can I delete?",
    "Run docker image prune -a to remove unused images, and clear old logs in /var/log.",
    "nginx -t says unexpected end of file in sites-enabled/default",
    "我们讨论一下数据库从 MySQL 迁移到 PostgreSQL 的方案",
    "建议先用 pgloader 做一次全量迁移，然后用逻辑复制同步增量。",
    "fn main() { println!(\"hello\"); }",
    "Tokyo trip: book the ryokan in Kyoto for two nights 🙂",
    " ".join(["The deployment pipeline failed at the integration stage because"] * 20),
]


def embed(model, tok, pooling):
    out = []
    for text in TEXTS:
        limit = min(512, model.config.max_position_embeddings - 2)
        batch = tok(text, return_tensors="pt", truncation=True, max_length=limit)
        with torch.no_grad():
            h = model(**batch).last_hidden_state.float()[0]
        v = h[0] if pooling == "cls" else h.mean(0)
        out.append(torch.nn.functional.normalize(v, dim=0))
    return out


def main():
    path = sys.argv[1]
    pooling = sys.argv[2] if len(sys.argv) > 2 else "cls"
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, torch_dtype=torch.float32).eval()
    ref = embed(model, tok, pooling)
    # f16 weights, f32 compute.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
    rounded = embed(model, tok, pooling)
    # f16 weights and activations.
    half = model.half()
    full_half = embed(half, tok, pooling)
    for name, vs in [("f16 weights", rounded), ("f16 weights + activations", full_half)]:
        cos = [float(torch.dot(a, b)) for a, b in zip(ref, vs)]
        print(f"{path} {name}: min cosine {min(cos):.6f}, mean {sum(cos) / len(cos):.6f} over {len(cos)} texts")


if __name__ == "__main__":
    main()
