//! `--dtype`: how the encoder's linear layers hold their weights.

use anyhow::Result;

/// How the encoder's linear layers hold their weights (`--dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dtype {
    /// As the checkpoint has them: the reference outputs.
    #[default]
    F32,
    /// int8, quantised at load (`quant`): about 4× less weight memory
    /// and several times the speed on CPUs with AVX-512 VNNI, at a small
    /// cost in fidelity. CPU only.
    Q8,
    /// bfloat16, rounded at load (`bf16`): half the weight memory, sums in
    /// f32; twice f32's arithmetic on CPUs with AVX512_BF16. CPU only.
    Bf16,
}

impl Dtype {
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Q8 => "q8",
            Dtype::Bf16 => "bf16",
        }
    }
}

impl std::str::FromStr for Dtype {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(Dtype::F32),
            "q8" | "int8" => Ok(Dtype::Q8),
            "bf16" | "bfloat16" => Ok(Dtype::Bf16),
            _ => anyhow::bail!("unknown dtype {s:?}: expected f32, bf16 or q8"),
        }
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
