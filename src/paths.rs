//! Where the user's files are, for every layer that needs it.

pub use recall_engine::paths::home_dir;
