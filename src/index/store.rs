//! recall's own index database: chunks with their text and provenance, dense
//! vectors in sqlite-vec, their 1-bit codes (the source of search's binary
//! scan file, see `search::binary`), two FTS5 indexes of the same text (trigram:
//! phrases, identifiers and CJK; words, stemmed: questions' words by BM25),
//! BGE-M3's sparse weights, and an embedding cache. WAL mode, so search reads
//! while indexing writes.
//!
//! Consistency rule: a message's chunks, vectors, sparse weights, FTS rows and
//! its fingerprint are written in one transaction, and deleting a chunk row
//! deletes the rest by trigger. A crash leaves either the old or the new
//! state of each message, never a chunk without its vector.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rusqlite::{Connection, OptionalExtension, params};

use super::guard;
use crate::source::hermes::Session;
use crate::space::Identity;

/// Why the index could not be used, by what the user does next. Each
/// variant keeps the whole message chain (`{:#}` prints it).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The path holds something recall must not write to (Hermes's
    /// `state.db`, another program's file): name another path.
    #[error(transparent)]
    Refused(anyhow::Error),
    /// The index is damaged: `recall index --rebuild` moves it aside and
    /// builds a new one from Hermes.
    #[error(transparent)]
    Damaged(anyhow::Error),
    /// The file system would not let the index be written: no space, or no
    /// permission (the message says which, and where).
    #[error(transparent)]
    Storage(anyhow::Error),
    /// Anything else (SQLite or the file system).
    #[error(transparent)]
    Other(anyhow::Error),
}

/// Bumped when the layout below changes incompatibly.
const LAYOUT_VERSION: i64 = 3;

/// A session row of the index: the source's session, placed in its lineage.
#[derive(Debug, Clone)]
pub struct SessionRow {
    pub session: Session,
    pub lineage_root: String,
    /// From a source Hermes's search never shows (`kanban`, `subagent`, `tool`).
    pub hidden: bool,
}

/// One embedded chunk.
#[derive(Debug, Clone)]
pub struct ChunkRow {
    pub text: String,
    pub tokens: usize,
    pub dense: Vec<f32>,
    pub sparse: Option<BTreeMap<u32, f32>>,
}

/// A message and its chunks, replacing whatever the index had for it.
#[derive(Debug, Clone)]
pub struct MessageRow {
    pub id: i64,
    pub session_id: String,
    pub role: String,
    pub timestamp: f64,
    pub fingerprint: String,
    pub chunks: Vec<ChunkRow>,
    /// Bytes of the message's text past its last chunk, left out.
    pub skipped_bytes: usize,
}

/// The rows of the `meta` table, each read and written through its
/// accessor on `Store`.
#[derive(Debug, Clone, Copy)]
enum Meta {
    Layout,
    IndexId,
    CodesEpoch,
    Identity,
    ModelDir,
    LastIndexedAt,
}

impl Meta {
    fn name(self) -> &'static str {
        match self {
            Meta::Layout => "layout",
            Meta::IndexId => "index_id",
            Meta::CodesEpoch => "codes_epoch",
            Meta::Identity => "identity",
            Meta::ModelDir => "model_dir",
            Meta::LastIndexedAt => "last_indexed_at",
        }
    }
}

pub struct Store {
    conn: Connection,
    path: PathBuf,
}

fn register_sqlite_vec() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: sqlite3_vec_init has the signature SQLite expects of an
        // extension entry point; registering it once makes every later
        // connection load sqlite-vec (the crate's documented use).
        unsafe {
            rusqlite::ffi::sqlite3_auto_extension(Some(std::mem::transmute::<
                *const (),
                unsafe extern "C" fn(
                    *mut rusqlite::ffi::sqlite3,
                    *mut *mut std::os::raw::c_char,
                    *const rusqlite::ffi::sqlite3_api_routines,
                ) -> i32,
            >(
                sqlite_vec::sqlite3_vec_init as *const (),
            )));
        }
    });
}

