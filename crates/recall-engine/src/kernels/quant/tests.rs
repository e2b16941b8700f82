//! The q8 kernels' tests: every tile and row loop this CPU runs gives the
//! portable loops' very integers and bytes, and the products stay close to
//! f32's (with and without outlier channels).

#[cfg(target_arch = "aarch64")]
use super::aarch64::{tile_sdot, tile_smmla};
use super::activations::RowLoops;
use super::outliers::cleared;
use super::pack::{WEIGHT_LIMIT, quantize_symmetric, symmetric_with};
#[cfg(target_arch = "x86_64")]
use super::x86::tile_avx_vnni_as_avx512;
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
    let levels = Q8Kernel::get().activation_levels();
    let rows = QuantRows::with(x, m, k, q.kp, RowLoops::of(Q8Kernel::Portable), levels, &[]);
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
    let portable = RowLoops::of(Q8Kernel::Portable);
    for levels in [255, 127] {
        let a = QuantRows::with(&x, m, k, kp, portable, levels, &[]);
        assert!(a.data[..k].iter().all(|&q| q as i32 == levels));
        assert!(a.data.iter().all(|&q| q as i32 <= levels + 1));
        for (kernel, run) in [
            (Q8Kernel::Avx2, avx2),
            (Q8Kernel::AvxVnni, avx2),
            (Q8Kernel::Vnni, vnni),
            // The NEON loops: every aarch64 CPU runs them.
            (Q8Kernel::Sdot, cfg!(target_arch = "aarch64")),
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
        // SAFETY: `p` is TILE_ROWS ≥ tile.rows rows of PANEL floats.
        unsafe { tile_portable(&tile, p.as_mut_ptr(), PANEL) };
        assert!(
            p[5 * PANEL..].iter().all(|&y| y == -1.0),
            "a padding row was written"
        );
        #[cfg(target_arch = "x86_64")]
        for (name, kernel, run, tile_of) in [
            (
                "AVX2",
                Q8Kernel::Avx2,
                avx2,
                tile_avx2 as unsafe fn(&Tile, *mut f32, usize),
            ),
            ("AVX-512 VNNI", Q8Kernel::Vnni, vnni, tile_vnni),
            ("AVX-VNNI", Q8Kernel::AvxVnni, avx_vnni, tile_avx_vnni),
            (
                "AVX-VNNI's tile as AVX-512 VNNI on 256 bits",
                Q8Kernel::AvxVnni,
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
            // SAFETY: `run` is this tile's features, detected above; `v`
            // as `p` for the portable tile.
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
            // SAFETY: the dot product was detected just above; `v` as `p`
            // for the portable tile.
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
            // SAFETY: I8MM was detected just above; `v` as `p` for the
            // portable tile.
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
    let mut kernels: Vec<Q8Kernel> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            kernels.push(Q8Kernel::Vnni);
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            kernels.extend([Q8Kernel::Avx2, Q8Kernel::AvxVnni]);
        }
    }
    // The NEON loops: every aarch64 CPU runs them.
    #[cfg(target_arch = "aarch64")]
    kernels.extend([Q8Kernel::Sdot]);
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
                let portable = symmetric_with(&mut a, &row, RowLoops::of(Q8Kernel::Portable));
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
