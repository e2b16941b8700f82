#!/usr/bin/env python3
"""recall's encoder beside ONNX Runtime (f32 and dynamic int8) and PyTorch
(f32 and bf16), on the same weights, shapes and thread count, in one run: a
table of tokens/s, the 1x16 query latency, peak memory, and recall's ratio
to each (recall --dtype q8 for the int8 peers, bf16 for torch-bf16, f32 for
the others), under a line naming the CPU and its relevant flags.

    python scripts/bench_peers.py MODEL_DIR [--recall target/release/recall]
        [--shapes 1x16,1x128,8x128,4x512,1x2048] [--runs 5] [--threads 2]
        [--peers ort,ort-int8,torch,torch-bf16] [--dtypes f32,q8,bf16]
        [--rounds 1] [--baseline OTHER_RECALL] [--json]

MODEL_DIR is an XLM-R (BGE-M3) directory such as models/bge-m3-random
(scripts/make_full_bge_m3.py). The ONNX exports are made once into
$RECALL_PEERS_CACHE (default ~/.cache/recall/peers). Each runtime runs in its
own process, shapes from small to large, so that its peak memory after a
shape is its own. Inputs are random token ids (no padding), the same for
every runtime; the dense output (CLS) is what all compute. recall's pack
files (its packed weights, mapped at load) are written before any timed
run, as the ONNX exports are. Needs the dev
venv (scripts/dev-venv.sh) plus onnxruntime, onnx and onnxscript.

On a shared machine one process can be slowed 1.5-2x while the next is not.
--rounds N runs every side N times, taking turns, and keeps each side's
best median per shape (and its largest peak memory), so that a slow spell
hits every side alike instead of deciding a ratio.

--baseline runs a second recall binary (a build of an earlier commit, say)
in every dtype beside this one, as `base-recall*`, so that a change's cost
or gain is one run's ratio (this recall / the baseline, in brackets on the
baseline's column). It keeps its own cache ($RECALL_PEERS_CACHE/baseline):
two builds whose packed layouts differ would otherwise replace each other's
pack file at every start.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def shapes_of(text):
    out = []
    for s in text.split(","):
        b, t = s.lower().split("x")
        out.append((int(b), int(t)))
    return out


def token_ids(batch, tokens, vocab, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed + batch * 100003 + tokens)
    ids = rng.integers(5, vocab - 1, size=(batch, tokens), dtype=np.int64)
    ids[:, 0] = 0  # <s>
    ids[:, -1] = 2  # </s>
    return ids


def peak_rss_bytes():
    """This process's own peak (VmHWM). getrusage's ru_maxrss is not: a
    process started after the parent's ONNX export reports the parent's
    peak as its own."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cpu_line():
    """The CPU model and the flags that decide recall's and its peers' kernels."""
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown CPU":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    wanted = ["avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8"]
    have = [f for f in wanted if f in flags]
    return f"{model}; {' '.join(have) if have else 'none of ' + ' '.join(wanted)}"


def time_runs(fn, runs):
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times)


def cache_dir():
    d = Path(os.environ.get("RECALL_PEERS_CACHE", Path.home() / ".cache/recall/peers"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def onnx_paths(model_dir):
    """The f32 export of MODEL_DIR's encoder and its dynamic int8 quantisation, made once."""
    f32 = onnx_f32(model_dir)
    int8 = f32.with_name(f32.name.replace(".onnx", ".int8.onnx"))
    if not int8.exists():
        from onnxruntime.quantization import QuantType, quantize_dynamic

        print(f"quantising {f32} to {int8} (once)", file=sys.stderr)
        quantize_dynamic(str(f32), str(int8), weight_type=QuantType.QInt8, use_external_data_format=True)
    return f32, int8


def onnx_f32(model_dir):
    """The f32 ONNX export of MODEL_DIR's encoder (last hidden state), made once."""
    import torch
    from transformers import AutoModel

    stamp = f"{Path(model_dir).resolve().name}-{int(os.path.getmtime(Path(model_dir) / 'config.json'))}"
    f32 = cache_dir() / f"{stamp}.onnx"
    if not f32.exists():
        print(f"exporting {model_dir} to {f32} (once)", file=sys.stderr)
        model = AutoModel.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
        ids = torch.tensor(token_ids(1, 16, model.config.vocab_size))
        mask = torch.ones_like(ids)
        import tempfile

        # A model over 2 GB is exported as one file per tensor: into a scratch dir.
        scratch = tempfile.TemporaryDirectory(dir=cache_dir())
        tmp = Path(scratch.name) / "model.onnx"
        torch.onnx.export(
            model,
            (ids, mask),
            str(tmp),
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "seq"},
                "attention_mask": {0: "batch", 1: "seq"},
                "last_hidden_state": {0: "batch", 1: "seq"},
            },
            opset_version=17,
            dynamo=False,
        )
        import onnx

        # The graph, with its weights in one file beside it.
        m = onnx.load(str(tmp))
        onnx.save(m, str(f32), save_as_external_data=True, location=f32.name + ".data")
        scratch.cleanup()
    return f32


