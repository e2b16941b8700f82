//! Reading Hermes Agent's `state.db`, read-only, whatever schema version it has.
//!
//! Hermes is the source of truth and keeps writing while recall reads, so:
//! the file is opened with `mode=ro` (recall never writes to it; in a
//! read-only directory, where SQLite cannot make a WAL database's `-shm`,
//! as an immutable file), columns are
//! probed with `PRAGMA table_info` (v5 has no `active`/`compacted`/
//! `display_kind`), and messages are read in pages, each its own short read
//! transaction, so a DELETE-mode writer is never blocked for long and a WAL
//! checkpoint is never held back.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};

/// Sources whose sessions Hermes's own search never shows.
pub const HIDDEN_SOURCES: [&str; 3] = ["kanban", "subagent", "tool"];

/// The source of sessions Hermes's scheduler started (not a person's turn):
/// search ranks them below a person's sessions.
pub const CRON_SOURCE: &str = "cron";
/// Hermes indexes only this much of a tool result.
pub const TOOL_CONTENT_CHARS: usize = 8192;
const PAGE: i64 = 2000;

/// One Hermes profile: its name and `state.db`.
#[derive(Debug, Clone)]
pub struct Profile {
    pub name: String,
    pub home: PathBuf,
}

impl Profile {
    pub fn state_db(&self) -> PathBuf {
        self.home.join("state.db")
    }
}

/// `$HERMES_HOME`, else `~/.hermes`.
pub fn default_home() -> Option<PathBuf> {
    if let Some(h) = crate::env::HERMES_HOME.get() {
        return Some(PathBuf::from(h));
    }
    crate::paths::home_dir().map(|h| h.join(".hermes"))
}

/// The profiles to read: the home itself ("default"), one named profile, or all of them.
pub fn profiles(home: &Path, profile: Option<&str>, all: bool) -> Result<Vec<Profile>> {
    if let Some(name) = profile {
        let dir = home.join("profiles").join(name);
        if !dir.is_dir() {
            bail!(
                "no Hermes profile {name:?}: {} does not exist",
                dir.display()
            );
        }
        return Ok(vec![Profile {
            name: name.to_string(),
            home: dir,
        }]);
    }
    let mut out = vec![Profile {
        name: "default".into(),
        home: home.to_path_buf(),
    }];
    if all {
        let mut named: Vec<Profile> = std::fs::read_dir(home.join("profiles"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().join("state.db").is_file())
            .map(|e| Profile {
                name: e.file_name().to_string_lossy().into_owned(),
                home: e.path(),
            })
            .collect();
        named.sort_by(|a, b| a.name.cmp(&b.name));
        out.extend(named);
    }
    Ok(out)
}

/// A session as recall needs it.
#[derive(Debug, Clone)]
pub struct Session {
    pub id: String,
    pub source: String,
    pub title: Option<String>,
    pub model: Option<String>,
    pub started_at: f64,
    pub parent: Option<String>,
}

/// A message that Hermes's own search would show, as text to index.
#[derive(Debug, Clone)]
pub struct Message {
    pub id: i64,
    pub session_id: String,
    pub role: String,
    pub timestamp: f64,
    pub text: String,
}

/// Which rows to index.
#[derive(Debug, Clone)]
pub struct Selection {
    /// Roles to index; Hermes searches `user` and `assistant`, `tool` on request.
    pub roles: Vec<String>,
}

impl Default for Selection {
    fn default() -> Self {
        Self {
            roles: vec!["user".into(), "assistant".into()],
        }
    }
}

/// A read-only connection to one `state.db`.
pub struct StateDb {
    conn: Connection,
    path: PathBuf,
    has: HashSet<String>,
    session_cols: HashSet<String>,
    /// Ids of messages read with a value repaired (see `Lenient`).
    repaired: RefCell<Vec<i64>>,
}

/// A column read as whatever SQLite holds, never failing on it: Hermes
/// stores content as given (`_encode_content` passes bytes through, so a
/// message can be a BLOB), old rows may hold text that is not UTF-8, and a
/// timestamp may have been written as text. One bad row must not stop every
/// later run, so bytes are decoded as UTF-8 with bad sequences replaced, and
/// a timestamp that is no number counts as 0; either marks the row repaired.
struct Lenient {
    repaired: bool,
}

impl Lenient {
    fn text(&mut self, v: ValueRef) -> Option<String> {
        match v {
            ValueRef::Null => None,
            ValueRef::Integer(i) => Some(i.to_string()),
            ValueRef::Real(f) => Some(f.to_string()),
            ValueRef::Text(b) | ValueRef::Blob(b) => Some(match std::str::from_utf8(b) {
                Ok(s) => s.to_string(),
                Err(_) => {
                    self.repaired = true;
                    String::from_utf8_lossy(b).into_owned()
                }
            }),
        }
    }

    fn seconds(&mut self, v: ValueRef) -> f64 {
        match v {
            ValueRef::Null => 0.0,
            ValueRef::Integer(i) => i as f64,
            ValueRef::Real(f) => f,
            ValueRef::Text(b) => match std::str::from_utf8(b)
                .ok()
                .and_then(|t| t.trim().parse().ok())
            {
                Some(t) => t,
                None => {
                    self.repaired = true;
                    0.0
                }
            },
            ValueRef::Blob(_) => {
                self.repaired = true;
                0.0
            }
        }
    }
}

/// A SQLite URI for `path` with `query`, the path percent-encoded (a `?`,
/// `#` or `%` in a directory name is a character, not syntax).
fn file_uri(path: &Path, query: &str) -> String {
    let mut uri = String::from("file:");
    for b in path.as_os_str().as_encoded_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'-' | b'_' | b'.' | b'~' => {
                uri.push(*b as char)
            }
            _ => uri.push_str(&format!("%{b:02X}")),
        }
    }
    format!("{uri}?{query}")
}

