//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use recall_engine::{Embedder, LoadOptions};

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn tiny_model_dir() -> PathBuf {
    repo_root().join("models").join("tiny-bge-m3")
}

/// A copy of the tiny model in a fresh temporary directory named
/// `tiny-bge-m3`, leaving out the files in `skip`.
pub fn tiny_model_copy(skip: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("tiny-bge-m3");
    copy_dir(&tiny_model_dir(), &dst, skip);
    (tmp, dst)
}

fn copy_dir(src: &Path, dst: &Path, skip: &[&str]) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        if skip.contains(&name.as_str()) {
            continue;
        }
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &dst.join(&name), skip);
        } else {
            std::fs::copy(entry.path(), dst.join(&name)).unwrap();
        }
    }
}

/// Loads a model with converted weights cached under `cache`.
pub fn load(dir: &Path, cache: &Path) -> recall_engine::Result<Embedder> {
    Embedder::load(
        dir,
        &LoadOptions {
            cache_dir: Some(cache.to_path_buf()),
            ..Default::default()
        },
    )
}

/// `load`, with the encoder's linear layers in int8 (`--dtype q8`).
pub fn load_q8(dir: &Path, cache: &Path) -> recall_engine::Result<Embedder> {
    load_as(dir, cache, recall_engine::Dtype::Q8)
}

/// `load`, with the encoder's linear layers in `dtype`.
pub fn load_as(
    dir: &Path,
    cache: &Path,
    dtype: recall_engine::Dtype,
) -> recall_engine::Result<Embedder> {
    Embedder::load(
        dir,
        &LoadOptions {
            dtype,
            cache_dir: Some(cache.to_path_buf()),
            ..Default::default()
        },
    )
}

/// `load`, with a batch budget of one token: every input gets a forward
/// pass of its own.
pub fn load_one_at_a_time(dir: &Path, cache: &Path) -> recall_engine::Result<Embedder> {
    Embedder::load(
        dir,
        &LoadOptions {
            max_batch_tokens: 1,
            cache_dir: Some(cache.to_path_buf()),
            ..Default::default()
        },
    )
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "vector lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The MiniLM directory fetched by scripts/fetch_test_models.sh. The tests
/// that need it fail (never skip) without it.
pub fn minilm_dir() -> PathBuf {
    let dir = std::env::var_os("RECALL_TEST_MINILM")
        .map(PathBuf::from)
        .expect(
            "RECALL_TEST_MINILM is not set: run the tests with scripts/test.sh, \
         or set it to the directory printed by scripts/fetch_test_models.sh",
        );
    assert!(
        dir.join("model.safetensors").is_file(),
        "RECALL_TEST_MINILM={} has no model.safetensors",
        dir.display()
    );
    dir
}

/// The Python that has the real hermes-agent (scripts/hermes_venv.sh).
pub fn hermes_python() -> String {
    std::env::var("RECALL_TEST_HERMES_PYTHON").expect(
        "RECALL_TEST_HERMES_PYTHON is not set: run the tests with scripts/test.sh, which installs \
         hermes-agent==0.19.0 into a venv and points this at its python",
    )
}

/// Runs tests/hermes/SCRIPT with Hermes's Python; the last JSON object it prints.
pub fn hermes_script(script: &str, args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(hermes_python())
        .arg(repo_root().join("tests/hermes").join(script))
        .args(args)
        .env_remove("RECALL_API_KEY")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = out
        .stdout
        .split(|&b| b == b'\n')
        .rfind(|l| l.starts_with(b"{"))
        .unwrap_or_else(|| panic!("{script} printed no JSON"));
    serde_json::from_slice(json).unwrap()
}

/// Runs tests/hermes/hermes_db.py (the real Hermes SessionDB); its JSON answer.
pub fn hermes_db(args: &[&str]) -> serde_json::Value {
    hermes_script("hermes_db.py", args)
}

/// `recall COMMAND --hermes-home HOME --model MODEL EXTRA...`, which must succeed; its output.
pub fn recall_on(command: &[&str], home: &Path, model: &Path, extra: &[&str]) -> String {
    let mut args = command.to_vec();
    args.extend([
        "--hermes-home",
        home.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
    ]);
    args.extend_from_slice(extra);
    let (ok, out, err) = recall_cli(&args);
    assert!(ok, "recall {command:?} failed: {err}");
    out
}

/// Runs the `recall` binary (no stdin, a shared conversion cache, no
/// RECALL_MODEL or HERMES_HOME from outside): (success, stdout, stderr).
pub fn recall_cli(args: &[&str]) -> (bool, String, String) {
    let (code, out, err) = recall_env(args, &[]);
    (code == 0, out, err)
}

/// `recall_cli` with ENVS set, and none of RECALL_LOG, RECALL_DTYPE and
/// NO_COLOR from outside: (exit code, stdout, stderr).
pub fn recall_env(args: &[&str], envs: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_recall"));
    cmd.args(args)
        .env(
            "RECALL_CACHE_DIR",
            std::env::temp_dir().join("recall-test-cache"),
        )
        .env_remove("RECALL_MODEL")
        .env_remove("HERMES_HOME")
        .env_remove("RECALL_LOG")
        .env_remove("RECALL_DTYPE")
        .env_remove("NO_COLOR")
        .stdin(std::process::Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "recall panicked: {stderr}");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    )
}

