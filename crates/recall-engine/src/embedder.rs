//! The embedding runtime that everything else calls: load a model once, then
//! embed batches of texts from any number of threads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use candle_core::Device;
use rayon::prelude::*;

use crate::dtype::Dtype;
use crate::encoder::{Encoder, Q8Plan};
use crate::error::Error;
use crate::heads::{self, M3Heads};
use crate::model::{ModelFiles, Pooling, Weights};
use crate::tokenize::{TextTokenizer, Tokens};

/// Which outputs to compute. Dense is what most callers want; sparse and
/// ColBERT need a BGE-M3 model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outputs {
    pub dense: bool,
    pub sparse: bool,
    pub colbert: bool,
}

impl Outputs {
    pub const DENSE: Outputs = Outputs {
        dense: true,
        sparse: false,
        colbert: false,
    };
    pub const ALL: Outputs = Outputs {
        dense: true,
        sparse: true,
        colbert: true,
    };
}

impl Default for Outputs {
    fn default() -> Self {
        Self::DENSE
    }
}

/// The embedding of one input. Each output is `Some` when it was asked for.
#[derive(Debug, Clone, Default)]
pub struct Embedding {
    /// The dense vector, L2-normalised when the model says so (BGE-M3 and MiniLM do).
    pub dense: Option<Vec<f32>>,
    /// Lexical weights: token id → weight (> 0), special tokens dropped.
    pub sparse: Option<BTreeMap<u32, f32>>,
    /// One normalised vector per token after `<s>` (`</s>` included).
    pub colbert: Option<Vec<Vec<f32>>>,
    /// Tokens the model saw, special tokens included.
    pub tokens: usize,
    /// The input was longer than the maximum length and was cut.
    pub truncated: bool,
}

/// How to load a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Cut inputs at this many tokens (special tokens included). `None`: the model's limit.
    pub max_length: Option<usize>,
    /// Tokens per forward pass; inputs are packed up to this budget.
    pub max_batch_tokens: usize,
    pub device: Device,
    /// How the encoder's linear layers hold their weights: `Q8` quantises
    /// them at load (CPU only).
    pub dtype: Dtype,
    /// Where converted weights are kept. `None`: `$RECALL_CACHE_DIR`, `$XDG_CACHE_HOME/recall` or `~/.cache/recall`.
    pub cache_dir: Option<PathBuf>,
    /// Keep the layers packed for recall's CPU kernels in `cache_dir`'s
    /// `packed/` and map them at later loads (`crate::packcache`): a start
    /// then costs no packing, and processes share the weights' memory.
    /// Default: on, unless `RECALL_PACK_CACHE=off`.
    pub pack_cache: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            max_length: None,
            max_batch_tokens: 16_384,
            device: Device::Cpu,
            dtype: Dtype::F32,
            cache_dir: None,
            pack_cache: crate::env::PACK_CACHE.get().is_none_or(|v| v != "off"),
        }
    }
}

/// What was loaded, for `--info`, `/info` and messages.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub dir: PathBuf,
    pub model_type: String,
    /// The file the weights were read from (a converted copy for `pytorch_model.bin`).
    pub weights: PathBuf,
    pub dense_dim: usize,
    pub vocab_size: usize,
    /// `Some` for BGE-M3.
    pub colbert_dim: Option<usize>,
    pub sparse: bool,
    pub max_length: usize,
    pub model_max_length: usize,
    pub pooling: Pooling,
    pub normalize: bool,
    /// The encoder's weights as loaded.
    pub dtype: Dtype,
    /// For q8: how it runs this model (layers in f32, outlier channels) and
    /// how close its vectors came to f32's there (`crate::calibrate`).
    pub q8: Option<crate::calibrate::Calibration>,
    /// The pack file the encoder's packed layers are mapped from
    /// (`crate::packcache`); `None`: they were packed in memory.
    pub pack_file: Option<PathBuf>,
    pub load_time: Duration,
    /// The checkpoint was converted to safetensors during this load.
    pub converted: bool,
}

