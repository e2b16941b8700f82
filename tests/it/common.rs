//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::ffi::{OsStr, OsString};
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

// ------------------------------------------------------------- fixtures

/// Whether the tests run in CI: `CI` set to anything but empty, `false`
/// or `0`. There a fixture that is not fetched fails the tests that need
/// it; elsewhere they skip.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| {
        let v = v.trim();
        !(v.is_empty() || v == "0" || v.eq_ignore_ascii_case("false"))
    })
}

/// The fetched fixture `var` names (scripts/test.sh sets it), or None where
/// it is not set: in CI a panic saying `unset`; elsewhere None, after one
/// line on standard error per process (written past libtest's capture)
/// saying which tests (`needing`) are skipped.
#[track_caller]
fn fixture(var: &str, note: &std::sync::Once, needing: &str, unset: &str) -> Option<PathBuf> {
    if let Some(value) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(value));
    }
    assert!(!in_ci(), "{var} is not set: {unset}");
    note.call_once(|| {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "note: {var} is not set: skipping the tests that need {needing}; \
             run bash scripts/test.sh for all of them"
        );
    });
    None
}

/// The value of a fixture the test needs (`minilm_dir()`,
/// `hermes_python()`, `clients_python()`), or a return from the test where
/// it is not fetched: the test passes, skipped (outside CI only: see
/// `fixture`). A test that needs one starts with it.
macro_rules! require {
    ($fixture:expr) => {
        match $fixture {
            Some(value) => value,
            None => return,
        }
    };
}
pub(crate) use require;

/// The MiniLM directory fetched by scripts/fetch_test_models.sh
/// (`RECALL_TEST_MINILM`); see `require!`.
#[track_caller]
pub fn minilm_dir() -> Option<PathBuf> {
    static NOTE: std::sync::Once = std::sync::Once::new();
    let dir = fixture(
        "RECALL_TEST_MINILM",
        &NOTE,
        "all-MiniLM-L6-v2",
        "run the tests with scripts/test.sh, \
         or set it to the directory printed by scripts/fetch_test_models.sh",
    )?;
    assert!(
        dir.join("model.safetensors").is_file(),
        "RECALL_TEST_MINILM={} has no model.safetensors",
        dir.display()
    );
    Some(dir)
}

/// `minilm_dir()` in a helper of a test that started with
/// `require!(minilm_dir())`.
#[track_caller]
pub fn minilm() -> PathBuf {
    minilm_dir().expect("a test that needs MiniLM starts with require!(minilm_dir())")
}

/// The Python that has the real hermes-agent (scripts/hermes_venv.sh,
/// `RECALL_TEST_HERMES_PYTHON`); see `require!`.
#[track_caller]
pub fn hermes_python() -> Option<PathBuf> {
    static NOTE: std::sync::Once = std::sync::Once::new();
    fixture(
        "RECALL_TEST_HERMES_PYTHON",
        &NOTE,
        "the real Hermes",
        "run the tests with scripts/test.sh, which installs \
         hermes-agent==0.19.0 into a venv and points this at its python",
    )
}

/// The Python that has the real embedding clients (scripts/clients_venv.sh,
/// `RECALL_TEST_CLIENTS_PYTHON`); see `require!`.
#[track_caller]
pub fn clients_python() -> Option<PathBuf> {
    static NOTE: std::sync::Once = std::sync::Once::new();
    fixture(
        "RECALL_TEST_CLIENTS_PYTHON",
        &NOTE,
        "the real embedding clients",
        "run the tests with scripts/test.sh, which \
         installs the client libraries into a venv (scripts/clients_venv.sh)",
    )
}

// ------------------------------------------------------- the real Hermes

