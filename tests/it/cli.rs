//! The command line as a new user meets it: help with examples and headings,
//! the environment and exit codes in `--help`, completions and a man page,
//! colour conventions, `--json` on every command that reports (and JSON
//! errors), -q/-v, `--version`, and dates.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::*;
use serde_json::Value;

fn json_of(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not one JSON value ({e}): {text}"))
}

/// A Hermes home written by the real Hermes, indexed with the tiny model.
fn indexed_home() -> (tempfile::TempDir, HermesHome) {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("hermes");
    std::fs::create_dir_all(&home).unwrap();
    let home = HermesHome::create(home);
    recall()
        .arg("index")
        .hermes_home(&home)
        .model(&tiny_model_dir())
        .arg("--json")
        .output()
        .assert_ok();
    (tmp, home)
}

#[test]
fn help_shows_examples_headings_environment_and_exit_codes() {
    let out = recall().arg("--help").output().assert_ok().stdout;
    for wanted in [
        "Examples:",
        "RECALL_MODEL",
        "RECALL_CACHE_DIR",
        "RECALL_CONFIG",
        "RECALL_PROVIDERS",
        "RECALL_DTYPE",
        "RECALL_API_KEY",
        "RECALL_LOG",
        "HERMES_HOME",
        "OLLAMA_HOST",
        "HF_HOME",
        "NO_COLOR",
        "Exit status: 0",
        "2 a usage error",
        "75 indexing paused",
    ] {
        assert!(out.contains(wanted), "{wanted:?} in recall --help:\n{out}");
    }
    let out = recall()
        .args(["search", "--help"])
        .output()
        .assert_ok()
        .stdout;
    for heading in [
        "Output:",
        "Filters:",
        "Ranking:",
        "Hermes and the index:",
        "Model:",
        "Embedding providers:",
        "Examples:\n  recall search",
    ] {
        assert!(
            out.contains(heading),
            "{heading:?} in search --help:\n{out}"
        );
    }
    // search filters by --role; --roles (what an index holds) is not its option.
    assert!(
        out.contains("--role <ROLE>") && !out.contains("--roles"),
        "{out}"
    );
    let filters = &out[out.find("Filters:").unwrap()..out.find("Ranking:").unwrap()];
    assert!(
        filters.contains("--since") && filters.contains("7d"),
        "{filters}"
    );
    // Where --roles does not choose what is indexed, it says what it does there.
    let out = recall().args(["stats", "--help"]).output().stdout;
    assert!(
        out.contains("to count the messages not indexed yet"),
        "{out}"
    );
    let out = recall().args(["index", "--help"]).output().stdout;
    assert!(out.contains("Roles to index"), "{out}");
}

#[test]
fn completions_for_every_shell_and_a_man_page() {
    for shell in ["bash", "zsh", "fish", "powershell", "elvish"] {
        let out = recall()
            .args(["completions", shell])
            .output()
            .assert_ok()
            .stdout;
        for word in ["recall", "search", "--since", "hermes", "install"] {
            assert!(out.contains(word), "{shell} completion lacks {word:?}");
        }
    }
    // The bash script is valid bash.
    let script = recall().args(["completions", "bash"]).output().stdout;
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("recall.bash");
    std::fs::write(&file, &script).unwrap();
    let status = Command::new("bash").arg("-n").arg(&file).status().unwrap();
    assert!(status.success(), "bash -n refused the completion script");
    let err = recall()
        .args(["completions", "tcsh"])
        .output()
        .assert_exit(2) // an unknown shell is a usage error
        .stderr;
    assert!(err.contains("tcsh"), "{err}");

    let man = recall().arg("man").output().assert_ok().stdout;
    assert!(
        man.starts_with(".ie") || man.contains(".TH recall"),
        "{man}"
    );
    assert!(man.contains(".TH recall 1"), "{man}");
    for word in ["search", "hermes", "RECALL_MODEL", "Exit status"] {
        assert!(man.contains(word), "man page lacks {word:?}");
    }
}

#[test]
fn version_names_commit_features_and_kernels() {
    let out = recall().arg("--version").output().assert_ok().stdout;
    assert!(
        out.starts_with(&format!("recall {}", env!("CARGO_PKG_VERSION"))),
        "{out}"
    );
    for wanted in [
        "commit ",
        "features: ",
        "CPU kernels here: f32 ",
        ", bf16 ",
        ", q8 ",
    ] {
        assert!(out.contains(wanted), "{wanted:?} in {out}");
    }
    assert!(out.contains(if cfg!(feature = "cuda") {
        "cuda"
    } else {
        "cpu only"
    }));
}

