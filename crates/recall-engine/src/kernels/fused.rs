//! The element-wise arithmetic after the encoder's matmuls, one row at a
//! time: the activations, GELU's erf and softmax's exp vectorised (AVX2,
//! NEON) within 3e-7 of libm's `erff`, so outputs are unchanged at the
//! parity tests' 1e-5. `crate::ops` runs it in place on a matmul's output,
//! every core at once (candle's CPU element-wise ops run on one thread, each
//! into a fresh buffer); other devices use candle's ops.

use crate::model::config::Activation;

pub(crate) fn activate(act: Option<Activation>, x: f32) -> f32 {
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

/// Softmax of one row, in place.
pub(crate) fn softmax(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum = exp_in_place(row, max);
    let scale = 1.0 / sum;
    row.iter_mut().for_each(|v| *v *= scale);
}

/// `row = gelu(row + bias)`, erf's exact GELU, vectorised where the CPU
/// allows (libm's scalar erff was a sixth of a q8 forward pass).
pub(crate) fn bias_gelu(row: &mut [f32], bias: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::cpu().avx2_fma {
        // SAFETY: `cpu()` found AVX2 and FMA, just checked.
        return unsafe { avx2_math::bias_gelu(row, bias) };
    }
    // SAFETY: NEON is in every aarch64 target's baseline (the whole binary
    // is built to use it).
    #[cfg(target_arch = "aarch64")]
    return unsafe { neon_math::bias_gelu(row, bias) };
    #[allow(unreachable_code)]
    for (v, &b) in row.iter_mut().zip(bias) {
        *v = activate(Some(Activation::Gelu), *v + b);
    }
}

/// `v = exp(v - shift)` for every element; returns their sum.
fn exp_in_place(row: &mut [f32], shift: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::cpu().avx2_fma {
        // SAFETY: `cpu()` found AVX2 and FMA, just checked.
        return unsafe { avx2_math::exp_in_place(row, shift) };
    }
    // SAFETY: NEON is in every aarch64 target's baseline (the whole binary
    // is built to use it).
    #[cfg(target_arch = "aarch64")]
    return unsafe { neon_math::exp_in_place(row, shift) };
    #[allow(unreachable_code)]
    row.iter_mut()
        .map(|v| {
            *v = (*v - shift).exp();
            *v
        })
        .sum()
}

/// erf's rational approximation as Eigen and XLA compute it in f32: `x ·
/// P(x²) / Q(x²)` on x clamped to [-4, 4] (beyond, erf is ±1 in f32).
const ERF_P: [f32; 7] = [
    -2.726_142_3e-10,
    2.770_681_4e-8,
    -2.101_024e-6,
    -5.692_506_4e-5,
    -7.349_906_3e-4,
    -2.954_6e-3,
    -1.609_603_3e-2,
];
const ERF_Q: [f32; 5] = [
    -1.456_607_2e-5,
    -2.133_740_6e-4,
    -1.682_827e-3,
    -7.373_329e-3,
    -1.426_474e-2,
];

/// Cephes' `expf` (as in avx_mathfun): 2ⁿ · e^r with n = ⌊x·log₂e + ½⌋, r =
/// x - n·ln 2 (ln 2 in two parts, exact products) and a degree-6
/// polynomial for e^r, `EXP_P` then `r²·P(r) + r + 1`; x clamped to where
/// the result is a normal f32.
const EXP_MAX: f32 = 88.376_26;
const EXP_MIN: f32 = -87.336_55;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const EXP_P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];

#[cfg(target_arch = "x86_64")]
mod avx2_math {
    use std::arch::x86_64::*;

