//! Downloading a model from the Hugging Face hub (or a mirror) into the
//! standard hub cache, so that Python tools and recall share one copy.
//!
//! `hf-hub` asks the hub what each file is (commit, ETag, size); recall
//! checks those names before any becomes a path, then transfers each file
//! itself from that one answer (a mirror asked twice could answer a path the
//! second time), resuming a `.part` file left by an interrupted run. Every
//! large file is checked against the SHA-256 the hub publishes as its LFS
//! ETag, and a manifest is recorded for `verify`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use hf_hub::api::sync::{Api, ApiBuilder, ApiRepo, Metadata};
use hf_hub::{Cache, Repo, RepoType};

use super::locate::{DEFAULT_REPO, hub_cache_dir};
use super::manifest::{
    FileEntry, Manifest, check_repo, check_revision, is_sha256, manifest_path, sha256_file,
};
use crate::env;
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

/// The files of sentence-transformers/all-MiniLM-L6-v2 that recall needs.
pub const MINILM_FILES: [&str; 8] = [
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "model.safetensors",
    "modules.json",
    "1_Pooling/config.json",
    "sentence_bert_config.json",
];

/// A model `recall model fetch` knows by name.
#[derive(Debug)]
pub struct KnownModel {
    /// The hub repository (`owner/name`); its `name` is the short name.
    pub repo: &'static str,
    /// The revision fetched unless another is asked for.
    pub revision: &'static str,
    pub files: &'static [&'static str],
    /// What it is, in a few words.
    pub about: &'static str,
}

/// The models `recall model fetch NAME` and `--model NAME` know.
pub const KNOWN_MODELS: [KnownModel; 2] = [
    KnownModel {
        repo: super::locate::DEFAULT_REPO,
        revision: super::locate::DEFAULT_REVISION,
        files: &BGE_M3_FILES,
        about: "the default: 2.3 GB, 1024-dim dense, sparse and ColBERT, 100+ languages",
    },
    KnownModel {
        repo: "sentence-transformers/all-MiniLM-L6-v2",
        revision: "main",
        files: &MINILM_FILES,
        about: "90 MB, 384-dim dense only, English: to try recall quickly",
    },
];

/// The known model `name` names: its repository or its short name, in any case.
pub fn known_model(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.iter().find(|m| {
        let short = m.repo.rsplit('/').next().unwrap_or(m.repo);
        name.eq_ignore_ascii_case(m.repo) || name.eq_ignore_ascii_case(short)
    })
}

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

/// `HF_HUB_OFFLINE` is set to a true value.
pub fn offline_from_env() -> bool {
    env::HF_HUB_OFFLINE.text().is_some_and(|v| {
        !matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "false" | "no" | "off"
        )
    })
}

