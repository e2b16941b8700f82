//! recall's own BERT / XLM-RoBERTa encoder on candle.
//!
//! A batch is packed: the tokens of every input are laid end to end as one
//! `[total_tokens, hidden]` matrix, so no work is spent on padding and the
//! linear layers see one large matrix. Attention runs per input over query
//! blocks, so its memory stays bounded at any length (8192 tokens included).
//! Position ids are integers computed on the host, as Hugging Face does.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::{D, DType, Device, Tensor};
use candle_nn::{LayerNorm, Linear, Module};

use crate::attention::Scores;
use crate::bf16::Bf16Linear;
use crate::matmul::{PackedLinear, packed_available};
use crate::model::config::{Activation, EncoderConfig};
use crate::model::weights::{MappedF32, Weights};
use crate::packcache::{PackFile, Reader, Writer};
use crate::quant::QLinear;

/// Upper bound on one attention score block (heads × query rows × keys), in
/// f32 elements: 32 Mi elements is 128 MiB.
const SCORE_BLOCK_ELEMENTS: usize = 32 << 20;

/// How the encoder's linear layers hold their weights (`--dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dtype {
    /// As the checkpoint has them: the reference outputs.
    #[default]
    F32,
    /// int8, quantised at load (`quant`): about 4× less weight memory
    /// and several times the speed on CPUs with AVX-512 VNNI, at a small
    /// cost in fidelity. CPU only.
    Q8,
    /// bfloat16, rounded at load (`bf16`): half the weight memory, sums in
    /// f32; twice f32's arithmetic on CPUs with AVX512_BF16. CPU only.
    Bf16,
}

impl Dtype {
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Q8 => "q8",
            Dtype::Bf16 => "bf16",
        }
    }
}

impl std::str::FromStr for Dtype {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(Dtype::F32),
            "q8" | "int8" => Ok(Dtype::Q8),
            "bf16" | "bfloat16" => Ok(Dtype::Bf16),
            _ => anyhow::bail!("unknown dtype {s:?}: expected f32, bf16 or q8"),
        }
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A linear layer of the encoder: `x · Wᵀ + b`.
struct Proj {
    weight: ProjWeight,
    bias: Tensor,
}

/// Something of each of a layer's four projections' inputs: the hidden
/// states (query, key and value), the attention's context (its output
/// projection), the attention block's output (the feed-forward's first
/// projection) and the activations (its second).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProjInputs<T> {
    pub qkv: T,
    pub attn_out: T,
    pub intermediate: T,
    pub output: T,
}

impl<T> ProjInputs<T> {
    pub fn map<U>(&self, f: impl Fn(&T) -> U) -> ProjInputs<U> {
        ProjInputs {
            qkv: f(&self.qkv),
            attn_out: f(&self.attn_out),
            intermediate: f(&self.intermediate),
            output: f(&self.output),
        }
    }
}

/// The channels of each layer's projection inputs that q8 keeps in f32
/// (`quant::outlier_channels`), from `Encoder::forward_peaks`.
pub type Outliers = [ProjInputs<Vec<usize>>];

enum ProjWeight {
    F32(Tensor),
    /// f32, packed for recall's kernel (CPUs with AVX2 and FMA).
    Packed(PackedLinear),
    Q8(QLinear),
    Bf16(Bf16Linear),
}

impl ProjWeight {
    /// Whether weights of `dtype` on `device` are packed for recall's CPU
    /// kernels (else kept as a tensor for candle's matmul).
    fn packs(dtype: Dtype, device: &Device) -> bool {
        dtype == Dtype::Q8 || (device.is_cpu() && packed_available())
    }

    /// A weight kept for candle's matmul: bf16's rounded to bf16 (and
    /// held as f32), so a CPU without recall's tiles gives the vectors of
    /// the widened tiles, without their memory saving.
    fn tensor(w: Tensor, dtype: Dtype) -> Result<Self> {
        let w = match dtype {
            Dtype::Bf16 => w.to_dtype(DType::BF16)?.to_dtype(DType::F32)?,
            Dtype::F32 | Dtype::Q8 => w,
        };
        Ok(Self::F32(w))
    }

