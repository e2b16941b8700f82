//! bf16 linear layers, for `--dtype bf16`.
//!
//! A weight is rounded once, at load, to bfloat16 (f32's sign, exponent
//! and top 7 mantissa bits, rounded to nearest even): half the memory and
//! half the bytes a short query streams. Products are summed in f32, and
//! everything between the linear layers (LayerNorm, softmax, GELU, the
//! heads) stays f32.
//!
//! On CPUs with AVX512_BF16 (docs/bf16.md names them) the tile is
//! `vdpbf16ps`: the inputs are
//! rounded to bf16 as well, and one instruction sums 16 lanes × 2 products
//! into f32, twice an f32 FMA's work. The weights are packed for it in
//! pairs of input positions: panels of 64 output columns, and within a
//! panel, for each pair, 64 columns × 2 values (one operand per 16
//! columns). A tile is 6 input rows × 64 columns (24 accumulators), as in
//! `matmul`. Elsewhere the f32 panel tiles widen the bf16 weights as they
//! load them (`matmul::PackedWeight`): inputs and sums stay f32, only the
//! weights are rounded.

use anyhow::Result;
use half::bf16;

use crate::kernels::matmul::{
    DEPTH, Dst, PANEL, PANEL_ROWS, PackedKernel, PackedLinear, TileAt, for_each_tile, share,
    without_padding,
};
#[cfg(target_arch = "x86_64")]
use crate::kernels::matmul::{PREFETCH_RUN, Prefetch, accumulators512, store512};
use crate::packcache::{Packed, Reader, Slab};

/// Input positions summed into one f32 lane by one `vdpbf16ps`.
const PAIR: usize = 2;

/// How a bf16 layer computes `x · Wᵀ` on this CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bf16Kernel {
    /// AVX512_BF16's `vdpbf16ps`, the inputs rounded to bf16 too.
    Dot,
    /// The f32 panel tiles, widening the bf16 weights as they load them.
    Widened(PackedKernel),
}

impl Bf16Kernel {
    /// The best this CPU runs (checked once), or none: then the encoder
    /// keeps bf16-rounded weights in f32 tensors for candle's matmul (the
    /// same vectors as `Widened`, without the memory saved).
    /// `RECALL_BF16=widen` takes the widened tiles on a CPU with
    /// AVX512_BF16 (`RECALL_MATMUL` then picks which), to compare.
    pub fn get() -> Option<Bf16Kernel> {
        static KERNEL: std::sync::OnceLock<Option<Bf16Kernel>> = std::sync::OnceLock::new();
        *KERNEL.get_or_init(|| {
            let packed = PackedKernel::get()?;
            let widen = super::overrides().bf16 == Some(super::Bf16Override::Widen);
            if !widen && packed == PackedKernel::Avx512 && super::cpu().avx512_bf16 {
                return Some(Bf16Kernel::Dot);
            }
            Some(Bf16Kernel::Widened(packed))
        })
    }

    /// What `recall --version`, `bench` and the docs call it.
    pub fn describe(self) -> String {
        match self {
            Bf16Kernel::Dot => "AVX512_BF16 tile".to_string(),
            Bf16Kernel::Widened(k) => format!("{k:?} packed tile, weights widened to f32"),
        }
    }
}

/// A linear layer's weight `[n, k]` in bf16, packed for this CPU's kernel.
pub enum Bf16Linear {
    Dot(DotLinear),
    Widened(PackedLinear<bf16>),
}

impl Bf16Linear {
    /// Rounds and packs `w: [n, k]` (row-major f32). Panics on a CPU
    /// without a kernel (`Bf16Kernel::get`).
    pub fn pack(w: &[f32], n: usize, k: usize) -> Self {
        match this_cpu() {
            Bf16Kernel::Dot => Self::Dot(DotLinear::pack(w, n, k)),
            Bf16Kernel::Widened(kernel) => Self::Widened(PackedLinear::pack_for(kernel, w, n, k)),
        }
    }

