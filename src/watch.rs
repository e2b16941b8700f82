//! `recall watch` (and `recall serve --watch`): follows Hermes's databases
//! and indexes what changed, so a new message is searchable seconds after
//! Hermes writes it.
//!
//! What is watched is each profile's `state.db` and its `-wal` (Hermes writes
//! the WAL on every commit) and its `sessions/` directory: file notifications
//! (the `notify` crate) wake the loop at once, and a poll of the files'
//! identity, size and modification time every `poll` catches what
//! notifications miss (network filesystems, a database file replaced by a
//! new one, a machine that slept). A change is debounced (quiet for
//! `debounce`, so a burst of writes is one run), then indexed incrementally:
//! the index's fingerprints find appends, edits and deletions alike. A missing
//! database is waited for; an error is reported once and retried on the next
//! change.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use notify::{RecursiveMode, Watcher as _};

use crate::index::store::Store;
use crate::index::{self, IndexOptions, Report};
use crate::provider::Chain;
use crate::source::hermes::Profile;

#[derive(Debug, Clone, Copy)]
pub struct WatchOptions {
    /// How often the files are checked when no notification comes.
    pub poll: Duration,
    /// How long the files must stay unchanged before indexing.
    pub debounce: Duration,
    /// How soon a run that paused (no embedding provider) is tried again.
    pub retry: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            poll: Duration::from_millis(500),
            debounce: Duration::from_millis(150),
            retry: Duration::from_secs(30),
        }
    }
}