    /// Packs (or quantises) `w: [n, k]` for `dtype`'s kernel; q8 keeps the
    /// input positions `outliers` in f32 (`quant::outlier_channels`).
    fn pack(dtype: Dtype, w: &[f32], n: usize, k: usize, outliers: &[usize]) -> Self {
        match dtype {
            Dtype::F32 => Self::Packed(PackedLinear::pack(w, n, k)),
            Dtype::Q8 => Self::Q8(QLinear::quantize_split(w, n, k, outliers)),
            Dtype::Bf16 => Self::Bf16(Bf16Linear::pack(w, n, k)),
        }
    }

    /// `[n, k]` packed for `dtype`'s kernel, read from a pack file.
    fn restore(
        dtype: Dtype,
        reader: &mut Reader,
        n: usize,
        k: usize,
        outliers: &[usize],
    ) -> Result<Self> {
        Ok(match dtype {
            Dtype::F32 => Self::Packed(PackedLinear::restore(reader, n, k)?),
            Dtype::Q8 => Self::Q8(QLinear::restore(reader, n, k, outliers)?),
            Dtype::Bf16 => Self::Bf16(Bf16Linear::restore(reader, n, k)?),
        })
    }

    /// Adds a packed weight's parts to a pack file (a tensor has none).
    fn push<'a>(&'a self, writer: &mut Writer<'a>) {
        match self {
            Self::F32(_) => {}
            Self::Packed(w) => writer.push(w),
            Self::Q8(w) => writer.push(w),
            Self::Bf16(w) => writer.push(w),
        }
    }
}

/// The kernel `dtype`'s packed layers are laid out for on this CPU, as a
/// pack file names it; q8's with its weights' revision and outlier
/// channels (a digest of them: they decide what is packed).
fn packed_kernel(dtype: Dtype, outliers: &Outliers) -> Result<String> {
    Ok(match dtype {
        Dtype::F32 => format!("{:?}", crate::matmul::PackedKernel::get()),
        Dtype::Bf16 => format!("{:?}", crate::bf16::Bf16Kernel::get()),
        Dtype::Q8 => {
            use sha2::{Digest, Sha256};
            let kernel = crate::quant::Kernel::get();
            let digest = Sha256::digest(serde_json::to_vec(outliers)?);
            let short: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
            // "in panels": the layout of the f32 channels' weights.
            format!(
                "{kernel:?} {} outliers {short} in panels",
                kernel.revision_tag()
            )
        }
    })
}

impl Proj {
    /// The layer `name` (`{name}.weight`, `{name}.bias`) of `out × inp`.
    /// A packed weight is read straight from the file's map where it holds
    /// f32: a copy first was a fresh 2 GB at load whose pages the kernel
    /// zeroes.
    /// With `packs`, the packed weight is the pack file's next part.
    /// q8 keeps the input positions `outliers` in f32.
    fn load(
        w: &Weights,
        name: &str,
        (out, inp): (usize, usize),
        dev: &Device,
        dtype: Dtype,
        outliers: &[usize],
        packs: Option<&mut Reader>,
    ) -> Result<Self> {
        let bias = w.get(&format!("{name}.bias"), &[out], dev)?;
        let weight_name = format!("{name}.weight");
        let weight = if let Some(reader) = packs {
            ProjWeight::restore(dtype, reader, out, inp, outliers)?
        } else if ProjWeight::packs(dtype, dev) {
            w.with_f32(&weight_name, &[out, inp], |data| {
                ProjWeight::pack(dtype, data, out, inp, outliers)
            })?
        } else {
            ProjWeight::tensor(w.get(&weight_name, &[out, inp], dev)?, dtype)?
        };
        Ok(Self { weight, bias })
    }

    /// A layer already in tensors (`qkv`'s stack), `outliers` as `load`'s.
    fn new(l: Linear, dtype: Dtype, outliers: &[usize]) -> Result<Self> {
        let bias = l.bias().context("a linear layer without bias")?.clone();
        let w = l.weight();
        let weight = if ProjWeight::packs(dtype, w.device()) {
            let (n, k) = w.dims2()?;
            let w = w.contiguous()?;
            let (storage, layout) = w.storage_and_layout();
            let candle_core::Storage::Cpu(cpu) = &*storage else {
                anyhow::bail!("packing a weight that is not in CPU memory");
            };
            ProjWeight::pack(dtype, crate::fused::data(cpu, layout, "W")?, n, k, outliers)
        } else {
            ProjWeight::tensor(w.clone(), dtype)?
        };
        Ok(Self { weight, bias })
    }

