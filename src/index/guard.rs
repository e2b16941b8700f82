//! What a file must be before recall writes to it as its index: missing,
//! empty, or recall's own index. Anything else is refused by name before a
//! byte of it is written, so that a slip such as `recall index --index
//! ~/.hermes/state.db` never touches Hermes's history.
//!
//! recall marks its index twice: SQLite's `application_id` in the file
//! header, and a `layout` row in its `meta` table. The header is also read
//! without SQLite, so a damaged index is still known as recall's (and
//! `recall index --rebuild` may move it aside); an index written before the
//! mark existed is known by its `meta` row and marked when next opened.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rusqlite::{Connection, OpenFlags, OptionalExtension};

/// recall's `application_id` ("RCLL").
pub const APPLICATION_ID: i32 = 0x5243_4c4c;

const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";
/// Where SQLite keeps `application_id` in the file header (big-endian).
const APPLICATION_ID_OFFSET: usize = 68;

/// What a path holds, as far as writing recall's index there goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Nothing yet: no file, zero bytes, or a SQLite database without tables.
    Empty,
    /// recall's index; `marked` is false for one written before the mark.
    Index { marked: bool },
    /// recall's index, which SQLite cannot read or check (the reason).
    Damaged(String),
    /// Anything else: what it is, in words.
    Foreign(String),
}

impl Found {
    /// `Ok` when recall may write its index at `path`; else the error that
    /// names the file (a `Refusal` inside, for `store::Error`).
    pub fn writable(self, path: &Path) -> Result<Found> {
        let refusal = match self {
            Found::Empty | Found::Index { .. } => return Ok(self),
            Found::Damaged(why) => Refusal {
                damaged: true,
                message: format!(
                    "{} is a damaged recall index ({why}). `recall index --rebuild` moves it aside \
                     and builds a new one (nothing in Hermes is lost: the index is rebuilt from it).",
                    path.display()
                ),
            },
            Found::Foreign(what) => Refusal {
                damaged: false,
                message: format!(
                    "{} is {what}, not a recall index. recall writes only to a new file, an empty one \
                     or its own index, and never changed this file. Leave out --index to use the \
                     default ($HERMES_HOME/recall/index.db), or name a new file.",
                    path.display()
                ),
            },
        };
        Err(refusal.into())
    }
}

/// Why recall will not write its index at a path: it holds something else,
/// or a damaged index.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub damaged: bool,
    message: String,
}

