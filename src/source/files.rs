//! Hermes's per-session files in `$HERMES_HOME/sessions/`: gateway
//! transcripts (`<id>.jsonl`) and CLI snapshots (`session_<id>.json`). Read
//! only for sessions that `state.db` does not hold; a malformed line is
//! counted, never fatal.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use super::hermes::{Message, Selection, Session, message_text};

#[derive(Debug, Default)]
pub struct FileSessions {
    pub sessions: Vec<Session>,
    pub messages: Vec<Message>,
    pub malformed_lines: usize,
    pub unreadable_files: usize,
}

/// Message ids of file sessions are negative, so they never collide with
/// `state.db` row ids: derived from the session id and the line number.
fn file_message_id(session: &str, index: usize) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in session.bytes().chain((index as u64).to_le_bytes()) {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    -((h >> 1) as i64) - 1
}

fn timestamp(v: Option<&Value>) -> f64 {
    match v {
        Some(Value::Number(n)) => n.as_f64().unwrap_or(0.0),
        _ => 0.0,
    }
}

fn content_of(v: &Value) -> Option<String> {
    match v.get("content") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(parts @ Value::Array(_)) => Some(format!("\u{0}json:{parts}")),
        _ => None,
    }
}

pub fn read(home: &Path, known: &HashMap<String, Session>, selection: &Selection) -> FileSessions {
    let mut out = FileSessions::default();
    let Ok(entries) = std::fs::read_dir(home.join("sessions")) else {
        return out;
    };
    let mut paths: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (id, rows): (String, Vec<Value>) = if let Some(id) = name.strip_suffix(".jsonl") {
            let Ok(text) = std::fs::read_to_string(&path) else {
                out.unreadable_files += 1;
                continue;
            };
            let mut rows = Vec::new();
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                match serde_json::from_str::<Value>(line) {
                    Ok(v @ Value::Object(_)) => rows.push(v),
                    _ => out.malformed_lines += 1,
                }
            }
            (id.to_string(), rows)
        } else if let Some(id) = name
            .strip_prefix("session_")
            .and_then(|n| n.strip_suffix(".json"))
        {
            match std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            {
                Some(v) => (
                    id.to_string(),
                    v.get("messages")
                        .and_then(|m| m.as_array())
                        .cloned()
                        .unwrap_or_default(),
                ),
                None => {
                    out.unreadable_files += 1;
                    continue;
                }
            }
        } else {
            continue;
        };
        if known.contains_key(&id) {
            continue;
        }
        let mut source = "gateway".to_string();
        let mut started = f64::MAX;
        for (index, row) in rows.iter().enumerate() {
            let role = row.get("role").and_then(|r| r.as_str()).unwrap_or("");
            if role == "session_meta" {
                if let Some(p) = row.get("platform").and_then(|p| p.as_str()) {
                    source = p.to_string();
                }
                continue;
            }
            let ts = timestamp(row.get("timestamp"));
            started = started.min(ts);
            if !selection.roles.iter().any(|r| r == role) {
                continue;
            }
            let tool_calls = row.get("tool_calls").map(|t| t.to_string());
            if let Some(text) =
                message_text(role, content_of(row).as_deref(), tool_calls.as_deref())
            {
                out.messages.push(Message {
                    id: file_message_id(&id, index),
                    session_id: id.clone(),
                    role: role.to_string(),
                    timestamp: ts,
                    text,
                });
            }
        }
        out.sessions.push(Session {
            id,
            source,
            title: None,
            model: None,
            started_at: if started == f64::MAX { 0.0 } else { started },
            parent: None,
        });
    }
    out
}
