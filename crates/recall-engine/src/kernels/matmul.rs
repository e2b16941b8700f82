//! `x · Wᵀ` for the encoder's linear layers, on x86-64 CPUs with AVX2 and
//! FMA and on aarch64 (NEON) (`PackedLinear`).
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
//! columns with AVX2 (12 accumulators), four strips per panel, or 6 rows
//! × 16 columns with NEON (24 of its 32 registers: `tile_neon`): more
//! accumulators than that spill, fewer leave the FMA units waiting on
//! loads (`examples/matmul_probe.rs` measures a shape; docs/benchmarks.md,
//! "Choices"). Attention uses it too (`attention`).
//!
//! Same products, summed in a different order than `gemm`: results differ
//! by float rounding only (the parity tests hold at 1e-5 on every path).

use anyhow::Result;
use rayon::prelude::*;

use super::MatmulOverride;
use crate::packcache::{Packed, Reader, Slab};

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
// SAFETY: a Dst only hands out its raw pointer; every read or write through
// it is an `unsafe` operation whose caller keeps each task to its own part
// of the buffer, so sharing the pointer between threads races on nothing.
unsafe impl Sync for Dst {}

impl Dst {
    /// The pointer `offset` floats into the buffer.
    ///
    /// # Safety
    /// `offset` is at most the buffer's capacity, in floats.
    pub(crate) unsafe fn at(&self, offset: usize) -> *mut f32 {
        // SAFETY: the caller keeps `offset` within the buffer's allocation.
        unsafe { self.0.add(offset) }
    }
}

/// Output columns per panel of a `PackedLinear`: what one pass of the row
/// tiles over a block of weights covers.
pub(crate) const PANEL: usize = 64;
/// Input rows per `PackedLinear` tile.
pub(crate) const PANEL_ROWS: usize = 6;
/// Input positions per pass over the rows: a panel's block of weights
/// (PANEL × DEPTH floats, 128 KiB) stays in L2 while every row tile uses it.
/// Even, so a block holds whole pairs (`crate::kernels::bf16`'s tile).
pub(crate) const DEPTH: usize = 512;

/// Where one row tile of a packed product works.
pub(crate) struct TileAt {
    /// The panel: output columns `p * PANEL..`.
    pub(crate) p: usize,
    /// The depth block: input positions `d..d + depth`.
    pub(crate) d: usize,
    pub(crate) depth: usize,
    /// Input rows `i..i + rows` (rows ≤ PANEL_ROWS).
    pub(crate) i: usize,
    pub(crate) rows: usize,
    /// The tile's place among the block's `tiles` (`share`).
    pub(crate) t: usize,
    pub(crate) tiles: usize,
}

/// The loop every panel kernel shares, for `[m, k] · [k, np]`: panels in
/// parallel (each thread a run of consecutive panels), within a panel the
/// depth blocks, within a block the row tiles, all of them, so the block
/// stays in L2 while they use it.
pub(crate) fn for_each_tile(m: usize, np: usize, k: usize, tile: impl Fn(TileAt) + Sync) {
    let tiles = m.div_ceil(PANEL_ROWS);
    (0..np / PANEL).into_par_iter().for_each(|p| {
        for d in (0..k).step_by(DEPTH) {
            let depth = DEPTH.min(k - d);
            for (t, i) in (0..m).step_by(PANEL_ROWS).enumerate() {
                let rows = PANEL_ROWS.min(m - i);
                tile(TileAt {
                    p,
                    d,
                    depth,
                    i,
                    rows,
                    t,
                    tiles,
                });
            }
        }
    });
}

/// What a `PackedLinear` holds: f32 weights, or bf16 ones that the tile
/// widens to f32 as it loads them (`--dtype bf16` on CPUs without
/// AVX512_BF16: half the bytes to stream, the same f32 arithmetic).
///
/// A tile loads two registers of weights at a time (`load_pair16`,
/// `load_pair8`). bf16 weights are packed for that with the two
/// registers' columns interleaved (`INTERLEAVED`), so one load of 32 (or
/// 16) bf16 becomes both registers by a shift (the even ones) and a mask
/// (the odd ones): two instructions for two registers. Widening each
/// register with a zero-extending load and a shift costs twice that, which
/// spends on instructions what the smaller weights save in memory
/// (docs/benchmarks.md, "Choices").
pub trait PackedWeight: crate::packcache::Plain + Default {
    /// Whether a strip's columns are interleaved in pairs of registers.
    const INTERLEAVED: bool;

