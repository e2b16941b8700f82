//! `recall model fetch/export/import/verify` and first-use fetching, against
//! a local HTTP server that serves the tiny model in the hub's URL layout
//! (`/{repo}/resolve/{revision}/{file}`, ranged GETs, LFS ETags).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::common::*;
use sha2::{Digest, Sha256};

const COMMIT: &str = "5617a9f61b028005a4858fdac845db406aefb181";
use recall::model::hub::BGE_M3_FILES as FILES;
const LFS: [&str; 3] = ["pytorch_model.bin", "colbert_linear.pt", "sparse_linear.pt"];

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

struct Served {
    body: Vec<u8>,
    etag: String,
    lfs: bool,
}

/// A hub in miniature. `log` records "file range" for every request.
struct Hub {
    url: String,
    log: Arc<Mutex<Vec<String>>>,
}

/// What a hostile mirror answers as a file's commit and ETag: names that
/// would lead out of the cache if they became paths.
#[derive(Clone, Copy, PartialEq)]
enum Names {
    Honest,
    /// Honest the first time a file is asked about, then escaping.
    EscapeWhenAskedAgain,
    /// An escaping ETag from the start.
    EscapingEtag,
}

/// From `blobs/` or `snapshots/` of a repository in the hub cache, this is
/// the machine's root, beside the cache.
const ESCAPE: &str = "../../../victim";

impl Hub {
    /// Serves the tiny model. `corrupt`: files served with one byte flipped
    /// (but the true ETag). `interrupt`: (file, bytes) cut off once, after that many bytes.
    fn start(corrupt: &[&str], interrupt: Option<(&str, usize)>) -> Hub {
        Self::start_naming(corrupt, interrupt, Names::Honest)
    }

    fn start_naming(corrupt: &[&str], interrupt: Option<(&str, usize)>, names: Names) -> Hub {
        let mut files = HashMap::new();
        for f in FILES {
            let mut body = std::fs::read(tiny_model_dir().join(f)).unwrap();
            let lfs = LFS.contains(&f);
            let etag = if lfs {
                sha256(&body)
            } else {
                sha256(&body)[..40].to_string()
            };
            if corrupt.contains(&f) {
                let mid = body.len() / 2;
                body[mid] ^= 0xff;
            }
            files.insert(
                format!("/BAAI/bge-m3/resolve/{COMMIT}/{f}"),
                Served { body, etag, lfs },
            );
        }
        // A small model, fetched by name at `main`, where the tests have it
        // (only `a_small_model_is_fetched_and_used_by_name` asks for it).
        if let Some(minilm) = minilm_dir() {
            for f in recall::model::hub::MINILM_FILES {
                let body = std::fs::read(minilm.join(f)).unwrap();
                let lfs = f.ends_with(".safetensors");
                let etag = if lfs {
                    sha256(&body)
                } else {
                    sha256(&body)[..40].to_string()
                };
                files.insert(
                    format!("/sentence-transformers/all-MiniLM-L6-v2/resolve/main/{f}"),
                    Served { body, etag, lfs },
                );
            }
        }
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let files = Arc::new(files);
        let interrupt = Arc::new(Mutex::new(interrupt.map(|(f, n)| (f.to_string(), n))));
        let log2 = log.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (files, log, interrupt) = (files.clone(), log2.clone(), interrupt.clone());
                std::thread::spawn(move || serve(stream, &files, &log, &interrupt, names));
            }
        });
        Hub { url, log }
    }

    fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

