//! `recall search` and `recall show` on a history written by the real Hermes,
//! indexed with the real all-MiniLM-L6-v2.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::common::*;
use serde_json::Value;

/// One indexed history shared by the tests (indexing it once).
fn home() -> &'static Path {
    static HOME: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &HOME
        .get_or_init(|| {
            let tmp = tempfile::tempdir().unwrap();
            let home = tmp.path().join("hermes");
            hermes_db(&["create", home.to_str().unwrap()]);
            index_with_minilm(&home);
            (tmp, home)
        })
        .1
}

/// `recall index` of the history at `home` with all-MiniLM-L6-v2.
fn index_with_minilm(home: &Path) {
    let minilm = minilm_dir();
    let (ok, _, err) = recall_cli(&[
        "index",
        "--hermes-home",
        home.to_str().unwrap(),
        "--model",
        minilm.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
}

/// `recall search --json QUERY EXTRA...`: the results.
fn search(query: &str, extra: &[&str]) -> Vec<Value> {
    search_in(home(), query, extra)
}

/// `recall search --json QUERY EXTRA...` in the history at `home`.
fn search_in(home: &Path, query: &str, extra: &[&str]) -> Vec<Value> {
    let minilm = minilm_dir();
    let mut args = vec![
        "search",
        "--json",
        query,
        "--hermes-home",
        home.to_str().unwrap(),
        "--model",
        minilm.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (ok, out, err) = recall_cli(&args);
    assert!(ok, "search {query:?} failed: {err}");
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn first_session(results: &[Value]) -> &str {
    results
        .first()
        .map(|r| r["session_id"].as_str().unwrap())
        .unwrap_or("(nothing)")
}

#[test]
fn a_paraphrase_finds_the_session_keywords_miss() {
    let results = search("the server ran out of space", &[]);
    assert_eq!(
        first_session(&results),
        "20260301_101500_aa0001",
        "{results:?}"
    );
    let r = &results[0];
    // The compressed continuation is the same conversation: one result, not two.
    assert!(
        results
            .iter()
            .filter(|r| r["lineage_root"] == "20260301_101500_aa0001")
            .count()
            == 1
    );
    assert_eq!(r["link"], "@session:default/20260301_101500_aa0001");
    assert_eq!(r["title"], "Disk cleanup on the build server");
    assert_eq!(r["source"], "cli");
    assert!(r["match_message_id"].as_i64().unwrap() > 0);
    assert!(r["when"].as_str().unwrap().ends_with('Z'));
    assert!(!r["snippet"].as_str().unwrap().is_empty());
    assert!(r["score"].as_f64().unwrap() > 0.0);
}

/// Everyday conversations (`tests/hermes/chat/`), all about one person's
/// life, so every session is near every question: each question, asked as
/// a user asks it, finds its session first and points at (or next to) the
/// turn that answers it; topics never discussed get only weak results.
#[test]
fn questions_about_everyday_life_find_the_turn_that_answers() {
    #[derive(serde::Deserialize)]
    struct History {
        questions: Vec<Question>,
        absent: Vec<String>,
    }
    #[derive(serde::Deserialize)]
    struct Question {
        query: String,
        session: String,
        answer: usize,
    }
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("hermes");
    let file = repo_root().join("tests/hermes/chat/history.json");
    let ids = hermes_db(&[
        "chat-create",
        home.to_str().unwrap(),
        file.to_str().unwrap(),
    ])["ids"]
        .clone();
    index_with_minilm(&home);
    let history: History = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    // Each question's session comes first, opened within two messages of
    // the answer (what Hermes's `session_search(around_message_id=…)`
    // shows around it); most point at the answering turn itself, and few
    // right answers are marked weak.
    let (mut wrong, mut exact, mut weak) = (Vec::new(), 0, 0);
    for q in &history.questions {
        let results = search_in(&home, &q.query, &[]);
        let session = ids[&q.session].as_array().unwrap();
        let answer = session[q.answer].as_i64().unwrap();
        let first = &results[0];
        let at = first["match_message_id"].as_i64().unwrap_or(0);
        let near = session
            .iter()
            .position(|m| m.as_i64() == Some(at))
            .is_some_and(|i| i.abs_diff(q.answer) <= 2);
        if first_session(&results) != q.session || !near {
            wrong.push(format!(
                "{:?}: want {} message {answer}, got {} message {at}",
                q.query, q.session, first["session_id"]
            ));
        }
        exact += (at == answer) as usize;
        weak += (first["weak"] == true) as usize;
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let n = history.questions.len();
    assert!(exact * 2 >= n, "{exact} of {n} point at the answering turn");
    assert!(weak * 5 <= n, "{weak} of {n} right answers are marked weak");
    for query in &history.absent {
        let results = search_in(&home, query, &[]);
        assert!(
            results.iter().all(|r| r["weak"] == true),
            "{query:?} is never discussed: {results:?}"
        );
    }
}

#[test]
fn exact_identifiers_and_chinese_are_found() {
    assert_eq!(
        first_session(&search("nginx -t", &[])),
        "20260302_090000_aa0002"
    );
    assert_eq!(
        first_session(&search("数据库迁移", &[])),
        "20260303_180000_aa0003"
    );
    assert_eq!(
        first_session(&search("pgloader", &[])),
        "20260303_180000_aa0003"
    );
}

#[test]
fn hermes_rules_hidden_sources_and_filters() {
    // Only a subagent session mentions it: Hermes never shows those.
    let r = search("ERR_CONNECTION_RESET", &[]);
    assert!(
        r.iter()
            .all(|r| r["session_id"] != "20260304_120000_aa0004"),
        "a subagent session was returned: {r:?}"
    );
    assert_eq!(
        first_session(&search("unread email", &[])),
        "20260305_070000_aa0005"
    );
    // Filtered to telegram, whose one session is about nginx: only weak results, all from telegram.
    let r = search("unread email", &["--source", "telegram"]);
    assert!(
        r.iter()
            .all(|r| r["source"] == "telegram" && r["weak"] == true),
        "{r:?}"
    );
    let r = search("docker images", &["--role", "assistant"]);
    assert!(r.iter().all(|r| r["role"] == "assistant"), "{r:?}");
    assert!(search("docker images", &["--since", "2999-01-01"]).is_empty());
    assert!(
        search("docker images", &["--session", "20260302_090000_aa0002"])
            .iter()
            .all(|r| r["session_id"] == "20260302_090000_aa0002")
    );
    for fusion in ["rrf", "weighted"] {
        assert_eq!(
            first_session(&search(
                "the server ran out of space",
                &["--fusion", fusion]
            )),
            "20260301_101500_aa0001"
        );
    }
    assert_eq!(
        first_session(&search(
            "the server ran out of space",
            &["--mmr", "0.5", "--half-life", "30"]
        )),
        "20260301_101500_aa0001"
    );
}

#[test]
fn an_absent_topic_returns_only_weak_results() {
    for query in [
        "a recipe for chocolate cake",
        "quantum chromodynamics lattice simulation",
    ] {
        let r = search(query, &[]);
        assert!(r.iter().all(|r| r["weak"] == true), "{query}: {r:?}");
    }
    // An identifier matched word for word is never weak. (Whether a
    // paraphrase stands out is judged against the rest of the history:
    // tests/eval.rs, on 80 sessions; five are too few to tell.)
    assert_eq!(search("nginx -t", &[])[0]["weak"], false);
    // With --min-score (a cosine of this model's), weak passages are left out.
    assert!(search("a recipe for chocolate cake", &["--min-score", "0.3"]).is_empty());
}

#[test]
fn bad_queries_get_clear_answers() {
    let minilm = minilm_dir();
    let h = home().to_str().unwrap();
    let m = minilm.to_str().unwrap();
    let (ok, _, err) = recall_cli(&["search", "  ", "--hermes-home", h, "--model", m]);
    assert!(!ok && err.contains("the query is empty"), "{err}");
    let long = "disk ".repeat(20_000);
    assert!(
        recall_cli(&["search", &long, "--hermes-home", h, "--model", m]).0,
        "a 100,000-character query"
    );
    for syntax in [
        "\"unbalanced",
        "disk*",
        "NEAR(disk space)",
        "content:disk",
        "a OR",
        "\"\"",
        "(",
        "sites -t -- ^",
    ] {
        let (ok, _, err) = recall_cli(&["search", syntax, "--hermes-home", h, "--model", m]);
        assert!(ok, "{syntax:?}: {err}");
    }
    // Numbers that cannot be meant are refused by name.
    for (flag, value, needle) in [
        ("--half-life", "0", "--half-life"),
        ("--half-life", "-3", "--half-life"),
        ("--min-score", "nan", "--min-score"),
        ("--mmr", "1.5", "--mmr"),
        ("--limit", "0", "--limit"),
    ] {
        let arg = format!("{flag}={value}");
        let (ok, _, err) = recall_cli(&["search", "disk", &arg, "--hermes-home", h, "--model", m]);
        assert!(!ok && err.contains(needle), "{arg}: {err}");
    }
    let (ok, _, err) = recall_cli(&[
        "search",
        "x",
        "--index",
        "/nonexistent/index.db",
        "--hermes-home",
        h,
        "--model",
        m,
    ]);
    assert!(
        !ok && err.contains("no index at /nonexistent/index.db"),
        "{err}"
    );
    let tiny = tiny_model_dir();
    let (ok, _, err) = recall_cli(&[
        "search",
        "disk",
        "--hermes-home",
        h,
        "--model",
        tiny.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("built with another model"), "{err}");
}

#[test]
fn show_prints_the_window_around_a_hit() {
    let h = home().to_str().unwrap();
    let (ok, out, err) = recall_cli(&[
        "show",
        "@session:default/20260301_101500_aa0001",
        "--hermes-home",
        h,
        "--around",
        "3",
        "--window",
        "1",
    ]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert_eq!(
        lines[0],
        "session 20260301_101500_aa0001 \"Disk cleanup on the build server\": messages 2–4 of 7"
    );
    assert!(
        lines[2].starts_with("> [3]") && lines[2].contains("docker images take 40GB"),
        "{out}"
    );
    let (ok, _, err) = recall_cli(&[
        "show",
        "20260301_101500_aa0001",
        "--hermes-home",
        h,
        "--around",
        "9999",
    ]);
    assert!(
        !ok && err.contains("message 9999 is not in session"),
        "{err}"
    );
}

#[test]
fn colbert_rerank_needs_and_uses_bge_m3_heads() {
    let minilm = minilm_dir();
    let (ok, _, err) = recall_cli(&[
        "search",
        "docker",
        "--rerank",
        "--hermes-home",
        home().to_str().unwrap(),
        "--model",
        minilm.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("dense vectors only"), "{err}");

    // The tiny BGE-M3 has the heads: rerank runs and keeps the result set's shape.
    let tmp = tempfile::tempdir().unwrap();
    let h = tmp.path().join("hermes");
    hermes_db(&["create", h.to_str().unwrap()]);
    let tiny = tiny_model_dir();
    assert!(
        recall_cli(&[
            "index",
            "--hermes-home",
            h.to_str().unwrap(),
            "--model",
            tiny.to_str().unwrap()
        ])
        .0
    );
    let (ok, out, err) = recall_cli(&[
        "search",
        "docker images",
        "--rerank",
        "--json",
        "--min-score=-1",
        "--hermes-home",
        h.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let results: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!results.is_empty());
    assert!(results.windows(2).all(|w| w[0]["source"] == "cron"
        || w[1]["source"] == "cron"
        || w[0]["score"].as_f64() >= w[1]["score"].as_f64()));
}

/// The text output shows each result's similarity (a strong match's well
/// above a marginal one's), not the fused rank score, which only orders.
#[test]
fn text_results_show_a_similarity_that_means_something() {
    let minilm = minilm_dir();
    let (ok, out, err) = recall_cli(&[
        "search",
        "the server ran out of space",
        "-n",
        "2",
        "--hermes-home",
        home().to_str().unwrap(),
        "--model",
        minilm.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let similarity = |line: &str| -> f32 {
        let at = line.find("similarity ").unwrap_or_else(|| panic!("{out}")) + "similarity ".len();
        line[at..at + 4].parse().unwrap()
    };
    let results: Vec<&str> = out.lines().filter(|l| l.starts_with(['1', '2'])).collect();
    assert_eq!(results.len(), 2, "{out}");
    assert!(!out.contains("score"), "{out}");
    assert!(
        results[0].starts_with("1. Disk cleanup")
            && similarity(results[0]) > similarity(results[1]) + 0.1,
        "{out}"
    );
}
