//! Broken model directories and bad input: a clear error naming the problem, never a panic.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::*;

fn load_error(dir: &Path) -> String {
    let cache = tempfile::tempdir().unwrap();
    match load(dir, cache.path()) {
        Ok(_) => panic!("{} loaded, but it is broken", dir.display()),
        Err(e) => format!("{e:#}"),
    }
}

fn assert_contains(haystack: &str, needles: &[&str]) {
    for needle in needles {
        assert!(
            haystack.contains(needle),
            "expected {needle:?} in: {haystack}"
        );
    }
}

#[test]
fn missing_head_is_refused() {
    let (_tmp, dir) = tiny_model_copy(&["sparse_linear.pt"]);
    assert_contains(
        &load_error(&dir),
        &["missing sparse_linear.pt", "random heads"],
    );
    let (_tmp, dir) = tiny_model_copy(&["sparse_linear.pt", "colbert_linear.pt"]);
    assert_contains(&load_error(&dir), &["missing colbert_linear.pt"]);
}

#[test]
fn missing_files_are_named() {
    let (_tmp, dir) = tiny_model_copy(&["config.json"]);
    assert_contains(&load_error(&dir), &["missing config.json"]);
    let (_tmp, dir) = tiny_model_copy(&["tokenizer.json"]);
    assert_contains(&load_error(&dir), &["missing tokenizer.json"]);
    let (_tmp, dir) = tiny_model_copy(&["model.safetensors", "pytorch_model.bin"]);
    assert_contains(
        &load_error(&dir),
        &["no weights", "model.safetensors or pytorch_model.bin"],
    );
}

#[test]
fn truncated_safetensors_is_named() {
    let (_tmp, dir) = tiny_model_copy(&["pytorch_model.bin"]);
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    assert_contains(
        &load_error(&dir),
        &["model.safetensors", "not a valid safetensors file"],
    );
}

#[test]
fn truncated_pytorch_checkpoint_is_named() {
    let (_tmp, dir) = tiny_model_copy(&["model.safetensors"]);
    let path = dir.join("pytorch_model.bin");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 3]).unwrap();
    assert_contains(
        &load_error(&dir),
        &["pytorch_model.bin", "not a readable PyTorch checkpoint"],
    );
}

#[test]
fn corrupt_head_is_named() {
    let (_tmp, dir) = tiny_model_copy(&[]);
    std::fs::write(dir.join("colbert_linear.pt"), b"not a checkpoint").unwrap();
    assert_contains(&load_error(&dir), &["colbert_linear.pt"]);
}

#[test]
fn wrong_weight_shape_is_named() {
    let (_tmp, dir) = tiny_model_copy(&["pytorch_model.bin"]);
    let path = dir.join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&path, &candle_core::Device::Cpu).unwrap();
    let name = "encoder.layer.1.attention.self.key.weight";
    let narrowed = tensors[name].narrow(0, 0, 16).unwrap();
    tensors.insert(name.to_string(), narrowed);
    candle_core::safetensors::save(&tensors, &path).unwrap();
    assert_contains(
        &load_error(&dir),
        &["model.safetensors", name, "[16, 32]", "[32, 32]"],
    );
}

#[test]
fn unsupported_config_is_named() {
    let (_tmp, dir) = tiny_model_copy(&[]);
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    std::fs::write(
        dir.join("config.json"),
        config.replace("\"xlm-roberta\"", "\"llama\""),
    )
    .unwrap();
    assert_contains(
        &load_error(&dir),
        &["config.json", "model_type \"llama\"", "XLM-RoBERTa"],
    );
    std::fs::write(dir.join("config.json"), "{ not json").unwrap();
    assert_contains(&load_error(&dir), &["config.json", "not valid JSON"]);
}

