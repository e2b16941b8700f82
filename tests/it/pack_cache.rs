//! Packed weights kept on disk (`recall_engine::packcache`): a load from the pack
//! file gives the very vectors of a load that packs, a stale or damaged
//! file is packed again, and a cache that cannot be written costs only
//! speed.

use std::path::{Path, PathBuf};

use crate::common::tiny_model_copy;
use recall_engine::{Dtype, Embedder, LoadOptions, Outputs};

const TEXTS: &[&str] = &[
    "",
    "the server ran out of space",
    "磁盘空间不足，清理一下日志",
    "fn main() { println!(\"hi\"); }",
];

fn load(model: &Path, cache: &Path, dtype: Dtype, pack_cache: bool) -> Embedder {
    Embedder::load(
        model,
        &LoadOptions {
            dtype,
            cache_dir: Some(cache.to_path_buf()),
            pack_cache,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Every output of `TEXTS`, as bits: equal only when identical.
fn outputs(embedder: &Embedder) -> Vec<Vec<u32>> {
    embedder
        .embed(TEXTS, Outputs::ALL)
        .unwrap()
        .into_iter()
        .map(|e| {
            let mut bits: Vec<u32> = e.dense.unwrap().iter().map(|v| v.to_bits()).collect();
            for (id, w) in e.sparse.unwrap() {
                bits.extend([id, w.to_bits()]);
            }
            for row in e.colbert.unwrap() {
                bits.extend(row.iter().map(|v| v.to_bits()));
            }
            bits
        })
        .collect()
}

/// The pack files under `cache`, each with its inode: a file written
/// again is another inode.
fn pack_files(cache: &Path) -> Vec<(PathBuf, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut files: Vec<_> = match std::fs::read_dir(cache.join("packed")) {
        Ok(entries) => entries
            .map(|e| e.unwrap())
            .map(|e| (e.path(), e.metadata().unwrap().ino()))
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    files
}

/// Whether `dtype`'s layers are packed on this CPU (else candle's matmul
/// runs on tensors, and there is nothing to keep).
fn packs(dtype: Dtype) -> bool {
    dtype == Dtype::Q8 || recall_engine::kernels::matmul::packed_available()
}

#[test]
fn a_mapped_pack_file_gives_the_vectors_of_packing_in_every_dtype() {
    let (_tmp, model) = tiny_model_copy(&[]);
    let cache = tempfile::tempdir().unwrap();
    for dtype in [Dtype::F32, Dtype::Bf16, Dtype::Q8] {
        let packing = load(&model, cache.path(), dtype, false);
        assert_eq!(packing.info().pack_file, None);
        let fresh = outputs(&packing);
        let before = pack_files(cache.path()).len();
        let writing = load(&model, cache.path(), dtype, true);
        let files = pack_files(cache.path());
        assert_eq!(
            files.len(),
            before + usize::from(packs(dtype)),
            "{dtype}: one pack file per dtype"
        );
        let mapping = load(&model, cache.path(), dtype, true);
        for e in [&writing, &mapping] {
            let expected = packs(dtype).then(|| files.iter().map(|f| &f.0));
            assert_eq!(
                e.info().pack_file.is_some(),
                packs(dtype),
                "{dtype}: mapped where packed"
            );
            if let (Some(mut names), Some(file)) = (expected, &e.info().pack_file) {
                assert!(names.any(|n| n == file));
            }
        }
        assert_eq!(
            fresh,
            outputs(&writing),
            "{dtype}: the load that writes the file"
        );
        assert_eq!(fresh, outputs(&mapping), "{dtype}: the load that maps it");
        assert_eq!(
            pack_files(cache.path()),
            files,
            "{dtype}: nothing written again"
        );
    }
}

#[test]
fn a_stale_or_damaged_pack_file_is_packed_again() {
    if !packs(Dtype::F32) {
        eprintln!("f32 is not packed on this CPU: only q8's pack file is tested");
    }
    let dtype = if packs(Dtype::F32) {
        Dtype::F32
    } else {
        Dtype::Q8
    };
    let (_tmp, model) = tiny_model_copy(&[]);
    let cache = tempfile::tempdir().unwrap();
    let expected = outputs(&load(&model, cache.path(), dtype, false));
    outputs(&load(&model, cache.path(), dtype, true));
    let [(file, _)] = pack_files(cache.path()).try_into().unwrap();
    let good = std::fs::read(&file).unwrap();

    // Cut short.
    std::fs::write(&file, &good[..good.len() / 2]).unwrap();
    assert_eq!(outputs(&load(&model, cache.path(), dtype, true)), expected);
    assert_eq!(std::fs::read(&file).unwrap(), good, "written again whole");

    // Its header damaged.
    let mut damaged = good.clone();
    damaged[100] ^= 0x20;
    std::fs::write(&file, &damaged).unwrap();
    assert_eq!(outputs(&load(&model, cache.path(), dtype, true)), expected);
    assert_eq!(std::fs::read(&file).unwrap(), good);

    // The weights replaced by others of the same layout: the old pack is
    // stale, and the new weights' vectors come out.
    scale_tensor(
        &model.join("model.safetensors"),
        "layer.0.intermediate.dense.weight",
        1.5,
    );
    let changed = outputs(&load(&model, cache.path(), dtype, false));
    assert_ne!(changed, expected);
    assert_eq!(outputs(&load(&model, cache.path(), dtype, true)), changed);
    assert_ne!(std::fs::read(&file).unwrap(), good, "packed again");
    assert_eq!(pack_files(cache.path()).len(), 1, "replaced, not added");
}

/// Multiplies every f32 of the tensor whose name ends in `suffix` by
/// `factor`, in place: the same layout, other weights.
fn scale_tensor(weights: &Path, suffix: &str, factor: f32) {
    let mut bytes = std::fs::read(weights).unwrap();
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    let (_, info) = header
        .as_object()
        .unwrap()
        .iter()
        .find(|(name, _)| name.ends_with(suffix))
        .unwrap();
    assert_eq!(info["dtype"], "F32");
    let at = |i: usize| 8 + len + info["data_offsets"][i].as_u64().unwrap() as usize;
    for v in bytes[at(0)..at(1)].chunks_mut(4) {
        let x = f32::from_le_bytes(v.try_into().unwrap()) * factor;
        v.copy_from_slice(&x.to_le_bytes());
    }
    std::fs::write(weights, &bytes).unwrap();
}

#[test]
fn a_cache_that_cannot_be_written_costs_only_speed() {
    let (_tmp, model) = tiny_model_copy(&[]);
    let cache = tempfile::tempdir().unwrap();
    let expected = outputs(&load(&model, cache.path(), Dtype::Q8, false));
    // `packed` is a file, so no pack file can be made under it.
    std::fs::write(cache.path().join("packed"), b"in the way").unwrap();
    let unkept = load(&model, cache.path(), Dtype::Q8, true);
    assert_eq!(unkept.info().pack_file, None);
    assert_eq!(outputs(&unkept), expected);
    assert_eq!(
        std::fs::read(cache.path().join("packed")).unwrap(),
        b"in the way"
    );
}