    fn from_f32(v: f32) -> Self;

    /// The 32 weights at `p` as two registers of f32: columns 0..16 and
    /// 16..32 of the strip's group of 32.
    ///
    /// # Safety
    /// AVX-512F; 32 values at `p`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load_pair16(p: *const Self)
    -> (std::arch::x86_64::__m512, std::arch::x86_64::__m512);

    /// The 16 weights at `p` as two registers of f32: columns 0..8 and 8..16.
    ///
    /// # Safety
    /// AVX2; 16 values at `p`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load_pair8(p: *const Self) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256);

    /// The 8 weights at `p` as two registers of f32: columns 0..4 and 4..8.
    ///
    /// # Safety
    /// NEON; 8 values at `p`, aligned for `Self`.
    #[cfg(target_arch = "aarch64")]
    unsafe fn load_pair4(
        p: *const Self,
    ) -> (
        std::arch::aarch64::float32x4_t,
        std::arch::aarch64::float32x4_t,
    );
}

impl PackedWeight for f32 {
    const INTERLEAVED: bool = false;

    fn from_f32(v: f32) -> Self {
        v
    }

    /// # Safety
    /// As `PackedWeight::load_pair16`: AVX-512F; 32 floats at `p`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn load_pair16(p: *const f32) -> (std::arch::x86_64::__m512, std::arch::x86_64::__m512) {
        use std::arch::x86_64::_mm512_loadu_ps;
        // SAFETY: the caller promised 32 floats at `p`; unaligned loads.
        unsafe { (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))) }
    }

    /// # Safety
    /// As `PackedWeight::load_pair8`: AVX2; 16 floats at `p`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn load_pair8(p: *const f32) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
        use std::arch::x86_64::_mm256_loadu_ps;
        // SAFETY: the caller promised 16 floats at `p`; unaligned loads.
        unsafe { (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))) }
    }

    /// # Safety
    /// As `PackedWeight::load_pair4`: NEON; 8 floats at `p`, aligned.
    #[cfg(target_arch = "aarch64")]
    #[target_feature(enable = "neon")]
    #[inline]
    unsafe fn load_pair4(
        p: *const f32,
    ) -> (
        std::arch::aarch64::float32x4_t,
        std::arch::aarch64::float32x4_t,
    ) {
        use std::arch::aarch64::vld1q_f32;
        // SAFETY: the caller promised 8 floats at `p`, aligned.
        unsafe { (vld1q_f32(p), vld1q_f32(p.add(4))) }
    }
}

impl PackedWeight for half::bf16 {
    const INTERLEAVED: bool = true;

    /// Rounded to nearest, ties to even.
    fn from_f32(v: f32) -> Self {
        half::bf16::from_f32(v)
    }

    // A bf16 is the top half of an f32: the even ones shifted up, the odd
    // ones with the low half cleared.
    /// # Safety
    /// As `PackedWeight::load_pair16`: AVX-512F; 32 bf16 at `p`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn load_pair16(
        p: *const half::bf16,
    ) -> (std::arch::x86_64::__m512, std::arch::x86_64::__m512) {
        use std::arch::x86_64::*;
        // SAFETY: the caller promised 32 bf16, 64 bytes, at `p`; an
        // unaligned load.
        unsafe {
            let v = _mm512_loadu_si512(p as *const __m512i);
            let odd = _mm512_and_si512(v, _mm512_set1_epi32(0xffff_0000u32 as i32));
            (
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v)),
                _mm512_castsi512_ps(odd),
            )
        }
    }

    /// # Safety
    /// As `PackedWeight::load_pair8`: AVX2; 16 bf16 at `p`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn load_pair8(
        p: *const half::bf16,
    ) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
        use std::arch::x86_64::*;
        // SAFETY: the caller promised 16 bf16, 32 bytes, at `p`; an
        // unaligned load.
        unsafe {
            let v = _mm256_loadu_si256(p as *const __m256i);
            let odd = _mm256_and_si256(v, _mm256_set1_epi32(0xffff_0000u32 as i32));
            (
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v)),
                _mm256_castsi256_ps(odd),
            )
        }
    }

    /// # Safety
    /// As `PackedWeight::load_pair4`: NEON; 8 bf16 at `p`, aligned.
    #[cfg(target_arch = "aarch64")]
    #[target_feature(enable = "neon")]
    #[inline]
    unsafe fn load_pair4(
        p: *const half::bf16,
    ) -> (
        std::arch::aarch64::float32x4_t,
        std::arch::aarch64::float32x4_t,
    ) {
        use std::arch::aarch64::*;
        // SAFETY: the caller promised 8 bf16 at `p`, aligned, so for u16
        // (a bf16 is one); loaded as u16, not as u32, which `p` may not be
        // aligned for (LLVM makes either the same `ldr`).
        let v = unsafe { vreinterpretq_u32_u16(vld1q_u16(p as *const u16)) };
        let odd = vandq_u32(v, vdupq_n_u32(0xffff_0000));
        (
            vreinterpretq_f32_u32(vshlq_n_u32::<16>(v)),
            vreinterpretq_f32_u32(odd),
        )
    }
}

