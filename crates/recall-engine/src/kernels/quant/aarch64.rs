//! The aarch64 kernels: the tiles on the Armv8.2 dot product (`sdot`) and
//! on I8MM (`smmla`), and the row loops of `RowLoops` on NEON (`neon`).
//!
//! NEON is in every aarch64 target's baseline (Rust builds the whole
//! binary to use it), so a NEON-only function's feature needs no check.

use super::activations::pair_row_bytes;
use super::{GROUP, PANEL, TILE_ROWS, Tile};
use crate::kernels::matmul::Prefetch;

/// The NEON versions of the portable `RowLoops` (every aarch64 CPU has
/// NEON), as `avx512`'s: the same floats in the same order, so the same
/// bytes. `fminnm`/`fmaxnm`, not `fmin`/`fmax`, which would keep a NaN;
/// a multiply then an add, not `fmla`, which would round once.
pub(super) mod neon {
    use std::arch::aarch64::*;

    /// `(min(0, row), max(0, row))`.
    #[target_feature(enable = "neon")]
    pub(in crate::kernels::quant) fn range(row: &[f32]) -> (f32, f32) {
        let (mut lo, mut hi) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
        let chunks = row.chunks_exact(4);
        let tail = chunks.remainder();
        for c in chunks {
            // SAFETY: `c` is 4 floats.
            let v = unsafe { vld1q_f32(c.as_ptr()) };
            lo = vminnmq_f32(lo, v);
            hi = vmaxnmq_f32(hi, v);
        }
        let (lo, hi) = (vminnmvq_f32(lo), vmaxnmvq_f32(hi));
        tail.iter()
            .fold((lo, hi), |(lo, hi), &v| (lo.min(v), hi.max(v)))
    }

