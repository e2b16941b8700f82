//! recall writes only to a file that is new, empty, or its own index:
//! `--index` pointing at Hermes's `state.db` (written by the real Hermes) or
//! at any other file leaves it byte-identical; a damaged index is named and
//! `--rebuild` recovers from it; a failed first run leaves no index behind.

use std::path::{Path, PathBuf};

use crate::common::*;
use recall::index::guard::{self, Found};
use recall::index::store::Store;
use rusqlite::Connection;

fn sha256(path: &Path) -> String {
    recall::model::manifest::sha256_file(path).unwrap()
}

/// The hashes of `path` and of its WAL, if it has one.
fn hashes(path: &Path) -> Vec<(PathBuf, String)> {
    let mut out = vec![(path.to_path_buf(), sha256(path))];
    let [wal, _, _] = guard::companions(path);
    if wal.exists() {
        out.push((wal.clone(), sha256(&wal)));
    }
    out
}

fn assert_unchanged(before: &[(PathBuf, String)]) {
    for (path, hash) in before {
        assert_eq!(&sha256(path), hash, "{} changed", path.display());
    }
}

/// `recall index --json` of `home` with the tiny model, and EXTRA.
fn index_cli(home: &Path, extra: &[&str]) -> Output {
    recall()
        .args(["index", "--json"])
        .hermes_home(home)
        .model(&tiny_model_dir())
        .args(extra)
        .output()
}

