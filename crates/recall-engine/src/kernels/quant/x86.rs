//! The x86-64 kernels: the tiles on AVX-512 VNNI, AVX-VNNI and AVX2, the
//! f32 outlier channels' loop on AVX2 (`add_avx2`), and the row loops of
//! `RowLoops` on AVX-512F and AVX2 (`avx512`, `avx2`).

use super::{GROUP, PANEL, TILE_ROWS, Tile};
use crate::kernels::matmul::Prefetch;

/// `F32Channels::add` with AVX2, a strip of 16 columns at a time: its
/// channels' weights loaded once for the tile's rows, 6 × 2 sums in
/// registers, rather than a row at a time reading the panel's weights
/// again for each row (docs/benchmarks.md, "Choices").
///
/// # Safety
/// The CPU has AVX2; `out` points at `rows` rows of PANEL initialised
/// floats, `stride` apart, that nothing else reads or writes meanwhile.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn add_avx2(
    xs: &[f32],
    weights: &[f32],
    out: *mut f32,
    rows: usize,
    stride: usize,
) {
    use std::arch::x86_64::*;
    for s in (0..PANEL).step_by(16) {
        let mut acc: [[__m256; 2]; TILE_ROWS] = std::array::from_fn(|r| {
            std::array::from_fn(|h| match r < rows {
                // SAFETY: row r < rows, columns s + 8h.. + 8 <= PANEL: the
                // caller's floats.
                true => unsafe { _mm256_loadu_ps(out.add(r * stride + s + 8 * h)) },
                false => _mm256_setzero_ps(),
            })
        });
        for (x, w) in xs.chunks_exact(TILE_ROWS).zip(weights.chunks_exact(PANEL)) {
            // SAFETY: `w` holds PANEL floats, and s + 16 <= PANEL.
            let w = unsafe {
                [
                    _mm256_loadu_ps(w.as_ptr().add(s)),
                    _mm256_loadu_ps(w.as_ptr().add(s + 8)),
                ]
            };
            for (acc, &x) in acc.iter_mut().zip(x) {
                let v = _mm256_set1_ps(x);
                for (acc, &w) in acc.iter_mut().zip(&w) {
                    *acc = _mm256_add_ps(*acc, _mm256_mul_ps(v, w));
                }
            }
        }
        for (r, acc) in acc.iter().enumerate().take(rows) {
            for (h, &acc) in acc.iter().enumerate() {
                // SAFETY: as the loads from `out` above.
                unsafe { _mm256_storeu_ps(out.add(r * stride + s + 8 * h), acc) };
            }
        }
    }
}

/// The AVX-512 versions of the portable `RowLoops`: the same floats in the same
/// order, so the same bytes.
pub(super) mod avx512 {
    use std::arch::x86_64::*;

    /// `(min(0, row), max(0, row))`.
    #[target_feature(enable = "avx512f")]
    pub(in crate::kernels::quant) fn range(row: &[f32]) -> (f32, f32) {
        let (mut lo, mut hi) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let chunks = row.chunks_exact(16);
        let tail = chunks.remainder();
        for c in chunks {
            // SAFETY: `c` is 16 floats.
            let v = unsafe { _mm512_loadu_ps(c.as_ptr()) };
            // A NaN gives back the second operand: skipped, as f32::min does.
            lo = _mm512_min_ps(v, lo);
            hi = _mm512_max_ps(v, hi);
        }
        let (lo, hi) = (_mm512_reduce_min_ps(lo), _mm512_reduce_max_ps(hi));
        tail.iter()
            .fold((lo, hi), |(lo, hi), &v| (lo.min(v), hi.max(v)))
    }

