//! `recall index`: Hermes sessions → chunks → embeddings → the index.
//!
//! Each run compares what Hermes holds with what the index holds, by a
//! fingerprint per message, and embeds only what is new or changed; what
//! Hermes deleted is deleted. Messages are embedded in length-sorted groups;
//! a writer thread commits one group while the model embeds the next.

pub mod chunk;
pub mod guard;
pub mod reads;
pub mod store;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rayon::prelude::*;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::embedder::Embedder;
use crate::provider::{Chain, Input, Provider, SAME_SPACE_COSINE, Unavailable, Vector};
use crate::source::files;
use crate::source::hermes::{HIDDEN_SOURCES, Message, Profile, Selection, Session, StateDb};
use crate::space::Identity;
use crate::tokenize::Tokens;
use chunk::{ChunkParams, Chunker};
use store::{ChunkRow, MessageRow, SessionRow, Store};

/// Tokens embedded per group (one writer transaction per group).
const GROUP_TOKENS: usize = 16_384;

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
}

/// Progress as work is done: (messages done, messages to do, chunks done, tokens done).
pub type ProgressFn<'a> = &'a (dyn Fn(usize, usize, usize, usize) + Sync);

/// The identity an index built by `embedder` with `chunk` has.
pub fn identity(embedder: &Embedder, chunk: ChunkParams) -> Identity {
    crate::provider::local::identity_of(embedder, None).chunked(chunk.window, chunk.overlap)
}