#[test]
fn json_everywhere_and_json_errors() {
    require!(hermes_python());
    let (_tmp, home) = indexed_home();
    let model = tiny_model_dir();
    let model_s = model.to_str().unwrap();
    // `recall ARGS --hermes-home HOME`.
    let run = |args: &[&str]| recall().args(args).hermes_home(&home).output();

    let out = run(&["stats", "--json"]).assert_ok();
    let stats = json_of(&out.stdout);
    assert!(stats["sessions"].as_u64().unwrap() >= 5, "{stats}");

    let out = run(&["search", "docker images", "--model", model_s, "--json"]).assert_ok();
    let hits: Vec<Value> = out.stdout.lines().map(json_of).collect();
    assert!(!hits.is_empty(), "{}", out.stdout);
    let session = hits[0]["session_id"].as_str().unwrap().to_string();

    let out = run(&["show", &session, "--json"]).assert_ok();
    let shown = json_of(&out.stdout);
    assert_eq!(shown["session_id"], session.as_str(), "{shown}");
    assert!(!shown["messages"].as_array().unwrap().is_empty(), "{shown}");

    let out = run(&["doctor", "--model", model_s, "--json"]);
    let doctor = json_of(&out.stdout);
    let checks = doctor["checks"].as_array().unwrap();
    assert!(
        checks
            .iter()
            .all(|c| ["ok", "warn", "fail"].contains(&c["status"].as_str().unwrap())),
        "{doctor}"
    );
    // doctor's problems (the plugin is not installed here) end in a JSON error.
    if doctor["problems"].as_u64().unwrap() > 0 {
        assert_eq!(json_of(&out.stderr)["exit_code"], 1, "{}", out.stderr);
    }

    let out = run(&["hermes", "status", "--json"]).assert_ok();
    let status = json_of(&out.stdout);
    assert_eq!(status["plugin"]["installed"], false, "{status}");
    assert_eq!(status["index"]["exists"], true, "{status}");
    assert_eq!(status["index"]["lag_messages"], 0, "{status}");

    let out = run(&["providers", "--model", model_s, "--json"]).assert_ok();
    let _ = json_of(out.stdout.lines().next().unwrap());

    let out = recall()
        .args(["model", "info", "--model", model_s, "--json"])
        .output()
        .assert_ok();
    assert_eq!(
        json_of(&out.stdout)["type"],
        "xlm-roberta",
        "{}",
        out.stdout
    );

    // Errors under --json: one object on standard error with a stable `error`
    // field and the exit code; usage errors too (exit 2).
    let missing = home.join("nowhere/index.db");
    let out = recall()
        .args(["search", "disk", "--index"])
        .arg(&missing)
        .arg("--json")
        .output();
    assert_eq!((out.code, out.stdout.as_str()), (1, ""), "{}", out.stderr);
    let error = json_of(&out.stderr);
    assert!(
        error["error"].as_str().unwrap().contains("nowhere"),
        "{error}"
    );
    assert_eq!(error["exit_code"], 1);
    let out = recall()
        .args(["search", "disk", "--limit", "many", "--json"])
        .output()
        .assert_exit(2);
    let error = json_of(&out.stderr);
    assert_eq!(
        (error["kind"].as_str(), error["exit_code"].as_u64()),
        (Some("usage"), Some(2))
    );
    assert!(
        error["error"].as_str().unwrap().contains("--limit"),
        "{error}"
    );
    // Without --json, the same error is a plain line.
    let out = recall()
        .args(["search", "disk", "--index"])
        .arg(&missing)
        .output();
    assert_eq!(out.code, 1);
    assert!(out.stderr.starts_with("error: "), "{}", out.stderr);
}

#[test]
fn colour_follows_the_flag_and_the_conventions() {
    require!(hermes_python());
    let (_tmp, home) = indexed_home();
    let model = tiny_model_dir();
    let search = |extra: &[&str], envs: &[(&str, &str)]| {
        recall()
            .args(["search", "docker images"])
            .hermes_home(&home)
            .model(&model)
            .args(extra)
            .envs(envs.iter().copied())
            .output()
            .assert_ok()
            .stdout
    };
    let bold = "\x1b[1m";
    // Not a terminal: plain text, as when piped to a file.
    assert!(!search(&[], &[]).contains('\x1b'));
    assert!(search(&["--color", "always"], &[]).contains(bold));
    assert!(!search(&["--color", "never"], &[]).contains('\x1b'));
    // An explicit --color always beats NO_COLOR and TERM=dumb (they only tune auto).
    assert!(search(&["--color=always"], &[("NO_COLOR", "1"), ("TERM", "dumb")]).contains(bold));
    // In a terminal (a pty from `script`), auto colours unless NO_COLOR or TERM=dumb.
    if let Some(in_tty) = through_a_pty(&home, &model) {
        assert!(in_tty(&[]).contains(bold), "auto colours a terminal");
        assert!(!in_tty(&[("NO_COLOR", "1")]).contains(bold), "NO_COLOR");
        assert!(!in_tty(&[("TERM", "dumb")]).contains(bold), "TERM=dumb");
    }
}

