//! What a model's files must be: their sizes and SHA-256, recorded at fetch
//! or export time and checked by `recall model verify` and `import`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileEntry {
    /// Relative path inside the model directory, `/`-separated.
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    pub repo: String,
    pub revision: String,
    pub files: Vec<FileEntry>,
}

/// One file that does not match its manifest entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub path: String,
    pub problem: String,
}

pub use recall_engine::model::sha256_file;

/// A 64-digit hex string: the hub's LFS ETag is the file's SHA-256.
pub fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

impl Manifest {
    /// Hashes `files` (relative paths) under `dir`.
    pub fn of_dir(dir: &Path, repo: &str, revision: &str, files: &[&str]) -> Result<Self> {
        let mut entries = Vec::with_capacity(files.len());
        for rel in files {
            let path = dir.join(rel);
            let size = std::fs::metadata(&path)
                .with_context(|| format!("missing {}", path.display()))?
                .len();
            entries.push(FileEntry {
                path: rel.to_string(),
                size,
                sha256: sha256_file(&path)?,
            });
        }
        Ok(Self {
            repo: repo.to_string(),
            revision: revision.to_string(),
            files: entries,
        })
    }

    /// Checks every file under `dir`; returns the ones that are wrong.
    pub fn verify(&self, dir: &Path) -> Result<Vec<Mismatch>> {
        let mut wrong = Vec::new();
        for entry in &self.files {
            let path = dir.join(&entry.path);
            let problem = match std::fs::metadata(&path) {
                Err(_) => Some("missing".to_string()),
                Ok(m) if m.len() != entry.size => {
                    Some(format!("size {} bytes, expected {}", m.len(), entry.size))
                }
                Ok(_) => {
                    let got = sha256_file(&path)?;
                    (got != entry.sha256)
                        .then(|| format!("SHA-256 {got}, expected {}", entry.sha256))
                }
            };
            if let Some(problem) = problem {
                wrong.push(Mismatch {
                    path: entry.path.clone(),
                    problem,
                });
            }
        }
        Ok(wrong)
    }

    pub fn total_size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let manifest: Manifest = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a recall model manifest", path.display()))?;
        manifest
            .check()
            .with_context(|| format!("{}: refused", path.display()))?;
        Ok(manifest)
    }

    /// Whether every name in it is safe to make a path of, inside the cache:
    /// its repository and revision as the hub names them (`check_repo`,
    /// `check_revision`), its files as relative paths without `.` or `..`.
    pub fn check(&self) -> Result<()> {
        check_repo(&self.repo)?;
        check_revision(&self.revision)?;
        for f in &self.files {
            if f.path
                .split('/')
                .any(|part| part.is_empty() || part == "." || part == "..")
                || f.path.starts_with('/')
                || f.path.contains('\\')
            {
                bail!("unsafe file path {:?}", f.path);
            }
        }
        Ok(())
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(self)?)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(())
    }
}

/// One part of a hub name: letters, digits, `-`, `_` and `.`, not starting
/// with `.` (so never `.` or `..`), at most 128 characters.
fn is_name_part(part: &str) -> bool {
    !part.is_empty()
        && part.len() <= 128
        && !part.starts_with('.')
        && part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A repository as the hub names it, `name` or `owner/name`: its parts
/// become one directory name in the cache, never a path.
pub fn check_repo(repo: &str) -> Result<()> {
    let parts: Vec<&str> = repo.split('/').collect();
    if parts.len() > 2 || !parts.iter().all(|p| is_name_part(p)) {
        bail!(
            "{repo:?} is not a model repository: `name` or `owner/name`, of letters, digits, `-`, `_` and `.`"
        );
    }
    Ok(())
}

/// A revision as a snapshot directory of the cache names it: a commit hash
/// or a branch or tag name, without separators.
pub fn check_revision(revision: &str) -> Result<()> {
    if !is_name_part(revision) {
        bail!(
            "{revision:?} is not a revision: a commit hash or a branch or tag name, of letters, digits, `-`, `_` and `.`"
        );
    }
    Ok(())
}

/// Where recall keeps the manifest of `repo` at `revision`.
pub fn manifest_path(cache_dir: &Path, repo: &str, revision: &str) -> PathBuf {
    cache_dir
        .join("manifests")
        .join(format!("models--{}", repo.replace('/', "--")))
        .join(format!("{revision}.json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_names_the_wrong_file() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("a"), b"hello").unwrap();
        std::fs::create_dir(tmp.path().join("d")).unwrap();
        std::fs::write(tmp.path().join("d/b"), b"world").unwrap();
        let m = Manifest::of_dir(tmp.path(), "x/y", "rev", &["a", "d/b"]).unwrap();
        assert!(m.verify(tmp.path()).unwrap().is_empty());
        std::fs::write(tmp.path().join("d/b"), b"worle").unwrap();
        let wrong = m.verify(tmp.path()).unwrap();
        assert_eq!(wrong.len(), 1);
        assert_eq!(wrong[0].path, "d/b");
        assert!(wrong[0].problem.starts_with("SHA-256"));
        std::fs::remove_file(tmp.path().join("a")).unwrap();
        assert_eq!(m.verify(tmp.path()).unwrap()[0].problem, "missing");
    }

    #[test]
    fn unsafe_paths_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let bad = Manifest {
            repo: "r".into(),
            revision: "v".into(),
            files: vec![FileEntry {
                path: "../etc/passwd".into(),
                size: 1,
                sha256: "0".into(),
            }],
        };
        let path = tmp.path().join("m.json");
        bad.write(&path).unwrap();
        assert!(Manifest::read(&path).is_err());
    }

    #[test]
    fn names_that_would_leave_the_cache_are_refused() {
        for revision in [
            "../../../../tmp/victim",
            "/tmp/victim",
            "..",
            ".",
            "a/b",
            "",
            "x\\y",
        ] {
            assert!(check_revision(revision).is_err(), "{revision:?}");
        }
        for revision in [
            "main",
            "v1.0",
            "0123456789abcdef0123456789abcdef01234567",
            "local",
        ] {
            check_revision(revision).unwrap();
        }
        for repo in [
            "../evil",
            "a/b/c",
            "/abs",
            "a/..",
            "",
            "a//b",
            "owner/.hidden",
        ] {
            assert!(check_repo(repo).is_err(), "{repo:?}");
        }
        for repo in [
            "BAAI/bge-m3",
            "sentence-transformers/all-MiniLM-L6-v2",
            "local-model",
        ] {
            check_repo(repo).unwrap();
        }
        let tmp = tempfile::tempdir().unwrap();
        let bad = Manifest {
            repo: "BAAI/bge-m3".into(),
            revision: "../../../../tmp/victim".into(),
            files: Vec::new(),
        };
        let path = tmp.path().join("m.json");
        bad.write(&path).unwrap();
        let err = format!("{:#}", Manifest::read(&path).unwrap_err());
        assert!(err.contains("is not a revision"), "{err}");
    }
}
