//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use recall::{Embedder, LoadOptions};

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn tiny_model_dir() -> PathBuf {
    repo_root().join("models").join("tiny-bge-m3")
}

/// A copy of the tiny model in a fresh temporary directory named
/// `tiny-bge-m3`, leaving out the files in `skip`.
pub fn tiny_model_copy(skip: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("tiny-bge-m3");
    copy_dir(&tiny_model_dir(), &dst, skip);
    (tmp, dst)
}

fn copy_dir(src: &Path, dst: &Path, skip: &[&str]) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        if skip.contains(&name.as_str()) {
            continue;
        }
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &dst.join(&name), skip);
        } else {
            std::fs::copy(entry.path(), dst.join(&name)).unwrap();
        }
    }
}

/// Loads a model with converted weights cached under `cache`.
pub fn load(dir: &Path, cache: &Path) -> anyhow::Result<Embedder> {
    Embedder::load(
        dir,
        &LoadOptions {
            cache_dir: Some(cache.to_path_buf()),
            ..Default::default()
        },
    )
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "vector lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The MiniLM directory fetched by scripts/fetch_test_models.sh. The tests
/// that need it fail (never skip) without it.
pub fn minilm_dir() -> PathBuf {
    let dir = std::env::var_os("RECALL_TEST_MINILM")
        .map(PathBuf::from)
        .expect(
            "RECALL_TEST_MINILM is not set: run the tests with scripts/test.sh, \
         or set it to the directory printed by scripts/fetch_test_models.sh",
        );
    assert!(
        dir.join("model.safetensors").is_file(),
        "RECALL_TEST_MINILM={} has no model.safetensors",
        dir.display()
    );
    dir
}