def run_peer(peer, model_dir, shapes, runs, threads):
    """One runtime in this process: a JSON line per shape on stdout."""
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    started = time.perf_counter()
    if peer in ("ort", "ort-int8"):
        import onnxruntime as ort

        f32, int8 = onnx_paths(model_dir)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(int8 if peer == "ort-int8" else f32), options, providers=["CPUExecutionProvider"])

        def forward(ids):
            return session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": (ids * 0 + 1)})[0][:, 0]
    else:
        import torch
        from transformers import AutoModel

        torch.set_num_threads(threads)
        model = AutoModel.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
        if peer == "torch-bf16":
            # What a sentence-transformers user writes: the whole model in bf16.
            model = model.to(torch.bfloat16)

        def forward(ids):
            with torch.inference_mode():
                t = torch.from_numpy(ids)
                return model(input_ids=t, attention_mask=torch.ones_like(t)).last_hidden_state[:, 0]
    load = time.perf_counter() - started
    for batch, tokens in shapes:
        ids = token_ids(batch, tokens, vocab)
        median, best = time_runs(lambda: forward(ids), runs)
        print(json.dumps({
            "peer": peer, "shape": f"{batch}x{tokens}", "median_ms": median * 1e3, "best_ms": best * 1e3,
            "tokens_per_s": batch * tokens / median, "peak_rss_bytes": peak_rss_bytes(), "load_s": load,
        }), flush=True)


def recall_name(dtype, prefix=""):
    return prefix + ("recall" if dtype == "f32" else f"recall-{dtype}")


BASE = "base-"


def baseline_env():
    """The baseline binary's environment: a cache of its own."""
    cache = Path(os.environ.get("RECALL_PEERS_CACHE", Path.home() / ".cache/recall/peers")) / "baseline"
    return dict(os.environ, RECALL_CACHE_DIR=str(cache))


def run_recall(binary, model_dir, shapes, runs, threads, dtype, prefix="", env=None):
    env = dict(env or os.environ, RAYON_NUM_THREADS=str(threads))
    spec = ",".join(f"{b}x{t}" for b, t in shapes)
    out = subprocess.run(
        [binary, "bench", "--model", model_dir, "--shapes", spec, "--runs", str(runs), "--json",
         "--dtype", dtype],
        check=True, capture_output=True, text=True, env=env,
    ).stdout
    rows = []
    for line in out.splitlines():
        r = json.loads(line)
        rows.append({"peer": recall_name(dtype, prefix), "shape": r["shape"], "median_ms": r["median_ms"], "best_ms": r["best_ms"],
                     "tokens_per_s": r["tokens_per_s"], "peak_rss_bytes": r["peak_rss_bytes"]})
    return rows