/// What a watch run reports after each indexing.
pub enum Event<'a> {
    Indexed(&'a Report),
    /// Indexing failed (the message is given once until it changes).
    Failed(&'a str),
    /// No Hermes database at these paths yet.
    Waiting(&'a [PathBuf]),
}

impl Event<'_> {
    /// The line a person reads for this event; None for a run that changed nothing.
    pub fn describe(&self) -> Option<String> {
        match self {
            Event::Indexed(r) if r.paused.is_some() => Some(format!(
                "indexing paused, {} messages wait: {} (retrying soon, and on each change)",
                r.pending_messages,
                r.paused.as_deref().unwrap_or_default(),
            )),
            Event::Indexed(r) if r.embedded_messages + r.deleted_messages == 0 => None,
            Event::Indexed(r) => Some(format!(
                "indexed {} new or changed messages, removed {}, in {:.2}s",
                r.embedded_messages, r.deleted_messages, r.seconds
            )),
            Event::Failed(message) => Some(format!(
                "cannot index: {message} (retrying on the next change)"
            )),
            Event::Waiting(paths) => Some(format!(
                "waiting for Hermes: no database at {} yet",
                paths
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

/// Wakes a running watch at once (e.g. from the Hermes plugin's nudge).
#[derive(Clone)]
pub struct Nudge(Sender<()>);

impl Nudge {
    pub fn nudge(&self) {
        let _ = self.0.send(());
    }
}

/// The channel a watch listens on for nudges.
pub fn nudge_channel() -> (Nudge, Receiver<()>) {
    let (tx, rx) = channel();
    (Nudge(tx), rx)
}

/// The file whose lock says a watcher follows the index at `index_path`.
pub fn lock_path(index_path: &Path) -> PathBuf {
    let mut p = index_path.as_os_str().to_owned();
    p.push(".watch");
    PathBuf::from(p)
}

/// One watcher per index: two would index the same changes twice over.
fn claim(index_path: &Path) -> Result<std::fs::File> {
    if let Some(dir) = index_path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let path = lock_path(index_path);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    if file.try_lock().is_err() {
        let mut pid = String::new();
        let _ = std::io::Read::read_to_string(&mut file, &mut pid);
        bail!(
            "another recall watch (or recall serve --watch, pid {}) already follows {}",
            pid.trim(),
            index_path.display()
        );
    }
    file.set_len(0)?;
    std::io::Write::write_all(&mut file, std::process::id().to_string().as_bytes())?;
    Ok(file)
}

/// Whether a watcher follows the index at `index_path` now.
pub fn is_watched(index_path: &Path) -> bool {
    std::fs::File::open(lock_path(index_path)).is_ok_and(|f| f.try_lock().is_err())
}

/// Identity, length and modification time of each watched file.
type Signature = Vec<Option<(u64, u64, SystemTime)>>;

fn watched_paths(profiles: &[Profile]) -> Vec<PathBuf> {
    profiles
        .iter()
        .flat_map(|p| {
            [
                p.state_db(),
                p.home.join("state.db-wal"),
                p.home.join("sessions"),
            ]
        })
        .collect()
}

fn signature(paths: &[PathBuf]) -> Signature {
    paths
        .iter()
        .map(|p| {
            let m = std::fs::metadata(p).ok()?;
            #[cfg(unix)]
            let inode = std::os::unix::fs::MetadataExt::ino(&m);
            #[cfg(not(unix))]
            let inode = 0;
            Some((inode, m.len(), m.modified().ok()?))
        })
        .collect()
}

/// A watch on its own thread (`recall serve --watch`).
pub struct Background {
    nudge: Nudge,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Background {
    /// Starts `watch` on a thread of its own, indexing with `chain`.
    pub fn spawn(
        chain: Chain,
        index_path: PathBuf,
        profiles: Vec<Profile>,
        options: IndexOptions,
        timing: WatchOptions,
        on_event: impl Fn(Event) + Send + 'static,
    ) -> Result<Self> {
        if is_watched(&index_path) {
            bail!(
                "another recall watch (or recall serve --watch) already follows {}",
                index_path.display()
            );
        }
        let (nudge, nudges) = nudge_channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("recall-watch".into())
            .spawn(move || {
                let what = Watch {
                    chain: &chain,
                    index_path: &index_path,
                    profiles: &profiles,
                    options: &options,
                    timing,
                };
                let control = Control {
                    nudges: &nudges,
                    stop: &stopped,
                    on_event: &on_event,
                };
                watch(&what, &control)
            })?;
        Ok(Self {
            nudge,
            stop,
            thread: Some(thread),
        })
    }

    /// Wakes the watch at once.
    pub fn nudge(&self) -> Nudge {
        self.nudge.clone()
    }

    /// Stops the watch after the run in progress, and waits for it.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Dropped without `stop` (the server failed to start), the watch is told
/// to stop and left to finish on its own: the process is ending anyway.
impl Drop for Background {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What a watch indexes, and how often it looks.
pub struct Watch<'a> {
    pub chain: &'a Chain,
    pub index_path: &'a Path,
    pub profiles: &'a [Profile],
    pub options: &'a IndexOptions,
    pub timing: WatchOptions,
}

/// How a running watch is woken, stopped and heard from.
pub struct Control<'a> {
    /// A message indexes at once (`Nudge`).
    pub nudges: &'a Receiver<()>,
    /// Set, the watch ends after the run in progress.
    pub stop: &'a AtomicBool,
    /// Hears of every run.
    pub on_event: &'a dyn Fn(Event),
}

/// What the watch remembers between runs.
#[derive(Default)]
struct Runs {
    /// The profiles' files as the last run found them.
    indexed: Option<Signature>,
    /// The last failure said, so that the same one is not said again.
    last_error: Option<String>,
    waiting_reported: bool,
    nudged: bool,
    /// When a paused run is tried again.
    retry_at: Option<Instant>,
}

/// Indexes the watched profiles whenever Hermes writes, until told to stop.
pub fn watch(what: &Watch, control: &Control) -> Result<()> {
    let _running = claim(what.index_path)?;
    let paths = watched_paths(what.profiles);
    let (_watcher, notified) = file_notifications(what.profiles);
    let mut runs = Runs::default();
    while !control.stop.load(Ordering::Relaxed) {
        let current = signature(&paths);
        let retry_due = runs.retry_at.is_some_and(|t| Instant::now() >= t);
        if runs.indexed.as_ref() != Some(&current) || runs.nudged || retry_due {
            runs.retry_at = None;
            let current = settled(&paths, current, what.timing.debounce);
            run_once(what, control, &mut runs);
            // What was indexed is the state before the run: writes during it
            // change the signature again and are picked up next time.
            runs.indexed = Some(current);
            runs.nudged = false;
        }
        runs.nudged = wait(what.timing.poll, &notified, control);
    }
    Ok(())
}

/// File notifications of the profiles' homes, where the system has them:
/// a shortcut; the poll is the guarantee.
fn file_notifications(profiles: &[Profile]) -> (Option<notify::RecommendedWatcher>, Receiver<()>) {
    let (notified_tx, notified) = channel::<()>();
    let watcher = notify::recommended_watcher(move |_: notify::Result<notify::Event>| {
        let _ = notified_tx.send(());
    })
    .and_then(|mut w| {
        for p in profiles {
            if p.home.is_dir() {
                w.watch(&p.home, RecursiveMode::NonRecursive)?;
            }
        }
        Ok(w)
    })
    .map_err(|e| tracing::debug!("file notifications unavailable ({e}); polling only"))
    .ok();
    (watcher, notified)
}

/// The signature once the files have been quiet for `debounce` (but never
/// put off for more than a second).
fn settled(paths: &[PathBuf], mut current: Signature, debounce: Duration) -> Signature {
    let started = Instant::now();
    loop {
        std::thread::sleep(debounce);
        let again = signature(paths);
        if again == current || started.elapsed() > Duration::from_secs(1) {
            return current;
        }
        current = again;
    }
}

/// One indexing run, or the wait for Hermes's first database; says what
/// happened.
fn run_once(what: &Watch, control: &Control, runs: &mut Runs) {
    let missing: Vec<PathBuf> = what
        .profiles
        .iter()
        .map(|p| p.state_db())
        .filter(|p| !p.is_file())
        .collect();
    if missing.len() == what.profiles.len() {
        if !runs.waiting_reported {
            (control.on_event)(Event::Waiting(&missing));
            runs.waiting_reported = true;
        }
        return;
    }
    runs.waiting_reported = false;
    let run = Store::open(what.index_path)
        .map_err(anyhow::Error::from)
        .and_then(|mut store| {
            let report = index::run(
                what.chain,
                &mut store,
                what.profiles,
                what.options,
                &|_, _, _, _| {},
            )?;
            crate::search::vector::prepare(&store);
            Ok(report)
        });
    match run {
        Ok(report) => {
            runs.last_error = None;
            if report.paused.is_some() {
                runs.retry_at = Some(Instant::now() + what.timing.retry);
            }
            (control.on_event)(Event::Indexed(&report));
        }
        Err(e) => {
            let message = format!("{e:#}");
            if runs.last_error.as_ref() != Some(&message) {
                (control.on_event)(Event::Failed(&message));
                runs.last_error = Some(message);
            }
        }
    }
}

/// Waits up to `poll` for a file notification, a nudge or the stop; whether
/// it was a nudge.
fn wait(poll: Duration, notified: &Receiver<()>, control: &Control) -> bool {
    let deadline = Instant::now() + poll;
    while Instant::now() < deadline && !control.stop.load(Ordering::Relaxed) {
        let slice = poll.min(Duration::from_millis(100));
        if notified.recv_timeout(Duration::ZERO).is_ok() {
            // Drain a burst, then look at the files.
            while notified.try_recv().is_ok() {}
            return false;
        }
        match control.nudges.recv_timeout(slice) {
            Ok(()) => {
                while control.nudges.try_recv().is_ok() {}
                return true;
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => std::thread::sleep(slice),
        }
    }
    false
}
