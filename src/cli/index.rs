//! `recall index` and `recall stats`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use recall::index::chunk::ChunkParams;
use recall::index::store::Store;
use recall::index::{self, IndexOptions};
use recall::source::hermes::{self, Profile, Selection};
use serde_json::json;

use super::{ModelArgs, Paused, ProviderArgs};

/// Where the Hermes history and the index are.
#[derive(Args, Clone)]
#[command(next_help_heading = "Hermes and the index")]
pub struct HermesArgs {
    /// Hermes home directory. Default: $HERMES_HOME, else ~/.hermes.
    #[arg(long, value_name = "DIR")]
    hermes_home: Option<PathBuf>,
    /// One Hermes profile (~/.hermes/profiles/NAME) instead of the default one.
    #[arg(long, value_name = "NAME", conflicts_with = "all_profiles")]
    profile: Option<String>,
    /// The default profile and every profile under profiles/.
    #[arg(long)]
    all_profiles: bool,
    /// The index database. Default: $HERMES_HOME/recall/index.db.
    #[arg(long, value_name = "PATH")]
    index: Option<PathBuf>,
}

/// `--roles` on the commands that only read an index (stats, doctor).
pub const ROLES_AS_INDEXED: &str = "The roles the index was built with, comma-separated (as given to \
    `recall index --roles`), to count the messages not indexed yet";

/// Which messages an index holds (index, watch, stats, doctor).
#[derive(Args, Clone)]
#[command(next_help_heading = "Hermes and the index")]
pub struct RoleArgs {
    /// Roles to index, comma-separated (Hermes searches user and assistant; add tool for tool results).
    #[arg(long, value_delimiter = ',', default_value = "user,assistant")]
    roles: Vec<String>,
}

impl RoleArgs {
    pub fn selection(&self) -> Result<Selection> {
        for role in &self.roles {
            if !["user", "assistant", "tool", "system"].contains(&role.as_str()) {
                bail!("--roles: unknown role {role:?} (user, assistant, tool, system)");
            }
        }
        Ok(Selection {
            roles: self.roles.clone(),
        })
    }
}

impl HermesArgs {
    pub fn home(&self) -> Result<PathBuf> {
        match &self.hermes_home {
            Some(h) => Ok(h.clone()),
            None => hermes::default_home()
                .context("cannot find Hermes: set HERMES_HOME or pass --hermes-home"),
        }
    }

    pub fn profiles(&self) -> Result<Vec<Profile>> {
        let home = self.home()?;
        let profiles = hermes::profiles(&home, self.profile.as_deref(), self.all_profiles)?;
        let missing: Vec<String> = profiles
            .iter()
            .filter(|p| !p.state_db().is_file())
            .map(|p| p.state_db().display().to_string())
            .collect();
        if !missing.is_empty() && missing.len() == profiles.len() {
            bail!(
                "no Hermes database at {}: is Hermes installed, or is --hermes-home right?",
                missing.join(", ")
            );
        }
        Ok(profiles
            .into_iter()
            .filter(|p| p.state_db().is_file())
            .collect())
    }

    /// The arguments that name one profile of `home`, with the default index and roles.
    pub fn for_home(home: &std::path::Path, profile: &str) -> Self {
        Self {
            hermes_home: Some(home.to_path_buf()),
            profile: (profile != "default").then(|| profile.to_string()),
            all_profiles: false,
            index: None,
        }
    }

    /// The profiles, whether or not Hermes has written their databases yet.
    pub fn profiles_even_missing(&self) -> Result<Vec<Profile>> {
        hermes::profiles(&self.home()?, self.profile.as_deref(), self.all_profiles)
    }

    pub fn profile_name(&self) -> Option<String> {
        self.profile.clone()
    }

    pub fn all_profiles(&self) -> bool {
        self.all_profiles
    }

    pub fn index_path(&self) -> Result<PathBuf> {
        match &self.index {
            Some(p) => Ok(p.clone()),
            None => Ok(index::default_index_path(&self.home()?)),
        }
    }
}

