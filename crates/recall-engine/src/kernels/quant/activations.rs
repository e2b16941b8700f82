//! Activations quantised per call (`QuantRows`): asymmetric, one scale and
//! zero point per input row, laid out as each tile reads them; and the
//! loops that quantise a row, of weights or activations (`RowLoops`).

use rayon::prelude::*;

#[cfg(target_arch = "aarch64")]
use super::aarch64::neon;
#[cfg(target_arch = "x86_64")]
use super::x86::{avx2, avx512};
use super::{Q8Kernel, TILE_ROWS};

/// The two loops that quantise a row: its range, `(min(0, row), max(0,
/// row))`, and `q = clamp(v · inv + shift, 0, 255)` truncated. The vector
/// versions give the very bytes of the portable ones.
///
/// The vector loops need CPU features. `of`, the only maker of a RowLoops
/// (its fields are this file's), hands them out only where this CPU has
/// those, so `range` and `quantize` are safe to call.
#[derive(Clone, Copy)]
pub(super) struct RowLoops {
    range: unsafe fn(&[f32]) -> (f32, f32),
    quantize: unsafe fn(&mut [u8], &[f32], f32, f32),
}

impl RowLoops {
    /// `(min(0, row), max(0, row))`.
    #[inline]
    pub(super) fn range(self, row: &[f32]) -> (f32, f32) {
        // SAFETY: `of` made these loops, so this CPU has their features
        // (see `RowLoops`); they take a slice of any length.
        unsafe { (self.range)(row) }
    }

    /// `q = clamp(v · inv + shift, 0, 255)` truncated, over the positions
    /// both `q` and `row` have.
    #[inline]
    pub(super) fn quantize(self, q: &mut [u8], row: &[f32], inv: f32, shift: f32) {
        // SAFETY: as in `range`; they take slices of any lengths.
        unsafe { (self.quantize)(q, row, inv, shift) }
    }

    /// `range` of `row` without positions `without` (ascending), a run of
    /// the others at a time.
    fn range_without(self, row: &[f32], without: &[usize]) -> (f32, f32) {
        let (mut range, mut start) = ((0f32, 0f32), 0);
        for &end in without.iter().chain([&row.len()]) {
            if end > start {
                let (lo, hi) = self.range(&row[start..end]);
                range = (range.0.min(lo), range.1.max(hi));
            }
            start = end + 1;
        }
        range
    }

    /// The fastest loops for `kernel`'s CPUs, where this CPU has their
    /// features: on x86 as `cpu()` found them (every CPU `Q8Kernel::get`
    /// picks a vector kernel for has them), else the portable loops; on
    /// aarch64 NEON, which every aarch64 target has as its baseline (the
    /// whole binary is built to use it).
    pub(super) fn of(kernel: Q8Kernel) -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let cpu = crate::kernels::cpu();
            match kernel {
                Q8Kernel::Vnni if cpu.avx512f => {
                    return Self {
                        range: avx512::range,
                        quantize: avx512::quantize,
                    };
                }
                Q8Kernel::Avx2 | Q8Kernel::AvxVnni if cpu.avx2 => {
                    return Self {
                        range: avx2::range,
                        quantize: avx2::quantize,
                    };
                }
                // (Not on x86, or not on this CPU.)
                _ => {}
            }
        }
        #[cfg(target_arch = "aarch64")]
        if matches!(kernel, Q8Kernel::Sdot | Q8Kernel::I8mm) {
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

/// Activations quantised per row, padded to whole tiles (padding rows are
/// zero and dropped from the output) and to whole groups.
pub(super) struct QuantRows {
    /// `[mp, kp]`
    pub(super) data: Vec<u8>,
    pub(super) scales: Vec<f32>,
    pub(super) zeros: Vec<i32>,
}

impl QuantRows {
    /// `x`'s rows with positions `without` (ascending) as zeros: those are
    /// summed in f32 (`F32Channels`).
    pub(super) fn new(
        x: &[f32],
        m: usize,
        k: usize,
        kp: usize,
        kernel: Q8Kernel,
        without: &[usize],
    ) -> Self {
        let (loops, levels) = (RowLoops::of(kernel), kernel.activation_levels());
        Self::with(x, m, k, kp, loops, levels, without)
    }

    pub(super) fn with(
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
                loops.quantize(q, row, inv, shift);
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
    pub(super) fn make_signed(&mut self) {
        self.data.par_chunks_mut(1 << 16).for_each(|c| {
            c.iter_mut().for_each(|q| *q ^= 0x80);
        });
    }

    /// The rows as `tile_smmla` reads them: signed as by `make_signed`
    /// (in the same pass), each pair of rows as runs of 8 bytes, the first
    /// row's then the second's (an `smmla` operand each),
    /// `pair_row_bytes(kp)` bytes a row; past `kp`, zeros.
    pub(super) fn pair_signed(&mut self, kp: usize) {
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

/// Bytes a row of activations takes in `QuantRows::pair_signed`'s layout.
pub(super) fn pair_row_bytes(kp: usize) -> usize {
    kp.next_multiple_of(8)
}
