#!/usr/bin/env python3
"""Write a tiny random model with BGE-M3's exact structure, and its reference outputs.

The structure is what BAAI/bge-m3 ships, scaled down: an XLM-RoBERTa encoder
(`config.json`, `model.safetensors` and `pytorch_model.bin` with the same
weights), the two heads `colbert_linear.pt` (fp32) and `sparse_linear.pt`
(fp16, as the real one), and an XLM-R-style Unigram tokenizer with
`<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3 and `<mask>` last.

The reference outputs come from the real FlagEmbedding package
(`BGEM3FlagModel`, `use_fp16=False`, CPU) and are what recall's parity tests
compare against. Needs: torch, flagembedding==1.4.2, transformers<5,
datasets<4, sentence-transformers<5 (see scripts/dev-venv.sh).

    python scripts/make_tiny_bge_m3.py [--out models/tiny-bge-m3] [--reference tests/fixtures/tiny_bge_m3_reference.json]
"""

import argparse
import json
import os

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import XLMRobertaConfig, XLMRobertaModel

SEED = 20261202
HIDDEN = 32
MAX_POSITIONS = 258  # 256 tokens with <s> and </s>: long inputs hit the limit cheaply

CORPUS = [
    "The server ran out of disk space, so we cleaned up old docker images and logs.",
    "How do I free up space on the root partition? du -sh /var/log/* | sort -h",
    "nginx -t reports a syntax error in /etc/nginx/sites-enabled/default on line 12.",
    "The browser says ERR_CONNECTION_RESET when I open the dashboard behind the proxy.",
    "Rust's borrow checker rejects this closure because it captures a mutable reference.",
    "fn main() { let v: Vec<u32> = (0..10).collect(); println!(\"{:?}\", v); }",
    "def embed(texts): return [model.encode(t) for t in texts]  # TODO batch it",
    "SELECT id, content FROM messages WHERE session_id = ? ORDER BY timestamp;",
    "Schedule a cron job every morning at 8 to summarise my unread email.",
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.",
    "服务器磁盘空间不足，我们清理了旧的日志文件和 Docker 镜像。",
    "如何让 Hermes 的会话搜索支持语义检索？用 bge-m3 生成向量并存入 SQLite。",
    "昨天讨论的那个数据库迁移方案，后来决定用哪个了？",
    "今天天气很好，我们去公园散步吧。",
    "東京の天気はどうですか？明日は雨が降るかもしれません。",
    "서버 디스크 공간이 부족합니다. 로그를 정리하세요.",
    "Der Server hat keinen Speicherplatz mehr, bitte alte Protokolle löschen.",
    "Le serveur n'a plus d'espace disque ; supprimez les anciens journaux.",
    "El servidor se quedó sin espacio en disco.",
    "Сервер закончил место на диске, удалите старые логи.",
    "Deploy finished 🚀 all checks green ✅ see you tomorrow 👋",
    "Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 2026-12-02 v0.19.0 #42 @alice",
]


