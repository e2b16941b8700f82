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
                watch(
                    &chain,
                    &index_path,
                    &profiles,
                    &options,
                    timing,
                    &nudges,
                    &stopped,
                    &on_event,
                )
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

/// Indexes `profiles` into the index at `index_path` whenever Hermes writes,
/// until `stop` is set. `on_event` hears of every run.
#[allow(clippy::too_many_arguments)]
pub fn watch(
    chain: &Chain,
    index_path: &Path,
    profiles: &[Profile],
    options: &IndexOptions,
    watch: WatchOptions,
    nudges: &Receiver<()>,
    stop: &AtomicBool,
    on_event: &dyn Fn(Event),
) -> Result<()> {
    let _running = claim(index_path)?;
    let paths = watched_paths(profiles);
    let (notified_tx, notified) = channel::<()>();
    // Notifications are a shortcut; the poll below is the guarantee.
    let _watcher = notify::recommended_watcher(move |_: notify::Result<notify::Event>| {
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

    let mut indexed: Option<Signature> = None;
    let mut last_error: Option<String> = None;
    let mut waiting_reported = false;
    let mut nudged = false;
    let mut retry_at: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        let mut current = signature(&paths);
        let retry_due = retry_at.is_some_and(|t| Instant::now() >= t);
        if indexed.as_ref() != Some(&current) || nudged || retry_due {
            retry_at = None;
            // Quiet for `debounce` (but never put off for more than a second).
            let started = Instant::now();
            loop {
                std::thread::sleep(watch.debounce);
                let again = signature(&paths);
                if again == current || started.elapsed() > Duration::from_secs(1) {
                    break;
                }
                current = again;
            }
            let missing: Vec<PathBuf> = profiles
                .iter()
                .map(|p| p.state_db())
                .filter(|p| !p.is_file())
                .collect();
            if missing.len() == profiles.len() {
                if !waiting_reported {
                    on_event(Event::Waiting(&missing));
                    waiting_reported = true;
                }
            } else {
                waiting_reported = false;
                let run = Store::open(index_path)
                    .map_err(anyhow::Error::from)
                    .and_then(|mut store| {
                        let report =
                            index::run(chain, &mut store, profiles, options, &|_, _, _, _| {})?;
                        crate::search::vector::prepare(&store);
                        Ok(report)
                    });
                match run {
                    Ok(report) => {
                        last_error = None;
                        if report.paused.is_some() {
                            retry_at = Some(Instant::now() + watch.retry);
                        }
                        on_event(Event::Indexed(&report));
                    }
                    Err(e) => {
                        let message = format!("{e:#}");
                        if last_error.as_ref() != Some(&message) {
                            on_event(Event::Failed(&message));
                            last_error = Some(message);
                        }
                    }
                }
            }
            // What was indexed is the state before the run: writes during it
            // change the signature again and are picked up next time.
            indexed = Some(current);
            nudged = false;
        }
        let deadline = Instant::now() + watch.poll;
        while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
            let slice = watch.poll.min(Duration::from_millis(100));
            if notified.recv_timeout(Duration::ZERO).is_ok() {
                // Drain a burst, then look at the files.
                while notified.try_recv().is_ok() {}
                break;
            }
            match nudges.recv_timeout(slice) {
                Ok(()) => {
                    while nudges.try_recv().is_ok() {}
                    nudged = true;
                    break;
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => std::thread::sleep(slice),
            }
        }
    }
    Ok(())
}
