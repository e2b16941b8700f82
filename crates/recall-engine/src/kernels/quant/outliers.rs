//! Outlier channels: the few input positions of a layer far larger than
//! the rest, found on calibration texts (`outlier_channels`), whose
//! products are summed in f32 beside the int8 product (`F32Channels`), and
//! the rows with them zeroed for the int8 side (`cleared`).

use super::{PANEL, TILE_ROWS};
use crate::packcache::Slab;

/// A layer's input positions whose products are summed in f32 beside the
/// int8 ones, and their weights. A channel far larger than the rest would
/// set every token's int8 scale and flatten the others into a few levels;
/// left out, the rest keep their 8 bits, and its own products are exact.
pub(super) struct F32Channels {
    /// Input positions, ascending.
    pub(super) channels: Vec<usize>,
    /// `[panels][channels][PANEL]`: each channel's weight for the output
    /// columns of each panel (zero past `n`), so that a tile reads its
    /// panel's in one run: as `[channels][n]`, rows `n` floats apart meet in
    /// the same L1 sets.
    pub(super) weights: Slab<f32>,
}

/// The rows of `x` (`k` wide) with positions `channels` zeroed, for the
/// int8 product (`x` itself without any).
pub(super) fn cleared<'x>(
    x: &'x [f32],
    k: usize,
    channels: &[usize],
) -> std::borrow::Cow<'x, [f32]> {
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
    pub(super) fn new(w: &[f32], n: usize, k: usize, channels: &[usize]) -> Self {
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
    pub(super) fn gather(&self, x: &[f32], m: usize, k: usize) -> Vec<f32> {
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
    /// `out` points at `rows` rows of PANEL initialised floats, `stride`
    /// apart, that nothing else reads or writes meanwhile; with `vector`,
    /// the CPU has AVX2.
    pub(super) unsafe fn add(
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
            // SAFETY: the caller vouches for AVX2 with `vector`, and for
            // `out` as `add_avx2` needs it (the same rows).
            return unsafe { super::x86::add_avx2(xs, weights, out, rows, stride) };
        }
        let _ = vector;
        for r in 0..rows {
            for j in 0..PANEL {
                let products = xs[r..]
                    .iter()
                    .step_by(TILE_ROWS)
                    .zip(weights[j..].iter().step_by(PANEL));
                // SAFETY: r < rows and j < PANEL: a float of the caller's
                // rows at `out`, initialised and this call's alone.
                unsafe {
                    let o = out.add(r * stride + j);
                    *o = products.fold(*o, |o, (&v, &w)| o + v * w);
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
/// Chosen on the check's own texts (`crate::calibrate::TEXTS`) as the best
/// lowest cosine to f32 on the 7-bit activations' path, the worse of the
/// two (docs/benchmarks.md, "Choices"); scored on other texts only
/// (`tests/it/q8_outliers.rs`).
const OUTLIER_RATIO: f32 = 3.0;

/// The most channels a layer may keep in f32 is at least this, however
/// narrow: outlier dimensions come a handful to a model, whatever its width
/// (BERT's and RoBERTa's reported ones: two to a few), so a 32-wide layer
/// needs room for them too. Layers of 256 or more (MiniLM's, BGE-M3's)
/// are held by `k / 32` instead, so this changes nothing there.
const MIN_OUTLIER_LIMIT: usize = 8;
