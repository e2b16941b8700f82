//! `x · Wᵀ` for the encoder's linear layers on few rows, on x86-64 CPUs
//! with AVX2 and FMA.
//!
//! candle's matmul (the `gemm` crate) packs its right-hand side into panels
//! on every call. For a linear layer that side is the weight matrix, so a
//! short input (a 16-token query) spends most of its time re-packing 1.2 GB
//! of weights that it then reads once. This kernel reads `W` as stored,
//! `[n, k]` row-major: each output is the dot product of an input row and a
//! weight row, both contiguous, and each weight row is read start to end,
//! which is what the hardware prefetcher streams best. A tile holds 4 input
//! rows × 3 weight rows of 8-lane accumulators (12 of the 16 AVX registers),
//! so each load feeds 3 or 4 FMAs. Columns are split between threads.
//!
//! Measured beside candle on this project's 2-core machine (`cargo run
//! --release --example matmul_probe -- M K N`): 2.2-3.3× at 16 rows,
//! 1.2-1.5× at 64 rows of 1024, but 0.8× at 128 rows of 4096 (before the
//! next-tile prefetch) and 0.6× at 1024 rows, where `gemm`'s packed,
//! broadcast kernel reuses each load far more. So the encoder calls it only while `x` fits in L2
//! (`suits`), and candle's beyond.
//!
//! Same products, summed in a different order than `gemm`: results differ
//! by float rounding only (the parity tests hold at 1e-5).

use candle_core::{CpuStorage, CustomOp2, Layout, Shape};
use rayon::prelude::*;

/// The largest `x` (elements) for which this kernel beats candle's: 512 KiB.
const MAX_X_ELEMENTS: usize = 128 * 1024;
/// Input rows and weight rows per tile.
const TILE_ROWS: usize = 4;
const TILE_COLS: usize = 3;
/// Output columns per rayon task: a multiple of `TILE_COLS`.
const COLUMNS_PER_TASK: usize = 48;
/// How far ahead (floats) a weight row is prefetched on its first read.
const PREFETCH: usize = 256;

/// Whether the kernel runs: the CPU has it and `RECALL_MATMUL=candle` (to
/// compare) did not turn it off.
pub fn available() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    !*OFF.get_or_init(|| std::env::var("RECALL_MATMUL").is_ok_and(|v| v == "candle"))
        && cpu_has_avx2_fma()
}

/// Whether this CPU has AVX2 and FMA (checked once).
pub(crate) fn cpu_has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether `x: [m, k]` is small enough for this kernel to beat candle's,
/// and the CPU runs it.
pub fn suits(m: usize, k: usize) -> bool {
    m * k <= MAX_X_ELEMENTS && available()
}

/// `x · Wᵀ` for contiguous f32 `x: [m, k]` and `w: [n, k]`: `[m, n]`.
/// Panics if the kernel is not `available()` or the sizes disagree.
pub fn matmul_t(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    assert!(
        available(),
        "recall's matmul kernel on a CPU without AVX2/FMA"
    );
    assert_eq!(x.len(), m * k, "x is not [m, k]");
    assert_eq!(w.len(), n * k, "w is not [n, k]");
    let mut out = vec![0f32; m * n];
    if m == 0 || n == 0 {
        return out;
    }
    // Rows of x 4 KiB apart would all fall in the same L1 sets as the
    // weight rows; a padded copy spreads them.
    let stride = k + 16;
    let mut padded = vec![0f32; m * stride];
    padded
        .par_chunks_mut(stride)
        .zip(x.par_chunks(k))
        .for_each(|(p, r)| p[..k].copy_from_slice(r));
    let dst = Dst(out.as_mut_ptr());
    let tasks = n.div_ceil(COLUMNS_PER_TASK);
    (0..tasks).into_par_iter().for_each(|t| {
        let cols = t * COLUMNS_PER_TASK..((t + 1) * COLUMNS_PER_TASK).min(n);
        columns(&padded, stride, w, m, k, n, cols, &dst);
    });
    out
}

/// An output buffer, shared by tasks that write disjoint parts of it.
pub(crate) struct Dst(pub(crate) *mut f32);
unsafe impl Sync for Dst {}

impl Dst {
    /// # Safety
    /// `offset` is inside the buffer.
    pub(crate) unsafe fn at(&self, offset: usize) -> *mut f32 {
        unsafe { self.0.add(offset) }
    }
}

