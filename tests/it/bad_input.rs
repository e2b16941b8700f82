//! Broken model directories and bad input: a clear error naming the problem, never a panic.

use std::path::Path;

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

/// `recall ARGS` with `stdin`, and a conversion cache of its own.
fn recall_with_stdin(args: &[&str], stdin: &[u8]) -> Output {
    let cache = tempfile::tempdir().unwrap();
    recall()
        .args(args)
        .env("RECALL_CACHE_DIR", cache.path())
        .stdin(stdin)
        .output()
}

#[test]
fn cli_rejects_empty_and_invalid_input() {
    let model = tiny_model_dir();
    let model = model.to_str().unwrap();
    let out = recall_with_stdin(&["embed", "--model", model], b"").assert_err();
    assert_contains(&out.stderr, &["no input"]);
    let out =
        recall_with_stdin(&["embed", "--model", model], b"fine\n\xc3\x28 broken\n").assert_err();
    assert_contains(&out.stderr, &["line 2", "not valid UTF-8"]);
    let out = recall_with_stdin(&["embed", "--model", "/nonexistent/model"], b"x\n").assert_err();
    assert_contains(&out.stderr, &["/nonexistent/model", "no such directory"]);
    let out =
        recall_with_stdin(&["embed", "--model", model, "--max-length", "0", "x"], b"").assert_err();
    assert_contains(&out.stderr, &["--max-length"]);
}

#[test]
fn cli_embeds_stdin_as_json_lines() {
    let model = tiny_model_dir();
    let out = recall_with_stdin(
        &[
            "embed",
            "--model",
            model.to_str().unwrap(),
            "--sparse",
            "--colbert",
        ],
        "first line\n第二行\n".as_bytes(),
    )
    .assert_ok();
    let lines: Vec<serde_json::Value> = out
        .stdout
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
    let out = recall_with_stdin(
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
    )
    .assert_ok();
    assert_contains(&out.stderr, &["1 of 2 inputs", "truncated"]);
    assert!(
        out.stdout
            .lines()
            .next()
            .unwrap()
            .contains("\"truncated\":true")
    );
}

/// A model whose weights give NaN never reaches a client or an index: the
/// embed fails naming the model, the server answers 500 with that message
/// (not nulls), indexing stores nothing; and a search of an index that holds
/// such a vector (an older recall stored it) skips that row instead of failing.
#[test]
fn nan_vectors_are_never_returned_or_stored() {
    let (_tmp, model) = nan_model(&tiny_model_dir());
    let model_arg = model.to_str().unwrap();
    let out = recall()
        .args(["embed", "--model", model_arg, "hello"])
        .output();
    assert!(
        !out.success() && !out.stdout.contains("null"),
        "{}",
        out.stdout
    );
    assert_contains(&out.stderr, &["not finite", model_arg]);

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

    // Indexing and search need a Hermes history.
    require!(hermes_python());
    let tmp = tempfile::tempdir().unwrap();
    let home = HermesHome::create(tmp.path().join("hermes"));
    let home_arg = home.to_str().unwrap();
    let out = recall()
        .args(["index", "--hermes-home", home_arg, "--model", model_arg])
        .output();
    assert!(!out.success(), "indexing with NaN weights succeeded");
    assert_contains(&out.stderr, &["not finite"]);
    if let Ok(store) = recall::index::store::Store::open(&home.join("recall/index.db")) {
        assert_eq!(store.counts().unwrap().vectors, 0);
    }

    // An index holding a NaN vector: search skips it.
    let good = tiny_model_dir();
    let good_arg = good.to_str().unwrap();
    let index = tmp.path().join("good.db");
    let index_arg = index.to_str().unwrap();
    recall()
        .args([
            "index",
            "--hermes-home",
            home_arg,
            "--index",
            index_arg,
            "--model",
            good_arg,
        ])
        .output()
        .assert_ok();
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
        let out = recall()
            .args([
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
            ])
            .output()
            .assert_ok();
        let out = out.stdout;
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
    require!(hermes_python());
    use recall::index::chunk::MAX_CHUNKS_PER_MESSAGE;
    let tmp = tempfile::tempdir().unwrap();
    let home = HermesHome::create(tmp.path().join("hermes"));
    let home_arg = home.to_str().unwrap();
    let text: String = (0..100_000)
        .map(|i| format!("line {i}: the build log repeats what it did. "))
        .collect();
    let file = tmp.path().join("log.txt");
    std::fs::write(&file, &text).unwrap();
    let huge = home
        .session("pasted-log")
        .message_from_file("user", &file)
        .id;

    let model = tiny_model_dir();
    let out = recall()
        .arg("index")
        .hermes_home(&home)
        .model(&model)
        .output()
        .assert_ok();
    assert_contains(
        &out.stderr,
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

    let out = recall()
        .args(["stats", "--hermes-home", home_arg])
        .output()
        .assert_ok()
        .stdout;
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
        let out = recall()
            .args(["embed", "--model", model, "x"])
            .env(var, value)
            .output();
        assert_eq!(out.code, 1, "{var}={value}: {}", out.stderr);
        assert!(out.stdout.is_empty());
        assert_contains(&out.stderr, &[&format!("{var}=\"{value}\""), accepted]);
    }
    let out = recall()
        .args(["embed", "--model", model, "x"])
        .env("RECALL_Q8", "portable")
        .output()
        .assert_ok();
    assert!(out.stdout.starts_with('{'));
}
