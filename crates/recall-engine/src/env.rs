//! The environment variables the engine reads, each declared once with what
//! it sets, and the only place that reads them.
//!
//! An application that documents its environment lists [`VARS`] beside its
//! own (the `recall` binary's `--help` and README table are generated from
//! both; a test there fails when a variable declared here is missing).

use std::ffi::OsString;

/// One environment variable: its name and what it sets, in one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Var {
    pub name: &'static str,
    pub doc: &'static str,
}

impl Var {
    /// Its value, when set and not empty: an empty variable is unset, as the
    /// shells' `VAR= command` means it.
    pub fn get(self) -> Option<OsString> {
        std::env::var_os(self.name).filter(|v| !v.is_empty())
    }

    /// Its value as text, when set, not blank and valid Unicode.
    pub fn text(self) -> Option<String> {
        named(self.name)
    }
}

/// A variable named at run time (a provider's `api_key_env` in a
/// configuration file), as [`Var::text`] reads a declared one.
pub fn named(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// recall's cache directory.
pub const CACHE_DIR: Var = Var {
    name: "RECALL_CACHE_DIR",
    doc: "recall's own cache: converted and packed weights, q8 calibrations (default `$XDG_CACHE_HOME/recall`, else `~/.cache/recall`)",
};
/// Turns the packed-weights cache off.
pub const PACK_CACHE: Var = Var {
    name: "RECALL_PACK_CACHE",
    doc: "`off`: pack the weights at every start instead of keeping them packed in the cache",
};
/// Forces a lesser f32 kernel.
pub const MATMUL: Var = Var {
    name: "RECALL_MATMUL",
    doc: "`avx2` or `candle`: force a lesser f32 kernel than the CPU's best, to compare",
};
/// Forces a lesser q8 kernel.
pub const Q8: Var = Var {
    name: "RECALL_Q8",
    doc: "`avx2`, `sdot` or `portable`: force a lesser q8 kernel, to compare",
};
/// Forces bf16 to widen to the f32 kernels.
pub const BF16: Var = Var {
    name: "RECALL_BF16",
    doc: "`widen`: run bf16 on the f32 kernels even where the CPU has AVX512_BF16, to compare",
};
/// The platform's cache directory.
pub const XDG_CACHE_HOME: Var = Var {
    name: "XDG_CACHE_HOME",
    doc: "where caches go (default `~/.cache`)",
};
/// The user's home directory.
pub const HOME: Var = Var {
    name: "HOME",
    doc: "the user's home directory",
};

/// Every variable the engine reads.
pub const VARS: &[Var] = &[
    CACHE_DIR,
    PACK_CACHE,
    MATMUL,
    Q8,
    BF16,
    XDG_CACHE_HOME,
    HOME,
];