fn serve(
    mut stream: TcpStream,
    files: &HashMap<String, Served>,
    log: &Mutex<Vec<String>>,
    interrupt: &Mutex<Option<(String, usize)>>,
    names: Names,
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request = String::new();
    if reader.read_line(&mut request).is_err() {
        return;
    }
    let path = request.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut range_start = 0usize;
    let mut range_end = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some(range) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
            let (a, b) = range.trim().split_once('-').unwrap();
            range_start = a.parse().unwrap();
            range_end = b.parse::<usize>().ok();
        }
    }
    // /{repo}/resolve/{revision}/{file}
    let file = path
        .split_once("/resolve/")
        .and_then(|(_, rest)| rest.split_once('/'))
        .map(|(_, f)| f.to_string())
        .unwrap_or_default();
    log.lock().unwrap().push(format!(
        "{file} {range_start}-{}",
        range_end.map(|e| e.to_string()).unwrap_or_default()
    ));
    let Some(served) = files.get(&path) else {
        let _ = stream
            .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        return;
    };
    let size = served.body.len();
    let end = range_end.unwrap_or(size - 1).min(size - 1);
    let body = &served.body[range_start..=end];
    // Asked what the file is (hf-hub's metadata request is a 1-byte range).
    let asked_before = range_end == Some(0)
        && log
            .lock()
            .unwrap()
            .iter()
            .filter(|r| **r == format!("{file} 0-0"))
            .count()
            > 1;
    let escape = match names {
        Names::Honest => false,
        Names::EscapeWhenAskedAgain => asked_before,
        Names::EscapingEtag => true,
    };
    let (commit, etag) = if escape {
        (ESCAPE, ESCAPE)
    } else {
        (COMMIT, served.etag.as_str())
    };
    let etag_header = if served.lfs {
        format!("ETag: \"other\"\r\nX-Linked-Etag: \"{etag}\"\r\nX-Linked-Size: {size}\r\n")
    } else {
        format!("ETag: \"{etag}\"\r\n")
    };
    let commit = if names == Names::EscapingEtag {
        COMMIT
    } else {
        commit
    };
    let head = format!(
        "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {range_start}-{end}/{size}\r\n\
         X-Repo-Commit: {commit}\r\n{etag_header}Connection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    let mut cut = interrupt.lock().unwrap();
    if range_end.is_none()
        && let Some((f, n)) = cut.as_ref()
        && *f == file
        && range_start == 0
    {
        let n = *n;
        *cut = None;
        drop(cut);
        let _ = stream.write_all(&body[..n]);
        let _ = stream.flush();
        return; // the connection drops mid-body
    }
    drop(cut);
    let _ = stream.write_all(body);
}

/// A machine of its own: HOME, hub cache and recall cache under one temp dir.
struct Machine {
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

impl Machine {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        Machine { _tmp: tmp, root }
    }

    fn hub_cache(&self) -> PathBuf {
        self.root.join("hub")
    }

    fn snapshot(&self) -> PathBuf {
        self.hub_cache()
            .join("models--BAAI--bge-m3/snapshots")
            .join(COMMIT)
    }

    /// Runs `recall ARGS` here, with ENVS.
    fn recall(&self, args: &[&str], envs: &[(&str, &str)]) -> Output {
        recall()
            .args(args)
            .env("HOME", &self.root)
            .env("HF_HUB_CACHE", self.hub_cache())
            .env("RECALL_CACHE_DIR", self.root.join("recall"))
            .envs(envs.iter().copied())
            .output()
    }