    /// `x · Wᵀ`: the int8 kernel, the packed f32 kernel, else candle's.
    fn matmul_t(&self, x: &Tensor) -> Result<Tensor> {
        match &self.weight {
            ProjWeight::F32(w) => Ok(x.matmul(&w.t()?)?),
            packed => Ok(x.contiguous()?.apply_op1_no_bwd(&PackedMatmulT(packed))?),
        }
    }
}

/// `x · Wᵀ` with weights packed at load (f32 or int8), as a candle op
/// (CPU, f32 `x`).
struct PackedMatmulT<'a>(&'a ProjWeight);

impl candle_core::CustomOp1 for PackedMatmulT<'_> {
    fn name(&self) -> &'static str {
        "recall-packed-matmul-t"
    }

    fn cpu_fwd(
        &self,
        x: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let (m, k) = layout.shape().dims2()?;
        let (n, inputs) = match self.0 {
            ProjWeight::Packed(w) => (w.out_features(), w.in_features()),
            ProjWeight::Q8(w) => (w.out_features(), w.in_features()),
            ProjWeight::Bf16(w) => (w.out_features(), w.in_features()),
            ProjWeight::F32(_) => candle_core::bail!("f32 weights that were not packed"),
        };
        if k != inputs {
            candle_core::bail!("x is [{m}, {k}] but W has {inputs} inputs");
        }
        let x = crate::fused::data(x, layout, "x")?;
        let y = match self.0 {
            ProjWeight::Packed(w) => w.matmul_t(x, m),
            ProjWeight::Q8(w) => w.matmul_t(x, m),
            ProjWeight::Bf16(w) => w.matmul_t(x, m),
            ProjWeight::F32(_) => unreachable!("refused above"),
        };
        Ok((
            candle_core::CpuStorage::F32(y),
            candle_core::Shape::from((m, n)),
        ))
    }
}

/// Attention by recall's kernels (`attention`), as a candle op on the
/// stacked `qkv`.
struct PackedAttention<'a> {
    lens: &'a [usize],
    heads: usize,
    head_dim: usize,
    scores: Scores,
}

impl candle_core::CustomOp1 for PackedAttention<'_> {
    fn name(&self) -> &'static str {
        "recall-attention"
    }

    fn cpu_fwd(
        &self,
        qkv: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let (total, width) = layout.shape().dims2()?;
        let h = self.heads * self.head_dim;
        if width != 3 * h || self.lens.iter().sum::<usize>() != total {
            candle_core::bail!("attention: qkv is [{total}, {width}], not [tokens, 3 × {h}]");
        }
        let qkv = crate::fused::data(qkv, layout, "qkv")?;
        let out =
            crate::attention::attention(qkv, self.lens, self.heads, self.head_dim, self.scores)?;
        Ok((
            candle_core::CpuStorage::F32(out),
            candle_core::Shape::from((total, h)),
        ))
    }
}

struct Layer {
    /// Query, key and value stacked, `[3 × hidden, hidden]`: one matmul
    /// instead of three. The query rows and bias are pre-scaled by
    /// 1/√head_dim, so attention never scales its scores.
    qkv: Proj,
    attn_out: Proj,
    attn_norm: LayerNorm,
    intermediate: Proj,
    output: Proj,
    out_norm: LayerNorm,
}

/// The word-embedding table. BGE-M3's is 1 GB (250,002 tokens × 1024), of
/// which an input reads a few rows, so it stays in the weights file's map
/// where it can: the pages read are the page cache's, shared and
/// reclaimable, rather than a copy in the process's own memory that it
/// first has to fault in and fill (a third of BGE-M3's start-up).
enum WordEmbeddings {
    Mapped { table: MappedF32, hidden: usize },
    Tensor(Tensor),
}

const WORD_EMBEDDINGS: &str = "embeddings.word_embeddings.weight";

