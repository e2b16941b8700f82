//! int8 linear layers, for `--dtype q8`.
//!
//! Weights are quantised once, at load: symmetric, one scale per output
//! column (`w ≈ scale · q`, `q` in -127..=127). Activations are quantised
//! per call: asymmetric, one scale and zero point per input row (`x ≈
//! scale · (q - zero)`, `q` in 0..=255, or 0..=127 for the AVX2 tile:
//! `Q8Kernel::activation_levels`), which keeps the full range for GELU's
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
//! That tile needs AVX-512 VNNI (docs/q8.md names the CPUs);
//! an AVX-VNNI tile (the same instruction on 256 bits), an AVX2 tile,
//! aarch64 tiles on the Armv8.2 dot product (`sdot`) and on I8MM's `smmla`,
//! and a portable loop compute the very same integers from the same
//! weights (`Q8Kernel`). The AVX2 tile needs activations within
//! 0..=128, so CPUs that run it quantise them to 127 levels and give
//! slightly different vectors (another revision: `Q8Kernel::revision_tag`).
//! `crate::attention` puts q8's `Q · Kᵀ` through the same kernels.
//!
//! This file holds the layer (`QLinear`: its product, tile by tile), the
//! choice of kernel (`Q8Kernel`) and what a tile is given (`Tile`). The
//! rest, by job:
//! - `pack`: quantising and packing a layer's weights, or reading them back;
//! - `outliers`: the input channels summed in f32 beside the int8 product;
//! - `activations`: quantising the input rows per call (`QuantRows`) and
//!   the row loops that do it (`RowLoops`);
//! - `x86`, `aarch64`, `portable`: the tiles (and the vector row loops),
//!   one file per instruction set.

#[cfg(target_arch = "aarch64")]
mod aarch64;
mod activations;
mod outliers;
mod pack;
mod portable;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

use rayon::prelude::*;

use crate::kernels::matmul::{Dst, share};
use crate::packcache::{Packed, Slab};

#[cfg(target_arch = "aarch64")]
use aarch64::{tile_sdot, tile_smmla};
use activations::{QuantRows, pair_row_bytes};
use outliers::F32Channels;
pub use outliers::outlier_channels;
use portable::tile_portable;
#[cfg(target_arch = "x86_64")]
use x86::{tile_avx_vnni, tile_avx2, tile_vnni};

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

impl QLinear {
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
        let kernel = Q8Kernel::get();
        let mut rows = QuantRows::new(x, m, self.k, self.kp, kernel, &self.outliers.channels);
        // A tile's rows in `rows.data`: kp bytes each, signed for the Arm
        // tiles, and for `tile_smmla` in pairs of 8-byte runs.
        let row_bytes = match kernel {
            Q8Kernel::Sdot => {
                rows.make_signed();
                self.kp
            }
            Q8Kernel::I8mm => {
                rows.pair_signed(self.kp);
                pair_row_bytes(self.kp)
            }
            _ => self.kp,
        };
        // The f32 channels' vector loop: every x86 tile kernel's CPU has
        // AVX2 (AVX-512 ones included: `Q8Kernel::get` picks Vnni on
        // AVX-512F and AvxVnni on AVX-VNNI, each of which implies AVX2, as
        // rustc's target features have it).
        let vector = matches!(kernel, Q8Kernel::Vnni | Q8Kernel::AvxVnni | Q8Kernel::Avx2);
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
                // SAFETY: i < m, so the offset lies inside `out`'s m × np
                // floats of capacity.
                let out = unsafe { dst.at(i * np + p * PANEL) };
                // Each tile below asserts the lengths of what it reads
                // (`tile`'s slices) and writes `tile.rows` rows of PANEL
                // floats at `out`, np apart: rows i..i + tile.rows (at most
                // m) of `out`, in panel p's columns, which no other task
                // touches.
                match kernel {
                    // SAFETY: `Q8Kernel::get` picks Vnni only where `cpu()`
                    // found AVX-512F and AVX-512 VNNI; `out` as above.
                    #[cfg(target_arch = "x86_64")]
                    Q8Kernel::Vnni => unsafe { tile_vnni(&tile, out, np) },
                    // SAFETY: `Q8Kernel::get` picks Avx2 only where `cpu()`
                    // found AVX2; `out` as above.
                    #[cfg(target_arch = "x86_64")]
                    Q8Kernel::Avx2 => unsafe { tile_avx2(&tile, out, np) },
                    // SAFETY: `Q8Kernel::get` picks AvxVnni only where `cpu()`
                    // found AVX-VNNI (which implies AVX2); `out` as above.
                    #[cfg(target_arch = "x86_64")]
                    Q8Kernel::AvxVnni => unsafe { tile_avx_vnni(&tile, out, np) },
                    // SAFETY: `Q8Kernel::get` picks Sdot only where `cpu()`
                    // found the dot product (NEON is aarch64's baseline);
                    // `out` as above.
                    #[cfg(target_arch = "aarch64")]
                    Q8Kernel::Sdot => unsafe { tile_sdot(&tile, out, np) },
                    // SAFETY: `Q8Kernel::get` picks I8mm only where `cpu()`
                    // found I8MM (NEON is aarch64's baseline); `out` as
                    // above.
                    #[cfg(target_arch = "aarch64")]
                    Q8Kernel::I8mm => unsafe { tile_smmla(&tile, out, np) },
                    // SAFETY: no CPU feature; `out` as above.
                    _ => unsafe { tile_portable(&tile, out, np) },
                }
                let xs = &xs[t * xs_tile..][..xs_tile];
                // SAFETY: the tile above has just written those `tile.rows`
                // rows of PANEL floats at `out`, this task's alone; `vector`
                // only for x86 kernels, whose CPUs have AVX2 (see above).
                unsafe { (self.outliers).add(xs, p, out, tile.rows, np, vector) };
            }
        });
        // SAFETY: the capacity is m × np, and the tasks, one per panel,
        // wrote every row of their PANEL columns: all m × np floats.
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

