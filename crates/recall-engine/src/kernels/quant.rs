//! int8 linear layers, for `--dtype q8`.
//!
//! Weights are quantised once, at load: symmetric, one scale per output
//! column (`w ≈ scale · q`, `q` in -127..=127). Activations are quantised
//! per call: asymmetric, one scale and zero point per input row (`x ≈
//! scale · (q - zero)`, `q` in 0..=255, or 0..=127 for the AVX2 tile:
//! `Kernel::activation_levels`), which keeps the full range for GELU's
//! lopsided outputs. A few input channels far larger than the rest
//! ("outlier dimensions", found on calibration texts:
//! `outlier_channels`) stay out of the int8 product and are summed in f32
//! beside it. The products are summed exactly in i32 and
//! turned back into f32 with both scales and the zero point's correction
//! (`zero · Σ q_w`, precomputed per column).
//!
//! The weights are packed for the kernel: panels of 64 output columns, and
//! within a panel, for each group of 4 input positions, 64 columns × 4
//! bytes, which is one `vpdpbusd` operand per 16 columns. A tile is 6 input
//! rows × 64 columns of i32 accumulators (24 of the 32 AVX-512 registers):
//! each weight load feeds 6 multiply-adds, each broadcast input feeds 4,
//! and nothing is reduced across lanes. Panels are split between threads.
//!
//! That tile needs AVX-512 VNNI (Intel since Ice Lake, AMD since Zen 4);
//! an AVX-VNNI tile (the same instruction on 256 bits), an AVX2 tile,
//! aarch64 tiles on the Armv8.2 dot product (`sdot`) and on I8MM's `smmla`,
//! and a portable loop compute the very same integers from the same
//! weights (`Kernel`). The AVX2 tile needs activations within
//! 0..=128, so CPUs that run it quantise them to 127 levels and give
//! slightly different vectors (another revision: `Kernel::revision_tag`).
//! `crate::attention` puts q8's `Q · Kᵀ` through the same kernels.

use anyhow::Result;
use rayon::prelude::*;

use crate::packcache::{Packed, Reader, Slab};

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use crate::kernels::matmul::Prefetch;
use crate::kernels::matmul::{Dst, share};

/// Output columns per panel: four registers of 16 i32 lanes.
const PANEL: usize = 64;
/// Input rows per tile.
const TILE_ROWS: usize = 6;
/// Bytes summed into one i32 lane by one `vpdpbusd`.
const GROUP: usize = 4;

/// A linear layer's weight `[n, k]`, quantised and packed.
pub struct QLinear {
    n: usize,
    k: usize,
    /// `k` rounded up to a whole group.
    kp: usize,
    /// `[panels][kp / GROUP][PANEL][GROUP]`, zero past `n` and `k`.
    packed: Slab<i8>,
    /// Per output column (padded to whole panels).
    scales: Slab<f32>,
    /// Per output column: the sum of its quantised weights.
    sums: Slab<i32>,
    /// Input positions kept out of the int8 product (`outlier_channels`).
    outliers: F32Channels,
}

/// A layer's input positions whose products are summed in f32 beside the
/// int8 ones, and their weights. A channel far larger than the rest would
/// set every token's int8 scale and flatten the others into a few levels;
/// left out, the rest keep their 8 bits, and its own products are exact.
struct F32Channels {
    /// Input positions, ascending.
    channels: Vec<usize>,
    /// `[panels][channels][PANEL]`: each channel's weight for the output
    /// columns of each panel (zero past `n`), so that a tile reads its
    /// panel's in one run. As `[channels][n]`, rows `n` floats apart met in
    /// the same L1 sets, and the sums were 5.7% of a q8 forward pass.
    weights: Slab<f32>,
}

/// The rows of `x` (`k` wide) with positions `channels` zeroed, for the
/// int8 product (`x` itself without any).
fn cleared<'x>(x: &'x [f32], k: usize, channels: &[usize]) -> std::borrow::Cow<'x, [f32]> {
    if channels.is_empty() {
        return x.into();
    }
    let mut x = x.to_vec();
    for row in x.chunks_mut(k) {
        channels.iter().for_each(|&c| row[c] = 0.0);
    }
    x.into()
}

impl F32Channels {
    /// The channels of `w: [n, k]`, laid out for `add`.
    fn new(w: &[f32], n: usize, k: usize, channels: &[usize]) -> Self {
        let np = n.next_multiple_of(PANEL);
        let mut weights = vec![0f32; channels.len() * np];
        for (p, panel) in weights
            .chunks_mut(channels.len().max(1) * PANEL)
            .enumerate()
        {
            for (&c, row) in channels.iter().zip(panel.chunks_mut(PANEL)) {
                for (j, v) in (p * PANEL..n.min((p + 1) * PANEL)).zip(row) {
                    *v = w[j * k + c];
                }
            }
        }
        Self {
            channels: channels.to_vec(),
            weights: weights.into(),
        }
    }

    /// The channels of `x: [m, k]`, a tile at a time: `[tiles][channels]
    /// [TILE_ROWS]` (zero past `m`), what `add` takes.
    fn gather(&self, x: &[f32], m: usize, k: usize) -> Vec<f32> {
        let c = self.channels.len();
        let mut out = vec![0f32; m.next_multiple_of(TILE_ROWS) * c];
        for (i, x) in x.chunks_exact(k).enumerate() {
            let tile = &mut out[i / TILE_ROWS * c * TILE_ROWS..][..c * TILE_ROWS];
            for (v, &ch) in tile.chunks_exact_mut(TILE_ROWS).zip(&self.channels) {
                v[i % TILE_ROWS] = x[ch];
            }
        }
        out
    }

    /// Adds one tile's channels' products (`xs`, its part of `gather`) to
    /// panel `p`'s columns of the output, at `out` (`rows` rows, `stride`
    /// apart). Run on each tile as it is written, while it is in cache.
    /// Each sum takes the channels in order with a multiply then an add
    /// (no FMA), so the vector loop gives the portable one's floats.
    ///
    /// # Safety
    /// `out` has `rows` rows of PANEL floats, `stride` apart; with
    /// `vector`, the CPU has AVX2.
    unsafe fn add(
        &self,
        xs: &[f32],
        p: usize,
        out: *mut f32,
        rows: usize,
        stride: usize,
        vector: bool,
    ) {
        let c = self.channels.len();
        if c == 0 {
            return;
        }
        let weights = &self.weights[p * c * PANEL..][..c * PANEL];
        #[cfg(target_arch = "x86_64")]
        if vector {
            // SAFETY: AVX2 and the tile, as promised.
            return unsafe { add_avx2(xs, weights, out, rows, stride) };
        }
        let _ = vector;
        for r in 0..rows {
            for j in 0..PANEL {
                let products = xs[r..]
                    .iter()
                    .step_by(TILE_ROWS)
                    .zip(weights[j..].iter().step_by(PANEL));
                // SAFETY: row r, column j of the tile.
                unsafe {
                    let o = out.add(r * stride + j);
                    *o = products.fold(*o, |o, (&v, &w)| o + v * w);
                }
            }
        }
    }
}

