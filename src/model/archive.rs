//! Moving a model to an air-gapped machine: `export` writes the files and
//! their manifest into one tar; `import` checks a tar (or a directory copied
//! by hand) and installs it into the Hugging Face cache layout
//! (`blobs/<sha256>`, `snapshots/<revision>/<file>` links, `refs/main`).

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::hub::write_ref;
use super::manifest::{Manifest, manifest_path};

const MANIFEST: &str = "manifest.json";
const FILES: &str = "files";

/// Writes `manifest`'s files from `dir` and the manifest into `tar_path`, atomically.
pub fn export(dir: &Path, manifest: &Manifest, tar_path: &Path) -> Result<()> {
    let tmp = tar_path.with_extension(format!("tmp{}", std::process::id()));
    let file = File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
    tar.follow_symlinks(true);
    let json = serde_json::to_vec_pretty(manifest)?;
    let mut header = tar::Header::new_gnu();
    header.set_size(json.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    tar.append_data(&mut header, MANIFEST, json.as_slice())?;
    for entry in &manifest.files {
        let src = dir.join(&entry.path);
        tar.append_path_with_name(&src, format!("{FILES}/{}", entry.path))
            .with_context(|| format!("cannot add {} to the archive", src.display()))?;
    }
    tar.into_inner()?
        .into_inner()
        .map_err(|e| e.into_error())?
        .sync_all()?;
    std::fs::rename(&tmp, tar_path)
        .with_context(|| format!("cannot write {}", tar_path.display()))?;
    Ok(())
}

/// Where an import came from.
pub enum ImportSource<'a> {
    Tar(&'a Path),
    /// A model directory; its manifest is `manifest.json` inside it if there
    /// is one, else made from its files under this repo and revision.
    Dir {
        dir: &'a Path,
        repo: &'a str,
        revision: &'a str,
    },
}

/// Checks the files of `source` against their manifest and installs them
/// into `hub_cache`. Nothing is installed unless every file is right.
pub fn import(
    source: ImportSource,
    hub_cache: &Path,
    recall_cache: &Path,
) -> Result<(PathBuf, Manifest)> {
    std::fs::create_dir_all(hub_cache)
        .with_context(|| format!("cannot create {}", hub_cache.display()))?;
    // Staged inside the cache so that installing is a rename on one filesystem.
    let staging = tempfile::Builder::new()
        .prefix(".recall-import-")
        .tempdir_in(hub_cache)?;
    let staged = match source {
        ImportSource::Tar(path) => Staged::unpack(path, staging.path())?,
        ImportSource::Dir {
            dir,
            repo,
            revision,
        } => Staged::in_place(dir, repo, revision)?,
    };
    staged.check()?;
    let snapshot = staged.install(hub_cache)?;
    let manifest = staged.manifest;
    write_ref(hub_cache, &manifest.repo, "main", &manifest.revision, false)?;
    manifest.write(&manifest_path(
        recall_cache,
        &manifest.repo,
        &manifest.revision,
    ))?;
    Ok((snapshot, manifest))
}

/// An import's files and their manifest, ready to check and install.
struct Staged {
    /// Where the manifest's paths are.
    files_dir: PathBuf,
    manifest: Manifest,
    /// The files are the user's, to copy; else unpacked in staging, to move.
    copy: bool,
}

impl Staged {
    /// Unpacks the tar at `path` into `staging`.
    fn unpack(path: &Path, staging: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        tar::Archive::new(std::io::BufReader::new(file))
            .unpack(staging)
            .with_context(|| format!("{}: not a readable tar archive", path.display()))?;
        let manifest = Manifest::read(&staging.join(MANIFEST)).with_context(|| {
            format!(
                "{} has no valid {MANIFEST}; was it written by `recall model export`?",
                path.display()
            )
        })?;
        Ok(Self {
            files_dir: staging.join(FILES),
            manifest,
            copy: false,
        })
    }

    /// The model directory `dir` where it is, with its manifest, or one made
    /// from its files under `repo` and `revision`.
    fn in_place(dir: &Path, repo: &str, revision: &str) -> Result<Self> {
        super::manifest::check_repo(repo).context("refusing to import")?;
        super::manifest::check_revision(revision).context("refusing to import")?;
        let manifest = if dir.join(MANIFEST).is_file() {
            Manifest::read(&dir.join(MANIFEST))?
        } else {
            let present = super::hub::BGE_M3_FILES
                .iter()
                .copied()
                .filter(|f| dir.join(f).is_file());
            let mut files: Vec<&str> = present.collect();
            if dir.join("model.safetensors").is_file() {
                files.push("model.safetensors");
            }
            super::ModelFiles::inspect(dir)
                .with_context(|| format!("{} is not a model directory", dir.display()))?;
            Manifest::of_dir(dir, repo, revision, &files)?
        };
        let files_dir = if dir.join(FILES).is_dir() {
            dir.join(FILES)
        } else {
            dir.to_path_buf()
        };
        Ok(Self {
            files_dir,
            manifest,
            copy: true,
        })
    }

    /// Refuses a manifest whose names are no safe paths, or files that do not match it.
    fn check(&self) -> Result<()> {
        // Its names become paths in the cache: checked before anything is written there.
        self.manifest.check().context("refusing to import")?;
        let wrong = self.manifest.verify(&self.files_dir)?;
        if !wrong.is_empty() {
            let list: Vec<String> = wrong
                .iter()
                .map(|m| format!("{}: {}", m.path, m.problem))
                .collect();
            bail!(
                "refusing to import, {} file(s) do not match the manifest:\n  {}",
                wrong.len(),
                list.join("\n  ")
            );
        }
        Ok(())
    }

    /// Puts each file into `hub_cache` as a blob named by its SHA-256, with a
    /// link to it in the revision's snapshot; gives the snapshot directory.
    fn install(&self, hub_cache: &Path) -> Result<PathBuf> {
        let Self {
            files_dir,
            manifest,
            copy,
        } = self;
        let repo_dir = hub_cache.join(format!("models--{}", manifest.repo.replace('/', "--")));
        let blobs = repo_dir.join("blobs");
        let snapshot = repo_dir.join("snapshots").join(&manifest.revision);
        std::fs::create_dir_all(&blobs)?;
        for entry in &manifest.files {
            let blob = blobs.join(&entry.sha256);
            if !blob.is_file() {
                let src = files_dir.join(&entry.path);
                if *copy {
                    let tmp = blob.with_extension("incomplete");
                    std::fs::copy(&src, &tmp)
                        .with_context(|| format!("cannot copy {}", src.display()))?;
                    std::fs::rename(&tmp, &blob)?;
                } else {
                    std::fs::rename(&src, &blob)
                        .with_context(|| format!("cannot install {}", blob.display()))?;
                }
            }
            let link = snapshot.join(&entry.path);
            std::fs::create_dir_all(link.parent().unwrap())?;
            let _ = std::fs::remove_file(&link);
            let depth = entry.path.matches('/').count() + 2;
            let target = PathBuf::from("../".repeat(depth))
                .join("blobs")
                .join(&entry.sha256);
            link_or_copy(&target, &blob, &link)?;
        }
        Ok(snapshot)
    }
}

#[cfg(unix)]
fn link_or_copy(relative: &Path, _blob: &Path, link: &Path) -> Result<()> {
    std::os::unix::fs::symlink(relative, link)
        .with_context(|| format!("cannot link {}", link.display()))
}

#[cfg(not(unix))]
fn link_or_copy(_relative: &Path, blob: &Path, link: &Path) -> Result<()> {
    std::fs::copy(blob, link).with_context(|| format!("cannot copy to {}", link.display()))?;
    Ok(())
}