/// Runs the `recall` binary with `stdin`, returning (success, stdout, stderr).
fn recall(args: &[&str], stdin: &[u8]) -> (bool, String, String) {
    let cache = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_recall"))
        .args(args)
        .env("RECALL_CACHE_DIR", cache.path())
        .env_remove("RECALL_MODEL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "recall panicked: {stderr}");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    )
}

#[test]
fn cli_rejects_empty_and_invalid_input() {
    let model = tiny_model_dir();
    let model = model.to_str().unwrap();
    let (ok, _, err) = recall(&["embed", "--model", model], b"");
    assert!(!ok);
    assert_contains(&err, &["no input"]);
    let (ok, _, err) = recall(&["embed", "--model", model], b"fine\n\xc3\x28 broken\n");
    assert!(!ok);
    assert_contains(&err, &["line 2", "not valid UTF-8"]);
    let (ok, _, err) = recall(&["embed", "--model", "/nonexistent/model"], b"x\n");
    assert!(!ok);
    assert_contains(&err, &["/nonexistent/model", "no such directory"]);
    let (ok, _, err) = recall(&["embed", "--model", model, "--max-length", "0", "x"], b"");
    assert!(!ok);
    assert_contains(&err, &["--max-length"]);
}

#[test]
fn cli_embeds_stdin_as_json_lines() {
    let model = tiny_model_dir();
    let (ok, out, err) = recall(
        &[
            "embed",
            "--model",
            model.to_str().unwrap(),
            "--sparse",
            "--colbert",
        ],
        "first line\n第二行\n".as_bytes(),
    );
    assert!(ok, "{err}");
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["index"], 1);
    assert_eq!(lines[0]["dense"].as_array().unwrap().len(), 32);
    let tokens = lines[0]["tokens"].as_u64().unwrap() as usize;
    assert_eq!(lines[0]["colbert"].as_array().unwrap().len(), tokens - 1);
    let sparse = lines[0]["sparse"].as_array().unwrap();
    assert!(!sparse.is_empty());
    assert!(sparse.iter().all(|s| s["id"].is_u64()
        && s["token"].is_string()
        && s["weight"].as_f64().unwrap() > 0.0));
}

#[test]
fn cli_reports_truncation() {
    let model = tiny_model_dir();
    let (ok, out, err) = recall(
        &[
            "embed",
            "--model",
            model.to_str().unwrap(),
            "--max-length",
            "4",
            "a b c d e f g",
            "a",
        ],
        b"",
    );
    assert!(ok, "{err}");
    assert_contains(&err, &["1 of 2 inputs", "truncated"]);
    assert!(out.lines().next().unwrap().contains("\"truncated\":true"));
}

/// A model whose weights give NaN never reaches a client or an index: the
/// embed fails naming the model, the server answers 500 with that message
/// (not nulls), indexing stores nothing; and a search of an index that holds
/// such a vector (an older recall stored it) skips that row instead of failing.
#[test]
fn nan_vectors_are_never_returned_or_stored() {
    let (_tmp, model) = nan_model(&tiny_model_dir());
    let model_arg = model.to_str().unwrap();
    let (ok, out, err) = recall_cli(&["embed", "--model", model_arg, "hello"]);
    assert!(!ok && !out.contains("null"), "{out}");
    assert_contains(&err, &["not finite", model_arg]);

    let server = Server::start(&model, &[]);
    let mut response = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .new_agent()
        .post(&server.url("/v1/embeddings"))
        .send_json(serde_json::json!({"input": "hello"}))
        .unwrap();
    assert_eq!(response.status().as_u16(), 500);
    let body = response.body_mut().read_to_string().unwrap();
    assert!(
        body.contains("not finite") && !body.contains("[null"),
        "{body}"
    );

    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("hermes");
    hermes_db(&["create", home.to_str().unwrap()]);
    let home_arg = home.to_str().unwrap();
    let (ok, _, err) = recall_cli(&["index", "--hermes-home", home_arg, "--model", model_arg]);
    assert!(!ok, "indexing with NaN weights succeeded");
    assert_contains(&err, &["not finite"]);
    if let Ok(store) = recall::index::store::Store::open(&home.join("recall/index.db")) {
        assert_eq!(store.counts().unwrap().vectors, 0);
    }

    // An index holding a NaN vector: search skips it.
    let good = tiny_model_dir();
    let good_arg = good.to_str().unwrap();
    let index = tmp.path().join("good.db");
    let index_arg = index.to_str().unwrap();
    let (ok, _, err) = recall_cli(&[
        "index",
        "--hermes-home",
        home_arg,
        "--index",
        index_arg,
        "--model",
        good_arg,
    ]);
    assert!(ok, "{err}");
    let store = recall::index::store::Store::open(&index).unwrap();
    let dims = store.identity().unwrap().unwrap().dimension;
    let nan: Vec<u8> = std::iter::repeat_n(f32::NAN.to_le_bytes(), dims)
        .flatten()
        .collect();
    store
        .conn()
        .execute(
            "UPDATE chunks_vec SET embedding = ? WHERE chunk_id = 1",
            [nan],
        )
        .unwrap();
    drop(store);
    for scan in ["exact", "binary"] {
        let (ok, out, err) = recall_cli(&[
            "search",
            "--json",
            "disk space",
            "--hermes-home",
            home_arg,
            "--index",
            index_arg,
            "--model",
            good_arg,
            "--scan",
            scan,
        ]);
        assert!(ok, "--scan {scan}: {err}");
        assert!(
            !out.is_empty() && !out.contains("NaN"),
            "--scan {scan}: {out}"
        );
    }
}

