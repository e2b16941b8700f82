//! The portable tile: plain Rust, for CPUs without any of the vector
//! tiles (and the reference the tests hold them to).

use super::{GROUP, PANEL, TILE_ROWS, Tile};

/// One tile in plain Rust, written to `out` (rows `stride` apart): the
/// same integers, and so the same floats, as `tile_vnni`.
///
/// # Safety
/// `out` points at `tile.rows` rows of PANEL floats, `stride` apart, valid
/// for writes, that nothing else reads or writes meanwhile.
pub(super) unsafe fn tile_portable(tile: &Tile, out: *mut f32, stride: usize) {
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
            // SAFETY: r < tile.rows and c < PANEL: one of the caller's
            // floats at `out`.
            unsafe { *out.add(r * stride + c) = tile.output(r, c, a) };
        }
    }
}