impl WordEmbeddings {
    fn load(weights: &Weights, vocab: usize, hidden: usize, dev: &Device) -> Result<Self> {
        let shape = [vocab, hidden];
        Ok(match weights.mapped_f32(WORD_EMBEDDINGS, &shape)? {
            Some(table) => Self::Mapped { table, hidden },
            None => Self::Tensor(weights.get(WORD_EMBEDDINGS, &shape, dev)?),
        })
    }

    /// The rows of `ids` (inside the vocabulary), `[ids.len(), hidden]` on
    /// `dev`.
    fn rows(&self, ids: Vec<u32>, dev: &Device) -> Result<Tensor> {
        let n = ids.len();
        Ok(match self {
            Self::Mapped { table, hidden } => {
                let table = table.data();
                let mut rows = Vec::with_capacity(n * hidden);
                for id in ids {
                    rows.extend_from_slice(&table[id as usize * hidden..][..*hidden]);
                }
                Tensor::from_vec(rows, (n, *hidden), dev)?
            }
            Self::Tensor(table) => table.index_select(&Tensor::from_vec(ids, n, dev)?, 0)?,
        })
    }
}

pub struct Encoder {
    config: EncoderConfig,
    word_embeddings: WordEmbeddings,
    position_embeddings: Tensor,
    /// Row 0 of the token-type table: every input is a single segment.
    token_type_row: Tensor,
    embed_norm: LayerNorm,
    layers: Vec<Layer>,
    device: Device,
    /// Where the packed layers are mapped from, if they are.
    pack_file: Option<PathBuf>,
}

/// Query, key and value of the attention `name` stacked into one layer
/// (`Layer::qkv`), the query scaled by 1/√head_dim; with `packs`, its
/// packed weight is the pack file's next part.
fn qkv(
    w: &Weights,
    name: &str,
    (h, heads): (usize, usize),
    dev: &Device,
    dtype: Dtype,
    outliers: &[usize],
    packs: Option<&mut Reader>,
) -> Result<Proj> {
    let scale = 1.0 / ((h / heads) as f64).sqrt();
    let part =
        |p: &str, what: &str, shape: &[usize]| w.get(&format!("{name}.{p}.{what}"), shape, dev);
    let bias = Tensor::cat(
        &[
            (part("query", "bias", &[h])? * scale)?,
            part("key", "bias", &[h])?,
            part("value", "bias", &[h])?,
        ],
        0,
    )?;
    if let Some(reader) = packs {
        let weight = ProjWeight::restore(dtype, reader, 3 * h, h, outliers)?;
        return Ok(Proj { weight, bias });
    }
    let weight = Tensor::cat(
        &[
            (part("query", "weight", &[h, h])? * scale)?,
            part("key", "weight", &[h, h])?,
            part("value", "weight", &[h, h])?,
        ],
        0,
    )?;
    Proj::new(Linear::new(weight, Some(bias)), dtype, outliers)
}

fn layer_norm(w: &Weights, name: &str, size: usize, eps: f64, dev: &Device) -> Result<LayerNorm> {
    let weight = w.get(&format!("{name}.weight"), &[size], dev)?;
    let bias = w.get(&format!("{name}.bias"), &[size], dev)?;
    Ok(LayerNorm::new(weight, bias, eps))
}