/// The part of the `next` block of weights that row tile `t` of `tiles`
/// prefetches (`PackedLinear`'s and `crate::kernels::quant`'s tiles).
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
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) struct Prefetch {
    start: *const i8,
    lines: usize,
    per_step: usize,
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
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
        let end = ((step + 1) * self.per_step).min(self.lines);
        for line in step * self.per_step..end {
            let at = self.start.wrapping_add(line * 64);
            // SAFETY: a prefetch is a hint: it reads nothing into the
            // program and never faults, whatever the address (this one is
            // a line of the range anyway); SSE, x86-64's baseline.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(at)
            };
            // (`core::arch::aarch64::_prefetch` is not stable.)
            // SAFETY: `prfm` is a hint: it reads nothing into the program,
            // never faults and writes no register or flag.
            #[cfg(target_arch = "aarch64")]
            unsafe {
                std::arch::asm!("prfm pldl2keep, [{at}]", at = in(reg) at,
                    options(nostack, readonly, preserves_flags))
            };
        }
    }
}

/// Tile steps (input positions) between prefetches.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) const PREFETCH_RUN: usize = 16;

/// Which tile `PackedLinear` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackedKernel {
    /// 6 rows × 64 columns, 24 zmm accumulators: a panel in one strip.
    Avx512,
    /// 6 rows × 16 columns, 12 ymm accumulators: a panel in four strips.
    Avx2,
    /// aarch64: 6 rows × 16 columns, 24 of NEON's 32 registers
    /// accumulating, four strips per panel.
    Neon,
}

impl PackedKernel {
    /// The best tile this CPU runs (checked once), or none: then the
    /// encoder keeps candle's matmul. `RECALL_MATMUL=avx2` forces the AVX2
    /// tile and `RECALL_MATMUL=candle` none, to compare. Every aarch64 CPU
    /// has NEON.
    pub fn get() -> Option<PackedKernel> {
        static KERNEL: std::sync::OnceLock<Option<PackedKernel>> = std::sync::OnceLock::new();
        *KERNEL.get_or_init(|| {
            let (cpu, forced) = (super::cpu(), super::overrides().matmul);
            if forced == Some(MatmulOverride::Candle) {
                return None;
            }
            if cpu.avx512f && forced != Some(MatmulOverride::Avx2) {
                return Some(PackedKernel::Avx512);
            }
            if cpu.avx2_fma {
                return Some(PackedKernel::Avx2);
            }
            cpu.neon.then_some(PackedKernel::Neon)
        })
    }

    /// Every tile this CPU runs, the best first (for tests and benchmarks).
    pub fn all() -> Vec<PackedKernel> {
        [PackedKernel::Avx512, PackedKernel::Avx2, PackedKernel::Neon]
            .into_iter()
            .filter(|kernel| kernel.runs_here())
            .collect()
    }

    /// Whether this CPU has the tile's features (`cpu()`).
    fn runs_here(self) -> bool {
        let cpu = super::cpu();
        match self {
            PackedKernel::Avx512 => cpu.avx512f,
            PackedKernel::Avx2 => cpu.avx2_fma,
            PackedKernel::Neon => cpu.neon,
        }
    }

    /// Columns per strip: the tile's width.
    fn strip(self) -> usize {
        match self {
            PackedKernel::Avx512 => 64,
            PackedKernel::Avx2 | PackedKernel::Neon => 16,
        }
    }