pub fn f32_blob(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Bytes of the 1-bit code of a `dimension`-dim vector: whole 64-bit words,
/// so that the scan can count bits a word at a time.
pub fn code_bytes(dimension: usize) -> usize {
    dimension.div_ceil(64) * 8
}

/// The 1-bit code of `v`: bit i (least significant first) is set when v[i] > 0.
pub fn binary_code(v: &[f32]) -> Vec<u8> {
    let mut code = vec![0u8; code_bytes(v.len())];
    for (i, x) in v.iter().enumerate() {
        if *x > 0.0 {
            code[i / 8] |= 1 << (i % 8);
        }
    }
    code
}

pub fn blob_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn sparse_blob(s: &BTreeMap<u32, f32>) -> Vec<u8> {
    s.iter()
        .flat_map(|(id, w)| id.to_le_bytes().into_iter().chain(w.to_le_bytes()))
        .collect()
}

fn blob_sparse(b: &[u8]) -> BTreeMap<u32, f32> {
    b.chunks_exact(8)
        .map(|c| {
            (
                u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                f32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            )
        })
        .collect()
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    profile TEXT NOT NULL, id TEXT NOT NULL, source TEXT NOT NULL, title TEXT, model TEXT,
    started_at REAL, parent_id TEXT, lineage_root TEXT NOT NULL, hidden INTEGER NOT NULL,
    PRIMARY KEY (profile, id));
CREATE TABLE IF NOT EXISTS messages (
    profile TEXT NOT NULL, id INTEGER NOT NULL, session_id TEXT NOT NULL, role TEXT NOT NULL,
    timestamp REAL, fingerprint TEXT NOT NULL, PRIMARY KEY (profile, id));
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY, profile TEXT NOT NULL, message_id INTEGER NOT NULL, seq INTEGER NOT NULL,
    session_id TEXT NOT NULL, role TEXT NOT NULL, timestamp REAL, text TEXT NOT NULL, tokens INTEGER NOT NULL,
    UNIQUE (profile, message_id, seq));
CREATE INDEX IF NOT EXISTS chunks_session ON chunks (profile, session_id);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(
    text, content='chunks', content_rowid='id', tokenize='trigram');
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_words USING fts5(
    text, content='chunks', content_rowid='id', tokenize='porter unicode61 remove_diacritics 2');
