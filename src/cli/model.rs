//! `recall model`: fetch, export, import, verify, list and describe models.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use recall::model::archive::{self, ImportSource};
use recall::model::hub::{self, BGE_M3_FILES, HubOptions};
use recall::model::locate::{self, DEFAULT_REPO, Origin};
use recall::model::manifest::{Manifest, manifest_path};
use recall::model::{ModelFiles, locate::Located};

#[derive(Args)]
pub struct ModelCommand {
    #[command(subcommand)]
    command: ModelSub,
}

#[derive(Subcommand)]
enum ModelSub {
    /// Download a model (BAAI/bge-m3 unless named) into the Hugging Face cache (honours HF_ENDPOINT,
    /// HF_TOKEN, HF_HUB_OFFLINE), check it, and convert its weights to safetensors once.
    #[command(after_help = fetch_help())]
    Fetch {
        /// The model: a repository or short name from the list below.
        #[arg(default_value = DEFAULT_REPO, value_name = "NAME")]
        name: String,
        /// Revision (a commit, or a branch or tag name). Default: the one recall pins (BAAI/bge-m3)
        /// or main.
        #[arg(long)]
        revision: Option<String>,
        /// Retries of a broken transfer, each resuming where it stopped.
        #[arg(long, default_value_t = 3)]
        retries: usize,
    },
    /// Write the model and its manifest into one tar file, for a machine without network.
    #[command(after_help = "Examples:\n  recall model export bge-m3.tar")]
    Export {
        /// The tar file to write.
        file: PathBuf,
        /// Model directory. Default: as `recall embed` finds it.
        #[arg(long, value_name = "DIR")]
        model: Option<PathBuf>,
    },
    /// Check and install a model from a tar written by `export`, or from a model directory copied by hand.
    #[command(
        after_help = "Examples:\n  recall model import bge-m3.tar\n  recall model import ./bge-m3-copy --revision 5617a9f61b028005a4858fdac845db406aefb181"
    )]
    Import {
        /// A .tar from `recall model export`, or a model directory.
        source: PathBuf,
        /// For a directory without manifest.json: the repository it is a copy of.
        #[arg(long, default_value = DEFAULT_REPO)]
        repo: String,
        /// For a directory without manifest.json: its revision. Default: the directory's name if it is a
        /// commit hash, else "local".
        #[arg(long)]
        revision: Option<String>,
    },
    /// Check every file of the model against its manifest (sizes and SHA-256), and the
    /// converted copy that runs, if there is one.
    #[command(
        after_help = "Examples:\n  recall model verify\n  recall model verify --model ./bge-m3 --json"
    )]
    Verify {
        /// Model directory. Default: as `recall embed` finds it.
        #[arg(long, value_name = "DIR")]
        model: Option<PathBuf>,
        /// Print one JSON object: each file's path and problem (null when it matches).
        #[arg(long)]
        json: bool,
    },
    /// The models in the Hugging Face cache that recall can use, and which one is the default.
    #[command(after_help = "Examples:\n  recall model list\n  recall model list --json")]
    List {
        /// Print one JSON object per model.
        #[arg(long)]
        json: bool,
    },
    /// Load the model and describe it: where, revision, size, dimensions, outputs.
    #[command(
        after_help = "Examples:\n  recall model info\n  recall model info --model ./bge-m3 --json"
    )]
    Info {
        /// Model directory. Default: as `recall embed` finds it.
        #[arg(long, value_name = "DIR")]
        model: Option<PathBuf>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// `recall model fetch --help`'s list of the models it knows, and examples.
fn fetch_help() -> String {
    let models: String = hub::KNOWN_MODELS
        .iter()
        .map(|m| format!("  {:<40}{}\n", m.repo, m.about))
        .collect();
    format!(
        "Models it knows by name (their short names too; then usable as --model NAME):\n{models}\n\
         Examples:\n  recall model fetch\n  recall model fetch all-MiniLM-L6-v2\n  \
         HF_ENDPOINT=https://hf-mirror.com recall model fetch"
    )
}

fn progress_bar(len: u64, template: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(template)
            .unwrap()
            .progress_chars("=> "),
    );
    bar
}