    /// `q = clamp(v · inv + shift, 0, 255)` truncated, as the portable loop
    /// (over the positions both `q` and `row` have, as its `zip`).
    #[target_feature(enable = "neon")]
    pub(in crate::kernels::quant) fn quantize(q: &mut [u8], row: &[f32], inv: f32, shift: f32) {
        let (inv_v, shift_v) = (vdupq_n_f32(inv), vdupq_n_f32(shift));
        let (zero, top) = (vdupq_n_f32(0.0), vdupq_n_f32(255.0));
        let lanes = row.len().min(q.len()) / 8 * 8;
        for i in (0..lanes).step_by(8) {
            let ints: [uint32x4_t; 2] = std::array::from_fn(|j| {
                // SAFETY: i + 4j + 4 <= i + 8 <= lanes <= row.len().
                let v = unsafe { vld1q_f32(row.as_ptr().add(i + 4 * j)) };
                let v = vaddq_f32(vmulq_f32(v, inv_v), shift_v);
                // maxnm(NaN, 0) is 0, as `clamp` then `as u8` make it.
                vcvtq_u32_f32(vminnmq_f32(vmaxnmq_f32(v, zero), top))
            });
            let words = vcombine_u16(vmovn_u32(ints[0]), vmovn_u32(ints[1]));
            // SAFETY: i + 8 <= lanes <= q.len().
            unsafe { vst1_u8(q.as_mut_ptr().add(i), vmovn_u16(words)) };
        }
        for (q, &v) in q[lanes..].iter_mut().zip(&row[lanes..]) {
            *q = (v * inv + shift).clamp(0.0, 255.0) as u8;
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
/// The CPU has the dot product; `out` as for `tile_portable`: `tile.rows`
/// rows of PANEL floats, `stride` apart, this call's alone. (`tile.x`
/// holds `q - 128`, or the integers are wrong: not unsafe.)
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn tile_sdot(tile: &Tile, out: *mut f32, stride: usize) {
    use std::arch::aarch64::*;
    const COLS: usize = 16;
    const REGS: usize = COLS / 4;
    let kp = tile.kp;
    assert!(tile.x.len() >= TILE_ROWS * kp && tile.panel.len() >= kp * PANEL);
    assert!(tile.w_sums.len() >= PANEL && tile.w_scales.len() >= PANEL);
    let groups = kp / GROUP;
    let ahead = Prefetch::new(tile.ahead, groups * PANEL / COLS);
    for c0 in (0..PANEL).step_by(COLS) {
        // SAFETY: reads within the lengths asserted above: 4 bytes of
        // `tile.x` at r·kp + 4g (r < TILE_ROWS, 4g < kp), unaligned; 16
        // bytes of `tile.panel` at 4·c0 + 16h + g·PANEL·GROUP (4·c0 + 16h +
        // 16 <= PANEL·GROUP, g < kp / GROUP); `signed_outputs` 4 sums and
        // scales from col + 4 <= PANEL. Writes: row r < tile.rows, columns
        // col..col + 4 <= PANEL at `out`, as the caller promised.
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
                    // Read unaligned: `vld1q_dup_s32` wants an aligned i32
                    // (LLVM makes this the same `ld1r`).
                    let four = (x.add(r * kp + g * GROUP) as *const i32).read_unaligned();
                    let xv = vreinterpretq_s8_s32(vdupq_n_s32(four));
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
/// The CPU has I8MM; `out` as for `tile_portable`: `tile.rows` rows of
/// PANEL floats, `stride` apart, this call's alone. (`tile.x` holds
/// `q - 128` in pairs of rows, `pair_row_bytes` a row, or the integers are
/// wrong: not unsafe.)
#[target_feature(enable = "neon,i8mm")]
pub(super) unsafe fn tile_smmla(tile: &Tile, out: *mut f32, stride: usize) {
    use std::arch::aarch64::*;
    const COLS: usize = 8;
    const PAIRS: usize = TILE_ROWS / 2;
    let kp = tile.kp;
    let row_bytes = pair_row_bytes(kp);
    assert!(tile.x.len() >= TILE_ROWS * row_bytes && tile.panel.len() >= kp * PANEL);
    assert!(tile.w_sums.len() >= PANEL && tile.w_scales.len() >= PANEL);
    let groups = kp / GROUP;
    let octets = row_bytes / 8;
    debug_assert!(kp.is_multiple_of(GROUP), "kp {kp} is a multiple of GROUP");
    let ahead = Prefetch::new(tile.ahead, octets * PANEL / COLS);
    for c0 in (0..PANEL).step_by(COLS) {
        // SAFETY: reads within the lengths asserted above: 16 bytes of
        // `tile.panel` at 4·c0 + 2h·PANEL·GROUP + {0, 16}, and with `paired`
        // (group 2h + 1 < kp / GROUP) + PANEL·GROUP (4·c0 + 32 <=
        // PANEL·GROUP); 16 bytes of `tile.x` at 2p·row_bytes + 16h (p <
        // TILE_ROWS / 2, h < octets = row_bytes / 8); `signed_outputs` 4
        // sums and scales from col + 4 <= PANEL. Writes: row r < tile.rows,
        // columns col..col + 4 <= PANEL at `out`, as the caller promised.
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
///
/// # Safety
/// `tile.w_sums` and `tile.w_scales` hold at least `col + 4` values.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn signed_outputs(
    tile: &Tile,
    r: usize,
    col: usize,
    sums: std::arch::aarch64::int32x4_t,
) -> std::arch::aarch64::float32x4_t {
    use std::arch::aarch64::*;
    let shift = vdupq_n_s32(128 - tile.x_zeros[r]);
    // SAFETY: col + 4 values of each, as the caller promised.
    let (w_sums, w_scales) = unsafe {
        (
            vld1q_s32(tile.w_sums.as_ptr().add(col)),
            vld1q_f32(tile.w_scales.as_ptr().add(col)),
        )
    };
    let v = vmlaq_s32(sums, shift, w_sums);
    vmulq_f32(
        vcvtq_f32_s32(v),
        vmulq_f32(vdupq_n_f32(tile.x_scales[r]), w_scales),
    )
}

/// Defines `$name(acc, a, b)`: `acc` plus the products of the i8 × i8
/// instruction `$op` on `a` and `b` (in assembly: its intrinsic is not
/// stable Rust).
macro_rules! arm_int8 {
    ($(#[$doc:meta])* $name:ident, $features:literal, $op:literal) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        #[inline]
        fn $name(
            acc: std::arch::aarch64::int32x4_t,
            a: std::arch::aarch64::int8x16_t,
            b: std::arch::aarch64::int8x16_t,
        ) -> std::arch::aarch64::int32x4_t {
            let mut acc = acc;
            // SAFETY: one instruction on three vector registers, touching
            // no memory or flags; the CPU has its feature, or this function
            // (`target_feature` above) could not have been called.
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