/// One message of megabytes (Hermes does not cap them, a pasted log is one)
/// is indexed up to `MAX_CHUNKS_PER_MESSAGE` chunks, named in a warning and
/// counted by `recall stats`.
#[test]
fn a_huge_message_is_indexed_up_to_its_cap() {
    use recall::index::chunk::MAX_CHUNKS_PER_MESSAGE;
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("hermes");
    let home_arg = home.to_str().unwrap();
    hermes_db(&["create", home_arg]);
    let text: String = (0..100_000)
        .map(|i| format!("line {i}: the build log repeats what it did. "))
        .collect();
    let file = tmp.path().join("log.txt");
    std::fs::write(&file, &text).unwrap();
    let huge = hermes_db(&[
        "append-file",
        home_arg,
        "pasted-log",
        "user",
        file.to_str().unwrap(),
    ])["id"]
        .as_i64()
        .unwrap();

    let model = tiny_model_dir();
    let (ok, _, err) = recall_cli(&[
        "index",
        "--hermes-home",
        home_arg,
        "--model",
        model.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert_contains(
        &err,
        &[
            &format!("1 messages are longer than {MAX_CHUNKS_PER_MESSAGE} chunks"),
            &format!("ids {huge}"),
        ],
    );
    let store = assert_index_consistent(&home);
    let chunks_of = |id: i64| -> i64 {
        store
            .conn()
            .query_row(
                "SELECT COUNT(*) FROM chunks WHERE message_id = ?",
                [id],
                |r| r.get(0),
            )
            .unwrap()
    };
    assert_eq!(chunks_of(huge), MAX_CHUNKS_PER_MESSAGE as i64);
    let counts = store.counts().unwrap();
    assert_eq!(counts.capped_messages, 1);
    assert!(
        counts.skipped_bytes > text.len() as i64 / 2,
        "{}",
        counts.skipped_bytes
    );
    drop(store);

    let (ok, out, err) = recall_cli(&["stats", "--hermes-home", home_arg]);
    assert!(ok, "{err}");
    assert!(out.contains("cut short:        1 messages"), "{out}");
}

/// A kernel override set to a value recall does not have is an error naming
/// the accepted ones, before anything is embedded; a known one works.
#[test]
fn an_unknown_kernel_override_is_named() {
    let model = tiny_model_dir();
    let model = model.to_str().unwrap();
    for (var, value, accepted) in [
        ("RECALL_Q8", "Portable", "avx2, sdot, portable"),
        ("RECALL_MATMUL", "avx512", "avx2, candle"),
        ("RECALL_BF16", "yes", "widen"),
    ] {
        let (code, out, err) = recall_env(&["embed", "--model", model, "x"], &[(var, value)]);
        assert_eq!(code, 1, "{var}={value}: {err}");
        assert!(out.is_empty());
        assert_contains(&err, &[&format!("{var}=\"{value}\""), accepted]);
    }
    let (code, out, err) = recall_env(
        &["embed", "--model", model, "x"],
        &[("RECALL_Q8", "portable")],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with('{'));
}
