//! A model directory in Hugging Face layout, checked and opened: its
//! configuration, its weights, and the safetensors copy of a PyTorch
//! checkpoint. Where the directory comes from (a path, the hub cache, a
//! download) is the application's business, not the engine's.

pub mod config;
pub mod weights;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

pub use config::{Architecture, EncoderConfig, Pooling, SentenceConfig};
pub use weights::Weights;

/// BGE-M3's two extra heads, stored beside the encoder.
pub const COLBERT_HEAD: &str = "colbert_linear.pt";
pub const SPARSE_HEAD: &str = "sparse_linear.pt";

/// The files of one model directory, found and checked, not yet loaded.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    pub dir: PathBuf,
    pub encoder: EncoderConfig,
    pub sentence: SentenceConfig,
    pub tokenizer: PathBuf,
    /// The weights as the directory ships them.
    pub weights: PathBuf,
    /// `Some` for a BGE-M3 model: (colbert_linear.pt, sparse_linear.pt).
    pub heads: Option<(PathBuf, PathBuf)>,
}

impl ModelFiles {
    pub fn inspect(dir: &Path) -> Result<Self> {
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            bail!(
                "{}: missing config.json; is this a Hugging Face model directory?",
                dir.display()
            );
        }
        let encoder = EncoderConfig::from_file(&config_path)?;
        let sentence = SentenceConfig::from_dir(dir)?;
        let tokenizer = dir.join("tokenizer.json");
        if !tokenizer.is_file() {
            bail!("{}: missing tokenizer.json", dir.display());
        }
        let weights = ["model.safetensors", "pytorch_model.bin"]
            .iter()
            .map(|f| dir.join(f))
            .find(|p| p.is_file())
            .with_context(|| {
                format!(
                    "{}: no weights (model.safetensors or pytorch_model.bin)",
                    dir.display()
                )
            })?;
        let colbert = dir.join(COLBERT_HEAD);
        let sparse = dir.join(SPARSE_HEAD);
        let heads = match (colbert.is_file(), sparse.is_file()) {
            (true, true) => Some((colbert, sparse)),
            (false, false) if !looks_like_bge_m3(dir) => None,
            (has_colbert, _) => {
                let missing = if has_colbert {
                    SPARSE_HEAD
                } else {
                    COLBERT_HEAD
                };
                bail!(
                    "{}: missing {missing}; a BGE-M3 model needs both {COLBERT_HEAD} and {SPARSE_HEAD} \
                     (recall never runs BGE-M3 with random heads)",
                    dir.display()
                )
            }
        };
        if heads.is_some() && encoder.architecture != Architecture::XlmRoberta {
            bail!(
                "{}: BGE-M3 heads beside a {} encoder; expected xlm-roberta",
                dir.display(),
                encoder.model_type
            );
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            encoder,
            sentence,
            tokenizer,
            weights,
            heads,
        })
    }

    /// The longest input (special tokens included) the model takes.
    pub fn max_tokens(&self) -> usize {
        let limit = self.encoder.max_tokens();
        self.sentence.max_seq_length.map_or(limit, |n| n.min(limit))
    }

    /// The weights to memory-map: the directory's `model.safetensors`, or a
    /// safetensors copy of `pytorch_model.bin` in recall's cache, written on
    /// first use. Returns the path and whether a conversion ran now.
    pub fn safetensors_weights(
        &self,
        cache_dir: &Path,
        progress: impl FnMut(usize, usize),
    ) -> Result<(PathBuf, bool)> {
        if self.weights.extension().is_some_and(|e| e == "safetensors") {
            return Ok((self.weights.clone(), false));
        }
        let cached = converted_path(&self.weights, cache_dir)?;
        if cached.is_file() {
            // The size is checked at every start (free); the hash by `recall model verify`.
            match ConvertedRecord::read(&cached) {
                Some(record) if record.size == std::fs::metadata(&cached)?.len() => {
                    return Ok((cached, false));
                }
                _ => tracing::warn!(
                    "{}: not the copy that was converted (its size or record differs): converting again",
                    cached.display()
                ),
            }
        }
        let started = Instant::now();
        tracing::info!(
            "converting {} to safetensors in {} (once; later starts memory-map it)",
            self.weights.display(),
            cached.display()
        );
        weights::convert_pth_to_safetensors(&self.weights, &cached, progress)?;
        ConvertedRecord::write(&cached)?;
        tracing::info!("converted in {:.1}s", started.elapsed().as_secs_f64());
        Ok((cached, true))
    }

    /// For `recall model verify`: the converted copy, if this model runs
    /// from one, checked against the SHA-256 recorded when it was written.
    /// A copy that does not match is removed, so that the next start
    /// converts the checkpoint again. None when the model needs no copy or
    /// none was made yet.
    pub fn verify_converted(
        &self,
        cache_dir: &Path,
    ) -> Result<Option<(PathBuf, Result<(), String>)>> {
        if self.weights.extension().is_some_and(|e| e == "safetensors") {
            return Ok(None);
        }
        let cached = converted_path(&self.weights, cache_dir)?;
        if !cached.is_file() {
            return Ok(None);
        }
        let verdict = match ConvertedRecord::read(&cached) {
            None => Err("no record of its SHA-256".to_string()),
            Some(record) => {
                let sha = sha256_file(&cached)?;
                if sha == record.sha256 {
                    Ok(())
                } else {
                    Err(format!("SHA-256 {sha}, recorded {}", record.sha256))
                }
            }
        };
        if verdict.is_err() {
            std::fs::remove_file(&cached)
                .with_context(|| format!("cannot remove {}", cached.display()))?;
        }
        Ok(Some((cached, verdict)))
    }
}