/// Whether SQLite failed to open a file it needs beside the database (its
/// `-shm`), rather than the database itself being unreadable.
fn cannot_open_beside(e: &anyhow::Error) -> bool {
    crate::sqlite::failed_with(
        e,
        &[
            rusqlite::ErrorCode::CannotOpen,
            rusqlite::ErrorCode::ReadOnly,
            rusqlite::ErrorCode::SystemIoFailure,
        ],
    )
}

fn columns(conn: &Connection, table: &str) -> Result<HashSet<String>> {
    let mut stmt = conn.prepare(&format!("PRAGMA table_info({table})"))?;
    let cols = stmt
        .query_map([], |r| r.get::<_, String>(1))?
        .collect::<rusqlite::Result<HashSet<_>>>()?;
    Ok(cols)
}

impl StateDb {
    pub fn open(path: &Path) -> Result<Self> {
        if !path.is_file() {
            bail!("no Hermes database at {}", path.display());
        }
        let open = |query: &str| -> Result<(Connection, HashSet<String>)> {
            let conn = Connection::open_with_flags(
                file_uri(path, query),
                OpenFlags::SQLITE_OPEN_READ_ONLY
                    | OpenFlags::SQLITE_OPEN_URI
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .with_context(|| format!("cannot open {} read-only", path.display()))?;
            conn.busy_timeout(Duration::from_secs(5))?;
            let has = columns(&conn, "messages")?;
            Ok((conn, has))
        };
        let (conn, has) = match open("mode=ro") {
            Ok(opened) => opened,
            // A WAL database needs its shared-memory file beside it, which a
            // reader cannot create in a read-only directory (a mounted
            // backup): read the file as it is, without the WAL.
            Err(e) if cannot_open_beside(&e) => {
                let opened = open("mode=ro&immutable=1")
                    .with_context(|| format!("{}: cannot read its schema", path.display()))?;
                let mut wal = path.as_os_str().to_os_string();
                wal.push("-wal");
                let unread = std::fs::metadata(&wal).map_or(0, |m| m.len());
                tracing::warn!(
                    "{}: read as an immutable file: SQLite could not open its shared-memory file \
                     beside it (a read-only directory?){}",
                    path.display(),
                    if unread > 0 {
                        format!(
                            "; the latest changes, in its WAL ({unread} bytes), are not read until \
                             the file is checkpointed or the directory writable"
                        )
                    } else {
                        String::new()
                    }
                );
                opened
            }
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("{}: cannot read its schema", path.display()));
            }
        };
        let session_cols = columns(&conn, "sessions")?;
        for needed in ["id", "session_id", "role", "content", "timestamp"] {
            if !has.contains(needed) {
                bail!(
                    "{}: messages table has no `{needed}` column; is this a Hermes state.db?",
                    path.display()
                );
            }
        }
        if !session_cols.contains("source") {
            bail!(
                "{}: sessions table has no `source` column; is this a Hermes state.db?",
                path.display()
            );
        }
        Ok(Self {
            conn,
            path: path.to_path_buf(),
            has,
            session_cols,
            repaired: RefCell::default(),
        })
    }

    /// Hermes's `schema_version`, when the database records one.
    pub fn schema_version(&self) -> Option<i64> {
        self.conn
            .query_row("SELECT MAX(version) FROM schema_version", [], |r| r.get(0))
            .ok()
            .flatten()
    }

    /// Ids of the messages read so far whose content or timestamp had to be
    /// repaired (bytes that are not UTF-8, a timestamp that is no number).
    pub fn repaired(&self) -> Vec<i64> {
        self.repaired.borrow().clone()
    }

    pub fn message_count(&self) -> Result<i64> {
        Ok(self
            .conn
            .query_row("SELECT COUNT(*) FROM messages", [], |r| r.get(0))?)
    }

    pub fn sessions(&self) -> Result<HashMap<String, Session>> {
        let col = |c: &str| {
            if self.session_cols.contains(c) {
                c.to_string()
            } else {
                format!("NULL AS {c}")
            }
        };
        let sql = format!(
            "SELECT id, source, {}, {}, {}, {} FROM sessions",
            col("title"),
            col("model"),
            col("started_at"),
            col("parent_session_id")
        );
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt.query_map([], |r| {
            let mut v = Lenient { repaired: false };
            Ok(Session {
                id: v.text(r.get_ref(0)?).unwrap_or_default(),
                source: v.text(r.get_ref(1)?).unwrap_or_default(),
                title: v.text(r.get_ref(2)?),
                model: v.text(r.get_ref(3)?),
                started_at: v.seconds(r.get_ref(4)?),
                parent: v.text(r.get_ref(5)?),
            })
        })?;
        let mut out = HashMap::new();
        for s in rows {
            let s = s.with_context(|| format!("{}: cannot read sessions", self.path.display()))?;
            out.insert(s.id.clone(), s);
        }
        Ok(out)
    }

    /// `column` if this schema has it, else `fallback`.
    fn column(&self, column: &str, fallback: &str) -> String {
        if self.has.contains(column) {
            column.to_string()
        } else {
            fallback.to_string()
        }
    }

    /// What Hermes's search shows: not rewound (`active = 0 AND compacted = 0`), not hidden scaffolding.
    fn visible(&self) -> String {
        format!(
            "NOT ({} = 0 AND {} = 0) AND COALESCE({}, '') <> 'hidden'",
            self.column("active", "1"),
            self.column("compacted", "0"),
            self.column("display_kind", "NULL")
        )
    }

    /// Every visible message of the selected roles, in id order, read in
    /// pages of short transactions. Rows that give no text are left out.
    pub fn messages(&self, selection: &Selection, mut each: impl FnMut(Message)) -> Result<()> {
        let placeholders = vec!["?"; selection.roles.len()].join(",");
        let sql = format!(
            "SELECT id, session_id, role, content, {}, timestamp FROM messages \
             WHERE id > ? AND role IN ({placeholders}) AND {} ORDER BY id LIMIT {PAGE}",
            self.column("tool_calls", "NULL"),
            self.visible(),
        );
        let mut stmt = self.conn.prepare(&sql)?;
        let mut after = 0i64;
        loop {
            let mut page = Vec::with_capacity(PAGE as usize);
            // One statement is one read transaction (autocommit), released before the next page.
            let rows = stmt.query_map(after_and_roles(after, selection), |r| {
                let mut v = Lenient { repaired: false };
                let row = (
                    r.get::<_, i64>(0)?,
                    v.text(r.get_ref(1)?).unwrap_or_default(),
                    v.text(r.get_ref(2)?).unwrap_or_default(),
                    v.text(r.get_ref(3)?),
                    v.text(r.get_ref(4)?),
                    v.seconds(r.get_ref(5)?),
                );
                Ok((row, v.repaired))
            })?;
            for row in rows {
                let (row, repaired) =
                    row.with_context(|| format!("{}: cannot read messages", self.path.display()))?;
                if repaired {
                    self.repaired.borrow_mut().push(row.0);
                }
                page.push(row);
            }
            let Some(last) = page.last() else { break };
            after = last.0;
            let full = page.len() as i64 == PAGE;
            for (id, session_id, role, content, tool_calls, timestamp) in page {
                if let Some(text) = message_text(&role, content.as_deref(), tool_calls.as_deref()) {
                    each(Message {
                        id,
                        session_id,
                        role,
                        timestamp,
                        text,
                    });
                }
            }
            if !full {
                break;
            }
        }
        Ok(())
    }
}

