//! q8 on models with outlier channels (`common::outlier_model`: the kind
//! of activations real RoBERTa-family checkpoints, BGE-M3 among them,
//! have) and without, through the `recall` binary as a user runs it, with
//! the 8-bit activations of VNNI CPUs and the 7-bit ones of the AVX2 tile:
//! its vectors against f32's, and its load-time check
//! (`recall_engine::calibrate`). The texts scored here are not the check's own
//! (`recall_engine::calibrate::TEXTS`), from which q8 also picks its outlier
//! channels.

use std::path::Path;

use crate::common::*;
use serde_json::Value;

const TEXTS: &[&str] = &[
    "nginx -t says unexpected end of file",
    "The server ran out of disk space.",
    "How do I bake sourdough bread at home?",
    "docker image prune -a freed 40GB on the build host",
    "我们讨论一下数据库从 MySQL 迁移到 PostgreSQL 的方案",
    "fn parse(line: &str) -> Result<u32, ParseIntError>",
    "ok",
    "Summarise the ERR_CONNECTION_RESET reports from the proxy",
    "The resets come from the proxy's idle timeout of 60 seconds.",
];

/// What `recall -v embed` gives for TEXTS: the dense vectors, the ColBERT
/// ones (with `colbert`), and standard error.
struct Embedded {
    dense: Vec<Vec<f32>>,
    colbert: Vec<Vec<Vec<f32>>>,
    stderr: String,
}