/// What was written when a checkpoint was converted: the copy's size and
/// SHA-256, beside it (`model.safetensors.sha256`).
struct ConvertedRecord {
    sha256: String,
    size: u64,
}

impl ConvertedRecord {
    fn path(copy: &Path) -> PathBuf {
        copy.with_extension("safetensors.sha256")
    }

    fn write(copy: &Path) -> Result<()> {
        let line = format!(
            "{} {}\n",
            sha256_file(copy)?,
            std::fs::metadata(copy)?.len()
        );
        std::fs::write(Self::path(copy), line)
            .with_context(|| format!("cannot write {}", Self::path(copy).display()))
    }

    fn read(copy: &Path) -> Option<Self> {
        let text = std::fs::read_to_string(Self::path(copy)).ok()?;
        let (sha256, size) = text.trim().split_once(' ')?;
        Some(Self {
            sha256: sha256.to_string(),
            size: size.parse().ok()?,
        })
    }
}

/// Where the converted copy of a PyTorch checkpoint lives: keyed by the
/// checkpoint's path, size and modification time, so a changed file is
/// converted again.
pub fn converted_path(checkpoint: &Path, cache_dir: &Path) -> Result<PathBuf> {
    Ok(cache_dir
        .join("converted")
        .join(file_key(checkpoint)?)
        .join("model.safetensors"))
}

/// A short key for a file as it is now: its canonical path, size and
/// modification time (a file changed or replaced gets another key).
pub fn file_key(checkpoint: &Path) -> Result<String> {
    let meta = std::fs::metadata(checkpoint)
        .with_context(|| format!("cannot read {}", checkpoint.display()))?;
    let canonical = checkpoint
        .canonicalize()
        .unwrap_or_else(|_| checkpoint.to_path_buf());
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let mut hash = Sha256::new();
    hash.update(canonical.to_string_lossy().as_bytes());
    hash.update(meta.len().to_le_bytes());
    hash.update(mtime.to_le_bytes());
    Ok(hash
        .finalize()
        .iter()
        .take(12)
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// BGE-M3 without its heads must be refused, not run as a plain encoder.
fn looks_like_bge_m3(dir: &Path) -> bool {
    let named = |s: &str| s.to_ascii_lowercase().contains("bge-m3");
    if dir
        .components()
        .any(|c| named(&c.as_os_str().to_string_lossy()))
    {
        return true;
    }
    std::fs::read_to_string(dir.join("config.json")).is_ok_and(|c| named(&c))
}

/// A file's SHA-256, as 64 lowercase hex digits.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
    }
    Ok(hash.finalize().iter().map(|b| format!("{b:02x}")).collect())
}
