//! recall's BGE-M3 outputs against FlagEmbedding's, on the tiny random model
//! with BGE-M3's exact structure (models/tiny-bge-m3, written with its
//! reference by scripts/make_tiny_bge_m3.py).

use std::collections::BTreeMap;

use crate::common::*;
use recall_engine::{Embedder, LoadOptions, Outputs, score};
use serde::Deserialize;

const TOLERANCE: f32 = 1e-5;

#[derive(Deserialize)]
struct Reference {
    max_length: usize,
    cases: Vec<Case>,
    scores: Scores,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    text: String,
    input_ids: Vec<u32>,
    dense: Vec<f32>,
    sparse: BTreeMap<String, f32>,
    colbert: Vec<Vec<f32>>,
}

#[derive(Deserialize)]
struct Scores {
    pair: (String, String),
    dense: f32,
    sparse: f32,
    colbert: f32,
}

fn reference() -> Reference {
    let path = repo_root().join("tests/fixtures/tiny_bge_m3_reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every output of every case within the tolerance, and the same token ids.
fn assert_matches_reference(embedder: &Embedder, reference: &Reference) {
    let texts: Vec<&str> = reference.cases.iter().map(|c| c.text.as_str()).collect();
    let tokens = embedder.tokenize(&texts).unwrap();
    let got = embedder.embed(&texts, Outputs::ALL).unwrap();
    for ((case, tokens), e) in reference.cases.iter().zip(&tokens).zip(&got) {
        let name = &case.name;
        assert_eq!(
            tokens.ids, case.input_ids,
            "{name}: token ids differ from the HF tokenizer's"
        );
        assert_eq!(e.tokens, case.input_ids.len(), "{name}");
        assert_eq!(e.truncated, name == "over_limit", "{name}: truncation flag");

        let dense = e.dense.as_ref().unwrap();
        let diff = max_abs_diff(dense, &case.dense);
        assert!(diff <= TOLERANCE, "{name}: dense differs by {diff}");

        let sparse = e.sparse.as_ref().unwrap();
        let want: BTreeMap<u32, f32> = case
            .sparse
            .iter()
            .map(|(k, v)| (k.parse().unwrap(), *v))
            .collect();
        assert_eq!(
            sparse.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "{name}: sparse token ids"
        );
        for (id, w) in &want {
            let d = (sparse[id] - w).abs();
            assert!(
                d <= TOLERANCE,
                "{name}: sparse weight of {id} differs by {d}"
            );
        }

        let colbert = e.colbert.as_ref().unwrap();
        assert_eq!(
            colbert.len(),
            case.colbert.len(),
            "{name}: ColBERT vector count"
        );
        assert_eq!(
            colbert.len(),
            case.input_ids.len() - 1,
            "{name}: one vector per token after <s>"
        );
        for (i, (a, b)) in colbert.iter().zip(&case.colbert).enumerate() {
            let d = max_abs_diff(a, b);
            assert!(d <= TOLERANCE, "{name}: ColBERT vector {i} differs by {d}");
        }
    }
}

#[test]
fn safetensors_matches_flagembedding() {
    let reference = reference();
    let (_tmp, dir) = tiny_model_copy(&["pytorch_model.bin"]);
    let cache = tempfile::tempdir().unwrap();
    let embedder = load(&dir, cache.path()).unwrap();
    assert_eq!(embedder.info().max_length, reference.max_length);
    assert!(!embedder.info().converted);
    assert_eq!(embedder.info().weights, dir.join("model.safetensors"));
    assert_matches_reference(&embedder, &reference);
}

#[test]
fn pytorch_bin_matches_flagembedding_and_is_converted_once() {
    let reference = reference();
    let (_tmp, dir) = tiny_model_copy(&["model.safetensors"]);
    let cache = tempfile::tempdir().unwrap();
    let first = load(&dir, cache.path()).unwrap();
    assert!(
        first.info().converted,
        "the first load converts pytorch_model.bin"
    );
    assert!(first.info().weights.starts_with(cache.path()));
    assert_matches_reference(&first, &reference);
    let second = load(&dir, cache.path()).unwrap();
    assert!(
        !second.info().converted,
        "later loads memory-map the converted copy"
    );
    assert_eq!(second.info().weights, first.info().weights);
    assert_matches_reference(&second, &reference);
}

#[test]
fn packing_does_not_change_results() {
    let reference = reference();
    let cache = tempfile::tempdir().unwrap();
    let texts: Vec<&str> = reference.cases.iter().map(|c| c.text.as_str()).collect();
    let packed = load(&tiny_model_dir(), cache.path())
        .unwrap()
        .embed(&texts, Outputs::ALL)
        .unwrap();
    let alone = load_one_at_a_time(&tiny_model_dir(), cache.path())
        .unwrap()
        .embed(&texts, Outputs::ALL)
        .unwrap();
    for (a, b) in packed.iter().zip(&alone) {
        assert!(max_abs_diff(a.dense.as_ref().unwrap(), b.dense.as_ref().unwrap()) <= 1e-6);
        assert_eq!(
            a.sparse.as_ref().unwrap().len(),
            b.sparse.as_ref().unwrap().len()
        );
    }
    // Outputs asked for separately are the same as all at once.
    let embedder = load(&tiny_model_dir(), cache.path()).unwrap();
    let dense_only = embedder.embed(&texts, Outputs::DENSE).unwrap();
    assert!(
        dense_only
            .iter()
            .all(|e| e.sparse.is_none() && e.colbert.is_none())
    );
    assert_eq!(dense_only[3].dense, packed[3].dense);
}

#[test]
fn scores_match_flagembedding() {
    let reference = reference();
    let cache = tempfile::tempdir().unwrap();
    let embedder = load(&tiny_model_dir(), cache.path()).unwrap();
    let text = |name: &str| {
        reference
            .cases
            .iter()
            .find(|c| c.name == name)
            .unwrap()
            .text
            .clone()
    };
    let (a, b) = &reference.scores.pair;
    let got = embedder.embed(&[text(a), text(b)], Outputs::ALL).unwrap();
    let dense = score::dense(
        got[0].dense.as_ref().unwrap(),
        got[1].dense.as_ref().unwrap(),
    );
    let sparse = score::lexical(
        got[0].sparse.as_ref().unwrap(),
        got[1].sparse.as_ref().unwrap(),
    );
    let colbert = score::colbert(
        got[0].colbert.as_ref().unwrap(),
        got[1].colbert.as_ref().unwrap(),
    );
    assert!(
        (dense - reference.scores.dense).abs() <= TOLERANCE,
        "dense {dense} vs {}",
        reference.scores.dense
    );
    assert!(
        reference.scores.sparse > 0.0,
        "the fixture pair shares tokens"
    );
    assert!(
        (sparse - reference.scores.sparse).abs() <= TOLERANCE,
        "sparse {sparse} vs {}",
        reference.scores.sparse
    );
    assert!(
        (colbert - reference.scores.colbert).abs() <= TOLERANCE,
        "colbert {colbert} vs {}",
        reference.scores.colbert
    );
}

#[test]
fn explicit_max_length_truncates_and_reports() {
    let cache = tempfile::tempdir().unwrap();
    let options = LoadOptions {
        max_length: Some(8),
        cache_dir: Some(cache.path().into()),
        ..Default::default()
    };
    let embedder = Embedder::load(&tiny_model_dir(), &options).unwrap();
    let got = embedder
        .embed(&["a", "The server ran out of disk space."], Outputs::ALL)
        .unwrap();
    assert!(!got[0].truncated);
    assert!(got[1].truncated);
    assert_eq!(got[1].tokens, 8);
    assert_eq!(got[1].colbert.as_ref().unwrap().len(), 7);
    let too_long = LoadOptions {
        max_length: Some(100_000),
        ..options
    };
    let err = Embedder::load(&tiny_model_dir(), &too_long).err().unwrap();
    assert!(
        format!("{err:#}").contains("more than the model's limit of 256"),
        "{err:#}"
    );
}

#[test]
fn embedder_is_shared_across_threads() {
    let cache = tempfile::tempdir().unwrap();
    let embedder = load(&tiny_model_dir(), cache.path()).unwrap();
    let single = embedder
        .embed(&["服务器磁盘空间不足"], Outputs::DENSE)
        .unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    embedder
                        .embed(&["服务器磁盘空间不足", "another text"], Outputs::DENSE)
                        .unwrap()
                })
            })
            .collect();
        for h in handles {
            assert!(
                max_abs_diff(
                    h.join().unwrap()[0].dense.as_ref().unwrap(),
                    single[0].dense.as_ref().unwrap()
                ) <= 1e-6
            );
        }
    });
}

