//! `recall serve` with the tiny BGE-M3: the real client libraries (openai,
//! ollama, LangChain, from PyPI) get `recall embed`'s vectors; TEI's sparse
//! and ColBERT routes; errors in each client's shape; limits, API key,
//! backpressure, batching across requests, graceful shutdown; /search.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::{Value, json};

const TEXTS: &[&str] = &[
    "The server ran out of disk space",
    "磁盘空间不足，需要清理日志",
    "nginx -t: unexpected end of file 🚀",
];

trait Stop {
    /// SIGTERM, then the exit status and standard error.
    fn stop(self) -> (std::process::ExitStatus, String);
}

impl Stop for Server {
    fn stop(mut self) -> (std::process::ExitStatus, String) {
        terminate(&self.child);
        let status = self.child.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut self.child.stderr.take().unwrap(), &mut err).unwrap();
        (status, err)
    }
}

fn start(extra: &[&str]) -> Server {
    Server::start(&tiny_model_dir(), extra)
}

fn terminate(child: &Child) {
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .into()
}

/// POST `body` as JSON: (status, JSON answer, Retry-After).
fn post(url: &str, body: &Value) -> (u16, Value, Option<String>) {
    post_with(url, body, None)
}

fn post_with(url: &str, body: &Value, key: Option<&str>) -> (u16, Value, Option<String>) {
    let mut request = agent().post(url);
    if let Some(key) = key {
        request = request.header("Authorization", &format!("Bearer {key}"));
    }
    let mut response = request.send_json(body).unwrap();
    let status = response.status().as_u16();
    let retry = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let text = response.body_mut().read_to_string().unwrap();
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value, retry)
}

fn get(url: &str) -> (u16, String) {
    let mut response = agent().get(url).call().unwrap();
    (
        response.status().as_u16(),
        response.body_mut().read_to_string().unwrap(),
    )
}

/// `recall embed --sparse --colbert` of TEXTS with the tiny model.
fn reference() -> Vec<Value> {
    recall()
        .arg("embed")
        .model(&tiny_model_dir())
        .args(["--sparse", "--colbert"])
        .args(TEXTS)
        .output()
        .assert_ok()
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn assert_vectors(name: &str, got: &Value, want: &[Vec<f32>]) {
    let got: Vec<Vec<f32>> = got.as_array().unwrap().iter().map(floats).collect();
    assert_eq!(got.len(), want.len(), "{name}: count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{name}[{i}]: dimension");
        let diff = max_abs_diff(g, w);
        assert!(
            diff < 1e-6,
            "{name}[{i}]: differs from recall embed by {diff}"
        );
    }
}