def best_of_rounds(rows):
    """Per (peer, shape): the row of the best median, with the largest peak
    memory of all its rounds and how many rounds there were."""
    best = {}
    for r in rows:
        key = (r["peer"], r["shape"])
        b = best.get(key)
        rounds = (b["rounds"] if b else 0) + 1
        peak = max(r["peak_rss_bytes"], b["peak_rss_bytes"] if b else 0)
        if b is None or r["median_ms"] < b["median_ms"]:
            b = dict(r)
        b["rounds"], b["peak_rss_bytes"] = rounds, peak
        best[key] = b
    return list(best.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--recall", default="target/release/recall")
    ap.add_argument("--shapes", default="1x16,1x128,8x128,4x512,1x2048")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peers", default="ort,ort-int8,torch,torch-bf16")
    ap.add_argument("--dtypes", default="f32,q8,bf16", help="recall's --dtype values to run")
    ap.add_argument("--rounds", type=int, default=1, help="runs of every side, taking turns; the best median of each is kept")
    ap.add_argument("--baseline", help="another recall binary to run in the same dtypes, taking turns")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only", help=argparse.SUPPRESS)  # internal: run one peer in this process
    args = ap.parse_args()
    shapes = shapes_of(args.shapes)
    if args.only:
        run_peer(args.only, args.model_dir, shapes, args.runs, args.threads)
        return
    if any(p.startswith("ort") for p in args.peers.split(",")):
        onnx_paths(args.model_dir)  # exports outside the timed processes
    dtypes = args.dtypes.split(",")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    recalls = [(args.recall, "", None)]
    if args.baseline:
        recalls.append((args.baseline, BASE, baseline_env()))
    for binary, _, env in recalls:
        for dtype in dtypes:
            # The first load in a dtype writes recall's pack file (packed
            # weights kept for later starts) and q8's check; outside the
            # timed processes, so that no peak counts them.
            subprocess.run(
                [binary, "embed", "--model", args.model_dir, "--dtype", dtype, "warm up"],
                check=True, stdout=subprocess.DEVNULL, env=env,
            )
    rows = []
    for _ in range(args.rounds):
        for dtype in dtypes:
            for binary, prefix, env in recalls:
                rows += run_recall(binary, args.model_dir, shapes, args.runs, args.threads, dtype, prefix, env)
        for peer in [p for p in args.peers.split(",") if p]:
            out = subprocess.run(
                [sys.executable, __file__, args.model_dir, "--only", peer, "--shapes", args.shapes,
                 "--runs", str(args.runs), "--threads", str(args.threads)],
                check=True, capture_output=True, text=True,
            ).stdout
            rows += [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    rows = best_of_rounds(rows)
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    mine_names = [recall_name(d) for d in dtypes]
    base_names = [recall_name(d, BASE) for d in dtypes] if args.baseline else []
    peers = mine_names + base_names + [p for p in args.peers.split(",") if p]
    by = {(r["peer"], r["shape"]): r for r in rows}
    weights = sum(p.stat().st_size for p in Path(args.model_dir).glob("model.safetensors"))
    rounds = f", best of {args.rounds} rounds taking turns" if args.rounds > 1 else ""
    print(f"CPU: {cpu_line()}")
    print(f"{args.model_dir}, {args.threads} threads, median of {args.runs} runs{rounds}; "
          f"tokens/s (1x16: latency), peak RSS after the shape; recall / peer in brackets")
    header = f"{'shape':<8}" + "".join(f"{p:>24}" for p in peers)
    print(header)
    for b, t in shapes:
        s = f"{b}x{t}"
        cells = []
        for p in peers:
            # int8 peers are compared with recall's q8, bf16 ones with bf16,
            # the others with f32 (or the first dtype run).
            base = recall_name(dtypes[0])
            for suffix, dtype in (("int8", "q8"), ("bf16", "bf16")):
                if p.endswith(suffix) and dtype in dtypes:
                    base = recall_name(dtype)
            shown = by.get((p, s))
            # Peers: recall / peer. recall's other dtypes: their speed-up
            # over its first (f32), the same way round.
            mine, r = by.get((base, s)), shown
            if p in base_names:
                base = p[len(BASE):]
                mine, r = by.get((base, s)), shown
            elif p in mine_names:
                first = recall_name(dtypes[0])
                mine, r = (shown, by.get((first, s))) if p != first else (None, None)
            if shown is None:
                cells.append(f"{'-':>24}")
                continue
            if b == 1 and t <= 16:
                v = f"{shown['median_ms']:.0f} ms"
                ratio = mine and r and r["median_ms"] / mine["median_ms"]
            else:
                v = f"{shown['tokens_per_s']:.0f}"
                ratio = mine and r and mine["tokens_per_s"] / r["tokens_per_s"]
            mem = f"{shown['peak_rss_bytes'] / 2**30:.2f}G"
            rs = f" ({ratio:.2f}x)" if ratio else ""
            cells.append(f"{v + ' ' + mem + rs:>24}")
        print(f"{s:<8}" + "".join(cells))
    if weights:
        print(f"weights file: {weights / 2**30:.2f} GiB; 1.25x = {1.25 * weights / 2**30:.2f} GiB")
    print("ratios > 1 mean recall is faster (for 1x16: peer latency / recall latency); "
          "int8 peers against recall-q8, bf16 ones against recall-bf16, the others against recall f32 "
          "(recall-bf16 and recall-q8 in brackets against recall f32"
          + ("; base-recall* columns: this recall against the baseline binary in the same dtype" if args.baseline else "")
          + ")")


if __name__ == "__main__":
    main()