/// `F32Channels::add` with AVX2, a strip of 16 columns at a time: its
/// channels' weights loaded once for the tile's rows, 6 × 2 sums in
/// registers. A row at a time, reading the panel's weights again for each,
/// the sums were 4-6% of a q8 forward pass.
///
/// # Safety
/// The CPU has AVX2; `out` as for `F32Channels::add`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn add_avx2(xs: &[f32], weights: &[f32], out: *mut f32, rows: usize, stride: usize) {
    use std::arch::x86_64::*;
    for s in (0..PANEL).step_by(16) {
        unsafe {
            let mut acc: [[__m256; 2]; TILE_ROWS] = std::array::from_fn(|r| {
                std::array::from_fn(|h| match r < rows {
                    true => _mm256_loadu_ps(out.add(r * stride + s + 8 * h)),
                    false => _mm256_setzero_ps(),
                })
            });
            for (x, w) in xs.chunks_exact(TILE_ROWS).zip(weights.chunks_exact(PANEL)) {
                let w = [
                    _mm256_loadu_ps(w.as_ptr().add(s)),
                    _mm256_loadu_ps(w.as_ptr().add(s + 8)),
                ];
                for (acc, &x) in acc.iter_mut().zip(x) {
                    let v = _mm256_set1_ps(x);
                    for (acc, &w) in acc.iter_mut().zip(&w) {
                        *acc = _mm256_add_ps(*acc, _mm256_mul_ps(v, w));
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate().take(rows) {
                for (h, &acc) in acc.iter().enumerate() {
                    _mm256_storeu_ps(out.add(r * stride + s + 8 * h), acc);
                }
            }
        }
    }
}

/// The input channels a layer keeps out of its int8 product, from the
/// largest magnitude each reached on calibration texts (`peaks`): those
/// over OUTLIER_RATIO times the median channel's, the largest `k / 32` at
/// most (MIN_OUTLIER_LIMIT in a narrow layer). Real checkpoints have such
/// "outlier dimensions": all-MiniLM-L6-v2 in a few channels of most
/// layers' inputs, and the RoBERTa family (XLM-R and so BGE-M3 among them)
/// is known for them.
pub fn outlier_channels(peaks: &[f32]) -> Vec<usize> {
    let mut sorted = peaks.to_vec();
    sorted.sort_by(f32::total_cmp);
    let Some(&median) = sorted.get(sorted.len() / 2) else {
        return Vec::new();
    };
    let mut channels: Vec<usize> = (0..peaks.len())
        .filter(|&c| peaks[c] > OUTLIER_RATIO * median)
        .collect();
    channels.sort_by(|&a, &b| peaks[b].total_cmp(&peaks[a]));
    channels.truncate((peaks.len() / 32).max(MIN_OUTLIER_LIMIT));
    channels.sort_unstable();
    channels
}

/// How many times the median channel's peak makes an outlier channel.
/// Chosen on the check's own texts (`crate::calibrate::TEXTS`) with
/// all-MiniLM-L6-v2, in a PyTorch model of this quantisation: the lowest
/// cosine to f32 there was 0.9933, 0.9979, 0.9980, 0.9985 at 6×, 4×, 3×
/// and 2× with 8-bit activations, 0.9817, 0.9952, 0.9958, 0.9956 with
/// 7-bit ones; 3× is the best of the worse path. Scored on other texts
/// only (tests/q8_outliers.rs).
const OUTLIER_RATIO: f32 = 3.0;

/// The most channels a layer may keep in f32 is at least this, however
/// narrow: outlier dimensions come a handful to a model, whatever its width
/// (BERT's and RoBERTa's reported ones: two to a few), so a 32-wide layer
/// needs room for them too. Layers of 256 or more (MiniLM's, BGE-M3's)
/// are held by `k / 32` instead, so this changes nothing there.
const MIN_OUTLIER_LIMIT: usize = 8;

impl QLinear {
    /// Quantises and packs `w: [n, k]` (row-major f32).
    pub fn quantize(w: &[f32], n: usize, k: usize) -> Self {
        Self::quantize_split(w, n, k, &[])
    }

    /// `quantize`, with the input positions `outliers` (ascending) kept in
    /// f32 beside the int8 product.
    pub fn quantize_split(w: &[f32], n: usize, k: usize, outliers: &[usize]) -> Self {
        assert_eq!(w.len(), n * k, "w is not [n, k]");
        assert!(outliers.iter().all(|&c| c < k), "an outlier channel past k");
        assert!(
            outliers.is_sorted_by(|a, b| a < b),
            "outlier channels not ascending"
        );
        let kp = k.next_multiple_of(GROUP);
        let np = n.next_multiple_of(PANEL);
        let mut rows = vec![0i8; np * kp];
        let mut scales = vec![0f32; np];
        let mut sums = vec![0i32; np];
        let kernel = Kernel::get();
        rows.par_chunks_mut(kp)
            .zip(scales.par_iter_mut().zip(sums.par_iter_mut()))
            .zip(w.par_chunks(k.max(1)))
            // A head's keys (attention) are rows of only 64: not worth a
            // task each.
            .with_min_len(16)
            .for_each(|((q, (scale, sum)), row)| {
                let row = cleared(row, k, outliers);
                (*scale, *sum) = quantize_symmetric(&mut q[..row.len()], &row, kernel)
            });
        let mut packed = vec![0i8; np * kp];
        packed
            .par_chunks_mut(PANEL * kp)
            .enumerate()
            .for_each(|(p, panel)| {
                for (g, block) in panel.chunks_mut(PANEL * GROUP).enumerate() {
                    for (c, lanes) in block.chunks_mut(GROUP).enumerate() {
                        let at = (p * PANEL + c) * kp + g * GROUP;
                        lanes.copy_from_slice(&rows[at..at + GROUP]);
                    }
                }
            });
        Self {
            n,
            k,
            kp,
            packed: packed.into(),
            scales: scales.into(),
            sums: sums.into(),
            outliers: F32Channels::new(w, n, k, outliers),
        }
    }

    /// The layer `[n, k]` quantised for this CPU's kernel with `outliers`
    /// apart (as `quantize_split`), read from a pack file (written from
    /// `Packed::parts`).
    pub fn restore(reader: &mut Reader, n: usize, k: usize, outliers: &[usize]) -> Result<Self> {
        let kp = k.next_multiple_of(GROUP);
        let np = n.next_multiple_of(PANEL);
        Ok(Self {
            n,
            k,
            kp,
            packed: reader.take(np * kp)?,
            scales: reader.take(np)?,
            sums: reader.take(np)?,
            outliers: F32Channels {
                channels: outliers.to_vec(),
                weights: reader.take(outliers.len() * np)?,
            },
        })
    }

    /// Output columns.
    pub fn out_features(&self) -> usize {
        self.n
    }

    /// Input columns.
    pub fn in_features(&self) -> usize {
        self.k
    }

    /// `x · Wᵀ` for `x: [m, k]` (row-major f32): `[m, n]`.
    pub fn matmul_t(&self, x: &[f32], m: usize) -> Vec<f32> {
        assert_eq!(x.len(), m * self.k, "x is not [m, k]");
        let (n, np) = (self.n, self.scales.len());
        if m == 0 || n == 0 {
            return vec![0f32; m * n];
        }
        let kernel = Kernel::get();
        let mut rows = QuantRows::new(x, m, self.k, self.kp, kernel, &self.outliers.channels);
        // A tile's rows in `rows.data`: kp bytes each, signed for the Arm
        // tiles, and for `tile_smmla` in pairs of 8-byte runs.
        let row_bytes = match kernel {
            Kernel::Sdot => {
                rows.make_signed();
                self.kp
            }
            Kernel::I8mm => {
                rows.pair_signed(self.kp);
                pair_row_bytes(self.kp)
            }
            _ => self.kp,
        };
        // The f32 channels' vector loop: every x86 tile kernel's CPU has
        // AVX2 (AVX-512 ones included).
        let vector = matches!(kernel, Kernel::Vnni | Kernel::AvxVnni | Kernel::Avx2);
        let xs = self.outliers.gather(x, m, self.k);
        let xs_tile = self.outliers.channels.len() * TILE_ROWS;
        let mut out = Vec::<f32>::with_capacity(m * np);
        let dst = Dst(out.as_mut_ptr());
        (0..np / PANEL).into_par_iter().for_each(|p| {
            let panel = &self.packed[p * PANEL * self.kp..(p + 1) * PANEL * self.kp];
            let cols = p * PANEL..(p + 1) * PANEL;
            // The thread's next panel, very likely: rayon hands each thread
            // a run of consecutive panels.
            let next = (self.packed)
                .get((p + 1) * PANEL * self.kp..(p + 2) * PANEL * self.kp)
                .unwrap_or_default();
            let tiles = m.div_ceil(TILE_ROWS);
            for (t, i) in (0..m).step_by(TILE_ROWS).enumerate() {
                let tile = Tile {
                    x: &rows.data[i * row_bytes..(i + TILE_ROWS) * row_bytes],
                    kp: self.kp,
                    panel,
                    x_scales: &rows.scales[i..i + TILE_ROWS],
                    x_zeros: &rows.zeros[i..i + TILE_ROWS],
                    w_scales: &self.scales[cols.clone()],
                    w_sums: &self.sums[cols.clone()],
                    rows: TILE_ROWS.min(m - i),
                    ahead: share(next, t, tiles),
                };
                // SAFETY: rows i..i + tile.rows are inside `out` (m rows of
                // np); the columns of panel p are this task's alone.
                let out = unsafe { dst.at(i * np + p * PANEL) };
                // SAFETY: the CPU has each kernel's features (`Kernel::get`).
                match kernel {
                    #[cfg(target_arch = "x86_64")]
                    Kernel::Vnni => unsafe { tile_vnni(&tile, out, np) },
                    #[cfg(target_arch = "x86_64")]
                    Kernel::Avx2 => unsafe { tile_avx2(&tile, out, np) },
                    #[cfg(target_arch = "x86_64")]
                    Kernel::AvxVnni => unsafe { tile_avx_vnni(&tile, out, np) },
                    #[cfg(target_arch = "aarch64")]
                    Kernel::Sdot => unsafe { tile_sdot(&tile, out, np) },
                    #[cfg(target_arch = "aarch64")]
                    Kernel::I8mm => unsafe { tile_smmla(&tile, out, np) },
                    _ => unsafe { tile_portable(&tile, out, np) },
                }
                let xs = &xs[t * xs_tile..][..xs_tile];
                // SAFETY: as the tile's; AVX2 as above.
                unsafe { (self.outliers).add(xs, p, out, tile.rows, np, vector) };
            }
        });
        // SAFETY: the tiles wrote every element of the m rows.
        unsafe { out.set_len(m * np) };
        crate::kernels::matmul::without_padding(out, np, n)
    }
}

impl Packed for QLinear {
    fn parts(&self) -> Vec<&[u8]> {
        vec![
            self.packed.bytes(),
            self.scales.bytes(),
            self.sums.bytes(),
            self.outliers.weights.bytes(),
        ]
    }
}

/// The largest quantised weight magnitude.
const WEIGHT_LIMIT: i32 = 127;

/// `q = round(v / scale)` for a row of weights (or keys), the scale its
/// largest magnitude over WEIGHT_LIMIT: returns the scale and `Σ q`.
fn quantize_symmetric(q: &mut [i8], row: &[f32], kernel: Kernel) -> (f32, i32) {
    symmetric_with(q, row, RowLoops::of(kernel))
}

fn symmetric_with(q: &mut [i8], row: &[f32], loops: RowLoops) -> (f32, i32) {
    // SAFETY: `RowLoops::of` picks loops this CPU runs.
    let (lo, hi) = unsafe { (loops.range)(row) };
    let max = (-lo).max(hi);
    let scale = if max > 0.0 {
        max / WEIGHT_LIMIT as f32
    } else {
        1.0
    };
    // |v / scale| is at most the limit, so the asymmetric loop with zero
    // point 128 (rounding half up) gives q + 128, every byte in 1..=255: a
    // flipped top bit away.
    // SAFETY: i8 and u8 have the same layout; the loops as above.
    let bytes = unsafe { std::slice::from_raw_parts_mut(q.as_mut_ptr() as *mut u8, q.len()) };
    unsafe { (loops.quantize)(bytes, row, 1.0 / scale, 128.5) };
    bytes.iter_mut().for_each(|b| *b ^= 0x80);
    (scale, q.iter().map(|&v| v as i32).sum())
}

/// The two loops that quantise a row: its range, `(min(0, row), max(0,
/// row))`, and `q = clamp(v · inv + shift, 0, 255)` truncated. The vector
/// versions give the very bytes of the portable ones.
#[derive(Clone, Copy)]
struct RowLoops {
    range: unsafe fn(&[f32]) -> (f32, f32),
    quantize: unsafe fn(&mut [u8], &[f32], f32, f32),
}

impl RowLoops {
    /// `range` of `row` without positions `without` (ascending), a run of
    /// the others at a time.
    fn range_without(self, row: &[f32], without: &[usize]) -> (f32, f32) {
        let (mut range, mut start) = ((0f32, 0f32), 0);
        for &end in without.iter().chain([&row.len()]) {
            if end > start {
                // SAFETY: `RowLoops::of` picks loops this CPU runs.
                let (lo, hi) = unsafe { (self.range)(&row[start..end]) };
                range = (range.0.min(lo), range.1.max(hi));
            }
            start = end + 1;
        }
        range
    }

    /// The fastest loops for `kernel`'s CPUs.
    fn of(kernel: Kernel) -> Self {
        #[cfg(target_arch = "x86_64")]
        match kernel {
            Kernel::Vnni => {
                return Self {
                    range: avx512::range,
                    quantize: avx512::quantize,
                };
            }
            Kernel::Avx2 | Kernel::AvxVnni => {
                return Self {
                    range: avx2::range,
                    quantize: avx2::quantize,
                };
            }
            // (Not on x86.)
            Kernel::Sdot | Kernel::I8mm | Kernel::Portable => {}
        }
        #[cfg(target_arch = "aarch64")]
        if matches!(kernel, Kernel::Sdot | Kernel::I8mm) {
            return Self {
                range: neon::range,
                quantize: neon::quantize,
            };
        }
        let _ = kernel;
        Self {
            range: |row| {
                row.iter()
                    .fold((0f32, 0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)))
            },
            quantize: |q, row, inv, shift| {
                for (q, &v) in q.iter_mut().zip(row) {
                    *q = (v * inv + shift).clamp(0.0, 255.0) as u8;
                }
            },
        }
    }
}

/// Which tile kernel runs. On the same quantised weights all give the same
/// integers, so the same floats; the AVX2 one needs activations within
/// 0..=128 (`Kernel::activation_levels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// AVX-512 VNNI `vpdpbusd`: 64 u8 × i8 products per instruction.
    Vnni,
    /// AVX-VNNI `vpdpbusd` on 256 bits: 32 products per instruction.
    AvxVnni,
    /// AVX2 `vpmaddubsw` + `vpmaddwd`: 32 products per pair of
    /// instructions, on 7-bit activations (their pairs of products would
    /// overflow i16 otherwise, as ONNX Runtime's do on AVX2 CPUs).
    Avx2,
    /// aarch64's dot product (`sdot`, Armv8.2: every Apple M-series chip,
    /// Graviton 2 and later): 16 i8 × i8 products per instruction.
    Sdot,
    /// aarch64's 8-bit matrix multiply (`smmla`, I8MM: Apple M2 and later,
    /// Graviton 3 and later): a 2×8 by 8×2 product, 32 i8 × i8 products,
    /// per instruction.
    I8mm,
    /// Plain Rust, for other CPUs: far slower than f32.
    Portable,
}