    /// Packs a weight given as its transpose, `wt: [k, n]`: then
    /// `matmul_t(x)` is `x · wt`.
    pub fn pack_transposed(wt: &[f32], k: usize, n: usize) -> Self {
        match this_cpu() {
            Bf16Kernel::Dot => Self::Dot(DotLinear::pack_transposed(wt, k, n)),
            Bf16Kernel::Widened(kernel) => {
                Self::Widened(PackedLinear::pack_transposed_for(kernel, wt, k, n))
            }
        }
    }

    /// The layer `[n, k]` packed for this CPU's kernel, read from a pack
    /// file (written from `Packed::parts`).
    pub fn restore(reader: &mut Reader, n: usize, k: usize) -> Result<Self> {
        Ok(match this_cpu() {
            Bf16Kernel::Dot => Self::Dot(DotLinear::restore(reader, n, k)?),
            Bf16Kernel::Widened(kernel) => {
                Self::Widened(PackedLinear::restore_for(kernel, reader, n, k)?)
            }
        })
    }

    pub fn out_features(&self) -> usize {
        match self {
            Self::Dot(w) => w.n,
            Self::Widened(w) => w.out_features(),
        }
    }

    pub fn in_features(&self) -> usize {
        match self {
            Self::Dot(w) => w.k,
            Self::Widened(w) => w.in_features(),
        }
    }

    /// `x · Wᵀ` for `x: [m, k]` (row-major f32): `[m, n]`.
    pub fn matmul_t(&self, x: &[f32], m: usize) -> Vec<f32> {
        match self {
            Self::Dot(w) => w.matmul_t(x, m),
            Self::Widened(w) => w.matmul_t(x, m),
        }
    }
}

impl Packed for Bf16Linear {
    fn parts(&self) -> Vec<&[u8]> {
        match self {
            Self::Dot(w) => vec![w.packed.bytes()],
            Self::Widened(w) => w.parts(),
        }
    }
}

fn this_cpu() -> Bf16Kernel {
    Bf16Kernel::get().expect("a bf16 layer on a CPU without AVX2 or AVX-512")
}

/// The weight packed for the `vdpbf16ps` tile. Its makers (`pack_with`,
/// `restore`) assert that this CPU has AVX512_BF16, so `matmul_t` may run
/// that tile.
pub struct DotLinear {
    n: usize,
    k: usize,
    /// `k` rounded up to whole pairs.
    kp: usize,
    /// `[panels][kp / PAIR][PANEL][PAIR]`, zero past `n` and `k`: the block
    /// of depth `d..` of panel `p` starts at `(p * kp + d) * PANEL`.
    packed: Slab<bf16>,
}

