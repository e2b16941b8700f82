//! `recall index`: Hermes sessions → chunks → embeddings → the index.
//!
//! Each run compares what Hermes holds with what the index holds, by a
//! fingerprint per message, and embeds only what is new or changed; what
//! Hermes deleted is deleted. Messages are embedded in length-sorted groups;
//! a writer thread commits one group while the model embeds the next.

mod admission;
pub mod chunk;
pub mod guard;
pub mod reads;
mod snapshot;
mod stage;
pub mod store;

pub use admission::{Embedders, NotEmbedded, QueryEmbedder, query_provider};
pub use snapshot::lineage_root;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::provider::{Chain, Input};
use crate::source::hermes::{HIDDEN_SOURCES, Message, Profile, Selection, Session, StateDb};
use crate::space::Identity;
use chunk::{ChunkParams, Chunker};
use recall_engine::Embedder;
use snapshot::{fingerprint, read_profile, up_to_date};
use stage::Stage;
use store::{SessionRow, Store};

#[derive(Debug, Clone)]
pub struct IndexOptions {
    pub selection: Selection,
    pub chunk: ChunkParams,
    pub rebuild: bool,
}

/// What a run did, for the `--json` summary and the progress line.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub profiles: Vec<String>,
    pub sessions: usize,
    pub messages: usize,
    pub embedded_messages: usize,
    pub deleted_messages: usize,
    pub unchanged_messages: usize,
    pub chunks: usize,
    pub cached_chunks: usize,
    pub tokens: usize,
    pub truncated_chunks: usize,
    pub session_file_messages: usize,
    pub malformed_lines: usize,
    pub seconds: f64,
    pub tokens_per_second: f64,
    /// Time spent in the model alone: the rest is the pipeline's cost.
    pub embed_seconds: f64,
    /// Chunks each provider embedded in this run.
    pub embedded_by: std::collections::BTreeMap<String, usize>,
    /// Set when no provider of the index's space could embed: what was
    /// done is kept, and `pending_messages` wait for the next run.
    pub paused: Option<String>,
    pub pending_messages: usize,
    /// Messages a provider refused (an input too long, a content filter):
    /// left out of this run, tried again in the next.
    pub rejected_messages: usize,
    /// Session titles embedded in this run (search scores sessions by them too).
    pub titles_embedded: usize,
    /// Messages whose content was not UTF-8 text or whose timestamp was no
    /// number in Hermes's database: indexed with the bad bytes replaced (or
    /// time 0), never stopping the run. The first ten ids.
    pub repaired_messages: usize,
    pub repaired_ids: Vec<i64>,
    /// Messages longer than `chunk::MAX_CHUNKS_PER_MESSAGE` chunks, indexed
    /// up to there (the rest counted in the index): the first ten ids.
    pub capped_messages: usize,
    pub capped_ids: Vec<i64>,
}

/// Progress as work is done: (messages done, messages to do, chunks done, tokens done).
pub type ProgressFn<'a> = &'a (dyn Fn(usize, usize, usize, usize) + Sync);

/// The identity an index built by `embedder` with `chunk` has.
pub fn identity(embedder: &Embedder, chunk: ChunkParams) -> Identity {
    crate::provider::local::identity_of(embedder, None).chunked(chunk.window, chunk.overlap)
}

/// Indexes `profiles` into `store`, embedding with the first provider of
/// `chain` that can (see `Embedders`).
pub fn run(
    chain: &Chain,
    store: &mut Store,
    profiles: &[Profile],
    options: &IndexOptions,
    progress: ProgressFn,
) -> Result<Report> {
    let started = Instant::now();
    let _one_at_a_time = RunLock::take(store.path())?;
    let chunker = match chain.tokenizer() {
        Some(tokenizer) => Chunker::Tokens(tokenizer),
        None => Chunker::Estimate,
    };
    chunker.check(options.chunk)?;
    let mut report = Report::default();
    let bound = match bound_identity(chain, store, options)? {
        Ok(identity) => identity,
        Err(unavailable) => {
            report.paused = Some(unavailable);
            for profile in profiles {
                report.pending_messages +=
                    read_profile(profile, &options.selection)?.messages.len();
            }
            report.seconds = started.elapsed().as_secs_f64();
            return Ok(report);
        }
    };
    if (bound.chunk_tokens, bound.chunk_overlap) != (options.chunk.window, options.chunk.overlap) {
        bail!(
            "the index {} was cut into chunks of {} tokens (overlap {}), not {} (overlap {}): \
             chunks of two sizes are never mixed. Run `recall index --rebuild` to cut and embed everything again.",
            store.path().display(),
            bound.chunk_tokens,
            bound.chunk_overlap,
            options.chunk.window,
            options.chunk.overlap
        );
    }
    let embedders = Embedders::new(chain, &bound, store)?;
    embedders.refuse_if_none_fits()?;
    // The local engine may write here: it records its model and, for a
    // BGE-M3 index, re-embeds what a fallback stored without sparse weights.
    let local_fits = embedders.local_fits();
    if let Some(dir) = chain.model_dir().filter(|_| local_fits) {
        // Later runs and searches without --model use the same directory.
        store.set_model_dir(dir)?;
    }
    let namespace = bound.embedding_key();

    for profile in profiles {
        let snapshot = read_profile(profile, &options.selection)
            .with_context(|| format!("cannot read Hermes profile {:?}", profile.name))?;
        report.count_snapshot(&profile.name, &snapshot);
        let rows = session_rows(&snapshot.sessions);
        store.put_sessions(&profile.name, &rows)?;
        let indexed = store.fingerprints(&profile.name)?;
        report.deleted_messages += remove_gone(store, &profile.name, &indexed, &snapshot.messages)?;
        let seen = snapshot.messages.len();
        let todo = changed(snapshot.messages, &indexed, bound.sparse && local_fits);
        report.unchanged_messages += seen - todo.len();
        if report.paused.is_some() {
            report.pending_messages += todo.len();
            continue;
        }
        let stage = Stage {
            embedders: &embedders,
            chunker,
            namespace: &namespace,
            sparse: bound.sparse,
        };
        stage.run(store, &profile.name, todo, options, progress, &mut report)?;
        if report.paused.is_none() {
            embed_titles(store, &embedders, &profile.name, &rows, &mut report)?;
        }
    }
    if report.paused.is_none() {
        store.set_last_indexed_at(unix_now())?;
    }
    report.seconds = started.elapsed().as_secs_f64();
    report.tokens_per_second = if report.seconds > 0.0 {
        report.tokens as f64 / report.seconds
    } else {
        0.0
    };
    Ok(report)
}

