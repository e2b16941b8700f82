//! `x · Wᵀ` for the encoder's linear layers, on x86-64 CPUs with AVX2 and
//! FMA (`PackedLinear`).
//!
//! candle's matmul (the `gemm` crate) packs its right-hand side into panels
//! on every call. For a linear layer that side is the weight matrix, so a
//! short input (a 16-token query) spends most of its time re-packing 1.2 GB
//! of weights that it then reads once. Here the weights are packed once, at
//! load: panels of 64 output columns, in blocks of DEPTH positions that stay
//! in L2 while every row tile of the input uses them, each block in strips
//! as wide as the tile, read start to end. Panels are split between threads.
//! With few rows (a query) the first row tile of a block waits on memory
//! and the rest find the block in L2, so the next two tiles prefetch the
//! next block between them (`share`): a 16-token query's weights then
//! stream while it computes.
//!
//! The tile is 6 input rows × 64 columns with AVX-512 (24 accumulators:
//! each weight load feeds 6 FMAs, each broadcast input 4), or 6 rows × 16
//! columns with AVX2 (12 accumulators), four strips per panel. On 2 Zen 4
//! cores (`cargo run --release --example matmul_probe -- M K N`): AVX-512
//! 200-215 GFLOP/s at 1024-2048 rows and 120 at 16; AVX2 150-215 at 1024
//! rows, level with the old row kernel at 16; candle's `gemm` 110-190
//! across runs. Attention uses it too (`attention`).
//!
//! Same products, summed in a different order than `gemm`: results differ
//! by float rounding only (the parity tests hold at 1e-5 on every path).

use rayon::prelude::*;

/// Whether this CPU has AVX2 and FMA (checked once).
#[cfg(target_arch = "x86_64")]
pub(crate) fn cpu_has_avx2_fma() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    })
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

/// Output columns per panel of a `PackedLinear`: what one pass of the row
/// tiles over a block of weights covers.
const PANEL: usize = 64;
/// Input rows per `PackedLinear` tile.
const PANEL_ROWS: usize = 6;
/// Input positions per pass over the rows: a panel's block of weights
/// (PANEL × DEPTH floats, 128 KiB) stays in L2 while every row tile uses it.
const DEPTH: usize = 512;

/// The part of the `next` block of weights that row tile `t` of `tiles`
/// prefetches (`PackedLinear`'s and `crate::quant`'s tiles).
/// The first tile reads its own block from memory; the others find it in
/// L2 and would leave memory idle, so the next two fetch the next block
/// between them. A short input (a 16-token query: 3 tiles) then streams
/// the weights while it computes instead of after. With many tiles the
/// first one's wait hardly counts, and the rest prefetch nothing.
pub(crate) fn share<T>(next: &[T], t: usize, tiles: usize) -> &[T] {
    let parts = (tiles - 1).min(PREFETCHING_TILES);
    if t == 0 || t > parts || next.is_empty() {
        return &[];
    }
    let part = t - 1;
    &next[next.len() * part / parts..next.len() * (part + 1) / parts]
}

/// Row tiles after the first that prefetch the next block.
pub(crate) const PREFETCHING_TILES: usize = 2;

/// Prefetches of a range into L2, spread evenly over a loop's steps.
#[cfg(target_arch = "x86_64")]
pub(crate) struct Prefetch {
    start: *const i8,
    lines: usize,
    per_step: usize,
}

#[cfg(target_arch = "x86_64")]
impl Prefetch {
    pub(crate) fn new<T>(range: &[T], steps: usize) -> Self {
        let lines = std::mem::size_of_val(range).div_ceil(64);
        Self {
            start: range.as_ptr() as *const i8,
            lines,
            per_step: lines.div_ceil(steps.max(1)),
        }
    }

    /// The prefetches of loop step `step`.
    #[inline(always)]
    pub(crate) fn step(&self, step: usize) {
        use std::arch::x86_64::*;
        let end = ((step + 1) * self.per_step).min(self.lines);
        for line in step * self.per_step..end {
            // A prefetch never faults, and the line is inside the range.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(self.start.wrapping_add(line * 64)) };
        }
    }
}

/// Tile steps (input positions) between prefetches.
#[cfg(target_arch = "x86_64")]
const PREFETCH_RUN: usize = 16;

/// Which tile `PackedLinear` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackedKernel {
    /// 6 rows × 64 columns, 24 zmm accumulators: a panel in one strip.
    Avx512,
    /// 6 rows × 16 columns, 12 ymm accumulators: a panel in four strips.
    Avx2,
}

