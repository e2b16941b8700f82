#!/usr/bin/env python3
"""Write a random-weight BGE-M3 of the real size, for benchmarks.

Exactly BAAI/bge-m3's config (24 layers, hidden 1024, 16 heads, intermediate
4096, vocab 250002, 8194 positions) and heads (colbert_linear 1024→1024,
sparse_linear 1024→1, fp16 as shipped), so it costs the same compute and
memory as the real model; the weights are random, so its vectors mean
nothing. The tokenizer is the tiny fixture's (same special tokens); the
benchmarks feed token ids directly.

    python scripts/make_full_bge_m3.py [--out models/bge-m3-random] [--with-bin]
        [--outliers N [--factor F]]

--with-bin also writes pytorch_model.bin (what BAAI/bge-m3 ships), to time
the one-time conversion. --outliers scales N channels of every encoder
LayerNorm by F (as tests/common's outlier_model does to the small models),
to time q8's outlier channels (default out: models/bge-m3-random-outliers);
q8's calibration may run some of that model's layers in f32 (it says which),
and its timings then include them.
Needs torch and safetensors (scripts/dev-venv.sh).
About 2.3 GB per weights file.
"""

import argparse
import json
import os
import shutil

import torch
from safetensors.torch import save_file

CONFIG = {
    "architectures": ["XLMRobertaModel"],
    "attention_probs_dropout_prob": 0.1,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 4096,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 8194,
    "model_type": "xlm-roberta",
    "num_attention_heads": 16,
    "num_hidden_layers": 24,
    "output_past": True,
    "pad_token_id": 1,
    "position_embedding_type": "absolute",
    "torch_dtype": "float32",
    "type_vocab_size": 1,
    "use_cache": True,
    "vocab_size": 250002,
}


def state_dict(gen: torch.Generator) -> dict:
    h, inter, c = CONFIG["hidden_size"], CONFIG["intermediate_size"], CONFIG
    sd = {}

    def rand(*shape):
        return torch.randn(*shape, generator=gen) * 0.02

    sd["embeddings.word_embeddings.weight"] = rand(c["vocab_size"], h)
    sd["embeddings.position_embeddings.weight"] = rand(c["max_position_embeddings"], h)
    sd["embeddings.token_type_embeddings.weight"] = rand(1, h)
    sd["embeddings.LayerNorm.weight"] = torch.ones(h)
    sd["embeddings.LayerNorm.bias"] = torch.zeros(h)
    for i in range(c["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for name, (o, n) in {
            "attention.self.query": (h, h),
            "attention.self.key": (h, h),
            "attention.self.value": (h, h),
            "attention.output.dense": (h, h),
            "intermediate.dense": (inter, h),
            "output.dense": (h, inter),
        }.items():
            sd[p + name + ".weight"] = rand(o, n)
            sd[p + name + ".bias"] = torch.zeros(o)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            sd[p + ln + ".weight"] = torch.ones(h)
            sd[p + ln + ".bias"] = torch.zeros(h)
    sd["pooler.dense.weight"] = rand(h, h)
    sd["pooler.dense.bias"] = torch.zeros(h)
    return sd


def main() -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(root, "models", "bge-m3-random"))
    ap.add_argument("--with-bin", action="store_true")
    ap.add_argument("--outliers", type=int, default=0, help="channels of every encoder LayerNorm to scale")
    ap.add_argument("--factor", type=float, default=20.0)
    args = ap.parse_args()
    if args.outliers and args.out == ap.get_default("out"):
        args.out += "-outliers"
    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator().manual_seed(20261202)
    sd = state_dict(gen)
    for name, t in sd.items():
        if "encoder.layer." in name and "LayerNorm." in name:
            t[[3, 17, 29, 11][: args.outliers]] *= args.factor
    save_file(sd, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    if args.with_bin:
        torch.save(sd, os.path.join(args.out, "pytorch_model.bin"))
    del sd
    h = CONFIG["hidden_size"]
    colbert = {"weight": torch.randn(h, h, generator=gen) * 0.02, "bias": torch.zeros(h)}
    sparse = {"weight": torch.randn(1, h, generator=gen) * 0.02, "bias": torch.zeros(1)}
    torch.save({k: v.half() for k, v in colbert.items()}, os.path.join(args.out, "colbert_linear.pt"))
    torch.save({k: v.half() for k, v in sparse.items()}, os.path.join(args.out, "sparse_linear.pt"))
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    tiny = os.path.join(root, "models", "tiny-bge-m3")
    for name in ("tokenizer.json", "special_tokens_map.json", "modules.json"):
        shutil.copy(os.path.join(tiny, name), os.path.join(args.out, name))
    os.makedirs(os.path.join(args.out, "1_Pooling"), exist_ok=True)
    with open(os.path.join(args.out, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": h, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, f)
    with open(os.path.join(args.out, "sentence_bert_config.json"), "w") as f:
        json.dump({"max_seq_length": 8192, "do_lower_case": False}, f)
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "XLMRobertaTokenizer", "model_max_length": 8192}, f)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