impl HubOptions {
    pub fn from_env() -> Result<Self> {
        let endpoint = env::HF_ENDPOINT
            .text()
            .unwrap_or_else(|| "https://huggingface.co".into());
        let token = env::HF_TOKEN.text().or_else(|| {
            let file = env::HF_HOME
                .text()
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
    let request = Request {
        repo,
        revision,
        options,
    };
    let api = options.api()?;
    let handle = api.repo(Repo::with_revision(
        repo.to_string(),
        RepoType::Model,
        revision.to_string(),
    ));
    let metas = request.metadata(&api, &handle, files)?;
    let commit = request.check_answer(files, &metas)?;
    let repo_dir = options
        .hub_cache
        .join(format!("models--{}", repo.replace('/', "--")));
    let total: u64 = metas.iter().map(|m| m.size() as u64).sum();
    let dir = repo_dir.join("snapshots").join(&commit);
    say(&format!(
        "fetching {repo} at {commit} ({} files, {:.2} GB) into {}",
        files.len(),
        total as f64 / 1e9,
        options.hub_cache.display()
    ));
    let mut entries = Vec::with_capacity(files.len());
    let mut downloaded = 0;
    for (file, meta) in files.iter().zip(&metas) {
        let (entry, transferred) = request.file(&handle, file, meta, &repo_dir, &dir)?;
        downloaded += transferred;
        entries.push(entry);
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

/// What one fetch asks for (`repo` at `revision`) and of whom.
struct Request<'a> {
    repo: &'a str,
    revision: &'a str,
    options: &'a HubOptions,
}

impl Request<'_> {
    /// The context of an error reaching the hub: what to check, and the way round it.
    fn hint(&self) -> String {
        format!(
            "could not reach {} for {}@{}; check the network, HF_ENDPOINT (a mirror) or HF_TOKEN, \
             or bring the model from another machine with `recall model export` / `recall model import`",
            self.options.endpoint, self.repo, self.revision
        )
    }

    /// What the hub says each of `files` is (commit, ETag, size), in order.
    fn metadata(&self, api: &Api, handle: &ApiRepo, files: &[&str]) -> Result<Vec<Metadata>> {
        let mut metas = Vec::with_capacity(files.len());
        for file in files {
            let meta = api
                .metadata(&handle.url(file))
                .map_err(|e| anyhow::anyhow!("{file}: {e}"))
                .with_context(|| self.hint())?;
            metas.push(meta);
        }
        Ok(metas)
    }

    /// The commit the hub answered for all of `files`. The commit and the
    /// ETags name paths in the cache: what a mirror answers is checked before
    /// any is used, and only this answer is used.
    fn check_answer(&self, files: &[&str], metas: &[Metadata]) -> Result<String> {
        let Self {
            repo,
            revision,
            options,
        } = self;
        let commit = metas[0].commit_hash().to_string();
        check_revision(&commit)
            .with_context(|| format!("{} answered for {repo}@{revision}", options.endpoint))?;
        for (file, meta) in files.iter().zip(metas) {
            if meta.commit_hash() != commit {
                bail!(
                    "{} answered two commits for {repo}@{revision} ({commit}, and {} for {file}): try again",
                    options.endpoint,
                    meta.commit_hash()
                );
            }
            if !is_blob_name(meta.etag()) {
                bail!(
                    "{} answered an ETag for {file} that is no hash ({:?}): recall names the cached file by it, \
                     so it refuses this mirror's answer",
                    options.endpoint,
                    meta.etag()
                );
            }
        }
        Ok(commit)
    }

    /// Puts `file` into the snapshot `dir` of `repo_dir` (transferring it
    /// unless a copy of its size is there) and checks its SHA-256 against
    /// the hub's; gives its manifest entry and the bytes transferred.
    fn file(
        &self,
        handle: &ApiRepo,
        file: &str,
        meta: &Metadata,
        repo_dir: &Path,
        dir: &Path,
    ) -> Result<(FileEntry, u64)> {
        let mut downloaded = 0;
        let cached = dir.join(file);
        let present = std::fs::metadata(&cached).is_ok_and(|m| m.len() == meta.size() as u64);
        let path = if present {
            cached
        } else {
            downloaded += meta.size() as u64;
            let blob = repo_dir.join("blobs").join(meta.etag());
            transfer(
                &handle.url(file),
                file,
                meta.size() as u64,
                &blob,
                self.options,
            )
            .with_context(|| self.hint())?;
            link(&blob, &cached)?;
            cached
        };
        let sha256 = sha256_file(&path)?;
        if is_sha256(meta.etag()) && sha256 != meta.etag() {
            remove_blob(&path);
            bail!(
                "{file}: the download is corrupt (SHA-256 {sha256}, the hub says {}); it was removed, run the fetch again",
                meta.etag()
            );
        }
        let entry = FileEntry {
            path: file.to_string(),
            size: meta.size() as u64,
            sha256,
        };
        Ok((entry, downloaded))
    }
}

/// An ETag that may name a blob: a git object id or a SHA-256, in hex.
fn is_blob_name(etag: &str) -> bool {
    matches!(etag.len(), 40 | 64) && etag.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Downloads `url` (`size` bytes) into `blob`, by way of `blob.part`, which
/// a transfer cut off (in this run or an earlier one) resumes from.
fn transfer(url: &str, file: &str, size: u64, blob: &Path, options: &HubOptions) -> Result<()> {
    use std::io::Write;
    let dir = blob.parent().expect("a blob is in blobs/");
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let part = blob.with_extension("part");
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&part)
        .with_context(|| format!("cannot write {}", part.display()))?;
    if out.metadata()?.len() > size {
        out.set_len(0)?;
    }
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_connect(Some(std::time::Duration::from_secs(30)))
        .http_status_as_error(false)
        .build()
        .into();
    let bar = options.progress.then(|| progress_bar(file, size));
    let mut attempt = 0;
    // A 4xx answer: trying again would get the same.
    let mut refused = false;
    loop {
        // Bytes in the .part file, counted as they are written (a failed
        // write is counted again from the file here).
        let mut have = out.metadata()?.len();
        let from = have;
        if from == size {
            break;
        }
        if let Some(bar) = &bar {
            bar.set_position(from);
        }
        let result = (|| -> Result<()> {
            let mut request = agent
                .get(url)
                .header("Range", format!("bytes={from}-"))
                .header("User-Agent", concat!("recall/", env!("CARGO_PKG_VERSION")));
            if let Some(token) = &options.token {
                request = request.header("Authorization", format!("Bearer {token}"));
            }
            let response = request.call().map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
            let status = response.status().as_u16();
            if (400..500).contains(&status) {
                refused = true;
                bail!("{file}: the server answered HTTP {status}");
            }
            if status >= 300 {
                bail!("{file}: the server answered HTTP {status}");
            }
            // A server that ignores the range sends the whole file again.
            if status != 206 && from > 0 {
                out.set_len(0)?;
                have = 0;
            }
            let mut body = response.into_body().into_reader();
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = std::io::Read::read(&mut body, &mut buf)
                    .map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
                if n == 0 {
                    break;
                }
                if have + n as u64 > size {
                    bail!("{file}: the server sent more than the {size} bytes it announced");
                }
                out.write_all(&buf[..n])?;
                have += n as u64;
                if let Some(bar) = &bar {
                    bar.inc(n as u64);
                }
            }
            Ok(())
        })();
        if have == size {
            break;
        }
        attempt += 1;
        let why = result
            .err()
            .map_or("the transfer ended early".to_string(), |e| e.to_string());
        if refused {
            bail!("{why}");
        }
        if attempt > options.retries {
            bail!("{file}: {why} ({attempt} tries; the next run resumes it)");
        }
        tracing::debug!("{file}: {why}; resuming");
        std::thread::sleep(std::time::Duration::from_millis(300 * attempt as u64));
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    out.sync_all()?;
    std::fs::rename(&part, blob)
        .with_context(|| format!("cannot move {} to {}", part.display(), blob.display()))
}

/// A transfer's bar on standard error: speed and time left.
fn progress_bar(file: &str, size: u64) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(size).with_message(file.to_string());
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar
}

/// Puts `blob` at `snapshot` (its path in a snapshot directory) as the hub
/// cache does: a relative symbolic link, or the file itself where links
/// cannot be made.
fn link(blob: &Path, snapshot: &Path) -> Result<()> {
    let dir = snapshot
        .parent()
        .expect("a snapshot file is in its directory");
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let _ = std::fs::remove_file(snapshot);
    #[cfg(unix)]
    {
        // snapshots/<commit>/<path> → ../../blobs/<etag>, one more `..` per folder in <path>.
        let repo_dir = blob
            .parent()
            .and_then(Path::parent)
            .expect("blobs/ is in the repository's folder");
        let depth = snapshot
            .strip_prefix(repo_dir)
            .map_or(2, |p| p.components().count() - 1);
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(blob.file_name().expect("a blob has a name"));
        if std::os::unix::fs::symlink(&target, snapshot).is_ok() {
            return Ok(());
        }
    }
    std::fs::rename(blob, snapshot)
        .with_context(|| format!("cannot move {} to {}", blob.display(), snapshot.display()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_bar() {
        assert!(is_blob_name(&"a".repeat(64)) && is_blob_name(&"0".repeat(40)));
        assert!(!is_blob_name("../../victim") && !is_blob_name(&"g".repeat(64)));
        progress_bar("config.json", 10).finish_and_clear();
    }
}
