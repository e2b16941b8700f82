//! Reading tensors from `model.safetensors` (memory-mapped) and PyTorch
//! checkpoints (`pytorch_model.bin`, `*.pt`), with every error naming the file.
//!
//! Tensors are copied out of the map into f32 tensors, and each copied range
//! of the map is released at once, so loading peaks near one copy of the
//! weights rather than two. A table read a few rows at a time (the word
//! embeddings) can instead stay in the map (`Weights::mapped_f32`).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use candle_core::{DType, Device, Tensor};
use memmap2::Mmap;
use safetensors::SafeTensors;

enum Source {
    Safetensors {
        map: Arc<Mmap>,
        tensors: HashMap<String, SafeInfo>,
    },
    Pth(candle_core::pickle::PthTensors),
}

struct SafeInfo {
    dtype: DType,
    shape: Vec<usize>,
    /// Byte range inside the map.
    range: (usize, usize),
}

/// A file of named tensors.
pub struct Weights {
    path: PathBuf,
    source: Source,
    /// Prefix that the checkpoint puts before every name (`roberta.`, `bert.`), if any.
    prefix: String,
}

impl Weights {
    /// Opens a `.safetensors` file (memory-mapped) or a PyTorch checkpoint.
    pub fn open(path: &Path) -> Result<Self> {
        let is_safetensors = path.extension().is_some_and(|e| e == "safetensors");
        let source = if is_safetensors {
            open_safetensors(path)?
        } else {
            let pth = candle_core::pickle::PthTensors::new(path, None).map_err(|e| {
                anyhow::anyhow!("{}: not a readable PyTorch checkpoint: {e}", path.display())
            })?;
            Source::Pth(pth)
        };
        Ok(Self {
            path: path.to_path_buf(),
            source,
            prefix: String::new(),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A safetensors file's header (its length and JSON: every tensor's
    /// name, type, shape and place), which changes with any change of
    /// layout; `None` for a PyTorch checkpoint.
    pub fn safetensors_header(&self) -> Option<&[u8]> {
        let Source::Safetensors { map, .. } = &self.source else {
            return None;
        };
        let len = u64::from_le_bytes(map.get(..8)?.try_into().ok()?);
        map.get(..8 + usize::try_from(len).ok()?)
    }

    fn contains(&self, name: &str) -> bool {
        match &self.source {
            Source::Safetensors { tensors, .. } => tensors.contains_key(name),
            Source::Pth(p) => p.tensor_infos().contains_key(name),
        }
    }

    /// Finds the prefix under which `probe` is stored (`""`, `roberta.`,
    /// `bert.`, `model.`), so that `get` can use the bare names.
    pub fn detect_prefix(&mut self, probe: &str) -> Result<()> {
        for prefix in ["", "roberta.", "bert.", "model.", "xlm_roberta."] {
            if self.contains(&format!("{prefix}{probe}")) {
                self.prefix = prefix.to_string();
                return Ok(());
            }
        }
        bail!(
            "{}: no tensor `{probe}`; this is not a BERT or XLM-RoBERTa checkpoint",
            self.path.display()
        )
    }

    /// The tensor `name` as f32 on `device`, checked to have `shape`.
    pub fn get(&self, name: &str, shape: &[usize], device: &Device) -> Result<Tensor> {
        let full = format!("{}{name}", self.prefix);
        let tensor = match &self.source {
            Source::Safetensors { map, tensors } => {
                let info = tensors
                    .get(&full)
                    .with_context(|| format!("{}: missing tensor `{full}`", self.path.display()))?;
                check_shape(&self.path, &full, &info.shape, shape)?;
                let (start, end) = info.range;
                let t = Tensor::from_raw_buffer(
                    &map[start..end],
                    info.dtype,
                    &info.shape,
                    &Device::Cpu,
                )
                .and_then(|t| t.to_dtype(DType::F32))
                .with_context(|| format!("{}: cannot read tensor `{full}`", self.path.display()))?;
                release(map, start, end);
                t
            }
            Source::Pth(pth) => {
                let t = pth
                    .get(&full)
                    .with_context(|| {
                        format!("{}: cannot read tensor `{full}`", self.path.display())
                    })?
                    .with_context(|| format!("{}: missing tensor `{full}`", self.path.display()))?;
                check_shape(&self.path, &full, t.dims(), shape)?;
                t.to_dtype(DType::F32)?
            }
        };
        Ok(tensor.to_device(device)?)
    }

    /// `f` of the tensor `name` as f32 data (row-major), checked to have
    /// `shape`: straight from the map where the file holds aligned
    /// little-endian f32 (then those pages are released), else from a
    /// converted copy (`get`). For weights that are repacked at load, so
    /// no tensor-sized copy comes first.
    pub fn with_f32<T>(
        &self,
        name: &str,
        shape: &[usize],
        f: impl FnOnce(&[f32]) -> T,
    ) -> Result<T> {
        if let Some(mapped) = self.mapped_f32(name, shape)? {
            let out = f(mapped.data());
            release(&mapped.map, mapped.start, mapped.end);
            return Ok(out);
        }
        let t = self.get(name, shape, &Device::Cpu)?.flatten_all()?;
        Ok(f(&t.to_vec1::<f32>()?))
    }

    /// The tensor `name`, checked to have `shape`, left in the map, where
    /// the file holds it as aligned little-endian f32; else `None` (a
    /// PyTorch checkpoint, another dtype: use `get`). The map stays open as
    /// long as the result lives.
    pub fn mapped_f32(&self, name: &str, shape: &[usize]) -> Result<Option<MappedF32>> {
        let Source::Safetensors { map, tensors } = &self.source else {
            return Ok(None);
        };
        let full = format!("{}{name}", self.prefix);
        let info = tensors
            .get(&full)
            .with_context(|| format!("{}: missing tensor `{full}`", self.path.display()))?;
        check_shape(&self.path, &full, &info.shape, shape)?;
        let (start, end) = info.range;
        let aligned = (map.as_ptr() as usize + start).is_multiple_of(std::mem::align_of::<f32>());
        let usable = info.dtype == DType::F32 && cfg!(target_endian = "little") && aligned;
        Ok(usable.then(|| MappedF32 {
            map: Arc::clone(map),
            start,
            end,
        }))
    }

    /// The shape of `name`, if the file has it.
    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        let full = format!("{}{name}", self.prefix);
        match &self.source {
            Source::Safetensors { tensors, .. } => tensors.get(&full).map(|i| i.shape.clone()),
            Source::Pth(p) => p
                .tensor_infos()
                .get(&full)
                .map(|i| i.layout.dims().to_vec()),
        }
    }
}

fn check_shape(path: &Path, name: &str, found: &[usize], expected: &[usize]) -> Result<()> {
    if found != expected {
        bail!(
            "{}: tensor `{name}` has shape {found:?}, but the config needs {expected:?}",
            path.display()
        );
    }
    Ok(())
}

fn open_safetensors(path: &Path) -> Result<Source> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: the map is read-only, and recall replaces a model file only
    // by renaming a new one into place (`MappedF32`), never writing where
    // it may be mapped; another process truncating or rewriting it would
    // break the map, the risk every mmap-based model loader takes.
    let map =
        unsafe { Mmap::map(&file) }.with_context(|| format!("cannot map {}", path.display()))?;
    let parsed = SafeTensors::deserialize(&map).map_err(|e| {
        anyhow::anyhow!(
            "{}: not a valid safetensors file (truncated or corrupt?): {e}",
            path.display()
        )
    })?;
    let mut tensors = HashMap::new();
    for (name, view) in parsed.tensors() {
        let dtype = match view.dtype() {
            safetensors::Dtype::F32 => DType::F32,
            safetensors::Dtype::F16 => DType::F16,
            safetensors::Dtype::BF16 => DType::BF16,
            safetensors::Dtype::F64 => DType::F64,
            // Integer buffers (e.g. `position_ids`) are never read as weights.
            _ => continue,
        };
        let start = view.data().as_ptr() as usize - map.as_ptr() as usize;
        tensors.insert(
            name,
            SafeInfo {
                dtype,
                shape: view.shape().to_vec(),
                range: (start, start + view.data().len()),
            },
        );
    }
    Ok(Source::Safetensors {
        map: Arc::new(map),
        tensors,
    })
}

/// An f32 tensor's data inside a weights file's map (`Weights::mapped_f32`).
/// The map lives as long as this does, the process's life for the word
/// embeddings: recall replaces model files only by renaming a new file into
/// place (conversion, import), so a running process keeps reading the file
/// it opened.
pub struct MappedF32 {
    map: Arc<Mmap>,
    start: usize,
    end: usize,
}

impl MappedF32 {
    /// The tensor's floats, row-major.
    pub fn data(&self) -> &[f32] {
        // SAFETY: any 4 bytes are a valid f32; `mapped_f32` checked that
        // the range is aligned, and its length is whole f32s (safetensors
        // checks each tensor's byte length against its shape and dtype).
        let (_, data, _) = unsafe { self.map[self.start..self.end].align_to::<f32>() };
        data
    }
}

/// Tells the kernel that the copied pages of the map are no longer needed,
/// so they stop counting towards the process's memory.
fn release(map: &Mmap, start: usize, end: usize) {
    let page = page_size();
    let first = start.div_ceil(page) * page;
    let last = end / page * page;
    if last > first {
        // SAFETY: the map is private and read-only; dropped pages are read
        // again from the file if anything touches them later.
        let _ = unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, last - first)
        };
    }
}

