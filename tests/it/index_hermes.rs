//! `recall index` on databases written by the real Hermes
//! (hermes-agent==0.19.0's SessionDB, driven by tests/hermes/hermes_db.py),
//! and on the v5 and v30 schemas built from their DDL.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common::*;
use recall::index::store::Store;
use rusqlite::Connection;
use serde_json::Value;

/// `recall index --json` on `home` with `model`, which must succeed; the summary.
fn index(home: &Path, model: &Path, extra: &[&str]) -> Value {
    let out = recall()
        .args(["index", "--json"])
        .hermes_home(home)
        .model(model)
        .args(extra)
        .output()
        .assert_ok();
    serde_json::from_str(out.stdout.lines().last().unwrap()).unwrap()
}

fn sha256(path: &Path) -> String {
    recall::model::manifest::sha256_file(path).unwrap()
}

/// Message ids in the index, after checking that it is consistent.
fn indexed_ids(home: &Path) -> BTreeSet<i64> {
    let store = assert_index_consistent(home);
    let mut stmt = store.conn().prepare("SELECT id FROM messages").unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect()
}

/// What Hermes's own search would show: the ids recall must hold.
fn eligible_ids(home: &Path, roles: &[&str]) -> BTreeSet<i64> {
    let conn = Connection::open_with_flags(
        home.join("state.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let roles = roles
        .iter()
        .map(|r| format!("'{r}'"))
        .collect::<Vec<_>>()
        .join(",");
    let sql = format!(
        "SELECT id FROM messages WHERE role IN ({roles}) AND NOT (active = 0 AND compacted = 0) \
         AND (TRIM(COALESCE(content, '')) <> '' OR tool_calls IS NOT NULL)"
    );
    let mut stmt = conn.prepare(&sql).unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect()
}

/// The index holds exactly what Hermes's search would show, consistently.
fn assert_complete(home: &Path, roles: &[&str]) {
    assert_eq!(indexed_ids(home), eligible_ids(home, roles));
}

fn home_in(tmp: &tempfile::TempDir) -> PathBuf {
    tmp.path().join("hermes")
}

#[test]
fn indexes_real_hermes_in_wal_and_delete_mode_without_touching_state_db() {
    require!(hermes_python());
    for mode in ["wal", "delete"] {
        let tmp = tempfile::tempdir().unwrap();
        let home = HermesHome::create_in_mode(home_in(&tmp), mode);
        let journal: String = Connection::open(home.join("state.db"))
            .unwrap()
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(journal, mode);
        let before = sha256(&home.join("state.db"));
        let report = index(&home, &tiny_model_dir(), &[]);
        assert_eq!(
            sha256(&home.join("state.db")),
            before,
            "{mode}: state.db changed"
        );
        assert_eq!(report["messages"], 15, "{mode}: {report}");
        assert_eq!(report["embedded_messages"], 15);
        assert_eq!(
            indexed_ids(&home),
            eligible_ids(&home, &["user", "assistant"]),
            "{mode}"
        );

        let store = Store::open_existing(&home.join("recall/index.db")).unwrap();
        let c = store.conn();
        let text = |id: i64| -> String {
            c.query_row("SELECT text FROM chunks WHERE message_id = ?", [id], |r| {
                r.get(0)
            })
            .unwrap()
        };
        assert_eq!(
            text(15),
            "Here is a screenshot of the disk usage chart",
            "text parts of \\x00json: content"
        );
        assert_eq!(
            text(13),
            "terminal({\"command\": \"df -h\"})",
            "a tool-call-only turn"
        );
        let hidden: Vec<(String, bool)> = c
            .prepare("SELECT id, hidden FROM sessions ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        assert!(
            hidden.contains(&("20260304_120000_aa0004".into(), true)),
            "subagent sessions are marked hidden"
        );
        assert!(
            hidden.contains(&("20260305_070000_aa0005".into(), false)),
            "cron sessions are kept"
        );
        let root: String = c
            .query_row(
                "SELECT lineage_root FROM sessions WHERE id = '20260301_113000_aa0006'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(root, "20260301_101500_aa0001");
        let cjk: i64 = c
            .query_row(
                "SELECT COUNT(*) FROM chunks_fts WHERE chunks_fts MATCH '数据库'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(cjk, 1, "the FTS index finds Chinese text");
        drop(store);

        // Tool results on request, cut at Hermes's 8192 characters.
        let report = index(
            &home,
            &tiny_model_dir(),
            &["--roles", "user,assistant,tool"],
        );
        assert_eq!(
            report["embedded_messages"], 1,
            "only the tool result is new: {report}"
        );
        assert_eq!(
            indexed_ids(&home),
            eligible_ids(&home, &["user", "assistant", "tool"])
        );
        assert_eq!(
            sha256(&home.join("state.db")),
            before,
            "{mode}: state.db changed"
        );
    }
}

#[test]
fn incremental_runs_follow_appends_deletes_and_edits() {
    require!(hermes_python());
    let tmp = tempfile::tempdir().unwrap();
    let home = HermesHome::create(home_in(&tmp));
    index(&home, &tiny_model_dir(), &[]);

    home.session("20260302_090000_aa0002")
        .message("user", "still broken after adding the brace");
    home.session("20260601_000000_abcdef")
        .message("user", "a brand new session about kubernetes");
    let report = index(&home, &tiny_model_dir(), &[]);
    assert_eq!(report["embedded_messages"], 2, "{report}");
    assert_eq!(report["unchanged_messages"], 15);
    assert_complete(&home, &["user", "assistant"]);

    // /retry-style rewrite: keep the first message, edit it; the rest are deleted.
    home.session("20260302_090000_aa0002")
        .rewrite(1, "nginx -t now says the config is ok");
    let report = index(&home, &tiny_model_dir(), &[]);
    assert_eq!(report["deleted_messages"], 3, "{report}");
    assert_eq!(report["embedded_messages"], 1, "{report}");
    assert_complete(&home, &["user", "assistant"]);
    let store = Store::open_existing(&home.join("recall/index.db")).unwrap();
    let texts: Vec<String> = store
        .conn()
        .prepare("SELECT text FROM chunks WHERE session_id = '20260302_090000_aa0002'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(
        texts,
        vec!["nginx -t now says the config is ok".to_string()]
    );
    let stale: i64 = store
        .conn()
        .query_row(
            "SELECT COUNT(*) FROM chunks_fts WHERE chunks_fts MATCH '\"closing brace\"'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(stale, 0, "deleted text is gone from the keyword index");
    drop(store);

    // Nothing changed: nothing embedded; a re-added identical text comes from the cache.
    let report = index(&home, &tiny_model_dir(), &[]);
    assert_eq!(report["embedded_messages"], 0, "{report}");
    home.session("20260602_000000_abcdef")
        .message("user", "docker images take 40GB");
    let report = index(&home, &tiny_model_dir(), &[]);
    assert_eq!(
        report["cached_chunks"], 1,
        "identical text is never embedded twice: {report}"
    );
    assert_eq!(report["tokens"], 0);

    let out = recall()
        .args(["stats", "--json"])
        .hermes_home(&home)
        .output()
        .assert_ok();
    let stats: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(stats["lag_messages"], 0);
    assert_eq!(stats["vectors"], stats["chunks"]);
    assert_eq!(stats["identity"]["model"], "tiny-bge-m3");
}

#[test]
fn hermes_keeps_writing_while_recall_indexes() {
    require!(hermes_python());
    let tmp = tempfile::tempdir().unwrap();
    let home = HermesHome::bulk(home_in(&tmp), 400);
    let writer = {
        let home = home.clone();
        std::thread::spawn(move || home.keep_writing(4.0))
    };
    // Index again and again for as long as Hermes writes.
    let mut runs = 0;
    while !writer.is_finished() || runs == 0 {
        index(&home, &tiny_model_dir(), &[]);
        runs += 1;
    }
    let written = writer.join().unwrap();
    assert_eq!(
        written["errors"],
        serde_json::json!([]),
        "Hermes saw errors while recall read: {written}"
    );
    assert!(written["written"].as_u64().unwrap() > 50, "{written}");
    index(&home, &tiny_model_dir(), &[]);
    assert_complete(&home, &["user", "assistant"]);
}

/// A vector and a keyword query against the index, as search runs them.
fn search_while_indexing(home: &Path) {
    let store = Store::open_existing(&home.join("recall/index.db")).unwrap();
    let Some(identity) = store.identity().unwrap() else {
        return;
    };
    let query = recall::index::store::f32_blob(&vec![0.1; identity.dimension]);
    let c = store.conn();
    let mut knn = c
        .prepare("SELECT chunk_id FROM chunks_vec WHERE embedding MATCH ? AND k = 5")
        .unwrap();
    knn.query_map([query], |r| r.get::<_, i64>(0))
        .unwrap()
        .for_each(|r| {
            r.unwrap();
        });
    let _: i64 = c
        .query_row(
            "SELECT COUNT(*) FROM chunks_fts WHERE chunks_fts MATCH 'disk'",
            [],
            |r| r.get(0),
        )
        .unwrap();
}

#[test]
fn a_killed_indexer_leaves_a_consistent_index_and_resumes() {
    require!(hermes_python());
    let tmp = tempfile::tempdir().unwrap();
    let home = HermesHome::bulk_in_mode(home_in(&tmp), 2000, "delete");
    let model = tiny_model_dir();
    let mut seed = 12345u64;
    for _ in 0..6 {
        let mut child = recall()
            .args(["index", "--json"])
            .hermes_home(&home)
            .model(&model)
            .env("RECALL_CACHE_DIR", tmp.path().join("cache"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let kill_at =
            std::time::Instant::now() + std::time::Duration::from_millis(300 + (seed >> 33) % 4000);
        // Searching the index while the indexer writes: never locked out.
        while std::time::Instant::now() < kill_at {
            if home.join("recall/index.db").exists() {
                search_while_indexing(&home);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        if home.join("recall/index.db").exists() {
            indexed_ids(&home); // consistent after every kill
        }
    }
    let report = index(&home, &model, &[]);
    assert_eq!(
        indexed_ids(&home),
        eligible_ids(&home, &["user", "assistant"]),
        "complete after resuming"
    );
    assert!(
        report["unchanged_messages"].as_u64().unwrap() > 0,
        "the killed runs' work was kept: {report}"
    );
}

#[test]
fn another_model_is_refused_until_rebuild() {
    require!(hermes_python());
    let minilm = require!(minilm_dir());
    let tmp = tempfile::tempdir().unwrap();
    let home = HermesHome::create(home_in(&tmp));
    index(&home, &tiny_model_dir(), &[]);
    let err = recall()
        .arg("index")
        .hermes_home(&home)
        .model(&minilm)
        .output()
        .assert_err()
        .stderr;
    for needle in [
        "never mixed",
        "model: index has tiny-bge-m3, now all-MiniLM-L6-v2",
        "dimension: index has 32, now 384",
        "recall index --rebuild",
    ] {
        assert!(err.contains(needle), "{needle:?} in {err}");
    }
    let report = index(&home, &minilm, &["--rebuild"]);
    assert_eq!(report["embedded_messages"], 15, "{report}");
    // Rebuilding again with the same model embeds nothing: the cache survives rebuilds.
    let report = index(&home, &minilm, &["--rebuild"]);
    assert_eq!(report["cached_chunks"], 15, "{report}");
    assert_eq!(report["tokens"], 0, "{report}");
    let out = recall()
        .args(["stats", "--json"])
        .hermes_home(&home)
        .output();
    let stats: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(stats["identity"]["dimension"], 384);
    assert_complete(&home, &["user", "assistant"]);
}

/// bf16 vectors share f32's space (docs/bf16.md): a bf16 engine adds to
/// and searches an index f32 built, and f32 one bf16 built; q8's are
/// another revision and are refused.
#[test]
fn bf16_and_f32_share_an_index_and_q8_does_not() {
    require!(hermes_python());
    let tmp = tempfile::tempdir().unwrap();
    let home = HermesHome::create(home_in(&tmp));
    index(&home, &tiny_model_dir(), &["--dtype", "bf16"]);
    let kubernetes = home.session("20260601_000000_abcdef");
    kubernetes.message("user", "a brand new session about kubernetes");
    let report = index(&home, &tiny_model_dir(), &[]);
    assert_eq!(report["embedded_messages"], 1, "{report}");
    kubernetes.message("user", "and the pods keep restarting");
    let report = index(&home, &tiny_model_dir(), &["--dtype", "bf16"]);
    assert_eq!(report["embedded_messages"], 1, "{report}");
    assert_eq!(report["unchanged_messages"], 16, "{report}");
    assert_complete(&home, &["user", "assistant"]);
    let out = recall()
        .args(["search", "--json", "pods keep restarting"])
        .hermes_home(&home)
        .model(&tiny_model_dir())
        .args(["--dtype", "bf16"])
        .output()
        .assert_ok()
        .stdout;
    assert!(out.contains("20260601_000000_abcdef"), "{out}");

    let out = recall()
        .arg("index")
        .hermes_home(&home)
        .model(&tiny_model_dir())
        .args(["--dtype", "q8"])
        .output();
    assert!(!out.success(), "a q8 engine wrote into an f32/bf16 index");
    assert!(out.stderr.contains("+q8"), "{}", out.stderr);
}

#[test]
fn session_files_profiles_and_missing_database() {
    require!(hermes_python());
    let tmp = tempfile::tempdir().unwrap();
    let home = HermesHome::create(home_in(&tmp));
    HermesHome::at(home.join("profiles/work"))
        .session("20260701_000000_0000aa")
        .message("user", "work profile message");
    std::fs::create_dir_all(home.join("sessions")).unwrap();
    std::fs::write(
        home.join("sessions/20250101_000000_0f0f0f.jsonl"),
        "{\"role\":\"session_meta\",\"platform\":\"telegram\"}\n\
         {\"role\":\"user\",\"content\":\"an old gateway transcript about backups\",\"timestamp\":1700000000}\n\
         not json at all\n\
         {\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"use restic\"}]}\n",
    )
    .unwrap();
    // A transcript of a session state.db already holds is not read again.
    std::fs::write(
        home.join("sessions/20260301_101500_aa0001.jsonl"),
        "{\"role\":\"user\",\"content\":\"dup\"}\n",
    )
    .unwrap();
    let report = index(&home, &tiny_model_dir(), &["--all-profiles"]);
    assert_eq!(report["profiles"], serde_json::json!(["default", "work"]));
    assert_eq!(report["session_file_messages"], 2, "{report}");
    assert_eq!(report["malformed_lines"], 1);
    assert_eq!(report["messages"], 15 + 2 + 1);

    let report = index(&home, &tiny_model_dir(), &["--profile", "work"]);
    assert_eq!(report["profiles"], serde_json::json!(["work"]));

    let err = recall()
        .arg("index")
        .hermes_home(&tmp.path().join("nowhere"))
        .model(&tiny_model_dir())
        .output()
        .assert_err()
        .stderr;
    assert!(err.contains("no Hermes database"), "{err}");
}

const V5_DDL: &str = "
CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, user_id TEXT, model TEXT, model_config TEXT,
  system_prompt TEXT, parent_session_id TEXT, started_at REAL NOT NULL, ended_at REAL, end_reason TEXT,
  message_count INTEGER DEFAULT 0, tool_call_count INTEGER DEFAULT 0, input_tokens INTEGER DEFAULT 0,
  output_tokens INTEGER DEFAULT 0, title TEXT);
CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, role TEXT NOT NULL,
  content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT, timestamp REAL NOT NULL, token_count INTEGER,
  finish_reason TEXT);
CREATE VIRTUAL TABLE messages_fts USING fts5(content, content=messages, content_rowid=id);
";

const V30_DDL: &str = "
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version VALUES (30);
CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, created_source TEXT, user_id TEXT,
  model TEXT, model_config TEXT, parent_session_id TEXT, started_at REAL NOT NULL, ended_at REAL, title TEXT,
  archived INTEGER NOT NULL DEFAULT 0, pinned INTEGER NOT NULL DEFAULT 0, hidden INTEGER NOT NULL DEFAULT 0);
CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL REFERENCES sessions(id),
  role TEXT NOT NULL, content TEXT, tool_call_id TEXT, tool_calls TEXT, tool_name TEXT, effect_disposition TEXT,
  timestamp REAL NOT NULL, token_count INTEGER, finish_reason TEXT, reasoning TEXT, platform_message_id TEXT,
  observed INTEGER DEFAULT 0, _compressed_summary INTEGER NOT NULL DEFAULT 0, active INTEGER NOT NULL DEFAULT 1,
  compacted INTEGER NOT NULL DEFAULT 0, api_content TEXT, display_kind TEXT, display_metadata TEXT,
  display_identity BLOB, display_order INTEGER);
CREATE VIEW messages_fts_src AS SELECT id, content, tool_name, tool_calls FROM messages;
CREATE VIRTUAL TABLE messages_fts USING fts5(content, tool_name, tool_calls, content='messages_fts_src', content_rowid='id');
";

#[test]
fn old_and_current_schemas_are_read_by_their_columns() {
    let tmp = tempfile::tempdir().unwrap();
    // v5: no active/compacted/display_kind columns.
    let v5 = tmp.path().join("v5");
    std::fs::create_dir_all(&v5).unwrap();
    let c = Connection::open(v5.join("state.db")).unwrap();
    c.execute_batch(V5_DDL).unwrap();
    c.execute_batch(
        "INSERT INTO sessions (id, source, started_at, title) VALUES ('20250101_000000_000001', 'cli', 1.0, 'old');
         INSERT INTO messages (session_id, role, content, timestamp) VALUES
           ('20250101_000000_000001', 'user', 'an old question about the disk', 1.0),
           ('20250101_000000_000001', 'assistant', 'an old answer', 2.0),
           ('20250101_000000_000001', 'system', 'system prompt', 0.5);",
    )
    .unwrap();
    drop(c);
    let report = index(&v5, &tiny_model_dir(), &[]);
    assert_eq!(report["messages"], 2, "{report}");

    // v30: hidden scaffolding and rewound rows are skipped, compaction-archived rows kept.
    let v30 = tmp.path().join("v30");
    std::fs::create_dir_all(&v30).unwrap();
    let c = Connection::open(v30.join("state.db")).unwrap();
    c.execute_batch(V30_DDL).unwrap();
    c.execute_batch(
        "INSERT INTO sessions (id, source, started_at) VALUES ('20261101_000000_000001', 'cli', 1.0);
         INSERT INTO messages (id, session_id, role, content, timestamp, active, compacted, display_kind) VALUES
           (1, '20261101_000000_000001', 'user', 'live message', 1.0, 1, 0, NULL),
           (2, '20261101_000000_000001', 'assistant', 'archived by compaction', 2.0, 0, 1, NULL),
           (3, '20261101_000000_000001', 'user', 'rewound by undo', 3.0, 0, 0, NULL),
           (4, '20261101_000000_000001', 'user', 'model-facing scaffolding', 4.0, 1, 0, 'hidden');",
    )
    .unwrap();
    drop(c);
    index(&v30, &tiny_model_dir(), &[]);
    assert_eq!(indexed_ids(&v30), BTreeSet::from([1, 2]));
}

#[test]
fn two_indexers_starting_on_a_new_index_both_finish_consistent() {
    require!(hermes_python());
    let tmp = tempfile::tempdir().unwrap();
    let home = HermesHome::bulk(home_in(&tmp), 1000);
    let model = tiny_model_dir();
    let runs: Vec<std::process::Child> = (0..2)
        .map(|_| {
            recall()
                .args(["index", "--json"])
                .hermes_home(&home)
                .model(&model)
                .spawn()
        })
        .collect();
    let mut embedded = Vec::new();
    let mut waited = false;
    for run in runs {
        let out = run.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        waited |= err.contains("waiting for it");
        let report: Value =
            serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap())
                .unwrap();
        embedded.push(report["embedded_messages"].as_u64().unwrap());
    }
    // One embeds everything; the other waits for it and finds nothing left.
    embedded.sort();
    assert_eq!(embedded[0], 0, "the work was done twice: {embedded:?}");
    assert!(waited, "the second run did not say it waited");
    assert_complete(&home, &["user", "assistant"]);
}

#[test]
fn rows_that_are_not_clean_text_never_stop_indexing() {
    require!(hermes_python());
    let tmp = tempfile::tempdir().unwrap();
    let home = HermesHome::create(home_in(&tmp));
    let ids = home.odd_rows();
    let storage: Vec<String> = {
        let conn = Connection::open(home.join("state.db")).unwrap();
        ids[..3]
            .iter()
            .map(|id| {
                conn.query_row(
                    "SELECT typeof(content) || '/' || typeof(timestamp) FROM messages WHERE id = ?",
                    [id],
                    |r| r.get(0),
                )
                .unwrap()
            })
            .collect()
    };
    assert_eq!(storage, ["blob/real", "text/real", "text/text"]);
    let before = sha256(&home.join("state.db"));
    let Output { stdout, stderr, .. } = recall()
        .args(["index", "--json"])
        .hermes_home(&home)
        .model(&tiny_model_dir())
        .output()
        .assert_ok();
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(report["repaired_messages"], 3, "{report}");
    assert!(stderr.contains("not UTF-8"), "{stderr}");
    assert_eq!(sha256(&home.join("state.db")), before);
    // Every message is in the index, the odd ones with their bytes replaced.
    let held = indexed_ids(&home);
    for id in &ids {
        assert!(held.contains(id), "message {id} not indexed");
    }
    let store = assert_index_consistent(&home);
    let text: String = store
        .conn()
        .query_row(
            "SELECT text FROM chunks WHERE message_id = ?",
            [ids[0]],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        text.starts_with("the backup disk é is full") && text.contains('\u{fffd}'),
        "{text:?}"
    );
    // A later run goes on as usual, and `recall show` reads the session.
    home.session("20260601_000000_0dd001")
        .message("user", "one more");
    let report = index(&home, &tiny_model_dir(), &[]);
    assert_eq!(report["embedded_messages"], 1, "{report}");
    let out = recall()
        .args(["show", "20260601_000000_0dd001"])
        .hermes_home(&home)
        .output()
        .assert_ok()
        .stdout;
    assert!(out.contains("rsync") && out.contains("one more"), "{out}");
    // What Hermes stored never reaches the terminal as control characters.
    assert!(!out.contains('\u{1b}') && !out.contains('\u{7}'), "{out:?}");
    assert!(out.contains("\\u{1b}]0;pwned"), "{out:?}");
    let out = recall()
        .args(["search", "rsync"])
        .hermes_home(&home)
        .model(&tiny_model_dir())
        .output()
        .assert_ok()
        .stdout;
    assert!(out.contains("Odd \\u{1b}[2J"), "{out:?}");
    assert!(!out.contains('\u{1b}') && !out.contains('\u{0}'), "{out:?}");
    // A window of any size is the whole session, never an overflow.
    let out = recall()
        .args(["show", "20260601_000000_0dd001"])
        .hermes_home(&home)
        .args(["--around", &ids[1].to_string()])
        .args(["--window", "18446744073709551615"])
        .output()
        .assert_ok()
        .stdout;
    // The title is shown, its control characters escaped.
    let first = out.lines().next().unwrap();
    assert!(
        first.starts_with("session 20260601_000000_0dd001 \"Odd ")
            && first.ends_with("\": messages 1–5 of 5")
            && !first.contains('\u{1b}'),
        "{out}"
    );
    let out = recall()
        .args(["show", "20260601_000000_0dd001"])
        .hermes_home(&home)
        .args(["--window", "18446744073709551615"])
        .output();
    assert!(
        out.success() && out.stdout.lines().count() == 6,
        "{}",
        out.stdout
    );
}

#[test]
fn a_read_only_backup_and_an_odd_path_are_read() {
    require!(hermes_python());
    let tmp = tempfile::tempdir().unwrap();
    chmod(tmp.path(), 0o755);
    let home = HermesHome::create(tmp.path().join("home"));
    // A copy of a live database (with its WAL, without its shared-memory
    // file) in a read-only directory whose name has `?`, `#` and `%` in it:
    // characters, not URI syntax.
    let backup = tmp.path().join("we?ird#backup%20");
    home.live_copy(&backup);
    let [wal, shm, _] = recall::index::guard::companions(&backup.join("state.db"));
    assert!(wal.exists() && !shm.exists());
    for f in ["state.db", "state.db-wal"] {
        chmod(&backup.join(f), 0o644);
    }
    chmod(&backup, 0o555);
    let before = sha256(&backup.join("state.db"));
    let out_dir = tmp.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    chmod(&out_dir, 0o777);
    let index_path = out_dir.join("index.db");
    let out = recall()
        .without_root()
        .args(["index", "--json"])
        .hermes_home(&backup)
        .arg("--index")
        .arg(&index_path)
        .model(&tiny_model_dir())
        .env("RECALL_CACHE_DIR", &out_dir)
        .env("HOME", &out_dir)
        .output();
    chmod(&backup, 0o755);
    let Output { stdout, stderr, .. } = out.assert_ok();
    assert!(
        stderr.contains("immutable") && stderr.contains("WAL"),
        "{stderr}"
    );
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(report["messages"], 15, "{report}");
    assert_eq!(sha256(&backup.join("state.db")), before);
}

/// A first index whose model cannot be loaded (no such directory, not a
/// model, none at all offline) is an error with what to do (exit 1, not the
/// "try again later" 75), and writes nothing: no index, no lock file, no
/// line that reads as success.
#[test]
fn a_first_index_without_a_model_says_what_to_do_and_writes_nothing() {
    require!(hermes_python());
    let tmp = tempfile::tempdir().unwrap();
    let home = HermesHome::create(tmp.path().join("hermes"));
    let home_s = home.to_str().unwrap();
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let hub = tmp.path().join("hub");
    let offline = [
        ("HOME", tmp.path().to_str().unwrap()),
        ("HF_HUB_CACHE", hub.to_str().unwrap()),
        ("HF_HUB_OFFLINE", "1"),
    ];
    for (args, envs, why) in [
        (
            vec![
                "index",
                "--hermes-home",
                home_s,
                "--model",
                "/nonexistent/model",
            ],
            &offline[..0],
            "no such directory",
        ),
        (
            vec![
                "index",
                "--hermes-home",
                home_s,
                "--model",
                empty.to_str().unwrap(),
            ],
            &offline[..0],
            "missing config.json",
        ),
        (
            vec!["index", "--hermes-home", home_s],
            &offline[..],
            "offline",
        ),
    ] {
        let Output {
            code,
            stdout: out,
            stderr: err,
            ..
        } = recall().args(&args).envs(envs.iter().copied()).output();
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.contains(why) && err.contains("--model DIR") && err.contains("recall model fetch"),
            "{args:?}: {err}"
        );
        assert!(!out.contains("indexed"), "{out}");
        assert!(
            !home.join("recall").exists(),
            "{args:?} wrote {:?}",
            std::fs::read_dir(home.join("recall"))
                .unwrap()
                .collect::<Vec<_>>()
        );
    }
}

/// Ctrl-C during indexing ends it at once, saying how far it got and how
/// to go on; what was written stays consistent.
#[test]
fn ctrl_c_says_how_far_indexing_got() {
    require!(hermes_python());
    let minilm = require!(minilm_dir());
    let tmp = tempfile::tempdir().unwrap();
    let home = HermesHome::bulk(tmp.path().join("hermes"), 4000);
    let child = recall()
        .arg("index")
        .hermes_home(&home)
        .model(&minilm)
        .spawn();
    // Once the index holds the sessions, the run is embedding messages.
    let index = home.join("recall/index.db");
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(60) {
        let sessions = rusqlite::Connection::open_with_flags(
            &index,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .and_then(|c| c.query_row("SELECT COUNT(*) FROM sessions", [], |r| r.get::<_, i64>(0)));
        if sessions.is_ok_and(|n| n > 0) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("interrupted after embedding ")
            && stderr.contains(" of 4000 messages;")
            && stderr.contains("run `recall index` again"),
        "{stderr}"
    );
    assert_index_consistent(&home);
}
