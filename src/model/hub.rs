//! Downloading a model from the Hugging Face hub (or a mirror) into the
//! standard hub cache, so that Python tools and recall share one copy.
//!
//! `hf-hub` does the transfer (resuming a `.part` file left by an
//! interrupted run); recall checks every large file against the SHA-256 the
//! hub publishes as its LFS ETag, and records a manifest for `verify`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use hf_hub::api::sync::{Api, ApiBuilder};
use hf_hub::{Cache, Repo, RepoType};

use super::locate::{DEFAULT_REPO, hub_cache_dir};
use super::manifest::{
    FileEntry, Manifest, check_repo, check_revision, is_sha256, manifest_path, sha256_file,
};
use crate::paths::home_dir;

/// The files of BAAI/bge-m3 that recall needs.
pub const BGE_M3_FILES: [&str; 9] = [
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "pytorch_model.bin",
    "colbert_linear.pt",
    "sparse_linear.pt",
    "1_Pooling/config.json",
    "modules.json",
];

/// How to reach the hub, from the environment (`HF_ENDPOINT`, `HF_TOKEN`,
/// the hub cache variables) unless set otherwise.
#[derive(Debug, Clone)]
pub struct HubOptions {
    pub endpoint: String,
    pub token: Option<String>,
    pub hub_cache: PathBuf,
    /// Show a progress bar (speed, ETA) on standard error.
    pub progress: bool,
    /// Retries of a broken transfer within one run, each resuming where it stopped.
    pub retries: usize,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `HF_HUB_OFFLINE` is set to a true value.
pub fn offline_from_env() -> bool {
    env("HF_HUB_OFFLINE").is_some_and(|v| {
        !matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "false" | "no" | "off"
        )
    })
}

impl HubOptions {
    pub fn from_env() -> Result<Self> {
        let endpoint = env("HF_ENDPOINT").unwrap_or_else(|| "https://huggingface.co".into());
        let token = env("HF_TOKEN").or_else(|| {
            let file = env("HF_HOME")
                .map(PathBuf::from)
                .or_else(|| home_dir().map(|h| h.join(".cache/huggingface")))?
                .join("token");
            std::fs::read_to_string(file)
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
        });
        let hub_cache = hub_cache_dir()
            .context("cannot find the Hugging Face cache: set HF_HUB_CACHE or HOME")?;
        Ok(Self {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
            hub_cache,
            progress: false,
            retries: 3,
        })
    }

    fn api(&self) -> Result<Api> {
        ApiBuilder::from_cache(Cache::new(self.hub_cache.clone()))
            .with_endpoint(self.endpoint.clone())
            .with_token(self.token.clone())
            .with_progress(self.progress)
            .with_retries(self.retries)
            .build()
            .context("cannot set up the hub client")
    }
}

/// A model in the hub cache, with its manifest.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// Bytes transferred in this run (0 when everything was cached).
    pub downloaded: u64,
}

/// Downloads `files` of `repo` at `revision` into the hub cache (files
/// already there are kept), checks them, and writes recall's manifest under
/// `recall_cache`. `say` receives one line per step.
pub fn fetch(
    repo: &str,
    revision: &str,
    files: &[&str],
    options: &HubOptions,
    recall_cache: &Path,
    mut say: impl FnMut(&str),
) -> Result<Fetched> {
    check_repo(repo)?;
    check_revision(revision)?;
    let api = options.api()?;
    let handle = api.repo(Repo::with_revision(
        repo.to_string(),
        RepoType::Model,
        revision.to_string(),
    ));
    let hint = || {
        format!(
            "could not reach {} for {repo}@{revision}; check the network, HF_ENDPOINT (a mirror) or HF_TOKEN, \
             or bring the model from another machine with `recall model export` / `recall model import`",
            options.endpoint
        )
    };
    let mut metas = Vec::with_capacity(files.len());
    for file in files {
        let meta = api
            .metadata(&handle.url(file))
            .map_err(|e| anyhow::anyhow!("{file}: {e}"))
            .with_context(hint)?;
        metas.push(meta);
    }
    let commit = metas[0].commit_hash().to_string();
    // The commit names a directory of the cache: what a mirror answers is checked first.
    check_revision(&commit)
        .with_context(|| format!("{} answered for {repo}@{revision}", options.endpoint))?;
    let total: u64 = metas.iter().map(|m| m.size() as u64).sum();
    let dir = options
        .hub_cache
        .join(format!("models--{}", repo.replace('/', "--")))
        .join("snapshots")
        .join(&commit);
    say(&format!(
        "fetching {repo} at {commit} ({} files, {:.2} GB) into {}",
        files.len(),
        total as f64 / 1e9,
        options.hub_cache.display()
    ));
    let mut entries = Vec::with_capacity(files.len());
    let mut downloaded = 0;
    for (file, meta) in files.iter().zip(&metas) {
        let cached = dir.join(file);
        let present = std::fs::metadata(&cached).is_ok_and(|m| m.len() == meta.size() as u64);
        let path = if present {
            cached
        } else {
            downloaded += meta.size() as u64;
            handle
                .download(file)
                .map_err(|e| anyhow::anyhow!("{file}: {e}"))
                .with_context(hint)?
        };
        let sha256 = sha256_file(&path)?;
        if is_sha256(meta.etag()) && sha256 != meta.etag() {
            remove_blob(&path);
            bail!(
                "{file}: the download is corrupt (SHA-256 {sha256}, the hub says {}); it was removed, run the fetch again",
                meta.etag()
            );
        }
        entries.push(FileEntry {
            path: file.to_string(),
            size: meta.size() as u64,
            sha256,
        });
    }
    write_ref(
        &options.hub_cache,
        repo,
        "main",
        &commit,
        revision == "main",
    )?;
    let manifest = Manifest {
        repo: repo.to_string(),
        revision: commit.clone(),
        files: entries,
    };
    manifest.write(&manifest_path(recall_cache, repo, &commit))?;
    Ok(Fetched {
        dir,
        manifest,
        downloaded,
    })
}

/// Removes a snapshot file and the blob it points to.
fn remove_blob(path: &Path) {
    if let Ok(target) = std::fs::canonicalize(path) {
        let _ = std::fs::remove_file(target);
    }
    let _ = std::fs::remove_file(path);
}

/// Points `refs/<name>` at `commit`; an existing ref is only replaced when `force`.
pub fn write_ref(
    hub_cache: &Path,
    repo: &str,
    name: &str,
    commit: &str,
    force: bool,
) -> Result<()> {
    let refs = hub_cache
        .join(format!("models--{}", repo.replace('/', "--")))
        .join("refs");
    let path = refs.join(name);
    if path.exists() && !force {
        return Ok(());
    }
    std::fs::create_dir_all(&refs).with_context(|| format!("cannot create {}", refs.display()))?;
    std::fs::write(&path, commit).with_context(|| format!("cannot write {}", path.display()))
}

/// The message for a model that is missing while recall may not download.
pub fn offline_message(hub_cache: &Path) -> String {
    format!(
        "{DEFAULT_REPO} is not in the Hugging Face cache ({}) and recall is offline (--offline or HF_HUB_OFFLINE). \
         On a machine with network run `recall model fetch && recall model export bge-m3.tar`, \
         copy bge-m3.tar here, then run `recall model import bge-m3.tar`. \
         Or pass --model DIR for a model directory you already have.",
        hub_cache.display()
    )
}
