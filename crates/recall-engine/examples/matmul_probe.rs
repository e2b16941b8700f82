//! recall's packed f32 kernel (`PackedLinear`, its AVX-512 or AVX2 tile:
//! `RECALL_MATMUL=avx2` forces the latter) and its int8 kernel (`quant`)
//! beside candle's, on weights that do not fit in cache:
//! `cargo run --release -p recall-engine --example matmul_probe -- M K N [MATRICES]`.
//! Prints the best of 5 passes over MATRICES (default 12) distinct `[N, K]`
//! weight matrices, for each side; REPS=N makes each pass go over them N
//! times (for matrices small enough to stay in cache). Thread count:
//! RAYON_NUM_THREADS.

use std::time::Instant;

use candle_core::{Device, Tensor};

fn best_of_5(mut pass: impl FnMut()) -> f64 {
    (0..5)
        .map(|_| {
            let t = Instant::now();
            pass();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("usage: matmul_probe M K N [MATRICES]: {e}"))?;
    let [m, k, n] = args[..3] else {
        anyhow::bail!("usage: matmul_probe M K N [MATRICES]");
    };
    let mats = args.get(3).copied().unwrap_or(12);
    let kernel = recall_engine::kernels::matmul::PackedKernel::get()
        .ok_or_else(|| anyhow::anyhow!("this CPU has no packed tile (it lacks AVX2/FMA)"))?;
    let x: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
    let ws: Vec<Vec<f32>> = (0..mats)
        .map(|j| (0..n * k).map(|i| ((i + j) % 5) as f32 * 0.1).collect())
        .collect();
    let xt = Tensor::from_slice(&x, (m, k), &Device::Cpu)?;
    let wts = ws
        .iter()
        .map(|w| Tensor::from_slice(w, (n, k), &Device::Cpu))
        .collect::<Result<Vec<_>, _>>()?;
    let reps: usize = std::env::var("REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let packed: Vec<_> = ws
        .iter()
        .map(|w| recall_engine::kernels::matmul::PackedLinear::<f32>::pack(w, n, k))
        .collect();
    let f32_time = best_of_5(|| {
        for w in packed.iter().cycle().take(mats * reps) {
            std::hint::black_box(w.matmul_t(&x, m));
        }
    });
    let quantized: Vec<_> = ws
        .iter()
        .map(|w| recall_engine::kernels::quant::QLinear::quantize(w, n, k))
        .collect();
    let q8 = best_of_5(|| {
        for w in quantized.iter().cycle().take(mats * reps) {
            std::hint::black_box(w.matmul_t(&x, m));
        }
    });
    let candle = best_of_5(|| {
        for w in wts.iter().cycle().take(mats * reps) {
            std::hint::black_box(xt.matmul(&w.t().unwrap()).unwrap());
        }
    });
    let gflops = |s: f64| (2 * m * n * k * mats * reps) as f64 / s / 1e9;
    println!(
        "{m}x{k}·{n}ᵀ: recall {kernel:?} {:.1} ms ({:.0} GFLOP/s), q8 {:?} {:.1} ms ({:.0} GOP/s), candle {:.1} ms ({:.0} GFLOP/s): {:.2}x",
        f32_time * 1e3,
        gflops(f32_time),
        recall_engine::kernels::quant::Q8Kernel::get(),
        q8 * 1e3,
        gflops(q8),
        candle * 1e3,
        gflops(candle),
        candle / f32_time
    );
    Ok(())
}
