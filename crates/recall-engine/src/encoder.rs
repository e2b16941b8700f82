//! recall's own BERT / XLM-RoBERTa encoder on candle.
//!
//! A batch is packed: the tokens of every input are laid end to end as one
//! `[total_tokens, hidden]` matrix, so no work is spent on padding and the
//! linear layers see one large matrix. Attention runs per input over query
//! blocks, so its memory stays bounded at any length (8192 tokens included).
//! Position ids are integers computed on the host, as Hugging Face does.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::{D, Device, Tensor};
use candle_nn::{LayerNorm, Module};

use crate::attention::Scores;
use crate::dtype::Dtype;
use crate::embeddings::{WORD_EMBEDDINGS, WordEmbeddings};
use crate::model::config::EncoderConfig;
use crate::model::weights::Weights;
use crate::ops::PackedAttention;
use crate::packcache::{PackFile, Reader, Writer};
use crate::proj::{Proj, ProjWeight, packed_kernel, project, project_add, qkv};
pub use crate::proj::{ProjInputs, Q8Plan};

/// Upper bound on one attention score block (heads × query rows × keys), in
/// f32 elements: 32 Mi elements is 128 MiB.
const SCORE_BLOCK_ELEMENTS: usize = 32 << 20;

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

impl Layer {
    /// Layer `i` of `weights` in `dtype`, q8 keeping `outliers` in f32; with
    /// `packs`, its packed weights are the pack file's next parts.
    fn load(
        c: &EncoderConfig,
        weights: &Weights,
        i: usize,
        dev: &Device,
        dtype: Dtype,
        outliers: &ProjInputs<Vec<usize>>,
        mut packs: Option<&mut Reader>,
    ) -> Result<Self> {
        let (p, h) = (format!("encoder.layer.{i}"), c.hidden_size);
        let qkv = {
            let name = format!("{p}.attention.self");
            let packs = packs.as_deref_mut();
            let heads = (h, c.num_heads);
            qkv(weights, &name, heads, dev, dtype, &outliers.qkv, packs)?
        };
        let mut proj = |name: &str, shape, outliers| {
            let packs = packs.as_deref_mut();
            let name = format!("{p}.{name}");
            Proj::load(weights, &name, shape, dev, dtype, outliers, packs)
        };
        let norm =
            |name: &str| layer_norm(weights, &format!("{p}.{name}"), h, c.layer_norm_eps, dev);
        Ok(Self {
            qkv,
            attn_out: proj("attention.output.dense", (h, h), &outliers.attn_out)?,
            attn_norm: norm("attention.output.LayerNorm")?,
            intermediate: proj(
                "intermediate.dense",
                (c.intermediate_size, h),
                &outliers.intermediate,
            )?,
            output: proj("output.dense", (h, c.intermediate_size), &outliers.output)?,
            out_norm: norm("output.LayerNorm")?,
        })
    }
}