    /// `q = clamp(v · inv + shift, 0, 255)` truncated, as the portable loop
    /// (over the positions both `q` and `row` have, as its `zip`).
    #[target_feature(enable = "avx512f")]
    pub(in crate::kernels::quant) fn quantize(q: &mut [u8], row: &[f32], inv: f32, shift: f32) {
        let (inv_v, shift_v) = (_mm512_set1_ps(inv), _mm512_set1_ps(shift));
        let (zero, top) = (_mm512_setzero_ps(), _mm512_set1_ps(255.0));
        let lanes = row.len().min(q.len()) / 16 * 16;
        for i in (0..lanes).step_by(16) {
            // SAFETY: i + 16 <= lanes <= row.len().
            let v = unsafe { _mm512_loadu_ps(row.as_ptr().add(i)) };
            let v = _mm512_add_ps(_mm512_mul_ps(v, inv_v), shift_v);
            // max(NaN, 0) is 0, as `clamp` then `as u8` make it.
            let v = _mm512_min_ps(_mm512_max_ps(v, zero), top);
            let bytes = _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(v));
            // SAFETY: i + 16 <= lanes <= q.len(); an unaligned store.
            unsafe { _mm_storeu_si128(q.as_mut_ptr().add(i) as *mut __m128i, bytes) };
        }
        for (q, &v) in q[lanes..].iter_mut().zip(&row[lanes..]) {
            *q = (v * inv + shift).clamp(0.0, 255.0) as u8;
        }
    }
}

/// The AVX2 versions of the portable `RowLoops`, as `avx512`'s.
pub(super) mod avx2 {
    use std::arch::x86_64::*;

    /// `(min(0, row), max(0, row))`.
    #[target_feature(enable = "avx2")]
    pub(in crate::kernels::quant) fn range(row: &[f32]) -> (f32, f32) {
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let chunks = row.chunks_exact(8);
        let tail = chunks.remainder();
        for c in chunks {
            // SAFETY: `c` is 8 floats.
            let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
            // A NaN gives back the second operand: skipped, as f32::min does.
            lo = _mm256_min_ps(v, lo);
            hi = _mm256_max_ps(v, hi);
        }
        let (mut l, mut h) = ([0f32; 8], [0f32; 8]);
        // SAFETY: `l` and `h` are 8 floats each.
        unsafe {
            _mm256_storeu_ps(l.as_mut_ptr(), lo);
            _mm256_storeu_ps(h.as_mut_ptr(), hi);
        }
        l.iter()
            .zip(&h)
            .chain(tail.iter().zip(tail))
            .fold((0f32, 0f32), |(lo, hi), (&l, &h)| (lo.min(l), hi.max(h)))
    }