impl Report {
    /// Counts what a profile's snapshot holds.
    fn count_snapshot(&mut self, profile: &str, snapshot: &snapshot::Snapshot) {
        self.profiles.push(profile.to_string());
        self.sessions += snapshot.sessions.len();
        self.messages += snapshot.messages.len();
        self.session_file_messages += snapshot.file_messages;
        self.malformed_lines += snapshot.malformed_lines;
        self.repaired_messages += snapshot.repaired.len();
        // The first ten are named in the warning.
        let room = 10usize.saturating_sub(self.repaired_ids.len());
        self.repaired_ids
            .extend(snapshot.repaired.iter().take(room));
    }
}

/// The identity the index is bound to: its own, or for a new (or rebuilt)
/// one the chain's first provider's, bound now. A new index takes the
/// space of the chain's first provider, never of whichever answers (a cloud
/// fallback would be sent the whole history): why not, when that provider
/// is unavailable (the run pauses).
fn bound_identity(
    chain: &Chain,
    store: &mut Store,
    options: &IndexOptions,
) -> Result<Result<Identity, String>> {
    if !options.rebuild
        && let Some(identity) = store.identity()?
    {
        return Ok(Ok(identity));
    }
    match chain.providers().first().map(|p| (p, p.identity())) {
        Some((_, Ok(identity))) => {
            let identity = identity.chunked(options.chunk.window, options.chunk.overlap);
            store.bind(&identity, options.rebuild)?;
            Ok(Ok(identity))
        }
        Some((first, Err(e))) => Ok(Err(format!(
            "a new index takes the vector space of the chain's first provider, {}, which is unavailable: {e:#}\n\
             (to build it with another provider, name that one first: --provider NAME)",
            first.name()
        ))),
        None => bail!("the provider chain is empty"),
    }
}

/// The sessions of a profile as the store keeps them: with their lineage
/// and whether Hermes hides them.
fn session_rows(sessions: &HashMap<String, Session>) -> Vec<SessionRow> {
    sessions
        .values()
        .map(|s| SessionRow {
            session: s.clone(),
            lineage_root: lineage_root(&s.id, sessions),
            hidden: HIDDEN_SOURCES.contains(&s.source.as_str()),
        })
        .collect()
}

/// Deletes the indexed messages Hermes no longer has; how many.
fn remove_gone(
    store: &mut Store,
    profile: &str,
    indexed: &HashMap<i64, String>,
    messages: &[Message],
) -> Result<usize> {
    let current: HashSet<i64> = messages.iter().map(|m| m.id).collect();
    let gone: Vec<i64> = indexed
        .keys()
        .copied()
        .filter(|id| !current.contains(id))
        .collect();
    store.delete_messages(profile, &gone)?;
    Ok(gone.len())
}

/// The messages new or changed since they were indexed, with their
/// fingerprints (`sparse`: a message a fallback embedded without sparse
/// weights is changed too).
fn changed(
    messages: Vec<Message>,
    indexed: &HashMap<i64, String>,
    sparse: bool,
) -> Vec<(Message, String)> {
    messages
        .into_iter()
        .map(|m| {
            let fp = fingerprint(&m);
            (m, fp)
        })
        .filter(|(m, fp)| !up_to_date(indexed.get(&m.id), fp, sparse))
        .collect()
}

/// One indexing run per index at a time: two at once would each embed
/// everything (the result correct, the work doubled). A second run waits
/// for the first, then finds little left to do. An advisory lock on
/// `<index>.indexing`, released when the run ends (or its process dies).
struct RunLock {
    _held: std::fs::File,
}