impl Kernel {
    /// What q8 adds to a model's revision (an index keeps to one): `q8v2`,
    /// or `q8a7` for the AVX2 tile's 7-bit activations. An index of the
    /// int8 vectors before outlier channels (`q8`, or `q8w7` from 7-bit
    /// weights) asks for a rebuild.
    pub fn revision_tag(self) -> &'static str {
        match self.activation_levels() {
            255 => "q8v2",
            _ => "q8a7",
        }
    }

    /// The steps an activation row is quantised to: 255 (8 bits) where the
    /// kernel sums exactly in i32; 127 for `Avx2`'s i16 pair sums (a byte
    /// then reaches 128 at most, rounding up: 128 · 127 · 2 fits i16,
    /// 255 · 127 · 2 does not). 7-bit activations lost less than the 7-bit
    /// weights used before (all-MiniLM-L6-v2, outlier channels apart, in a
    /// PyTorch model of this quantisation: lowest cosine to f32 on the
    /// check's texts 0.9958 against 0.9955).
    pub fn activation_levels(self) -> i32 {
        match self {
            Kernel::Avx2 => 127,
            Kernel::Vnni | Kernel::AvxVnni | Kernel::Sdot | Kernel::I8mm | Kernel::Portable => 255,
        }
    }

    /// The best this CPU runs; `RECALL_Q8=avx2`, `sdot` or `portable` picks
    /// a lesser one (to compare). Checked once.
    pub fn get() -> Kernel {
        static KERNEL: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *KERNEL.get_or_init(|| {
            let (cpu, wanted) = (super::cpu(), super::overrides().q8.as_deref());
            let below_vnni = matches!(wanted, Some("avx2" | "portable"));
            let below_i8mm = matches!(wanted, Some("sdot" | "portable"));
            let portable = wanted == Some("portable");
            if cpu.avx512_vnni && !below_vnni {
                Kernel::Vnni
            } else if cpu.avx_vnni && !below_vnni {
                Kernel::AvxVnni
            } else if cpu.avx2 && !portable {
                Kernel::Avx2
            } else if cpu.i8mm && !below_i8mm {
                Kernel::I8mm
            } else if cpu.dotprod && !portable {
                Kernel::Sdot
            } else {
                Kernel::Portable
            }
        })
    }
}

/// Activations quantised per row, padded to whole tiles (padding rows are
/// zero and dropped from the output) and to whole groups.
struct QuantRows {
    /// `[mp, kp]`
    data: Vec<u8>,
    scales: Vec<f32>,
    zeros: Vec<i32>,
}

impl QuantRows {
    /// `x`'s rows with positions `without` (ascending) as zeros: those are
    /// summed in f32 (`F32Channels`).
    fn new(x: &[f32], m: usize, k: usize, kp: usize, kernel: Kernel, without: &[usize]) -> Self {
        let (loops, levels) = (RowLoops::of(kernel), kernel.activation_levels());
        Self::with(x, m, k, kp, loops, levels, without)
    }

