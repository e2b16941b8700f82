//! `recall index`: Hermes sessions → chunks → embeddings → the index.
//!
//! Each run compares what Hermes holds with what the index holds, by a
//! fingerprint per message, and embeds only what is new or changed; what
//! Hermes deleted is deleted. Messages are embedded in length-sorted groups;
//! a writer thread commits one group while the model embeds the next.

pub mod chunk;
pub mod store;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rayon::prelude::*;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::embedder::{Embedder, Outputs};
use crate::source::files;
use crate::source::hermes::{HIDDEN_SOURCES, Message, Profile, Selection, Session, StateDb};
use crate::tokenize::Tokens;
use chunk::ChunkParams;
use store::{ChunkRow, Identity, MessageRow, SessionRow, Store};

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
}

/// Progress as work is done: (messages done, messages to do, chunks done, tokens done).
pub type ProgressFn<'a> = &'a (dyn Fn(usize, usize, usize, usize) + Sync);

/// The identity an index built by `embedder` with `chunk` has.
pub fn identity(embedder: &Embedder, chunk: ChunkParams) -> Identity {
    let info = embedder.info();
    let model = info
        .dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // A hub snapshot is named by its revision; its repository is two levels up.
    let (model, revision) = match info
        .dir
        .parent()
        .and_then(|p| p.parent())
        .and_then(|p| p.file_name())
    {
        Some(repo) if repo.to_string_lossy().starts_with("models--") => (
            repo.to_string_lossy()
                .trim_start_matches("models--")
                .replace("--", "/"),
            model,
        ),
        _ => (model, "local".to_string()),
    };
    Identity {
        provider: "local".into(),
        model,
        revision,
        weights_bytes: std::fs::metadata(&info.weights)
            .map(|m| m.len())
            .unwrap_or(0),
        dimension: info.dense_dim,
        normalized: info.normalize,
        sparse: info.sparse,
        chunk_tokens: chunk.window,
        chunk_overlap: chunk.overlap,
    }
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
}

fn read_profile(profile: &Profile, selection: &Selection) -> Result<Snapshot> {
    let db = StateDb::open(&profile.state_db())?;
    let mut sessions = db.sessions()?;
    let mut messages = Vec::new();
    db.messages(selection, |m| messages.push(m))?;
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
    })
}

/// Indexes `profiles` into `store` with `embedder`.
pub fn run(
    embedder: &Embedder,
    store: &mut Store,
    profiles: &[Profile],
    options: &IndexOptions,
    progress: ProgressFn,
) -> Result<Report> {
    let started = Instant::now();
    options.chunk.check(embedder.tokenizer())?;
    let identity = identity(embedder, options.chunk);
    store.bind(&identity, options.rebuild)?;
    // Later runs and searches without --model use the same directory.
    store.set_meta(
        "model_dir",
        &embedder
            .info()
            .dir
            .canonicalize()
            .unwrap_or_else(|_| embedder.info().dir.clone())
            .to_string_lossy(),
    )?;
    let namespace = identity.embedding_key();
    let outputs = Outputs {
        dense: true,
        sparse: identity.sparse,
        colbert: false,
    };
    let mut report = Report::default();

    for profile in profiles {
        let snapshot = read_profile(profile, &options.selection)
            .with_context(|| format!("cannot read Hermes profile {:?}", profile.name))?;
        report.profiles.push(profile.name.clone());
        report.sessions += snapshot.sessions.len();
        report.messages += snapshot.messages.len();
        report.session_file_messages += snapshot.file_messages;
        report.malformed_lines += snapshot.malformed_lines;

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
            .filter(|(m, fp)| indexed.get(&m.id) != Some(fp))
            .collect();
        report.unchanged_messages += seen - todo.len();
        embed_messages(
            embedder,
            store,
            &profile.name,
            &namespace,
            outputs,
            todo,
            options,
            progress,
            &mut report,
        )?;
    }
    store.set_meta("last_indexed_at", &format!("{:.3}", unix_now()))?;
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

pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
}

/// A message cut into chunks, with what is known of their embeddings.
struct Pending {
    message: Message,
    fingerprint: String,
    chunks: Vec<(Tokens, String, Option<ChunkRow>)>,
}

/// Messages chunked, embedded and written per wave: early commits, bounded memory.
const WAVE_MESSAGES: usize = 512;

