//! The embedding providers: Ollama and OpenAI-compatible ones against a real
//! HTTP server (`recall serve`, which speaks both APIs, with the tiny
//! model), behind a fault-injecting proxy, in a fallback chain, refused when
//! of another vector space, and keyword-only search when none is up.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use recall::index::store::Store;
use recall::provider::{Chain, Config, Input, Kind, Provider, Vector};
use serde_json::{Value, json};

// ---------------------------------------------------------------- helpers

/// A Hermes home with the small realistic history (real Hermes SessionDB).
fn hermes_home() -> (tempfile::TempDir, HermesHome) {
    let dir = tempfile::tempdir().unwrap();
    let home = HermesHome::create(dir.path().join("hermes"));
    (dir, home)
}

/// `recall serve` with the tiny model, which has BGE-M3's heads: served as
/// `bge-m3`, the family recall's own engine gives it too.
fn server() -> Server {
    Server::start(&tiny_model_dir(), &[])
}

/// Writes `toml` to a config file in `dir`.
fn config_file(dir: &Path, toml: &str) -> PathBuf {
    let path = dir.join("config.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// `recall ARGS --hermes-home HOME --config CONFIG`.
fn recall_with(home: &Path, config: &Path, args: &[&str]) -> Output {
    recall()
        .args(args)
        .hermes_home(home)
        .arg("--config")
        .arg(config)
        .output()
}

/// Every chunk of the index with its vector, after checking that the index
/// is consistent: each chunk has one vector of the index's width, each
/// message its chunks.
fn stored(home: &Path) -> Vec<(String, Vec<f32>)> {
    let store = assert_index_consistent(home);
    let c = store.conn();
    let width = store.identity().unwrap().unwrap().dimension;
    let mut stmt = c
        .prepare("SELECT c.text, v.embedding FROM chunks c JOIN chunks_vec v ON v.chunk_id = c.id ORDER BY c.id")
        .unwrap();
    let rows: Vec<(String, Vec<f32>)> = stmt
        .query_map([], |r| {
            let blob: Vec<u8> = r.get(1)?;
            Ok((
                r.get(0)?,
                blob.chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for (text, v) in &rows {
        assert_eq!(v.len(), width, "{text:?}");
        assert!(v.iter().all(|x| x.is_finite()), "{text:?}");
    }
    rows
}

/// The tiny model, loaded in this process.
fn tiny() -> Arc<recall::Embedder> {
    let cache = std::env::temp_dir().join("recall-test-cache");
    Arc::new(load(&tiny_model_dir(), &cache).unwrap())
}

/// Each stored vector is the tiny model's vector of its text.
fn assert_vectors_are_the_models(rows: &[(String, Vec<f32>)]) {
    let embedder = tiny();
    let texts: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    let local = embedder.embed(&texts, recall::Outputs::DENSE).unwrap();
    for ((text, v), e) in rows.iter().zip(&local) {
        let d = max_abs_diff(v, e.dense.as_ref().unwrap());
        assert!(d < 1e-5, "{text:?}: stored vector differs by {d}");
    }
}

fn lag(home: &Path) -> i64 {
    let out = recall()
        .args(["stats", "--json"])
        .hermes_home(home)
        .output()
        .assert_ok();
    serde_json::from_str::<Value>(&out.stdout).unwrap()["lag_messages"]
        .as_i64()
        .unwrap()
}

// ---------------------------------------------------------- fault proxy

#[derive(Debug, Clone)]
enum Fault {
    /// Pass this request through untouched.
    Pass,
    /// The answer's `data` in reverse order (each item keeps its `index`).
    Shuffle,
    /// Close the connection without answering.
    Drop,
    /// Answer after this long.
    Delay(Duration),
    /// Answer with this status (and `Retry-After`, if given).
    Status(u16, Option<&'static str>),
    /// One vector fewer than inputs.
    WrongCount,
    /// A `NaN` in the first vector (as Python's json.dumps writes it).
    NaN,
    /// A `null` in the first vector.
    Null,
    /// The first vector one dimension short.
    WrongDimension,
}

/// A proxy in front of `upstream` that applies queued faults to the
/// embedding requests, one per request, then passes requests through.
/// With `fake_dims`, it answers OpenAI requests itself with vectors of that width.
struct Proxy {
    base: String,
    faults: Arc<Mutex<VecDeque<Fault>>>,
    /// When set, every embedding request fails with 500.
    down: Arc<std::sync::atomic::AtomicBool>,
    embeds: Arc<AtomicUsize>,
    authorization: Arc<Mutex<Vec<String>>>,
    /// Embedding requests holding this text are refused with 400 (a content filter).
    refuse: Arc<Mutex<Option<String>>>,
}

impl Proxy {
    fn start(upstream: &str, fake_dims: Option<usize>) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let proxy = Proxy {
            base,
            faults: Default::default(),
            down: Default::default(),
            embeds: Default::default(),
            authorization: Default::default(),
            refuse: Default::default(),
        };
        let (faults, down, embeds, auth, refuse) = (
            proxy.faults.clone(),
            proxy.down.clone(),
            proxy.embeds.clone(),
            proxy.authorization.clone(),
            proxy.refuse.clone(),
        );
        let upstream = upstream.to_string();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (faults, down, embeds, auth, refuse, upstream) = (
                    faults.clone(),
                    down.clone(),
                    embeds.clone(),
                    auth.clone(),
                    refuse.clone(),
                    upstream.clone(),
                );
                std::thread::spawn(move || {
                    let refused = refuse.lock().unwrap().clone();
                    let _ = handle(
                        stream, &upstream, fake_dims, &faults, &down, &embeds, &auth, refused,
                    );
                });
            }
        });
        proxy
    }

    fn queue(&self, faults: &[Fault]) {
        self.faults.lock().unwrap().extend(faults.iter().cloned());
    }

    fn pending(&self) -> usize {
        self.faults.lock().unwrap().len()
    }
}

fn respond(stream: &mut TcpStream, status: u16, extra: &str, body: &str) -> std::io::Result<()> {
    write!(
        stream,
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n{body}",
        body.len()
    )
}

#[allow(clippy::too_many_arguments)]
fn handle(
    mut stream: TcpStream,
    upstream: &str,
    fake_dims: Option<usize>,
    faults: &Mutex<VecDeque<Fault>>,
    down: &std::sync::atomic::AtomicBool,
    embeds: &AtomicUsize,
    auth: &Mutex<Vec<String>>,
    refused: Option<String>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':').unwrap_or((line, ""));
        if k.eq_ignore_ascii_case("content-length") {
            length = v.trim().parse().unwrap_or(0);
        }
        if k.eq_ignore_ascii_case("authorization") {
            auth.lock().unwrap().push(v.trim().to_string());
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
    let is_embed = path.ends_with("/embed") || path.ends_with("/embeddings");
    if let Some(text) =
        refused.filter(|t| is_embed && String::from_utf8_lossy(&body).contains(t.as_str()))
    {
        embeds.fetch_add(1, Ordering::SeqCst);
        let answer = json!({"error": format!("content refused: {text}")}).to_string();
        return respond(&mut stream, 400, "", &answer);
    }
    if is_embed && fake_dims.is_none() && down.load(Ordering::SeqCst) {
        embeds.fetch_add(1, Ordering::SeqCst);
        return respond(&mut stream, 500, "", r#"{"error":"upstream is down"}"#);
    }
    let fault = if is_embed {
        embeds.fetch_add(1, Ordering::SeqCst);
        faults.lock().unwrap().pop_front()
    } else {
        None
    };
    match &fault {
        Some(Fault::Drop) => return Ok(()),
        Some(Fault::Delay(d)) => std::thread::sleep(*d),
        Some(Fault::Status(code, retry_after)) => {
            let extra = retry_after.map_or(String::new(), |s| format!("Retry-After: {s}\r\n"));
            return respond(
                &mut stream,
                *code,
                &extra,
                r#"{"error":{"message":"injected"}}"#,
            );
        }
        _ => {}
    }
    let (status, text) = match fake_dims {
        Some(dims) => {
            let request: Value = serde_json::from_slice(&body).unwrap();
            let n = request["input"].as_array().map_or(1, |a| a.len());
            let data: Vec<Value> = (0..n)
                .map(|i| json!({"index": i, "embedding": (0..dims).map(|d| ((d + i) % 7) as f32 * 0.1 + 0.01).collect::<Vec<_>>()}))
                .collect();
            (
                200,
                json!({"data": data, "model": "doubao-embedding-vision"}).to_string(),
            )
        }
        None => {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .http_status_as_error(false)
                .build()
                .into();
            let url = format!("{upstream}{path}");
            let mut r = if method == "GET" {
                agent.get(&url).call()
            } else {
                agent
                    .post(&url)
                    .header("Content-Type", "application/json")
                    .send(&body[..])
            }
            .map_err(std::io::Error::other)?;
            (
                r.status().as_u16(),
                r.body_mut()
                    .read_to_string()
                    .map_err(std::io::Error::other)?,
            )
        }
    };
    let text = match fault {
        Some(Fault::Shuffle) => {
            let mut v: Value = serde_json::from_str(&text).unwrap();
            v["data"].as_array_mut().unwrap().reverse();
            v.to_string()
        }
        Some(f @ (Fault::WrongCount | Fault::NaN | Fault::Null | Fault::WrongDimension)) => {
            let mut v: Value = serde_json::from_str(&text).unwrap();
            let list = if v.get("embeddings").is_some() {
                v["embeddings"].as_array_mut().unwrap()
            } else {
                v["data"].as_array_mut().unwrap()
            };
            let first = |list: &mut Vec<Value>| -> *mut Vec<Value> {
                let item = &mut list[0];
                let vector = if item.is_array() {
                    item
                } else {
                    &mut item["embedding"]
                };
                vector.as_array_mut().unwrap() as *mut _
            };
            // SAFETY: a pointer into `v`, used before `v` is touched again.
            let vector = unsafe { &mut *first(list) };
            match f {
                Fault::WrongCount => {
                    list.pop();
                }
                Fault::NaN => vector[0] = json!("NaN-marker"),
                Fault::Null => vector[0] = Value::Null,
                Fault::WrongDimension => {
                    vector.pop();
                }
                _ => unreachable!(),
            }
            v.to_string().replace("\"NaN-marker\"", "NaN")
        }
        _ => text,
    };
    respond(&mut stream, status, "", &text)
}

// ------------------------------------------------------------------ tests

#[test]
fn ollama_and_openai_providers_give_the_engines_vectors() {
    require!(hermes_python());
    let serve = server();
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        &format!(
            r#"
chain = ["ollama", "me"]
[providers.ollama]
base_url = "{0}"
model = "bge-m3"
[providers.me]
type = "openai"
base_url = "{0}/v1"
model = "bge-m3"
"#,
            serve.base
        ),
    );
    let chain = Config::load(Some(&config), &[])
        .unwrap()
        .build(&|_, _| unreachable!("no local provider in this chain"))
        .unwrap();
    let embedder = tiny();
    let texts = ["The disk is full", "磁盘空间不足", "fn main() {}", "🙂"];
    let local = embedder.embed(&texts, recall::Outputs::DENSE).unwrap();
    for p in chain.providers() {
        let identity = p.identity().unwrap();
        assert_eq!(identity.space().family, "bge-m3", "{}", p.name());
        assert_eq!(identity.dimension, 32);
        let inputs: Vec<Input> = texts
            .iter()
            .map(|t| Input {
                text: t,
                tokens: None,
            })
            .collect();
        let vectors: Vec<Vector> = p.embed(&inputs, false).unwrap();
        assert_eq!(vectors.len(), texts.len());
        for (v, l) in vectors.iter().zip(&local) {
            assert!(
                max_abs_diff(&v.dense, l.dense.as_ref().unwrap()) < 1e-5,
                "{}",
                p.name()
            );
        }
    }
    assert_eq!(chain.providers()[0].kind(), Kind::Ollama);
    assert_eq!(chain.providers()[1].kind(), Kind::Openai);

    // An index built through Ollama is searched through the OpenAI API.
    let (_h, home) = hermes_home();
    let Output {
        code,
        stdout: out,
        stderr: err,
        ..
    } = recall_with(&home, &config, &["index", "--provider", "ollama"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains("embedded by: ollama"), "{err}");
    assert_vectors_are_the_models(&stored(&home));
    let Output {
        code,
        stdout: out,
        stderr: err,
        ..
    } = recall_with(
        &home,
        &config,
        &[
            "search",
            "nginx unexpected end of file",
            "--provider",
            "me",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let first: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(first["title"], "Nginx config error", "{out}");

    // `recall providers` names each, its space, and the one the index uses.
    let Output {
        code,
        stdout: out,
        stderr: err,
        ..
    } = recall_with(&home, &config, &["providers", "--json"]);
    assert_eq!(code, 0, "{err}");
    let survey: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(survey["providers"][0]["used"], true, "{survey}");
    assert_eq!(survey["providers"][1]["fits_index"], true, "{survey}");
    assert_eq!(survey["index"]["space"]["dimension"], 32);
}

#[test]
fn faults_are_retried_and_never_stored_and_the_index_completes() {
    require!(hermes_python());
    let serve = server();
    let proxy = Proxy::start(&serve.base, None);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        &format!(
            r#"
chain = ["flaky"]
[providers.flaky]
type = "ollama"
base_url = "{}"
model = "bge-m3"
batch_size = 8
retries = 12
max_backoff_secs = 0.5
backoff_ms = 20
breaker_failures = 100
timeout_secs = 2
"#,
            proxy.base
        ),
    );
    let dir2 = tempfile::tempdir().unwrap();
    let home = HermesHome::bulk(dir2.path().join("hermes"), 120);

    // Faults the provider recovers from within its retries.
    proxy.queue(&[
        Fault::Drop,
        Fault::Status(500, None),
        Fault::Status(429, Some("1")),
        Fault::WrongCount,
        Fault::NaN,
        Fault::Null,
        Fault::WrongDimension,
        Fault::Delay(Duration::from_secs(3)), // past the 2 s timeout
        Fault::Status(503, Some("0")),
    ]);
    let started = std::time::Instant::now();
    let Output {
        code,
        stdout: out,
        stderr: err,
        ..
    } = recall_with(&home, &config, &["index"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(proxy.pending(), 0, "every fault was met");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After: 1 was honoured"
    );
    for seen in [
        "a wrong answer, not stored",
        "HTTP 429",
        "HTTP 500",
        "NaN",
        "not a number",
        "dimensions",
        "vectors for",
    ] {
        assert!(err.contains(seen), "no retry for {seen:?} in:\n{err}");
    }
    let rows = stored(&home);
    assert!(rows.len() >= 120);
    assert_vectors_are_the_models(&rows);
    assert_eq!(lag(&home), 0);

    // A provider down for longer than its retries: the run pauses (exit 75)
    // keeping what was done, consistent; once it is back, the next run completes.
    for i in 0..3 {
        let text = format!("new message {i}: the certificate renewal failed again");
        home.session("20260401_000000_000000")
            .message("user", &text);
    }
    proxy.down.store(true, Ordering::SeqCst);
    let Output {
        code, stderr: err, ..
    } = recall_with(&home, &config, &["index"]);
    assert_eq!(code, 75, "{err}");
    assert!(
        err.contains("indexing paused") && err.contains("flaky"),
        "{err}"
    );
    assert!(lag(&home) > 0);
    assert_vectors_are_the_models(&stored(&home));
    proxy.down.store(false, Ordering::SeqCst);
    let Output {
        code,
        stdout: out,
        stderr: err,
        ..
    } = recall_with(&home, &config, &["index"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(lag(&home), 0);
    assert_vectors_are_the_models(&stored(&home));
}

#[test]
fn a_dead_provider_is_not_hammered() {
    let serve = server();
    let proxy = Proxy::start(&serve.base, None);
    proxy.down.store(true, Ordering::SeqCst);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        &format!(
            r#"
[providers.dead]
type = "openai"
base_url = "{}/v1"
model = "bge-m3"
retries = 20
backoff_ms = 1
breaker_failures = 3
breaker_cooldown_secs = 60
"#,
            proxy.base
        ),
    );
    let chain = Config::load(Some(&config), &["dead".into()])
        .unwrap()
        .build(&|_, _| unreachable!())
        .unwrap();
    let p = &chain.providers()[0];
    let inputs = [Input {
        text: "hello",
        tokens: None,
    }];
    let err = format!("{:#}", p.embed(&inputs, false).unwrap_err());
    assert!(err.contains("HTTP 500"), "{err}");
    let after_first = proxy.embeds.load(Ordering::SeqCst);
    assert!(
        after_first <= 3,
        "{after_first} requests before the circuit opened"
    );
    let err = format!("{:#}", p.embed(&inputs, false).unwrap_err());
    assert!(
        err.contains("circuit open") && err.contains("HTTP 500"),
        "{err}"
    );
    assert_eq!(
        proxy.embeds.load(Ordering::SeqCst),
        after_first,
        "no request while open"
    );
}

/// The local engine, failing after its first `after` calls (as when it runs out of memory).
struct FailingLocal {
    inner: Arc<recall::Embedder>,
    calls: AtomicUsize,
    after: usize,
}

impl Provider for FailingLocal {
    fn name(&self) -> &str {
        "local"
    }
    fn kind(&self) -> Kind {
        Kind::Local
    }
    fn describe(&self) -> String {
        "the tiny model, failing".into()
    }
    fn identity(&self) -> Result<recall::space::Identity, recall::provider::Error> {
        self.inner.identity()
    }
    fn embed(
        &self,
        inputs: &[Input],
        sparse: bool,
    ) -> Result<Vec<Vector>, recall::provider::Error> {
        if self.calls.fetch_add(1, Ordering::SeqCst) >= self.after {
            return Err(anyhow::anyhow!("out of memory (injected)").into());
        }
        Provider::embed(&*self.inner, inputs, sparse)
    }
    fn capabilities(&self) -> recall::provider::Capabilities {
        self.inner.capabilities()
    }
    fn tokenizer(&self) -> Option<&recall::engine::TextTokenizer> {
        Provider::tokenizer(&*self.inner)
    }
    fn model_dir(&self) -> Option<&std::path::Path> {
        self.inner.model_dir()
    }
    fn embed_outputs(
        &self,
        texts: &[&str],
        outputs: recall::Outputs,
    ) -> Result<Vec<recall::Embedding>, recall::provider::Error> {
        self.inner.embed_outputs(texts, outputs)
    }
}

#[test]
fn falls_back_from_local_to_ollama_mid_index() {
    require!(hermes_python());
    let serve = server();
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        &format!(
            "[providers.ollama]\nbase_url = \"{}\"\nmodel = \"bge-m3\"\n",
            serve.base
        ),
    );
    let ollama = Config::load(Some(&config), &["ollama".into()])
        .unwrap()
        .build(&|_, _| unreachable!())
        .unwrap()
        .providers()[0]
        .clone();
    let failing = Arc::new(FailingLocal {
        inner: tiny(),
        calls: AtomicUsize::new(0),
        after: 1,
    });
    let chain = Chain::new(vec![failing.clone(), ollama]);

    let home_dir = tempfile::tempdir().unwrap();
    // Enough for several embedding groups (16,384 tokens each).
    let home = HermesHome::bulk(home_dir.path().join("hermes"), 2000);
    let report = index_in_process(&chain, &home);
    assert!(report.paused.is_none(), "{:?}", report.paused);
    assert!(
        report.embedded_by.get("local").copied().unwrap_or(0) > 0,
        "{:?}",
        report.embedded_by
    );
    assert!(
        report.embedded_by.get("ollama").copied().unwrap_or(0) > 0,
        "{:?}",
        report.embedded_by
    );
    assert_eq!(report.embedded_messages, report.messages);
    let rows = stored(&home);
    // The index was built by the local engine and stays its.
    let store = Store::open_existing(&home.join("recall/index.db")).unwrap();
    assert_eq!(store.identity().unwrap().unwrap().provider, "local");
    assert_eq!(rows.len(), report.chunks);
    assert_vectors_are_the_models(&rows);
}

#[test]
fn a_provider_of_another_space_is_refused_and_only_a_rebuild_moves_the_index() {
    require!(hermes_python());
    let big = Proxy::start("http://unused", Some(2048));
    let (_h, home) = hermes_home();
    let dir = tempfile::tempdir().unwrap();
    let tiny_dir = tiny_model_dir();
    let config = config_file(
        dir.path(),
        &format!(
            r#"
[providers.local]
model = "{}"
[providers.ark]
base_url = "{}"
api_key = "ark-secret-0123456789"
retries = 0
[providers.nolocal]
type = "local"
model = "/nonexistent/model"
"#,
            tiny_dir.display(),
            big.base
        ),
    );
    let Output {
        code, stderr: err, ..
    } = recall_with(&home, &config, &["index", "--provider", "local"]);
    assert_eq!(code, 0, "{err}");
    let before = stored(&home).len();
    home.session("20260302_090000_aa0002")
        .message("user", "and the TLS certificate expired");

    // Only the 2048-dim provider in the chain: refused, nothing written.
    let Output {
        code, stderr: err, ..
    } = recall_with(&home, &config, &["index", "--provider", "ark"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("another vector space")
            && err.contains("2048 dims")
            && err.contains("--rebuild"),
        "{err}"
    );
    assert!(
        !err.contains("ark-secret"),
        "the API key was printed: {err}"
    );
    // The index's own kind is unavailable, the other is of another space: a pause, still nothing from ark.
    let Output {
        code, stderr: err, ..
    } = recall_with(&home, &config, &["index", "--provider", "nolocal,ark"]);
    assert_eq!(code, 75, "{err}");
    assert!(
        err.contains("nolocal") && err.contains("another vector space"),
        "{err}"
    );
    assert_eq!(stored(&home).len(), before);
    assert_eq!(lag(&home), 1);
    // The key was sent, as a Bearer token.
    assert!(
        big.authorization
            .lock()
            .unwrap()
            .iter()
            .all(|a| a == "Bearer ark-secret-0123456789")
    );
    let Output {
        stdout: out,
        stderr: err,
        ..
    } = recall_with(&home, &config, &["providers", "--provider", "local,ark"]);
    assert!(!out.contains("ark-secret") && !err.contains("ark-secret"));
    assert!(out.contains("doubao-embedding-vision, 2048 dims"), "{out}");

    // --rebuild moves the index to the other space.
    let Output {
        code, stderr: err, ..
    } = recall_with(&home, &config, &["index", "--provider", "ark", "--rebuild"]);
    assert_eq!(code, 0, "{err}");
    let rows = stored(&home);
    assert_eq!(rows[0].1.len(), 2048);
    assert_eq!(lag(&home), 0);
}

#[test]
fn search_is_keyword_only_while_no_provider_is_up() {
    require!(hermes_python());
    let (_h, home) = hermes_home();
    let dir = tempfile::tempdir().unwrap();
    let dead = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_port = dead.local_addr().unwrap().port();
    drop(dead);
    let config = config_file(
        dir.path(),
        &format!(
            "[providers.local]\nmodel = \"{}\"\n[providers.ollama]\nbase_url = \"http://127.0.0.1:{dead_port}\"\nmodel = \"bge-m3\"\nretries = 0\n",
            tiny_model_dir().display()
        ),
    );
    let Output {
        code, stderr: err, ..
    } = recall_with(&home, &config, &["index", "--provider", "local"]);
    assert_eq!(code, 0, "{err}");
    let Output {
        code,
        stdout: out,
        stderr: err,
        ..
    } = recall_with(&home, &config, &["search", "nginx", "--provider", "ollama"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("keyword-only search") && err.contains("ollama"),
        "{err}"
    );
    assert!(out.starts_with("(keyword-only results"), "{out}");
    assert!(out.contains("Nginx config error"), "{out}");
    let Output {
        code, stdout: out, ..
    } = recall_with(
        &home,
        &config,
        &["search", "nginx", "--provider", "ollama", "--json"],
    );
    assert_eq!(code, 0);
    assert!(out.contains("Nginx config error"), "{out}");
    for line in out.lines() {
        let hit: Value = serde_json::from_str(line).unwrap();
        assert_eq!(hit["mode"], "keyword", "{line}");
    }
    // Dense-only search cannot do without a provider, and says so.
    let Output {
        code, stderr: err, ..
    } = recall_with(
        &home,
        &config,
        &[
            "search",
            "nginx",
            "--provider",
            "ollama",
            "--signals",
            "dense",
        ],
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("no embedding provider of the index's space"),
        "{err}"
    );
}

#[test]
fn configuration_errors_name_what_is_wrong() {
    require!(hermes_python());
    let (_h, home) = hermes_home();
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "[providers.x]\ntype = \"ollama\"\nbase_url = \"http://h\"\nmodel = \"m\"\nbatchsize = 3\n",
            "batchsize",
        ),
        ("[providers.x]\ntype = \"grpc\"\n", "grpc"),
        (
            "[providers.x]\ntype = \"openai\"\nmodel = \"m\"\n",
            "needs base_url",
        ),
        ("chain = []\n", "chain is empty"),
        ("chain = [\"nope\"]\n", "unknown provider \"nope\""),
        ("chain = \"local\"\n", "chain"),
    ];
    for (toml, expected) in cases {
        let config = config_file(dir.path(), toml);
        let Output {
            code, stderr: err, ..
        } = recall_with(&home, &config, &["providers", "--provider", "x"]);
        let Output {
            code: code2,
            stderr: err2,
            ..
        } = recall_with(&home, &config, &["providers"]);
        assert!(
            (code != 0 && err.contains(expected)) || (code2 != 0 && err2.contains(expected)),
            "{toml:?}: {err} / {err2}"
        );
    }
    // A key in a file others can read is named, with the way out.
    let keyed = config_file(
        dir.path(),
        "chain = [\"ark\"]\n[providers.ark]\ntype = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\napi_key = \"sk-x\"\n",
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&keyed, std::fs::Permissions::from_mode(0o644)).unwrap();
    let Output { stderr: err, .. } = recall_with(&home, &keyed, &["providers"]);
    assert_eq!(err.matches("chmod 600").count(), 1, "{err}");
    std::fs::set_permissions(&keyed, std::fs::Permissions::from_mode(0o600)).unwrap();
    let Output { stderr: err, .. } = recall_with(&home, &keyed, &["providers"]);
    assert!(!err.contains("chmod 600"), "{err}");
    let missing = dir.path().join("missing.toml");
    let Output {
        code, stderr: err, ..
    } = recall_with(&home, &missing, &["providers"]);
    assert_eq!(code, 1);
    assert!(err.contains("does not exist"), "{err}");
}

#[test]
fn openai_answers_out_of_order_or_wrong_are_never_stored() {
    require!(hermes_python());
    let serve = server();
    let proxy = Proxy::start(&serve.base, None);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        &format!(
            r#"
[providers.remote]
type = "openai"
base_url = "{}/v1"
model = "bge-m3"
batch_size = 4
concurrency = 2
retries = 6
backoff_ms = 10
max_backoff_secs = 0.2
"#,
            proxy.base
        ),
    );
    let (_h, home) = hermes_home();
    proxy.queue(&[
        Fault::Pass, // the probe
        Fault::Shuffle,
        Fault::WrongCount,
        Fault::NaN,
        Fault::Status(500, None),
        Fault::Shuffle,
        Fault::Null,
    ]);
    let Output {
        code,
        stdout: out,
        stderr: err,
        ..
    } = recall_with(&home, &config, &["index", "--provider", "remote"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(proxy.pending(), 0);
    assert_vectors_are_the_models(&stored(&home));
    assert_eq!(lag(&home), 0);
}

#[test]
fn a_query_that_cannot_be_embedded_falls_back_to_keywords() {
    require!(hermes_python());
    let serve = server();
    let proxy = Proxy::start(&serve.base, None);
    let (_h, home) = hermes_home();
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        &format!(
            "[providers.local]\nmodel = \"{}\"\n[providers.ollama]\nbase_url = \"{}\"\nmodel = \"bge-m3\"\nbackoff_ms = 1\n",
            tiny_model_dir().display(),
            proxy.base
        ),
    );
    let Output {
        code, stderr: err, ..
    } = recall_with(&home, &config, &["index", "--provider", "local"]);
    assert_eq!(code, 0, "{err}");
    // The probe and the same-vectors check pass; the query itself fails (one retry when someone waits).
    proxy.queue(&[
        Fault::Pass,
        Fault::Pass,
        Fault::Status(500, None),
        Fault::Status(500, None),
    ]);
    let Output {
        code,
        stdout: out,
        stderr: err,
        ..
    } = recall_with(
        &home,
        &config,
        &["search", "nginx", "--provider", "ollama", "--json"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("keyword-only search: the query could not be embedded")
            && err.contains("HTTP 500"),
        "{err}"
    );
    let hit: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(hit["mode"], "keyword");
    assert_eq!(hit["title"], "Nginx config error");
    assert_eq!(proxy.pending(), 0);
    // With the provider answering, the same search is hybrid.
    let Output {
        code, stdout: out, ..
    } = recall_with(
        &home,
        &config,
        &["search", "nginx", "--provider", "ollama", "--json"],
    );
    assert_eq!(code, 0);
    assert!(
        out.lines().all(|l| l.contains(r#""mode":"hybrid""#)),
        "{out}"
    );
}

#[test]
fn a_message_the_provider_refuses_is_left_out_and_the_rest_indexed() {
    require!(hermes_python());
    let serve = server();
    let proxy = Proxy::start(&serve.base, None);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        &format!(
            "[providers.ollama]\nbase_url = \"{}\"\nmodel = \"bge-m3\"\nbreaker_failures = 3\n",
            proxy.base
        ),
    );
    let (_h, home) = hermes_home();
    let session = "20260302_090000_aa0002";
    home.session(session)
        .message("user", "a FORBIDDEN-TOPIC message");
    *proxy.refuse.lock().unwrap() = Some("FORBIDDEN-TOPIC".into());
    let Output {
        code,
        stdout: out,
        stderr: err,
        ..
    } = recall_with(&home, &config, &["index", "--provider", "ollama"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        err.contains("refused 1 messages") && err.contains("content refused"),
        "{err}"
    );
    assert_eq!(lag(&home), 1);
    let rows = stored(&home);
    assert!(rows.iter().all(|(t, _)| !t.contains("FORBIDDEN")));
    assert_vectors_are_the_models(&rows);
    // More refusals than breaker_failures: a refusal is not the provider failing.
    let before = proxy.embeds.load(Ordering::SeqCst);
    for _ in 0..2 {
        let Output {
            code, stderr: err, ..
        } = recall_with(&home, &config, &["index", "--provider", "ollama"]);
        assert_eq!(code, 0, "{err}");
    }
    assert!(proxy.embeds.load(Ordering::SeqCst) > before);
    *proxy.refuse.lock().unwrap() = None;
    let Output {
        code, stderr: err, ..
    } = recall_with(&home, &config, &["index", "--provider", "ollama"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(lag(&home), 0);
}

#[test]
fn what_a_fallback_embedded_without_sparse_weights_is_caught_up_by_the_local_engine() {
    require!(hermes_python());
    let serve = server();
    let (_h, home) = hermes_home();
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        &format!(
            "[providers.local]\nmodel = \"{}\"\n[providers.nolocal]\ntype = \"local\"\nmodel = \"/nonexistent/model\"\n\
             [providers.ollama]\nbase_url = \"{}\"\nmodel = \"bge-m3\"\n",
            tiny_model_dir().display(),
            serve.base
        ),
    );
    let Output {
        code, stderr: err, ..
    } = recall_with(&home, &config, &["index", "--provider", "local"]);
    assert_eq!(code, 0, "{err}");
    let text = "the certificate renewal failed again on friday";
    home.session("20260302_090000_aa0002").message("user", text);
    let sparse_rows = || -> i64 {
        let store = Store::open_existing(&home.join("recall/index.db")).unwrap();
        store
            .conn()
            .query_row(
                "SELECT COUNT(*) FROM chunk_sparse s JOIN chunks c ON c.id = s.chunk_id WHERE c.text = ?",
                [text],
                |r| r.get(0),
            )
            .unwrap()
    };
    // The local engine is unavailable: Ollama (same space, checked) writes it, without sparse weights.
    let Output {
        code, stderr: err, ..
    } = recall_with(&home, &config, &["index", "--provider", "nolocal,ollama"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("embedded by: ollama 1 chunks"), "{err}");
    assert_eq!(lag(&home), 0);
    assert_eq!(sparse_rows(), 0);
    // Still without the local engine, nothing is redone.
    let Output {
        stdout: out,
        stderr: err,
        ..
    } = recall_with(
        &home,
        &config,
        &["index", "--provider", "nolocal,ollama", "--json"],
    );
    let report: Value =
        serde_json::from_str(out.lines().last().unwrap()).unwrap_or_else(|_| panic!("{out}{err}"));
    assert_eq!(report["embedded_messages"], 0, "{report}");
    // With it, the message gets its sparse weights.
    let Output {
        code,
        stdout: out,
        stderr: err,
        ..
    } = recall_with(&home, &config, &["index", "--provider", "local", "--json"]);
    assert_eq!(code, 0, "{err}");
    let report: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(report["embedded_messages"], 1, "{report}");
    assert!(sparse_rows() > 0);
    assert_vectors_are_the_models(&stored(&home));
}

/// A BGE-M3 directory is one vector space whatever its folder is called:
/// through recall's own engine and through `recall serve` (as `bge-m3`) alike.
#[test]
fn one_model_directory_is_one_space_served_or_local() {
    let (_tmp, copy) = tiny_model_copy(&[]);
    let renamed = copy.with_file_name("models-I-keep-here");
    std::fs::rename(&copy, &renamed).unwrap();
    let cache = std::env::temp_dir().join("recall-test-cache");
    let local = load(&renamed, &cache).unwrap();
    let local_identity = recall::provider::local::identity_of(&local, None);
    assert_eq!(local_identity.space().family, "bge-m3");
    let serve = Server::start(&renamed, &[]);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(
        dir.path(),
        &format!(
            "chain = [\"ollama\"]\n[providers.ollama]\nbase_url = \"{}\"\nmodel = \"bge-m3\"\n",
            serve.base
        ),
    );
    let chain = Config::load(Some(&config), &[])
        .unwrap()
        .build(&|_, _| unreachable!("no local provider in this chain"))
        .unwrap();
    let served = chain.providers()[0].identity().unwrap();
    assert_eq!(served.space(), local_identity.space());
}