/// Every row of output columns `cols`, tile by tile. A tile at an edge
/// repeats the last row of `x` or `W` and drops those results.
#[allow(clippy::too_many_arguments)]
fn columns(
    x: &[f32],
    x_stride: usize,
    w: &[f32],
    m: usize,
    k: usize,
    n: usize,
    cols: std::ops::Range<usize>,
    dst: &Dst,
) {
    let lanes = k / 16 * 16;
    let tiles = m.div_ceil(TILE_ROWS);
    let mut sums = [[0f32; TILE_COLS]; TILE_ROWS];
    for j in cols.clone().step_by(TILE_COLS) {
        let row = |c: usize| w[(j + c).min(n - 1) * k..].as_ptr();
        let wr: [*const f32; TILE_COLS] = std::array::from_fn(row);
        for (t, i) in (0..m).step_by(TILE_ROWS).enumerate() {
            let xr: [*const f32; TILE_ROWS] =
                std::array::from_fn(|r| x[(i + r).min(m - 1) * x_stride..].as_ptr());
            // The first tile of a weight tile reads it from memory and the
            // others from cache, leaving memory idle: so the others fetch
            // the next weight tile's rows, shared out between them, and the
            // first prefetches ahead of its own rows in case they did not.
            let mut ahead = [std::ptr::null::<f32>(); TILE_COLS];
            let mut count = 0;
            for c in 0..TILE_COLS {
                let next = j + TILE_COLS + c;
                if t == 0 {
                    ahead[count] = row(c).wrapping_add(PREFETCH);
                } else if next < cols.end && c % (tiles - 1) == t - 1 {
                    ahead[count] = w[next * k..].as_ptr();
                } else {
                    continue;
                }
                count += 1;
            }
            // SAFETY: `available()` held in `matmul_t`; every row pointer
            // has at least `lanes` floats after it; prefetches never fault.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                avx2(&xr, &wr, &ahead[..count], lanes, &mut sums)
            }
            for (r, row_sums) in sums.iter().enumerate().take(m - i) {
                for (c, sum) in row_sums.iter().enumerate().take(cols.end - j) {
                    let (xrow, wrow) = ((i + r) * x_stride, (j + c) * k);
                    let tail: f32 = (lanes..k).map(|q| x[xrow + q] * w[wrow + q]).sum();
                    // SAFETY: (i + r, j + c) is inside `out`, and column
                    // j + c is this task's alone.
                    unsafe { *dst.at((i + r) * n + j + c) = sum + tail };
                }
            }
        }
    }
}

/// `sums[r][c] = x[r][..lanes] · w[c][..lanes]`, prefetching the rows at
/// `ahead` in step.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2(
    x: &[*const f32; TILE_ROWS],
    w: &[*const f32; TILE_COLS],
    ahead: &[*const f32],
    lanes: usize,
    sums: &mut [[f32; TILE_COLS]; TILE_ROWS],
) {
    use std::arch::x86_64::*;
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); TILE_COLS]; TILE_ROWS];
        let mut p = 0;
        while p < lanes {
            for a in ahead {
                _mm_prefetch::<_MM_HINT_T1>(a.wrapping_add(p) as *const i8);
            }
            for half in [0, 8] {
                let mut wv = [_mm256_setzero_ps(); TILE_COLS];
                for c in 0..TILE_COLS {
                    wv[c] = _mm256_loadu_ps(w[c].add(p + half));
                }
                for r in 0..TILE_ROWS {
                    let xv = _mm256_loadu_ps(x[r].add(p + half));
                    for c in 0..TILE_COLS {
                        acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
                    }
                }
            }
            p += 16;
        }
        for r in 0..TILE_ROWS {
            for c in 0..TILE_COLS {
                let v = acc[r][c];
                let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0b01));
                sums[r][c] = _mm_cvtss_f32(s);
            }
        }
    }
}

/// `x · Wᵀ` as a candle op (CPU, f32, both contiguous).
pub struct MatmulT;

impl CustomOp2 for MatmulT {
    fn name(&self) -> &'static str {
        "recall-matmul-t"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        x_layout: &Layout,
        w: &CpuStorage,
        w_layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (m, k) = x_layout.shape().dims2()?;
        let (n, wk) = w_layout.shape().dims2()?;
        if wk != k {
            candle_core::bail!("x is [{m}, {k}] but W is [{n}, {wk}]");
        }
        let x = crate::fused::data(x, x_layout, "x")?;
        let w = crate::fused::data(w, w_layout, "W")?;
        Ok((
            CpuStorage::F32(matmul_t(x, w, m, k, n)),
            Shape::from((m, n)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k)
                    .map(|p| x[i * k + p] as f64 * w[j * k + p] as f64)
                    .sum::<f64>() as f32;
            }
        }
        out
    }

    #[test]
    fn matches_a_plain_loop_at_every_edge() {
        if !available() {
            eprintln!("matmul kernel: this CPU lacks AVX2/FMA; the encoder uses candle's matmul");
            return;
        }
        // Sizes that leave remainders everywhere: rows (tile), columns
        // (tile, task) and depth (16 lanes), and sizes with none.
        for &(m, k, n) in &[
            (1, 8, 1),
            (5, 13, 7),
            (16, 1024, 50),
            (131, 1100, 97),
            (3, 4096, 3),
            (4, 16, 96),
        ] {
            let x: Vec<f32> = (0..m * k)
                .map(|v| ((v * 7919 % 1000) as f32 / 500.0) - 1.0)
                .collect();
            let w: Vec<f32> = (0..n * k)
                .map(|v| ((v * 104729 % 997) as f32 / 498.0) - 1.0)
                .collect();
            let got = matmul_t(&x, &w, m, k, n);
            let want = reference(&x, &w, m, k, n);
            for (idx, (g, r)) in got.iter().zip(&want).enumerate() {
                let tol = 1e-4 * (k as f32).sqrt() * r.abs().max(1.0);
                assert!((g - r).abs() <= tol, "{m}x{k}x{n} at {idx}: {g} vs {r}");
            }
        }
    }
}
