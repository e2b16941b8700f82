//! `recall watch` following a history written by the real Hermes: appends,
//! edits and deletions are searchable within seconds; a database that
//! appears later, or is replaced by another file, is followed.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

struct Watcher(Child);

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_watch(home: &Path) -> Watcher {
    let mut child = recall()
        .args(["watch", "--json"])
        .hermes_home(home)
        .model(&tiny_model_dir())
        .stderr(Stdio::null())
        .spawn();
    // Drain its output so that it never blocks on a full pipe.
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || for _ in BufReader::new(out).lines() {});
    Watcher(child)
}

/// Sessions whose text contains `words` exactly, per the index.
fn found(home: &Path, words: &str) -> Vec<String> {
    let out = recall()
        .args(["search", "--json", "--signals", "keyword", words])
        .hermes_home(home)
        .output();
    if !out.success() {
        // The index may not exist yet.
        let err = out.stderr;
        assert!(err.contains("no index") || err.contains("empty"), "{err}");
        return Vec::new();
    }
    out.stdout
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["session_id"].as_str().unwrap().to_string()
        })
        .collect()
}

/// Seconds until `check` holds (panics after `limit`).
fn until(limit: Duration, what: &str, mut check: impl FnMut() -> bool) -> f64 {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    started.elapsed().as_secs_f64()
}

const SESSION: &str = "20260601_120000_bb0001";

#[test]
fn appends_edits_and_deletions_are_followed() {
    require!(hermes_python());
    let tmp = tempfile::tempdir().unwrap();
    let home = HermesHome::create(tmp.path().join("hermes"));
    let _watch = start_watch(&home);
    until(Duration::from_secs(60), "first index", || {
        !found(&home, "nginx").is_empty()
    });

    // One watcher per index.
    let out = recall()
        .arg("watch")
        .hermes_home(&home)
        .model(&tiny_model_dir())
        .output();
    assert!(
        !out.success() && out.stderr.contains("already follows"),
        "{}",
        out.stderr
    );

    let mut latencies = Vec::new();
    for word in ["zebra", "okapi", "narwhal"] {
        let appended = home.session(SESSION).message("user", word);
        until(Duration::from_secs(20), "append", || {
            found(&home, word) == [SESSION]
        });
        // From Hermes's commit to the first search that finds it (a search is ~50 ms).
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        latencies.push(now - appended.committed_at);
    }
    // Reported, not asserted: scripts/bench_watch.sh measures it properly.
    println!("Hermes commit → searchable: {latencies:.2?} s");

    // An edit (Hermes rewrites the session's messages) and a deletion.
    home.session(SESSION).rewrite(2, "pelican harmonica");
    until(Duration::from_secs(20), "edit and deletion", || {
        found(&home, "pelican harmonica") == [SESSION]
            && found(&home, "okapi").is_empty()
            && found(&home, "narwhal").is_empty()
            && found(&home, "zebra") == [SESSION]
    });
}

#[test]
fn a_database_that_appears_later_or_is_replaced_is_followed() {
    let python = require!(hermes_python());
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("hermes");
    std::fs::create_dir_all(&home).unwrap();
    let _watch = start_watch(&home);
    std::thread::sleep(Duration::from_millis(800));
    HermesHome::create(&home);
    until(
        Duration::from_secs(60),
        "database created after start",
        || !found(&home, "nginx").is_empty(),
    );

    // Another Hermes database moved over the first (a restore from backup).
    let other = HermesHome::create(tmp.path().join("other"));
    other.session(SESSION).message("user", "walrus accordion");
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(home.join(format!("state.db{suffix}")));
    }
    // Checkpointed into one file, so that the move is one complete database.
    let status = Command::new(python)
        .args([
            "-c",
            "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('PRAGMA wal_checkpoint(TRUNCATE)'); c.close()",
            other.join("state.db").to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::rename(other.join("state.db"), home.join("state.db")).unwrap();
    until(Duration::from_secs(20), "replaced database", || {
        found(&home, "walrus accordion") == [SESSION]
    });
}

#[test]
fn a_paused_watch_resumes_when_its_provider_comes_back() {
    require!(hermes_python());
    let tmp = tempfile::tempdir().unwrap();
    let home = HermesHome::create(tmp.path().join("hermes"));
    // An Ollama provider (played by `recall serve`) that is not up yet.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = tmp.path().join("config.toml");
    std::fs::write(
        &config,
        format!("chain = [\"ollama\"]\n[providers.ollama]\nbase_url = \"http://127.0.0.1:{port}\"\nmodel = \"bge-m3\"\n"),
    )
    .unwrap();
    let mut child = recall()
        .args(["watch", "--json", "--retry-secs", "1"])
        .hermes_home(&home)
        .arg("--config")
        .arg(&config)
        .stderr(Stdio::null())
        .spawn();
    let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let (out, seen) = (child.stdout.take().unwrap(), events.clone());
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            seen.lock()
                .unwrap()
                .push(v["event"].as_str().unwrap().to_string());
        }
    });
    let _watch = Watcher(child);
    until(Duration::from_secs(20), "a paused run", || {
        events.lock().unwrap().iter().any(|e| e == "paused")
    });
    assert!(found(&home, "nginx").is_empty());
    let _server = Server::start(&tiny_model_dir(), &["--port", &port.to_string()]);
    until(
        Duration::from_secs(20),
        "indexed once the provider is up",
        || !found(&home, "nginx").is_empty(),
    );
}
