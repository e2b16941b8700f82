//! Where the user's files are, for every layer that needs it.

use std::path::PathBuf;

/// `$HOME`, when set and not empty.
pub fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}