impl Encoder {
    /// Where the weights were loaded.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Loads the encoder from `weights`. With `pack_dir`, packed layers are
    /// read from their pack file there (`crate::packcache`), which the
    /// first load writes. q8 keeps each layer's `outliers` in f32 (a layer
    /// past the list keeps none).
    pub fn load(
        config: &EncoderConfig,
        weights: &mut Weights,
        device: &Device,
        dtype: Dtype,
        outliers: &Outliers,
        pack_dir: Option<&Path>,
    ) -> Result<Self> {
        if dtype != Dtype::F32 && !device.is_cpu() {
            anyhow::bail!("--dtype {dtype} runs on the CPU only, not on {device:?}");
        }
        if dtype == Dtype::Q8 && crate::quant::Kernel::get() == crate::quant::Kernel::Portable {
            tracing::warn!(
                "--dtype q8: this CPU has no int8 dot product (AVX-512 VNNI, AVX-VNNI, AVX2 or \
                 Arm's dot product), so int8 runs a portable loop, much slower than f32"
            );
        }
        weights.detect_prefix(WORD_EMBEDDINGS)?;
        let pack_file = match (pack_dir, weights.safetensors_header()) {
            (Some(dir), Some(header)) if ProjWeight::packs(dtype, device) => Some(PackFile::new(
                dir,
                weights.path(),
                header,
                dtype.as_str(),
                &packed_kernel(dtype, outliers)?,
            )?),
            _ => None,
        };
        let Some(pack_file) = pack_file else {
            return Self::build(config, weights, device, dtype, outliers, None);
        };
        let shown = pack_file.path().display();
        match pack_file.open() {
            Ok(Some(mut reader)) => {
                match Self::build(config, weights, device, dtype, outliers, Some(&mut reader))
                    .and_then(|e| reader.finish().map(|()| e))
                {
                    Ok(encoder) => {
                        tracing::debug!("packed weights read from {shown}");
                        return Ok(encoder.mapped_from(pack_file.path()));
                    }
                    Err(e) => {
                        tracing::debug!("{shown} does not fit the model ({e:#}): packing again")
                    }
                }
            }
            Ok(None) => tracing::debug!("no packed weights at {shown} yet: packing"),
            Err(e) => tracing::debug!("{shown}: {e:#}: packing again"),
        }
        let encoder = Self::build(config, weights, device, dtype, outliers, None)?;
        let mut writer = Writer::default();
        encoder.push_packs(&mut writer);
        if let Err(e) = pack_file.write(&writer) {
            tracing::warn!(
                "cannot keep the packed weights in {shown} ({e:#}): every start packs them again"
            );
            return Ok(encoder);
        }
        // Read back from the file, its pages are the page cache's, shared
        // with the next process, rather than this one's own; the packed
        // copy goes first, so that the two never take memory at once.
        drop(writer);
        drop(encoder);
        let mapped = pack_file.open().and_then(|reader| {
            let mut reader = reader.context("it is gone")?;
            let mapped = Self::build(config, weights, device, dtype, outliers, Some(&mut reader))?;
            reader.finish().map(|()| mapped)
        });
        match mapped {
            Ok(mapped) => {
                tracing::debug!("packed weights kept in {shown}");
                Ok(mapped.mapped_from(pack_file.path()))
            }
            Err(e) => {
                tracing::warn!("cannot read back {shown} ({e:#}): packing in memory");
                Self::build(config, weights, device, dtype, outliers, None)
            }
        }
    }

    fn build(
        config: &EncoderConfig,
        weights: &Weights,
        device: &Device,
        dtype: Dtype,
        outliers: &Outliers,
        mut packs: Option<&mut Reader>,
    ) -> Result<Self> {
        let c = config;
        let (h, dev) = (c.hidden_size, device);
        let word_embeddings = WordEmbeddings::load(weights, c.vocab_size, h, dev)?;
        let position_embeddings = weights.get(
            "embeddings.position_embeddings.weight",
            &[c.max_position_embeddings, h],
            dev,
        )?;
        let token_type_row = weights
            .get(
                "embeddings.token_type_embeddings.weight",
                &[c.type_vocab_size, h],
                dev,
            )?
            .get(0)?;
        let embed_norm = layer_norm(weights, "embeddings.LayerNorm", h, c.layer_norm_eps, dev)?;
        let mut layers = Vec::with_capacity(c.num_layers);
        let none = ProjInputs::default();
        for i in 0..c.num_layers {
            let p = format!("encoder.layer.{i}");
            let outliers = match dtype {
                Dtype::Q8 => outliers.get(i).unwrap_or(&none),
                Dtype::F32 | Dtype::Bf16 => &none,
            };
            let qkv = {
                let name = format!("{p}.attention.self");
                let packs = packs.as_deref_mut();
                let heads = (h, c.num_heads);
                qkv(weights, &name, heads, dev, dtype, &outliers.qkv, packs)?
            };
            let mut proj = |name: &str, shape, outliers| {
                let packs = packs.as_deref_mut();
                Proj::load(
                    weights,
                    &format!("{p}.{name}"),
                    shape,
                    dev,
                    dtype,
                    outliers,
                    packs,
                )
            };
            layers.push(Layer {
                qkv,
                attn_out: proj("attention.output.dense", (h, h), &outliers.attn_out)?,
                attn_norm: layer_norm(
                    weights,
                    &format!("{p}.attention.output.LayerNorm"),
                    h,
                    c.layer_norm_eps,
                    dev,
                )?,
                intermediate: proj(
                    "intermediate.dense",
                    (c.intermediate_size, h),
                    &outliers.intermediate,
                )?,
                output: proj("output.dense", (h, c.intermediate_size), &outliers.output)?,
                out_norm: layer_norm(
                    weights,
                    &format!("{p}.output.LayerNorm"),
                    h,
                    c.layer_norm_eps,
                    dev,
                )?,
            });
        }
        Ok(Self {
            config: config.clone(),
            word_embeddings,
            position_embeddings,
            token_type_row,
            embed_norm,
            layers,
            device: device.clone(),
            pack_file: None,
        })
    }