fn fingerprint(m: &Message) -> String {
    let mut h = Sha256::new();
    for part in [
        m.session_id.as_str(),
        m.role.as_str(),
        &m.timestamp.to_string(),
        m.text.as_str(),
    ] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    h.finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Follows `parent_session_id` to the first session of the chain (cycle-safe).
pub fn lineage_root(id: &str, sessions: &HashMap<String, Session>) -> String {
    let mut current = id.to_string();
    let mut seen = HashSet::new();
    while let Some(parent) = sessions.get(&current).and_then(|s| s.parent.clone()) {
        if !seen.insert(current.clone()) || !sessions.contains_key(&parent) {
            break;
        }
        current = parent;
    }
    current
}

/// What one profile's source holds now.
struct Snapshot {
    sessions: HashMap<String, Session>,
    messages: Vec<Message>,
    file_messages: usize,
    malformed_lines: usize,
    /// Messages read with bytes or a timestamp repaired (`StateDb::repaired`).
    repaired: Vec<i64>,
}

fn read_profile(profile: &Profile, selection: &Selection) -> Result<Snapshot> {
    let db = StateDb::open(&profile.state_db())?;
    let mut sessions = db.sessions()?;
    let mut messages = Vec::new();
    db.messages(selection, |m| messages.push(m))?;
    let repaired = db.repaired();
    drop(db);
    let from_files = files::read(&profile.home, &sessions, selection);
    let file_messages = from_files.messages.len();
    for s in from_files.sessions {
        sessions.insert(s.id.clone(), s);
    }
    messages.extend(from_files.messages);
    Ok(Snapshot {
        sessions,
        messages,
        file_messages,
        malformed_lines: from_files.malformed_lines,
        repaired,
    })
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
    let local = chain.local();
    let chunker = match &local {
        Some(e) => Chunker::Tokens(e.tokenizer()),
        None => Chunker::Estimate,
    };
    chunker.check(options.chunk)?;
    let mut report = Report::default();
    let existing = if options.rebuild {
        None
    } else {
        store.identity()?
    };
    let bound = match existing {
        Some(identity) => identity,
        // A new index takes the space of the chain's first provider, never of
        // whichever answers (a cloud fallback would be sent the whole history).
        None => match chain.providers().first().map(|p| (p, p.identity())) {
            Some((_, Ok(identity))) => {
                let identity = identity.chunked(options.chunk.window, options.chunk.overlap);
                store.bind(&identity, options.rebuild)?;
                identity
            }
            Some((first, Err(e))) => {
                report.paused = Some(format!(
                    "a new index takes the vector space of the chain's first provider, {}, which is unavailable: {e:#}\n\
                     (to build it with another provider, name that one first: --provider NAME)",
                    first.name()
                ));
                for profile in profiles {
                    report.pending_messages +=
                        read_profile(profile, &options.selection)?.messages.len();
                }
                report.seconds = started.elapsed().as_secs_f64();
                return Ok(report);
            }
            None => bail!("the provider chain is empty"),
        },
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
    if let Some(e) = local.as_ref().filter(|_| local_fits) {
        // Later runs and searches without --model use the same directory.
        let dir = &e.info().dir;
        store.set_meta(
            "model_dir",
            &dir.canonicalize()
                .unwrap_or_else(|_| dir.clone())
                .to_string_lossy(),
        )?;
    }
    let namespace = bound.embedding_key();

    for profile in profiles {
        let snapshot = read_profile(profile, &options.selection)
            .with_context(|| format!("cannot read Hermes profile {:?}", profile.name))?;
        report.profiles.push(profile.name.clone());
        report.sessions += snapshot.sessions.len();
        report.messages += snapshot.messages.len();
        report.session_file_messages += snapshot.file_messages;
        report.malformed_lines += snapshot.malformed_lines;
        report.repaired_messages += snapshot.repaired.len();
        let room = 10usize.saturating_sub(report.repaired_ids.len());
        report
            .repaired_ids
            .extend(snapshot.repaired.iter().take(room));

        let rows: Vec<SessionRow> = snapshot
            .sessions
            .values()
            .map(|s| SessionRow {
                session: s.clone(),
                lineage_root: lineage_root(&s.id, &snapshot.sessions),
                hidden: HIDDEN_SOURCES.contains(&s.source.as_str()),
            })
            .collect();
        store.put_sessions(&profile.name, &rows)?;

        let indexed = store.fingerprints(&profile.name)?;
        let current: HashSet<i64> = snapshot.messages.iter().map(|m| m.id).collect();
        let gone: Vec<i64> = indexed
            .keys()
            .copied()
            .filter(|id| !current.contains(id))
            .collect();
        store.delete_messages(&profile.name, &gone)?;
        report.deleted_messages += gone.len();

        let seen = snapshot.messages.len();
        let todo: Vec<(Message, String)> = snapshot
            .messages
            .into_iter()
            .map(|m| {
                let fp = fingerprint(&m);
                (m, fp)
            })
            .filter(|(m, fp)| !up_to_date(indexed.get(&m.id), fp, bound.sparse && local_fits))
            .collect();
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
        store.set_meta("last_indexed_at", &format!("{:.3}", unix_now()))?;
    }
    // Large indexes are searched through the code file: bring it up to date
    // now rather than in the first search. Without it search is slower, not wrong.
    if crate::search::binary::approximate_len(store)? >= crate::search::vector::EXACT_BELOW
        && let Err(e) = crate::search::binary::CodeFile::open(store)
    {
        tracing::warn!("{e:#}");
    }
    report.seconds = started.elapsed().as_secs_f64();
    report.tokens_per_second = if report.seconds > 0.0 {
        report.tokens as f64 / report.seconds
    } else {
        0.0
    };
    Ok(report)
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

/// The chain's providers that may write into an index bound to `bound`,
/// in order: those of its space (and, for recall's own engine, its very
/// model), each checked once against vectors already stored before its
/// first use. A group is embedded by the first that succeeds.
pub struct Embedders<'a> {
    chain: &'a Chain,
    bound: &'a Identity,
    /// Stored passages and their vectors, to check a provider other than the index's builder.
    sample: Vec<(String, Vec<f32>)>,
    /// Provider name → None (may write) or why it may not.
    checked: std::sync::Mutex<HashMap<String, Option<Refusal>>>,
}

/// Why a provider may not write into an index.
#[derive(Clone)]
struct Refusal {
    why: String,
    /// Another space or model: it never will (not a check that failed now).
    other_model: bool,
}

impl<'a> Embedders<'a> {
    pub fn new(chain: &'a Chain, bound: &'a Identity, store: &Store) -> Result<Self> {
        Ok(Self {
            chain,
            bound,
            sample: store.sample_vectors(3)?,
            checked: Default::default(),
        })
    }

    /// Whether the chain's local engine loads and may write into the index.
    fn local_fits(&self) -> bool {
        self.chain
            .providers()
            .iter()
            .filter(|p| p.kind() == crate::provider::Kind::Local)
            .any(|p| self.may_write(p.as_ref()).is_ok() && p.local().is_some())
    }

    /// Whether `p` may write into (and search) the index now; why not otherwise.
    pub fn may_write(&self, p: &dyn Provider) -> Result<(), String> {
        if let Some(verdict) = self.checked.lock().unwrap().get(p.name()) {
            return verdict.as_ref().map_or(Ok(()), |r| Err(r.why.clone()));
        }
        let identity = p
            .identity()
            .map_err(|e| format!("{e:#}"))?
            .chunked(self.bound.chunk_tokens, self.bound.chunk_overlap);
        let verdict = if !self.bound.accepts(&identity) {
            let what = if identity.space() == self.bound.space() {
                "another model of the same name".to_string()
            } else {
                format!(
                    "another vector space ({}; the index is {})",
                    identity.space(),
                    self.bound.space()
                )
            };
            Some(Refusal {
                why: format!(
                    "{what}, and vectors of two models are never mixed in one index:\n    {}",
                    self.bound.differences(&identity).join("\n    ")
                ),
                other_model: true,
            })
        } else if identity.embedding_key() != self.bound.embedding_key() {
            // Same name, same width, another provider: check that it really
            // gives the vectors the index holds. Failing to answer is not a verdict.
            match self.same_vectors(p) {
                Ok(()) => None,
                Err(NotSame::Unanswered(why)) => return Err(why),
                Err(NotSame::Different(why)) => Some(Refusal {
                    why,
                    other_model: false,
                }),
            }
        } else {
            None
        };
        // Unavailable providers are asked again next time; verdicts stay.
        self.checked
            .lock()
            .unwrap()
            .insert(p.name().to_string(), verdict.clone());
        verdict.map_or(Ok(()), |r| Err(r.why))
    }

    /// Whether `p` gives the vectors stored for the sample passages.
    fn same_vectors(&self, p: &dyn Provider) -> Result<(), NotSame> {
        if self.sample.is_empty() {
            return Ok(());
        }
        let inputs: Vec<Input> = self
            .sample
            .iter()
            .map(|(text, _)| Input { text, tokens: None })
            .collect();
        let vectors = p
            .embed(&inputs, false)
            .map_err(|e| NotSame::Unanswered(format!("{e:#}")))?;
        let mean = self
            .sample
            .iter()
            .zip(&vectors)
            .map(|((_, stored), v)| cosine(stored, &v.dense))
            .sum::<f32>()
            / self.sample.len() as f32;
        if mean.is_nan() || mean < SAME_SPACE_COSINE {
            return Err(NotSame::Different(format!(
                "its vectors are not the index's: mean cosine {mean:.3} over {} stored passages (at least {SAME_SPACE_COSINE} needed); \
                 another model behind the same name? Set its `space` in config.toml, or rebuild the index with it",
                self.sample.len()
            )));
        }
        tracing::info!(
            "{}: mean cosine {mean:.5} to the index's own vectors",
            p.name()
        );
        Ok(())
    }

    /// Embeds `inputs` with the first provider that may and can; the provider's name.
    pub fn embed(
        &self,
        inputs: &[Input],
        sparse: bool,
    ) -> Result<(Vec<Vector>, String), NotEmbedded> {
        let mut reasons = Vec::new();
        let mut rejected = false;
        for p in self.chain.providers() {
            if let Err(why) = self.may_write(p.as_ref()) {
                reasons.push((p.name().to_string(), why));
                continue;
            }
            match p.embed(inputs, sparse) {
                Ok(v)
                    if v.len() == inputs.len()
                        && v.iter().all(|v| v.dense.len() == self.bound.dimension) =>
                {
                    return Ok((v, p.name().to_string()));
                }
                Ok(_) => reasons.push((
                    p.name().into(),
                    "returned vectors of the wrong count or width".into(),
                )),
                Err(e) => {
                    tracing::warn!("{}: {e:#}", p.name());
                    rejected |= e
                        .downcast_ref::<crate::provider::http::Rejected>()
                        .is_some();
                    reasons.push((p.name().to_string(), format!("{e:#}")));
                }
            }
        }
        let unavailable = Unavailable {
            space: Some(self.bound.space()),
            reasons,
        };
        Err(if rejected {
            NotEmbedded::Rejected(unavailable)
        } else {
            NotEmbedded::Unavailable(unavailable)
        })
    }

    /// The embedding cache namespace of provider `name`'s vectors.
    fn namespace_of(&self, name: &str) -> String {
        self.chain
            .providers()
            .iter()
            .find(|p| p.name() == name)
            .and_then(|p| p.identity().ok())
            .map_or_else(|| self.bound.embedding_key(), |i| i.embedding_key())
    }

    /// Fails, naming each provider's difference, when no provider of the
    /// chain could ever write into this index (all of another space or model).
    pub fn refuse_if_none_fits(&self) -> Result<()> {
        // In order, stopping at the first that fits: fallbacks are asked only when needed.
        let mut reasons = Vec::new();
        for p in self.chain.providers() {
            match self.may_write(p.as_ref()) {
                Ok(()) => return Ok(()),
                Err(why) => reasons.push((p.name().to_string(), why)),
            }
        }
        if self.none_of_this_space() {
            bail!(
                "{}\nRun `recall index --rebuild` to re-embed everything with the current provider \
                 (the embedding cache keeps what was already computed for it).",
                Unavailable {
                    space: Some(self.bound.space()),
                    reasons,
                }
            );
        }
        Ok(())
    }

    /// Whether no provider of the chain could ever write into this index (all of another space).
    pub fn none_of_this_space(&self) -> bool {
        let checked = self.checked.lock().unwrap();
        self.chain.providers().iter().all(|p| {
            checked
                .get(p.name())
                .is_some_and(|v| v.as_ref().is_some_and(|r| r.other_model))
        })
    }
}

pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
}

/// Why `Embedders::embed` gave nothing.
pub enum NotEmbedded {
    /// No provider could work now: pause.
    Unavailable(Unavailable),
    /// A provider refused these inputs themselves (one of them, likely):
    /// look for it, skip it, go on.
    Rejected(Unavailable),
}

/// Marks a message of a sparse (BGE-M3) index that a fallback without
/// sparse weights embedded: the local engine embeds it again when it can.
const DENSE_ONLY: &str = "~dense";

/// Whether the index holds `fingerprint` as it is now (`indexed`), counting
/// a message a fallback embedded without sparse weights as done unless the
/// local engine can `upgrade` it.
fn up_to_date(indexed: Option<&String>, fingerprint: &str, upgrade: bool) -> bool {
    match indexed {
        Some(held) if held == fingerprint => true,
        Some(held) => !upgrade && held.strip_suffix(DENSE_ONLY) == Some(fingerprint),
        None => false,
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot = crate::score::dense(a, b);
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b)).max(f32::MIN_POSITIVE)
}