/// Runs tests/hermes/SCRIPT with Hermes's Python; the last JSON object it
/// prints. The test started with `require!(hermes_python())`.
pub fn hermes_script(script: &str, args: &[&str]) -> serde_json::Value {
    let python = hermes_python()
        .expect("a test that runs the real Hermes starts with require!(hermes_python())");
    let out = std::process::Command::new(python)
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
fn hermes_db(args: &[&str]) -> serde_json::Value {
    hermes_script("hermes_db.py", args)
}

/// A Hermes home (what `--hermes-home` names) whose `state.db` the real
/// Hermes writes: hermes-agent 0.19.0's SessionDB, driven by
/// tests/hermes/hermes_db.py. It stands for its path (`Deref<Target = Path>`).
/// The tests that use it start with `require!(hermes_python())`.
#[derive(Debug, Clone)]
pub struct HermesHome(PathBuf);

/// A message Hermes appended.
pub struct Appended {
    /// Its id in Hermes's `messages` table.
    pub id: i64,
    /// When Hermes's write was committed, in seconds since the epoch.
    pub committed_at: f64,
}

impl HermesHome {
    /// Hermes's home at `path`, as it is (maybe without a database yet: a
    /// message to a session creates one).
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self(path.into())
    }

    /// The small realistic history at `path`, in WAL mode: five sessions
    /// and a compressed continuation of the first (a subagent's and a cron
    /// job's among them), with a tool call, a tool result and multimodal
    /// content: 15 messages of users and assistants to index.
    pub fn create(path: impl Into<PathBuf>) -> Self {
        Self::create_in_mode(path, "wal")
    }

    /// `create`, in the journal mode `mode`: `wal`, or `delete` (Hermes's
    /// choice on filesystems without WAL).
    pub fn create_in_mode(path: impl Into<PathBuf>, mode: &str) -> Self {
        let home = Self::at(path);
        hermes_db(&["create", home.arg(), "--mode", mode]);
        home
    }

    /// `n` generated messages over `n / 10` sessions, in WAL mode.
    pub fn bulk(path: impl Into<PathBuf>, n: usize) -> Self {
        Self::bulk_in_mode(path, n, "wal")
    }

    /// `bulk`, in the journal mode `mode` (see `create_in_mode`).
    pub fn bulk_in_mode(path: impl Into<PathBuf>, n: usize, mode: &str) -> Self {
        let home = Self::at(path);
        hermes_db(&["bulk", home.arg(), &n.to_string(), "--mode", mode]);
        home
    }

    /// The retrieval evaluation's history in `corpus` (tests/hermes/eval/).
    pub fn eval(path: impl Into<PathBuf>, corpus: &Path) -> Self {
        let home = Self::at(path);
        hermes_db(&["eval-create", home.arg(), corpus.to_str().unwrap()]);
        home
    }

    /// The everyday conversations in `history` (tests/hermes/chat/), and
    /// each session's message ids in order: `{session: [id, ...]}`.
    pub fn chat(path: impl Into<PathBuf>, history: &Path) -> (Self, serde_json::Value) {
        let home = Self::at(path);
        let ids = hermes_db(&["chat-create", home.arg(), history.to_str().unwrap()])["ids"].clone();
        (home, ids)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }

    /// The session `id` (Hermes creates it, as a `cli` one, with its first message).
    pub fn session<'a>(&'a self, id: &'a str) -> HermesSession<'a> {
        HermesSession { home: self, id }
    }

    /// Appends to a session of its own for `seconds`, as Hermes does while
    /// recall reads: `{"written": N, "errors": [the errors Hermes saw]}`.
    pub fn keep_writing(&self, seconds: f64) -> serde_json::Value {
        hermes_db(&["writer", self.arg(), &seconds.to_string()])
    }

    /// A copy of `state.db` and its WAL (without the shared-memory file)
    /// in `dest`, taken while Hermes has the database open, right after a
    /// write: a backup of a live database.
    pub fn live_copy(&self, dest: &Path) {
        hermes_db(&["live-copy", self.arg(), dest.to_str().unwrap()]);
    }

    /// A session (`20260601_000000_0dd001`) whose rows hold what Hermes can
    /// store but is no clean text (tests/hermes/hermes_db.py `odd-rows`):
    /// their ids.
    pub fn odd_rows(&self) -> Vec<i64> {
        hermes_db(&["odd-rows", self.arg()])["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect()
    }

    /// Hermes's own `session_search` (FTS5) of each query: the session ids it ranks.
    pub fn hermes_search(
        &self,
        queries: &[&str],
    ) -> std::collections::BTreeMap<String, Vec<String>> {
        let mut args = vec!["hermes-search", self.arg()];
        args.extend(queries);
        serde_json::from_value(hermes_db(&args)["results"].clone()).unwrap()
    }
}

impl std::ops::Deref for HermesHome {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for HermesHome {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

/// A session of a `HermesHome`.
pub struct HermesSession<'a> {
    home: &'a HermesHome,
    id: &'a str,
}

impl HermesSession<'_> {
    /// Appends a message of `role` saying `text`.
    pub fn message(&self, role: &str, text: &str) -> Appended {
        appended(&hermes_db(&[
            "append",
            self.home.arg(),
            self.id,
            role,
            text,
        ]))
    }

    /// `message`, its text read from `file` (a large one).
    pub fn message_from_file(&self, role: &str, file: &Path) -> Appended {
        let path = file.to_str().unwrap();
        appended(&hermes_db(&[
            "append-file",
            self.home.arg(),
            self.id,
            role,
            path,
        ]))
    }

    /// A /retry-style rewrite: the session's first `keep` messages kept,
    /// the last of them now saying `text`, the rest deleted.
    pub fn rewrite(&self, keep: usize, text: &str) {
        hermes_db(&["replace", self.home.arg(), self.id, &keep.to_string(), text]);
    }
}

fn appended(answer: &serde_json::Value) -> Appended {
    Appended {
        id: answer["id"].as_i64().unwrap(),
        committed_at: answer["committed_at"].as_f64().unwrap(),
    }
}

// -------------------------------------------------------- the recall binary

/// `recall`, to be run: the one way the tests start the binary.
///
/// It starts from the same environment every time: none of the variables
/// recall reads (`recall::env::all()`) comes from outside but those in
/// `INHERITED`, and `RECALL_CACHE_DIR` is the tests' shared conversion
/// cache. A test that needs a variable sets it (`.env`). Standard input is
/// empty unless `.stdin` gives it bytes.
pub fn recall() -> Recall {
    let mut envs: Vec<(OsString, Option<OsString>)> = recall::env::all()
        .into_iter()
        .filter(|v| !INHERITED.iter().any(|i| i.name == v.name))
        .map(|v| (v.name.into(), None))
        .collect();
    envs.push((
        recall::env::CACHE_DIR.name.into(),
        Some(std::env::temp_dir().join("recall-test-cache").into()),
    ));
    Recall {
        args: Vec::new(),
        envs,
        dir: None,
        stdin: None,
        stdout: None,
        stderr: None,
        via: Via::Direct,
    }
}

/// The variables a test's `recall` takes from outside: the kernel
/// overrides (scripts/test.sh sets them to run the tests again on the
/// encoder's other kernels) and the machine's own.
const INHERITED: [recall::env::Var; 8] = {
    use recall::env::*;
    use recall_engine::env::{BF16, MATMUL, Q8, XDG_CACHE_HOME};
    [
        MATMUL,
        Q8,
        BF16,
        HOME,
        PATH,
        XDG_CONFIG_HOME,
        XDG_CACHE_HOME,
        TERM,
    ]
};

/// A `recall` command line and its environment (see `recall()`), run
/// once: by `output`, or by `spawn`.
pub struct Recall {
    args: Vec<OsString>,
    /// Set (Some) or removed (None), in order.
    envs: Vec<(OsString, Option<OsString>)>,
    dir: Option<PathBuf>,
    stdin: Option<Vec<u8>>,
    stdout: Option<std::process::Stdio>,
    stderr: Option<std::process::Stdio>,
    via: Via,
}

/// How the binary is started.
enum Via {
    Direct,
    /// As `nobody`, through `setpriv`, when the tests run as root.
    WithoutRoot,
    /// In a pseudo-terminal, through util-linux's `script`.
    Pty,
}

impl Recall {
    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    pub fn args<I, S>(&mut self, args: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        for arg in args {
            self.arg(arg);
        }
        self
    }

    /// `--hermes-home HOME`.
    pub fn hermes_home(&mut self, home: &Path) -> &mut Self {
        self.arg("--hermes-home").arg(home)
    }

    /// `--model MODEL`.
    pub fn model(&mut self, model: &Path) -> &mut Self {
        self.arg("--model").arg(model)
    }

    pub fn env(&mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut Self {
        let value = value.as_ref().to_owned();
        self.envs.push((key.as_ref().to_owned(), Some(value)));
        self
    }

    pub fn envs<I, K, V>(&mut self, vars: I) -> &mut Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        for (key, value) in vars {
            self.env(key, value);
        }
        self
    }

    pub fn env_remove(&mut self, key: impl AsRef<OsStr>) -> &mut Self {
        self.envs.push((key.as_ref().to_owned(), None));
        self
    }

    pub fn current_dir(&mut self, dir: impl AsRef<Path>) -> &mut Self {
        self.dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// Standard input: these bytes (else empty).
    pub fn stdin(&mut self, bytes: impl Into<Vec<u8>>) -> &mut Self {
        self.stdin = Some(bytes.into());
        self
    }

    /// Where standard output goes (else captured).
    pub fn stdout(&mut self, to: impl Into<std::process::Stdio>) -> &mut Self {
        self.stdout = Some(to.into());
        self
    }

    /// Where standard error goes (else captured).
    pub fn stderr(&mut self, to: impl Into<std::process::Stdio>) -> &mut Self {
        self.stderr = Some(to.into());
        self
    }

    /// Runs it as `nobody` when the tests run as root (who ignores
    /// directory permissions), so that they hold; as is otherwise.
    pub fn without_root(&mut self) -> &mut Self {
        self.via = Via::WithoutRoot;
        self
    }

    /// Runs it in a pseudo-terminal (util-linux's `script`): its standard
    /// output is a terminal, and comes back through `script`'s.
    pub fn in_a_pty(&mut self) -> &mut Self {
        self.via = Via::Pty;
        self
    }

    /// The command line, for messages.
    pub fn line(&self) -> String {
        std::iter::once(OsStr::new("recall"))
            .chain(self.args.iter().map(OsString::as_os_str))
            .map(|a| shell_quoted(a.to_string_lossy().as_ref()))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn command(&mut self) -> std::process::Command {
        use std::process::{Command, Stdio};
        let bin = env!("CARGO_BIN_EXE_recall");
        let mut cmd = match self.via {
            Via::Direct => Command::new(bin),
            Via::WithoutRoot if !running_as_root() => Command::new(bin),
            Via::WithoutRoot => {
                let mut c = Command::new("setpriv");
                c.args(["--reuid=65534", "--regid=65534", "--clear-groups", bin]);
                c
            }
            Via::Pty => {
                let line = std::iter::once(bin.to_string())
                    .chain(self.args.iter().map(|a| a.to_str().unwrap().to_string()))
                    .map(|a| shell_quoted(&a))
                    .collect::<Vec<_>>()
                    .join(" ");
                let mut c = Command::new("script");
                c.args(["-qec", &line, "/dev/null"]);
                c
            }
        };
        if !matches!(self.via, Via::Pty) {
            cmd.args(&self.args);
        }
        for (key, value) in &self.envs {
            match value {
                Some(value) => cmd.env(key, value),
                None => cmd.env_remove(key),
            };
        }
        if let Some(dir) = &self.dir {
            cmd.current_dir(dir);
        }
        cmd.stdin(if self.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        cmd.stdout(self.stdout.take().unwrap_or_else(Stdio::piped));
        cmd.stderr(self.stderr.take().unwrap_or_else(Stdio::piped));
        cmd
    }

    /// Starts it (a long-running one: `serve`, `watch`); its standard
    /// output and error are pipes unless `.stdout`/`.stderr` said otherwise.
    pub fn spawn(&mut self) -> std::process::Child {
        let mut child = self
            .command()
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", self.line()));
        if let Some(bytes) = self.stdin.take() {
            let mut stdin = child.stdin.take().unwrap();
            std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &bytes));
        }
        child
    }

    /// Runs it to the end; what it did, after checking that it did not panic.
    pub fn output(&mut self) -> Output {
        let out = self.spawn().wait_with_output().unwrap();
        let output = Output {
            status: out.status,
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            line: self.line(),
        };
        assert!(
            !output.stderr.contains("panicked"),
            "{} panicked: {}",
            output.line,
            output.stderr
        );
        output
    }
}

fn running_as_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// `arg` as one word of a POSIX shell's command line.
fn shell_quoted(arg: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

/// What a `recall` run did.
#[derive(Debug)]
pub struct Output {
    pub status: std::process::ExitStatus,
    /// The exit code; -1 when a signal ended it.
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    /// The command line.
    line: String,
}

impl Output {
    /// Whether it exited 0.
    pub fn success(&self) -> bool {
        self.code == 0
    }

    /// Panics, naming the command and with its standard error, unless it exited 0.
    #[track_caller]
    pub fn assert_ok(self) -> Self {
        assert!(
            self.success(),
            "{} failed ({}): {}",
            self.line,
            self.status,
            self.stderr
        );
        self
    }

    /// Panics unless it failed (exited other than 0).
    #[track_caller]
    pub fn assert_err(self) -> Self {
        assert!(
            !self.success(),
            "{} succeeded: {}{}",
            self.line,
            self.stdout,
            self.stderr
        );
        self
    }

    /// Panics unless it exited `code`.
    #[track_caller]
    pub fn assert_exit(self, code: i32) -> Self {
        assert_eq!(
            self.code, code,
            "{} ({}): {}",
            self.line, self.status, self.stderr
        );
        self
    }
}

/// A running `recall serve --port 0 --model MODEL EXTRA...` (EXTRA may name
/// another port) and its base URL (read from its first line); killed when
/// dropped. Its standard error is a pipe.
pub struct Server {
    pub child: std::process::Child,
    pub base: String,
}

impl Server {
    pub fn start(model: &Path, extra: &[&str]) -> Self {
        use std::io::BufRead;
        let port: &[&str] = if extra.contains(&"--port") {
            &[]
        } else {
            &["--port", "0"]
        };
        let mut child = recall()
            .arg("serve")
            .model(model)
            .args(port)
            .args(extra)
            .spawn();
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