impl PackedKernel {
    /// The best tile this CPU runs (checked once), or none: then the
    /// encoder keeps candle's matmul. `RECALL_MATMUL=avx2` forces the AVX2
    /// tile and `RECALL_MATMUL=candle` none, to compare.
    pub fn get() -> Option<PackedKernel> {
        static KERNEL: std::sync::OnceLock<Option<PackedKernel>> = std::sync::OnceLock::new();
        *KERNEL.get_or_init(|| {
            let forced = std::env::var("RECALL_MATMUL").ok();
            #[cfg(target_arch = "x86_64")]
            {
                if forced.as_deref() == Some("candle") {
                    return None;
                }
                if forced.as_deref() != Some("avx2")
                    && std::arch::is_x86_feature_detected!("avx512f")
                {
                    return Some(PackedKernel::Avx512);
                }
                if cpu_has_avx2_fma() {
                    return Some(PackedKernel::Avx2);
                }
            }
            let _ = forced;
            None
        })
    }

    /// Columns per strip: the tile's width.
    fn strip(self) -> usize {
        match self {
            PackedKernel::Avx512 => 64,
            PackedKernel::Avx2 => 16,
        }
    }
}

/// Whether this CPU runs `PackedLinear` (`PackedKernel::get`).
pub fn packed_available() -> bool {
    PackedKernel::get().is_some()
}

/// A linear layer's f32 weight `[n, k]`, packed once at load. Panels of
/// PANEL output columns; a panel in blocks of DEPTH positions; a block in
/// strips as wide as the tile (`PackedKernel::strip`), each `depth` rows of
/// `strip` floats. So a tile reads each strip start to end, which is what
/// the hardware prefetcher streams best when the weights come from memory.
pub struct PackedLinear {
    n: usize,
    k: usize,
    // Read by the x86 tiles only; elsewhere `PackedKernel::get` finds none
    // and no PackedLinear is built.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    kernel: PackedKernel,
    /// `[panels][blocks][strips][depth][strip]`, zero past `n`.
    packed: Vec<f32>,
}

impl PackedLinear {
    /// Packs `w: [n, k]` (row-major). Panics on a CPU without a tile
    /// (`packed_available`).
    pub fn pack(w: &[f32], n: usize, k: usize) -> Self {
        Self::pack_for(this_cpu(), w, n, k)
    }