    fn mapped_from(self, pack_file: &Path) -> Self {
        Self {
            pack_file: Some(pack_file.to_path_buf()),
            ..self
        }
    }

    /// The pack file the packed layers are mapped from, if they are.
    pub fn pack_file(&self) -> Option<&Path> {
        self.pack_file.as_deref()
    }

    /// Every packed layer's parts, in the order `build` reads them.
    fn push_packs<'a>(&'a self, writer: &mut Writer<'a>) {
        for l in &self.layers {
            for proj in [&l.qkv, &l.attn_out, &l.intermediate, &l.output] {
                proj.weight.push(writer);
            }
        }
    }

    /// Runs the encoder over `inputs` (token ids, special tokens included)
    /// and returns the last hidden states of all of them, packed in order:
    /// `[sum of lengths, hidden]`.
    pub fn forward(&self, inputs: &[&[u32]]) -> Result<Tensor> {
        self.forward_with(inputs, &|| {})
    }

    /// `forward`, calling `between_layers` before each layer: a serving loop
    /// uses it to let more urgent work run first.
    pub fn forward_with(&self, inputs: &[&[u32]], between_layers: &dyn Fn()) -> Result<Tensor> {
        self.run(inputs, between_layers, None)
    }

    /// `forward`, and for each layer the largest magnitude each channel of
    /// its projections' inputs reached: where q8 finds the channels it
    /// keeps in f32 (`quant::outlier_channels`).
    pub fn forward_peaks(&self, inputs: &[&[u32]]) -> Result<(Tensor, Vec<ProjInputs<Vec<f32>>>)> {
        let mut peaks = vec![ProjInputs::default(); self.layers.len()];
        let hidden = self.run(inputs, &|| {}, Some(&mut peaks))?;
        Ok((hidden, peaks))
    }

    fn run(
        &self,
        inputs: &[&[u32]],
        between_layers: &dyn Fn(),
        mut peaks: Option<&mut [ProjInputs<Vec<f32>>]>,
    ) -> Result<Tensor> {
        let c = &self.config;
        let lens: Vec<usize> = inputs.iter().map(|ids| ids.len()).collect();
        let total: usize = lens.iter().sum();
        anyhow::ensure!(total > 0, "nothing to encode: every input is empty");
        let max_tokens = c.max_tokens();
        if let Some(long) = lens.iter().find(|&&n| n > max_tokens) {
            anyhow::bail!("an input of {long} tokens is longer than the model's {max_tokens}");
        }
        let mut ids = Vec::with_capacity(total);
        let mut positions = Vec::with_capacity(total);
        for input in inputs {
            if let Some(bad) = input.iter().find(|&&id| id as usize >= c.vocab_size) {
                anyhow::bail!(
                    "token id {bad} is outside the vocabulary of {} tokens",
                    c.vocab_size
                );
            }
            ids.extend_from_slice(input);
            positions.extend((0..input.len()).map(|i| (i + c.position_offset()) as u32));
        }
        let positions = Tensor::from_vec(positions, total, &self.device)?;
        let embedded = (self.word_embeddings)
            .rows(ids, &self.device)?
            .add(&self.position_embeddings.index_select(&positions, 0)?)?
            .broadcast_add(&self.token_type_row)?;
        let mut hidden = self.embed_norm.forward(&embedded)?;
        for (i, layer) in self.layers.iter().enumerate() {
            between_layers();
            let peaks = peaks.as_deref_mut().map(|p| &mut p[i]);
            let forward = || self.layer_forward(layer, &hidden, &lens, peaks);
            // On a rayon worker, each parallel op inside the layer puts its
            // tasks on the pool's own queues; from any other thread, every
            // op hands its work over and sleeps until it is done: two
            // wake-ups per op, a few hundred per forward pass. A 16-token
            // query took 78-92 ms instead of 90-113 (q8: 24-34 against
            // 31-43). GPUs keep their thread.
            hidden = if self.device.is_cpu() {
                rayon::scope(|_| forward())
            } else {
                forward()
            }
            .with_context(|| format!("encoder layer {i}"))?;
        }
        Ok(hidden)
    }

    fn layer_forward(
        &self,
        layer: &Layer,
        x: &Tensor,
        lens: &[usize],
        mut peaks: Option<&mut ProjInputs<Vec<f32>>>,
    ) -> Result<Tensor> {
        let mut observe = |site: fn(&mut ProjInputs<Vec<f32>>) -> &mut Vec<f32>, x: &Tensor| {
            let Some(peaks) = peaks.as_deref_mut() else {
                return Ok(());
            };
            let seen = x.abs()?.max(0)?.to_vec1::<f32>()?;
            let peak = site(peaks);
            if peak.is_empty() {
                *peak = seen;
            } else {
                peak.iter_mut().zip(seen).for_each(|(p, s)| *p = p.max(s));
            }
            anyhow::Ok(())
        };
        let h = self.config.hidden_size;
        observe(|p| &mut p.qkv, x)?;
        let qkv = project(x, &layer.qkv, None)?;
        let kernel = match layer.qkv.weight {
            ProjWeight::F32(_) => None,
            ProjWeight::Packed(_) => Some(Scores::F32),
            ProjWeight::Q8(_) => Some(Scores::Q8),
            ProjWeight::Bf16(_) => Some(Scores::Bf16),
        };
        let context = if let Some(scores) = kernel {
            let op = PackedAttention {
                lens,
                heads: self.config.num_heads,
                head_dim: h / self.config.num_heads,
                scores,
            };
            qkv.apply_op1_no_bwd(&op)?
        } else {
            let (q, k, v) = (
                qkv.narrow(1, 0, h)?,
                qkv.narrow(1, h, h)?,
                qkv.narrow(1, 2 * h, h)?,
            );
            self.attention(&q, &k, &v, lens)?
        };
        observe(|p| &mut p.attn_out, &context)?;
        let attended = layer
            .attn_norm
            .forward(&project_add(&context, &layer.attn_out, x)?)?;
        observe(|p| &mut p.intermediate, &attended)?;
        let inner = project(&attended, &layer.intermediate, Some(self.config.activation))?;
        observe(|p| &mut p.output, &inner)?;
        let out = project_add(&inner, &layer.output, &attended)?;
        Ok(layer.out_norm.forward(&out)?)
    }

    /// Scaled dot-product attention within each packed input.
    fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, lens: &[usize]) -> Result<Tensor> {
        let inputs: Vec<(usize, usize)> = lens
            .iter()
            .scan(0, |offset, &len| {
                *offset += len;
                Some((*offset - len, len))
            })
            .collect();
        let one = |&(offset, len): &(usize, usize)| self.attention_one(q, k, v, offset, len);
        // Inputs side by side on the CPU: each one's splits and joins are
        // copies on one thread, which left the other cores idle.
        let mut outputs = if q.device().is_cpu() && inputs.len() > 1 {
            use rayon::prelude::*;
            inputs.par_iter().map(one).collect::<Result<Vec<_>>>()?
        } else {
            inputs.iter().map(one).collect::<Result<Vec<_>>>()?
        };
        let out = if outputs.len() == 1 {
            outputs.pop().unwrap()
        } else {
            Tensor::cat(&outputs, 0)?
        };
        Ok(out)
    }

    /// Attention within the input at rows `offset..offset + len`.
    fn attention_one(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        offset: usize,
        len: usize,
    ) -> Result<Tensor> {
        let heads = self.config.num_heads;
        let head_dim = self.config.hidden_size / heads;
        // [len, hidden] -> [heads, len, head_dim]
        let split = |t: &Tensor| -> Result<Tensor> {
            Ok(t.narrow(0, offset, len)?
                .reshape((len, heads, head_dim))?
                .transpose(0, 1)?
                .contiguous()?)
        };
        let (qs, ks, vs) = (split(q)?, split(k)?, split(v)?);
        let kt = ks.t()?;
        let rows = (SCORE_BLOCK_ELEMENTS / (heads * len)).clamp(1, len);
        let mut blocks = Vec::with_capacity(len.div_ceil(rows));
        let mut start = 0;
        while start < len {
            let n = rows.min(len - start);
            let scores = qs.narrow(1, start, n)?.matmul(&kt)?;
            let probs = if scores.device().is_cpu() && scores.is_contiguous() {
                scores.inplace_op1(&crate::fused::SoftmaxInPlace)?;
                scores
            } else {
                candle_nn::ops::softmax_last_dim(&scores)?
            };
            blocks.push(probs.matmul(&vs)?);
            start += n;
        }
        let context = if blocks.len() == 1 {
            blocks.pop().unwrap()
        } else {
            Tensor::cat(&blocks, 1)?
        };
        // [heads, len, head_dim] -> [len, hidden]
        Ok(context.transpose(0, 1)?.reshape((len, heads * head_dim))?)
    }
}