#[test]
fn real_clients_get_recall_embeds_vectors() {
    let python = require!(clients_python());
    let want: Vec<Vec<f32>> = reference().iter().map(|r| floats(&r["dense"])).collect();
    let server = start(&[]);
    let out = Command::new(python)
        .arg(repo_root().join("tests/clients/clients.py"))
        .arg(&server.base)
        .arg(serde_json::to_string(TEXTS).unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "clients.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    for name in [
        "openai_default",
        "openai_float",
        "openai_base64",
        "ollama_embed",
        "langchain_openai",
        "langchain_ollama",
    ] {
        assert_vectors(name, &got[name], &want);
    }
    assert_vectors(
        "ollama_embeddings",
        &json!([got["ollama_embeddings"]]),
        &want[..1],
    );
    let tokens: u64 = reference()
        .iter()
        .map(|r| r["tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(got["openai_usage"], tokens);
    assert_eq!(got["openai_unknown_model"]["status"], 404);
    assert_eq!(got["openai_unknown_model"]["code"], "model_not_found");
    assert_eq!(got["openai_dimensions"]["status"], 400);
    assert_eq!(got["openai_dimensions"]["param"], "dimensions");
    assert_eq!(got["ollama_unknown_model"]["status"], 404);
    assert!(
        got["ollama_tags"]
            .as_array()
            .unwrap()
            .contains(&json!("bge-m3:latest")),
        "{}",
        got["ollama_tags"]
    );
    let (status, _) = server.stop();
    assert!(status.success());
}

#[test]
fn tei_routes_give_sparse_weights_and_colbert_vectors() {
    let reference = reference();
    let server = start(&[]);
    let (status, dense, _) = post(&server.url("/embed"), &json!({"inputs": TEXTS}));
    assert_eq!(status, 200);
    let want: Vec<Vec<f32>> = reference.iter().map(|r| floats(&r["dense"])).collect();
    assert_vectors("/embed", &dense, &want);

    let (status, sparse, _) = post(&server.url("/embed_sparse"), &json!({"inputs": TEXTS}));
    assert_eq!(status, 200);
    for (got, want) in sparse.as_array().unwrap().iter().zip(&reference) {
        let want = want["sparse"].as_array().unwrap();
        let got = got.as_array().unwrap();
        assert_eq!(got.len(), want.len());
        for w in want {
            let g = got.iter().find(|g| g["index"] == w["id"]).unwrap();
            assert!((g["value"].as_f64().unwrap() - w["weight"].as_f64().unwrap()).abs() < 1e-6);
        }
    }

    let (status, colbert, _) = post(&server.url("/embed_all"), &json!({"inputs": TEXTS}));
    assert_eq!(status, 200);
    for (got, want) in colbert.as_array().unwrap().iter().zip(&reference) {
        let want: Vec<Vec<f32>> = want["colbert"]
            .as_array()
            .unwrap()
            .iter()
            .map(floats)
            .collect();
        assert_vectors("/embed_all", got, &want);
    }
}

#[test]
fn token_ids_and_text_give_the_same_vector() {
    let model = tiny_model_dir();
    let cache = tempfile::tempdir().unwrap();
    let embedder = load(&model, cache.path()).unwrap();
    let ids: Vec<u32> = embedder.tokenize(&[TEXTS[0]]).unwrap()[0].ids.clone();
    let server = start(&[]);
    let (_, text, _) = post(&server.url("/v1/embeddings"), &json!({"input": TEXTS[0]}));
    let (status, by_ids, _) = post(&server.url("/v1/embeddings"), &json!({"input": [ids]}));
    assert_eq!(status, 200, "{by_ids}");
    assert_eq!(
        floats(&text["data"][0]["embedding"]),
        floats(&by_ids["data"][0]["embedding"])
    );
    let (status, one, _) = post(&server.url("/v1/embeddings"), &json!({"input": ids}));
    assert_eq!(status, 200);
    assert_eq!(one["data"][0]["embedding"], by_ids["data"][0]["embedding"]);
}

#[test]
fn bad_requests_get_clear_errors_in_the_clients_shape() {
    let server = start(&["--max-items", "3", "--max-body-bytes", "4000"]);
    let openai = server.url("/v1/embeddings");
    let ollama = server.url("/api/embed");
    let long = "word ".repeat(400);

    let check = |url: &str, body: Value, status: u16, needle: &str| {
        let (got, answer, _) = post(url, &body);
        assert_eq!(got, status, "{body}: {answer}");
        let message = answer["error"]["message"]
            .as_str()
            .or(answer["error"].as_str())
            .unwrap_or_else(|| panic!("no error message in {answer}"));
        assert!(message.contains(needle), "{message:?} lacks {needle:?}");
        answer
    };
    let a = check(
        &openai,
        json!({"input": "x", "model": "gpt-4"}),
        404,
        "gpt-4",
    );
    assert_eq!(a["error"]["type"], "invalid_request_error");
    check(&openai, json!({"input": ""}), 400, "empty string");
    check(&openai, json!({"input": []}), 400, "empty array");
    check(&openai, json!({"input": [1, "a"]}), 400, "token id");
    check(&openai, json!({"input": [[999999]]}), 400, "vocabulary");
    check(
        &openai,
        json!({"input": "x", "encoding_format": "int8"}),
        400,
        "int8",
    );
    check(
        &openai,
        json!({"input": ["a", "b", "c", "d"]}),
        400,
        "limit is 3",
    );
    let a = check(&openai, json!({"input": long}), 400, "limit of 256");
    assert_eq!(a["error"]["param"], "input");
    check(&openai, json!({"inputs": "x"}), 400, "not valid");
    check(
        &openai,
        json!({"input": "x".repeat(5000)}),
        413,
        "4000 bytes",
    );

    // Ollama cuts by default, refuses with truncate: false.
    let (status, cut, _) = post(&ollama, &json!({"model": "bge-m3", "input": long}));
    assert_eq!(status, 200);
    assert_eq!(cut["prompt_eval_count"], 256);
    check(
        &ollama,
        json!({"input": long, "truncate": false}),
        400,
        "limit of 256",
    );
    let a = check(
        &ollama,
        json!({"model": "llama3", "input": "x"}),
        404,
        "llama3",
    );
    assert!(a["error"].is_string());
    check(
        &ollama,
        json!({"input": "x", "dimensions": 1024}),
        400,
        "32-dimensional",
    );

    let (status, tei, _) = post(&server.url("/embed"), &json!({"inputs": long}));
    assert_eq!(status, 400);
    assert_eq!(tei["error_type"], "validation");

    // The empty string has no embedding on any route (one rule, as OpenAI and TEI have it).
    for (route, body) in [
        ("/api/embed", json!({"input": ""})),
        ("/api/embed", json!({"input": ["a", ""]})),
        ("/api/embeddings", json!({"prompt": ""})),
        ("/embed", json!({"inputs": ""})),
        ("/embed_sparse", json!({"inputs": [""]})),
    ] {
        let (status, answer, _) = post(&server.url(route), &body);
        assert_eq!(status, 400, "{route} {body}: {answer}");
        assert!(
            answer.to_string().contains("empty string"),
            "{route}: {answer}"
        );
    }
}

#[test]
fn api_key_is_required_off_loopback_and_checked() {
    let err = recall()
        .args(["serve", "--host", "0.0.0.0", "--port", "0"])
        .model(&tiny_model_dir())
        .output()
        .assert_err()
        .stderr;
    assert!(err.contains("--api-key"), "{err}");

    let server = start(&["--api-key", "s3cret"]);
    let url = server.url("/v1/embeddings");
    let body = json!({"input": "x"});
    assert_eq!(post_with(&url, &body, None).0, 401);
    let (status, answer, _) = post_with(&url, &body, Some("wrong"));
    assert_eq!(status, 401);
    assert_eq!(answer["error"]["code"], "invalid_api_key");
    assert_eq!(post_with(&url, &body, Some("s3cret")).0, 200);
    // The scheme is case-insensitive (RFC 9110).
    for header in ["bearer s3cret", "BEARER s3cret", "Bearer  s3cret "] {
        let response = agent()
            .post(&url)
            .header("Authorization", header)
            .send_json(&body)
            .unwrap();
        assert_eq!(response.status().as_u16(), 200, "{header:?}");
    }
    assert_eq!(get(&server.url("/health")).0, 200);
    assert_eq!(get(&server.url("/info")).0, 401);
}

/// A web page cannot use a server without an API key: not by DNS
/// rebinding (its requests name the page's host), not by a form or
/// plain-text POST (the only ones it may send without a preflight), and no
/// preflight is granted. With a key, the key guards, and names pass.
#[test]
fn web_pages_cannot_reach_a_server_without_a_key() {
    let server = start(&["--allow-host", "recall.internal"]);
    let addr = server.url("").trim_start_matches("http://").to_string();
    let raw = |method: &str, path: &str, host: &str, content_type: &str| -> u16 {
        use std::io::{Read, Write};
        let body = "{\"query\": \"disk\", \"input\": \"x\"}";
        let mut tcp = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            tcp,
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\nOrigin: http://{host}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).unwrap();
        answer.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let json = "application/json";
    let port = addr.rsplit_once(':').unwrap().1.to_string();
    for host in [
        "evil.example",
        "evil.example:80",
        "192.168.1.20",
        "localhost.evil.example",
    ] {
        assert_eq!(raw("POST", "/v1/embeddings", host, json), 403, "{host}");
        assert_eq!(raw("GET", "/info", host, json), 403, "{host}");
    }
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        "recall.internal".to_string(),
    ] {
        assert_eq!(raw("POST", "/v1/embeddings", &host, json), 200, "{host}");
    }
    let local = format!("127.0.0.1:{port}");
    for content_type in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        assert_eq!(
            raw("POST", "/v1/embeddings", &local, content_type),
            415,
            "{content_type}"
        );
        assert_eq!(
            raw("POST", "/index", &local, content_type),
            415,
            "{content_type}"
        );
    }
    assert_eq!(
        raw(
            "POST",
            "/v1/embeddings",
            &local,
            "application/json; charset=utf-8"
        ),
        200
    );
    let preflight = raw("OPTIONS", "/search", &local, json);
    assert!(
        !(200..300).contains(&preflight),
        "a preflight was granted: {preflight}"
    );

    let keyed = start(&["--api-key", "s3cret"]);
    let response = agent()
        .post(&keyed.url("/v1/embeddings"))
        .header("Host", "recall.example.org")
        .header("Authorization", "Bearer s3cret")
        .send_json(json!({"input": "x"}))
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
}

/// A request of many long inputs that keeps the worker busy for a while.
fn heavy() -> Value {
    json!({"input": vec!["lorem ipsum dolor sit amet ".repeat(12); 2000]})
}

#[test]
fn a_full_queue_answers_503_and_too_many_requests_429() {
    let server = start(&["--max-queue", "100", "--max-batch-tokens", "2048"]);
    let url = server.url("/v1/embeddings");
    std::thread::scope(|s| {
        let busy = s.spawn(|| post(&url, &heavy()).0);
        std::thread::sleep(Duration::from_millis(1500));
        // Another bulk request (a short query would take the query lane).
        let document = "a document of some length ".repeat(5);
        let (status, answer, retry) = post(&url, &json!({"input": document}));
        assert_eq!(status, 503, "{answer}");
        assert_eq!(retry.as_deref(), Some("1"));
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("busy")
        );
        assert_eq!(busy.join().unwrap(), 200);
    });
    drop(server);

    let server = start(&[
        "--max-concurrent-requests",
        "1",
        "--max-batch-tokens",
        "2048",
    ]);
    let url = server.url("/v1/embeddings");
    std::thread::scope(|s| {
        let busy = s.spawn(|| post(&url, &heavy()).0);
        std::thread::sleep(Duration::from_millis(1500));
        let (status, _, retry) = post(&url, &json!({"input": "a short query"}));
        assert_eq!(status, 429);
        assert_eq!(retry.as_deref(), Some("1"));
        assert_eq!(busy.join().unwrap(), 200);
    });
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in metrics"))
}

