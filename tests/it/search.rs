//! `recall search` and `recall show` on a history written by the real Hermes,
//! indexed with the real all-MiniLM-L6-v2.

use std::path::Path;
use std::sync::OnceLock;

use crate::common::*;
use serde_json::Value;

/// One indexed history shared by the tests (indexing it once).
fn home() -> &'static Path {
    static HOME: OnceLock<(tempfile::TempDir, HermesHome)> = OnceLock::new();
    &HOME
        .get_or_init(|| {
            let tmp = tempfile::tempdir().unwrap();
            let home = HermesHome::create(tmp.path().join("hermes"));
            index_with_minilm(&home);
            (tmp, home)
        })
        .1
}

/// `recall index` of the history at `home` with all-MiniLM-L6-v2.
fn index_with_minilm(home: &Path) {
    recall()
        .arg("index")
        .hermes_home(home)
        .model(&minilm())
        .output()
        .assert_ok();
}

/// `recall search --json QUERY EXTRA...`: the results.
fn search(query: &str, extra: &[&str]) -> Vec<Value> {
    search_in(home(), query, extra)
}

/// `recall search --json QUERY EXTRA...` in the history at `home`.
fn search_in(home: &Path, query: &str, extra: &[&str]) -> Vec<Value> {
    recall()
        .args(["search", "--json", query])
        .hermes_home(home)
        .model(&minilm())
        .args(extra)
        .output()
        .assert_ok()
        .stdout
        .lines()
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
    require!(hermes_python());
    require!(minilm_dir());
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
    require!(hermes_python());
    require!(minilm_dir());
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
    let file = repo_root().join("tests/hermes/chat/history.json");
    let (home, ids) = HermesHome::chat(tmp.path().join("hermes"), &file);
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
    require!(hermes_python());
    require!(minilm_dir());
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
    require!(hermes_python());
    require!(minilm_dir());
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
    require!(hermes_python());
    require!(minilm_dir());
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
    require!(hermes_python());
    let minilm = require!(minilm_dir());
    let search = |query: &str, extra: &[&str]| {
        recall()
            .args(["search", query])
            .args(extra)
            .hermes_home(home())
            .model(&minilm)
            .output()
    };
    let out = search("  ", &[]);
    assert!(
        !out.success() && out.stderr.contains("the query is empty"),
        "{}",
        out.stderr
    );
    let long = "disk ".repeat(20_000);
    assert!(search(&long, &[]).success(), "a 100,000-character query");
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
        let out = search(syntax, &[]);
        assert!(out.success(), "{syntax:?}: {}", out.stderr);
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
        let Output { code, stderr, .. } = search("disk", &[arg.as_str()]);
        assert!(code != 0 && stderr.contains(needle), "{arg}: {stderr}");
    }
    let Output { code, stderr, .. } = search("x", &["--index", "/nonexistent/index.db"]);
    assert!(
        code != 0 && stderr.contains("no index at /nonexistent/index.db"),
        "{stderr}"
    );
    let Output { code, stderr, .. } = recall()
        .args(["search", "disk"])
        .hermes_home(home())
        .model(&tiny_model_dir())
        .output();
    assert!(
        code != 0 && stderr.contains("built with another model"),
        "{stderr}"
    );
}

#[test]
fn show_prints_the_window_around_a_hit() {
    require!(hermes_python());
    require!(minilm_dir());
    let out = recall()
        .args(["show", "@session:default/20260301_101500_aa0001"])
        .hermes_home(home())
        .args(["--around", "3", "--window", "1"])
        .output()
        .assert_ok()
        .stdout;
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
    let Output { code, stderr, .. } = recall()
        .args(["show", "20260301_101500_aa0001"])
        .hermes_home(home())
        .args(["--around", "9999"])
        .output();
    assert!(
        code != 0 && stderr.contains("message 9999 is not in session"),
        "{stderr}"
    );
}

#[test]
fn colbert_rerank_needs_and_uses_bge_m3_heads() {
    require!(hermes_python());
    let minilm = require!(minilm_dir());
    let Output { code, stderr, .. } = recall()
        .args(["search", "docker", "--rerank"])
        .hermes_home(home())
        .model(&minilm)
        .output();
    assert!(
        code != 0 && stderr.contains("dense vectors only"),
        "{stderr}"
    );

    // The tiny BGE-M3 has the heads: rerank runs and keeps the result set's shape.
    let tmp = tempfile::tempdir().unwrap();
    let h = HermesHome::create(tmp.path().join("hermes"));
    assert!(
        recall()
            .arg("index")
            .hermes_home(&h)
            .model(&tiny_model_dir())
            .output()
            .success()
    );
    let out = recall()
        .args([
            "search",
            "docker images",
            "--rerank",
            "--json",
            "--min-score=-1",
        ])
        .hermes_home(&h)
        .output()
        .assert_ok();
    let results: Vec<Value> = out
        .stdout
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
    require!(hermes_python());
    let minilm = require!(minilm_dir());
    let out = recall()
        .args(["search", "the server ran out of space", "-n", "2"])
        .hermes_home(home())
        .model(&minilm)
        .output()
        .assert_ok()
        .stdout;
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
