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
fn indexed_home() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("hermes");
    std::fs::create_dir_all(&home).unwrap();
    hermes_db(&["create", home.to_str().unwrap()]);
    recall_on(&["index"], &home, &tiny_model_dir(), &["--json"]);
    (tmp, home)
}

#[test]
fn help_shows_examples_headings_environment_and_exit_codes() {
    let (code, out, _) = recall_env(&["--help"], &[]);
    assert_eq!(code, 0);
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
    let (code, out, _) = recall_env(&["search", "--help"], &[]);
    assert_eq!(code, 0);
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
    let (_, out, _) = recall_env(&["stats", "--help"], &[]);
    assert!(
        out.contains("to count the messages not indexed yet"),
        "{out}"
    );
    let (_, out, _) = recall_env(&["index", "--help"], &[]);
    assert!(out.contains("Roles to index"), "{out}");
}

#[test]
fn completions_for_every_shell_and_a_man_page() {
    for shell in ["bash", "zsh", "fish", "powershell", "elvish"] {
        let (code, out, err) = recall_env(&["completions", shell], &[]);
        assert_eq!(code, 0, "{shell}: {err}");
        for word in ["recall", "search", "--since", "hermes", "install"] {
            assert!(out.contains(word), "{shell} completion lacks {word:?}");
        }
    }
    // The bash script is valid bash.
    let (_, script, _) = recall_env(&["completions", "bash"], &[]);
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("recall.bash");
    std::fs::write(&file, &script).unwrap();
    let status = Command::new("bash").arg("-n").arg(&file).status().unwrap();
    assert!(status.success(), "bash -n refused the completion script");
    let (code, _, err) = recall_env(&["completions", "tcsh"], &[]);
    assert_eq!(code, 2, "an unknown shell is a usage error: {err}");
    assert!(err.contains("tcsh"), "{err}");

    let (code, man, _) = recall_env(&["man"], &[]);
    assert_eq!(code, 0);
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
    let (code, out, _) = recall_env(&["--version"], &[]);
    assert_eq!(code, 0);
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
    let (_tmp, home) = indexed_home();
    let home_s = home.to_str().unwrap();
    let model = tiny_model_dir();
    let model_s = model.to_str().unwrap();
    let at = ["--hermes-home", home_s];

    let with = |args: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        v.extend(at.iter().map(|s| s.to_string()));
        v
    };
    let run = |args: Vec<String>| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        recall_env(&refs, &[])
    };

    let (code, out, err) = run(with(&["stats", "--json"]));
    assert_eq!(code, 0, "{err}");
    let stats = json_of(&out);
    assert!(stats["sessions"].as_u64().unwrap() >= 5, "{stats}");

    let (code, out, err) = run(with(&[
        "search",
        "docker images",
        "--model",
        model_s,
        "--json",
    ]));
    assert_eq!(code, 0, "{err}");
    let hits: Vec<Value> = out.lines().map(json_of).collect();
    assert!(!hits.is_empty(), "{out}");
    let session = hits[0]["session_id"].as_str().unwrap().to_string();

    let (code, out, err) = run(with(&["show", &session, "--json"]));
    assert_eq!(code, 0, "{err}");
    let shown = json_of(&out);
    assert_eq!(shown["session_id"], session.as_str(), "{shown}");
    assert!(!shown["messages"].as_array().unwrap().is_empty(), "{shown}");

    let (_, out, err) = run(with(&["doctor", "--model", model_s, "--json"]));
    let doctor = json_of(&out);
    let checks = doctor["checks"].as_array().unwrap();
    assert!(
        checks
            .iter()
            .all(|c| ["ok", "warn", "fail"].contains(&c["status"].as_str().unwrap())),
        "{doctor}"
    );
    // doctor's problems (the plugin is not installed here) end in a JSON error.
    if doctor["problems"].as_u64().unwrap() > 0 {
        assert_eq!(json_of(&err)["exit_code"], 1, "{err}");
    }

    let (code, out, err) = run(with(&["hermes", "status", "--json"]));
    assert_eq!(code, 0, "{err}");
    let status = json_of(&out);
    assert_eq!(status["plugin"]["installed"], false, "{status}");
    assert_eq!(status["index"]["exists"], true, "{status}");
    assert_eq!(status["index"]["lag_messages"], 0, "{status}");

    let (code, out, err) = run(with(&["providers", "--model", model_s, "--json"]));
    assert_eq!(code, 0, "{err}");
    let _ = json_of(out.lines().next().unwrap());

    let (code, out, err) = recall_env(&["model", "info", "--model", model_s, "--json"], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(json_of(&out)["type"], "xlm-roberta", "{out}");

    // Errors under --json: one object on standard error with a stable `error`
    // field and the exit code; usage errors too (exit 2).
    let missing = home.join("nowhere/index.db");
    let (code, out, err) = recall_env(
        &[
            "search",
            "disk",
            "--index",
            missing.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    let error = json_of(&err);
    assert!(
        error["error"].as_str().unwrap().contains("nowhere"),
        "{error}"
    );
    assert_eq!(error["exit_code"], 1);
    let (code, _, err) = recall_env(&["search", "disk", "--limit", "many", "--json"], &[]);
    assert_eq!(code, 2, "{err}");
    let error = json_of(&err);
    assert_eq!(
        (error["kind"].as_str(), error["exit_code"].as_u64()),
        (Some("usage"), Some(2))
    );
    assert!(
        error["error"].as_str().unwrap().contains("--limit"),
        "{error}"
    );
    // Without --json, the same error is a plain line.
    let (code, _, err) = recall_env(
        &["search", "disk", "--index", missing.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, 1);
    assert!(err.starts_with("error: "), "{err}");
}

#[test]
fn colour_follows_the_flag_and_the_conventions() {
    let (_tmp, home) = indexed_home();
    let model = tiny_model_dir();
    let search = |extra: &[&str], envs: &[(&str, &str)]| {
        let mut args = vec![
            "search",
            "docker images",
            "--hermes-home",
            home.to_str().unwrap(),
            "--model",
            model.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = recall_env(&args, envs);
        assert_eq!(code, 0, "{err}");
        out
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
/// (installed by .ci/run); None only where `script` cannot make one.
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
        _ if std::env::var_os("CI").is_some() => panic!("util-linux `script` is needed in CI"),
        _ => {
            eprintln!(
                "`script` cannot open a pty here: the terminal half of the colour test is not run"
            );
            return None;
        }
    }
    Some(Box::new(move |envs: &[(&str, &str)]| {
        let line = format!(
            "{} search 'docker images' --hermes-home '{}' --model '{}'",
            env!("CARGO_BIN_EXE_recall"),
            home.display(),
            model.display()
        );
        let mut cmd = Command::new("script");
        cmd.args(["-qec", &line, "/dev/null"])
            .env("TERM", "xterm")
            .env_remove("NO_COLOR")
            .env(
                "RECALL_CACHE_DIR",
                std::env::temp_dir().join("recall-test-cache"),
            )
            .stdin(Stdio::null());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }))
}

#[test]
fn verbosity_flags_and_recall_log() {
    let model = tiny_model_dir();
    let embed = |flags: &[&str], envs: &[(&str, &str)]| {
        let mut args = flags.to_vec();
        args.extend(["embed", "--model", model.to_str().unwrap(), "hello"]);
        let (code, out, err) = recall_env(&args, envs);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("\"dense\""), "{out}");
        err
    };
    let loaded = "loaded ";
    assert!(!embed(&[], &[]).contains(loaded));
    assert!(embed(&["-v"], &[]).contains(loaded));
    assert!(embed(&["-vv"], &[]).contains(loaded));
    // The flag also works after the subcommand (it is global).
    let (code, _, err) = recall_env(
        &["embed", "-v", "--model", model.to_str().unwrap(), "hello"],
        &[],
    );
    assert_eq!(code, 0);
    assert!(err.contains(loaded), "{err}");
    // RECALL_LOG wins over -q.
    assert!(embed(&["-q"], &[("RECALL_LOG", "recall=debug")]).contains(loaded));
    let (code, _, err) = recall_env(&["-q", "-v", "stats"], &[]);
    assert_eq!(code, 2, "-q and -v conflict: {err}");
}

#[test]
fn dates_are_checked_and_documented_forms_accepted() {
    let (_tmp, home) = indexed_home();
    let model = tiny_model_dir();
    let search = |since: &str| {
        recall_env(
            &[
                "search",
                "disk",
                "--hermes-home",
                home.to_str().unwrap(),
                "--model",
                model.to_str().unwrap(),
                "--since",
                since,
            ],
            &[],
        )
    };
    for bad in [
        "2026-02-31",
        "2026-02-28T99:00",
        "2026-13-01",
        "last tuesday",
        "7x",
    ] {
        let (code, _, err) = search(bad);
        assert_eq!(code, 1, "{bad} was accepted");
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
        let (code, _, err) = search(good);
        assert_eq!(code, 0, "{good}: {err}");
    }
    // Hermes stamped the messages now: a day ago finds them, a window in the future nothing.
    let (_, out, _) = search("yesterday");
    assert!(out.contains("Disk cleanup"), "{out}");
    let (code, out, _) = search("2100-01-01");
    assert_eq!(code, 0);
    assert!(out.contains("no session matches"), "{out}");
}

/// Output into a pipe whose reader has gone (`recall search … | head -1`)
/// ends the command quietly, as it ends grep: no panic, no error.
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
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
        let out = Command::new(env!("CARGO_BIN_EXE_recall"))
            .args(&args)
            .stdin(Stdio::null())
            .stdout(writer)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
            "{args:?}: {:?} {stderr}",
            out.status
        );
        assert!(stderr.trim().is_empty(), "{args:?}: {stderr}");
    }
}