    /// Columns per register.
    fn lanes(self) -> usize {
        match self {
            PackedKernel::Avx512 => 16,
            PackedKernel::Avx2 => 8,
            PackedKernel::Neon => 4,
        }
    }
}

/// Whether this CPU runs `PackedLinear` (`PackedKernel::get`).
pub fn packed_available() -> bool {
    PackedKernel::get().is_some()
}

/// A linear layer's weight `[n, k]`, packed once at load (f32, or bf16:
/// `PackedWeight`). Panels of
/// PANEL output columns; a panel in blocks of DEPTH positions; a block in
/// strips as wide as the tile (`PackedKernel::strip`), each `depth` rows of
/// `strip` floats. So a tile reads each strip start to end, which is what
/// the hardware prefetcher streams best when the weights come from memory.
pub struct PackedLinear<E = f32> {
    n: usize,
    k: usize,
    // Read by the tiles only; where there are none `PackedKernel::get`
    // finds none and no PackedLinear is built.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    kernel: PackedKernel,
    /// `[panels][blocks][strips][depth][strip]`, zero past `n`.
    packed: Slab<E>,
}

impl<E: PackedWeight> PackedLinear<E> {
    /// Packs `w: [n, k]` (row-major), converted to `E`. Panics on a CPU
    /// without a tile (`packed_available`).
    pub fn pack(w: &[f32], n: usize, k: usize) -> Self {
        Self::pack_for(this_cpu(), w, n, k)
    }