/// `--dtype q8`: every output stays close to FlagEmbedding's f32 ones on
/// the tiny model. Measured with 8-bit activations (AVX-512 VNNI, other
/// CPUs): dense ≥ 0.9998 cosine, ColBERT ≥ 0.9994; with the 7-bit
/// activations of AVX2 CPUs (`RECALL_Q8=avx2`): 0.9993 and 0.9988.
#[test]
fn q8_stays_close_to_flagembedding() {
    let reference = reference();
    let cache = tempfile::tempdir().unwrap();
    let embedder = load_q8(&tiny_model_dir(), cache.path()).unwrap();
    assert_eq!(embedder.info().dtype, recall_engine::Dtype::Q8);
    let (dense_min, colbert_min) = closeness(&embedder, &reference);
    println!(
        "q8 vs FlagEmbedding f32 on the tiny model: dense cosine ≥ {dense_min:.5}, ColBERT ≥ {colbert_min:.5}"
    );
    let (dense_bar, colbert_bar) =
        match recall_engine::kernels::quant::Q8Kernel::get().activation_levels() {
            255 => (0.9995, 0.999),
            _ => (0.999, 0.998),
        };
    assert!(dense_min >= dense_bar, "dense cosine {dense_min}");
    assert!(colbert_min >= colbert_bar, "ColBERT cosine {colbert_min}");

    // An index keeps to one of f32 and q8: they are different revisions.
    use recall::provider::local::identity_of;
    let f32_engine = load(&tiny_model_dir(), cache.path()).unwrap();
    let (q8, f32) = (identity_of(&embedder, None), identity_of(&f32_engine, None));
    let tag = recall_engine::kernels::quant::Q8Kernel::get().revision_tag();
    assert_eq!(q8.revision, format!("{}+{tag}", f32.revision));
    assert!(!f32.accepts(&q8) && !q8.accepts(&f32));
    assert!(f32.differences(&q8).iter().any(|d| d.contains("+q8")));
}

