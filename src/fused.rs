//! The element-wise work after each of the encoder's matmuls, fused into one
//! pass on every core: candle's CPU unary and binary ops run on one thread
//! and each makes a full pass over memory (bias, then activation, then
//! residual). Same arithmetic as candle's ops (libm's `erff` for GELU), so
//! outputs are unchanged. CPU only: other devices use candle's ops.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Shape};
use rayon::prelude::*;

use crate::model::config::Activation;

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

fn activate(act: Option<Activation>, x: f32) -> f32 {
    match act {
        None => x,
        Some(Activation::Gelu) => (libm::erff(x * std::f32::consts::FRAC_1_SQRT_2) + 1.0) * 0.5 * x,
        Some(Activation::GeluTanh) => {
            // candle's `gelu`: the tanh approximation.
            let sqrt_two_over_pi = (2.0f32 / std::f32::consts::PI).sqrt();
            0.5 * x * (1.0 + (sqrt_two_over_pi * x * (1.0 + 0.044715 * x * x)).tanh())
        }
        Some(Activation::Relu) => x.max(0.0),
    }
}

/// `act(x + bias)`, `bias` broadcast over the rows of `x`.
pub struct BiasAct {
    pub act: Option<Activation>,
}

impl CustomOp2 for BiasAct {
    fn name(&self) -> &'static str {
        "recall-bias-act"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        x_layout: &Layout,
        bias: &CpuStorage,
        bias_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, bias) = (data(x, x_layout, "x")?, data(bias, bias_layout, "bias")?);
        let n = bias.len();
        if n == 0 || x.len() % n != 0 {
            candle_core::bail!("bias of {n} for rows of {} elements", x.len());
        }
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(n)
            .zip(x.par_chunks(n))
            .for_each(|(o, row)| {
                for ((o, &v), &b) in o.iter_mut().zip(row).zip(bias) {
                    *o = activate(self.act, v + b);
                }
            });
        Ok((CpuStorage::F32(out), x_layout.shape().clone()))
    }
}

/// `x + bias + residual`, `bias` broadcast over the rows.
pub struct BiasResidual;

impl CustomOp3 for BiasResidual {
    fn name(&self) -> &'static str {
        "recall-bias-residual"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        x_layout: &Layout,
        bias: &CpuStorage,
        bias_layout: &Layout,
        residual: &CpuStorage,
        residual_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = data(x, x_layout, "x")?;
        let bias = data(bias, bias_layout, "bias")?;
        let residual = data(residual, residual_layout, "residual")?;
        let n = bias.len();
        if n == 0 || x.len() % n != 0 || residual.len() != x.len() {
            candle_core::bail!("bias-residual: shapes do not match");
        }
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(n)
            .zip(x.par_chunks(n))
            .zip(residual.par_chunks(n))
            .for_each(|((o, row), res)| {
                for (((o, &v), &b), &r) in o.iter_mut().zip(row).zip(bias).zip(res) {
                    *o = v + b + r;
                }
            });
        Ok((CpuStorage::F32(out), x_layout.shape().clone()))
    }
}