/// What `Encoder::forward_trace` keeps.
pub struct Trace {
    /// Each layer's input, then the last layer's output: `[sum of
    /// lengths, hidden]` each.
    pub hidden: Vec<Tensor>,
    /// Per layer, the largest magnitude each input channel of its
    /// projections reached.
    pub peaks: Vec<ProjInputs<Vec<f32>>>,
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
    /// first load writes. q8 runs as `plan` says (outlier channels and
    /// layers in f32).
    pub fn load(
        config: &EncoderConfig,
        weights: &mut Weights,
        device: &Device,
        dtype: Dtype,
        plan: &Q8Plan,
        pack_dir: Option<&Path>,
    ) -> Result<Self> {
        if dtype != Dtype::F32 && !device.is_cpu() {
            anyhow::bail!("`Dtype::{dtype:?}` runs on the CPU only, not on {device:?}");
        }
        if dtype == Dtype::Q8
            && crate::kernels::quant::Q8Kernel::get() == crate::kernels::quant::Q8Kernel::Portable
        {
            tracing::warn!(
                "q8 (`Dtype::Q8`): this CPU has no int8 dot product (AVX-512 VNNI, AVX-VNNI, AVX2 or \
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
                &packed_kernel(dtype, plan)?,
            )?),
            _ => None,
        };
        let Some(pack_file) = pack_file else {
            return Self::build(config, weights, device, dtype, plan, None);
        };
        let shown = pack_file.path().display();
        match pack_file.open() {
            Ok(Some(mut reader)) => {
                match Self::build(config, weights, device, dtype, plan, Some(&mut reader))
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
        let encoder = Self::build(config, weights, device, dtype, plan, None)?;
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
            let mapped = Self::build(config, weights, device, dtype, plan, Some(&mut reader))?;
            reader.finish().map(|()| mapped)
        });
        match mapped {
            Ok(mapped) => {
                tracing::debug!("packed weights kept in {shown}");
                Ok(mapped.mapped_from(pack_file.path()))
            }
            Err(e) => {
                tracing::warn!("cannot read back {shown} ({e:#}): packing in memory");
                Self::build(config, weights, device, dtype, plan, None)
            }
        }
    }

    fn build(
        config: &EncoderConfig,
        weights: &Weights,
        device: &Device,
        dtype: Dtype,
        plan: &Q8Plan,
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
        let none = ProjInputs::default();
        let layers = (0..c.num_layers)
            .map(|i| {
                let dtype = plan.layer_dtype(dtype, i);
                let outliers = match dtype {
                    Dtype::Q8 => plan.outliers.get(i).unwrap_or(&none),
                    Dtype::F32 | Dtype::Bf16 => &none,
                };
                // A layer that is not packed (f32 on a CPU without recall's
                // f32 tile) has nothing in the pack file.
                let packs = packs
                    .as_deref_mut()
                    .filter(|_| ProjWeight::packs(dtype, dev));
                Layer::load(c, weights, i, dev, dtype, outliers, packs)
            })
            .collect::<Result<_>>()?;
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

    /// Runs layer `i` in f32 from now on (`crate::calibrate`, where q8 there
    /// costs the model's vectors too much).
    pub(crate) fn demote(&mut self, i: usize, weights: &Weights) -> Result<()> {
        let none = ProjInputs::default();
        let dev = &self.device;
        self.layers[i] = Layer::load(&self.config, weights, i, dev, Dtype::F32, &none, None)?;
        Ok(())
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

    /// `forward`, keeping what `crate::calibrate` measures q8 against: each
    /// layer's input and the last one's output, and for each layer the
    /// largest magnitude each channel of its projections' inputs reached
    /// (where q8 finds the channels it keeps in f32:
    /// `quant::outlier_channels`).
    pub fn forward_trace(&self, inputs: &[&[u32]]) -> Result<Trace> {
        let mut trace = Trace {
            hidden: Vec::with_capacity(self.layers.len() + 1),
            peaks: vec![ProjInputs::default(); self.layers.len()],
        };
        let last = self.run(inputs, &|| {}, Some(&mut trace))?;
        trace.hidden.push(last);
        Ok(trace)
    }

    /// Layer `i` alone, on `x` (the hidden states of inputs of `lens`
    /// tokens, packed); with `peaks`, noting its inputs' largest values.
    pub(crate) fn layer(
        &self,
        i: usize,
        x: &Tensor,
        lens: &[usize],
        peaks: Option<&mut ProjInputs<Vec<f32>>>,
    ) -> Result<Tensor> {
        let forward = || self.layer_forward(&self.layers[i], x, lens, peaks);
        // On a rayon worker, each parallel op inside the layer puts its
        // tasks on the pool's own queues; from any other thread, every op
        // hands its work over and sleeps until it is done: two wake-ups per
        // op, a few hundred per forward pass, a large share of a short
        // query's time (docs/benchmarks.md, "Choices"). GPUs keep their
        // thread.
        if self.device.is_cpu() {
            rayon::scope(|_| forward())
        } else {
            forward()
        }
    }

    /// Layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn run(
        &self,
        inputs: &[&[u32]],
        between_layers: &dyn Fn(),
        mut trace: Option<&mut Trace>,
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
        for i in 0..self.layers.len() {
            between_layers();
            let peaks = trace.as_deref_mut().map(|t| {
                t.hidden.push(hidden.clone());
                &mut t.peaks[i]
            });
            hidden = self
                .layer(i, &hidden, &lens, peaks)
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
                scores.inplace_op1(&crate::ops::SoftmaxInPlace)?;
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

/// `x / max(‖x‖₂, 1e-12)` along the last dimension, as `torch.nn.functional.normalize`.
pub fn l2_normalize(x: &Tensor) -> Result<Tensor> {
    let norm = x
        .sqr()?
        .sum_keepdim(D::Minus1)?
        .sqrt()?
        .clamp(1e-12f32, f32::MAX)?;
    Ok(x.broadcast_div(&norm)?)
}