    fn dense(&self, envs: &[(&str, &str)]) -> Vec<f64> {
        let out = self
            .recall(&["embed", "the server ran out of space"], envs)
            .assert_ok()
            .stdout;
        let v: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
        v["dense"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    }
}

fn blob_of(link: &Path) -> PathBuf {
    std::fs::canonicalize(link).unwrap()
}

/// A mirror's names become paths in the cache only as first answered and
/// checked: one that answers escaping names when asked again, or an ETag
/// that is a path, writes nothing outside the cache.
#[test]
fn fetch_never_writes_where_a_mirror_points() {
    for names in [Names::EscapeWhenAskedAgain, Names::EscapingEtag] {
        let hub = Hub::start_naming(&[], None, names);
        let m = Machine::new();
        let out = m.recall(&["model", "fetch"], &[("HF_ENDPOINT", hub.url.as_str())]);
        // Where the escaping names lead, from blobs/ or snapshots/.
        for victim in ["victim", "victim.part"] {
            assert!(!m.root.join(victim).exists(), "{victim} was written");
        }
        match names {
            Names::EscapeWhenAskedAgain => {
                out.assert_ok();
                for f in FILES {
                    let got = std::fs::read(m.snapshot().join(f)).unwrap();
                    assert_eq!(got, std::fs::read(tiny_model_dir().join(f)).unwrap(), "{f}");
                }
            }
            _ => {
                let err = out.assert_err().stderr;
                assert!(err.contains("no hash"), "{err}");
                assert!(!m.hub_cache().join("models--BAAI--bge-m3/blobs").exists());
            }
        }
    }
}

#[test]
fn fetch_resumes_an_interrupted_download_and_verifies() {
    let hub = Hub::start(&[], Some(("pytorch_model.bin", 50_000)));
    let m = Machine::new();
    // No model yet: still JSON for a script, an empty list.
    let out = m.recall(&["model", "list", "--json"], &[]).assert_ok();
    assert_eq!(out.stdout.trim(), "[]");
    let endpoint = [("HF_ENDPOINT", hub.url.as_str())];
    let out = m.recall(&["model", "fetch", "--retries", "0"], &endpoint);
    assert!(!out.success(), "the interrupted transfer fails this run");
    assert!(out.stderr.contains("pytorch_model.bin"), "{}", out.stderr);
    let Output {
        stdout: out,
        stderr: err,
        ..
    } = m
        .recall(&["model", "fetch", "--retries", "0"], &endpoint)
        .assert_ok();
    assert_eq!(out.trim(), m.snapshot().to_str().unwrap());
    assert!(
        hub.requests()
            .iter()
            .any(|r| r == "pytorch_model.bin 50000-"),
        "the second run resumes at byte 50000: {:?}",
        hub.requests()
    );
    for f in FILES {
        let got = std::fs::read(m.snapshot().join(f)).unwrap();
        assert_eq!(got, std::fs::read(tiny_model_dir().join(f)).unwrap(), "{f}");
    }
    assert!(err.contains("converted the weights once"), "{err}");

    // The main job finds it in the cache, offline.
    let dense = m.dense(&[("HF_HUB_OFFLINE", "1")]);
    assert_eq!(dense.len(), 32);

    let out = m.recall(&["model", "verify"], &[]);
    assert!(out.success(), "{}{}", out.stdout, out.stderr);
    let out = out.stdout;
    assert_eq!(
        out.lines().filter(|l| l.starts_with("ok")).count(),
        FILES.len() + 1,
        "{out}"
    );
    assert!(out.contains("(the converted copy that runs)"), "{out}");

    // The converted copy is what runs: a changed byte in it is found, and
    // the copy made again from the checkpoint.
    let copy = std::fs::read_dir(m.root.join("recall/converted"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join("model.safetensors");
    let mut bytes = std::fs::read(&copy).unwrap();
    let at = bytes.len() - 1000;
    bytes[at] ^= 0x40;
    std::fs::write(&copy, bytes).unwrap();
    let out = m.recall(&["model", "verify"], &[]);
    assert!(out.success(), "{}{}", out.stdout, out.stderr);
    let out = out.stdout;
    assert!(
        out.contains("WRONG") && out.contains("converted again"),
        "{out}"
    );
    assert_eq!(m.dense(&[("HF_HUB_OFFLINE", "1")]), dense);
    // A copy cut short is not used at start: it is converted again.
    let len = std::fs::metadata(&copy).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&copy)
        .unwrap()
        .set_len(len - 10)
        .unwrap();
    assert_eq!(m.dense(&[("HF_HUB_OFFLINE", "1")]), dense);
    assert_eq!(std::fs::metadata(&copy).unwrap().len(), len);

    let out = m.recall(&["model", "list"], &[]).assert_ok().stdout;
    assert!(
        out.starts_with(&format!("* BAAI/bge-m3@{COMMIT}")),
        "the default is marked: {out}"
    );
    assert!(out.contains("32 dims, dense+sparse+colbert"), "{out}");
    let out = m
        .recall(&["model", "list", "--json"], &[])
        .assert_ok()
        .stdout;
    let listed: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    let listed = &listed[0];
    assert_eq!(listed["revision"], COMMIT, "{listed}");
    assert_eq!(listed["default"], true, "{listed}");
    assert_eq!(
        listed["outputs"],
        serde_json::json!(["dense", "sparse", "colbert"])
    );
    let out = m
        .recall(&["model", "info", "--json"], &[])
        .assert_ok()
        .stdout;
    let info: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (info["revision"].as_str(), info["dimension"].as_u64()),
        (Some(COMMIT), Some(32))
    );
    assert_eq!(info["max_length"], 256, "{info}");
    let out = m.recall(&["model", "info"], &[]).assert_ok().stdout;
    for line in [
        &format!("revision:    {COMMIT}"),
        "outputs:     dense, sparse, colbert",
        "max length:  256 tokens",
    ] {
        assert!(out.contains(line), "{line:?} in {out}");
    }

    // A flipped byte in one blob is found and named.
    let blob = blob_of(&m.snapshot().join("sparse_linear.pt"));
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&blob, bytes).unwrap();
    let Output {
        stdout: out,
        stderr: err,
        ..
    } = m.recall(&["model", "verify"], &[]).assert_err();
    assert!(out.contains("WRONG sparse_linear.pt: SHA-256"), "{out}");
    assert!(err.contains("1 of 9 files are wrong"), "{err}");
    // The same as JSON: every file with its problem (null when it matches),
    // and the error as one JSON object on standard error.
    let Output {
        stdout: out,
        stderr: err,
        ..
    } = m.recall(&["model", "verify", "--json"], &[]).assert_err();
    let verdict: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let files = verdict["files"].as_array().unwrap();
    assert_eq!(files.len(), 9, "{verdict}");
    let wrong: Vec<_> = files.iter().filter(|f| !f["problem"].is_null()).collect();
    assert_eq!(wrong.len(), 1, "{verdict}");
    assert_eq!(wrong[0]["path"], "sparse_linear.pt");
    let error: serde_json::Value = serde_json::from_str(err.trim()).unwrap();
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("1 of 9 files are wrong"),
        "{error}"
    );
    assert_eq!(error["exit_code"], 1);
}

