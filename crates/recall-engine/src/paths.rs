//! Where the user's files are: `$HOME` and recall's cache (converted
//! weights, pack files, q8 calibrations).

use std::path::PathBuf;

use anyhow::{Context, Result};

/// `$HOME`, when set and not empty.
pub fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// recall's own cache (converted weights): `$RECALL_CACHE_DIR`, `$XDG_CACHE_HOME/recall` or `~/.cache/recall`.
pub fn recall_cache_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("RECALL_CACHE_DIR").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir).join("recall"));
    }
    Ok(home_dir()
        .context("cannot find a cache directory: set RECALL_CACHE_DIR or HOME")?
        .join(".cache")
        .join("recall"))
}