    fn with(
        x: &[f32],
        m: usize,
        k: usize,
        kp: usize,
        loops: RowLoops,
        levels: i32,
        without: &[usize],
    ) -> Self {
        let mp = m.next_multiple_of(TILE_ROWS);
        let mut data = vec![0u8; mp * kp];
        let mut scales = vec![0f32; mp];
        let mut zeros = vec![0i32; mp];
        data.par_chunks_mut(kp)
            .zip(scales.par_iter_mut().zip(zeros.par_iter_mut()))
            .zip(x.par_chunks(k))
            .for_each(|((q, (scale, zero)), row)| {
                // The range always holds 0, so 0 is exact (padding, ReLU,
                // the channels left out).
                let (lo, hi) = loops.range_without(row, without);
                let (s, z, inv, shift) = Self::params(lo, hi, levels);
                (*scale, *zero) = (s, z);
                // SAFETY: `RowLoops::of` picks loops this CPU runs.
                unsafe { (loops.quantize)(q, row, inv, shift) };
                without.iter().for_each(|&c| q[c] = z as u8);
            });
        Self {
            data,
            scales,
            zeros,
        }
    }

    /// The bytes as `q - 128`, signed, which is what `tile_sdot` multiplies
    /// (`sdot` takes i8 × i8; `pair_signed` does the same for `smmla`).
    fn make_signed(&mut self) {
        self.data.par_chunks_mut(1 << 16).for_each(|c| {
            c.iter_mut().for_each(|q| *q ^= 0x80);
        });
    }

    /// The rows as `tile_smmla` reads them: signed as by `make_signed`
    /// (in the same pass), each pair of rows as runs of 8 bytes, the first
    /// row's then the second's (an `smmla` operand each),
    /// `pair_row_bytes(kp)` bytes a row; past `kp`, zeros.
    fn pair_signed(&mut self, kp: usize) {
        let kp8 = pair_row_bytes(kp);
        let mut paired = vec![0u8; self.data.len() / kp * kp8];
        paired
            .par_chunks_mut(2 * kp8)
            .zip(self.data.par_chunks(2 * kp))
            .for_each(|(to, from)| {
                let (first, second) = from.split_at(kp);
                for (h, run) in to.chunks_exact_mut(16).enumerate() {
                    for (row, half) in [first, second].into_iter().zip(run.chunks_exact_mut(8)) {
                        let part = row.get(8 * h..kp.min(8 * h + 8)).unwrap_or_default();
                        for (to, &q) in half.iter_mut().zip(part) {
                            *to = q ^ 0x80;
                        }
                    }
                }
            });
        self.data = paired;
    }

    /// A row's scale, zero point, and what `quantize` multiplies and adds:
    /// `q = clamp(v · inv + shift)` truncated, which rounds half up (so `q`
    /// reaches `levels + 1` at most).
    fn params(lo: f32, hi: f32, levels: i32) -> (f32, i32, f32, f32) {
        let scale = if hi > lo {
            (hi - lo) / levels as f32
        } else {
            1.0
        };
        let inv = 1.0 / scale;
        let zero = ((-lo * inv + 0.5) as i32).clamp(0, levels);
        (scale, zero, inv, zero as f32 + 0.5)
    }
}

/// The AVX-512 versions of the portable `RowLoops`: the same floats in the same
/// order, so the same bytes.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// `(min(0, row), max(0, row))`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn range(row: &[f32]) -> (f32, f32) {
        let (mut lo, mut hi) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let chunks = row.chunks_exact(16);
        let tail = chunks.remainder();
        for c in chunks {
            let v = unsafe { _mm512_loadu_ps(c.as_ptr()) };
            // A NaN gives back the second operand: skipped, as f32::min does.
            lo = _mm512_min_ps(v, lo);
            hi = _mm512_max_ps(v, hi);
        }
        let (lo, hi) = (_mm512_reduce_min_ps(lo), _mm512_reduce_max_ps(hi));
        tail.iter()
            .fold((lo, hi), |(lo, hi), &v| (lo.min(v), hi.max(v)))
    }

    /// `q = clamp(v · inv + shift, 0, 255)` truncated, as the portable loop.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn quantize(q: &mut [u8], row: &[f32], inv: f32, shift: f32) {
        let (inv_v, shift_v) = (_mm512_set1_ps(inv), _mm512_set1_ps(shift));
        let (zero, top) = (_mm512_setzero_ps(), _mm512_set1_ps(255.0));
        let lanes = row.len() / 16 * 16;
        for i in (0..lanes).step_by(16) {
            unsafe {
                let v = _mm512_add_ps(
                    _mm512_mul_ps(_mm512_loadu_ps(row.as_ptr().add(i)), inv_v),
                    shift_v,
                );
                // max(NaN, 0) is 0, as `clamp` then `as u8` make it.
                let v = _mm512_min_ps(_mm512_max_ps(v, zero), top);
                let bytes = _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(v));
                _mm_storeu_si128(q.as_mut_ptr().add(i) as *mut __m128i, bytes);
            }
        }
        for (q, &v) in q[lanes..].iter_mut().zip(&row[lanes..]) {
            *q = (v * inv + shift).clamp(0.0, 255.0) as u8;
        }
    }
}

/// The AVX2 versions of the portable `RowLoops`, as `avx512`'s.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// `(min(0, row), max(0, row))`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn range(row: &[f32]) -> (f32, f32) {
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let chunks = row.chunks_exact(8);
        let tail = chunks.remainder();
        for c in chunks {
            let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
            // A NaN gives back the second operand: skipped, as f32::min does.
            lo = _mm256_min_ps(v, lo);
            hi = _mm256_max_ps(v, hi);
        }
        let (mut l, mut h) = ([0f32; 8], [0f32; 8]);
        unsafe {
            _mm256_storeu_ps(l.as_mut_ptr(), lo);
            _mm256_storeu_ps(h.as_mut_ptr(), hi);
        }
        l.iter()
            .zip(&h)
            .chain(tail.iter().zip(tail))
            .fold((0f32, 0f32), |(lo, hi), (&l, &h)| (lo.min(l), hi.max(h)))
    }

    /// `q = clamp(v · inv + shift, 0, 255)` truncated, as the portable loop.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize(q: &mut [u8], row: &[f32], inv: f32, shift: f32) {
        let (inv_v, shift_v) = (_mm256_set1_ps(inv), _mm256_set1_ps(shift));
        let (zero, top) = (_mm256_setzero_ps(), _mm256_set1_ps(255.0));
        // Packing goes by 128-bit lanes; this puts the 32 bytes back in order.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let lanes = row.len() / 32 * 32;
        for i in (0..lanes).step_by(32) {
            unsafe {
                let ints: [__m256i; 4] = std::array::from_fn(|j| {
                    let v = _mm256_add_ps(
                        _mm256_mul_ps(_mm256_loadu_ps(row.as_ptr().add(i + 8 * j)), inv_v),
                        shift_v,
                    );
                    // max(NaN, 0) is 0, as `clamp` then `as u8` make it.
                    _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(v, zero), top))
                });
                let words = (
                    _mm256_packus_epi32(ints[0], ints[1]),
                    _mm256_packus_epi32(ints[2], ints[3]),
                );
                let bytes = _mm256_packus_epi16(words.0, words.1);
                let bytes = _mm256_permutevar8x32_epi32(bytes, order);
                _mm256_storeu_si256(q.as_mut_ptr().add(i) as *mut __m256i, bytes);
            }
        }
        for (q, &v) in q[lanes..].iter_mut().zip(&row[lanes..]) {
            *q = (v * inv + shift).clamp(0.0, 255.0) as u8;
        }
    }
}

/// The NEON versions of the portable `RowLoops` (every aarch64 CPU has
/// NEON), as `avx512`'s: the same floats in the same order, so the same
/// bytes. `fminnm`/`fmaxnm`, not `fmin`/`fmax`, which would keep a NaN;
/// a multiply then an add, not `fmla`, which would round once.
#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;

    /// `(min(0, row), max(0, row))`.
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn range(row: &[f32]) -> (f32, f32) {
        let (mut lo, mut hi) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        let chunks = row.chunks_exact(4);
        let tail = chunks.remainder();
        for c in chunks {
            let v = unsafe { vld1q_f32(c.as_ptr()) };
            lo = vminnmq_f32(lo, v);
            hi = vmaxnmq_f32(hi, v);
        }
        let (lo, hi) = (vminnmvq_f32(lo), vmaxnmvq_f32(hi));
        tail.iter()
            .fold((lo, hi), |(lo, hi), &v| (lo.min(v), hi.max(v)))
    }

    /// `q = clamp(v · inv + shift, 0, 255)` truncated, as the portable loop.
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn quantize(q: &mut [u8], row: &[f32], inv: f32, shift: f32) {
        let (inv_v, shift_v) = (vdupq_n_f32(inv), vdupq_n_f32(shift));
        let (zero, top) = (vdupq_n_f32(0.0), vdupq_n_f32(255.0));
        let lanes = row.len() / 8 * 8;
        for i in (0..lanes).step_by(8) {
            unsafe {
                let ints: [uint32x4_t; 2] = std::array::from_fn(|j| {
                    let v = vld1q_f32(row.as_ptr().add(i + 4 * j));
                    let v = vaddq_f32(vmulq_f32(v, inv_v), shift_v);
                    // maxnm(NaN, 0) is 0, as `clamp` then `as u8` make it.
                    vcvtq_u32_f32(vminnmq_f32(vmaxnmq_f32(v, zero), top))
                });
                let words = vcombine_u16(vmovn_u32(ints[0]), vmovn_u32(ints[1]));
                vst1_u8(q.as_mut_ptr().add(i), vmovn_u16(words));
            }
        }
        for (q, &v) in q[lanes..].iter_mut().zip(&row[lanes..]) {
            *q = (v * inv + shift).clamp(0.0, 255.0) as u8;
        }
    }
}