/// Downloads the default model and converts its weights, printing each step.
pub fn fetch_default(revision: &str, retries: usize) -> Result<PathBuf> {
    let default = hub::known_model(DEFAULT_REPO).expect("the default model is known");
    fetch_known(default, revision, retries)
}

/// Downloads `model` at `revision` and converts its weights, printing each step.
fn fetch_known(model: &hub::KnownModel, revision: &str, retries: usize) -> Result<PathBuf> {
    let mut options = HubOptions::from_env()?;
    options.progress = std::io::stderr().is_terminal();
    options.retries = retries;
    let cache = locate::recall_cache_dir()?;
    let fetched = hub::fetch(
        model.repo,
        revision,
        model.files,
        &options,
        &cache,
        |line| eprintln!("{line}"),
    )?;
    eprintln!(
        "{} in {} ({:.2} GB downloaded now)",
        if fetched.downloaded > 0 {
            "fetched"
        } else {
            "already present"
        },
        fetched.dir.display(),
        fetched.downloaded as f64 / 1e9
    );
    convert(&fetched.dir, &cache)?;
    Ok(fetched.dir)
}

fn convert(dir: &Path, cache: &Path) -> Result<()> {
    let files = ModelFiles::inspect(dir)?;
    let bar = progress_bar(
        0,
        "converting to safetensors [{bar:40}] {pos}/{len} tensors ({elapsed})",
    );
    let (path, converted) = files.safetensors_weights(cache, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })?;
    bar.finish_and_clear();
    if converted {
        eprintln!("converted the weights once to {}", path.display());
    }
    Ok(())
}

/// The manifest that describes `located`: recall's record for a hub
/// snapshot, or the directory's own `manifest.json`.
pub fn manifest_of(located: &Located) -> Result<Option<Manifest>> {
    if let Origin::HubCache { revision } = &located.origin {
        let path = manifest_path(&locate::recall_cache_dir()?, DEFAULT_REPO, revision);
        if path.is_file() {
            return Manifest::read(&path).map(Some);
        }
    }
    let own = located.dir.join("manifest.json");
    if own.is_file() {
        Manifest::read(&own).map(Some)
    } else {
        Ok(None)
    }
}

fn revision_of(located: &Located) -> String {
    match &located.origin {
        Origin::HubCache { revision } => revision.clone(),
        _ => dir_revision(&located.dir),
    }
}

fn dir_revision(dir: &Path) -> String {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if name.len() == 40 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
        name
    } else {
        "local".into()
    }
}

fn dir_size(dir: &Path) -> u64 {
    walk(dir)
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p))
            } else {
                out.push(p)
            }
        }
    }
    out
}

pub fn run(cmd: ModelCommand) -> Result<()> {
    match cmd.command {
        ModelSub::Fetch {
            name,
            revision,
            retries,
        } => fetch(&name, revision.as_deref(), retries),
        ModelSub::Export { file, model } => export(&file, model.as_deref()),
        ModelSub::Import {
            source,
            repo,
            revision,
        } => import(&source, &repo, revision),
        ModelSub::Verify { model, json } => verify(model.as_deref(), json),
        ModelSub::List { json } => list(json),
        ModelSub::Info { model, json } => info(model.as_deref(), json),
    }
}

/// A model recall knows by name into the Hugging Face cache.
fn fetch(name: &str, revision: Option<&str>, retries: usize) -> Result<()> {
    let Some(model) = hub::known_model(name) else {
        bail!(
            "recall does not know a model named {name:?}; it fetches {} (or give any model directory \
             as --model DIR)",
            hub::KNOWN_MODELS
                .iter()
                .map(|m| m.repo)
                .collect::<Vec<_>>()
                .join(" and ")
        );
    };
    if hub::offline_from_env() {
        bail!(
            "HF_HUB_OFFLINE is set: recall will not download. Unset it, or import the model with `recall model import`"
        );
    }
    let dir = fetch_known(model, revision.unwrap_or(model.revision), retries)?;
    println!("{}", dir.display());
    Ok(())
}

