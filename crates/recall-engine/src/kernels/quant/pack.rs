//! Quantising a layer's weights (symmetric, one scale per output column)
//! and packing them for the tiles, or reading a packed layer back from a
//! pack file.

use anyhow::Result;
use rayon::prelude::*;

use super::activations::RowLoops;
use super::outliers::{F32Channels, cleared};
use super::{GROUP, PANEL, Q8Kernel, QLinear};
use crate::packcache::Reader;

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
        let kernel = Q8Kernel::get();
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
}

/// The largest quantised weight magnitude.
pub(super) const WEIGHT_LIMIT: i32 = 127;

/// `q = round(v / scale)` for a row of weights (or keys), the scale its
/// largest magnitude over WEIGHT_LIMIT: returns the scale and `Σ q`.
pub(super) fn quantize_symmetric(q: &mut [i8], row: &[f32], kernel: Q8Kernel) -> (f32, i32) {
    symmetric_with(q, row, RowLoops::of(kernel))
}

pub(super) fn symmetric_with(q: &mut [i8], row: &[f32], loops: RowLoops) -> (f32, i32) {
    let (lo, hi) = loops.range(row);
    let max = (-lo).max(hi);
    let scale = if max > 0.0 {
        max / WEIGHT_LIMIT as f32
    } else {
        1.0
    };
    // |v / scale| is at most the limit, so the asymmetric loop with zero
    // point 128 (rounding half up) gives q + 128, every byte in 1..=255: a
    // flipped top bit away.
    // SAFETY: `q`'s pointer and length, as u8: the same size and alignment
    // as i8, and every byte is both. `bytes` borrows from `q`, which is not
    // used again until `bytes` is done with.
    let bytes = unsafe { std::slice::from_raw_parts_mut(q.as_mut_ptr() as *mut u8, q.len()) };
    loops.quantize(bytes, row, 1.0 / scale, 128.5);
    bytes.iter_mut().for_each(|b| *b ^= 0x80);
    (scale, q.iter().map(|&v| v as i32).sum())
}
