//! The encoder's linear layers, `x · Wᵀ + b`: each holds its weight for
//! the kernel its dtype and the CPU pick (candle's matmul, recall's packed
//! f32 or bf16 tile, or int8), packs it at load or reads it from a pack
//! file, and applies the bias, activation and residual after the matmul.

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::Linear;

use crate::dtype::Dtype;
use crate::kernels::bf16::Bf16Linear;
use crate::kernels::matmul::{PackedLinear, packed_available};
use crate::kernels::quant::QLinear;
use crate::model::config::Activation;
use crate::model::weights::Weights;
use crate::ops::PackedMatmulT;
use crate::packcache::{Reader, Writer};

/// A linear layer of the encoder: `x · Wᵀ + b`.
pub(crate) struct Proj {
    pub(crate) weight: ProjWeight,
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

/// How q8 runs a model, from `crate::calibrate`: the input channels each
/// layer's projections keep out of the int8 product, and the layers that
/// run wholly in f32 because int8 there took the model's vectors below the
/// fidelity bar.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Q8Plan {
    /// Per layer (a layer past the list keeps none).
    pub outliers: Vec<ProjInputs<Vec<usize>>>,
    /// Ascending.
    pub f32_layers: Vec<usize>,
}

impl Q8Plan {
    /// The dtype layer `i` of a `dtype` encoder runs in.
    pub(crate) fn layer_dtype(&self, dtype: Dtype, i: usize) -> Dtype {
        match dtype {
            Dtype::Q8 if self.f32_layers.contains(&i) => Dtype::F32,
            other => other,
        }
    }
}

pub(crate) enum ProjWeight {
    F32(Tensor),
    /// f32, packed for recall's kernel (CPUs with AVX2 and FMA).
    Packed(PackedLinear),
    Q8(QLinear),
    Bf16(Bf16Linear),
}

impl ProjWeight {
    /// Whether weights of `dtype` on `device` are packed for recall's CPU
    /// kernels (else kept as a tensor for candle's matmul).
    pub(crate) fn packs(dtype: Dtype, device: &Device) -> bool {
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
    pub(crate) fn push<'a>(&'a self, writer: &mut Writer<'a>) {
        match self {
            Self::F32(_) => {}
            Self::Packed(w) => writer.push(w),
            Self::Q8(w) => writer.push(w),
            Self::Bf16(w) => writer.push(w),
        }
    }
}

/// The kernel `dtype`'s packed layers are laid out for on this CPU, as a
/// pack file names it; q8's with its weights' revision, outlier channels
/// (a digest of them: they decide what is packed) and the layers packed
/// for the f32 kernel instead.
pub(crate) fn packed_kernel(dtype: Dtype, plan: &Q8Plan) -> Result<String> {
    let f32_kernel = || format!("{:?}", crate::kernels::matmul::PackedKernel::get());
    Ok(match dtype {
        Dtype::F32 => f32_kernel(),
        Dtype::Bf16 => format!("{:?}", crate::kernels::bf16::Bf16Kernel::get()),
        Dtype::Q8 => {
            use sha2::{Digest, Sha256};
            let kernel = crate::kernels::quant::Q8Kernel::get();
            let digest = Sha256::digest(serde_json::to_vec(&plan.outliers)?);
            let short: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
            // "in panels": the layout of the f32 channels' weights.
            let mut name = format!(
                "{kernel:?} {} outliers {short} in panels",
                kernel.revision_tag()
            );
            if !plan.f32_layers.is_empty() {
                name += &format!(", layers {:?} {}", plan.f32_layers, f32_kernel());
            }
            name
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
    pub(crate) fn load(
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
            ProjWeight::pack(dtype, crate::ops::data(cpu, layout, "W")?, n, k, outliers)
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

/// Query, key and value of the attention `name` stacked into one layer
/// (`Layer::qkv`), the query scaled by 1/√head_dim; with `packs`, its
/// packed weight is the pack file's next part.
pub(crate) fn qkv(
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

/// `act(x · Wᵀ + b)`: on the CPU the bias and activation are one parallel
/// pass over the matmul's output, in place (`ops::BiasAct`).
pub(crate) fn project(x: &Tensor, l: &Proj, act: Option<Activation>) -> Result<Tensor> {
    let y = l.matmul_t(x)?;
    let bias = &l.bias;
    if y.device().is_cpu() {
        y.inplace_op2(bias, &crate::ops::BiasAct { act })?;
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
pub(crate) fn project_add(x: &Tensor, l: &Proj, residual: &Tensor) -> Result<Tensor> {
    let y = l.matmul_t(x)?;
    let bias = &l.bias;
    if y.device().is_cpu() && residual.is_contiguous() {
        y.inplace_op3(bias, residual, &crate::ops::BiasResidual)?;
        return Ok(y);
    }
    Ok(y.broadcast_add(bias)?.add(residual)?)
}