    pub(crate) fn pack_for(kernel: PackedKernel, w: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), n * k, "w is not [n, k]");
        let mut packed = Self::zeroed(n, k);
        let strip = kernel.strip();
        packed
            .par_chunks_mut(PANEL * k.max(1))
            .enumerate()
            .for_each(|(p, panel)| {
                for (c, row) in (p * PANEL..n.min((p + 1) * PANEL)).enumerate() {
                    let row = &w[row * k..(row + 1) * k];
                    for d0 in (0..k).step_by(DEPTH) {
                        let at = position::<E>(kernel, k, c, d0);
                        let depth = DEPTH.min(k - d0);
                        for (j, &v) in row[d0..d0 + depth].iter().enumerate() {
                            panel[at + j * strip] = E::from_f32(v);
                        }
                    }
                }
            });
        Self::from_packed(kernel, n, k, packed.into())
    }

    /// Packs a weight given as its transpose, `wt: [k, n]` (row-major):
    /// then `matmul_t(x)` is `x · wt`.
    pub fn pack_transposed(wt: &[f32], k: usize, n: usize) -> Self {
        Self::pack_transposed_for(this_cpu(), wt, k, n)
    }

    pub(crate) fn pack_transposed_for(
        kernel: PackedKernel,
        wt: &[f32],
        k: usize,
        n: usize,
    ) -> Self {
        assert_eq!(wt.len(), k * n, "wt is not [k, n]");
        let mut packed = Self::zeroed(n, k);
        let strip = kernel.strip();
        for (p, panel) in packed.chunks_mut(PANEL * k.max(1)).enumerate() {
            let cols = PANEL.min(n - p * PANEL);
            for d in 0..k {
                let row = &wt[d * n + p * PANEL..][..cols];
                for (s, part) in row.chunks(strip).enumerate() {
                    let at = position::<E>(kernel, k, s * strip, d);
                    for (c, &v) in part.iter().enumerate() {
                        panel[at + lane::<E>(kernel, c)] = E::from_f32(v);
                    }
                }
            }
        }
        Self::from_packed(kernel, n, k, packed.into())
    }

    fn zeroed(n: usize, k: usize) -> Vec<E> {
        vec![E::default(); Self::packed_len(n, k)]
    }

    fn packed_len(n: usize, k: usize) -> usize {
        n.next_multiple_of(PANEL) * k
    }

    /// The only maker of a PackedLinear: so `matmul_t` runs only tiles
    /// this CPU has the features of.
    fn from_packed(kernel: PackedKernel, n: usize, k: usize, packed: Slab<E>) -> Self {
        assert!(kernel.runs_here(), "{kernel:?} tile on a CPU without it");
        Self {
            n,
            k,
            kernel,
            packed,
        }
    }

    /// The layer `[n, k]` packed for this CPU, read from a pack file
    /// (written from `Packed::parts`).
    pub fn restore(reader: &mut Reader, n: usize, k: usize) -> Result<Self> {
        Self::restore_for(this_cpu(), reader, n, k)
    }

    pub(crate) fn restore_for(
        kernel: PackedKernel,
        reader: &mut Reader,
        n: usize,
        k: usize,
    ) -> Result<Self> {
        let packed = reader.take(Self::packed_len(n, k))?;
        Ok(Self::from_packed(kernel, n, k, packed))
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
        for_each_tile(m, np, k, |at| {
            let TileAt { p, d, depth, i, .. } = at;
            // The block after this one, the thread's next very likely:
            // the panel's next depth, or the next panel's first.
            let after = p * PANEL * k + (d + depth) * PANEL;
            let next = (self.packed)
                .get(after..(after + DEPTH * PANEL).min(self.packed.len()))
                .unwrap_or_default();
            let rows = at.rows;
            let xr: [*const f32; PANEL_ROWS] =
                std::array::from_fn(|r| x[(i + r.min(rows - 1)) * k + d..].as_ptr());
            let tile = Tile {
                x: &xr,
                block: self.packed[p * PANEL * k + d * PANEL..].as_ptr(),
                depth,
                // SAFETY: i < m, so the offset lies inside `out`'s m × np
                // floats of capacity; rows i..i + rows (at most m) of it,
                // in panel p's columns, are this task's alone.
                out: unsafe { dst.at(i * np + p * PANEL) },
                stride: np,
                rows,
                // The first depth block wrote the tile before later ones
                // read it.
                accumulate: d > 0,
                ahead: share(next, at.t, at.tiles),
            };
            // `tile` holds what `Tile` says: each x row has at least k - d
            // >= depth floats from d; the block is positions d..d + depth
            // of panel p, `depth × PANEL` weights; `out` as above, and
            // with `accumulate`, written by this task's pass at depth 0.
            // `from_packed` asserted that this CPU runs `self.kernel`.
            match self.kernel {
                // SAFETY: `cpu()` found AVX-512F (`from_packed`); `tile`
                // as above.
                #[cfg(target_arch = "x86_64")]
                PackedKernel::Avx512 => unsafe { tile_avx512(&tile) },
                // SAFETY: `cpu()` found AVX2 and FMA (`from_packed`);
                // `tile` as above.
                #[cfg(target_arch = "x86_64")]
                PackedKernel::Avx2 => unsafe { tile_avx2(&tile) },
                // SAFETY: NEON, aarch64's baseline (`from_packed` checked
                // it too); `tile` as above.
                #[cfg(target_arch = "aarch64")]
                PackedKernel::Neon => unsafe { tile_neon(&tile) },
                // No other tile is built for this arch (`PackedKernel::get`).
                #[allow(unreachable_patterns)]
                _ => unreachable!("{:?} tile on this arch", self.kernel),
            }
        });
        // SAFETY: the capacity is m × np, and the tasks, one per panel,
        // wrote every row of their PANEL columns: all m × np floats.
        unsafe { out.set_len(m * np) };
        without_padding(out, np, n)
    }
}

impl<E: PackedWeight> Packed for PackedLinear<E> {
    fn parts(&self) -> Vec<&[u8]> {
        vec![self.packed.bytes()]
    }
}

fn this_cpu() -> PackedKernel {
    PackedKernel::get().expect("PackedLinear on a CPU without AVX2 or AVX-512")
}

/// Where position `d` of a panel's column `c` lies in the panel. Within a
/// block, position `d + 1` is one strip width further.
fn position<E: PackedWeight>(kernel: PackedKernel, k: usize, c: usize, d: usize) -> usize {
    let strip = kernel.strip();
    let d0 = d - d % DEPTH;
    let depth = DEPTH.min(k - d0);
    d0 * PANEL + (c / strip) * depth * strip + (d - d0) * strip + lane::<E>(kernel, c % strip)
}

/// Where column `c` of a strip lies in its row: in place, or interleaved
/// with the column one register further (`PackedWeight::INTERLEAVED`).
fn lane<E: PackedWeight>(kernel: PackedKernel, c: usize) -> usize {
    if !E::INTERLEAVED {
        return c;
    }
    let width = kernel.lanes();
    let j = c % (2 * width);
    c - j + (j % width) * 2 + j / width
}