    fn pack_for(kernel: PackedKernel, w: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), n * k, "w is not [n, k]");
        let mut packed = Self::zeroed(kernel, n, k);
        let strip = kernel.strip();
        packed
            .packed
            .par_chunks_mut(PANEL * k.max(1))
            .enumerate()
            .for_each(|(p, panel)| {
                for (c, row) in (p * PANEL..n.min((p + 1) * PANEL)).enumerate() {
                    let row = &w[row * k..(row + 1) * k];
                    for d0 in (0..k).step_by(DEPTH) {
                        let at = position(kernel, k, c, d0);
                        let depth = DEPTH.min(k - d0);
                        for (j, &v) in row[d0..d0 + depth].iter().enumerate() {
                            panel[at + j * strip] = v;
                        }
                    }
                }
            });
        packed
    }

    /// Packs a weight given as its transpose, `wt: [k, n]` (row-major):
    /// then `matmul_t(x)` is `x · wt`.
    pub fn pack_transposed(wt: &[f32], k: usize, n: usize) -> Self {
        Self::pack_transposed_for(this_cpu(), wt, k, n)
    }

    fn pack_transposed_for(kernel: PackedKernel, wt: &[f32], k: usize, n: usize) -> Self {
        assert_eq!(wt.len(), k * n, "wt is not [k, n]");
        let mut packed = Self::zeroed(kernel, n, k);
        let strip = kernel.strip();
        for (p, panel) in packed.packed.chunks_mut(PANEL * k.max(1)).enumerate() {
            let cols = PANEL.min(n - p * PANEL);
            for d in 0..k {
                let row = &wt[d * n + p * PANEL..][..cols];
                for (s, part) in row.chunks(strip).enumerate() {
                    let at = position(kernel, k, s * strip, d);
                    panel[at..at + part.len()].copy_from_slice(part);
                }
            }
        }
        packed
    }

    fn zeroed(kernel: PackedKernel, n: usize, k: usize) -> Self {
        let packed = vec![0f32; n.next_multiple_of(PANEL) * k];
        Self {
            n,
            k,
            kernel,
            packed,
        }
    }

    /// Output columns.
    pub fn out_features(&self) -> usize {
        self.n
    }

    /// Input columns.
    pub fn in_features(&self) -> usize {
        self.k
    }

    /// `x · Wᵀ` for `x: [m, k]` (row-major): `[m, n]`.
    pub fn matmul_t(&self, x: &[f32], m: usize) -> Vec<f32> {
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
            let tiles = m.div_ceil(PANEL_ROWS);
            for d in (0..k).step_by(DEPTH) {
                let depth = DEPTH.min(k - d);
                // The block after this one, the thread's next very likely:
                // the panel's next depth, or the next panel's first (rayon
                // hands each thread a run of consecutive panels).
                let after = p * PANEL * k + (d + depth) * PANEL;
                let next = (self.packed)
                    .get(after..(after + DEPTH * PANEL).min(self.packed.len()))
                    .unwrap_or_default();
                for (t, i) in (0..m).step_by(PANEL_ROWS).enumerate() {
                    let rows = PANEL_ROWS.min(m - i);
                    let xr: [*const f32; PANEL_ROWS] =
                        std::array::from_fn(|r| x[(i + r.min(rows - 1)) * k + d..].as_ptr());
                    let tile = Tile {
                        x: &xr,
                        block: panel[d * PANEL..].as_ptr(),
                        depth,
                        // SAFETY: rows i..i + rows of `out` (np wide)
                        // exist, and panel p's columns are this task's alone.
                        out: unsafe { dst.at(i * np + p * PANEL) },
                        stride: np,
                        rows,
                        // The first depth block wrote the tile before later
                        // ones read it.
                        accumulate: d > 0,
                        ahead: share(next, t, tiles),
                    };
                    // SAFETY: `kernel` is one this CPU runs; each x row has
                    // `depth` floats from d, and the block `depth × PANEL`.
                    #[cfg(target_arch = "x86_64")]
                    unsafe {
                        match self.kernel {
                            PackedKernel::Avx512 => tile_avx512(&tile),
                            PackedKernel::Avx2 => tile_avx2(&tile),
                        }
                    }
                    // No tile elsewhere, where no PackedLinear is built.
                    #[cfg(not(target_arch = "x86_64"))]
                    let _ = tile;
                }
            }
        });
        // SAFETY: the tiles wrote every element of the m rows.
        unsafe { out.set_len(m * np) };
        without_padding(out, np, n)
    }
}

fn this_cpu() -> PackedKernel {
    PackedKernel::get().expect("PackedLinear on a CPU without AVX2 or AVX-512")
}

/// Where position `d` of a panel's column `c` lies in the panel. Within a
/// block, position `d + 1` is one strip width further.
fn position(kernel: PackedKernel, k: usize, c: usize, d: usize) -> usize {
    let strip = kernel.strip();
    let d0 = d - d % DEPTH;
    let depth = DEPTH.min(k - d0);
    d0 * PANEL + (c / strip) * depth * strip + (d - d0) * strip + c % strip
}

/// One tile's work: `out[r] (+)= x[r][..depth] · block` for `rows` rows
/// (the others repeat the last) and the PANEL columns of a block.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct Tile<'a> {
    x: &'a [*const f32; PANEL_ROWS],
    /// `PANEL / strip` strips of `depth × strip` floats.
    block: *const f32,
    depth: usize,
    /// `rows` rows of PANEL floats, `stride` apart.
    out: *mut f32,
    stride: usize,
    rows: usize,
    accumulate: bool,
    /// Part of the next block to prefetch into L2 meanwhile.
    ahead: &'a [f32],
}

