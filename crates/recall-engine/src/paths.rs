//! Where the user's files are: `$HOME` and recall's cache (converted
//! weights, pack files, q8 calibrations).

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::env;

/// `$HOME`, when set and not empty.
pub fn home_dir() -> Option<PathBuf> {
    env::HOME.get().map(PathBuf::from)
}

/// recall's own cache (converted weights): `$RECALL_CACHE_DIR`, `$XDG_CACHE_HOME/recall` or `~/.cache/recall`.
pub fn recall_cache_dir() -> Result<PathBuf> {
    if let Some(dir) = env::CACHE_DIR.get() {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = env::XDG_CACHE_HOME.get() {
        return Ok(PathBuf::from(dir).join("recall"));
    }
    Ok(home_dir()
        .context("cannot find a cache directory: set RECALL_CACHE_DIR or HOME")?
        .join(".cache")
        .join("recall"))
}