/// One tile's work: `out[r] (+)= x[r][..depth] · block` for `rows` rows
/// (the others repeat the last) and the PANEL columns of a block.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
struct Tile<'a, E> {
    /// PANEL_ROWS rows of `depth` floats.
    x: &'a [*const f32; PANEL_ROWS],
    /// `PANEL / strip` strips of `depth × strip` weights.
    block: *const E,
    depth: usize,
    /// `rows` rows of PANEL floats, `stride` apart, this tile's alone
    /// while it runs, and initialised if `accumulate`.
    out: *mut f32,
    stride: usize,
    rows: usize,
    accumulate: bool,
    /// Part of the next block to prefetch into L2 meanwhile.
    ahead: &'a [E],
}

/// The tile with AVX-512: one strip, 6 rows × 4 registers (24 of the 32).
///
/// # Safety
/// AVX-512F; the pointers hold what `Tile` says.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile_avx512<E: PackedWeight>(t: &Tile<E>) {
    use std::arch::x86_64::*;
    const REGS: usize = PANEL / 16;
    // SAFETY: AVX-512F, and the pointers as `Tile` says (the caller's
    // promise): the strip is the whole block, so the 64 weights at
    // `block + d·PANEL` and x[r][d] are inside it for d < depth; `out` is
    // the `rows` rows that `accumulators512` and `store512` need.
    unsafe {
        let mut acc = accumulators512(t.out, t.stride, t.rows, t.accumulate);
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
                let (w0, w1) = E::load_pair16(b);
                let (w2, w3) = E::load_pair16(b.add(32));
                let wv: [__m512; REGS] = [w0, w1, w2, w3];
                for (r, acc) in acc.iter_mut().enumerate() {
                    let xv = _mm512_set1_ps(*t.x[r].add(d));
                    for c in 0..REGS {
                        acc[c] = _mm512_fmadd_ps(xv, wv[c], acc[c]);
                    }
                }
            }
        }
        store512(&acc, t.out, t.stride, t.rows);
    }
}

/// The accumulators of an AVX-512 tile of PANEL_ROWS × PANEL: zero, or
/// the first `rows` rows of `out` (`stride` apart) to add to.
///
/// # Safety
/// AVX-512F; with `accumulate`, `rows` rows of PANEL initialised floats
/// at `out`, `stride` apart.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn accumulators512(
    out: *const f32,
    stride: usize,
    rows: usize,
    accumulate: bool,
) -> [[std::arch::x86_64::__m512; PANEL / 16]; PANEL_ROWS] {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); PANEL / 16]; PANEL_ROWS];
    if accumulate {
        for (r, acc) in acc.iter_mut().enumerate().take(rows) {
            for (c, a) in acc.iter_mut().enumerate() {
                // SAFETY: r < rows, columns 16c..16c + 16 <= PANEL: floats
                // of the caller's rows.
                *a = unsafe { _mm512_loadu_ps(out.add(r * stride + c * 16)) };
            }
        }
    }
    acc
}