/// The parameters of `id > ? AND role IN (?, …)`.
fn after_and_roles(
    after: i64,
    selection: &Selection,
) -> rusqlite::ParamsFromIter<Vec<rusqlite::types::Value>> {
    let mut params: Vec<rusqlite::types::Value> = vec![after.into()];
    params.extend(selection.roles.iter().map(|r| r.clone().into()));
    rusqlite::params_from_iter(params)
}

impl StateDb {
    /// Visible messages of the selected roles newer than message `after`:
    /// how many, and the time of the first (a cheap look at what an index
    /// that holds up to `after` lacks; one query on the id key).
    pub fn newer_than(&self, after: i64, selection: &Selection) -> Result<(usize, Option<f64>)> {
        let placeholders = vec!["?"; selection.roles.len()].join(",");
        let sql = format!(
            "SELECT COUNT(*), MIN(timestamp) FROM messages WHERE id > ? AND role IN ({placeholders}) AND {} \
             AND (COALESCE(content, '') <> '' OR {} IS NOT NULL)",
            self.visible(),
            self.column("tool_calls", "NULL"),
        );
        let (count, first) = self
            .conn
            .query_row(&sql, after_and_roles(after, selection), |r| {
                let mut v = Lenient { repaired: false };
                let first = match r.get_ref(1)? {
                    rusqlite::types::ValueRef::Null => None,
                    value => Some(v.seconds(value)),
                };
                Ok((r.get::<_, i64>(0)?, first))
            })
            .with_context(|| format!("{}: cannot read messages", self.path.display()))?;
        Ok((count.max(0) as usize, first))
    }