/// One tile's inputs: TILE_ROWS quantised input rows against one panel.
struct Tile<'a> {
    /// TILE_ROWS rows of `kp` bytes.
    x: &'a [u8],
    kp: usize,
    /// kp / GROUP blocks of PANEL × GROUP.
    panel: &'a [i8],
    x_scales: &'a [f32],
    x_zeros: &'a [i32],
    w_scales: &'a [f32],
    w_sums: &'a [i32],
    /// Rows to write (the rest are padding).
    rows: usize,
    /// Part of the next panel to prefetch into L2 meanwhile.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    ahead: &'a [i8],
}

impl Tile<'_> {
    /// The f32 output of one accumulated integer.
    fn output(&self, r: usize, c: usize, acc: i32) -> f32 {
        (acc - self.x_zeros[r] * self.w_sums[c]) as f32 * (self.x_scales[r] * self.w_scales[c])
    }
}

/// One tile in plain Rust, written to `out` (rows `stride` apart): the
/// same integers, and so the same floats, as `tile_vnni`.
///
/// # Safety
/// `out` has `tile.rows` rows of PANEL floats, `stride` apart.
unsafe fn tile_portable(tile: &Tile, out: *mut f32, stride: usize) {
    let mut acc = [[0i32; PANEL]; TILE_ROWS];
    for (g, block) in tile.panel.chunks_exact(PANEL * GROUP).enumerate() {
        for (r, acc) in acc.iter_mut().enumerate() {
            let xs = &tile.x[r * tile.kp + g * GROUP..][..GROUP];
            for (a, w) in acc.iter_mut().zip(block.chunks_exact(GROUP)) {
                *a += (0..GROUP).map(|b| xs[b] as i32 * w[b] as i32).sum::<i32>();
            }
        }
    }
    for (r, acc) in acc.iter().enumerate().take(tile.rows) {
        for (c, &a) in acc.iter().enumerate() {
            unsafe { *out.add(r * stride + c) = tile.output(r, c, a) };
        }
    }
}

/// Defines a tile on 256-bit registers: four strips of 16 columns, each 6
/// rows × 2 registers (12 of the 16 accumulate). `dot` adds to `acc` the
/// four u8 × i8 products of each i32 lane of `x` and of the 32 weight bytes
/// at `w`; the tiles differ only in how.
macro_rules! tile_256 {
    ($(#[$doc:meta])* $name:ident, $features:literal, |$acc:ident, $x:ident, $w:ident| $dot:expr) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name(tile: &Tile, out: *mut f32, stride: usize) {
            use std::arch::x86_64::*;
            const COLS: usize = 16;
            let kp = tile.kp;
            assert!(tile.x.len() >= TILE_ROWS * kp && tile.panel.len() >= kp * PANEL);
            let groups = kp / GROUP;
            let ahead = Prefetch::new(tile.ahead, groups * PANEL / COLS);
            for c0 in (0..PANEL).step_by(COLS) {
                unsafe {
                    let mut acc = [[_mm256_setzero_si256(); 2]; TILE_ROWS];
                    let (x, w) = (tile.x.as_ptr(), tile.panel.as_ptr().add(c0 * GROUP));
                    let step = c0 / COLS * groups;
                    for g in 0..groups {
                        if !tile.ahead.is_empty() {
                            ahead.step(step + g);
                        }
                        let block = w.add(g * PANEL * GROUP) as *const __m256i;
                        for (r, acc) in acc.iter_mut().enumerate() {
                            let four = (x.add(r * kp + g * GROUP) as *const i32).read_unaligned();
                            let xv = _mm256_set1_epi32(four);
                            for (h, acc) in acc.iter_mut().enumerate() {
                                let ($acc, $x, $w) = (*acc, xv, block.add(h));
                                *acc = $dot;
                            }
                        }
                    }
                    for (r, acc) in acc.iter().enumerate().take(tile.rows) {
                        let zero = _mm256_set1_epi32(tile.x_zeros[r]);
                        let scale = _mm256_set1_ps(tile.x_scales[r]);
                        for (h, &sums) in acc.iter().enumerate() {
                            let col = c0 + 8 * h;
                            let w_sums =
                                _mm256_loadu_si256(tile.w_sums.as_ptr().add(col) as *const _);
                            let w_scales = _mm256_loadu_ps(tile.w_scales.as_ptr().add(col));
                            let v = _mm256_sub_epi32(sums, _mm256_mullo_epi32(zero, w_sums));
                            let y = _mm256_mul_ps(
                                _mm256_cvtepi32_ps(v),
                                _mm256_mul_ps(scale, w_scales),
                            );
                            _mm256_storeu_ps(out.add(r * stride + col), y);
                        }
                    }
                }
            }
        }
    };
}

tile_256!(
    /// One tile with AVX2, `vpdpbusd` done in three steps: `vpmaddubsw` (u8
    /// × i8, pairs summed into i16), `vpmaddwd` by ones (pairs of those into
    /// i32) and an add. The i16 sums are exact because this kernel's
    /// activations stay within 0..=128 (`Kernel::activation_levels`):
    /// 128 · 127 · 2 < 2¹⁵.
    ///
    /// # Safety
    /// The CPU has AVX2; `out` as for `tile_portable`.
    tile_avx2,
    "avx2",
    |acc, x, w| {
        // In assembly so that the weights stay memory operands: as
        // intrinsics, LLVM loads each once into a register for the six rows,
        // and with those two the 12 accumulators, the input, the product and
        // the ones need 17 registers, so one accumulator went to the stack
        // and back on every step.
        let mut acc = acc;
        std::arch::asm!(
            "vpmaddubsw {t}, {x}, [{w}]",
            "vpmaddwd {t}, {t}, {ones}",
            "vpaddd {acc}, {acc}, {t}",
            acc = inout(ymm_reg) acc,
            x = in(ymm_reg) x,
            w = in(reg) w,
            ones = in(ymm_reg) _mm256_set1_epi16(1),
            t = out(ymm_reg) _,
            options(nostack, readonly, preserves_flags),
        );
        acc
    }
);

tile_256!(
    /// One tile with AVX-VNNI's `vpdpbusd` on 256 bits, for CPUs that have
    /// it without AVX-512 (Intel's client chips since Alder Lake, its E-core
    /// servers): exact on 8-bit weights, as `tile_vnni`.
    ///
    /// # Safety
    /// The CPU has AVX-VNNI; `out` as for `tile_portable`.
    tile_avx_vnni,
    "avx2,avxvnni",
    |acc, x, w| _mm256_dpbusd_avx_epi32(acc, x, _mm256_loadu_si256(w))
);

// The same tile with AVX-512 VNNI's encoding of that instruction, on 256
// bits: the CPUs that test have AVX-512 rather than AVX-VNNI.
#[cfg(test)]
tile_256!(
    tile_avx_vnni_as_avx512,
    "avx2,avx512vnni,avx512vl",
    |acc, x, w| _mm256_dpbusd_epi32(acc, x, _mm256_loadu_si256(w))
);

