//! Where the user's files are, for every layer that needs it.

pub use recall_engine::paths::home_dir;

/// The first file named `name` in a directory of `PATH`.
pub fn on_path(name: &str) -> Option<std::path::PathBuf> {
    crate::env::path_dirs()
        .into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
