//! Where a model comes from: `--model DIR`, then `RECALL_MODEL`, then the
//! Hugging Face hub cache. Nothing here touches the network.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::env;
use crate::paths::home_dir;

/// The model recall uses when none is named.
pub const DEFAULT_REPO: &str = "BAAI/bge-m3";
/// The BAAI/bge-m3 revision recall is tested against.
pub const DEFAULT_REVISION: &str = "5617a9f61b028005a4858fdac845db406aefb181";

/// How the model directory was chosen, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Flag,
    Env,
    HubCache { revision: String },
}

#[derive(Debug, Clone)]
pub struct Located {
    pub dir: PathBuf,
    pub origin: Origin,
}

/// The Hugging Face hub cache: `$HF_HUB_CACHE`, `$HF_HOME/hub`, or `~/.cache/huggingface/hub`.
pub fn hub_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = env::HF_HUB_CACHE.get() {
        return Some(PathBuf::from(dir));
    }
    if let Some(home) = env::HF_HOME.get() {
        return Some(PathBuf::from(home).join("hub"));
    }
    home_dir().map(|h| h.join(".cache").join("huggingface").join("hub"))
}

pub use recall_engine::paths::recall_cache_dir;

/// Resolves the model directory: `flag`, then `RECALL_MODEL`, then BAAI/bge-m3 in the hub cache.
pub fn locate(flag: Option<&Path>) -> Result<Located> {
    if let Some(dir) = flag {
        return checked(dir, Origin::Flag, "--model");
    }
    if let Some(dir) = env::MODEL.get() {
        return checked(Path::new(&dir), Origin::Env, env::MODEL.name);
    }
    let cache = hub_cache_dir();
    if let Some(cache) = &cache
        && let Some((dir, revision)) = hub_snapshot(cache, DEFAULT_REPO)?
    {
        return Ok(Located {
            dir,
            origin: Origin::HubCache { revision },
        });
    }
    let looked = cache
        .map(|c| format!(" (looked in {})", c.display()))
        .unwrap_or_default();
    bail!(
        "no model found: pass --model DIR or set RECALL_MODEL to a model directory, \
         or put {DEFAULT_REPO} in the Hugging Face cache{looked}, \
         e.g. `huggingface-cli download {DEFAULT_REPO} --revision {DEFAULT_REVISION}`"
    )
}

fn checked(dir: &Path, origin: Origin, what: &str) -> Result<Located> {
    if !dir.is_dir() {
        // Not a directory: perhaps the name of a model `recall model fetch` got.
        if let Some(known) = dir.to_str().and_then(super::hub::known_model) {
            if let Some(cache) = hub_cache_dir()
                && let Some((dir, revision)) = hub_snapshot(&cache, known.repo)?
            {
                return Ok(Located {
                    dir,
                    origin: Origin::HubCache { revision },
                });
            }
            bail!(
                "{what} {}: no such directory, nor is {} in the Hugging Face cache yet: \
                 `recall model fetch {}` downloads it",
                dir.display(),
                known.repo,
                dir.display()
            );
        }
        bail!("{what} {}: no such directory", dir.display());
    }
    Ok(Located {
        dir: dir.to_path_buf(),
        origin,
    })
}

/// The snapshot directory of `repo` in a hub cache: the one `refs/main`
/// points to, else the pinned default revision, else the only one there.
pub fn hub_snapshot(cache: &Path, repo: &str) -> Result<Option<(PathBuf, String)>> {
    let root = cache.join(format!("models--{}", repo.replace('/', "--")));
    let snapshots = root.join("snapshots");
    if !snapshots.is_dir() {
        return Ok(None);
    }
    let usable = |rev: &str| {
        let dir = snapshots.join(rev);
        dir.join("config.json")
            .exists()
            .then_some((dir, rev.to_string()))
    };
    if let Ok(rev) = std::fs::read_to_string(root.join("refs").join("main"))
        && let Some(found) = usable(rev.trim())
    {
        return Ok(Some(found));
    }
    if let Some(found) = usable(DEFAULT_REVISION) {
        return Ok(Some(found));
    }
    let mut revisions: Vec<String> = std::fs::read_dir(&snapshots)
        .with_context(|| format!("cannot list {}", snapshots.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|rev| usable(rev).is_some())
        .collect();
    revisions.sort();
    match revisions.as_slice() {
        [] => Ok(None),
        [only] => Ok(usable(only)),
        many => bail!(
            "{} holds several snapshots ({}) and no refs/main: pass --model with the one to use",
            snapshots.display(),
            many.join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_follows_refs_main() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("models--BAAI--bge-m3");
        for rev in ["aaa", "bbb"] {
            let dir = root.join("snapshots").join(rev);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("config.json"), "{}").unwrap();
        }
        assert!(
            hub_snapshot(tmp.path(), DEFAULT_REPO).is_err(),
            "ambiguous without refs/main"
        );
        std::fs::create_dir_all(root.join("refs")).unwrap();
        std::fs::write(root.join("refs").join("main"), "bbb\n").unwrap();
        let (dir, rev) = hub_snapshot(tmp.path(), DEFAULT_REPO).unwrap().unwrap();
        assert_eq!(rev, "bbb");
        assert!(dir.ends_with("snapshots/bbb"));
    }

    #[test]
    fn missing_cache_is_none() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(hub_snapshot(tmp.path(), DEFAULT_REPO).unwrap().is_none());
    }
}
