//! `x · Wᵀ` for the encoder's linear layers on x86-64 CPUs.
//!
//! With AVX-512 (`PackedLinear`): the weights are packed once, at load,
//! into panels of 64 output columns (`k` rows of 64 floats each), and a
//! tile of 6 input rows × 64 columns keeps 24 accumulators in registers:
//! each weight load feeds 6 FMAs, each broadcast input 4. Panels are split
//! between threads; a block of DEPTH positions of a panel stays in L2 while
//! every row tile uses it. About 200 GFLOP/s on 2 Zen 4 cores, at 16 rows
//! as at 2048, against 110-190 for candle's `gemm` (AVX2 kernels, and the
//! weights re-packed on every call). Attention uses it too (`attention`).
//!
//! Without AVX-512, on CPUs with AVX2 and FMA, for few rows (`matmul_t`):
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

/// Rows of `padded` (`np` wide, whole panels) cut to their first `n`
/// columns.
pub(crate) fn without_padding(padded: Vec<f32>, np: usize, n: usize) -> Vec<f32> {
    if np == n {
        return padded;
    }
    padded.chunks(np).flat_map(|r| &r[..n]).copied().collect()
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

/// Output columns per panel of a `PackedLinear`: four AVX-512 registers.
const PANEL: usize = 64;
/// Input rows per `PackedLinear` tile: 6 × 4 accumulators of the 32 registers.
const PANEL_ROWS: usize = 6;
/// Input positions per pass over the rows: a panel's block of weights
/// (PANEL × DEPTH floats, 128 KiB) stays in L2 while every row tile uses it.
const DEPTH: usize = 512;

/// A linear layer's f32 weight `[n, k]`, packed once at load: panels of
/// PANEL output columns, and within a panel, `k` rows of PANEL floats.
pub struct PackedLinear {
    n: usize,
    k: usize,
    /// `[panels][k][PANEL]`, zero past `n`.
    packed: Vec<f32>,
}

/// Whether this CPU has AVX-512F, which `PackedLinear` needs (checked once).
pub fn packed_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            std::env::var("RECALL_MATMUL").map_or(true, |v| v != "candle" && v != "avx2")
                && std::arch::is_x86_feature_detected!("avx512f")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

impl PackedLinear {
    /// Packs `w: [n, k]` (row-major).
    pub fn pack(w: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), n * k, "w is not [n, k]");
        let np = n.next_multiple_of(PANEL);
        let mut packed = vec![0f32; np * k];
        packed
            .par_chunks_mut(PANEL * k.max(1))
            .enumerate()
            .for_each(|(p, panel)| {
                // 16 positions of each row at a time: its reads are whole
                // cache lines, its writes 16 lines that stay in L1.
                const STEP: usize = 16;
                for (c, row) in (p * PANEL..n.min((p + 1) * PANEL)).enumerate() {
                    let row = &w[row * k..(row + 1) * k];
                    for (d0, part) in row.chunks(STEP).enumerate() {
                        let out = &mut panel[d0 * STEP * PANEL + c..];
                        for (j, &v) in part.iter().enumerate() {
                            out[j * PANEL] = v;
                        }
                    }
                }
            });
        Self { n, k, packed }
    }

    /// Packs a weight given as its transpose, `wt: [k, n]` (row-major):
    /// then `matmul_t(x)` is `x · wt`.
    pub fn pack_transposed(wt: &[f32], k: usize, n: usize) -> Self {
        assert_eq!(wt.len(), k * n, "wt is not [k, n]");
        let np = n.next_multiple_of(PANEL);
        let mut packed = vec![0f32; np * k];
        for (p, panel) in packed.chunks_mut(PANEL * k.max(1)).enumerate() {
            let cols = PANEL.min(n - p * PANEL);
            for (d, row) in panel.chunks_mut(PANEL).enumerate() {
                row[..cols].copy_from_slice(&wt[d * n + p * PANEL..][..cols]);
            }
        }
        Self { n, k, packed }
    }

    /// Output columns.
    pub fn out_features(&self) -> usize {
        self.n
    }

    /// Input columns.
    pub fn in_features(&self) -> usize {
        self.k
    }

    /// `x · Wᵀ` for `x: [m, k]` (row-major): `[m, n]`. Panics without
    /// AVX-512F (`packed_available`).
    pub fn matmul_t(&self, x: &[f32], m: usize) -> Vec<f32> {
        assert!(packed_available(), "PackedLinear on a CPU without AVX-512F");
        let (n, k) = (self.n, self.k);
        assert_eq!(x.len(), m * k, "x is not [m, k]");
        let np = n.next_multiple_of(PANEL);
        if m == 0 || n == 0 || k == 0 {
            return vec![0f32; m * n];
        }
        let mut out = Vec::<f32>::with_capacity(m * np);
        let dst = Dst(out.as_mut_ptr());
        (0..np / PANEL).into_par_iter().for_each(|p| {
            let panel = &self.packed[p * PANEL * k..(p + 1) * PANEL * k];
            for d in (0..k).step_by(DEPTH) {
                let depth = DEPTH.min(k - d);
                for i in (0..m).step_by(PANEL_ROWS) {
                    let rows = PANEL_ROWS.min(m - i);
                    let xr: [*const f32; PANEL_ROWS] =
                        std::array::from_fn(|r| x[(i + r.min(rows - 1)) * k + d..].as_ptr());
                    // SAFETY: rows i..i + rows of `out` (np wide) exist,
                    // panel p's columns are this task's alone, and the first
                    // depth block wrote them before later ones read them;
                    // each x row has `depth` floats from d.
                    #[cfg(target_arch = "x86_64")]
                    unsafe {
                        tile_avx512(
                            &xr,
                            panel[d * PANEL..].as_ptr(),
                            depth,
                            dst.at(i * np + p * PANEL),
                            np,
                            rows,
                            d > 0,
                        )
                    }
                }
            }
        });
        // SAFETY: the tiles wrote every element of the m rows.
        unsafe { out.set_len(m * np) };
        without_padding(out, np, n)
    }
}