/// The system's page size (4 KiB on most Linux machines, 16 KiB on Apple
/// Silicon and some Arm Linux kernels, 64 KiB on others): only whole pages
/// inside a range can be released.
fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf reads a constant of the system.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(page)
            .ok()
            .filter(|&p| p > 0)
            .unwrap_or(64 << 10)
    })
}

/// Writes every tensor of a PyTorch checkpoint into a safetensors file,
/// atomically (a temporary file renamed into place). `progress` gets
/// (tensors read, tensors in all).
pub fn convert_pth_to_safetensors(
    src: &Path,
    dst: &Path,
    mut progress: impl FnMut(usize, usize),
) -> Result<()> {
    let unreadable = |e: candle_core::Error| {
        anyhow::anyhow!("{}: not a readable PyTorch checkpoint: {e}", src.display())
    };
    let pth = candle_core::pickle::PthTensors::new(src, None).map_err(unreadable)?;
    let mut names: Vec<&String> = pth.tensor_infos().keys().collect();
    if names.is_empty() {
        bail!("{}: the checkpoint holds no tensors", src.display());
    }
    names.sort();
    let mut map = HashMap::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let tensor = pth
            .get(name)
            .map_err(unreadable)?
            .with_context(|| format!("{}: lost tensor `{name}`", src.display()))?;
        map.insert(name.to_string(), tensor);
        progress(i + 1, names.len());
    }
    let dir = dst
        .parent()
        .context("conversion target has no parent directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = dst.with_extension(format!("tmp{}", std::process::id()));
    candle_core::safetensors::save(&map, &tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, dst).with_context(|| format!("cannot move into {}", dst.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors file of one `[2, 3]` tensor of `dtype` holding 0..6.
    fn one_tensor(dir: &Path, dtype: safetensors::Dtype) -> PathBuf {
        let data: Vec<u8> = match dtype {
            safetensors::Dtype::F32 => (0..6).flat_map(|v| (v as f32).to_le_bytes()).collect(),
            _ => (0..6)
                .flat_map(|v| half::f16::from_f32(v as f32).to_le_bytes())
                .collect(),
        };
        let view = safetensors::tensor::TensorView::new(dtype, vec![2, 3], &data).unwrap();
        let path = dir.join(format!("{dtype:?}.safetensors"));
        safetensors::serialize_to_file([("t", view)], None, &path).unwrap();
        path
    }

    #[test]
    fn f32_stays_in_the_map_and_other_dtypes_are_converted() {
        let dir = tempfile::tempdir().unwrap();
        let want: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let f32s = Weights::open(&one_tensor(dir.path(), safetensors::Dtype::F32)).unwrap();
        let mapped = f32s
            .mapped_f32("t", &[2, 3])
            .unwrap()
            .expect("f32 is mapped");
        assert_eq!(mapped.data(), want);
        assert!(
            f32s.mapped_f32("t", &[3, 2]).is_err(),
            "a wrong shape is an error"
        );
        let f16s = Weights::open(&one_tensor(dir.path(), safetensors::Dtype::F16)).unwrap();
        assert!(f16s.mapped_f32("t", &[2, 3]).unwrap().is_none());
        let t = f16s.get("t", &[2, 3], &Device::Cpu).unwrap();
        assert_eq!(t.flatten_all().unwrap().to_vec1::<f32>().unwrap(), want);
        drop(f32s);
        assert_eq!(mapped.data(), want, "the map outlives its `Weights`");
    }
}