impl DotLinear {
    fn pack(w: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), n * k, "w is not [n, k]");
        // A weight row is a column here: read along it.
        Self::pack_with(n, k, |panel, cols| {
            for (c, col) in cols.enumerate() {
                for (d, &v) in w[col * k..(col + 1) * k].iter().enumerate() {
                    panel[offset(c, d)] = bf16::from_f32(v);
                }
            }
        })
    }

    fn pack_transposed(wt: &[f32], k: usize, n: usize) -> Self {
        assert_eq!(wt.len(), k * n, "wt is not [k, n]");
        Self::pack_with(n, k, |panel, cols| {
            for d in 0..k {
                let row = &wt[d * n..(d + 1) * n];
                for (c, &v) in row[cols.clone()].iter().enumerate() {
                    panel[offset(c, d)] = bf16::from_f32(v);
                }
            }
        })
    }

    /// A zeroed weight whose panels `fill(panel, columns)` writes, in
    /// parallel.
    fn pack_with(
        n: usize,
        k: usize,
        fill: impl Fn(&mut [bf16], std::ops::Range<usize>) + Sync,
    ) -> Self {
        use rayon::prelude::*;
        assert!(
            super::cpu().avx512_bf16,
            "a DotLinear on a CPU without AVX512_BF16"
        );
        let kp = k.next_multiple_of(PAIR);
        let mut packed = vec![bf16::ZERO; n.next_multiple_of(PANEL) * kp];
        packed
            .par_chunks_mut(PANEL * kp.max(1))
            .enumerate()
            .for_each(|(p, panel)| fill(panel, p * PANEL..n.min((p + 1) * PANEL)));
        Self {
            n,
            k,
            kp,
            packed: packed.into(),
        }
    }

    fn restore(reader: &mut Reader, n: usize, k: usize) -> Result<Self> {
        assert!(
            super::cpu().avx512_bf16,
            "a DotLinear on a CPU without AVX512_BF16"
        );
        let kp = k.next_multiple_of(PAIR);
        Ok(Self {
            n,
            k,
            kp,
            packed: reader.take(n.next_multiple_of(PANEL) * kp)?,
        })
    }

    fn matmul_t(&self, x: &[f32], m: usize) -> Vec<f32> {
        let (n, k, kp) = (self.n, self.k, self.kp);
        assert_eq!(x.len(), m * k, "x is not [m, k]");
        let np = n.next_multiple_of(PANEL);
        if m == 0 || n == 0 || k == 0 {
            return vec![0f32; m * n];
        }
        // SAFETY: this DotLinear's maker asserted AVX512_BF16 (which implies
        // AVX-512F: `cpu()`).
        let xb = unsafe { to_bf16_rows(x, m, k, kp) };
        let mut out = Vec::<f32>::with_capacity(m * np);
        let dst = Dst(out.as_mut_ptr());
        for_each_tile(m, np, kp, |at| {
            let TileAt { p, d, depth, i, .. } = at;
            let block = (p * kp + d) * PANEL;
            let next = (self.packed)
                .get(
                    block + depth * PANEL..(block + (depth + DEPTH) * PANEL).min(self.packed.len()),
                )
                .unwrap_or_default();
            let rows = at.rows;
            let xr: [*const bf16; PANEL_ROWS] =
                std::array::from_fn(|r| xb[(i + r.min(rows - 1)) * kp + d..].as_ptr());
            let tile = DotTile {
                x: &xr,
                block: self.packed[block..].as_ptr(),
                pairs: depth / PAIR,
                // SAFETY: i < m, so the offset lies inside `out`'s m × np
                // floats of capacity; rows i..i + rows (at most m) of it,
                // in panel p's columns, are this task's alone.
                out: unsafe { dst.at(i * np + p * PANEL) },
                stride: np,
                rows,
                accumulate: d > 0,
                ahead: share(next, at.t, at.tiles),
            };
            // SAFETY: this DotLinear's maker asserted AVX512_BF16 (and so
            // AVX-512F); the pointers hold what `DotTile` says: each x row
            // of `xb` has kp - d >= depth values from d, the block is pairs
            // d / PAIR.. of panel p, `depth / PAIR × PANEL × PAIR` weights
            // (kp and every block's depth are whole pairs), `out` as above.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                tile_dot(&tile)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let _ = tile;
        });
        // SAFETY: the capacity is m × np, and the tasks, one per panel,
        // wrote every row of their PANEL columns: all m × np floats.
        unsafe { out.set_len(m * np) };
        without_padding(out, np, n)
    }
}

/// Where position `d` of a panel's column `c` lies in the panel.
fn offset(c: usize, d: usize) -> usize {
    (d / PAIR) * PANEL * PAIR + c * PAIR + d % PAIR
}

/// `x: [m, k]` rounded to bf16, rows `kp` wide (zero past `k`), on a CPU
/// with AVX512_BF16 (`DotLinear` is built only there).
///
/// # Safety
/// On x86-64, the CPU has AVX-512F and AVX512_BF16.
unsafe fn to_bf16_rows(x: &[f32], m: usize, k: usize, kp: usize) -> Vec<bf16> {
    use rayon::prelude::*;
    let mut out = vec![bf16::ZERO; m * kp];
    out.par_chunks_mut(kp)
        .zip(x.par_chunks(k))
        .with_min_len(16)
        .for_each(|(o, row)| {
            // SAFETY: the caller promised AVX-512F and AVX512_BF16.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                round_row(&mut o[..row.len()], row)
            };
            #[cfg(not(target_arch = "x86_64"))]
            for (o, &v) in o.iter_mut().zip(row) {
                *o = bf16::from_f32(v);
            }
        });
    out
}