def build_tokenizer(vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.Unigram())
    # XLM-R's tokenizer.json: NMT + NFKC normalisation, runs of spaces collapsed, metaspace pre-tokenising.
    tok.normalizer = normalizers.Sequence(
        [normalizers.Nmt(), normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")]
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
        unk_token="<unk>",
        shrinking_factor=0.75,
        max_piece_length=8,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    tok.add_special_tokens(["<mask>"])
    assert [tok.token_to_id(t) for t in ["<s>", "<pad>", "</s>", "<unk>"]] == [0, 1, 2, 3]
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    return tok


def write_model(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    tok = build_tokenizer(600)
    tok.save(os.path.join(out, "tokenizer.json"))
    vocab_size = tok.get_vocab_size()
    mask_id = tok.token_to_id("<mask>")
    assert mask_id == vocab_size - 1

    specials = {
        "bos_token": "<s>",
        "cls_token": "<s>",
        "eos_token": "</s>",
        "sep_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "mask_token": {"content": "<mask>", "lstrip": True, "normalized": False, "rstrip": False, "single_word": False},
    }
    with open(os.path.join(out, "special_tokens_map.json"), "w") as f:
        json.dump(specials, f, indent=2)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(
            {"tokenizer_class": "XLMRobertaTokenizer", "model_max_length": MAX_POSITIONS - 2, **specials},
            f,
            indent=2,
        )

    config = XLMRobertaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=MAX_POSITIONS,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        hidden_act="gelu",
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    config.architectures = ["XLMRobertaModel"]
    torch.manual_seed(SEED)
    model = XLMRobertaModel(config, add_pooling_layer=True)
    # Wider than the default 0.02 init so that outputs differ visibly between inputs.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("weight") else 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.2)
    model.save_pretrained(out, safe_serialization=True)
    model.save_pretrained(out, safe_serialization=False)

    colbert = torch.nn.Linear(HIDDEN, HIDDEN)
    sparse = torch.nn.Linear(HIDDEN, 1)
    with torch.no_grad():
        colbert.weight.normal_(0.0, 0.3)
        colbert.bias.normal_(0.0, 0.1)
        sparse.weight.normal_(0.0, 0.3)
        sparse.bias.fill_(0.3)
    torch.save(colbert.state_dict(), os.path.join(out, "colbert_linear.pt"))
    torch.save({k: v.half() for k, v in sparse.state_dict().items()}, os.path.join(out, "sparse_linear.pt"))

    # sentence-transformers layout, as BAAI/bge-m3 ships it.
    os.makedirs(os.path.join(out, "1_Pooling"), exist_ok=True)
    with open(os.path.join(out, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": HIDDEN, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, f, indent=2)
    with open(os.path.join(out, "modules.json"), "w") as f:
        json.dump(
            [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
            ],
            f,
            indent=2,
        )
    with open(os.path.join(out, "sentence_bert_config.json"), "w") as f:
        json.dump({"max_seq_length": MAX_POSITIONS - 2, "do_lower_case": False}, f)
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(
            "# tiny-bge-m3\n\nRandom weights with BGE-M3's exact structure, written by "
            "`scripts/make_tiny_bge_m3.py` for recall's parity tests. Not a useful model.\n"
        )


def reference_inputs():
    long_text = " ".join(CORPUS)  # far past the 128-token limit
    return {
        "english": "The server ran out of disk space.",
        "chinese": "服务器磁盘空间不足，清理日志。",
        "emoji": "Deploy finished 🚀✅👋 🦀",
        "code": "fn main() { println!(\"{}\", 42); } // nginx -t && du -sh /var/log",
        "one_token": "a",
        "empty_string": "",
        "unknown_script": "ᚠᛇᚻ᛫ᛒᛦᚦ ꦲꦏ꧀ꦱꦫ",
        "long": " ".join(CORPUS[:4]),
        "over_limit": long_text,
        "mixed": "如何 free up space? 服务器 disk 🚀 SELECT * FROM t;",
    }


def write_reference(model_dir: str, path: str) -> None:
    from FlagEmbedding import BGEM3FlagModel

    inputs = reference_inputs()
    names = list(inputs)
    texts = [inputs[n] for n in names]
    model = BGEM3FlagModel(model_dir, use_fp16=False, devices="cpu")
    max_length = MAX_POSITIONS - 2
    # One call with every input: FlagEmbedding sorts by length and pads per
    # batch, so this is also the "batch of mixed lengths" case.
    out = model.encode(
        texts,
        batch_size=4,
        max_length=max_length,
        return_dense=True,
        return_sparse=True,
        return_colbert_vecs=True,
    )
    tokenizer = model.tokenizer
    cases = []
    for i, name in enumerate(names):
        ids = tokenizer(texts[i], truncation=True, max_length=max_length)["input_ids"]
        cases.append(
            {
                "name": name,
                "text": texts[i],
                "input_ids": ids,
                "dense": [float(x) for x in out["dense_vecs"][i]],
                "sparse": {str(k): float(v) for k, v in out["lexical_weights"][i].items()},
                "colbert": [[float(x) for x in row] for row in out["colbert_vecs"][i]],
            }
        )
    a, b = out["lexical_weights"][0], out["lexical_weights"][7]
    ca, cb = out["colbert_vecs"][0], out["colbert_vecs"][7]
    scores = {
        "pair": ["english", "long"],
        "dense": float(out["dense_vecs"][0] @ out["dense_vecs"][7]),
        "sparse": float(model.compute_lexical_matching_score(a, b)),
        "colbert": float(model.colbert_score(ca, cb)),
    }
    with open(path, "w") as f:
        json.dump(
            {
                "generator": "FlagEmbedding BGEM3FlagModel, use_fp16=False, CPU",
                "max_length": max_length,
                "cases": cases,
                "scores": scores,
            },
            f,
            indent=1,
        )


def main() -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(root, "models", "tiny-bge-m3"))
    ap.add_argument("--reference", default=os.path.join(root, "tests", "fixtures", "tiny_bge_m3_reference.json"))
    args = ap.parse_args()
    write_model(args.out)
    write_reference(args.out, args.reference)
    print(f"wrote {args.out} and {args.reference}")


if __name__ == "__main__":
    main()