/// A running `recall serve --port 0 --model MODEL EXTRA...` (EXTRA may name
/// another port) and its base URL
/// (read from its first line); killed when dropped.
pub struct Server {
    pub child: std::process::Child,
    pub base: String,
}

impl Server {
    pub fn start(model: &Path, extra: &[&str]) -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_recall"))
            .args(["serve", "--model", model.to_str().unwrap()])
            .args(if extra.contains(&"--port") {
                &[][..]
            } else {
                &["--port", "0"][..]
            })
            .args(extra)
            .env_remove("RECALL_API_KEY")
            .env_remove("HERMES_HOME")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let base = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        Self { child, base }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Opens `HOME/recall/index.db` after checking that every chunk has its
/// vector, its FTS row and its message, and every message its chunks.
pub fn assert_index_consistent(home: &Path) -> recall::index::store::Store {
    let store = recall::index::store::Store::open_existing(&home.join("recall/index.db")).unwrap();
    let c = store.conn();
    let count = |sql: &str| -> i64 { c.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(
        count("SELECT COUNT(*) FROM chunks"),
        count("SELECT COUNT(*) FROM chunks_vec"),
        "a chunk without its vector"
    );
    for (orphans, what) in [
        (
            "SELECT COUNT(*) FROM chunks c LEFT JOIN messages m ON m.profile = c.profile AND m.id = c.message_id WHERE m.id IS NULL",
            "a chunk without its message",
        ),
        (
            "SELECT COUNT(*) FROM messages m WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.profile = m.profile AND c.message_id = m.id)",
            "a message without chunks",
        ),
        (
            "SELECT COUNT(*) FROM chunks_vec v LEFT JOIN chunks c ON c.id = v.chunk_id WHERE c.id IS NULL",
            "a vector without its chunk",
        ),
        (
            "SELECT COUNT(*) FROM chunk_sparse s LEFT JOIN chunks c ON c.id = s.chunk_id WHERE c.id IS NULL",
            "sparse weights without their chunk",
        ),
        (
            "SELECT COUNT(*) FROM capped_messages k LEFT JOIN messages m ON m.profile = k.profile AND m.id = k.id WHERE m.id IS NULL",
            "a message counted as cut short that is not indexed",
        ),
    ] {
        assert_eq!(count(orphans), 0, "{what}");
    }
    c.execute(
        "INSERT INTO chunks_fts (chunks_fts, rank) VALUES ('integrity-check', 1)",
        [],
    )
    .expect("FTS index out of step");
    store
}

/// Indexes `home` in this process with `chain`, in chunks of 256 tokens (the tiny model's limit).
pub fn index_in_process(chain: &recall::provider::Chain, home: &Path) -> recall::index::Report {
    let mut store = recall::index::store::Store::open(&home.join("recall/index.db")).unwrap();
    let profiles = recall::source::hermes::profiles(home, None, false).unwrap();
    let options = recall::index::IndexOptions {
        selection: Default::default(),
        chunk: recall::index::chunk::ChunkParams {
            window: 256,
            overlap: 64,
        },
        rebuild: false,
    };
    recall::index::run(chain, &mut store, &profiles, &options, &|_, _, _, _| {}).unwrap()
}

/// Runs the `recall` binary so that directory permissions hold: as
/// `nobody` when the tests run as root (who ignores them), else as is.
pub fn recall_without_root(args: &[&str], cache: &Path) -> (bool, String, String) {
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let mut command = if root {
        let mut c = std::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_recall"));
        c
    } else {
        std::process::Command::new(env!("CARGO_BIN_EXE_recall"))
    };
    let out = command
        .args(args)
        .env("RECALL_CACHE_DIR", cache)
        .env("HOME", cache)
        .env_remove("RECALL_MODEL")
        .env_remove("HERMES_HOME")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A copy of the model in `src` (safetensors weights) with outlier
/// channels, as real checkpoints of the RoBERTa family have: in every
/// encoder LayerNorm (weight and bias), the first `channels` of
/// `OUTLIER_CHANNELS` scaled by `factor`. It simulates the kind of
/// activations int8 finds hard; it is another model, and says nothing of
/// how large the real BGE-M3's outliers are or where they sit.
pub fn outlier_model(src: &Path, channels: usize, factor: f32) -> (tempfile::TempDir, PathBuf) {
    const OUTLIER_CHANNELS: [usize; 4] = [3, 17, 29, 11];
    edited_model(
        src,
        &format!("outliers-{channels}x{factor}"),
        |name, data| {
            if name.contains("encoder.layer.") && name.contains("LayerNorm.") {
                for &c in &OUTLIER_CHANNELS[..channels] {
                    let at = c * 4..c * 4 + 4;
                    let v = f32::from_le_bytes(data[at.clone()].try_into().unwrap()) * factor;
                    data[at].copy_from_slice(&v.to_le_bytes());
                }
            }
        },
    )
}

/// A copy of the model at `src` whose first encoder layer's LayerNorm
/// weights are NaN: damaged weights, as a bad download or disk can leave.
pub fn nan_model(src: &Path) -> (tempfile::TempDir, PathBuf) {
    edited_model(src, "nan", |name, data| {
        if name.contains("encoder.layer.0.") && name.ends_with("LayerNorm.weight") {
            for value in data.chunks_exact_mut(4) {
                value.copy_from_slice(&f32::NAN.to_le_bytes());
            }
        }
    })
}

/// A copy of the model at `src` (named `<src>-<suffix>`) with each f32
/// tensor's bytes passed through `edit(name, bytes)`.
fn edited_model(
    src: &Path,
    suffix: &str,
    edit: impl Fn(&str, &mut [u8]),
) -> (tempfile::TempDir, PathBuf) {
    use safetensors::{Dtype, SafeTensors, tensor::TensorView};
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join(format!(
        "{}-{suffix}",
        src.file_name().unwrap().to_string_lossy()
    ));
    copy_dir(src, &dst, &["model.safetensors", "pytorch_model.bin"]);
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let tensors = SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in tensors.tensors() {
        let mut data = view.data().to_vec();
        if view.dtype() == Dtype::F32 {
            edit(&name, &mut data);
        }
        out.push((name, view.dtype(), view.shape().to_vec(), data));
    }
    let views: Vec<(String, TensorView)> = out
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dst.join("model.safetensors")).unwrap();
    (tmp, dst)
}