/// How messages are cut into chunks.
#[derive(Args, Clone)]
#[command(next_help_heading = "Chunking")]
pub struct ChunkArgs {
    /// Tokens per chunk window, special tokens included. Default: 512, or the model's limit if smaller.
    #[arg(long)]
    chunk_tokens: Option<usize>,
    /// Tokens shared by consecutive windows of a long message. Default: 64.
    #[arg(long)]
    chunk_overlap: Option<usize>,
}

impl ChunkArgs {
    /// The chunking, for a model taking at most `max_length` tokens (if known).
    pub fn params(&self, max_length: Option<usize>) -> ChunkParams {
        ChunkParams {
            window: self.chunk_tokens.unwrap_or(
                ChunkParams::default()
                    .window
                    .min(max_length.unwrap_or(usize::MAX)),
            ),
            overlap: self.chunk_overlap.unwrap_or(ChunkParams::default().overlap),
        }
    }

    /// The chunking of an index built before (`existing`) unless set here,
    /// else the default for `chain` (its local model's limit, when it has one).
    pub fn params_for(
        &self,
        chain: &recall::provider::Chain,
        existing: Option<&recall::space::Identity>,
    ) -> ChunkParams {
        match existing {
            Some(id) => ChunkParams {
                window: self.chunk_tokens.unwrap_or(id.chunk_tokens),
                overlap: self.chunk_overlap.unwrap_or(id.chunk_overlap),
            },
            None => self.params(chain.tokenizer().map(|t| t.max_length())),
        }
    }
}

#[derive(Args)]
pub struct IndexArgs {
    #[command(flatten)]
    hermes: HermesArgs,
    #[command(flatten)]
    roles: RoleArgs,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    providers: ProviderArgs,
    /// Empty the index and embed everything again (needed after changing the model or chunking).
    #[arg(long)]
    rebuild: bool,
    #[command(flatten)]
    chunk: ChunkArgs,
    /// Print a JSON summary instead of a progress bar and text.
    #[arg(long)]
    json: bool,
}

pub fn run_index(args: IndexArgs) -> Result<()> {
    index_with(
        &args.hermes,
        &args.roles,
        &args.model,
        &args.providers,
        &args.chunk,
        args.rebuild,
        args.json,
    )
}

/// `recall index` with these arguments (also the first index of `recall hermes install`).
pub fn index_with(
    hermes: &HermesArgs,
    roles: &RoleArgs,
    model: &ModelArgs,
    providers: &ProviderArgs,
    chunk: &ChunkArgs,
    rebuild: bool,
    json: bool,
) -> Result<()> {
    let profiles = hermes.profiles()?;
    let selection = roles.selection()?;
    let index_path = hermes.index_path()?;
    index::check_sources(&index_path, &profiles)?;
    if rebuild && let Some((aside, why)) = Store::set_aside_if_damaged(&index_path)? {
        eprintln!(
            "warning: the index {} was damaged ({why}); moved it to {} and building a new one",
            index_path.display(),
            aside.display()
        );
    }
    let bar = starting_bar(json);
    interrupt::report_on_ctrl_c();
    let mut first_chain = first_chain(&index_path, providers, model)?;
    // Damage found on the way is named with the way out.
    let run = || -> Result<()> {
        let mut store = Store::open(&index_path)?;
        let remembered = if rebuild { None } else { store.model_dir()? };
        let chain = match first_chain.take() {
            Some(chain) => chain,
            None => providers.chain(model, remembered)?,
        };
        let options = IndexOptions {
            selection,
            chunk: chunk.params_for(&chain, store.identity()?.as_ref().filter(|_| !rebuild)),
            rebuild,
        };
        let progress = progress_on(bar.clone());
        let report = index::run(&chain, &mut store, &profiles, &options, &progress)?;
        recall::search::vector::prepare(&store);
        if let Some(bar) = &bar {
            bar.finish_and_clear();
        }
        print_report(&report, &index_path, json, options.chunk.window)?;
        match &report.paused {
            Some(why) => Err(paused(why, &report).into()),
            None => Ok(()),
        }
    };
    run().map_err(|e| Store::explain(&index_path, e))
}

