//! recall's CPU kernels, and the one place that decides which of them run.
//!
//! - `matmul`: f32 weights packed in panels, `x · Wᵀ` by register tiles
//!   (AVX-512, AVX2 + FMA, NEON).
//! - `bf16`: bf16 weights, AVX512_BF16's dot product or the f32 tiles
//!   widening them as they load.
//! - `quant`: int8 weights and activations (AVX-512 VNNI, AVX-VNNI, AVX2,
//!   Arm's I8MM and dot product, a portable loop), with f32 outlier
//!   channels.
//! - `fused`: the element-wise work after a matmul (bias, GELU, residual,
//!   softmax), vectorised.
//!
//! What the CPU has is detected once ([`cpu`]); the variables that force a
//! lesser kernel, to compare, are read once ([`overrides`]). Each kernel
//! family's `get()` picks from these two and nothing else.

pub mod bf16;
pub(crate) mod fused;
pub mod matmul;
pub mod quant;

use std::sync::OnceLock;

/// The instruction-set extensions recall's kernels use, as this CPU has
/// them (all false off their architecture).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cpu {
    /// x86-64: AVX2 and FMA (the f32 tile, the vectorised GELU and exp).
    pub avx2_fma: bool,
    /// x86-64: AVX2 alone (q8's AVX2 tile).
    pub avx2: bool,
    /// x86-64: AVX-512 Foundation (the wide f32 tile).
    pub avx512f: bool,
    /// x86-64: AVX512_BF16's `vdpbf16ps`.
    pub avx512_bf16: bool,
    /// x86-64: AVX-512 VNNI's `vpdpbusd` on zmm.
    pub avx512_vnni: bool,
    /// x86-64: AVX-VNNI (the same on ymm, without AVX-512).
    pub avx_vnni: bool,
    /// aarch64: NEON (every aarch64 CPU).
    pub neon: bool,
    /// aarch64: the dot product (`sdot`).
    pub dotprod: bool,
    /// aarch64: the int8 matrix multiply (`smmla`).
    pub i8mm: bool,
}

/// This CPU, detected once.
pub fn cpu() -> &'static Cpu {
    static CPU: OnceLock<Cpu> = OnceLock::new();
    CPU.get_or_init(|| {
        #[cfg_attr(
            not(any(target_arch = "x86_64", target_arch = "aarch64")),
            allow(unused_mut)
        )]
        let mut cpu = Cpu::default();
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            cpu.avx2 = has!("avx2");
            cpu.avx2_fma = cpu.avx2 && has!("fma");
            cpu.avx512f = has!("avx512f");
            cpu.avx512_bf16 = cpu.avx512f && has!("avx512bf16");
            cpu.avx512_vnni = cpu.avx512f && has!("avx512vnni");
            cpu.avx_vnni = has!("avxvnni");
        }
        #[cfg(target_arch = "aarch64")]
        {
            use std::arch::is_aarch64_feature_detected as has;
            cpu.neon = has!("neon");
            cpu.dotprod = has!("dotprod");
            cpu.i8mm = has!("i8mm");
        }
        cpu
    })
}

/// The environment variables that force a lesser kernel than the CPU's
/// best, to compare (`recall --help` lists them). Read once, here only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `RECALL_MATMUL`: `avx2` (not AVX-512) or `candle` (none of recall's
    /// f32 tiles).
    pub matmul: Option<String>,
    /// `RECALL_Q8`: `avx2`, `sdot` or `portable`.
    pub q8: Option<String>,
    /// `RECALL_BF16`: `widen` (the f32 tiles on AVX512_BF16 CPUs).
    pub bf16: Option<String>,
}

/// The overrides of this process, read once.
pub fn overrides() -> &'static Overrides {
    static OVERRIDES: OnceLock<Overrides> = OnceLock::new();
    OVERRIDES.get_or_init(|| {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Overrides {
            matmul: var("RECALL_MATMUL"),
            q8: var("RECALL_Q8"),
            bf16: var("RECALL_BF16"),
        }
    })
}
