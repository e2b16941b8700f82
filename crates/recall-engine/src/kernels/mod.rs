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
            cpu.avx_vnni = cpu.avx2 && has!("avxvnni");
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
/// best, to compare (`crate::env` declares them). Read once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `RECALL_MATMUL`.
    pub matmul: Option<MatmulOverride>,
    /// `RECALL_Q8`.
    pub q8: Option<Q8Override>,
    /// `RECALL_BF16`.
    pub bf16: Option<Bf16Override>,
}

/// `RECALL_MATMUL`: which f32 kernel instead of the CPU's best.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulOverride {
    /// The AVX2 tile, not the AVX-512 one.
    Avx2,
    /// candle's matmul: none of recall's f32 tiles.
    Candle,
}

/// `RECALL_Q8`: which q8 kernel instead of the CPU's best.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Q8Override {
    /// Nothing above the AVX2 tile (no VNNI).
    Avx2,
    /// Nothing above the dot-product tile (no I8MM).
    Sdot,
    /// The plain Rust loop.
    Portable,
}

/// `RECALL_BF16`: how bf16 weights run instead of the CPU's best.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bf16Override {
    /// Widened to the f32 tiles, even on AVX512_BF16 CPUs.
    Widen,
}

/// `var`'s value among `choices`; an unknown one is an error naming them.
fn choice<T: Copy>(var: crate::env::Var, choices: &[(&str, T)]) -> Result<Option<T>, String> {
    let Some(value) = var.get() else {
        return Ok(None);
    };
    let value = value.to_string_lossy();
    match choices.iter().find(|(name, _)| *name == value) {
        Some(&(_, kernel)) => Ok(Some(kernel)),
        None => {
            let names: Vec<&str> = choices.iter().map(|&(name, _)| name).collect();
            Err(format!(
                "{}={value:?} is not a kernel recall has: use {} (or unset it for the CPU's best)",
                var.name,
                names.join(", ")
            ))
        }
    }
}

impl Overrides {
    /// Parses the variables: an unknown value is an error naming the
    /// accepted ones.
    fn from_env() -> Result<Overrides, String> {
        use crate::env;
        Ok(Overrides {
            matmul: choice(
                env::MATMUL,
                &[
                    ("avx2", MatmulOverride::Avx2),
                    ("candle", MatmulOverride::Candle),
                ],
            )?,
            q8: choice(
                env::Q8,
                &[
                    ("avx2", Q8Override::Avx2),
                    ("sdot", Q8Override::Sdot),
                    ("portable", Q8Override::Portable),
                ],
            )?,
            bf16: choice(env::BF16, &[("widen", Bf16Override::Widen)])?,
        })
    }
}

fn parsed_overrides() -> &'static Result<Overrides, String> {
    static OVERRIDES: OnceLock<Result<Overrides, String>> = OnceLock::new();
    OVERRIDES.get_or_init(Overrides::from_env)
}

/// The overrides of this process, read once. With a variable set to an
/// unknown value, none apply; loading a model reports it
/// ([`check_overrides`]), before any kernel runs.
pub fn overrides() -> Overrides {
    parsed_overrides().as_ref().copied().unwrap_or_default()
}

/// An error naming the override variable set to an unknown value, if any.
pub fn check_overrides() -> Result<(), String> {
    parsed_overrides()
        .as_ref()
        .map(|_| ())
        .map_err(Clone::clone)
}

/// The CPU kernel each dtype runs on this machine, for `--version`,
/// benchmarks and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelInfo {
    /// `None`: candle's matmul.
    pub f32: Option<matmul::PackedKernel>,
    /// `None`: candle's matmul on bf16-rounded weights.
    pub bf16: Option<bf16::Bf16Kernel>,
    pub q8: quant::Q8Kernel,
}

impl KernelInfo {
    /// This machine's, with the overrides applied.
    pub fn here() -> KernelInfo {
        KernelInfo {
            f32: matmul::PackedKernel::get(),
            bf16: bf16::Bf16Kernel::get(),
            q8: quant::Q8Kernel::get(),
        }
    }

    /// The dtype and its kernel: `f32`, `q8, Vnni kernel`, `bf16, AVX512_BF16
    /// tile kernel`.
    pub fn describe(self, dtype: crate::Dtype) -> String {
        match dtype {
            crate::Dtype::F32 => "f32".to_string(),
            crate::Dtype::Q8 => format!("q8, {:?} kernel", self.q8),
            crate::Dtype::Bf16 => match self.bf16 {
                Some(kernel) => format!("bf16, {} kernel", kernel.describe()),
                None => "bf16, candle's matmul on bf16-rounded weights".to_string(),
            },
        }
    }
}

impl std::fmt::Display for KernelInfo {
    /// `f32 Avx512 packed tile, bf16 AVX512_BF16 tile, q8 Vnni`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let candle = || "candle's matmul".to_string();
        write!(
            f,
            "f32 {}, bf16 {}, q8 {:?}",
            self.f32
                .map_or_else(candle, |k| format!("{k:?} packed tile")),
            self.bf16.map_or_else(candle, |k| k.describe()),
            self.q8
        )
    }
}