/// A model, checked against its manifest, into one tar.
fn export(file: &Path, model: Option<&Path>) -> Result<()> {
    let located = locate::locate(model)?;
    let manifest = match manifest_of(&located)? {
        Some(m) => m,
        None => {
            let files: Vec<&str> = BGE_M3_FILES
                .iter()
                .copied()
                .chain(["model.safetensors"])
                .filter(|f| located.dir.join(f).is_file())
                .collect();
            Manifest::of_dir(&located.dir, DEFAULT_REPO, &revision_of(&located), &files)?
        }
    };
    let wrong = manifest.verify(&located.dir)?;
    if let Some(w) = wrong.first() {
        bail!(
            "{}: {} does not match its manifest ({}); run `recall model verify`",
            located.dir.display(),
            w.path,
            w.problem
        );
    }
    eprintln!(
        "writing {} files ({:.2} GB) to {}",
        manifest.files.len(),
        manifest.total_size() as f64 / 1e9,
        file.display()
    );
    archive::export(&located.dir, &manifest, file)?;
    println!("{}", file.display());
    Ok(())
}

/// A tar or a directory into the cache layout, checked and converted.
fn import(source: &Path, repo: &str, revision: Option<String>) -> Result<()> {
    let hub_cache =
        locate::hub_cache_dir().context("cannot find the Hugging Face cache: set HF_HUB_CACHE")?;
    let recall_cache = locate::recall_cache_dir()?;
    let revision = revision.unwrap_or_else(|| dir_revision(source));
    let from = if source.is_dir() {
        ImportSource::Dir {
            dir: source,
            repo,
            revision: &revision,
        }
    } else if source.is_file() {
        ImportSource::Tar(source)
    } else {
        bail!("{}: no such file or directory", source.display());
    };
    let (dir, manifest) = archive::import(from, &hub_cache, &recall_cache)?;
    eprintln!(
        "verified {} files ({:.2} GB)",
        manifest.files.len(),
        manifest.total_size() as f64 / 1e9
    );
    convert(&dir, &recall_cache)?;
    println!("{}", dir.display());
    Ok(())
}

/// A model's files against their manifest, and the converted copy that runs.
fn verify(model: Option<&Path>, json: bool) -> Result<()> {
    let located = locate::locate(model)?;
    let manifest = manifest_of(&located)?.with_context(|| {
        format!(
            "no manifest recorded for {}: recall records one when it fetches or imports a model",
            located.dir.display()
        )
    })?;
    let wrong = manifest.verify(&located.dir)?;
    let mut files: Vec<serde_json::Value> = Vec::new();
    for entry in &manifest.files {
        let problem = wrong
            .iter()
            .find(|w| w.path == entry.path)
            .map(|w| w.problem.clone());
        if !json {
            match &problem {
                Some(p) => println!("WRONG {}: {p}", entry.path),
                None => println!("ok    {}", entry.path),
            }
        }
        files.push(serde_json::json!({"path": entry.path, "problem": problem}));
    }
    // What actually runs, when the checkpoint is not safetensors.
    let recall_cache = locate::recall_cache_dir()?;
    let mut converted = serde_json::Value::Null;
    if let Some((copy, verdict)) =
        ModelFiles::inspect(&located.dir)?.verify_converted(&recall_cache)?
    {
        let problem = verdict.err();
        if let Some(why) = &problem {
            convert(&located.dir, &recall_cache)?;
            if !json {
                println!("WRONG {} (the converted copy): {why}", copy.display());
                println!("      converted again from the checkpoint");
            }
        } else if !json {
            println!("ok    {} (the converted copy that runs)", copy.display());
        }
        converted = serde_json::json!({
            "path": copy, "problem": problem, "converted_again": problem.is_some(),
        });
    }
    if json {
        println!(
            "{}",
            serde_json::json!({"model": located.dir, "files": files, "converted": converted})
        );
    }
    if !wrong.is_empty() {
        bail!(
            "{} of {} files are wrong: run `recall model fetch` again (it re-downloads what is missing or \
                 wrong after you delete it), or import a good copy",
            wrong.len(),
            manifest.files.len()
        );
    }
    eprintln!("all {} files match the manifest", manifest.files.len());
    Ok(())
}