fn floats(v: &Value) -> Vec<f32> {
    let array = v.as_array().unwrap();
    array.iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn embed(model: &Path, cache: &Path, q8: Option<&str>, colbert: bool) -> Embedded {
    let mut cmd = recall();
    cmd.args(["-v", "embed"])
        .model(model)
        .env("RECALL_CACHE_DIR", cache);
    if let Some(kernel) = q8 {
        cmd.args(["--dtype", "q8"]).env("RECALL_Q8", kernel);
    }
    if colbert {
        cmd.arg("--colbert");
    }
    let Output { stdout, stderr, .. } = cmd.arg("--").args(TEXTS).output().assert_ok();
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    Embedded {
        dense: lines.iter().map(|v| floats(&v["dense"])).collect(),
        colbert: (lines.iter())
            .filter_map(|v| v.get("colbert"))
            .map(|c| c.as_array().unwrap().iter().map(floats).collect())
            .collect(),
        stderr,
    }
}

/// The check's lowest cosine, as q8 runs the model and with int8 in
/// every layer, from its debug line.
fn checked(stderr: &str) -> Option<(f32, f32)> {
    let line = stderr
        .lines()
        .find(|l| l.contains("q8 against f32 on this model"))?;
    let mut mins = line
        .split("cosine min ")
        .skip(1)
        .map(|at| at.split(',').next().and_then(|m| m.trim().parse().ok()));
    Some((mins.next()??, mins.next()??))
}

/// How many layers q8 runs in f32, and of how many, from its report.
fn f32_layers(stderr: &str) -> (usize, Option<usize>) {
    let Some(at) = stderr.find(" layers run in f32") else {
        return (0, None);
    };
    let words: Vec<&str> = stderr[..at].rsplit(' ').take(4).collect();
    // "… so N of its L layers run in f32"
    let parse = |w: &str| w.parse::<usize>().unwrap();
    (parse(words[3]), Some(parse(words[0])))
}

/// For each fixture and activation width: q8 against f32 on TEXTS, held to
/// the bars (every text's dense cosine ≥ 0.995, their mean ≥ 0.998, every
/// ColBERT vector ≥ 0.99), on the model as it is (where every layer runs
/// int8) and with 1 to 4 outlier channels ×10 to ×100 (where the check
/// runs the layers in f32 that int8 takes below the bars on its own
/// texts). The check is measured once per weights file, and warns when
/// most layers run in f32; a second load maps the packed layers the first
/// wrote and gives the same vectors.
fn check_on(base: &Path, colbert: bool) {
    let cache = tempfile::tempdir().unwrap();
    let mut table = Vec::new();
    let mut wrong = Vec::new();
    for (channels, factor) in [(0, 1.0), (1, 10.0), (2, 40.0), (4, 100.0)] {
        let (_tmp, model) = outlier_model(base, channels, factor);
        let f32 = embed(&model, cache.path(), None, colbert);
        // "portable" computes the 8-bit activations of VNNI CPUs; "avx2"
        // the 7-bit ones of the AVX2 tile.
        for kernel in ["portable", "avx2"] {
            let q8 = embed(&model, cache.path(), Some(kernel), colbert);
            let (measured, int8) =
                checked(&q8.stderr).unwrap_or_else(|| panic!("no check ran: {}", q8.stderr));
            let (in_f32, layers) = f32_layers(&q8.stderr);
            let warned = q8.stderr.contains("q8 saves little");
            // Int8 in every layer below the bar: layers moved, and said so.
            // Nothing moved: the plan's measure is int8's own.
            if int8 < recall_engine::calibrate::FIDELITY_BAR {
                assert!(in_f32 > 0 && layers.is_some(), "{}", q8.stderr);
            }
            if in_f32 == 0 {
                assert_eq!(measured, int8, "{}", q8.stderr);
            }
            if colbert {
                assert!(!f32.colbert.is_empty(), "no ColBERT vectors");
                let tokens = |e: &Embedded| e.colbert.iter().map(Vec::len).collect::<Vec<_>>();
                assert_eq!(tokens(&f32), tokens(&q8));
            }
            let cosines: Vec<f32> = f32
                .dense
                .iter()
                .zip(&q8.dense)
                .map(|(a, b)| dot(a, b))
                .collect();
            let min = cosines.iter().copied().fold(1f32, f32::min);
            let mean = cosines.iter().sum::<f32>() / cosines.len() as f32;
            let colbert_min = (f32.colbert.iter().flatten())
                .zip(q8.colbert.iter().flatten())
                .map(|(a, b)| dot(a, b))
                .fold(1f32, f32::min);
            let row = format!(
                "{channels} ch x{factor} {kernel}: dense min {min:.5} mean {mean:.5}, ColBERT min {colbert_min:.5}; check {measured:.5} (all int8 {int8:.5}), layers in f32 {in_f32}"
            );
            assert_eq!(warned, layers.is_some_and(|l| 2 * in_f32 > l), "{row}");
            assert!(measured >= recall_engine::calibrate::FIDELITY_BAR, "{row}");
            if min < 0.995 || mean < 0.998 || colbert_min < 0.99 || (channels == 0 && in_f32 > 0) {
                wrong.push(row.clone());
            }
            // The first load packed the layers (those in f32 included) into
            // a pack file; the second reads the check's result instead of
            // measuring again, runs the same layers in f32, and maps that
            // file.
            // (Unless nothing is packed: every layer in f32 where f32 runs on
            // candle's matmul.)
            let candle = std::env::var("RECALL_MATMUL").is_ok_and(|m| m == "candle");
            let packed = !(candle && layers == Some(in_f32));
            assert!(
                !packed || q8.stderr.contains("packed weights kept in"),
                "{}",
                q8.stderr
            );
            let again = embed(&model, cache.path(), Some(kernel), false);
            assert!(
                !packed || again.stderr.contains("packed weights read from"),
                "{}",
                again.stderr
            );
            assert_eq!(
                checked(&again.stderr),
                None,
                "measured twice: {}",
                again.stderr
            );
            assert_eq!(f32_layers(&again.stderr), (in_f32, layers));
            // From the pack file the first load wrote (layers in f32
            // included): the very same vectors.
            assert_eq!(again.dense, q8.dense, "{row}");
            table.push(row);
        }
    }
    eprintln!("{}:\n{}", base.display(), table.join("\n"));
    assert!(wrong.is_empty(), "below the bars: {wrong:#?}");
}

/// Random weights, with the ColBERT head. The check is not asked to
/// predict here: with random weights the worst text of one set says
/// little about another's.
#[test]
fn q8_holds_with_outliers_on_tiny_bge_m3() {
    check_on(&tiny_model_dir(), true);
}

/// Real weights.
#[test]
fn q8_holds_with_outliers_on_minilm() {
    check_on(&require!(minilm_dir()), false);
}

/// The layers q8 runs in f32 are part of the model's revision: an index of
/// int8 in every layer refuses vectors of another plan, and the other way
/// round.
#[test]
fn layers_in_f32_are_part_of_the_q8_revision() {
    use recall::provider::local::identity_of;
    let minilm = require!(minilm_dir());
    let cache = tempfile::tempdir().unwrap();
    let (_tmp, model) = outlier_model(&minilm, 2, 40.0);
    let q8 = load_q8(&model, cache.path()).unwrap();
    let plan = &q8.info().q8.as_ref().unwrap().plan;
    assert!(!plan.f32_layers.is_empty(), "{plan:?}");
    let tag = recall_engine::kernels::quant::Q8Kernel::get().revision_tag();
    let layers: Vec<String> = plan.f32_layers.iter().map(|l| l.to_string()).collect();
    let planned = identity_of(&q8, None);
    assert!(
        planned
            .revision
            .ends_with(&format!("+{tag}-f32:{}", layers.join(","))),
        "{}",
        planned.revision
    );
    // An index of one plan refuses the vectors of another (here: int8 in
    // every layer), and the other way round.
    let mut int8 = planned.clone();
    int8.revision = int8.revision.split("-f32:").next().unwrap().to_string();
    assert!(!planned.accepts(&int8) && !int8.accepts(&planned));
    let shipped = load_q8(&minilm, cache.path()).unwrap();
    let plain = identity_of(&shipped, None);
    assert!(
        plain.revision.ends_with(&format!("+{tag}")),
        "{}",
        plain.revision
    );
    assert!(
        shipped
            .info()
            .q8
            .as_ref()
            .unwrap()
            .plan
            .f32_layers
            .is_empty()
    );
}