/// One tile with `vpdpbusd` (u8 × i8, four products summed into each i32
/// lane, exactly: no saturation), the scales applied in registers.
///
/// # Safety
/// The CPU has AVX-512 VNNI; `out` as for `tile_portable`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn tile_vnni(tile: &Tile, out: *mut f32, stride: usize) {
    use std::arch::x86_64::*;
    const REGS: usize = PANEL / 16;
    let kp = tile.kp;
    assert!(tile.x.len() >= TILE_ROWS * kp && tile.panel.len() >= kp * PANEL);
    unsafe {
        let mut sums = [[_mm512_setzero_si512(); REGS]; TILE_ROWS];
        let (x, w) = (tile.x.as_ptr(), tile.panel.as_ptr());
        let mut group = |g: usize| {
            let block = w.add(g * PANEL * GROUP);
            let wv: [__m512i; REGS] =
                std::array::from_fn(|c| _mm512_loadu_si512(block.add(c * 64) as *const _));
            for (r, sums) in sums.iter_mut().enumerate() {
                let four = (x.add(r * kp + g * GROUP) as *const i32).read_unaligned();
                let xv = _mm512_set1_epi32(four);
                for c in 0..REGS {
                    sums[c] = _mm512_dpbusd_epi32(sums[c], xv, wv[c]);
                }
            }
        };
        // Two loops: working out each step's prefetches, even none, was
        // 2.5% of a 1×128 forward pass's samples in perf.
        if tile.ahead.is_empty() {
            (0..kp / GROUP).for_each(&mut group);
        } else {
            let ahead = Prefetch::new(tile.ahead, kp / GROUP);
            for g in 0..kp / GROUP {
                ahead.step(g);
                group(g);
            }
        }
        let w_scales: [__m512; REGS] =
            std::array::from_fn(|c| _mm512_loadu_ps(tile.w_scales.as_ptr().add(c * 16)));
        let w_sums: [__m512i; REGS] = std::array::from_fn(|c| {
            _mm512_loadu_si512(tile.w_sums.as_ptr().add(c * 16) as *const _)
        });
        for (r, sums) in sums.iter().enumerate().take(tile.rows) {
            let zero = _mm512_set1_epi32(tile.x_zeros[r]);
            let scale = _mm512_set1_ps(tile.x_scales[r]);
            for c in 0..REGS {
                let v = _mm512_sub_epi32(sums[c], _mm512_mullo_epi32(zero, w_sums[c]));
                let y = _mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_mul_ps(scale, w_scales[c]));
                _mm512_storeu_ps(out.add(r * stride + c * 16), y);
            }
        }
    }
}