#[test]
fn short_queries_are_answered_while_a_large_request_runs() {
    let server = start(&["--max-batch-tokens", "4096"]);
    let url = server.url("/v1/embeddings");
    std::thread::scope(|s| {
        let busy = s.spawn(|| post(&url, &heavy()).0);
        std::thread::sleep(Duration::from_millis(1000));
        let started = Instant::now();
        let small: Vec<_> = (0..8)
            .map(|i| {
                let url = url.clone();
                s.spawn(move || post(&url, &json!({"input": format!("query {i}")})).0)
            })
            .collect();
        for h in small {
            assert_eq!(h.join().unwrap(), 200);
        }
        // Queries take their own lane, and the large request's passes pause
        // for them between layers: they do not wait for its 2,000 inputs.
        println!("8 short requests answered in {:?}", started.elapsed());
        assert!(
            !busy.is_finished(),
            "the short requests were answered only after the large one"
        );
        assert_eq!(busy.join().unwrap(), 200);
    });
    let text = get(&server.url("/metrics")).1;
    for name in [
        "recall_requests_total",
        "recall_tokens_total",
        "recall_batch_tokens_bucket",
        "recall_queue_duration_seconds_bucket",
        "recall_request_duration_seconds_bucket",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics");
    }
    assert_eq!(metric(&text, "recall_inputs_total"), 2008.0);
    // The large request's 2,000 inputs went through a few dozen passes.
    assert!(metric(&text, "recall_batch_inputs_count") < 200.0);
}