/// `out[r] (+)= x[r][..depth] · panel` for `rows` rows (the others repeat
/// the last), 64 columns, with 24 accumulators.
///
/// # Safety
/// AVX-512F; `x` rows hold `depth` floats, `panel` `depth × PANEL`, `out`
/// `rows` rows of PANEL floats `stride` apart.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile_avx512(
    x: &[*const f32; PANEL_ROWS],
    panel: *const f32,
    depth: usize,
    out: *mut f32,
    stride: usize,
    rows: usize,
    accumulate: bool,
) {
    use std::arch::x86_64::*;
    const REGS: usize = PANEL / 16;
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); REGS]; PANEL_ROWS];
        if accumulate {
            for (r, acc) in acc.iter_mut().enumerate().take(rows) {
                for (c, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_loadu_ps(out.add(r * stride + c * 16));
                }
            }
        }
        for d in 0..depth {
            let b = panel.add(d * PANEL);
            let wv: [__m512; REGS] = std::array::from_fn(|c| _mm512_loadu_ps(b.add(c * 16)));
            for (r, acc) in acc.iter_mut().enumerate() {
                let xv = _mm512_set1_ps(*x[r].add(d));
                for c in 0..REGS {
                    acc[c] = _mm512_fmadd_ps(xv, wv[c], acc[c]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate().take(rows) {
            for (c, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(out.add(r * stride + c * 16), *a);
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

    /// Each product of `sizes` against `reference`, on inputs in -1..1.
    fn check(
        sizes: &[(usize, usize, usize)],
        matmul: impl Fn(&[f32], &[f32], usize, usize, usize) -> Vec<f32>,
    ) {
        for &(m, k, n) in sizes {
            let x: Vec<f32> = (0..m * k)
                .map(|v| ((v * 7919 % 1000) as f32 / 500.0) - 1.0)
                .collect();
            let w: Vec<f32> = (0..n * k)
                .map(|v| ((v * 104729 % 997) as f32 / 498.0) - 1.0)
                .collect();
            let got = matmul(&x, &w, m, k, n);
            let want = reference(&x, &w, m, k, n);
            assert_eq!(got.len(), want.len());
            for (idx, (g, r)) in got.iter().zip(&want).enumerate() {
                let tol = 1e-4 * (k as f32).sqrt() * r.abs().max(1.0);
                assert!((g - r).abs() <= tol, "{m}x{k}x{n} at {idx}: {g} vs {r}");
            }
        }
    }

    #[test]
    fn packed_matches_a_plain_loop_at_every_edge() {
        if !packed_available() {
            eprintln!("packed matmul: this CPU lacks AVX-512F; the encoder uses the AVX2 kernels");
            return;
        }
        // Remainders in rows (tile of 6), columns (panel of 64) and depth
        // (block of DEPTH), and sizes with none.
        let sizes = [
            (1, 1, 1),
            (5, 13, 7),
            (6, 64, 64),
            (13, DEPTH + 3, 130),
            (16, 2 * DEPTH, 192),
            (7, 3 * DEPTH + 1, 65),
        ];
        check(&sizes, |x, w, m, k, n| {
            PackedLinear::pack(w, n, k).matmul_t(x, m)
        });
    }

    #[test]
    fn matches_a_plain_loop_at_every_edge() {
        if !available() {
            eprintln!("matmul kernel: this CPU lacks AVX2/FMA; the encoder uses candle's matmul");
            return;
        }
        // Sizes that leave remainders everywhere: rows (tile), columns
        // (tile, task) and depth (16 lanes), and sizes with none.
        let sizes = [
            (1, 8, 1),
            (5, 13, 7),
            (16, 1024, 50),
            (131, 1100, 97),
            (3, 4096, 3),
            (4, 16, 96),
        ];
        check(&sizes, matmul_t);
    }
}