    /// `q = clamp(v · inv + shift, 0, 255)` truncated, as the portable loop
    /// (over the positions both `q` and `row` have, as its `zip`).
    #[target_feature(enable = "avx2")]
    pub(in crate::kernels::quant) fn quantize(q: &mut [u8], row: &[f32], inv: f32, shift: f32) {
        let (inv_v, shift_v) = (_mm256_set1_ps(inv), _mm256_set1_ps(shift));
        let (zero, top) = (_mm256_setzero_ps(), _mm256_set1_ps(255.0));
        // Packing goes by 128-bit lanes; this puts the 32 bytes back in order.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let lanes = row.len().min(q.len()) / 32 * 32;
        for i in (0..lanes).step_by(32) {
            let ints: [__m256i; 4] = std::array::from_fn(|j| {
                // SAFETY: i + 8j + 8 <= i + 32 <= lanes <= row.len().
                let v = unsafe { _mm256_loadu_ps(row.as_ptr().add(i + 8 * j)) };
                let v = _mm256_add_ps(_mm256_mul_ps(v, inv_v), shift_v);
                // max(NaN, 0) is 0, as `clamp` then `as u8` make it.
                _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(v, zero), top))
            });
            let words = (
                _mm256_packus_epi32(ints[0], ints[1]),
                _mm256_packus_epi32(ints[2], ints[3]),
            );
            let bytes = _mm256_packus_epi16(words.0, words.1);
            let bytes = _mm256_permutevar8x32_epi32(bytes, order);
            // SAFETY: i + 32 <= lanes <= q.len(); an unaligned store.
            unsafe { _mm256_storeu_si256(q.as_mut_ptr().add(i) as *mut __m256i, bytes) };
        }
        for (q, &v) in q[lanes..].iter_mut().zip(&row[lanes..]) {
            *q = (v * inv + shift).clamp(0.0, 255.0) as u8;
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
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name(tile: &Tile, out: *mut f32, stride: usize) {
            use std::arch::x86_64::*;
            const COLS: usize = 16;
            let kp = tile.kp;
            assert!(tile.x.len() >= TILE_ROWS * kp && tile.panel.len() >= kp * PANEL);
            assert!(tile.w_sums.len() >= PANEL && tile.w_scales.len() >= PANEL);
            let groups = kp / GROUP;
            let ahead = Prefetch::new(tile.ahead, groups * PANEL / COLS);
            for c0 in (0..PANEL).step_by(COLS) {
                // SAFETY: reads within the lengths asserted above: 4 bytes
                // of `tile.x` at r·kp + 4g (r < TILE_ROWS, 4g < kp); `$dot`
                // 32 bytes of `tile.panel` at 4·c0 + 32h + g·PANEL·GROUP
                // (4·c0 + 32h + 32 <= PANEL·GROUP, g < kp / GROUP), its only
                // memory access; 8 sums and scales from col + 8 <= PANEL.
                // Writes: row r < tile.rows, columns col..col + 8 <= PANEL at
                // `out`, as the caller promised. The CPU features, as the
                // caller promised.
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
    /// activations stay within 0..=128 (`Q8Kernel::activation_levels`):
    /// 128 · 127 · 2 < 2¹⁵.
    ///
    /// # Safety
    /// The CPU has AVX2; `out` as for `tile_portable`: `tile.rows` rows of
    /// PANEL floats, `stride` apart, this call's alone.
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
    /// it without AVX-512 (docs/q8.md names them): exact on 8-bit weights,
    /// as `tile_vnni`.
    ///
    /// # Safety
    /// The CPU has AVX2 and AVX-VNNI; `out` as for `tile_portable`:
    /// `tile.rows` rows of PANEL floats, `stride` apart, this call's alone.
    tile_avx_vnni,
    "avx2,avxvnni",
    |acc, x, w| _mm256_dpbusd_avx_epi32(acc, x, _mm256_loadu_si256(w))
);

#[cfg(test)]
tile_256!(
    /// The same tile with AVX-512 VNNI's encoding of that instruction, on
    /// 256 bits: the CPUs that test have AVX-512 rather than AVX-VNNI.
    ///
    /// # Safety
    /// The CPU has AVX2, AVX-512 VNNI and AVX-512VL; `out` as for
    /// `tile_portable`.
    tile_avx_vnni_as_avx512,
    "avx2,avx512vnni,avx512vl",
    |acc, x, w| _mm256_dpbusd_epi32(acc, x, _mm256_loadu_si256(w))
);

/// One tile with `vpdpbusd` (u8 × i8, four products summed into each i32
/// lane, exactly: no saturation), the scales applied in registers.
///
/// # Safety
/// The CPU has AVX-512F and AVX-512 VNNI; `out` as for `tile_portable`:
/// `tile.rows` rows of PANEL floats, `stride` apart, this call's alone.
#[target_feature(enable = "avx512f,avx512vnni")]
pub(super) unsafe fn tile_vnni(tile: &Tile, out: *mut f32, stride: usize) {
    use std::arch::x86_64::*;
    const REGS: usize = PANEL / 16;
    let kp = tile.kp;
    assert!(tile.x.len() >= TILE_ROWS * kp && tile.panel.len() >= kp * PANEL);
    assert!(tile.w_sums.len() >= PANEL && tile.w_scales.len() >= PANEL);
    // SAFETY: reads within the lengths asserted above: 4 bytes of `tile.x`
    // at r·kp + 4g (r < TILE_ROWS, 4g < kp); 64 bytes of `tile.panel` at
    // g·PANEL·GROUP + 64c (64c + 64 <= PANEL·GROUP, g < kp / GROUP); 16
    // sums and scales from 16c + 16 <= PANEL. Writes: row r < tile.rows,
    // columns 16c..16c + 16 <= PANEL at `out`, as the caller promised.
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
        // Two loops: working out each step's prefetches, even none, showed
        // in profiles of short inputs.
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