/// The usable models in the Hugging Face cache.
fn list(json: bool) -> Result<()> {
    let hub_cache = locate::hub_cache_dir().context("cannot find the Hugging Face cache")?;
    let default = locate::locate(None).ok();
    let mut any = false;
    // `--json` is one array, empty too, so a script always gets JSON.
    let mut listed = Vec::new();
    for entry in std::fs::read_dir(&hub_cache)
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(repo) = name.strip_prefix("models--").map(|r| r.replace("--", "/")) else {
            continue;
        };
        for snap in std::fs::read_dir(entry.path().join("snapshots"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let dir = snap.path();
            let Ok(files) = ModelFiles::inspect(&dir) else {
                continue;
            };
            any = true;
            let is_default = default.as_ref().is_some_and(|d| d.dir == dir);
            let revision = snap.file_name().to_string_lossy().into_owned();
            let outputs = if files.heads.is_some() {
                "dense+sparse+colbert"
            } else {
                "dense"
            };
            if json {
                listed.push(serde_json::json!({
                    "repo": repo, "revision": revision, "default": is_default,
                    "bytes": dir_size(&dir), "dimension": files.encoder.hidden_size,
                    "outputs": outputs.split('+').collect::<Vec<_>>(), "dir": dir,
                }));
                continue;
            }
            println!(
                "{} {repo}@{revision} {:.2} GB {} dims, {outputs} {}",
                if is_default { "*" } else { " " },
                dir_size(&dir) as f64 / 1e9,
                files.encoder.hidden_size,
                dir.display()
            );
        }
    }
    if json {
        println!("{}", serde_json::Value::Array(listed));
    } else if !any {
        println!(
            "no usable model in {} (fetch one with `recall model fetch`)",
            hub_cache.display()
        );
    }
    Ok(())
}

/// What a model is, loaded.
fn info(model: Option<&Path>, json: bool) -> Result<()> {
    let located = locate::locate(model)?;
    let embedder = recall::Embedder::load(&located.dir, &recall::LoadOptions::default())?;
    let info = embedder.info();
    let outputs: Vec<&str> = if info.sparse {
        vec!["dense", "sparse", "colbert"]
    } else {
        vec!["dense"]
    };
    let found_by = match &located.origin {
        Origin::Flag => "--model",
        Origin::Env => recall::env::MODEL.name,
        Origin::HubCache { .. } => "Hugging Face cache (default)",
    };
    if json {
        println!(
            "{}",
            serde_json::json!({
                "model": located.dir, "found_by": found_by, "revision": revision_of(&located),
                "type": info.model_type, "bytes": dir_size(&located.dir), "weights": info.weights,
                "dimension": info.dense_dim, "colbert_dimension": info.colbert_dim,
                "outputs": outputs, "max_length": info.model_max_length,
                "load_seconds": info.load_time.as_secs_f64(), "pack_file": info.pack_file,
            })
        );
        return Ok(());
    }
    println!("model:       {}", located.dir.display());
    println!("found by:    {found_by}");
    println!("revision:    {}", revision_of(&located));
    println!("type:        {}", info.model_type);
    println!("size:        {:.2} GB", dir_size(&located.dir) as f64 / 1e9);
    println!("weights:     {}", info.weights.display());
    println!(
        "dimensions:  {}{}",
        info.dense_dim,
        info.colbert_dim
            .map(|d| format!(" (colbert {d})"))
            .unwrap_or_default()
    );
    println!("outputs:     {}", outputs.join(", "));
    println!("max length:  {} tokens", info.model_max_length);
    if let Some(pack) = &info.pack_file {
        println!("packed:      {}", pack.display());
    }
    println!("loaded in:   {:.2}s", info.load_time.as_secs_f64());
    Ok(())
}