/// `--dtype bf16`: every output within the bars of docs/bf16.md of
/// FlagEmbedding's f32 ones on the tiny model (dense ≥ 0.9995 cosine,
/// ColBERT ≥ 0.999, the heaviest lexical token of each text kept), on
/// whichever bf16 kernel this CPU runs (`RECALL_BF16=widen` and
/// `RECALL_MATMUL` force the others). Its vectors share f32's space: an
/// index takes either.
#[test]
fn bf16_stays_close_to_flagembedding() {
    let reference = reference();
    let cache = tempfile::tempdir().unwrap();
    let embedder = load_as(&tiny_model_dir(), cache.path(), recall_engine::Dtype::Bf16).unwrap();
    assert_eq!(embedder.info().dtype, recall_engine::Dtype::Bf16);
    let (dense_min, colbert_min) = closeness(&embedder, &reference);
    println!(
        "bf16 ({:?}) vs FlagEmbedding f32 on the tiny model: dense cosine ≥ {dense_min:.6}, ColBERT ≥ {colbert_min:.6}",
        recall_engine::kernels::bf16::Bf16Kernel::get()
    );
    assert!(dense_min >= 0.9995, "dense cosine {dense_min}");
    assert!(colbert_min >= 0.999, "ColBERT cosine {colbert_min}");

    use recall::provider::local::identity_of;
    let f32_engine = load(&tiny_model_dir(), cache.path()).unwrap();
    let (bf16, f32) = (identity_of(&embedder, None), identity_of(&f32_engine, None));
    assert_eq!(bf16, f32);
    assert!(f32.accepts(&bf16) && bf16.accepts(&f32));
}

/// The lowest dense and ColBERT cosines of `embedder`'s outputs to the
/// reference's; panics if a text's heaviest lexical token is lost.
fn closeness(embedder: &Embedder, reference: &Reference) -> (f32, f32) {
    let texts: Vec<&str> = reference.cases.iter().map(|c| c.text.as_str()).collect();
    let got = embedder.embed(&texts, Outputs::ALL).unwrap();
    let (mut dense_min, mut colbert_min) = (f32::MAX, f32::MAX);
    for (case, e) in reference.cases.iter().zip(&got) {
        let dense = score::dense(e.dense.as_ref().unwrap(), &case.dense);
        dense_min = dense_min.min(dense);
        for (a, b) in e.colbert.as_ref().unwrap().iter().zip(&case.colbert) {
            colbert_min = colbert_min.min(score::dense(a, b));
        }
        let sparse = e.sparse.as_ref().unwrap();
        let heaviest = case
            .sparse
            .iter()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(id, _)| id.parse::<u32>().unwrap());
        if let Some(id) = heaviest {
            assert!(
                sparse.contains_key(&id),
                "{}: the heaviest lexical token {id} is lost",
                case.name
            );
        }
    }
    (dense_min, colbert_min)
}