/// Looks at `path` without writing to it: the file header first, then, for
/// a SQLite database, its tables through a read-only connection (which,
/// unlike a read-write one, never checkpoints another program's WAL on close).
pub fn inspect(path: &Path) -> Result<Found> {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::Empty),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    if meta.is_dir() {
        return Ok(Found::Foreign("a directory".into()));
    }
    if meta.len() == 0 {
        return Ok(Found::Empty);
    }
    let mut header = Vec::with_capacity(100);
    std::fs::File::open(path)
        .and_then(|f| f.take(100).read_to_end(&mut header))
        .with_context(|| format!("cannot read {}", path.display()))?;
    if header.len() < 100 || !header.starts_with(SQLITE_MAGIC) {
        return Ok(Found::Foreign("not a SQLite database".into()));
    }
    let marked = header_application_id(&header) == APPLICATION_ID;
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    );
    let found = conn.map_err(anyhow::Error::from).and_then(|conn| {
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        classify(&conn)
    });
    match found {
        Ok(found) => Ok(found),
        Err(e) if marked => Ok(Found::Damaged(reason(&e))),
        Err(e) if is_damage(&e) => Ok(Found::Foreign(format!(
            "a SQLite database that cannot be read ({}; if it is a damaged index of a recall \
             from before its files were marked, move it away by hand)",
            reason(&e)
        ))),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// What `conn`'s database is, by reading only: its `application_id`, its
/// tables, and recall's `meta` row or Hermes's columns among them.
pub fn classify(conn: &Connection) -> Result<Found> {
    let id: i32 = conn.pragma_query_value(None, "application_id", |r| r.get(0))?;
    if id == APPLICATION_ID {
        return Ok(Found::Index { marked: true });
    }
    let mut stmt = conn.prepare(
        "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') \
         AND name NOT LIKE 'sqlite_%' ORDER BY name",
    )?;
    let tables: Vec<String> = stmt
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    if id != 0 {
        return Ok(Found::Foreign(format!(
            "a database of another program (SQLite application_id {id:#010x})"
        )));
    }
    if tables.is_empty() {
        return Ok(Found::Empty);
    }
    let has = |t: &str| tables.iter().any(|n| n == t);
    if has("meta") && has("chunks") && recall_meta(conn)? {
        return Ok(Found::Index { marked: false });
    }
    if has("sessions") && has("messages") && hermes_messages(conn)? {
        let count = |table: &str| -> rusqlite::Result<i64> {
            conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
        };
        return Ok(Found::Foreign(format!(
            "a Hermes Agent database ({} sessions, {} messages: recall only ever reads it)",
            count("sessions")?,
            count("messages")?
        )));
    }
    let shown: Vec<&str> = tables.iter().take(5).map(String::as_str).collect();
    Ok(Found::Foreign(format!(
        "a SQLite database with tables of its own ({}{})",
        shown.join(", "),
        if tables.len() > shown.len() {
            ", …"
        } else {
            ""
        }
    )))
}

/// Whether the `meta` table has the rows only recall writes there.
fn recall_meta(conn: &Connection) -> Result<bool> {
    let value = |key: &str| -> Result<Option<String>> {
        Ok(conn
            .query_row("SELECT value FROM meta WHERE key = ?", [key], |r| r.get(0))
            .optional()?)
    };
    Ok(value("layout")?.is_some() && value("index_id")?.is_some())
}

/// Whether `messages` has Hermes's columns.
fn hermes_messages(conn: &Connection) -> Result<bool> {
    let mut stmt = conn.prepare("SELECT name FROM pragma_table_info('messages')")?;
    let columns: Vec<String> = stmt
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(["session_id", "role", "content"]
        .iter()
        .all(|c| columns.iter().any(|n| n == c)))
}

fn header_application_id(header: &[u8]) -> i32 {
    let at = APPLICATION_ID_OFFSET;
    i32::from_be_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
}

/// Whether `e` says the database file itself is damaged (not locked, not missing).
pub fn is_damage(e: &anyhow::Error) -> bool {
    crate::sqlite::failed_with(
        e,
        &[
            rusqlite::ErrorCode::DatabaseCorrupt,
            rusqlite::ErrorCode::NotADatabase,
        ],
    )
}

fn reason(e: &anyhow::Error) -> String {
    e.chain().last().map(|c| c.to_string()).unwrap_or_default()
}

/// Whether SQLite's `quick_check` finds recall's index at `path` intact.
pub fn intact(path: &Path) -> Result<std::result::Result<(), String>> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    let checked = conn.prepare("PRAGMA quick_check(5)").and_then(|mut stmt| {
        stmt.query_map([], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()
    });
    match checked {
        Ok(lines) if lines == ["ok"] => Ok(Ok(())),
        Ok(lines) => Ok(Err(lines.join("; "))),
        Err(e) => {
            let e = anyhow::Error::from(e);
            if is_damage(&e) {
                Ok(Err(reason(&e)))
            } else {
                Err(e).with_context(|| format!("cannot check {}", path.display()))
            }
        }
    }
}

/// The files that belong to the index at `path`: the database, its WAL and
/// shared memory, and search's code file (derived, see `search::binary`).
pub fn companions(path: &Path) -> [PathBuf; 3] {
    ["-wal", "-shm", ".codes"].map(|suffix| {
        let mut name = path.as_os_str().to_os_string();
        name.push(suffix);
        PathBuf::from(name)
    })
}