/// Which tile kernel runs. On the same quantised weights all give the same
/// integers, so the same floats; the AVX2 one needs activations within
/// 0..=128 (`Q8Kernel::activation_levels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Q8Kernel {
    /// AVX-512 VNNI `vpdpbusd`: 64 u8 × i8 products per instruction.
    Vnni,
    /// AVX-VNNI `vpdpbusd` on 256 bits: 32 products per instruction.
    AvxVnni,
    /// AVX2 `vpmaddubsw` + `vpmaddwd`: 32 products per pair of
    /// instructions, on 7-bit activations (their pairs of products would
    /// overflow i16 otherwise, as ONNX Runtime's do on AVX2 CPUs).
    Avx2,
    /// aarch64's dot product (`sdot`, Armv8.2's dot-product extension):
    /// 16 i8 × i8 products per instruction.
    Sdot,
    /// aarch64's 8-bit matrix multiply (`smmla`, the I8MM extension): a
    /// 2×8 by 8×2 product, 32 i8 × i8 products,
    /// per instruction.
    I8mm,
    /// Plain Rust, for other CPUs: far slower than f32.
    Portable,
}

impl Q8Kernel {
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
    /// 255 · 127 · 2 does not). 7-bit activations lose less than 7-bit
    /// weights would (docs/benchmarks.md, "Choices").
    pub fn activation_levels(self) -> i32 {
        match self {
            Q8Kernel::Avx2 => 127,
            Q8Kernel::Vnni
            | Q8Kernel::AvxVnni
            | Q8Kernel::Sdot
            | Q8Kernel::I8mm
            | Q8Kernel::Portable => 255,
        }
    }

    /// The best this CPU runs; `RECALL_Q8=avx2`, `sdot` or `portable` picks
    /// a lesser one (to compare). Checked once.
    pub fn get() -> Q8Kernel {
        static KERNEL: std::sync::OnceLock<Q8Kernel> = std::sync::OnceLock::new();
        *KERNEL.get_or_init(|| {
            use super::Q8Override;
            let (cpu, wanted) = (super::cpu(), super::overrides().q8);
            let below_vnni = matches!(wanted, Some(Q8Override::Avx2 | Q8Override::Portable));
            let below_i8mm = matches!(wanted, Some(Q8Override::Sdot | Q8Override::Portable));
            let portable = wanted == Some(Q8Override::Portable);
            if cpu.avx512_vnni && !below_vnni {
                Q8Kernel::Vnni
            } else if cpu.avx_vnni && !below_vnni {
                Q8Kernel::AvxVnni
            } else if cpu.avx2 && !portable {
                Q8Kernel::Avx2
            } else if cpu.i8mm && !below_i8mm {
                Q8Kernel::I8mm
            } else if cpu.dotprod && !portable {
                Q8Kernel::Sdot
            } else {
                Q8Kernel::Portable
            }
        })
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