CREATE TABLE IF NOT EXISTS chunk_sparse (
    chunk_id INTEGER NOT NULL, token_id INTEGER NOT NULL, weight REAL NOT NULL,
    PRIMARY KEY (chunk_id, token_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS chunk_sparse_token ON chunk_sparse (token_id);
CREATE TABLE IF NOT EXISTS chunk_codes (chunk_id INTEGER PRIMARY KEY, code BLOB NOT NULL);
INSERT OR IGNORE INTO meta (key, value) VALUES ('codes_epoch', '0');
CREATE TABLE IF NOT EXISTS session_titles (
    profile TEXT NOT NULL, session_id TEXT NOT NULL, title TEXT NOT NULL, dense BLOB NOT NULL,
    PRIMARY KEY (profile, session_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS capped_messages (
    profile TEXT NOT NULL, id INTEGER NOT NULL, skipped_bytes INTEGER NOT NULL,
    PRIMARY KEY (profile, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS embed_cache (key BLOB PRIMARY KEY, dense BLOB NOT NULL, sparse BLOB) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS chunks_ai AFTER INSERT ON chunks BEGIN
    INSERT INTO chunks_fts (rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER IF NOT EXISTS chunks_words_ai AFTER INSERT ON chunks BEGIN
    INSERT INTO chunks_words (rowid, text) VALUES (new.id, new.text);
END;
";

// The vector table's dimension is the identity's, so it is made with it.
const CHUNK_DELETE_TRIGGER: &str = "
CREATE TRIGGER IF NOT EXISTS chunks_ad AFTER DELETE ON chunks BEGIN
    INSERT INTO chunks_fts (chunks_fts, rowid, text) VALUES ('delete', old.id, old.text);
    INSERT INTO chunks_words (chunks_words, rowid, text) VALUES ('delete', old.id, old.text);
    DELETE FROM chunks_vec WHERE chunk_id = old.id;
    DELETE FROM chunk_sparse WHERE chunk_id = old.id;
    DELETE FROM chunk_codes WHERE chunk_id = old.id;
    UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'codes_epoch';
END;
";

impl Store {
    /// Opens (creating if needed) the index at `path`. Refuses, before
    /// writing anything, a path that holds anything but recall's index or
    /// nothing (see `guard`): `Error::Refused`, or `Error::Damaged`.
    pub fn open(path: &Path) -> Result<Self, Error> {
        Self::open_anyhow(path).map_err(|e| Self::classify(path, e))
    }

    fn open_anyhow(path: &Path) -> Result<Self> {
        register_sqlite_vec();
        guard::inspect(path)?.writable(path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let mut conn = Connection::open(path)
            .with_context(|| format!("cannot open the index {}", path.display()))?;
        conn.busy_timeout(Duration::from_secs(10))?;
        // Search runs the same few statements for every candidate passage;
        // without the stability guarantee SQLite re-plans a join on each new
        // bound value (the passage read was recompiled on every call).
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
            true,
        )?;
        // Write transactions take the write lock when they begin, where the
        // busy timeout waits for it; a deferred one that reads first gets
        // SQLITE_BUSY at once when another writer got there in between.
        conn.set_transaction_behavior(rusqlite::TransactionBehavior::Immediate);
        // The file may have changed since it was inspected: look again under
        // the write lock, then mark and set up a new index in the same
        // transaction, so that no other process ever sees it half made. A
        // new file is still in rollback mode here, so the mark reaches the
        // file's header at once.
        {
            let tx = conn
                .transaction()
                .with_context(|| format!("cannot open the index {}", path.display()))?;
            let found = guard::classify(&tx)
                .with_context(|| format!("cannot read {}", path.display()))?
                .writable(path)?;
            if found != (guard::Found::Index { marked: true }) {
                tx.pragma_update(None, "application_id", guard::APPLICATION_ID)?;
            }
            tx.execute_batch(SCHEMA)
                .with_context(|| format!("{}: cannot set up the index", path.display()))?;
            if found == guard::Found::Empty {
                tx.execute(
                    "INSERT INTO meta (key, value) VALUES ('index_id', ?), ('layout', ?)",
                    params![new_index_id(), LAYOUT_VERSION.to_string()],
                )?;
            }
            tx.commit()?;
        }
        // Turning a new file to WAL takes an exclusive lock and does not wait
        // on the busy timeout: another process opening the new index at the
        // same moment is waited for here.
        let started = std::time::Instant::now();
        while let Err(e) = conn.pragma_update(None, "journal_mode", "WAL") {
            let busy = e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy);
            if !busy || started.elapsed() > Duration::from_secs(10) {
                return Err(e).with_context(|| format!("cannot open the index {}", path.display()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        let store = Self {
            conn,
            path: path.to_path_buf(),
        };
        match store.layout()? {
            Some(v) if v == LAYOUT_VERSION.to_string() => {}
            Some(v) if v == "1" || v == "2" => store.upgrade(&v)?,
            Some(v) => bail!(
                "{} has index layout {v}, this recall writes {LAYOUT_VERSION}: run `recall index --rebuild`",
                path.display()
            ),
            None => bail!(
                "{} has no layout record: not a recall index",
                path.display()
            ),
        }
        Ok(store)
    }

    /// For `recall index --rebuild`: when the index at `path` is damaged
    /// (SQLite cannot read it, or its quick check fails), moves it and its
    /// WAL aside to `<path>.damaged-<unix time>` so that a new one can be
    /// built; returns where it went and what was wrong. Anything that is not
    /// recall's index is left alone (`open` refuses it).
    pub fn set_aside_if_damaged(path: &Path) -> Result<Option<(PathBuf, String)>> {
        let why = match guard::inspect(path)? {
            guard::Found::Damaged(why) => why,
            guard::Found::Index { .. } => match guard::intact(path)? {
                Ok(()) => return Ok(None),
                Err(why) => why,
            },
            _ => return Ok(None),
        };
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let aside = (0..)
            .map(|n| {
                let mut aside = path.as_os_str().to_os_string();
                aside.push(format!(".damaged-{stamp}"));
                if n > 0 {
                    aside.push(format!(".{n}"));
                }
                PathBuf::from(aside)
            })
            .find(|p| !p.exists() && !guard::companions(p)[0].exists())
            .expect("an unused name");
        let [wal, shm, codes] = guard::companions(path);
        std::fs::rename(path, &aside)
            .with_context(|| format!("cannot move the damaged index {} aside", path.display()))?;
        // A WAL left beside a new database would be replayed into it.
        if wal.exists() {
            let [wal_aside, _, _] = guard::companions(&aside);
            std::fs::rename(&wal, &wal_aside)
                .with_context(|| format!("cannot move {} aside", wal.display()))?;
        }
        for derived in [shm, codes] {
            match std::fs::remove_file(&derived) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("cannot remove {}", derived.display()));
                }
                _ => {}
            }
        }
        Ok(Some((aside, why)))
    }

    /// `err`, explained when it comes from the index at `path` being damaged
    /// or its directory being full or not writable: the message then names
    /// the cause, the path and the way out. Any other error comes back as it
    /// was (a paused run stays a `Paused` for the exit code).
    pub fn explain(path: &Path, err: anyhow::Error) -> anyhow::Error {
        if err.downcast_ref::<Error>().is_some() {
            return err;
        }
        match Self::classify(path, err) {
            Error::Other(err) => err,
            sorted => sorted.into(),
        }
    }

    /// `err` sorted: a refusal by the guard, the index at `path` being
    /// damaged, or its directory being full or not writable.
    fn classify(path: &Path, err: anyhow::Error) -> Error {
        if let Some(refusal) = err.downcast_ref::<guard::Refusal>() {
            return if refusal.damaged {
                Error::Damaged(err)
            } else {
                Error::Refused(err)
            };
        }
        if guard::is_damage(&err) {
            let damaged = match guard::inspect(path) {
                Ok(guard::Found::Damaged(_)) => true,
                Ok(guard::Found::Index { .. }) => matches!(guard::intact(path), Ok(Err(_))),
                _ => false,
            };
            if damaged {
                return Error::Damaged(err.context(format!(
                    "the index {} is damaged; `recall index --rebuild` moves it aside and builds a new one",
                    path.display()
                )));
            }
            return Error::Other(err);
        }
        if is_storage_error(&err)
            && let Some(why) = path.parent().and_then(unwritable)
        {
            return Error::Storage(
                err.context(format!("cannot write the index {}: {why}", path.display())),
            );
        }
        Error::Other(err)
    }

    /// Opens an existing index for reading; a missing file is an error, not a new index.
    pub fn open_existing(path: &Path) -> Result<Self, Error> {
        if !path.is_file() {
            return Err(Error::Other(anyhow::anyhow!(
                "no index at {}: run `recall index` first",
                path.display()
            )));
        }
        Self::open(path)
    }

    /// An index of an older layout brought to this one in place, nothing
    /// re-embedded: layout 1 lacks the vectors' 1-bit codes, layouts 1 and 2
    /// the word index (filled from the passages' text). The delete trigger
    /// is made again, since it clears both.
    fn upgrade(&self, from: &str) -> Result<()> {
        let tx = self.conn.unchecked_transaction()?;
        if self.identity()?.is_some() {
            if from == "1" {
                let mut read = tx.prepare("SELECT chunk_id, embedding FROM chunks_vec")?;
                let mut write = tx
                    .prepare("INSERT OR REPLACE INTO chunk_codes (chunk_id, code) VALUES (?, ?)")?;
                let mut rows = read.query([])?;
                while let Some(row) = rows.next()? {
                    let id: i64 = row.get(0)?;
                    let embedding: Vec<u8> = row.get(1)?;
                    write.execute(params![id, binary_code(&blob_f32(&embedding))])?;
                }
            }
            tx.execute_batch("DROP TRIGGER IF EXISTS chunks_ad;")?;
            tx.execute_batch(CHUNK_DELETE_TRIGGER)?;
        }
        tx.execute_batch("INSERT INTO chunks_words (chunks_words) VALUES ('rebuild');")?;
        tx.execute(
            "UPDATE meta SET value = ? WHERE key = 'layout'",
            [LAYOUT_VERSION.to_string()],
        )?;
        tx.commit()?;
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The connection, for the index's own modules (`reads.rs`) and for
    /// tests that inspect the file; the application reads through `reads.rs`.
    #[doc(hidden)]
    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    fn meta(&self, key: Meta) -> Result<Option<String>> {
        Ok(self
            .conn
            .query_row("SELECT value FROM meta WHERE key = ?", [key.name()], |r| {
                r.get(0)
            })
            .optional()?)
    }

    fn set_meta(&self, key: Meta, value: &str) -> Result<()> {
        self.conn.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
            params![key.name(), value],
        )?;
        Ok(())
    }

    /// The layout version this file is written in (`LAYOUT_VERSION` once
    /// opened).
    pub fn layout(&self) -> Result<Option<String>> {
        self.meta(Meta::Layout)
    }

    /// The random id the index was created with: a code file names the
    /// index it was built from.
    pub fn index_id(&self) -> Result<String> {
        Ok(self.meta(Meta::IndexId)?.unwrap_or_default())
    }

    /// The deletion epoch, bumped by every chunk deletion and rebuild: a
    /// code file built before the last one is stale.
    pub fn codes_epoch(&self) -> Result<i64> {
        Ok(self
            .meta(Meta::CodesEpoch)?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }

    /// When the last indexing run finished, in seconds since the epoch.
    pub fn last_indexed_at(&self) -> Result<Option<f64>> {
        Ok(self.meta(Meta::LastIndexedAt)?.and_then(|t| t.parse().ok()))
    }

    pub fn set_last_indexed_at(&self, unix_seconds: f64) -> Result<()> {
        self.set_meta(Meta::LastIndexedAt, &format!("{unix_seconds:.3}"))
    }

    /// The model directory the index was last built with.
    pub fn model_dir(&self) -> Result<Option<PathBuf>> {
        Ok(self.meta(Meta::ModelDir)?.map(PathBuf::from))
    }

    /// Records the model directory, made absolute, for later runs and
    /// searches without `--model`.
    pub fn set_model_dir(&self, dir: &Path) -> Result<()> {
        let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
        self.set_meta(Meta::ModelDir, &dir.to_string_lossy())
    }

    pub fn identity(&self) -> Result<Option<Identity>> {
        match self.meta(Meta::Identity)? {
            None => Ok(None),
            Some(json) => Ok(Some(
                serde_json::from_str(&json).context("the index's identity record is damaged")?,
            )),
        }
    }

    /// Binds the index to `identity`: a new index takes it; an index of
    /// another identity is refused unless `rebuild`, which empties it first.
    pub fn bind(&mut self, identity: &Identity, rebuild: bool) -> Result<()> {
        // Decided and done under the write lock: two indexers starting on a
        // new index (`recall index` beside `recall watch`) must not both set
        // it up, the second dropping what the first has begun to write.
        let tx = self.conn.transaction()?;
        let existing: Option<Identity> = tx
            .query_row("SELECT value FROM meta WHERE key = 'identity'", [], |r| {
                r.get::<_, String>(0)
            })
            .optional()?
            .map(|json| serde_json::from_str(&json))
            .transpose()
            .context("the index's identity record is damaged")?;
        match existing {
            Some(existing) if existing.accepts(identity) && !rebuild => return Ok(()),
            Some(existing) if !rebuild => {
                bail!(
                    "the index {} was built with another embedding setup, and vectors of two models are never mixed:\n  {}\n\
                     Run `recall index --rebuild` to re-embed everything with the current one \
                     (the embedding cache keeps what was already computed for it).",
                    self.path.display(),
                    existing.differences(identity).join("\n  ")
                )
            }
            _ => {}
        }
        tx.execute_batch(
            "DROP TRIGGER IF EXISTS chunks_ad; DROP TABLE IF EXISTS chunks_vec;
             DELETE FROM chunks; DELETE FROM chunk_sparse; DELETE FROM chunk_codes;
             DELETE FROM messages; DELETE FROM capped_messages;
             DELETE FROM sessions; DELETE FROM session_titles;
             UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'codes_epoch';
             INSERT INTO chunks_fts (chunks_fts) VALUES ('delete-all');
             INSERT INTO chunks_words (chunks_words) VALUES ('delete-all');",
        )?;
        tx.execute_batch(&format!(
            "CREATE VIRTUAL TABLE chunks_vec USING vec0(chunk_id INTEGER PRIMARY KEY, embedding float[{}]);",
            identity.dimension
        ))?;
        tx.execute_batch(CHUNK_DELETE_TRIGGER)?;
        tx.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('identity', ?)",
            [serde_json::to_string(identity)?],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Message id → fingerprint of what the index holds for `profile`.
    pub fn fingerprints(&self, profile: &str) -> Result<HashMap<i64, String>> {
        let mut stmt = self
            .conn
            .prepare("SELECT id, fingerprint FROM messages WHERE profile = ?")?;
        let rows = stmt.query_map([profile], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Replaces the session rows of `profile`.
    pub fn put_sessions(&mut self, profile: &str, sessions: &[SessionRow]) -> Result<()> {
        let tx = self.conn.transaction()?;
        tx.execute("DELETE FROM sessions WHERE profile = ?", [profile])?;
        {
            let mut insert = tx.prepare(
                "INSERT INTO sessions (profile, id, source, title, model, started_at, parent_id, lineage_root, hidden)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )?;
            for row in sessions {
                let s = &row.session;
                insert.execute(params![
                    profile,
                    s.id,
                    s.source,
                    s.title,
                    s.model,
                    s.started_at,
                    s.parent,
                    row.lineage_root,
                    row.hidden
                ])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Session id → title of the titles embedded for `profile`.
    pub fn titles(&self, profile: &str) -> Result<HashMap<String, String>> {
        let mut stmt = self
            .conn
            .prepare("SELECT session_id, title FROM session_titles WHERE profile = ?")?;
        let rows = stmt.query_map([profile], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Replaces the embedded titles of `remove` and `put` (session id, title, vector).
    pub fn put_titles(
        &mut self,
        profile: &str,
        remove: &[String],
        put: &[(String, String, Vec<f32>)],
    ) -> Result<()> {
        let tx = self.conn.transaction()?;
        {
            let mut delete =
                tx.prepare("DELETE FROM session_titles WHERE profile = ? AND session_id = ?")?;
            for id in remove {
                delete.execute(params![profile, id])?;
            }
            let mut insert = tx.prepare(
                "INSERT OR REPLACE INTO session_titles (profile, session_id, title, dense) VALUES (?, ?, ?, ?)",
            )?;
            for (id, title, dense) in put {
                insert.execute(params![profile, id, title, f32_blob(dense)])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// The title vector of each of `sessions` (profile, session id) that has one.
    pub fn title_vectors(
        &self,
        sessions: &[(String, String)],
    ) -> Result<HashMap<(String, String), Vec<f32>>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT dense FROM session_titles WHERE profile = ? AND session_id = ?",
        )?;
        let mut out = HashMap::new();
        for (profile, id) in sessions {
            if let Some(blob) = stmt
                .query_row(params![profile, id], |r| r.get::<_, Vec<u8>>(0))
                .optional()?
            {
                out.insert((profile.clone(), id.clone()), blob_f32(&blob));
            }
        }
        Ok(out)
    }

    /// Removes messages (and their chunks, vectors, sparse and FTS rows).
    pub fn delete_messages(&mut self, profile: &str, ids: &[i64]) -> Result<()> {
        let tx = self.conn.transaction()?;
        for id in ids {
            tx.execute(
                "DELETE FROM chunks WHERE profile = ? AND message_id = ?",
                params![profile, id],
            )?;
            tx.execute(
                "DELETE FROM messages WHERE profile = ? AND id = ?",
                params![profile, id],
            )?;
            tx.execute(
                "DELETE FROM capped_messages WHERE profile = ? AND id = ?",
                params![profile, id],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Writes `messages` (each replacing its old chunks) in one transaction,
    /// and adds their embeddings to the cache.
    pub fn put_messages(
        &mut self,
        profile: &str,
        cache_namespace: &str,
        messages: &[MessageRow],
    ) -> Result<()> {
        let tx = self.conn.transaction()?;
        {
            let mut del =
                tx.prepare_cached("DELETE FROM chunks WHERE profile = ? AND message_id = ?")?;
            let mut chunk = tx.prepare_cached(
                "INSERT INTO chunks (profile, message_id, seq, session_id, role, timestamp, text, tokens)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            )?;
            let mut vec =
                tx.prepare_cached("INSERT INTO chunks_vec (chunk_id, embedding) VALUES (?, ?)")?;
            let mut code =
                tx.prepare_cached("INSERT INTO chunk_codes (chunk_id, code) VALUES (?, ?)")?;
            let mut sparse = tx.prepare_cached(
                "INSERT INTO chunk_sparse (chunk_id, token_id, weight) VALUES (?, ?, ?)",
            )?;
            let mut cache = tx.prepare_cached(
                "INSERT OR IGNORE INTO embed_cache (key, dense, sparse) VALUES (?, ?, ?)",
            )?;
            let mut msg = tx.prepare_cached(
                "INSERT OR REPLACE INTO messages (profile, id, session_id, role, timestamp, fingerprint)
                 VALUES (?, ?, ?, ?, ?, ?)",
            )?;
            let mut uncap =
                tx.prepare_cached("DELETE FROM capped_messages WHERE profile = ? AND id = ?")?;
            let mut cap = tx.prepare_cached(
                "INSERT INTO capped_messages (profile, id, skipped_bytes) VALUES (?, ?, ?)",
            )?;
            for m in messages {
                del.execute(params![profile, m.id])?;
                uncap.execute(params![profile, m.id])?;
                if m.skipped_bytes > 0 {
                    cap.execute(params![profile, m.id, m.skipped_bytes as i64])?;
                }
                for (seq, c) in m.chunks.iter().enumerate() {
                    chunk.execute(params![
                        profile,
                        m.id,
                        seq as i64,
                        m.session_id,
                        m.role,
                        m.timestamp,
                        c.text,
                        c.tokens as i64
                    ])?;
                    let chunk_id = tx.last_insert_rowid();
                    vec.execute(params![chunk_id, f32_blob(&c.dense)])?;
                    code.execute(params![chunk_id, binary_code(&c.dense)])?;
                    if let Some(weights) = &c.sparse {
                        for (token, w) in weights {
                            sparse.execute(params![chunk_id, *token as i64, *w as f64])?;
                        }
                    }
                    cache.execute(params![
                        cache_key(cache_namespace, &c.text),
                        f32_blob(&c.dense),
                        c.sparse.as_ref().map(sparse_blob)
                    ])?;
                }
                msg.execute(params![
                    profile,
                    m.id,
                    m.session_id,
                    m.role,
                    m.timestamp,
                    m.fingerprint
                ])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// The cached embedding of `text` under `namespace`, as a chunk of `tokens` tokens.
    pub fn cached(&self, namespace: &str, text: &str, tokens: usize) -> Result<Option<ChunkRow>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT dense, sparse FROM embed_cache WHERE key = ?")?;
        let row = stmt
            .query_row([cache_key(namespace, text)], |r| {
                Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, Option<Vec<u8>>>(1)?))
            })
            .optional()?;
        Ok(row.map(|(dense, sparse)| ChunkRow {
            text: text.to_string(),
            tokens,
            dense: blob_f32(&dense),
            sparse: sparse.as_deref().map(blob_sparse),
        }))
    }

    /// Up to `n` stored passages with their vectors (the oldest): what
    /// another provider must reproduce before it may write into the index.
    pub fn sample_vectors(&self, n: usize) -> Result<Vec<(String, Vec<f32>)>> {
        if self.identity()?.is_none() {
            return Ok(Vec::new());
        }
        let mut stmt = self.conn.prepare(
            "SELECT c.text, v.embedding FROM chunks c JOIN chunks_vec v ON v.chunk_id = c.id
             ORDER BY c.id LIMIT ?",
        )?;
        let rows = stmt.query_map([n as i64], |r| {
            Ok((r.get::<_, String>(0)?, blob_f32(&r.get::<_, Vec<u8>>(1)?)))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Whether the index holds no passage.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(!self
            .conn
            .query_row("SELECT EXISTS (SELECT 1 FROM chunks)", [], |r| r.get(0))?)
    }

    /// One number from `sql`: for tests that inspect the file.
    #[doc(hidden)]
    pub fn count(&self, sql: &str) -> Result<i64> {
        Ok(self.conn.query_row(sql, [], |r| r.get(0))?)
    }
}

/// Whether SQLite failed on the file system (full, read-only, cannot open
/// or write), where the directory may say why.
fn is_storage_error(e: &anyhow::Error) -> bool {
    crate::sqlite::failed_with(
        e,
        &[
            rusqlite::ErrorCode::DiskFull,
            rusqlite::ErrorCode::SystemIoFailure,
            rusqlite::ErrorCode::CannotOpen,
            rusqlite::ErrorCode::ReadOnly,
        ],
    )
}

/// Why files cannot be written in `dir`, found by writing one: no space, or
/// no permission (a read-only directory or file system). None when a write
/// works.
fn unwritable(dir: &Path) -> Option<String> {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let describe = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => {
            format!("no space left on the device that holds {}", dir.display())
        }
        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
            format!("{} is not writable ({e})", dir.display())
        }
        std::io::ErrorKind::NotFound => format!("{} does not exist", dir.display()),
        _ => format!("writing in {} fails: {e}", dir.display()),
    };
    let mut probe = match tempfile::Builder::new()
        .prefix(".recall-probe")
        .tempfile_in(dir)
    {
        Ok(f) => f,
        Err(e) => return Some(describe(e)),
    };
    // Room for a page or two of SQLite's, synced so a full device says so now.
    let written = std::io::Write::write_all(&mut probe, &[0u8; 64 * 1024])
        .and_then(|()| probe.as_file().sync_all());
    written.err().map(describe)
}

/// Tells this index file from any other, so that a file derived from an
/// index (search's code file) is never read against a different one.
fn new_index_id() -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(format!("{:?} {}", std::time::SystemTime::now(), std::process::id()).as_bytes());
    h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(crate) fn cache_key(namespace: &str, text: &str) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(namespace.as_bytes());
    h.update([0]);
    h.update(text.as_bytes());
    h.finalize().to_vec()
}