    /// Every visible message of one session, any role, in order (for `recall show`).
    pub fn session_messages(&self, session: &str) -> Result<Vec<Message>> {
        let sql = format!(
            "SELECT id, role, content, {}, timestamp FROM messages WHERE session_id = ? AND {} ORDER BY id",
            self.column("tool_calls", "NULL"),
            self.visible(),
        );
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt.query_map([session], |r| {
            let mut v = Lenient { repaired: false };
            Ok((
                r.get::<_, i64>(0)?,
                v.text(r.get_ref(1)?).unwrap_or_default(),
                v.text(r.get_ref(2)?),
                v.text(r.get_ref(3)?),
                v.seconds(r.get_ref(4)?),
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (id, role, content, tool_calls, timestamp) =
                row.with_context(|| format!("{}: cannot read messages", self.path.display()))?;
            let text =
                message_text(&role, content.as_deref(), tool_calls.as_deref()).unwrap_or_default();
            out.push(Message {
                id,
                session_id: session.to_string(),
                role,
                timestamp,
                text,
            });
        }
        Ok(out)
    }
}

/// The searchable text of a message: plain content, the text parts of
/// `"\x00json:"` content, a tool result's first 8192 characters, or, for an
/// assistant turn that only calls tools, the calls' names and arguments.
pub fn message_text(role: &str, content: Option<&str>, tool_calls: Option<&str>) -> Option<String> {
    let mut text = match content {
        Some(c) if c.starts_with("\u{0}json:") => json_text_parts(&c["\u{0}json:".len()..]),
        Some(c) => c.to_string(),
        None => String::new(),
    };
    if role == "tool" && text.chars().count() > TOOL_CONTENT_CHARS {
        text = text.chars().take(TOOL_CONTENT_CHARS).collect();
    }
    if text.trim().is_empty() && role == "assistant" {
        text = tool_calls.map(tool_call_text).unwrap_or_default();
    }
    let text = text.trim().to_string();
    (!text.is_empty()).then_some(text)
}

fn json_text_parts(json: &str) -> String {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(json) else {
        return String::new();
    };
    let parts = match &value {
        serde_json::Value::Array(parts) => parts.clone(),
        other => vec![other.clone()],
    };
    parts
        .iter()
        .filter_map(|p| match p {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Object(o) => {
                o.get("text").and_then(|t| t.as_str()).map(str::to_string)
            }
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn tool_call_text(json: &str) -> String {
    let Ok(serde_json::Value::Array(calls)) = serde_json::from_str::<serde_json::Value>(json)
    else {
        return String::new();
    };
    calls
        .iter()
        .filter_map(|c| {
            let f = c.get("function")?;
            let name = f.get("name")?.as_str()?;
            let args = f.get("arguments").map(|a| {
                a.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| a.to_string())
            });
            Some(format!("{name}({})", args.unwrap_or_default()))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_of_each_content_shape() {
        assert_eq!(
            message_text("user", Some(" hi "), None).as_deref(),
            Some("hi")
        );
        assert_eq!(message_text("user", None, None), None);
        let parts = "\u{0}json:[{\"type\":\"text\",\"text\":\"look\"},{\"type\":\"image_url\",\"image_url\":{}},{\"type\":\"text\",\"text\":\"here\"}]";
        assert_eq!(
            message_text("user", Some(parts), None).as_deref(),
            Some("look\nhere")
        );
        let calls = r#"[{"id":"1","type":"function","function":{"name":"terminal","arguments":"{\"command\":\"df -h\"}"}}]"#;
        assert_eq!(
            message_text("assistant", None, Some(calls)).as_deref(),
            Some("terminal({\"command\":\"df -h\"})")
        );
        let long = "x".repeat(10_000);
        assert_eq!(
            message_text("tool", Some(&long), None).unwrap().len(),
            TOOL_CONTENT_CHARS
        );
    }
}
