//! What a Hermes profile holds now, and how the index tells what changed:
//! a fingerprint per message, compared with the one stored.

use std::collections::{HashMap, HashSet};

use anyhow::Result;
use sha2::{Digest, Sha256};

use crate::source::files;
use crate::source::hermes::{Message, Profile, Selection, Session, StateDb};

/// A message as it is now: its session, role, time and text.
pub(super) fn fingerprint(m: &Message) -> String {
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
pub(super) struct Snapshot {
    pub(super) sessions: HashMap<String, Session>,
    pub(super) messages: Vec<Message>,
    pub(super) file_messages: usize,
    pub(super) malformed_lines: usize,
    /// Messages read with bytes or a timestamp repaired (`StateDb::repaired`).
    pub(super) repaired: Vec<i64>,
}

pub(super) fn read_profile(profile: &Profile, selection: &Selection) -> Result<Snapshot> {
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

/// Marks a message of a sparse (BGE-M3) index that a fallback without
/// sparse weights embedded: the local engine embeds it again when it can.
pub(super) const DENSE_ONLY: &str = "~dense";

/// Whether the index holds `fingerprint` as it is now (`indexed`), counting
/// a message a fallback embedded without sparse weights as done unless the
/// local engine can `upgrade` it.
pub(super) fn up_to_date(indexed: Option<&String>, fingerprint: &str, upgrade: bool) -> bool {
    match indexed {
        Some(held) if held == fingerprint => true,
        Some(held) => !upgrade && held.strip_suffix(DENSE_ONLY) == Some(fingerprint),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(text: &str) -> Message {
        Message {
            id: 1,
            session_id: "s".into(),
            role: "user".into(),
            timestamp: 1.5,
            text: text.into(),
        }
    }

    #[test]
    fn a_fingerprint_changes_with_every_part_of_a_message() {
        let base = message("disk cleanup");
        let same = fingerprint(&base);
        assert_eq!(same, fingerprint(&message("disk cleanup")));
        assert_eq!(same.len(), 32);
        let changed = [
            Message {
                session_id: "t".into(),
                ..base.clone()
            },
            Message {
                role: "assistant".into(),
                ..base.clone()
            },
            Message {
                timestamp: 2.5,
                ..base.clone()
            },
            message("disk cleanup!"),
        ];
        for m in changed {
            assert_ne!(fingerprint(&m), same, "{m:?}");
        }
        // Parts are separated: moving a character across a boundary shows.
        let a = Message {
            session_id: "ab".into(),
            role: "c".into(),
            ..base.clone()
        };
        let b = Message {
            session_id: "a".into(),
            role: "bc".into(),
            ..base
        };
        assert_ne!(fingerprint(&a), fingerprint(&b));
    }

    #[test]
    fn lineage_follows_parents_to_the_first_session_and_stops_on_cycles() {
        let session = |id: &str, parent: Option<&str>| {
            (
                id.to_string(),
                Session {
                    id: id.into(),
                    source: "cli".into(),
                    title: None,
                    model: None,
                    started_at: 0.0,
                    parent: parent.map(String::from),
                },
            )
        };
        let sessions: HashMap<String, Session> = [
            session("a", None),
            session("b", Some("a")),
            session("c", Some("b")),
            session("x", Some("y")),
            session("y", Some("x")),
            session("orphan", Some("gone")),
        ]
        .into_iter()
        .collect();
        assert_eq!(lineage_root("c", &sessions), "a");
        assert_eq!(lineage_root("a", &sessions), "a");
        assert_eq!(lineage_root("orphan", &sessions), "orphan");
        assert_eq!(lineage_root("unknown", &sessions), "unknown");
        let root = lineage_root("x", &sessions);
        assert!(root == "x" || root == "y", "{root}");
    }

    #[test]
    fn dense_only_messages_are_done_unless_the_local_engine_can_upgrade_them() {
        let fp = "f00d";
        let dense_only = format!("{fp}{DENSE_ONLY}");
        assert!(up_to_date(Some(&fp.to_string()), fp, true));
        assert!(up_to_date(Some(&dense_only), fp, false));
        assert!(!up_to_date(Some(&dense_only), fp, true));
        assert!(!up_to_date(Some(&"beef".to_string()), fp, false));
        assert!(!up_to_date(None, fp, false));
    }
}