/// A message cut into chunks, with what is known of their embeddings.
struct Pending {
    message: Message,
    fingerprint: String,
    chunks: Vec<PendingChunk>,
}

struct PendingChunk {
    text: String,
    /// Token ids when recall's own tokenizer cut the chunk.
    tokens: Option<Tokens>,
    token_count: usize,
    cached: Option<ChunkRow>,
}

/// Messages chunked, embedded and written per wave: early commits, bounded memory.
const WAVE_MESSAGES: usize = 512;

/// Length-sorted groups of about `GROUP_TOKENS` tokens.
fn groups(mut pending: Vec<Pending>) -> Vec<Vec<Pending>> {
    let size = |p: &Pending| p.chunks.iter().map(|c| c.token_count).sum::<usize>();
    pending.sort_by_key(|p| std::cmp::Reverse(size(p)));
    let mut groups: Vec<Vec<Pending>> = Vec::new();
    let mut tokens_in_group = usize::MAX;
    for p in pending {
        let n = size(&p);
        if tokens_in_group.saturating_add(n) > GROUP_TOKENS {
            groups.push(Vec::new());
            tokens_in_group = 0;
        }
        tokens_in_group += n;
        groups.last_mut().unwrap().push(p);
    }
    groups
}

/// The embedding stage of one run: chunk, look up the cache, embed the
/// rest with the chain, hand rows to the writer.
struct Stage<'a> {
    embedders: &'a Embedders<'a>,
    chunker: Chunker<'a>,
    /// The index builder's cache namespace: the cache is read under it.
    namespace: &'a str,
    sparse: bool,
}