    /// erf as Eigen and XLA compute it in f32: `x · P(x²) / Q(x²)` on x
    /// clamped to [-4, 4] (beyond, erf is ±1 in f32).
    #[target_feature(enable = "avx2,fma")]
    fn erf8(x: __m256) -> __m256 {
        let x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(4.0)), _mm256_set1_ps(-4.0));
        let x2 = _mm256_mul_ps(x, x);
        let poly = |coefficients: &[f32]| {
            let mut p = _mm256_set1_ps(coefficients[0]);
            for &c in &coefficients[1..] {
                p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(c));
            }
            p
        };
        let (p, q) = (poly(&super::ERF_P), poly(&super::ERF_Q));
        _mm256_div_ps(_mm256_mul_ps(x, p), q)
    }

    /// `row = gelu(row + bias)`, erf's exact GELU (`0.5 · x · (1 + erf(x/√2))`).
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn bias_gelu(row: &mut [f32], bias: &[f32]) {
        let len = row.len().min(bias.len());
        let lanes = len / 8 * 8;
        for i in (0..lanes).step_by(8) {
            // SAFETY: i + 8 <= lanes <= both lengths.
            let (r, b) = unsafe {
                (
                    _mm256_loadu_ps(row.as_ptr().add(i)),
                    _mm256_loadu_ps(bias.as_ptr().add(i)),
                )
            };
            let x = _mm256_add_ps(r, b);
            let e = erf8(_mm256_mul_ps(
                x,
                _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2),
            ));
            let half_x = _mm256_mul_ps(x, _mm256_set1_ps(0.5));
            let y = _mm256_fmadd_ps(half_x, e, half_x);
            // SAFETY: i + 8 <= lanes <= row.len().
            unsafe { _mm256_storeu_ps(row.as_mut_ptr().add(i), y) };
        }
        for i in lanes..len {
            row[i] = super::activate(Some(super::Activation::Gelu), row[i] + bias[i]);
        }
    }

    /// Cephes' `expf` (as in avx_mathfun): 2ⁿ · e^r with |r| ≤ ½ ln 2 and a
    /// degree-6 polynomial for e^r; relative error about 1e-7, as libm's.
    #[target_feature(enable = "avx2,fma")]
    fn exp8(x: __m256) -> __m256 {
        let x = _mm256_max_ps(
            _mm256_min_ps(x, _mm256_set1_ps(super::EXP_MAX)),
            _mm256_set1_ps(super::EXP_MIN),
        );
        let n = _mm256_floor_ps(_mm256_fmadd_ps(
            x,
            _mm256_set1_ps(std::f32::consts::LOG2_E),
            _mm256_set1_ps(0.5),
        ));
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(super::LN2_HI), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(super::LN2_LO), r);
        let mut p = _mm256_set1_ps(super::EXP_P[0]);
        for &c in &super::EXP_P[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let y = _mm256_fmadd_ps(
            p,
            _mm256_mul_ps(r, r),
            _mm256_add_ps(r, _mm256_set1_ps(1.0)),
        );
        let pow2n = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        _mm256_mul_ps(y, _mm256_castsi256_ps(pow2n))
    }

    /// `v = exp(v - shift)` for every element; returns their sum.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn exp_in_place(row: &mut [f32], shift: f32) -> f32 {
        let s = _mm256_set1_ps(shift);
        let mut sum = _mm256_setzero_ps();
        let mut chunks = row.chunks_exact_mut(8);
        for c in &mut chunks {
            // SAFETY: `c` is 8 floats.
            let e = exp8(_mm256_sub_ps(unsafe { _mm256_loadu_ps(c.as_ptr()) }, s));
            // SAFETY: as the load.
            unsafe { _mm256_storeu_ps(c.as_mut_ptr(), e) };
            sum = _mm256_add_ps(sum, e);
        }
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` is 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sum) };
        let mut total: f32 = lanes.iter().sum();
        for v in chunks.into_remainder() {
            *v = (*v - shift).exp();
            total += *v;
        }
        total
    }
}

/// `avx2_math` on NEON's 4 lanes: the same polynomials.
#[cfg(target_arch = "aarch64")]
mod neon_math {
    use std::arch::aarch64::*;

    #[target_feature(enable = "neon")]
    fn erf4(x: float32x4_t) -> float32x4_t {
        let x = vmaxq_f32(vminq_f32(x, vdupq_n_f32(4.0)), vdupq_n_f32(-4.0));
        let x2 = vmulq_f32(x, x);
        let poly = |coefficients: &[f32]| {
            let mut p = vdupq_n_f32(coefficients[0]);
            for &c in &coefficients[1..] {
                p = vfmaq_f32(vdupq_n_f32(c), p, x2);
            }
            p
        };
        let (p, q) = (poly(&super::ERF_P), poly(&super::ERF_Q));
        vdivq_f32(vmulq_f32(x, p), q)
    }

    /// `row = gelu(row + bias)`, as `avx2_math::bias_gelu`.
    #[target_feature(enable = "neon")]
    pub(super) fn bias_gelu(row: &mut [f32], bias: &[f32]) {
        let len = row.len().min(bias.len());
        let lanes = len / 4 * 4;
        for i in (0..lanes).step_by(4) {
            // SAFETY: i + 4 <= lanes <= both lengths.
            let (r, b) = unsafe {
                (
                    vld1q_f32(row.as_ptr().add(i)),
                    vld1q_f32(bias.as_ptr().add(i)),
                )
            };
            let x = vaddq_f32(r, b);
            let e = erf4(vmulq_f32(x, vdupq_n_f32(std::f32::consts::FRAC_1_SQRT_2)));
            let half_x = vmulq_f32(x, vdupq_n_f32(0.5));
            // SAFETY: i + 4 <= lanes <= row.len().
            unsafe { vst1q_f32(row.as_mut_ptr().add(i), vfmaq_f32(half_x, half_x, e)) };
        }
        for i in lanes..len {
            row[i] = super::activate(Some(super::Activation::Gelu), row[i] + bias[i]);
        }
    }

    #[target_feature(enable = "neon")]
    fn exp4(x: float32x4_t) -> float32x4_t {
        let x = vmaxq_f32(
            vminq_f32(x, vdupq_n_f32(super::EXP_MAX)),
            vdupq_n_f32(super::EXP_MIN),
        );
        let n = vrndmq_f32(vfmaq_f32(
            vdupq_n_f32(0.5),
            x,
            vdupq_n_f32(std::f32::consts::LOG2_E),
        ));
        let r = vfmsq_f32(x, n, vdupq_n_f32(super::LN2_HI));
        let r = vfmsq_f32(r, n, vdupq_n_f32(super::LN2_LO));
        let mut p = vdupq_n_f32(super::EXP_P[0]);
        for &c in &super::EXP_P[1..] {
            p = vfmaq_f32(vdupq_n_f32(c), p, r);
        }
        let y = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0)), p, vmulq_f32(r, r));
        let pow2n = vshlq_n_s32::<23>(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)));
        vmulq_f32(y, vreinterpretq_f32_s32(pow2n))
    }

    /// `v = exp(v - shift)` for every element; returns their sum.
    #[target_feature(enable = "neon")]
    pub(super) fn exp_in_place(row: &mut [f32], shift: f32) -> f32 {
        let s = vdupq_n_f32(shift);
        let mut sum = vdupq_n_f32(0.0);
        let mut chunks = row.chunks_exact_mut(4);
        for c in &mut chunks {
            // SAFETY: `c` is 4 floats.
            let e = exp4(vsubq_f32(unsafe { vld1q_f32(c.as_ptr()) }, s));
            // SAFETY: as the load.
            unsafe { vst1q_f32(c.as_mut_ptr(), e) };
            sum = vaddq_f32(sum, e);
        }
        let mut total = vaddvq_f32(sum);
        for v in chunks.into_remainder() {
            *v = (*v - shift).exp();
            total += *v;
        }
        total
    }
}

#[cfg(test)]
mod tests {
    // The vector loops where the CPU has them (AVX2 and FMA; NEON), else
    // libm itself.

    #[test]
    fn gelu_matches_libm_erff() {
        let xs: Vec<f32> = (0..40_001).map(|i| -20.0 + i as f32 * 0.001).collect();
        let mut got = xs.clone();
        super::bias_gelu(&mut got, &vec![0f32; xs.len()]);
        for (x, g) in xs.iter().zip(&got) {
            let want = super::activate(Some(super::Activation::Gelu), *x);
            assert!(
                (g - want).abs() <= 3e-7 * x.abs().max(1.0),
                "gelu({x}) = {g}, libm {want}"
            );
        }
    }

    #[test]
    fn matches_libm_expf() {
        let xs: Vec<f32> = (0..20_000).map(|i| -100.0 + i as f32 * 0.0055).collect();
        let mut got = xs.clone();
        super::exp_in_place(&mut got, 0.0);
        for (x, g) in xs.iter().zip(&got) {
            let want = x.exp();
            assert!(
                (g - want).abs() <= 3e-7 * want + f32::MIN_POSITIVE,
                "exp({x}) = {g}, libm {want}"
            );
        }
    }
}