#[test]
fn sigterm_finishes_the_requests_in_flight() {
    let server = start(&["--max-batch-tokens", "2048"]);
    let url = server.url("/v1/embeddings");
    std::thread::scope(|s| {
        let busy = s.spawn(|| post(&url, &heavy()));
        std::thread::sleep(Duration::from_millis(800));
        terminate(&server.child);
        let (status, answer, _) = busy.join().unwrap();
        assert_eq!(status, 200);
        assert_eq!(answer["data"].as_array().unwrap().len(), 2000);
    });
    let (status, err) = server.stop();
    assert!(status.success(), "{err}");
    assert!(err.contains("finishing the requests in flight"), "{err}");
}

#[test]
fn info_health_tags_and_search() {
    require!(hermes_python());
    let tmp = tempfile::tempdir().unwrap();
    let home = HermesHome::create(tmp.path().join("hermes"));
    let model = tiny_model_dir();
    recall()
        .arg("index")
        .hermes_home(&home)
        .model(&model)
        .output()
        .assert_ok();
    let query = "nginx config error";
    let out = recall()
        .args(["search", "--json", "--min-score=-1", query])
        .hermes_home(&home)
        .output()
        .assert_ok();
    let want: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!want.is_empty());

    let server = start(&["--hermes-home", home.to_str().unwrap()]);
    let (status, found, _) = post(
        &server.url("/search"),
        &json!({"query": query, "min_score": -1.0}),
    );
    assert_eq!(status, 200, "{found}");
    assert_eq!(found["success"], true);
    let ids = |v: &[Value]| -> Vec<String> {
        v.iter()
            .map(|h| h["session_id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids(found["results"].as_array().unwrap()), ids(&want));
    assert_eq!(found["results"][0]["link"], want[0]["link"]);
    let (status, filtered, _) = post(
        &server.url("/search"),
        &json!({"query": query, "min_score": -1.0, "role_filter": "assistant", "limit": 2}),
    );
    assert_eq!(status, 200);
    let results = filtered["results"].as_array().unwrap();
    assert!(results.len() <= 2 && results.iter().all(|h| h["role"] == "assistant"));
    let (status, bad, _) = post(&server.url("/search"), &json!({"query": ""}));
    assert_eq!(status, 400);
    assert!(bad["error"].as_str().unwrap().contains("empty"), "{bad}");
    let (status, bad, _) = post(&server.url("/search"), &json!({"q": "x"}));
    assert_eq!(status, 400, "{bad}");
    // User text never reaches SQL as syntax: NULs, quotes, FTS5 operators.
    for hostile in [
        "disk\u{0}space",
        "\u{0}",
        "\" OR 1=1 --",
        "NEAR(a b) * : ^",
        "'); DROP TABLE chunks; --",
    ] {
        let (status, found, _) = post(&server.url("/search"), &json!({"query": hostile}));
        assert_eq!(status, 200, "{hostile:?}: {found}");
        assert_eq!(found["success"], true);
    }
    // Sizes from a request are bounded, never wrapped (2^63 × 40 overflows).
    for (field, value) in [
        ("half_life", json!(0)),
        ("half_life", json!(-3)),
        ("mmr", json!(2)),
        ("limit", json!(1_000_000)),
        ("limit", json!(1u64 << 63)),
        ("limit", json!(u64::MAX)),
    ] {
        let (status, bad, _) = post(
            &server.url("/search"),
            &json!({"query": "disk", field: value}),
        );
        assert_eq!(status, 400, "{field}={value}: {bad}");
        assert!(
            bad["error"]
                .as_str()
                .unwrap()
                .contains(field.replace('_', "-").as_str()),
            "{bad}"
        );
    }

    let (status, health) = get(&server.url("/health"));
    assert_eq!((status, health.as_str()), (200, r#"{"status":"ok"}"#));
    let info: Value = serde_json::from_str(&get(&server.url("/info")).1).unwrap();
    assert_eq!(info["dimension"], 32);
    assert_eq!(info["max_input_length"], 256);
    assert_eq!(info["outputs"]["colbert"], true);
    let tags: Value = serde_json::from_str(&get(&server.url("/api/tags")).1).unwrap();
    assert_eq!(tags["models"][0]["name"], "bge-m3:latest");
    let version: Value = serde_json::from_str(&get(&server.url("/api/version")).1).unwrap();
    assert!(version["version"].is_string());
}

#[test]
fn hostile_requests_get_answers_and_the_server_keeps_serving() {
    let server = start(&[]);
    let url = server.url("/v1/embeddings");
    let raw = |body: Vec<u8>| {
        let mut response = agent()
            .post(&url)
            .header("Content-Type", "application/json")
            .send(&body[..])
            .unwrap();
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap();
        (status, text)
    };
    // A client that sends half a request and stalls.
    let mut stalled =
        std::net::TcpStream::connect(server.base.trim_start_matches("http://")).unwrap();
    std::io::Write::write_all(
        &mut stalled,
        b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"input\":",
    )
    .unwrap();

    let (status, text) = raw(b"{not json".to_vec());
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("not valid"), "{text}");
    for (body, needle) in [
        (json!({"input": 5}), "wrong type"),
        (json!({"input": {"a": 1}}), "wrong type"),
        (json!({"input": "x", "model": 3}), "not valid"),
        (json!({"input": [null]}), "neither strings nor token ids"),
        (json!({"input": vec!["x"; 3000]}), "limit is 2048"),
    ] {
        let (status, answer, _) = post(&url, &body);
        assert_eq!(status, 400, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{message:?} lacks {needle:?}");
    }
    // 10 MB of text in one input: too many tokens, said as such.
    let (status, answer, _) = post(&url, &json!({"input": "ab ".repeat(3_500_000)}));
    assert_eq!(status, 400);
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tokens"),
        "{answer}"
    );
    // Over the 16 MiB body limit: the server answers 413 after reading 16 MiB
    // and closes; a client still sending may see the connection close before
    // it reads the answer (the 413 body itself is checked with a small limit
    // in `bad_requests_get_clear_errors_in_the_clients_shape`).
    let body = format!("{{\"input\": \"{}\"}}", "a".repeat(17 << 20));
    match agent()
        .post(&url)
        .header("Content-Type", "application/json")
        .send(body.as_bytes())
    {
        Ok(mut response) => {
            assert_eq!(response.status().as_u16(), 413);
            let text = response.body_mut().read_to_string().unwrap();
            assert!(text.contains("larger than this server's limit"), "{text}");
        }
        Err(ureq::Error::Io(e)) => assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ),
            "{e}"
        ),
        Err(e) => panic!("{e}"),
    }

    // Still serving, the stalled client notwithstanding.
    let (status, answer, _) = post(&url, &json!({"input": "still here"}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(get(&server.url("/health")).0, 200);
    drop(stalled);
}

#[test]
fn many_concurrent_clients_are_all_answered_in_shared_passes() {
    let server = start(&[]);
    let url = server.url("/v1/embeddings");
    let deadline = Instant::now() + Duration::from_secs(3);
    let answered: Vec<(usize, usize)> = std::thread::scope(|s| {
        let clients: Vec<_> = (0..16)
            .map(|c| {
                let url = url.clone();
                s.spawn(move || {
                    let (mut ok, mut failed) = (0, 0);
                    let mut i = 0;
                    while Instant::now() < deadline {
                        let texts: Vec<String> = (0..1 + i % 3)
                            .map(|k| format!("client {c} request {i} text {k}"))
                            .collect();
                        let (status, answer, _) = post(&url, &json!({"input": texts}));
                        if status == 200 && answer["data"].as_array().unwrap().len() == texts.len()
                        {
                            ok += 1;
                        } else {
                            failed += 1;
                        }
                        i += 1;
                    }
                    (ok, failed)
                })
            })
            .collect();
        clients.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok: usize = answered.iter().map(|a| a.0).sum();
    let failed: usize = answered.iter().map(|a| a.1).sum();
    assert_eq!(failed, 0);
    assert!(ok > 16);
    let metrics = get(&server.url("/metrics")).1;
    let inputs = metric(&metrics, "recall_inputs_total");
    let passes = metric(&metrics, "recall_batch_inputs_count");
    println!("{ok} requests, {inputs} inputs in {passes} passes");
    // Requests of one to three inputs, yet passes of several: they were shared.
    assert!(inputs / passes > 3.0, "{inputs} inputs in {passes} passes");
}

/// Peak resident memory of a process, bytes (Linux).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// A client that sends its headers, then its body (declared `length` bytes)
/// a byte every 200 ms; the status it got back, if any.
fn trickler(
    addr: &str,
    path: &str,
    length: usize,
    burst: usize,
) -> std::thread::JoinHandle<Option<u16>> {
    use std::io::{Read, Write};
    let (addr, path) = (addr.to_string(), path.to_string());
    std::thread::spawn(move || {
        let mut tcp = std::net::TcpStream::connect(&addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        write!(tcp, "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n").unwrap();
        tcp.write_all(&vec![b' '; burst]).unwrap();
        let mut answer = Vec::new();
        for _ in 0..100 {
            if tcp.write_all(b" ").is_err() {
                break;
            }
            let mut buf = [0u8; 4096];
            match tcp.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buf[..n]);
                    break;
                }
                Err(_) => {}
            }
        }
        let text = String::from_utf8_lossy(&answer).into_owned();
        text.split_whitespace().nth(1).and_then(|s| s.parse().ok())
    })
}

/// A raw HTTP/1.1 connection to `addr` that has sent `head`.
fn raw(addr: &str, head: &str) -> std::net::TcpStream {
    use std::io::Write;
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.write_all(head.as_bytes()).unwrap();
    tcp
}

/// What the server answers on `tcp` within 5 s ("" when it closes without a word).
fn answer(tcp: &mut std::net::TcpStream) -> String {
    use std::io::Read;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tcp.read(&mut buf).unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Connections hold only what they send: idle ones that open a chunked body
/// take none of the bytes-in-flight budget, so POSTs beside them are
/// answered; a GET with a body is refused unread; and one address holds at
/// most --max-connections-per-client connections.
#[test]
fn idle_and_bodied_connections_cannot_starve_the_server() {
    let server = start(&["--max-connections-per-client", "8"]);
    let addr = server.base.trim_start_matches("http://").to_string();
    let url = server.url("/v1/embeddings");
    let chunked = "POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\n\
                   Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    let idle: Vec<_> = (0..6).map(|_| raw(&addr, chunked)).collect();
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        let (status, body, _) = post(&url, &json!({"input": "a query beside idle connections"}));
        assert_eq!(status, 200, "{body}");
    }

    let mut get = raw(
        &addr,
        "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n",
    );
    let refused = answer(&mut get);
    assert!(refused.starts_with("HTTP/1.1 400"), "{refused}");
    assert!(
        refused.contains("only POST requests take a body"),
        "{refused}"
    );
    drop(get);
    std::thread::sleep(Duration::from_millis(300));

    // Six idle and two more make eight: a ninth is answered 503 and closed.
    let more: Vec<_> = (0..2).map(|_| raw(&addr, chunked)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut ninth = raw(&addr, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    let refused = answer(&mut ninth);
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused.contains("--max-connections-per-client"),
        "{refused}"
    );
    drop((idle, more));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(post(&url, &json!({"input": "after they left"})).0, 200);
}

#[test]
fn slow_and_large_clients_cannot_stall_the_server() {
    let server = start(&[
        "--max-concurrent-requests",
        "8",
        "--header-timeout",
        "2",
        "--body-timeout",
        "2",
    ]);
    let addr = server.base.trim_start_matches("http://").to_string();
    let url = server.url("/v1/embeddings");
    // Nine clients trickling their bodies, one more than the request slots.
    let started = Instant::now();
    let slow: Vec<_> = (0..9)
        .map(|_| trickler(&addr, "/v1/embeddings", 1000, 0))
        .collect();
    // One sending its headers a byte at a time.
    let headers = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            let mut tcp = std::net::TcpStream::connect(&addr).unwrap();
            let start = Instant::now();
            for b in b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
                .iter()
                .chain(b"y".repeat(200).iter())
            {
                if tcp.write_all(&[*b]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = [0u8; 256];
            let closed = matches!(tcp.read(&mut buf), Ok(0) | Err(_));
            (closed, start.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    // Meanwhile /health and real requests are answered at once.
    let mut worst = Duration::ZERO;
    for _ in 0..10 {
        let t = Instant::now();
        assert_eq!(get(&server.url("/health")).0, 200);
        worst = worst.max(t.elapsed());
        let (status, answer, _) = post(&url, &json!({"input": "a query while others trickle"}));
        assert_eq!(status, 200, "{answer}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(worst < Duration::from_secs(1), "/health took {worst:?}");
    for client in slow {
        assert_eq!(
            client.join().unwrap(),
            Some(408),
            "a trickling body is cut off"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    let (closed, after) = headers.join().unwrap();
    assert!(
        closed && after < Duration::from_secs(8),
        "slow headers: closed {closed} after {after:?}"
    );

    // Over-long inputs: two 15 MB texts at once, /health answering meanwhile.
    let big = json!({"input": "ab ".repeat(5_000_000)});
    let ollama = server.url("/api/embed");
    std::thread::scope(|s| {
        let both: Vec<_> = [&url, &ollama]
            .into_iter()
            .map(|u| {
                let big = &big;
                s.spawn(move || post(u, big).0)
            })
            .collect();
        let mut worst = Duration::ZERO;
        while both.iter().any(|h| !h.is_finished()) {
            let t = Instant::now();
            assert_eq!(get(&server.url("/health")).0, 200);
            worst = worst.max(t.elapsed());
            std::thread::sleep(Duration::from_millis(20));
        }
        let statuses: Vec<u16> = both.into_iter().map(|h| h.join().unwrap()).collect();
        // OpenAI refuses an over-long input; Ollama cuts it.
        assert_eq!(statuses, [400, 200]);
        assert!(
            worst < Duration::from_secs(1),
            "/health took {worst:?} beside two 15 MB inputs"
        );
    });
    let peak = peak_rss(server.child.id());
    assert!(peak < 600 << 20, "peak RSS {} MiB", peak >> 20);

    // The bytes in flight are bounded across requests: a 15 MB body, all
    // but its last bytes sent, holds 15 MB of a 20 MB budget, so another of
    // 15 MB is told to retry before it sends.
    drop(server);
    let server = start(&["--body-timeout", "2", "--max-inflight-bytes", "20000000"]);
    let addr = server.base.trim_start_matches("http://").to_string();
    let ollama = server.url("/api/embed");
    let holder = trickler(&addr, "/api/embed", 15_000_000, 14_999_900);
    std::thread::sleep(Duration::from_millis(300));
    let answer = {
        use std::io::{Read, Write};
        let mut tcp = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            tcp,
            "POST /api/embed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 15000000\r\n\r\n"
        )
        .unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tcp.read(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    assert!(answer.contains("--max-inflight-bytes"), "{answer}");
    // A small request still fits beside the held 15 MB.
    assert_eq!(post(&ollama, &json!({"input": "small"})).0, 200);
    assert_eq!(
        get(&server.url("/health")).0,
        200,
        "/health needs no budget"
    );
    assert_eq!(holder.join().unwrap(), Some(408));
    let (status, _, _) = post(&ollama, &big);
    assert_eq!(status, 200, "the budget is given back");
}

/// A model from the Hugging Face cache answers to its short name and its
/// repository's id, announces both, lists them in /v1/models and
/// /api/tags, and a request for another model is told which names it has.
#[test]
fn the_model_answers_to_its_names() {
    use std::io::BufRead;
    let minilm = require!(minilm_dir());
    let tmp = tempfile::tempdir().unwrap();
    let snapshot = tmp
        .path()
        .join("models--sentence-transformers--all-MiniLM-L6-v2/snapshots/abc123");
    std::fs::create_dir_all(&snapshot).unwrap();
    for entry in std::fs::read_dir(minilm).unwrap() {
        let entry = entry.unwrap();
        std::os::unix::fs::symlink(entry.path(), snapshot.join(entry.file_name())).unwrap();
    }
    let mut server = Server::start(&snapshot, &[]);
    let stderr = std::io::BufReader::new(server.child.stderr.take().unwrap());
    let announced = stderr
        .lines()
        .map(Result::unwrap)
        .find(|l| l.starts_with("recall serve:"))
        .unwrap();
    assert!(
        announced
            .contains(r#"as "all-MiniLM-L6-v2" (also sentence-transformers/all-MiniLM-L6-v2)"#),
        "{announced}"
    );
    let models: Value = serde_json::from_str(&get(&server.url("/v1/models")).1).unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"]
    );
    let tags: Value = serde_json::from_str(&get(&server.url("/api/tags")).1).unwrap();
    assert_eq!(
        tags["models"][1]["name"],
        "sentence-transformers/all-MiniLM-L6-v2:latest"
    );
    let url = server.url("/v1/embeddings");
    for name in ["all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"] {
        let (status, body, _) = post(&url, &json!({"input": "hello", "model": name}));
        assert_eq!(status, 200, "{name}: {body}");
    }
    let (status, body, _) = post(&url, &json!({"input": "hello", "model": "bge-m3"}));
    assert_eq!(status, 404);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("answers to all-MiniLM-L6-v2, sentence-transformers/all-MiniLM-L6-v2"),
        "{body}"
    );
}