/// One tile with the Armv8.2 dot product (`sdot`: four i8 × i8 products
/// summed into each i32 lane, exactly), as `tile_avx_vnni`'s on registers
/// half as wide: four strips of 16 columns, each 6 rows × 4 registers (24
/// of the 32). Per group of 4 positions, 4 weight loads and 6 broadcast
/// loads (`ld1r`) feed 24 `sdot`. The activations come as `q - 128`
/// (`QuantRows::make_signed`), since `sdot` is signed on both sides; adding
/// back `128 · Σ w` gives `tile_vnni`'s very integers.
///
/// # Safety
/// The CPU has the dot product; `tile.x` holds `q - 128`; `out` as for
/// `tile_portable`.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon,dotprod")]
unsafe fn tile_sdot(tile: &Tile, out: *mut f32, stride: usize) {
    use std::arch::aarch64::*;
    const COLS: usize = 16;
    const REGS: usize = COLS / 4;
    let kp = tile.kp;
    assert!(tile.x.len() >= TILE_ROWS * kp && tile.panel.len() >= kp * PANEL);
    let groups = kp / GROUP;
    let ahead = Prefetch::new(tile.ahead, groups * PANEL / COLS);
    for c0 in (0..PANEL).step_by(COLS) {
        unsafe {
            let mut acc = [[vdupq_n_s32(0); REGS]; TILE_ROWS];
            let (x, w) = (tile.x.as_ptr(), tile.panel.as_ptr().add(c0 * GROUP));
            let step = c0 / COLS * groups;
            for g in 0..groups {
                if !tile.ahead.is_empty() {
                    ahead.step(step + g);
                }
                let block = w.add(g * PANEL * GROUP);
                let wv: [int8x16_t; REGS] = std::array::from_fn(|h| vld1q_s8(block.add(16 * h)));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let four = x.add(r * kp + g * GROUP) as *const i32;
                    let xv = vreinterpretq_s8_s32(vld1q_dup_s32(four));
                    for (acc, &wv) in acc.iter_mut().zip(&wv) {
                        *acc = sdot(*acc, wv, xv);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate().take(tile.rows) {
                for (h, &sums) in acc.iter().enumerate() {
                    let col = c0 + 4 * h;
                    let y = signed_outputs(tile, r, col, sums);
                    vst1q_f32(out.add(r * stride + col), y);
                }
            }
        }
    }
}

/// Bytes a row of activations takes in `QuantRows::pair_signed`'s layout.
fn pair_row_bytes(kp: usize) -> usize {
    kp.next_multiple_of(8)
}

/// One tile with I8MM's `smmla` (the 2×8 by 8×2 i8 product, added exactly
/// to a 2×2 of i32): eight strips of 8 columns, each 3 pairs of rows × 4
/// pairs of columns (12 accumulators). Per 8 positions, 4 weight loads and
/// 4 `zip`s (two groups of the panel's 4-byte layout become a column's 8
/// bytes) and 3 activation loads (rows paired by `QuantRows::pair_signed`)
/// feed 12 `smmla`, 384 products: `tile_sdot` takes 10 loads and 24 `sdot`
/// for as many. Signed activations and the same correction as `tile_sdot`,
/// so the same integers.
///
/// # Safety
/// The CPU has I8MM; `tile.x` holds `q - 128` in pairs of rows
/// (`pair_row_bytes`); `out` as for `tile_portable`.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon,i8mm")]
unsafe fn tile_smmla(tile: &Tile, out: *mut f32, stride: usize) {
    use std::arch::aarch64::*;
    const COLS: usize = 8;
    const PAIRS: usize = TILE_ROWS / 2;
    let kp = tile.kp;
    let row_bytes = pair_row_bytes(kp);
    assert!(tile.x.len() >= TILE_ROWS * row_bytes && tile.panel.len() >= kp * PANEL);
    let groups = kp / GROUP;
    let octets = row_bytes / 8;
    debug_assert!(kp.is_multiple_of(GROUP), "kp {kp} is a multiple of GROUP");
    let ahead = Prefetch::new(tile.ahead, octets * PANEL / COLS);
    for c0 in (0..PANEL).step_by(COLS) {
        unsafe {
            // acc[p][j]: rows 2p, 2p + 1 × columns c0 + 2j, c0 + 2j + 1.
            let mut acc = [[vdupq_n_s32(0); COLS / 2]; PAIRS];
            let (x, w) = (tile.x.as_ptr(), tile.panel.as_ptr().add(c0 * GROUP));
            let step = c0 / COLS * octets;
            // Groups 2h and 2h + 1 (zeros for the second past the last),
            // 4 columns a register: zipped by 4-byte lanes, a column's 8
            // bytes. `paired` is a constant at each call below, so the loop
            // over whole pairs makes no zeros.
            let mut octet = |h: usize, paired: bool| {
                if !tile.ahead.is_empty() {
                    ahead.step(step + h);
                }
                let first = w.add(2 * h * PANEL * GROUP);
                let load = |at: usize| vreinterpretq_s32_s8(vld1q_s8(first.add(at)));
                let (a0, a1) = (load(0), load(16));
                let (b0, b1) = match paired {
                    true => (load(PANEL * GROUP), load(PANEL * GROUP + 16)),
                    false => (vdupq_n_s32(0), vdupq_n_s32(0)),
                };
                let wv = [
                    vreinterpretq_s8_s32(vzip1q_s32(a0, b0)),
                    vreinterpretq_s8_s32(vzip2q_s32(a0, b0)),
                    vreinterpretq_s8_s32(vzip1q_s32(a1, b1)),
                    vreinterpretq_s8_s32(vzip2q_s32(a1, b1)),
                ];
                for (p, acc) in acc.iter_mut().enumerate() {
                    let xv = vld1q_s8(x.add(2 * p * row_bytes + 16 * h) as *const i8);
                    for (acc, &wv) in acc.iter_mut().zip(&wv) {
                        *acc = smmla(*acc, xv, wv);
                    }
                }
            };
            for h in 0..groups / 2 {
                octet(h, true);
            }
            if groups % 2 == 1 {
                octet(groups / 2, false);
            }
            for (p, acc) in acc.iter().enumerate() {
                for half in 0..2 {
                    let (lo, hi) = (
                        vreinterpretq_s64_s32(acc[2 * half]),
                        vreinterpretq_s64_s32(acc[2 * half + 1]),
                    );
                    // Each row's 4 columns c0 + 4·half.. .
                    let rows = [vzip1q_s64(lo, hi), vzip2q_s64(lo, hi)];
                    for (r, sums) in (2 * p..).zip(rows) {
                        if r >= tile.rows {
                            break;
                        }
                        let col = c0 + 4 * half;
                        let y = signed_outputs(tile, r, col, vreinterpretq_s32_s64(sums));
                        vst1q_f32(out.add(r * stride + col), y);
                    }
                }
            }
        }
    }
}

/// The f32 outputs of row `r`, columns `col..col + 4`, from the sums of
/// signed activations (`q - 128`): `Σ q·w = Σ (q - 128)·w + 128·Σ w`, less
/// the zero point's `zero · Σ w`, then both scales, as `Tile::output`.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
#[inline]
unsafe fn signed_outputs(
    tile: &Tile,
    r: usize,
    col: usize,
    sums: std::arch::aarch64::int32x4_t,
) -> std::arch::aarch64::float32x4_t {
    use std::arch::aarch64::*;
    unsafe {
        let shift = vdupq_n_s32(128 - tile.x_zeros[r]);
        let w_sums = vld1q_s32(tile.w_sums.as_ptr().add(col));
        let w_scales = vld1q_f32(tile.w_scales.as_ptr().add(col));
        let v = vmlaq_s32(sums, shift, w_sums);
        vmulq_f32(
            vcvtq_f32_s32(v),
            vmulq_f32(vdupq_n_f32(tile.x_scales[r]), w_scales),
        )
    }
}

/// Defines `$name(acc, a, b)`: `acc` plus the products of the i8 × i8
/// instruction `$op` on `a` and `b` (in assembly: its intrinsic is not
/// stable Rust).
macro_rules! arm_int8 {
    ($(#[$doc:meta])* $name:ident, $features:literal, $op:literal) => {
        $(#[$doc])*
        #[cfg(target_arch = "aarch64")]
        #[target_feature(enable = $features)]
        #[inline]
        fn $name(
            acc: std::arch::aarch64::int32x4_t,
            a: std::arch::aarch64::int8x16_t,
            b: std::arch::aarch64::int8x16_t,
        ) -> std::arch::aarch64::int32x4_t {
            let mut acc = acc;
            unsafe {
                std::arch::asm!(
                    concat!($op, " {acc:v}.4s, {a:v}.16b, {b:v}.16b"),
                    acc = inout(vreg) acc,
                    a = in(vreg) a,
                    b = in(vreg) b,
                    options(pure, nomem, nostack, preserves_flags),
                )
            };
            acc
        }
    };
}

arm_int8!(
    /// `acc +` the 2×2 products of `x`'s two rows of 8 and `w`'s two
    /// columns of 8 (`smmla acc, x, w`).
    smmla,
    "neon,i8mm",
    "smmla"
);

arm_int8!(
    /// `acc +` the four products of each i32 lane of `w` and `x` (`sdot`).
    sdot,
    "neon,dotprod",
    "sdot"
);

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `len` values in -amplitude..amplitude, spread by `seed`.
    pub(crate) fn values(len: usize, seed: usize, amplitude: f32) -> Vec<f32> {
        (0..len)
            .map(|v| (((v * seed) % 1999) as f32 / 999.5 - 1.0) * amplitude)
            .collect()
    }

    /// The kernel's integers, one output at a time, from unpacked data.
    fn reference(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let q = QLinear::quantize(w, n, k);
        let levels = Kernel::get().activation_levels();
        let rows = QuantRows::with(x, m, k, q.kp, RowLoops::of(Kernel::Portable), levels, &[]);
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0i32;
                for p in 0..k {
                    let packed = (j / PANEL) * PANEL * q.kp
                        + (p / GROUP) * PANEL * GROUP
                        + (j % PANEL) * GROUP
                        + p % GROUP;
                    acc += rows.data[i * q.kp + p] as i32 * q.packed[packed] as i32;
                }
                out[i * n + j] =
                    (acc - rows.zeros[i] * q.sums[j]) as f32 * (rows.scales[i] * q.scales[j]);
            }
        }
        out
    }

    #[test]
    fn kernel_gives_the_reference_integers_at_every_edge() {
        for &(m, k, n) in &[
            (1, 4, 1),
            (5, 13, 7),
            (3, 20, 70),
            (7, 1024, 130),
            (16, 384, 64),
            (13, 4096, 3),
        ] {
            let (x, w) = (values(m * k, 7919, 3.0), values(n * k, 104729, 0.1));
            let q = QLinear::quantize(&w, n, k);
            assert_eq!(q.matmul_t(&x, m), reference(&x, &w, m, k, n), "{m}x{k}x{n}");
        }
    }

    #[test]
    fn every_kernel_gives_the_same_floats() {
        #[cfg(target_arch = "x86_64")]
        let (vnni, avx_vnni, vnni_256, avx2) = {
            use std::arch::is_x86_feature_detected as has;
            let vnni = has!("avx512vnni");
            (
                vnni,
                has!("avxvnni"),
                vnni && has!("avx512vl"),
                has!("avx2"),
            )
        };
        #[cfg(not(target_arch = "x86_64"))]
        let (vnni, avx2) = (false, false);
        // kp 4 past a multiple of 8: a group without a pair (`tile_smmla`).
        let (m, k, kp) = (7, 1026, 1028);
        let mut x = values(m * k, 7919, 3.0);
        // A row of one positive value: every input byte 255, the largest
        // products there are.
        x[..k].fill(3.0);
        // A NaN (a broken model's) is skipped by the range, 0 as a byte: put
        // after the row's minimum in the same vector lane (for 8 and 16
        // lanes), which a NaN-keeping min would lose.
        x[2 * k + 9] = -5.0;
        x[2 * k + 25] = f32::NAN;
        let portable = RowLoops::of(Kernel::Portable);
        for levels in [255, 127] {
            let a = QuantRows::with(&x, m, k, kp, portable, levels, &[]);
            assert!(a.data[..k].iter().all(|&q| q as i32 == levels));
            assert!(a.data.iter().all(|&q| q as i32 <= levels + 1));
            for (kernel, run) in [
                (Kernel::Avx2, avx2),
                (Kernel::AvxVnni, avx2),
                (Kernel::Vnni, vnni),
                // The NEON loops: every aarch64 CPU runs them.
                (Kernel::Sdot, cfg!(target_arch = "aarch64")),
            ] {
                if run {
                    let b = QuantRows::with(&x, m, k, kp, RowLoops::of(kernel), levels, &[]);
                    assert_eq!(
                        (&a.data, &a.scales, &a.zeros),
                        (&b.data, &b.scales, &b.zeros),
                        "{kernel:?}, {levels} levels"
                    );
                }
            }
        }
        let a = QuantRows::with(&x, m, k, kp, portable, 255, &[]);
        let w_scales: Vec<f32> = (0..PANEL).map(|c| 0.001 * (c + 1) as f32).collect();
        // The next panel, to prefetch: any bytes.
        let ahead = vec![0i8; PANEL * kp];
        let limit = WEIGHT_LIMIT;
        // Weights over the whole range, and the first 64 groups at its
        // ends, so that pairs of products reach ±top · limit · 2.
        let mut panel: Vec<i8> = (0..PANEL * kp)
            .map(|v| ((v * 17) as i32 % (2 * limit + 1) - limit) as i8)
            .collect();
        for (i, w) in panel[..64 * PANEL * GROUP].iter_mut().enumerate() {
            *w = if (i / (PANEL * GROUP)).is_multiple_of(2) {
                limit
            } else {
                -limit
            } as i8;
        }
        // Each column's sum, which the sdot tile's correction relies on.
        let w_sums: Vec<i32> = (0..PANEL)
            .map(|c| {
                (panel.chunks_exact(PANEL * GROUP))
                    .flat_map(|block| &block[c * GROUP..][..GROUP])
                    .map(|&w| w as i32)
                    .sum()
            })
            .collect();
        // Every input byte, or those the AVX2 tile takes (0..=128).
        for top in [255u8, 128] {
            let data: Vec<u8> = a.data.iter().map(|&q| q.min(top)).collect();
            let tile = Tile {
                x: &data[..TILE_ROWS * kp],
                kp,
                panel: &panel,
                x_scales: &a.scales[..TILE_ROWS],
                x_zeros: &a.zeros[..TILE_ROWS],
                w_scales: &w_scales,
                w_sums: &w_sums,
                rows: 5,
                ahead: &ahead,
            };
            let mut p = vec![-1f32; TILE_ROWS * PANEL];
            unsafe { tile_portable(&tile, p.as_mut_ptr(), PANEL) };
            assert!(
                p[5 * PANEL..].iter().all(|&y| y == -1.0),
                "a padding row was written"
            );
            #[cfg(target_arch = "x86_64")]
            for (name, kernel, run, tile_of) in [
                (
                    "AVX2",
                    Kernel::Avx2,
                    avx2,
                    tile_avx2 as unsafe fn(&Tile, *mut f32, usize),
                ),
                ("AVX-512 VNNI", Kernel::Vnni, vnni, tile_vnni),
                ("AVX-VNNI", Kernel::AvxVnni, avx_vnni, tile_avx_vnni),
                (
                    "AVX-VNNI's tile as AVX-512 VNNI on 256 bits",
                    Kernel::AvxVnni,
                    vnni_256,
                    tile_avx_vnni_as_avx512,
                ),
            ] {
                if !run {
                    eprintln!("quant: this CPU lacks {name}; that tile is not compared");
                    continue;
                }
                if kernel.activation_levels() + 1 < top as i32 {
                    continue;
                }
                let mut v = vec![-1f32; TILE_ROWS * PANEL];
                unsafe { tile_of(&tile, v.as_mut_ptr(), PANEL) };
                assert_eq!(p, v, "{name}, input bytes up to {top}");
            }
            #[cfg(target_arch = "aarch64")]
            if std::arch::is_aarch64_feature_detected!("dotprod") {
                let signed: Vec<u8> = data.iter().map(|&q| q ^ 0x80).collect();
                let tile = Tile {
                    x: &signed[..TILE_ROWS * kp],
                    ..tile
                };
                let mut v = vec![-1f32; TILE_ROWS * PANEL];
                unsafe { tile_sdot(&tile, v.as_mut_ptr(), PANEL) };
                assert_eq!(p, v, "sdot, input bytes up to {top}");
            } else {
                eprintln!("quant: this CPU lacks the dot product; the sdot tile is not compared");
            }
            #[cfg(target_arch = "aarch64")]
            if std::arch::is_aarch64_feature_detected!("i8mm") {
                let mut rows = QuantRows {
                    data: data.clone(),
                    scales: vec![],
                    zeros: vec![],
                };
                rows.pair_signed(kp);
                let tile = Tile {
                    x: &rows.data[..TILE_ROWS * pair_row_bytes(kp)],
                    ..tile
                };
                let mut v = vec![-1f32; TILE_ROWS * PANEL];
                unsafe { tile_smmla(&tile, v.as_mut_ptr(), PANEL) };
                assert_eq!(p, v, "smmla, input bytes up to {top}");
            } else {
                eprintln!("quant: this CPU lacks I8MM; the smmla tile is not compared");
            }
        }
    }

    #[test]
    fn close_to_the_f32_product() {
        let (m, k, n) = (9, 1024, 70);
        let (x, w) = (values(m * k, 7919, 3.0), values(n * k, 104729, 0.1));
        let got = QLinear::quantize(&w, n, k).matmul_t(&x, m);
        for i in 0..m {
            for j in 0..n {
                let exact: f32 = (0..k).map(|p| x[i * k + p] * w[j * k + p]).sum();
                let norm = (0..k)
                    .map(|p| (x[i * k + p] * w[j * k + p]).abs())
                    .sum::<f32>();
                let err = (got[i * n + j] - exact).abs();
                assert!(
                    err <= 0.01 * norm,
                    "({i}, {j}): {} vs {exact}",
                    got[i * n + j]
                );
            }
        }
    }

    /// Relative error of `got` against the exact `x · Wᵀ`, over all
    /// outputs: |got - exact| / Σ |products|, the largest.
    fn worst_error(x: &[f32], w: &[f32], got: &[f32], m: usize, k: usize, n: usize) -> f32 {
        let mut worst = 0f32;
        for i in 0..m {
            for j in 0..n {
                let (exact, norm) = (0..k)
                    .map(|p| (x[i * k + p] * w[j * k + p]) as f64)
                    .fold((0f64, 0f64), |(s, a), v| (s + v, a + v.abs()));
                worst = worst.max(((got[i * n + j] as f64 - exact).abs() / norm) as f32);
            }
        }
        worst
    }

    #[test]
    fn outlier_channels_are_the_few_far_above_the_median() {
        let k = 384;
        let peaks: Vec<f32> = (0..k).map(|c| 2.0 + (c % 7) as f32 * 0.3).collect();
        assert_eq!(outlier_channels(&peaks), Vec::<usize>::new());
        let mut some = peaks.clone();
        some[17] = 20.0;
        some[3] = 300.0;
        // At 3× the median (2.9 here) and below, a channel stays.
        some[200] = 8.6;
        assert_eq!(outlier_channels(&some), vec![3, 17]);
        // Never more than k / 32, the largest kept.
        let mut many = peaks.clone();
        for (c, p) in many.iter_mut().enumerate().take(40) {
            *p = 100.0 + c as f32;
        }
        assert_eq!(outlier_channels(&many), (28..40).collect::<Vec<_>>());
        // A narrow layer keeps up to MIN_OUTLIER_LIMIT (8), not k / 32 (1):
        // of 10 channels ×10, the two smallest (0 and 7, at 20) stay.
        let mut narrow = peaks[..32].to_vec();
        narrow[..10].iter_mut().for_each(|p| *p *= 10.0);
        assert_eq!(outlier_channels(&narrow), vec![1, 2, 3, 4, 5, 6, 8, 9]);
        assert_eq!(outlier_channels(&[]), Vec::<usize>::new());
    }

    #[test]
    fn outlier_channels_keep_the_rest_of_a_row_in_eight_bits() {
        let (m, k, n) = (7, 256, 70);
        let mut x = values(m * k, 7919, 1.0);
        let outliers = [5, 130];
        for row in x.chunks_mut(k) {
            row[5] *= 100.0;
            row[130] *= -60.0;
        }
        let w = values(n * k, 104729, 0.1);
        let plain = QLinear::quantize(&w, n, k).matmul_t(&x, m);
        let split = QLinear::quantize_split(&w, n, k, &outliers).matmul_t(&x, m);
        let (plain, split) = (
            worst_error(&x, &w, &plain, m, k, n),
            worst_error(&x, &w, &split, m, k, n),
        );
        assert!(split < 0.01, "split: {split}");
        assert!(split * 10.0 < plain, "split {split} against {plain}");
        // Only the channels: their products are f32's.
        let mut only = vec![0f32; m * k];
        for (o, x) in only.chunks_mut(k).zip(x.chunks(k)) {
            outliers.iter().for_each(|&c| o[c] = x[c]);
        }
        let got = QLinear::quantize_split(&w, n, k, &outliers).matmul_t(&only, m);
        assert!(worst_error(&only, &w, &got, m, k, n) < 1e-6);
    }

    #[test]
    fn split_product_is_the_int8_one_of_the_rest_plus_the_channels_in_f32() {
        // Rows past one tile, panels with 8-column and single-column tails.
        for (m, k, n) in [(7, 256, 150), (1, 64, 7), (13, 384, 64)] {
            let x = values(m * k, 7919, 1.0);
            let w = values(n * k, 104729, 0.1);
            let outliers = [0, 5, 6, k - 1];
            let cleared = |v: &[f32]| cleared(v, k, &outliers).into_owned();
            let mut want = QLinear::quantize(&cleared(&w), n, k).matmul_t(&cleared(&x), m);
            for (i, want) in want.chunks_mut(n).enumerate() {
                for (j, want) in want.iter_mut().enumerate() {
                    for &c in &outliers {
                        *want += x[i * k + c] * w[j * k + c];
                    }
                }
            }
            let got = QLinear::quantize_split(&w, n, k, &outliers).matmul_t(&x, m);
            assert_eq!(got, want, "{m}x{k}x{n}");
        }
    }

    #[test]
    fn symmetric_rows_are_the_same_bytes_with_vector_loops() {
        #[cfg_attr(
            not(any(target_arch = "x86_64", target_arch = "aarch64")),
            allow(unused_mut)
        )]
        let mut kernels: Vec<Kernel> = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                kernels.push(Kernel::Vnni);
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                kernels.extend([Kernel::Avx2, Kernel::AvxVnni]);
            }
        }
        // The NEON loops: every aarch64 CPU runs them.
        #[cfg(target_arch = "aarch64")]
        kernels.extend([Kernel::Sdot]);
        if kernels.is_empty() {
            eprintln!("this CPU has no vector loop: only the portable one runs");
        }
        // Tails of every length; the largest magnitude on either side;
        // halves that round; zeros.
        for len in [1, 15, 16, 17, 40, 64, 100] {
            for (seed, amplitude) in [(7919, 1.0), (104729, 3e-3), (1, 0.0)] {
                let mut row = values(len, seed, amplitude);
                row[len / 2] = -2.0 * amplitude;
                if len > 3 {
                    // A half to round: 63.5 steps at ±127.
                    row[1] = amplitude;
                    row[2] = amplitude * 3.0 / 64.0;
                }
                for &kernel in &kernels {
                    let (mut a, mut b) = (vec![0i8; len], vec![0i8; len]);
                    let portable = symmetric_with(&mut a, &row, RowLoops::of(Kernel::Portable));
                    let vectorised = quantize_symmetric(&mut b, &row, kernel);
                    assert_eq!(
                        (portable, &a),
                        (vectorised, &b),
                        "{kernel:?}: {len} × {amplitude}"
                    );
                }
            }
        }
    }

    #[test]
    fn zero_rows_and_columns_stay_zero() {
        let (m, k, n) = (3, 8, 2);
        let x = vec![0f32; m * k];
        let w = values(n * k, 13, 1.0);
        assert!(
            QLinear::quantize(&w, n, k)
                .matmul_t(&x, m)
                .iter()
                .all(|&v| v == 0.0)
        );
        let x = values(m * k, 7, 1.0);
        let w = vec![0f32; n * k];
        assert!(
            QLinear::quantize(&w, n, k)
                .matmul_t(&x, m)
                .iter()
                .all(|&v| v == 0.0)
        );
    }
}
