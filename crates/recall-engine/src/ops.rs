//! recall's CPU kernels as candle operations: the encoder stays a graph of
//! candle tensors (so GPUs run candle's own ops) while on the CPU its
//! matmuls, attention and element-wise work run recall's kernels, in
//! place where they can.

use candle_core::{CpuStorage, InplaceOp2, InplaceOp3, Layout};
use rayon::prelude::*;

use crate::attention::Scores;
use crate::kernels::fused::{activate, bias_gelu, softmax};
use crate::model::config::Activation;
use crate::proj::ProjWeight;

/// The contiguous f32 data of a tensor, or why not.
pub(crate) fn data<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
    what: &str,
) -> candle_core::Result<&'a [f32]> {
    let all = storage.as_slice::<f32>()?;
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&all[start..end]),
        None => candle_core::bail!("{what}: expected a contiguous f32 tensor"),
    }
}

/// The contiguous f32 data of a tensor to be overwritten, or why not.
fn data_mut<'a>(
    storage: &'a mut CpuStorage,
    layout: &Layout,
    what: &str,
) -> candle_core::Result<&'a mut [f32]> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("{what}: expected a contiguous tensor");
    };
    match storage {
        CpuStorage::F32(all) => Ok(&mut all[start..end]),
        _ => candle_core::bail!("{what}: expected f32"),
    }
}

/// `x = act(x + bias)` in place, `bias` broadcast over the rows of `x`: `x`
/// is a matmul's fresh output, so no second buffer is allocated (and its
/// pages zeroed).
pub struct BiasAct {
    pub act: Option<Activation>,
}

impl InplaceOp2 for BiasAct {
    fn name(&self) -> &'static str {
        "recall-bias-act"
    }

    fn cpu_fwd(
        &self,
        x: &mut CpuStorage,
        x_layout: &Layout,
        bias: &CpuStorage,
        bias_layout: &Layout,
    ) -> candle_core::Result<()> {
        let bias = data(bias, bias_layout, "bias")?;
        let x = data_mut(x, x_layout, "x")?;
        let n = bias.len();
        if n == 0 || x.len() % n != 0 {
            candle_core::bail!("bias of {n} for rows of {} elements", x.len());
        }
        if self.act == Some(Activation::Gelu) {
            x.par_chunks_mut(n).for_each(|row| bias_gelu(row, bias));
            return Ok(());
        }
        x.par_chunks_mut(n).for_each(|row| {
            for (v, &b) in row.iter_mut().zip(bias) {
                *v = activate(self.act, *v + b);
            }
        });
        Ok(())
    }
}

/// `x = x + bias + residual` in place, `bias` broadcast over the rows.
pub struct BiasResidual;

impl InplaceOp3 for BiasResidual {
    fn name(&self) -> &'static str {
        "recall-bias-residual"
    }

    fn cpu_fwd(
        &self,
        x: &mut CpuStorage,
        x_layout: &Layout,
        bias: &CpuStorage,
        bias_layout: &Layout,
        residual: &CpuStorage,
        residual_layout: &Layout,
    ) -> candle_core::Result<()> {
        let bias = data(bias, bias_layout, "bias")?;
        let residual = data(residual, residual_layout, "residual")?;
        let x = data_mut(x, x_layout, "x")?;
        let n = bias.len();
        if n == 0 || x.len() % n != 0 || residual.len() != x.len() {
            candle_core::bail!("bias-residual: shapes do not match");
        }
        x.par_chunks_mut(n)
            .zip(residual.par_chunks(n))
            .for_each(|(row, res)| {
                for ((v, &b), &r) in row.iter_mut().zip(bias).zip(res) {
                    *v = *v + b + r;
                }
            });
        Ok(())
    }
}

/// Softmax over the last dimension, in place: the attention scores are the
/// largest tensor of a long input (16 heads × 2048 × 2048 floats is 256 MiB
/// per block), so no second one is allocated. Rows run in parallel, and
/// `exp` is vectorised (`exp_in_place`): libm's scalar `expf` was a tenth
/// of the time at 2048 tokens.
pub struct SoftmaxInPlace;

impl candle_core::InplaceOp1 for SoftmaxInPlace {
    fn name(&self) -> &'static str {
        "recall-softmax-in-place"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("softmax: expected a contiguous tensor");
        };
        let width = layout.dims().last().copied().unwrap_or(0);
        let CpuStorage::F32(all) = storage else {
            candle_core::bail!("softmax: expected f32");
        };
        if width == 0 {
            return Ok(());
        }
        all[start..end].par_chunks_mut(width).for_each(softmax);
        Ok(())
    }
}

/// `x · Wᵀ` with weights packed at load (f32 or int8), as a candle op
/// (CPU, f32 `x`).
pub(crate) struct PackedMatmulT<'a>(pub(crate) &'a ProjWeight);

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
        let x = data(x, layout, "x")?;
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
pub(crate) struct PackedAttention<'a> {
    pub(crate) lens: &'a [usize],
    pub(crate) heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) scores: Scores,
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
        let qkv = data(qkv, layout, "qkv")?;
        let out =
            crate::attention::attention(qkv, self.lens, self.heads, self.head_dim, self.scores)?;
        Ok((
            candle_core::CpuStorage::F32(out),
            candle_core::Shape::from((total, h)),
        ))
    }
}