#[test]
fn a_corrupt_download_is_refused_and_removed() {
    let hub = Hub::start(&["colbert_linear.pt"], None);
    let m = Machine::new();
    let err = m
        .recall(&["model", "fetch"], &[("HF_ENDPOINT", hub.url.as_str())])
        .assert_err()
        .stderr;
    assert!(
        err.contains("colbert_linear.pt: the download is corrupt"),
        "{err}"
    );
    assert!(
        !m.snapshot().join("colbert_linear.pt").exists(),
        "the bad file is not left in the cache"
    );
}

#[test]
fn first_use_fetches_and_offline_says_what_to_run() {
    let hub = Hub::start(&[], None);
    let m = Machine::new();
    let err = m
        .recall(
            &["embed", "x"],
            &[("HF_ENDPOINT", hub.url.as_str()), ("HF_HUB_OFFLINE", "1")],
        )
        .assert_err()
        .stderr;
    assert!(
        err.contains("recall model fetch && recall model export"),
        "{err}"
    );
    assert!(err.contains("recall model import"), "{err}");
    assert!(
        hub.requests().is_empty(),
        "offline means no request: {:?}",
        hub.requests()
    );
    let out = m.recall(
        &["embed", "--offline", "x"],
        &[("HF_ENDPOINT", hub.url.as_str())],
    );
    assert!(
        !out.success() && out.stderr.contains("offline"),
        "{}",
        out.stderr
    );

    let dense = m.dense(&[("HF_ENDPOINT", hub.url.as_str())]);
    assert_eq!(dense.len(), 32);
    assert!(!hub.requests().is_empty());
}

#[test]
fn export_import_round_trip() {
    let hub = Hub::start(&[], None);
    let online = Machine::new();
    online
        .recall(&["model", "fetch"], &[("HF_ENDPOINT", hub.url.as_str())])
        .assert_ok();
    let tar = online.root.join("bge-m3.tar");
    online
        .recall(&["model", "export", tar.to_str().unwrap()], &[])
        .assert_ok();

    let airgapped = Machine::new();
    let out = airgapped
        .recall(
            &["model", "import", tar.to_str().unwrap()],
            &[("HF_HUB_OFFLINE", "1")],
        )
        .assert_ok()
        .stdout;
    assert_eq!(out.trim(), airgapped.snapshot().to_str().unwrap());
    let offline = [("HF_HUB_OFFLINE", "1")];
    assert_eq!(airgapped.dense(&offline), online.dense(&offline));
    let out = airgapped.recall(&["model", "verify"], &[]);
    assert!(out.success(), "{}", out.stdout);

    // The same tar unpacked by hand, with one file damaged: refused, naming it.
    let unpacked = airgapped.root.join("by-hand");
    tar::Archive::new(std::fs::File::open(&tar).unwrap())
        .unpack(&unpacked)
        .unwrap();
    let victim = unpacked.join("files/tokenizer.json");
    let text = std::fs::read_to_string(&victim)
        .unwrap()
        .replacen("<unk>", "<UNK>", 1);
    std::fs::write(&victim, text).unwrap();
    let third = Machine::new();
    let err = third
        .recall(&["model", "import", unpacked.to_str().unwrap()], &[])
        .assert_err()
        .stderr;
    assert!(err.contains("tokenizer.json: SHA-256"), "{err}");
    assert!(
        !third.snapshot().exists(),
        "nothing is installed from a bad copy"
    );

    // A model directory copied by hand, without a manifest, imports under the revision given.
    let fourth = Machine::new();
    let (_keep, copy) = tiny_model_copy(&[
        "model.safetensors",
        "README.md",
        "sentence_bert_config.json",
    ]);
    let out = fourth
        .recall(
            &[
                "model",
                "import",
                copy.to_str().unwrap(),
                "--revision",
                COMMIT,
            ],
            &[],
        )
        .assert_ok()
        .stdout;
    assert_eq!(out.trim(), fourth.snapshot().to_str().unwrap());
    assert_eq!(fourth.dense(&offline).len(), 32);
}