/// `act(x · Wᵀ + b)`: on the CPU the bias and activation are one parallel
/// pass over the matmul's output, in place (`fused::BiasAct`).
fn project(x: &Tensor, l: &Proj, act: Option<Activation>) -> Result<Tensor> {
    let y = l.matmul_t(x)?;
    let bias = &l.bias;
    if y.device().is_cpu() {
        y.inplace_op2(bias, &crate::fused::BiasAct { act })?;
        return Ok(y);
    }
    let y = y.broadcast_add(bias)?;
    Ok(match act {
        None => y,
        Some(Activation::Gelu) => y.gelu_erf()?,
        Some(Activation::GeluTanh) => y.gelu()?,
        Some(Activation::Relu) => y.relu()?,
    })
}

/// `x · Wᵀ + b + residual`, one parallel pass in place after the matmul on
/// the CPU.
fn project_add(x: &Tensor, l: &Proj, residual: &Tensor) -> Result<Tensor> {
    let y = l.matmul_t(x)?;
    let bias = &l.bias;
    if y.device().is_cpu() && residual.is_contiguous() {
        y.inplace_op3(bias, residual, &crate::fused::BiasResidual)?;
        return Ok(y);
    }
    Ok(y.broadcast_add(bias)?.add(residual)?)
}

/// `x / max(‖x‖₂, 1e-12)` along the last dimension, as `torch.nn.functional.normalize`.
pub fn l2_normalize(x: &Tensor) -> Result<Tensor> {
    let norm = x
        .sqr()?
        .sum_keepdim(D::Minus1)?
        .sqrt()?
        .clamp(1e-12f32, f32::MAX)?;
    Ok(x.broadcast_div(&norm)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_embeddings_read_in_the_map_are_the_tensor_rows() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("models/tiny-bge-m3/model.safetensors");
        let mut weights = Weights::open(&path).unwrap();
        weights.detect_prefix(WORD_EMBEDDINGS).unwrap();
        let [vocab, hidden] = weights.shape(WORD_EMBEDDINGS).unwrap()[..] else {
            panic!("not a table")
        };
        let cpu = Device::Cpu;
        let mapped = WordEmbeddings::load(&weights, vocab, hidden, &cpu).unwrap();
        assert!(matches!(mapped, WordEmbeddings::Mapped { .. }));
        let table = weights
            .get(WORD_EMBEDDINGS, &[vocab, hidden], &cpu)
            .unwrap();
        let copied = WordEmbeddings::Tensor(table);
        let ids = vec![0, 5, vocab as u32 - 1, 5];
        let rows = |e: &WordEmbeddings| e.rows(ids.clone(), &cpu).unwrap();
        assert_eq!(rows(&mapped).dims(), [4, hidden]);
        assert_eq!(
            rows(&mapped).to_vec2::<f32>().unwrap(),
            rows(&copied).to_vec2::<f32>().unwrap()
        );
    }
}