impl ModelInfo {
    /// The revision of the vectors this model gives, from the revision of
    /// its weights: the same for f32 and bf16 (bf16's vectors are f32's
    /// within 0.9995 cosine, docs/bf16.md: one space); for q8, tagged with
    /// the activations' bits (`Q8Kernel::revision_tag`) and the layers run
    /// in f32, since int8 vectors are close to f32's but not the same.
    pub fn vector_revision(&self, weights_revision: &str) -> String {
        if self.dtype != Dtype::Q8 {
            return weights_revision.to_string();
        }
        let tag = crate::kernels::quant::Q8Kernel::get().revision_tag();
        let f32_layers = self.q8.as_ref().map_or(&[][..], |q8| &q8.plan.f32_layers);
        match f32_layers {
            [] => format!("{weights_revision}+{tag}"),
            layers => format!(
                "{weights_revision}+{tag}-f32:{}",
                (layers.iter().map(usize::to_string))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }
}

pub struct Embedder {
    tokenizer: TextTokenizer,
    encoder: Encoder,
    heads: Option<M3Heads>,
    info: ModelInfo,
    max_batch_tokens: usize,
}

/// The device the cargo features select: CUDA or Metal when compiled in and present, else CPU.
pub fn default_device() -> Result<Device, Error> {
    #[cfg(feature = "cuda")]
    if candle_core::utils::cuda_is_available() {
        return Device::new_cuda(0).map_err(|e| Error::Load(e.into()));
    }
    #[cfg(feature = "metal")]
    if candle_core::utils::metal_is_available() {
        return Device::new_metal(0).map_err(|e| Error::Load(e.into()));
    }
    Ok(Device::Cpu)
}

impl Embedder {
    /// Loads the model in `dir`, a model directory in Hugging Face layout.
    pub fn load(dir: &Path, options: &LoadOptions) -> Result<Self, Error> {
        Self::load_anyhow(dir, options).map_err(Error::Load)
    }

    fn load_anyhow(dir: &Path, options: &LoadOptions) -> anyhow::Result<Self> {
        let started = Instant::now();
        crate::kernels::check_overrides().map_err(anyhow::Error::msg)?;
        let files = ModelFiles::inspect(dir)?;
        let model_max_length = files.max_tokens();
        let max_length = match options.max_length {
            None => model_max_length,
            Some(0) => bail!("`max_length` must be at least 1"),
            Some(n) if n > model_max_length => bail!(
                "`max_length` {n} is more than the model's limit of {model_max_length} tokens"
            ),
            Some(n) => n,
        };
        if options.max_batch_tokens == 0 {
            bail!("`max_batch_tokens` must be at least 1");
        }
        let tokenizer = TextTokenizer::from_file(&files.tokenizer, max_length)?;
        let cache_dir = match &options.cache_dir {
            Some(dir) => dir.clone(),
            None => crate::paths::recall_cache_dir()?,
        };
        let (weights_path, converted) = files.safetensors_weights(&cache_dir, |_, _| {})?;
        // FlagEmbedding pools BGE-M3 by `<s>` and normalises, whatever modules.json says.
        let (pooling, normalize) = match files.heads {
            Some(_) => (Pooling::Cls, true),
            None => (files.sentence.pooling, files.sentence.normalize),
        };
        let hidden = files.encoder.hidden_size;
        let heads = match &files.heads {
            Some((colbert, sparse)) => {
                Some(M3Heads::load(colbert, sparse, hidden, &options.device)?)
            }
            None => None,
        };
        // q8 is checked against f32 on this very model (once per weights
        // file), which also says how q8 runs it.
        let q8 = match options.dtype {
            Dtype::Q8 if options.device.is_cpu() => Some(crate::calibrate::Calibration::of(
                &files.encoder,
                &weights_path,
                &cache_dir,
                &tokenizer,
                &crate::calibrate::Outputs {
                    pooling,
                    heads: heads.as_ref(),
                },
            )?),
            _ => None,
        };
        if let Some(q8) = &q8 {
            q8.report(files.encoder.num_layers);
        }
        let mut weights = Weights::open(&weights_path)?;
        let pack_dir = options.pack_cache.then_some(cache_dir.as_path());
        let encoder = Encoder::load(
            &files.encoder,
            &mut weights,
            &options.device,
            options.dtype,
            q8.as_ref().map(|c| &c.plan).unwrap_or(&Q8Plan::default()),
            pack_dir,
        )
        .with_context(|| format!("cannot load the encoder of {}", dir.display()))?;
        drop(weights);
        let info = ModelInfo {
            dir: dir.to_path_buf(),
            model_type: files.encoder.model_type.clone(),
            weights: weights_path,
            dense_dim: hidden,
            vocab_size: files.encoder.vocab_size,
            colbert_dim: heads.as_ref().map(|h| h.colbert_dim()),
            sparse: heads.is_some(),
            max_length,
            model_max_length,
            pooling,
            normalize,
            dtype: options.dtype,
            q8,
            pack_file: encoder.pack_file().map(Path::to_path_buf),
            load_time: started.elapsed(),
            converted,
        };
        Ok(Self {
            tokenizer,
            encoder,
            heads,
            info,
            max_batch_tokens: options.max_batch_tokens,
        })
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The device the model was loaded on (CPU for q8, whatever the build).
    pub fn device(&self) -> &candle_core::Device {
        self.encoder.device()
    }

    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// Checks that the model can give `outputs` (`Error::Unsupported`).
    pub fn check_outputs(&self, outputs: Outputs) -> Result<(), Error> {
        if (outputs.sparse || outputs.colbert) && self.heads.is_none() {
            return Err(Error::Unsupported(format!(
                "{} has no BGE-M3 heads ({} and {}): it gives dense vectors only",
                self.info.dir.display(),
                crate::model::SPARSE_HEAD,
                crate::model::COLBERT_HEAD
            )));
        }
        if !(outputs.dense || outputs.sparse || outputs.colbert) {
            return Err(Error::Unsupported(
                "no output asked for: choose at least one of dense, sparse, colbert".into(),
            ));
        }
        Ok(())
    }

    /// The model's tokens of each of `texts`, cut at its maximum length.
    pub fn tokenize<S: AsRef<str> + Sync>(&self, texts: &[S]) -> Result<Vec<Tokens>, Error> {
        texts
            .par_iter()
            .map(|t| self.tokenizer.encode(t.as_ref()))
            .collect::<anyhow::Result<_>>()
            .map_err(Error::Run)
    }

    /// Embeds `texts`; the result is in the order of `texts`.
    pub fn embed<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
        outputs: Outputs,
    ) -> Result<Vec<Embedding>, Error> {
        self.check_outputs(outputs)?;
        let tokens = self.tokenize(texts)?;
        self.embed_tokens(&tokens, outputs)
    }

    /// Embeds tokenised inputs; the result is in their order. Inputs are
    /// sorted by length and packed into forward passes of at most the batch
    /// token budget (a longer single input gets a pass of its own).
    pub fn embed_tokens(
        &self,
        inputs: &[Tokens],
        outputs: Outputs,
    ) -> Result<Vec<Embedding>, Error> {
        self.embed_tokens_with(inputs, outputs, &|| {})
    }

    /// `embed_tokens`, calling `between_layers` before each encoder layer
    /// (`recall serve` pauses bulk work there while queries wait).
    pub fn embed_tokens_with(
        &self,
        inputs: &[Tokens],
        outputs: Outputs,
        between_layers: &dyn Fn(),
    ) -> Result<Vec<Embedding>, Error> {
        self.check_outputs(outputs)?;
        let mut order: Vec<usize> = (0..inputs.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(inputs[i].ids.len()));
        let mut results: Vec<Embedding> = vec![Embedding::default(); inputs.len()];
        let mut start = 0;
        while start < order.len() {
            let mut end = start + 1;
            let mut tokens = inputs[order[start]].ids.len();
            while end < order.len()
                && tokens + inputs[order[end]].ids.len() <= self.max_batch_tokens
            {
                tokens += inputs[order[end]].ids.len();
                end += 1;
            }
            let batch: Vec<&Tokens> = order[start..end].iter().map(|&i| &inputs[i]).collect();
            for (slot, embedding) in order[start..end].iter().zip(
                self.embed_batch(&batch, outputs, between_layers)
                    .map_err(Error::Run)?,
            ) {
                results[*slot] = embedding;
            }
            start = end;
        }
        Ok(results)
    }

    fn embed_batch(
        &self,
        batch: &[&Tokens],
        outputs: Outputs,
        between_layers: &dyn Fn(),
    ) -> Result<Vec<Embedding>> {
        let ids: Vec<&[u32]> = batch.iter().map(|t| t.ids.as_slice()).collect();
        let lens: Vec<usize> = ids.iter().map(|i| i.len()).collect();
        if let Some(empty) = lens.iter().position(|&n| n == 0) {
            bail!("input {empty} of the batch has no tokens");
        }
        let hidden = self.encoder.forward_with(&ids, between_layers)?;
        let mut out: Vec<Embedding> = batch
            .iter()
            .map(|t| Embedding {
                tokens: t.ids.len(),
                truncated: t.truncated,
                ..Default::default()
            })
            .collect();
        if outputs.dense {
            let dense = heads::pool(&hidden, &lens, self.info.pooling, self.info.normalize)?
                .to_vec2::<f32>()?;
            for (e, d) in out.iter_mut().zip(dense) {
                e.dense = Some(d);
            }
        }
        let Some(m3) = &self.heads else {
            return Ok(out);
        };
        if outputs.sparse {
            let weights = m3.token_weights(&hidden)?;
            let mut offset = 0;
            for (e, input) in out.iter_mut().zip(&ids) {
                let w = &weights[offset..offset + input.len()];
                e.sparse = Some(heads::lexical_weights(input, w, |id| {
                    self.tokenizer.is_special(id)
                }));
                offset += input.len();
            }
        }
        if outputs.colbert {
            let vectors = m3.colbert_vectors(&hidden)?.to_vec2::<f32>()?;
            let mut offset = 0;
            for (e, &len) in out.iter_mut().zip(&lens) {
                // Every token after `<s>`, the closing `</s>` included.
                e.colbert = Some(vectors[offset + 1..offset + len].to_vec());
                offset += len;
            }
        }
        self.check_finite(&out)?;
        Ok(out)
    }

    /// A vector with NaN or infinite values would poison every search of an
    /// index that stored it: the whole batch fails instead, naming the model.
    fn check_finite(&self, out: &[Embedding]) -> Result<()> {
        let finite = |v: &[f32]| v.iter().all(|x| x.is_finite());
        let bad = out.iter().any(|e| {
            !(e.dense.as_deref().is_none_or(finite)
                && e.sparse
                    .as_ref()
                    .is_none_or(|s| s.values().all(|w| w.is_finite()))
                && e.colbert
                    .as_ref()
                    .is_none_or(|c| c.iter().all(|v| finite(v))))
        });
        if bad {
            bail!(
                "the model at {} gave values that are not finite numbers (NaN or infinity): its weights may be damaged",
                self.info.dir.display()
            );
        }
        Ok(())
    }
}

const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Embedder>();
};