/// `recall search` run in a pseudo-terminal by util-linux's `script`
/// (installed by .ci/run): its output (standard error too, through the
/// terminal); None only where `script` cannot make one.
#[allow(clippy::type_complexity)]
fn through_a_pty<'a>(
    home: &'a Path,
    model: &'a Path,
) -> Option<Box<dyn Fn(&[(&str, &str)]) -> String + 'a>> {
    let probe = Command::new("script")
        .args(["-qec", "test -t 1", "/dev/null"])
        .stdin(Stdio::null())
        .status();
    match probe {
        Ok(s) if s.success() => {}
        // CI must have it: only a developer machine may lack it.
        _ if in_ci() => panic!("util-linux `script` is needed in CI"),
        _ => {
            eprintln!(
                "`script` cannot open a pty here: the terminal half of the colour test is not run"
            );
            return None;
        }
    }
    Some(Box::new(move |envs: &[(&str, &str)]| {
        let out = recall()
            .in_a_pty()
            .args(["search", "docker images"])
            .hermes_home(home)
            .model(model)
            .env("TERM", "xterm")
            .envs(envs.iter().copied())
            .output();
        assert!(out.success(), "{}", out.stdout);
        out.stdout
    }))
}

#[test]
fn verbosity_flags_and_recall_log() {
    let model = tiny_model_dir();
    let embed = |flags: &[&str], envs: &[(&str, &str)]| {
        let out = recall()
            .args(flags)
            .args(["embed", "--model", model.to_str().unwrap(), "hello"])
            .envs(envs.iter().copied())
            .output()
            .assert_ok();
        assert!(out.stdout.contains("\"dense\""), "{}", out.stdout);
        out.stderr
    };
    let loaded = "loaded ";
    assert!(!embed(&[], &[]).contains(loaded));
    assert!(embed(&["-v"], &[]).contains(loaded));
    assert!(embed(&["-vv"], &[]).contains(loaded));
    // The flag also works after the subcommand (it is global).
    let err = recall()
        .args(["embed", "-v", "--model", model.to_str().unwrap(), "hello"])
        .output()
        .assert_ok()
        .stderr;
    assert!(err.contains(loaded), "{err}");
    // RECALL_LOG wins over -q.
    assert!(embed(&["-q"], &[("RECALL_LOG", "recall=debug")]).contains(loaded));
    // -q and -v conflict.
    recall().args(["-q", "-v", "stats"]).output().assert_exit(2);
}

#[test]
fn dates_are_checked_and_documented_forms_accepted() {
    require!(hermes_python());
    let (_tmp, home) = indexed_home();
    let model = tiny_model_dir();
    let search = |since: &str| {
        recall()
            .args(["search", "disk"])
            .hermes_home(&home)
            .model(&model)
            .args(["--since", since])
            .output()
    };
    for bad in [
        "2026-02-31",
        "2026-02-28T99:00",
        "2026-13-01",
        "last tuesday",
        "7x",
    ] {
        let out = search(bad);
        assert_eq!(out.code, 1, "{bad} was accepted");
        let err = out.stderr;
        assert!(err.contains(bad), "the error names {bad:?}: {err}");
    }
    for good in [
        "2026-02-28",
        "2026-02-28T10:00",
        "2026-02-28T10:00:00+08:00",
        "2026-02-28T02:00:00Z",
        "1772236800",
        "7d",
        "2 weeks",
        "yesterday",
        "today",
    ] {
        let out = search(good);
        assert_eq!(out.code, 0, "{good}: {}", out.stderr);
    }
    // Hermes stamped the messages now: a day ago finds them, a window in the future nothing.
    let out = search("yesterday").stdout;
    assert!(out.contains("Disk cleanup"), "{out}");
    let out = search("2100-01-01");
    assert_eq!(out.code, 0);
    let out = out.stdout;
    assert!(out.contains("no session matches"), "{out}");
}

/// Output into a pipe whose reader has gone (`recall search … | head -1`)
/// ends the command quietly, as it ends grep: no panic, no error.
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    require!(hermes_python());
    let (_tmp, home) = indexed_home();
    let home = home.to_str().unwrap();
    let tiny = tiny_model_dir();
    let tiny = tiny.to_str().unwrap();
    for args in [
        vec!["completions", "bash"],
        vec!["man"],
        vec!["embed", "--model", tiny, "the disk is full"],
        vec!["stats", "--hermes-home", home],
        vec![
            "search",
            "disk space",
            "--hermes-home",
            home,
            "--model",
            tiny,
        ],
        vec!["show", "20260302_090000_aa0002", "--hermes-home", home],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = recall().args(&args).stdout(writer).output();
        let stderr = &out.stderr;
        assert!(
            out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
            "{args:?}: {:?} {stderr}",
            out.status
        );
        assert!(stderr.trim().is_empty(), "{args:?}: {stderr}");
    }
}