impl RunLock {
    fn take(index: &Path) -> Result<Self> {
        let mut path = index.as_os_str().to_os_string();
        path.push(".indexing");
        let path = std::path::PathBuf::from(path);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        if file.try_lock().is_err() {
            tracing::info!(
                "another recall is indexing into {}: waiting for it to finish",
                index.display()
            );
            file.lock()
                .with_context(|| format!("cannot lock {}", path.display()))?;
        }
        Ok(Self { _held: file })
    }
}

/// Longest title embedded, in characters (Hermes caps its own at 100).
const TITLE_CHARS: usize = 200;

/// Embeds the titles of `profile`'s visible sessions that the index lacks
/// or holds in an older wording, and drops those of sessions gone or
/// untitled: search scores a session by its title too. Titles that no
/// provider can embed now are left for the next run.
fn embed_titles(
    store: &mut Store,
    embedders: &Embedders,
    profile: &str,
    sessions: &[SessionRow],
    report: &mut Report,
) -> Result<()> {
    let held = store.titles(profile)?;
    let wanted: HashMap<&str, String> = sessions
        .iter()
        .filter(|row| !row.hidden)
        .filter_map(|row| {
            let title = row.session.title.as_deref()?.trim();
            (!title.is_empty()).then(|| {
                let title: String = title.chars().take(TITLE_CHARS).collect();
                (row.session.id.as_str(), title)
            })
        })
        .collect();
    let remove: Vec<String> = held
        .keys()
        .filter(|id| !wanted.contains_key(id.as_str()))
        .cloned()
        .collect();
    let mut todo: Vec<(&str, &String)> = wanted
        .iter()
        .filter(|(id, title)| held.get(**id) != Some(*title))
        .map(|(id, title)| (*id, title))
        .collect();
    todo.sort();
    let mut put = Vec::with_capacity(todo.len());
    for batch in todo.chunks(256) {
        let inputs: Vec<Input> = batch
            .iter()
            .map(|(_, title)| Input {
                text: title,
                tokens: None,
            })
            .collect();
        match embedders.embed(&inputs, false) {
            Ok((vectors, _)) => put.extend(
                batch
                    .iter()
                    .zip(vectors)
                    .map(|((id, title), v)| (id.to_string(), (*title).clone(), v.dense)),
            ),
            Err(NotEmbedded::Unavailable(why) | NotEmbedded::Rejected(why)) => {
                tracing::warn!("session titles not embedded this run: {why}");
                break;
            }
        }
    }
    report.titles_embedded += put.len();
    store.put_titles(profile, &remove, &put)
}

pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
}

/// The default index location: `$HERMES_HOME/recall/index.db`.
pub fn default_index_path(hermes_home: &Path) -> std::path::PathBuf {
    hermes_home.join("recall").join("index.db")
}

/// Checked before an index is created or written: `index` is none of the
/// profiles' Hermes databases, and each of those that exists opens (so
/// that a failed first run leaves no empty index behind).
pub fn check_sources(index: &Path, profiles: &[Profile]) -> Result<()> {
    for profile in profiles {
        let state_db = profile.state_db();
        if same_file(index, &state_db) {
            bail!(
                "the index {} is Hermes's own database (profile {:?}): recall only ever reads it. \
                 Leave out --index to use the default ({}), or name a new file.",
                index.display(),
                profile.name,
                default_index_path(&profile.home).display()
            );
        }
        if state_db.exists() {
            StateDb::open(&state_db)
                .with_context(|| format!("cannot read Hermes profile {:?}", profile.name))?;
        }
    }
    Ok(())
}

/// Whether two paths name one file (either may not exist yet).
fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Messages Hermes has written since the newest one in the index, over
/// `profiles`, and when the first of them was written: a look cheap enough
/// for every search (one query per profile). Edits and deletions of older
/// messages are not seen; `lag` counts everything.
pub fn behind(
    store: &Store,
    profiles: &[Profile],
    selection: &Selection,
) -> Result<Option<(usize, f64)>> {
    let mut count = 0;
    let mut first: Option<f64> = None;
    for profile in profiles {
        let state_db = profile.state_db();
        if !state_db.exists() {
            continue;
        }
        let db = StateDb::open(&state_db)?;
        let (n, since) = db.newer_than(store.last_message_id(&profile.name)?, selection)?;
        count += n;
        first = match (first, since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    Ok((count > 0).then(|| (count, first.unwrap_or(0.0))))
}

/// Messages in Hermes that the index does not hold as they are now.
pub fn lag(store: &Store, profiles: &[Profile], selection: &Selection) -> Result<usize> {
    let mut behind = 0;
    for profile in profiles {
        let snapshot = read_profile(profile, selection)?;
        let indexed = store.fingerprints(&profile.name)?;
        let current: HashSet<i64> = snapshot.messages.iter().map(|m| m.id).collect();
        behind += indexed.keys().filter(|id| !current.contains(id)).count();
        behind += snapshot
            .messages
            .iter()
            .filter(|m| !up_to_date(indexed.get(&m.id), &fingerprint(m), false))
            .count();
    }
    Ok(behind)
}
