//! q8's check at load (`recall::calibrate`), on models with outlier
//! channels (`common::outlier_model`: the kind of activations real
//! RoBERTa-family checkpoints, BGE-M3 among them, have) and without,
//! through the `recall` binary as a user runs it, on the 8-bit weights of
//! VNNI CPUs and the 7-bit ones of the AVX2 tile. The texts scored here are
//! not the check's own (`recall::calibrate::TEXTS`).

mod common;

use std::path::Path;

use common::*;
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

/// `recall -v embed` on TEXTS: the dense vectors and standard error.
fn embed(model: &Path, cache: &Path, q8: Option<&str>) -> (Vec<Vec<f32>>, String) {
    let mut args = vec!["-v", "embed", "--model", model.to_str().unwrap()];
    if q8.is_some() {
        args.extend(["--dtype", "q8"]);
    }
    args.push("--");
    args.extend_from_slice(TEXTS);
    let mut envs = vec![("RECALL_CACHE_DIR", cache.to_str().unwrap())];
    envs.extend(q8.map(|k| ("RECALL_Q8", k)));
    let (code, out, err) = recall_env(&args, &envs);
    assert_eq!(code, 0, "{err}");
    let vectors = out
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap();
            v["dense"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect();
    (vectors, err)
}

/// The check's lowest cosine, from its debug line.
fn checked(stderr: &str) -> Option<f32> {
    let line = stderr
        .lines()
        .find(|l| l.contains("q8 against f32 on this model"))?;
    let at = line.find("cosine min ")? + "cosine min ".len();
    line[at..].split(',').next()?.trim().parse().ok()
}

/// For each fixture and weight width: the check's verdict, and q8's lowest
/// cosine to f32 on TEXTS. The check warns exactly when its own
/// measurement is below the bar, is measured once per weights file, and
/// (`predicts`) warns wherever q8 falls below 0.99 on texts it never saw.
fn check_on(base: &Path, predicts: bool, quiet_unmodified: bool) {
    let cache = tempfile::tempdir().unwrap();
    let mut table = Vec::new();
    let mut wrong = Vec::new();
    for (channels, factor) in [(0, 1.0), (1, 10.0), (2, 40.0), (4, 100.0)] {
        let (_tmp, model) = outlier_model(base, channels, factor);
        let (f32, _) = embed(&model, cache.path(), None);
        // "portable" computes the 8-bit weights of VNNI CPUs; "avx2" the
        // 7-bit ones of the AVX2 tile.
        for kernel in ["portable", "avx2"] {
            let (q8, err) = embed(&model, cache.path(), Some(kernel));
            let measured = checked(&err).unwrap_or_else(|| panic!("no check ran: {err}"));
            let warned = err.contains("int8 vectors reach only");
            let min = f32
                .iter()
                .zip(&q8)
                .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>())
                .fold(1f32, f32::min);
            let row = format!(
                "{channels} ch x{factor} {kernel}: check {measured:.5} warned {warned}, q8 on the texts {min:.5}"
            );
            assert_eq!(warned, measured < recall::calibrate::FIDELITY_BAR, "{row}");
            if (predicts && !warned && min < 0.99) || (quiet_unmodified && channels == 0 && warned)
            {
                wrong.push(row.clone());
            }
            table.push(row);
            // The second load reads the result instead of measuring again.
            let (_, again) = embed(&model, cache.path(), Some(kernel));
            assert_eq!(checked(&again), None, "measured twice: {again}");
            assert_eq!(again.contains("int8 vectors reach only"), warned);
        }
    }
    eprintln!("{}:\n{}", base.display(), table.join("\n"));
    assert!(wrong.is_empty(), "the check misjudged: {wrong:#?}");
}

/// Random weights: q8 holds on the model as it is, and the check stays
/// quiet there. Its outlier fixtures are not asserted on: with random
/// weights the worst text of one set says little about another's (on
/// 4 channels x100 with 8-bit weights the check read 0.9987 while one
/// scored text fell to 0.96).
#[test]
fn the_q8_check_on_tiny_bge_m3() {
    check_on(&tiny_model_dir(), false, true);
}

/// Real weights: wherever q8 falls below 0.99 on the scored texts, with or
/// without outliers, the check has warned.
#[test]
fn the_q8_check_on_minilm() {
    check_on(&minilm_dir(), true, false);
}
