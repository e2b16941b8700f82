#!/usr/bin/env python3
"""Throughput and peak memory of recall's Python package beside `recall
bench` (same model, dtype, shapes and threads, in one run) and, where they
are installed, FlagEmbedding (PyTorch), fastembed (ONNX Runtime, on the
f32 export scripts/bench_peers.py makes) and sentence-transformers.

    python scripts/bench_python.py --model models/bge-m3-random \\
        [--dtypes f32,bf16,q8] [--shapes 1x16,32x128,1x2048] [--runs 3] \\
        [--recall target/release/recall] [--peers flagembedding,fastembed,sentence-transformers]

Each measurement runs in a process of its own, so its peak memory is its
own. A shape BATCHxTOKENS is BATCH inputs cut at TOKENS tokens (special
tokens included) by `max_length`. Prints a table with each figure's ratio to
`recall bench`'s for the same dtype and shape; name the CPU with it.
Run it inside a venv where `recall_embed` is installed (scripts/python_test.sh
builds one; `maturin build --release` for figures).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

WORDS = "recall keeps an agent's memory on the machine it runs on ".split()


def text(tokens, model):
    """A text of `tokens` tokens with the model's tokenizer (special tokens
    included), so that every implementation sees the same input whether or
    not it can be told where to cut; without the `tokenizers` package,
    about twice that many words (cut by `max_length`)."""
    words = " ".join(WORDS[i % len(WORDS)] for i in range(2 * tokens))
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return words
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    tok.no_truncation()
    ids = tok.encode(words, add_special_tokens=False).ids
    added = len(tok.encode("", add_special_tokens=True).ids)
    return tok.decode(ids[: tokens - added])


def shapes(spec):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_peers import shapes_of

    return shapes_of(spec)


def measure(encode, model, batch, tokens, runs):
    texts = [text(tokens, model)] * batch
    encode(texts, batch, tokens)  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        encode(texts, batch, tokens)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def one(impl, model, dtype, spec, runs):
    """Runs in a child process: one implementation, one dtype, every shape."""
    if impl == "recall_embed":
        from recall_embed import BGEM3

        m = BGEM3(model, dtype=dtype)

        def encode(texts, batch, tokens):
            m.encode(texts, batch_size=batch, max_length=tokens)
    elif impl == "flagembedding":
        import torch
        from FlagEmbedding import BGEM3FlagModel

        torch.set_num_threads(os.cpu_count())
        m = BGEM3FlagModel(model, use_fp16=False, devices="cpu")
        cast = {"f32": None, "bf16": torch.bfloat16}[dtype]
        if cast is not None:
            m.model = m.model.to(cast)

        def encode(texts, batch, tokens):
            m.encode(texts, batch_size=batch, max_length=tokens)
    elif impl == "sentence-transformers":
        from sentence_transformers import SentenceTransformer

        m = SentenceTransformer(model, device="cpu")
        if dtype == "bf16":
            import torch

            m = m.to(torch.bfloat16)

        def encode(texts, batch, tokens):
            m.max_seq_length = tokens
            m.encode(texts, batch_size=batch)
    elif impl == "fastembed":
        # fastembed's ONNX runtime on the export bench_peers.py makes of
        # the same weights (f32 only), registered as a local custom model.
        import tempfile

        from fastembed import TextEmbedding
        from fastembed.common.model_description import ModelSource, PoolingType

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import bench_peers

        if dtype != "f32":
            raise SystemExit("fastembed runs the f32 export only")
        onnx = bench_peers.onnx_f32(model)
        local = tempfile.mkdtemp()
        for name in ("tokenizer.json", "special_tokens_map.json", "config.json"):
            os.symlink(os.path.abspath(os.path.join(model, name)), os.path.join(local, name))
        # fastembed reads the pad token from tokenizer_config.json, where the
        # real BGE-M3 has it and the random one's is bare.
        with open(os.path.join(model, "tokenizer_config.json")) as f:
            config = json.load(f)
        with open(os.path.join(model, "special_tokens_map.json")) as f:
            config.setdefault("pad_token", json.load(f).get("pad_token", "<pad>"))
        with open(os.path.join(local, "tokenizer_config.json"), "w") as f:
            json.dump(config, f)
        for path in (onnx, onnx.with_name(onnx.name + ".data")):
            os.symlink(path, os.path.join(local, path.name))
        name = "recall-bench/" + os.path.basename(os.path.abspath(model))
        TextEmbedding.add_custom_model(
            model=name, pooling=PoolingType.CLS, normalization=True,
            sources=ModelSource(hf=name), dim=1024, model_file=onnx.name,
        )
        m = TextEmbedding(name, specific_model_path=local, threads=os.cpu_count())

        def encode(texts, batch, tokens):
            list(m.embed(texts, batch_size=batch))
    else:
        raise SystemExit(f"unknown implementation {impl}")
    for batch, tokens in shapes(spec):
        seconds = measure(encode, model, batch, tokens, runs)
        print(json.dumps({"impl": impl, "dtype": dtype, "shape": f"{batch}x{tokens}",
                          "tokens_per_s": batch * tokens / seconds}), flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"impl": impl, "dtype": dtype, "peak_rss_bytes": peak}), flush=True)


def child(args, impl, dtype):
    cmd = [sys.executable, __file__, "--one", impl, "--model", args.model, "--dtypes", dtype,
           "--shapes", args.shapes, "--runs", str(args.runs)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["failed"])[-1]
        return [], last
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")], None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtypes", default="f32,bf16,q8")
    ap.add_argument("--shapes", default="1x16,32x128,1x2048")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--recall", default="target/release/recall")
    ap.add_argument("--peers", default="flagembedding,fastembed,sentence-transformers")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return one(args.one, args.model, args.dtypes, args.shapes, args.runs)

    rows, peaks, notes = {}, {}, []
    for dtype in args.dtypes.split(","):
        bench = subprocess.run(
            [args.recall, "bench", "--model", args.model, "--dtype", dtype, "--shapes", args.shapes,
             "--runs", str(args.runs), "--json"], capture_output=True, text=True, check=True)
        for line in bench.stdout.splitlines():
            r = json.loads(line)
            rows[("recall bench", dtype, r["shape"])] = r["tokens_per_s"]
            peaks[("recall bench", dtype)] = max(peaks.get(("recall bench", dtype), 0), r["peak_rss_bytes"])
        impls = ["recall_embed"] + [p for p in args.peers.split(",") if p]
        for impl in impls:
            if impl != "recall_embed" and dtype == "q8" or impl == "fastembed" and dtype != "f32":
                continue
            results, error = child(args, impl, dtype)
            if error:
                notes.append(f"{impl} {dtype}: not measured ({error})")
            for r in results:
                if "shape" in r:
                    rows[(impl, dtype, r["shape"])] = r["tokens_per_s"]
                else:
                    peaks[(impl, dtype)] = r["peak_rss_bytes"]

    shape_list = [f"{b}x{t}" for b, t in shapes(args.shapes)]
    print("| implementation | dtype | " + " | ".join(f"{s} tokens/s (× recall bench)" for s in shape_list)
          + " | peak RSS |")
    print("|---|---|" + "---|" * (len(shape_list) + 1))
    for (impl, dtype) in sorted(peaks, key=lambda k: (k[1], k[0] != "recall bench", k[0])):
        cells = []
        for s in shape_list:
            v, base = rows.get((impl, dtype, s)), rows.get(("recall bench", dtype, s))
            cells.append("-" if v is None else f"{v:,.0f} ({v / base:.2f})" if base else f"{v:,.0f}")
        print(f"| {impl} | {dtype} | " + " | ".join(cells) + f" | {peaks[(impl, dtype)] / 2**20:,.0f} MiB |")
    for n in notes:
        print(f"\n{n}")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"\nCPU: {cpu}, {os.cpu_count()} threads")


if __name__ == "__main__":
    main()