/// `row` rounded to bf16 (nearest, ties to even), 16 at a time, into
/// `out` (as far as both go): the softmax's probabilities alone are 64 M
/// values per layer at 2048 tokens.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
fn round_row(out: &mut [bf16], row: &[f32]) {
    use std::arch::x86_64::{__m256i, _mm256_storeu_si256, _mm512_cvtneps_pbh, _mm512_loadu_ps};
    let whole = row.len().min(out.len()) / 16 * 16;
    for i in (0..whole).step_by(16) {
        // SAFETY: i + 16 <= whole <= row.len().
        let v = _mm512_cvtneps_pbh(unsafe { _mm512_loadu_ps(row.as_ptr().add(i)) });
        // SAFETY: 16 bf16 as 32 bytes: the same size, every bit pattern
        // valid for both.
        let v: __m256i = unsafe { std::mem::transmute(v) };
        // SAFETY: i + 16 <= whole <= out.len(); an unaligned store.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(i) as *mut __m256i, v) };
    }
    for (o, &v) in out[whole..].iter_mut().zip(&row[whole..]) {
        *o = bf16::from_f32(v);
    }
}

/// One tile's work: `out[r] (+)= x[r][..2·pairs] · block` for `rows` rows
/// (the others repeat the last) and the PANEL columns of a block.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct DotTile<'a> {
    /// PANEL_ROWS rows of `2 · pairs` values.
    x: &'a [*const bf16; PANEL_ROWS],
    /// `pairs` × PANEL × PAIR weights.
    block: *const bf16,
    pairs: usize,
    /// `rows` rows of PANEL floats, `stride` apart, this tile's alone
    /// while it runs, and initialised if `accumulate`.
    out: *mut f32,
    stride: usize,
    rows: usize,
    accumulate: bool,
    /// Part of the next block to prefetch into L2 meanwhile.
    ahead: &'a [bf16],
}