impl Stage<'_> {
    /// Chunks and tokenises `wave`, taking what the cache has.
    fn prepare(
        &self,
        wave: Vec<(Message, String)>,
        cache: &Store,
        params: ChunkParams,
    ) -> Result<Vec<Pending>> {
        let mut pending: Vec<Pending> = wave
            .into_par_iter()
            .map(|(message, fingerprint)| -> Result<Pending> {
                let chunks = self
                    .chunker
                    .chunk(&message.text, params)?
                    .into_iter()
                    .map(|text| {
                        let tokens = match self.chunker {
                            Chunker::Tokens(t) => Some(t.encode(&text)?),
                            Chunker::Estimate => None,
                        };
                        let token_count = tokens.as_ref().map_or_else(
                            || crate::tokenize::estimate_tokens(&text),
                            |t| t.ids.len(),
                        );
                        Ok(PendingChunk {
                            text,
                            tokens,
                            token_count,
                            cached: None,
                        })
                    })
                    .collect::<Result<_>>()?;
                Ok(Pending {
                    message,
                    fingerprint,
                    chunks,
                })
            })
            .collect::<Result<_>>()?;
        for p in &mut pending {
            for c in &mut p.chunks {
                c.cached = cache.cached(self.namespace, &c.text, c.token_count)?;
            }
        }
        Ok(pending)
    }

    /// Embeds what `group` lacks and assembles its rows, in batches with the
    /// cache namespace of the provider that embedded them. When a provider
    /// refuses the group, it is halved until the message it refuses is
    /// found; that message is left out (and counted), the rest go on.
    fn embed_group(
        &self,
        mut group: Vec<Pending>,
        report: &mut Report,
    ) -> Result<Vec<(Vec<MessageRow>, String)>, Unavailable> {
        match self.embed_whole(&mut group, report) {
            Ok(rows) => Ok(vec![rows]),
            Err(NotEmbedded::Unavailable(u)) => Err(u),
            Err(NotEmbedded::Rejected(why)) if group.len() == 1 => {
                report.rejected_messages += 1;
                tracing::warn!(
                    "message {} of session {} left out: {why}",
                    group[0].message.id,
                    group[0].message.session_id
                );
                Ok(Vec::new())
            }
            Err(NotEmbedded::Rejected(_)) => {
                let second = group.split_off(group.len() / 2);
                let mut rows = self.embed_group(group, report)?;
                rows.extend(self.embed_group(second, report)?);
                Ok(rows)
            }
        }
    }

    /// `embed_group` in one call: the group is left as it was on failure.
    fn embed_whole(
        &self,
        group: &mut Vec<Pending>,
        report: &mut Report,
    ) -> Result<(Vec<MessageRow>, String), NotEmbedded> {
        let missing: Vec<Input> = group
            .iter()
            .flat_map(|p| p.chunks.iter().filter(|c| c.cached.is_none()))
            .map(|c| Input {
                text: &c.text,
                tokens: c.tokens.as_ref(),
            })
            .collect();
        let (vectors, by) = if missing.is_empty() {
            (Vec::new(), None)
        } else {
            let (v, by) = self.embedders.embed(&missing, self.sparse)?;
            *report.embedded_by.entry(by.clone()).or_default() += v.len();
            (v, Some(by))
        };
        let namespace = match by.as_deref() {
            Some(name) => self.embedders.namespace_of(name),
            None => self.namespace.to_string(),
        };
        let mut embedded = vectors.into_iter();
        let mut rows = Vec::with_capacity(group.len());
        for p in std::mem::take(group) {
            let mut chunks = Vec::with_capacity(p.chunks.len());
            for c in p.chunks {
                report.chunks += 1;
                report.truncated_chunks += c.tokens.as_ref().is_some_and(|t| t.truncated) as usize;
                let row = match c.cached {
                    Some(row) => {
                        report.cached_chunks += 1;
                        row
                    }
                    None => {
                        // `embed` checked there is one vector per input.
                        let v = embedded.next().expect("one vector per input");
                        report.tokens += v.tokens;
                        ChunkRow {
                            text: c.text,
                            tokens: v.tokens,
                            dense: v.dense,
                            sparse: v.sparse,
                        }
                    }
                };
                chunks.push(row);
            }
            let dense_only = self.sparse && chunks.iter().any(|c| c.sparse.is_none());
            rows.push(MessageRow {
                id: p.message.id,
                session_id: p.message.session_id,
                role: p.message.role,
                timestamp: p.message.timestamp,
                fingerprint: if dense_only {
                    format!("{}{DENSE_ONLY}", p.fingerprint)
                } else {
                    p.fingerprint
                },
                chunks,
            });
        }
        report.embedded_messages += rows.len();
        Ok((rows, namespace))
    }

    /// Three stages at once: a preparer chunks and tokenises the next wave
    /// (reading the cache through its own connection), this thread embeds,
    /// and a writer commits what was embedded. When no provider can embed,
    /// the run stops after committing what it has (`report.paused`).
    fn run(
        &self,
        store: &mut Store,
        profile: &str,
        todo: Vec<(Message, String)>,
        options: &IndexOptions,
        progress: ProgressFn,
        report: &mut Report,
    ) -> Result<()> {
        if todo.is_empty() {
            return Ok(());
        }
        let total = todo.len();
        let cache = Store::open(store.path())?;
        let (group_tx, group_rx) = mpsc::sync_channel::<Vec<Pending>>(2);
        let (row_tx, row_rx) = mpsc::sync_channel::<(Vec<MessageRow>, String)>(1);
        std::thread::scope(|scope| -> Result<()> {
            let preparer = scope.spawn(move || -> Result<()> {
                let mut todo = todo.into_iter().peekable();
                while todo.peek().is_some() {
                    let wave: Vec<_> = todo.by_ref().take(WAVE_MESSAGES).collect();
                    for group in groups(self.prepare(wave, &cache, options.chunk)?) {
                        if group_tx.send(group).is_err() {
                            return Ok(()); // the embedder stopped; its error is reported
                        }
                    }
                }
                Ok(())
            });
            let writer = scope.spawn(move || -> Result<()> {
                for (rows, namespace) in row_rx {
                    store.put_messages(profile, &namespace, &rows)?;
                }
                Ok(())
            });
            let mut done = 0;
            let result = (|| -> Result<()> {
                for group in group_rx {
                    let started = Instant::now();
                    let size = group.len();
                    let embedded = self.embed_group(group, report);
                    report.embed_seconds += started.elapsed().as_secs_f64();
                    let batches = match embedded {
                        Ok(batches) => batches,
                        Err(unavailable) => {
                            self.embedders.refuse_if_none_fits()?;
                            report.paused = Some(unavailable.to_string());
                            report.pending_messages += total - done;
                            break;
                        }
                    };
                    done += size;
                    // The writer failing ends the loop; its error is reported below.
                    if batches.into_iter().any(|rows| row_tx.send(rows).is_err()) {
                        break;
                    }
                    progress(done, total, report.chunks, report.tokens);
                }
                Ok(())
            })();
            drop(row_tx);
            let joined = |h: std::thread::ScopedJoinHandle<'_, Result<()>>, what: &str| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("the index {what} thread panicked"))?
            };
            // Dropping the receiver (by returning) stops the preparer.
            let prepared = joined(preparer, "preparer");
            let written = joined(writer, "writer");
            result.and(prepared).and(written)
        })
    }
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

/// Why a provider's vectors were not found to be the index's.
enum NotSame {
    /// It did not answer: asked again next time, no verdict.
    Unanswered(String),
    /// It answered with other vectors: a verdict that stays.
    Different(String),
}