/// Chunks and tokenises `wave`, taking what the cache has.
fn prepare(
    wave: Vec<(Message, String)>,
    embedder: &Embedder,
    cache: &Store,
    namespace: &str,
    chunking: ChunkParams,
) -> Result<Vec<Pending>> {
    let mut pending: Vec<Pending> = wave
        .into_par_iter()
        .map(|(message, fingerprint)| -> Result<Pending> {
            let pieces = chunk::chunk(&message.text, chunking, embedder.tokenizer())?;
            let chunks = pieces
                .into_iter()
                .map(|text| Ok((embedder.tokenizer().encode(&text)?, text, None)))
                .collect::<Result<_>>()?;
            Ok(Pending {
                message,
                fingerprint,
                chunks,
            })
        })
        .collect::<Result<_>>()?;
    for p in &mut pending {
        for (tokens, text, row) in &mut p.chunks {
            *row = cache.cached(namespace, text, tokens.ids.len())?;
        }
    }
    Ok(pending)
}

/// Length-sorted groups of about `GROUP_TOKENS` tokens.
fn groups(mut pending: Vec<Pending>) -> Vec<Vec<Pending>> {
    let size = |p: &Pending| p.chunks.iter().map(|c| c.0.ids.len()).sum::<usize>();
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

/// Embeds what `group` lacks and assembles its rows.
fn embed_group(
    embedder: &Embedder,
    outputs: Outputs,
    group: Vec<Pending>,
    report: &mut Report,
) -> Result<Vec<MessageRow>> {
    let missing: Vec<Tokens> = group
        .iter()
        .flat_map(|p| {
            p.chunks
                .iter()
                .filter(|c| c.2.is_none())
                .map(|c| c.0.clone())
        })
        .collect();
    let mut embedded = embedder.embed_tokens(&missing, outputs)?.into_iter();
    let mut rows = Vec::with_capacity(group.len());
    for p in group {
        let mut chunks = Vec::with_capacity(p.chunks.len());
        for (tokens, text, cached) in p.chunks {
            report.chunks += 1;
            report.truncated_chunks += tokens.truncated as usize;
            let row = match cached {
                Some(row) => {
                    report.cached_chunks += 1;
                    row
                }
                None => {
                    let e = embedded
                        .next()
                        .context("the model returned fewer embeddings than inputs")?;
                    report.tokens += e.tokens;
                    ChunkRow {
                        text,
                        tokens: e.tokens,
                        dense: e.dense.unwrap_or_default(),
                        sparse: e.sparse,
                    }
                }
            };
            chunks.push(row);
        }
        rows.push(MessageRow {
            id: p.message.id,
            session_id: p.message.session_id,
            role: p.message.role,
            timestamp: p.message.timestamp,
            fingerprint: p.fingerprint,
            chunks,
        });
    }
    report.embedded_messages += rows.len();
    Ok(rows)
}

#[allow(clippy::too_many_arguments)]
fn embed_messages(
    embedder: &Embedder,
    store: &mut Store,
    profile: &str,
    namespace: &str,
    outputs: Outputs,
    todo: Vec<(Message, String)>,
    options: &IndexOptions,
    progress: ProgressFn,
    report: &mut Report,
) -> Result<()> {
    if todo.is_empty() {
        return Ok(());
    }
    let total = todo.len();
    // Three stages run at once: a preparer chunks and tokenises the next
    // wave (reading the cache through its own connection), this thread
    // embeds, and a writer commits what was embedded.
    let cache = Store::open(store.path())?;
    let (group_tx, group_rx) = mpsc::sync_channel::<Vec<Pending>>(2);
    let (row_tx, row_rx) = mpsc::sync_channel::<Vec<MessageRow>>(1);
    std::thread::scope(|scope| -> Result<()> {
        let preparer = scope.spawn(move || -> Result<()> {
            let mut todo = todo.into_iter().peekable();
            while todo.peek().is_some() {
                let wave: Vec<_> = todo.by_ref().take(WAVE_MESSAGES).collect();
                for group in groups(prepare(wave, embedder, &cache, namespace, options.chunk)?) {
                    if group_tx.send(group).is_err() {
                        return Ok(()); // the embedder stopped; its error is reported
                    }
                }
            }
            Ok(())
        });
        let writer = scope.spawn(move || -> Result<()> {
            for rows in row_rx {
                store.put_messages(profile, namespace, &rows)?;
            }
            Ok(())
        });
        let mut done = 0;
        let result = (|| -> Result<()> {
            for group in group_rx {
                let started = Instant::now();
                let rows = embed_group(embedder, outputs, group, report)?;
                report.embed_seconds += started.elapsed().as_secs_f64();
                done += rows.len();
                if row_tx.send(rows).is_err() {
                    break; // the writer failed; its error is reported below
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
        let prepared = joined(preparer, "preparer");
        let written = joined(writer, "writer");
        result.and(prepared).and(written)
    })
}

/// The default index location: `$HERMES_HOME/recall/index.db`.
pub fn default_index_path(hermes_home: &Path) -> std::path::PathBuf {
    hermes_home.join("recall").join("index.db")
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
            .filter(|m| indexed.get(&m.id) != Some(&fingerprint(m)))
            .count();
    }
    Ok(behind)
}