fn application_id(path: &Path) -> i32 {
    Connection::open(path)
        .unwrap()
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn hermes_state_db_is_never_written_as_an_index() {
    require!(hermes_python());
    for mode in ["wal", "delete"] {
        let tmp = tempfile::tempdir().unwrap();
        let home = HermesHome::create_in_mode(tmp.path().join("hermes"), mode);
        let state_db = home.join("state.db");
        let before = hashes(&state_db);
        // The slip itself, the same file by another name, and a copy of it
        // elsewhere (which only the file's content can tell).
        let copy = tmp.path().join("copy-of-state.db");
        std::fs::copy(&state_db, &copy).unwrap();
        let copy_hash = sha256(&copy);
        let other_name = home.join(".").join("state.db");
        for target in [&state_db, &other_name, &copy] {
            let out = index_cli(&home, &["--index", target.to_str().unwrap()]);
            assert!(
                !out.success(),
                "{mode}: indexing into {} succeeded",
                target.display()
            );
            let err = out.stderr;
            assert!(err.contains(target.to_str().unwrap()), "{err}");
            assert!(err.contains("Hermes"), "{err}");
            assert!(!err.contains("FOREIGN KEY"), "{err}");
            for rebuild in [true, false] {
                let extra: &[&str] = if rebuild { &["--rebuild"] } else { &[] };
                let mut args = vec!["--index", target.to_str().unwrap()];
                args.extend_from_slice(extra);
                assert!(!index_cli(&home, &args).success());
            }
            // Every command that opens an index refuses it too.
            for command in [&["search", "disk"][..], &["stats"][..]] {
                let out = recall()
                    .args(command)
                    .hermes_home(&home)
                    .arg("--index")
                    .arg(target)
                    .output();
                assert!(!out.success(), "{command:?} on {}", target.display());
                let err = out.stderr;
                assert!(err.contains("not a recall index"), "{command:?}: {err}");
            }
        }
        assert_unchanged(&before);
        assert_eq!(sha256(&copy), copy_hash);
        // The library refuses it as well, whoever calls it.
        let err = Store::open(&state_db).err().unwrap();
        assert!(
            format!("{err:#}").contains("Hermes Agent database"),
            "{err:#}"
        );
        assert!(
            matches!(err, recall::index::store::Error::Refused(_)),
            "{err:?}"
        );
        assert!(matches!(
            guard::inspect(&state_db).unwrap(),
            Found::Foreign(_)
        ));
        assert_unchanged(&before);
        // Hermes goes on writing, and the default index is built as usual.
        home.session("20260301_101500_aa0001")
            .message("user", "still writable");
        index_cli(&home, &[]).assert_ok();
        let index = home.join("recall/index.db");
        assert_eq!(application_id(&index), guard::APPLICATION_ID);
        let tables: i64 = Connection::open(&state_db)
            .unwrap()
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE name IN ('chunks', 'meta', 'embed_cache')",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(tables, 0, "recall's tables in Hermes's database");
    }
}

#[test]
fn only_new_empty_or_recall_files_are_written() {
    require!(hermes_python());
    let tmp = tempfile::tempdir().unwrap();
    let home = HermesHome::create(tmp.path().join("hermes"));

    // Refused, left byte-identical.
    let text = tmp.path().join("passwd");
    std::fs::write(&text, "root:x:0:0:root:/root:/bin/bash\n").unwrap();
    let app = tmp.path().join("app.db");
    Connection::open(&app)
        .unwrap()
        .execute_batch("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT); INSERT INTO notes (body) VALUES ('mine');")
        .unwrap();
    let other_app = tmp.path().join("other-app.db");
    Connection::open(&other_app)
        .unwrap()
        .execute_batch("PRAGMA application_id = 1234;")
        .unwrap();
    let dir = tmp.path().join("a-directory");
    std::fs::create_dir(&dir).unwrap();
    for (path, what) in [
        (&text, "not a SQLite database"),
        (&app, "tables of its own (notes)"),
        (&other_app, "application_id 0x000004d2"),
        (&dir, "a directory"),
    ] {
        let before = (!path.is_dir()).then(|| sha256(path));
        for extra in [&[][..], &["--rebuild"][..]] {
            let mut args = vec!["--index", path.to_str().unwrap()];
            args.extend_from_slice(extra);
            let out = index_cli(&home, &args);
            assert!(!out.success(), "{}", path.display());
            let err = out.stderr;
            assert!(err.contains(path.to_str().unwrap()), "{err}");
            assert!(err.contains(what), "{what:?} in {err}");
        }
        assert_eq!((!path.is_dir()).then(|| sha256(path)), before);
        assert!(
            !guard::companions(path)[0].exists(),
            "a WAL beside {}",
            path.display()
        );
    }

    // Accepted: a new path, a file of zero bytes, a SQLite database without tables.
    let empty = tmp.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    let bare = tmp.path().join("bare.db");
    Connection::open(&bare)
        .unwrap()
        .execute_batch("PRAGMA user_version = 1;")
        .unwrap();
    let new = tmp.path().join("sub/dir/new.db");
    for path in [&empty, &bare, &new] {
        let out = index_cli(&home, &["--index", path.to_str().unwrap()]);
        assert!(out.success(), "{}: {}", path.display(), out.stderr);
        assert_eq!(application_id(path), guard::APPLICATION_ID);
        assert_eq!(guard::inspect(path).unwrap(), Found::Index { marked: true });
        // And it is used again as recall's own.
        index_cli(&home, &["--index", path.to_str().unwrap()]).assert_ok();
    }
}

#[test]
fn an_index_from_before_the_mark_is_recognised_and_marked() {
    require!(hermes_python());
    let tmp = tempfile::tempdir().unwrap();
    let home = HermesHome::create(tmp.path().join("hermes"));
    assert!(index_cli(&home, &[]).success());
    let index = home.join("recall/index.db");
    Connection::open(&index)
        .unwrap()
        .execute_batch("PRAGMA application_id = 0;")
        .unwrap();
    assert_eq!(
        guard::inspect(&index).unwrap(),
        Found::Index { marked: false }
    );
    let out = index_cli(&home, &[]).assert_ok().stdout;
    assert!(out.contains("\"unchanged_messages\":15"), "{out}");
    assert_eq!(application_id(&index), guard::APPLICATION_ID);
}

/// Random bytes over every page of `path` but the first (the header and schema stay readable).
fn damage(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let page = 4096;
    assert!(bytes.len() > 2 * page, "index too small to damage");
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    for b in &mut bytes[page..] {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        *b = state as u8;
    }
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_damaged_index_is_named_and_rebuild_sets_it_aside() {
    require!(hermes_python());
    let tmp = tempfile::tempdir().unwrap();
    let home = HermesHome::create(tmp.path().join("hermes"));
    assert!(index_cli(&home, &[]).success());
    let index = home.join("recall/index.db");
    // Checkpointed and closed: the damage is in the file SQLite reads.
    Connection::open(&index)
        .unwrap()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
        .unwrap();
    for whole_file in [false, true] {
        if whole_file {
            // Even the header: only recall's mark at offset 68 is left.
            let mut bytes = std::fs::read(&index).unwrap();
            for b in &mut bytes[16..64] {
                *b = 0xff;
            }
            std::fs::write(&index, bytes).unwrap();
        } else {
            damage(&index);
        }
        let damaged = sha256(&index);
        if whole_file {
            // The library says which: damaged, not another program's file.
            let err = Store::open(&index).err().unwrap();
            assert!(
                matches!(err, recall::index::store::Error::Damaged(_)),
                "{err:?}"
            );
            assert_eq!(sha256(&index), damaged);
        }
        let out = index_cli(&home, &[]);
        assert!(!out.success(), "indexing into a damaged index succeeded");
        let err = out.stderr;
        assert!(err.contains(index.to_str().unwrap()), "{err}");
        assert!(err.contains("recall index --rebuild"), "{err}");
        let Output {
            code,
            stdout: out,
            stderr: err,
            ..
        } = index_cli(&home, &["--rebuild"]);
        assert!(code == 0, "--rebuild did not recover: {err}");
        assert!(
            err.contains("damaged") && err.contains("moved it to"),
            "{err}"
        );
        assert!(out.contains("\"embedded_messages\":15"), "{out}");
        // What was there is kept beside the new index, as it was.
        let aside: Vec<PathBuf> = std::fs::read_dir(home.join("recall"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.to_string_lossy().contains(".damaged-") && !p.to_string_lossy().ends_with("-wal")
            })
            .collect();
        assert!(
            aside.iter().any(|p| sha256(p) == damaged),
            "the damaged index was not kept: {aside:?}"
        );
        for p in aside {
            std::fs::remove_file(p).unwrap();
        }
        assert_index_consistent(&home);
        Connection::open(&index)
            .unwrap()
            .execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
            .unwrap();
    }
}

#[test]
fn a_failed_first_run_leaves_no_index() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("hermes");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("state.db"),
        "not a database at all, but long enough to look like a file header\n".repeat(4),
    )
    .unwrap();
    let err = index_cli(&home, &[]).assert_err().stderr;
    assert!(err.contains("state.db"), "{err}");
    assert!(
        !home.join("recall/index.db").exists(),
        "an empty index was left behind: {err}"
    );
}