/// The tile with AVX-512: one strip, 6 rows × 4 registers (24 of the 32).
///
/// # Safety
/// AVX-512F; the pointers hold what `Tile` says.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile_avx512(t: &Tile) {
    use std::arch::x86_64::*;
    const REGS: usize = PANEL / 16;
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); REGS]; PANEL_ROWS];
        if t.accumulate {
            for (r, acc) in acc.iter_mut().enumerate().take(t.rows) {
                for (c, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_loadu_ps(t.out.add(r * t.stride + c * 16));
                }
            }
        }
        let ahead =
            (!t.ahead.is_empty()).then(|| Prefetch::new(t.ahead, t.depth.div_ceil(PREFETCH_RUN)));
        // Prefetches go between runs of steps: inside the loop of FMAs they
        // made LLVM spill accumulators.
        for (run, d0) in (0..t.depth).step_by(PREFETCH_RUN).enumerate() {
            if let Some(ahead) = &ahead {
                ahead.step(run);
            }
            for d in d0..t.depth.min(d0 + PREFETCH_RUN) {
                let b = t.block.add(d * PANEL);
                let wv: [__m512; REGS] = std::array::from_fn(|c| _mm512_loadu_ps(b.add(c * 16)));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let xv = _mm512_set1_ps(*t.x[r].add(d));
                    for c in 0..REGS {
                        acc[c] = _mm512_fmadd_ps(xv, wv[c], acc[c]);
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate().take(t.rows) {
            for (c, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(t.out.add(r * t.stride + c * 16), *a);
            }
        }
    }
}

/// The tile with AVX2: four strips of 16 columns, each 6 rows × 2
/// registers (12 of the 16). The x rows stay in L1 from strip to strip.
///
/// # Safety
/// AVX2 and FMA; the pointers hold what `Tile` says.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2(t: &Tile) {
    use std::arch::x86_64::*;
    const STRIP: usize = 16;
    // The strips share the block's prefetches.
    let steps = PANEL / STRIP * t.depth.div_ceil(PREFETCH_RUN);
    let ahead = (!t.ahead.is_empty()).then(|| Prefetch::new(t.ahead, steps));
    let mut run = 0;
    unsafe {
        for s in 0..PANEL / STRIP {
            let (strip, c0) = (t.block.add(s * t.depth * STRIP), s * STRIP);
            let mut acc = [[_mm256_setzero_ps(); 2]; PANEL_ROWS];
            if t.accumulate {
                for (r, acc) in acc.iter_mut().enumerate().take(t.rows) {
                    for (c, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_loadu_ps(t.out.add(r * t.stride + c0 + c * 8));
                    }
                }
            }
            // As in `tile_avx512`.
            for d0 in (0..t.depth).step_by(PREFETCH_RUN) {
                if let Some(ahead) = &ahead {
                    ahead.step(run);
                }
                run += 1;
                for d in d0..t.depth.min(d0 + PREFETCH_RUN) {
                    let b = strip.add(d * STRIP);
                    let (w0, w1) = (_mm256_loadu_ps(b), _mm256_loadu_ps(b.add(8)));
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let xv = _mm256_broadcast_ss(&*t.x[r].add(d));
                        acc[0] = _mm256_fmadd_ps(xv, w0, acc[0]);
                        acc[1] = _mm256_fmadd_ps(xv, w1, acc[1]);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate().take(t.rows) {
                for (c, a) in acc.iter().enumerate() {
                    _mm256_storeu_ps(t.out.add(r * t.stride + c0 + c * 8), *a);
                }
            }
        }
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

    /// The packed tiles this CPU runs, whichever the encoder picked.
    fn kernels() -> Vec<PackedKernel> {
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut kernels = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                kernels.push(PackedKernel::Avx512);
            }
            if cpu_has_avx2_fma() {
                kernels.push(PackedKernel::Avx2);
            }
        }
        if kernels.is_empty() {
            eprintln!("packed matmul: this CPU has no tile for it; the encoder uses candle's");
        }
        kernels
    }

    #[test]
    fn tiles_after_the_first_share_the_next_panel() {
        let next: Vec<i8> = (0..100).map(|v| v as i8).collect();
        for tiles in 1..8 {
            assert!(share(&next, 0, tiles).is_empty(), "{tiles} tiles");
            let parts: Vec<i8> = (1..tiles)
                .flat_map(|t| share(&next, t, tiles).to_vec())
                .collect();
            let want = if tiles > 1 { next.clone() } else { vec![] };
            assert_eq!(parts, want, "{tiles} tiles");
            assert!(share(&next, PREFETCHING_TILES + 1, tiles).is_empty());
        }
        assert!(share(&[] as &[i8], 1, 3).is_empty());
    }

    #[test]
    fn packed_matches_a_plain_loop_at_every_edge() {
        // Remainders in rows (tile of 6), columns (panel of 64) and depth
        // (block of DEPTH), and sizes with none.
        let sizes = [
            (1, 1, 1),
            (5, 13, 7),
            (6, 64, 64),
            (13, DEPTH + 3, 130),
            (16, 2 * DEPTH, 192),
            (7, 3 * DEPTH + 1, 65),
            (131, 1100, 97),
        ];
        for kernel in kernels() {
            check(&sizes, |x, w, m, k, n| {
                PackedLinear::pack_for(kernel, w, n, k).matmul_t(x, m)
            });
            check(&sizes, |x, w, m, k, n| {
                let wt: Vec<f32> = (0..k * n).map(|i| w[i % n * k + i / n]).collect();
                PackedLinear::pack_transposed_for(kernel, &wt, k, n).matmul_t(x, m)
            });
        }
    }
}