/// A manifest whose revision or repository would name a path outside the
/// cache (a crafted archive) is refused before anything is written, in the
/// cache or outside it; so is such a `--revision`.
#[test]
fn import_refuses_names_that_leave_the_cache() {
    let source = Machine::new();
    let (_keep, copy) = tiny_model_copy(&[
        "model.safetensors",
        "README.md",
        "sentence_bert_config.json",
    ]);
    source
        .recall(
            &[
                "model",
                "import",
                copy.to_str().unwrap(),
                "--revision",
                COMMIT,
            ],
            &[],
        )
        .assert_ok();
    let tar = source.root.join("model.tar");
    source
        .recall(&["model", "export", tar.to_str().unwrap()], &[])
        .assert_ok();
    let unpacked = source.root.join("unpacked");
    tar::Archive::new(std::fs::File::open(&tar).unwrap())
        .unpack(&unpacked)
        .unwrap();
    let manifest_file = unpacked.join("manifest.json");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest_file).unwrap()).unwrap();

    let victim = source.root.join("victimdir");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("notes.txt"), "mine").unwrap();
    let escape = format!("{}{}", "../".repeat(12), victim.to_str().unwrap());
    for (field, value) in [
        ("revision", escape.as_str()),
        ("revision", victim.to_str().unwrap()),
        ("repo", "../../../evil"),
    ] {
        let mut crafted = manifest.clone();
        crafted[field] = value.into();
        std::fs::write(&manifest_file, crafted.to_string()).unwrap();
        let target = Machine::new();
        for from in [
            &unpacked,
            &repack(&unpacked, &target.root.join("crafted.tar")),
        ] {
            let out = target.recall(&["model", "import", from.to_str().unwrap()], &[]);
            assert!(!out.success(), "{field} = {value:?} was imported");
            let err = out.stderr;
            assert!(err.contains("is not a"), "{field} = {value:?}: {err}");
        }
        let names: Vec<_> = std::fs::read_dir(&victim).unwrap().collect();
        assert_eq!(names.len(), 1, "{field} = {value:?} wrote into {victim:?}");
        assert_eq!(
            std::fs::read_to_string(victim.join("notes.txt")).unwrap(),
            "mine"
        );
        let hub = target.hub_cache();
        let installed: Vec<_> = std::fs::read_dir(&hub)
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(
            installed.is_empty(),
            "{field} = {value:?} installed {installed:?}"
        );
        assert!(!target.root.join("recall/manifests").exists());
    }
    let target = Machine::new();
    let out = target.recall(
        &[
            "model",
            "import",
            copy.to_str().unwrap(),
            "--revision",
            &escape,
        ],
        &[],
    );
    assert!(
        !out.success() && out.stderr.contains("is not a revision"),
        "{}",
        out.stderr
    );
}

/// `dir` packed into the tar at `path`.
fn repack(dir: &Path, path: &Path) -> PathBuf {
    let mut tar = tar::Builder::new(std::fs::File::create(path).unwrap());
    tar.append_dir_all(".", dir).unwrap();
    tar.finish().unwrap();
    path.to_path_buf()
}

/// A small model recall knows is fetched by its short name and then used by
/// it as --model NAME (offline); an unknown name, or a known one not yet
/// fetched, says what to do.
#[test]
fn a_small_model_is_fetched_and_used_by_name() {
    require!(minilm_dir());
    let hub = Hub::start(&[], None);
    let m = Machine::new();
    let endpoint = [("HF_ENDPOINT", hub.url.as_str())];
    let out = m.recall(
        &["embed", "--model", "all-MiniLM-L6-v2", "x"],
        &[("HF_HUB_OFFLINE", "1")],
    );
    assert!(
        !out.success() && out.stderr.contains("`recall model fetch all-MiniLM-L6-v2`"),
        "{}",
        out.stderr
    );
    let out = m
        .recall(&["model", "fetch", "all-MiniLM-L6-v2"], &endpoint)
        .assert_ok()
        .stdout;
    let snapshot = m
        .hub_cache()
        .join("models--sentence-transformers--all-MiniLM-L6-v2/snapshots")
        .join(COMMIT);
    assert_eq!(out.trim(), snapshot.to_str().unwrap());
    let out = m
        .recall(
            &[
                "embed",
                "--model",
                "sentence-transformers/all-MiniLM-L6-v2",
                "the disk is full",
            ],
            &[("HF_HUB_OFFLINE", "1")],
        )
        .assert_ok()
        .stdout;
    let v: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(v["dense"].as_array().unwrap().len(), 384);
    let out = m.recall(&["model", "fetch", "gpt2"], &endpoint);
    let err = &out.stderr;
    assert!(
        !out.success()
            && err.contains("does not know a model named \"gpt2\"")
            && err.contains("all-MiniLM-L6-v2"),
        "{err}"
    );
}