/// A tmpfs of `kib` KiB mounted at `dir` (the tests run as root, as CI does),
/// unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, kib: usize) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(
            status.success(),
            "mounting a small tmpfs (to fill a disk) needs root: run the tests as root, as CI does"
        );
        Self(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_and_an_unwritable_directory_are_named() {
    require!(hermes_python());
    let tmp = tempfile::tempdir().unwrap();
    let home = HermesHome::create(tmp.path().join("hermes"));
    let full = tmp.path().join("full");
    let _disk = Tmpfs::mount(&full, 256);
    let index = full.join("index.db");
    let err = index_cli(&home, &["--index", index.to_str().unwrap()])
        .assert_err()
        .stderr;
    assert!(
        err.contains("no space left") && err.contains(full.to_str().unwrap()),
        "{err}"
    );

    // A directory recall may not write to (as nobody: root may write anywhere).
    let locked = tmp.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    chmod(tmp.path(), 0o755);
    chmod(&locked, 0o555);
    let index = locked.join("index.db");
    let cache = tmp.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    chmod(&cache, 0o777);
    let err = recall()
        .without_root()
        .arg("index")
        .hermes_home(&home)
        .arg("--index")
        .arg(&index)
        .model(&tiny_model_dir())
        .env("RECALL_CACHE_DIR", &cache)
        .env("HOME", &cache)
        .output()
        .assert_err()
        .stderr;
    assert!(
        err.contains("is not writable") && err.contains(locked.to_str().unwrap()),
        "{err}"
    );
}

#[test]
fn an_empty_index_says_so() {
    require!(hermes_python());
    let tmp = tempfile::tempdir().unwrap();
    // A Hermes database with no messages yet.
    let home = HermesHome::bulk(tmp.path().join("hermes"), 0);
    let out = index_cli(&home, &[]).assert_ok().stdout;
    assert!(out.contains("\"messages\":0"), "{out}");
    let err = recall()
        .args(["search", "disk"])
        .hermes_home(&home)
        .model(&tiny_model_dir())
        .output()
        .assert_err()
        .stderr;
    assert!(err.contains("is empty (no passages yet)"), "{err}");
}