/// The `vdpbf16ps` tile: 6 rows × 4 registers of 16 columns, each step a
/// pair of input positions.
///
/// # Safety
/// AVX-512F and AVX512_BF16; the pointers hold what `DotTile` says.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tile_dot(t: &DotTile) {
    use std::arch::x86_64::*;
    const REGS: usize = PANEL / 16;
    // SAFETY: the pointers as `DotTile` says (the caller's promise): pair
    // j < pairs of the block is PANEL × PAIR bf16 at j·PANEL·PAIR, 4 loads
    // of 64 bytes; positions 2j, 2j + 1 of each x row, 4 bytes read
    // unaligned; `out` is the `rows` rows that `accumulators512` and
    // `store512` need. The transmutes turn 512-bit vectors into 512-bit
    // vectors of 32 bf16, every bit pattern valid for both.
    unsafe {
        let mut acc = accumulators512(t.out, t.stride, t.rows, t.accumulate);
        let ahead =
            (!t.ahead.is_empty()).then(|| Prefetch::new(t.ahead, t.pairs.div_ceil(PREFETCH_RUN)));
        for (run, j0) in (0..t.pairs).step_by(PREFETCH_RUN).enumerate() {
            if let Some(ahead) = &ahead {
                ahead.step(run);
            }
            for j in j0..t.pairs.min(j0 + PREFETCH_RUN) {
                let b = t.block.add(j * PANEL * PAIR) as *const __m512i;
                let wv: [__m512bh; REGS] =
                    std::array::from_fn(|c| std::mem::transmute(_mm512_loadu_si512(b.add(c))));
                for (r, acc) in acc.iter_mut().enumerate() {
                    // Positions 2j and 2j + 1 of row r, broadcast as a pair.
                    let pair = (t.x[r].add(j * PAIR) as *const i32).read_unaligned();
                    let xv: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                    for c in 0..REGS {
                        acc[c] = _mm512_dpbf16_ps(acc[c], xv, wv[c]);
                    }
                }
            }
        }
        store512(&acc, t.out, t.stride, t.rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::quant::tests::values;

    /// `x · Wᵀ` in f64 over bf16-rounded weights, and inputs too if
    /// `round_x`.
    fn reference(x: &[f32], w: &[f32], m: usize, k: usize, n: usize, round_x: bool) -> Vec<f32> {
        let r = |v: f32| bf16::from_f32(v).to_f64();
        let xr = |v: f32| if round_x { r(v) } else { v as f64 };
        (0..m * n)
            .map(|o| {
                let (i, j) = (o / n, o % n);
                (0..k)
                    .map(|p| xr(x[i * k + p]) * r(w[j * k + p]))
                    .sum::<f64>() as f32
            })
            .collect()
    }

    /// Every bf16 kernel this CPU runs, whichever the encoder picked.
    fn kernels() -> Vec<Bf16Kernel> {
        let mut kernels = Vec::new();
        if PackedKernel::get() == Some(PackedKernel::Avx512) {
            if crate::kernels::cpu().avx512_bf16 {
                kernels.push(Bf16Kernel::Dot);
            }
            kernels.push(Bf16Kernel::Widened(PackedKernel::Avx512));
        }
        for packed in PackedKernel::all() {
            if packed != PackedKernel::Avx512 {
                kernels.push(Bf16Kernel::Widened(packed));
            }
        }
        if kernels.is_empty() {
            eprintln!("bf16: this CPU has no tile; the encoder uses candle's matmul");
        }
        kernels
    }

    fn pack(kernel: Bf16Kernel, w: &[f32], n: usize, k: usize, transposed: bool) -> Bf16Linear {
        let wt: Vec<f32> = (0..k * n).map(|i| w[i % n * k + i / n]).collect();
        match (kernel, transposed) {
            (Bf16Kernel::Dot, false) => Bf16Linear::Dot(DotLinear::pack(w, n, k)),
            (Bf16Kernel::Dot, true) => Bf16Linear::Dot(DotLinear::pack_transposed(&wt, k, n)),
            (Bf16Kernel::Widened(p), false) => {
                Bf16Linear::Widened(PackedLinear::pack_for(p, w, n, k))
            }
            (Bf16Kernel::Widened(p), true) => {
                Bf16Linear::Widened(PackedLinear::pack_transposed_for(p, &wt, k, n))
            }
        }
    }

    #[test]
    fn rows_round_as_half_does() {
        if !crate::kernels::cpu().avx512_bf16 {
            eprintln!("bf16: no AVX512_BF16 here, its rounding loop is not run");
            return;
        }
        // Halfway cases (ties to even, both ways), a carry into the
        // exponent, signs, and a tail after the vectors.
        let mut x = vec![
            1.0 + 1.0 / 256.0,
            1.0 + 3.0 / 256.0,
            -2.0 - 1.0 / 128.0,
            1.9999999,
        ];
        x.extend(values(33, 7919, 3.0));
        // SAFETY: AVX512_BF16 (and so AVX-512F) was found above.
        let got = unsafe { to_bf16_rows(&x, 1, x.len(), x.len() + 1) };
        let want: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
        assert_eq!(&got[..x.len()], &want[..]);
        assert_eq!(got[x.len()], bf16::ZERO);
    }

    #[test]
    fn every_kernel_matches_a_plain_loop_at_every_edge() {
        for kernel in kernels() {
            for (m, k, n) in crate::kernels::matmul::tests::EDGE_SIZES {
                let x = values(m * k, 7919, 1.0);
                let w = values(n * k, 104729, 1.0);
                // Only the dot tile rounds its inputs.
                let want = reference(&x, &w, m, k, n, kernel == Bf16Kernel::Dot);
                for transposed in [false, true] {
                    let layer = pack(kernel, &w, n, k, transposed);
                    assert_eq!((layer.out_features(), layer.in_features()), (n, k));
                    let got = layer.matmul_t(&x, m);
                    assert_eq!(got.len(), want.len());
                    for (idx, (g, r)) in got.iter().zip(&want).enumerate() {
                        let tol = 1e-4 * (k as f32).sqrt() * r.abs().max(1.0);
                        assert!(
                            (g - r).abs() <= tol,
                            "{kernel:?} {m}x{k}x{n} (transposed: {transposed}) at {idx}: {g} vs {r}"
                        );
                    }
                }
            }
        }
    }
}