/// Stores the first `rows` rows of an AVX-512 tile's accumulators.
///
/// # Safety
/// AVX-512F; `rows` rows of PANEL floats at `out`, `stride` apart, that
/// nothing else reads or writes meanwhile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn store512(
    acc: &[[std::arch::x86_64::__m512; PANEL / 16]; PANEL_ROWS],
    out: *mut f32,
    stride: usize,
    rows: usize,
) {
    for (r, acc) in acc.iter().enumerate().take(rows) {
        for (c, a) in acc.iter().enumerate() {
            // SAFETY: r < rows, columns 16c..16c + 16 <= PANEL: floats of
            // the caller's rows.
            unsafe { std::arch::x86_64::_mm512_storeu_ps(out.add(r * stride + c * 16), *a) };
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
unsafe fn tile_avx2<E: PackedWeight>(t: &Tile<E>) {
    use std::arch::x86_64::*;
    const STRIP: usize = 16;
    // The strips share the block's prefetches.
    let steps = PANEL / STRIP * t.depth.div_ceil(PREFETCH_RUN);
    let ahead = (!t.ahead.is_empty()).then(|| Prefetch::new(t.ahead, steps));
    let mut run = 0;
    // SAFETY: AVX2 and FMA, and the pointers as `Tile` says (the caller's
    // promise): strip s < PANEL / STRIP of the block starts at
    // s·depth·STRIP, and its 16 weights at d·STRIP, d < depth, are inside
    // it; x[r][d] for d < depth; `out` row r < rows, columns c0 + 8c..
    // + 8 <= PANEL.
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
                    let (w0, w1) = E::load_pair8(b);
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

/// The tile with NEON: four strips of 16 columns, each 6 rows × 4
/// registers (24 of the 32), as `tile_avx2`'s on registers a quarter as
/// wide. Per input position: 4 weight loads (2 `ldp`) and 6 input loads
/// (LLVM makes the broadcast an `fmla` by element) for 24 `fmla`. The
/// same sums in the same order as `tile_avx2`.
///
/// # Safety
/// NEON; the pointers hold what `Tile` says.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
unsafe fn tile_neon<E: PackedWeight>(t: &Tile<E>) {
    use std::arch::aarch64::*;
    const STRIP: usize = 16;
    const REGS: usize = STRIP / 4;
    let steps = PANEL / STRIP * t.depth.div_ceil(PREFETCH_RUN);
    let ahead = (!t.ahead.is_empty()).then(|| Prefetch::new(t.ahead, steps));
    let mut run = 0;
    // SAFETY: NEON, and the pointers as `Tile` says (the caller's promise):
    // strip s < PANEL / STRIP of the block starts at s·depth·STRIP, and its
    // 16 weights at d·STRIP, d < depth, are inside it (aligned: the block
    // is a slice of E); x[r][d] for d < depth; `out` row r < rows, columns
    // c0 + 4c.. + 4 <= PANEL.
    unsafe {
        for s in 0..PANEL / STRIP {
            let (strip, c0) = (t.block.add(s * t.depth * STRIP), s * STRIP);
            let mut acc = [[vdupq_n_f32(0.0); REGS]; PANEL_ROWS];
            if t.accumulate {
                for (r, acc) in acc.iter_mut().enumerate().take(t.rows) {
                    for (c, a) in acc.iter_mut().enumerate() {
                        *a = vld1q_f32(t.out.add(r * t.stride + c0 + c * 4));
                    }
                }
            }
            for d0 in (0..t.depth).step_by(PREFETCH_RUN) {
                if let Some(ahead) = &ahead {
                    ahead.step(run);
                }
                run += 1;
                for d in d0..t.depth.min(d0 + PREFETCH_RUN) {
                    let b = strip.add(d * STRIP);
                    let (w0, w1) = E::load_pair4(b);
                    let (w2, w3) = E::load_pair4(b.add(8));
                    let wv = [w0, w1, w2, w3];
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let xv = vld1q_dup_f32(t.x[r].add(d));
                        for c in 0..REGS {
                            acc[c] = vfmaq_f32(acc[c], wv[c], xv);
                        }
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate().take(t.rows) {
                for (c, a) in acc.iter().enumerate() {
                    vst1q_f32(t.out.add(r * t.stride + c0 + c * 4), *a);
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
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
        let kernels = PackedKernel::all();
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

    /// Products `(m, k, n)` with remainders in rows (tile of 6), columns
    /// (panel of 64) and depth (block of DEPTH; odd depths: half a pair for
    /// `crate::kernels::bf16`'s tile), and with none.
    pub(crate) const EDGE_SIZES: [(usize, usize, usize); 7] = [
        (1, 1, 1),
        (5, 13, 7),
        (6, 64, 64),
        (13, DEPTH + 3, 130),
        (16, 2 * DEPTH, 192),
        (7, 3 * DEPTH + 1, 65),
        (131, 1101, 97),
    ];

    #[test]
    fn packed_matches_a_plain_loop_at_every_edge() {
        for kernel in kernels() {
            check(&EDGE_SIZES, |x, w, m, k, n| {
                PackedLinear::<f32>::pack_for(kernel, w, n, k).matmul_t(x, m)
            });
            check(&EDGE_SIZES, |x, w, m, k, n| {
                let wt: Vec<f32> = (0..k * n).map(|i| w[i % n * k + i / n]).collect();
                PackedLinear::<f32>::pack_transposed_for(kernel, &wt, k, n).matmul_t(x, m)
            });
        }
    }
}