/// Until the first messages are embedded, a spinner saying what takes the
/// time (on a terminal, without `--json`).
fn starting_bar(json: bool) -> Option<ProgressBar> {
    (!json && std::io::stderr().is_terminal()).then(|| {
        let bar = ProgressBar::new_spinner().with_message(
            "starting: loading the model (its first load also packs the weights), reading Hermes's history",
        );
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        bar
    })
}

/// The chain for a new index, checked before anything is written: a new
/// index takes the space of the chain's first provider, and where that is
/// recall's engine and its model cannot be loaded, no retry will help until
/// the user acts, so it is an error (not a pause). `None` for an index that
/// exists (its chain depends on the model it remembers).
fn first_chain(
    index_path: &Path,
    providers: &ProviderArgs,
    model: &ModelArgs,
) -> Result<Option<recall::provider::Chain>> {
    if index_path.exists() {
        return Ok(None);
    }
    let chain = providers.chain(model, None)?;
    if let Some(first) = chain
        .providers()
        .first()
        .filter(|p| p.kind() == recall::provider::Kind::Local)
        && let Err(e) = first.identity()
    {
        bail!("{}", no_model(&format!("{e:#}")));
    }
    Ok(Some(chain))
}

/// The indexing run's progress callback: Ctrl-C's report, and the bar.
fn progress_on(bar: Option<ProgressBar>) -> impl Fn(usize, usize, usize, usize) {
    let started = std::time::Instant::now();
    let bar_ref = Mutex::new(bar);
    move |done: usize, total: usize, chunks: usize, tokens: usize| {
        interrupt::progress(done, total);
        if let Some(bar) = bar_ref.lock().unwrap().as_ref() {
            if bar.length() != Some(total as u64) {
                bar.set_style(
                    ProgressStyle::with_template(
                        "indexing [{bar:30}] {pos}/{len} messages, {msg} ({elapsed}, ETA {eta})",
                    )
                    .expect("a valid template")
                    .progress_chars("=> "),
                );
            }
            bar.set_length(total as u64);
            bar.set_position(done as u64);
            let rate = tokens as f64 / started.elapsed().as_secs_f64().max(1e-3);
            bar.set_message(format!("{chunks} chunks, {rate:.0} tokens/s"));
        }
    }
}

/// What a run did: on standard output (a line, or JSON), and its warnings
/// on standard error.
fn print_report(
    report: &index::Report,
    index_path: &Path,
    json: bool,
    window: usize,
) -> Result<()> {
    if json {
        let mut value = serde_json::to_value(report)?;
        value["index"] = json!(index_path);
        println!("{value}");
    } else if report.paused.is_none() || report.embedded_messages > 0 {
        println!(
            "indexed {} into {}: {} messages ({} embedded, {} unchanged, {} removed), {} chunks ({} from cache), \
             {} tokens in {:.1}s ({:.0} tokens/s)",
            report.profiles.join(", "),
            index_path.display(),
            report.messages,
            report.embedded_messages,
            report.unchanged_messages,
            report.deleted_messages,
            report.chunks,
            report.cached_chunks,
            report.tokens,
            report.seconds,
            report.tokens_per_second
        );
    }
    if report.embedded_by.len() > 1 || report.embedded_by.keys().any(|p| p != "local") {
        eprintln!(
            "embedded by: {}",
            report
                .embedded_by
                .iter()
                .map(|(p, n)| format!("{p} {n} chunks"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    print_warnings(report, window);
    Ok(())
}

/// What was cut, repaired, skipped or refused, on standard error.
fn print_warnings(report: &index::Report, window: usize) {
    if report.truncated_chunks > 0 {
        eprintln!(
            "warning: {} chunks were longer than the model's limit and were truncated",
            report.truncated_chunks
        );
    }
    if report.capped_messages > 0 {
        eprintln!(
            "warning: {} messages are longer than {} chunks of {} tokens; only that much of each \
             was indexed (ids {}; `recall stats` counts them)",
            report.capped_messages,
            index::chunk::MAX_CHUNKS_PER_MESSAGE,
            window,
            id_list(&report.capped_ids)
        );
    }
    if report.repaired_messages > 0 {
        eprintln!(
            "warning: {} messages in Hermes's database held bytes that are not UTF-8 text or a \
             timestamp that is no number (ids {}); they were indexed with those bytes replaced",
            report.repaired_messages,
            id_list(&report.repaired_ids)
        );
    }
    if report.malformed_lines > 0 {
        eprintln!(
            "warning: {} malformed lines in Hermes session files were skipped",
            report.malformed_lines
        );
    }
    if report.rejected_messages > 0 {
        eprintln!(
            "warning: the provider refused {} messages (their reasons are above); they were left out \
             and are tried again on the next run",
            report.rejected_messages
        );
    }
}

/// The error of a run that paused: why, and what waits.
fn paused(why: &str, report: &index::Report) -> Paused {
    let waiting = if report.messages == 0 {
        "nothing was indexed yet; it waits".to_string()
    } else {
        format!(
            "what was embedded is kept; {} messages wait",
            report.pending_messages
        )
    };
    Paused(format!(
        "indexing paused: {why}\n{waiting} for the next `recall index` \
         (`recall watch` retries by itself). `recall providers` shows each provider's state."
    ))
}

#[derive(Args)]
#[command(mut_arg("roles", |a| a.help(ROLES_AS_INDEXED)))]
pub struct StatsArgs {
    #[command(flatten)]
    hermes: HermesArgs,
    #[command(flatten)]
    roles: RoleArgs,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run_stats(args: StatsArgs) -> Result<()> {
    let path = args.hermes.index_path()?;
    stats_of(&path, &args).map_err(|e| Store::explain(&path, e))
}

fn stats_of(path: &std::path::Path, args: &StatsArgs) -> Result<()> {
    let store = Store::open_existing(path)?;
    let identity = store.identity()?;
    let size: u64 = ["", "-wal"]
        .iter()
        .filter_map(|s| std::fs::metadata(format!("{}{s}", path.display())).ok())
        .map(|m| m.len())
        .sum();
    let counts = store.counts()?;
    let profiles = args.hermes.profiles()?;
    let lag = index::lag(&store, &profiles, &args.roles.selection()?)?;
    let last = store.last_indexed_at()?;
    let stats = json!({
        "index": path,
        "sessions": counts.sessions,
        "messages": counts.messages,
        "chunks": counts.chunks,
        "vectors": counts.vectors,
        "tokens_embedded": counts.tokens_embedded,
        "cached_embeddings": counts.cached_embeddings,
        "capped_messages": counts.capped_messages,
        "skipped_bytes": counts.skipped_bytes,
        "size_bytes": size,
        "identity": identity,
        "last_indexed_at": last,
        "lag_messages": lag,
    });
    if args.json {
        println!("{stats}");
        return Ok(());
    }
    println!("index:            {}", path.display());
    for key in [
        "sessions",
        "messages",
        "chunks",
        "vectors",
        "tokens_embedded",
        "cached_embeddings",
    ] {
        println!(
            "{:<17} {}",
            format!("{}:", key.replace('_', " ")),
            stats[key]
        );
    }
    if counts.capped_messages > 0 {
        println!(
            "cut short:        {} messages over {} chunks ({:.1} MB of their text not indexed)",
            counts.capped_messages,
            index::chunk::MAX_CHUNKS_PER_MESSAGE,
            counts.skipped_bytes as f64 / 1e6
        );
    }
    println!("size:             {:.1} MB", size as f64 / 1e6);
    if let Some(id) = store.identity()? {
        println!(
            "model:            {} {} ({} dims{}), chunks of {} tokens, overlap {}",
            id.model,
            id.revision,
            id.dimension,
            if id.sparse { ", sparse" } else { "" },
            id.chunk_tokens,
            id.chunk_overlap
        );
    }
    match last {
        Some(t) => println!("last indexed:     {:.0} s ago", index::unix_now() - t),
        None => println!("last indexed:     never"),
    }
    println!(
        "behind Hermes:    {lag} messages{}",
        if lag > 0 { " (run `recall index`)" } else { "" }
    );
    Ok(())
}

/// Message ids for a warning: `4, 8, 15`.
fn id_list(ids: &[i64]) -> String {
    ids.iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What to do when recall's engine has no model to load (`why`).
fn no_model(why: &str) -> String {
    format!(
        "recall's engine cannot load its model: {why}\n\
         Give it one: --model DIR (or RECALL_MODEL) names a model directory \
         (config.json, tokenizer.json and the weights, as downloaded from Hugging Face; \
         a small one such as sentence-transformers/all-MiniLM-L6-v2 is enough to try recall), \
         `recall model fetch` downloads BAAI/bge-m3 (2.3 GB; HF_ENDPOINT for a mirror), \
         and `recall model export` / `recall model import` bring it from another machine."
    )
}

/// Ctrl-C during indexing: what was committed is kept (every write is a
/// transaction), so the process ends at once, saying how far it got.
mod interrupt {
    use std::sync::atomic::{AtomicUsize, Ordering};

    static DONE: AtomicUsize = AtomicUsize::new(0);
    static TOTAL: AtomicUsize = AtomicUsize::new(0);

    /// Messages embedded so far of those this run embeds.
    pub fn progress(done: usize, total: usize) {
        DONE.store(done, Ordering::Relaxed);
        TOTAL.store(total, Ordering::Relaxed);
    }

    /// From now on, SIGINT prints how far indexing got and exits 130.
    pub fn report_on_ctrl_c() {
        #[cfg(unix)]
        // SAFETY: `on_sigint` only reads atomics, writes to a stack buffer
        // and calls write(2) and _exit(2), which are async-signal-safe.
        unsafe {
            libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
        }
    }

    #[cfg(unix)]
    extern "C" fn on_sigint(_: libc::c_int) {
        let mut line = Line::default();
        let total = TOTAL.load(Ordering::Relaxed);
        if total == 0 {
            line.push(b"\ninterrupted before embedding began: run `recall index` again\n");
        } else {
            line.push(b"\ninterrupted after embedding ");
            line.number(DONE.load(Ordering::Relaxed));
            line.push(b" of ");
            line.number(total);
            line.push(b" messages; what was written is kept: run `recall index` again to go on\n");
        }
        // SAFETY: write(2) from a valid buffer of `len` bytes, then _exit(2).
        unsafe {
            libc::write(2, line.bytes.as_ptr().cast(), line.len);
            libc::_exit(130);
        }
    }

    /// A line built without allocating (a signal handler may not).
    struct Line {
        bytes: [u8; 160],
        len: usize,
    }

    impl Default for Line {
        fn default() -> Self {
            Self {
                bytes: [0; 160],
                len: 0,
            }
        }
    }

    impl Line {
        fn push(&mut self, text: &[u8]) {
            let n = text.len().min(self.bytes.len() - self.len);
            self.bytes[self.len..self.len + n].copy_from_slice(&text[..n]);
            self.len += n;
        }

        fn number(&mut self, mut n: usize) {
            let mut digits = [0u8; 20];
            let mut at = digits.len();
            loop {
                at -= 1;
                digits[at] = b'0' + (n % 10) as u8;
                n /= 10;
                if n == 0 {
                    break;
                }
            }
            self.push(&digits[at..]);
        }
    }
}
