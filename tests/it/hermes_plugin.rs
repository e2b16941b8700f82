//! `recall hermes install|uninstall|status` with the real hermes-agent
//! 0.19.0 and the real all-MiniLM-L6-v2: Hermes's own plugin loader finds the plugin, its tool answers
//! through Hermes's own dispatch (via `recall serve` and via the binary), the
//! hook runs; a second install changes nothing; uninstall leaves
//! config.yaml byte for byte as it was.

use std::path::{Path, PathBuf};

use crate::common::*;
use serde_json::Value;

const CONFIG: &str = "# my Hermes settings\nmodel:\n  default: anthropic/claude-sonnet-4   # the good one\nplugins:\n  # what I enabled myself\n  enabled:\n  - other-plugin\n";
const QUERY: &str = "nginx config error";
const EXPECTED: &str = "20260302_090000_aa0002";

fn history() -> (tempfile::TempDir, HermesHome) {
    let tmp = tempfile::tempdir().unwrap();
    let home = HermesHome::create(tmp.path().join("hermes"));
    std::fs::write(home.join("config.yaml"), CONFIG).unwrap();
    (tmp, home)
}

/// Hermes's loader and dispatch on `home` (tests/hermes/plugin_check.py).
fn hermes_sees(home: &Path) -> Value {
    hermes_script("plugin_check.py", &[home.to_str().unwrap(), QUERY])
}

/// `recall hermes install` with MiniLM, which must succeed; its output.
fn install(home: &Path, extra: &[&str]) -> String {
    recall()
        .args(["hermes", "install"])
        .hermes_home(home)
        .model(&minilm())
        .args(extra)
        .output()
        .assert_ok()
        .stdout
}

/// `recall hermes install` without the `hermes` command.
fn install_without_hermes(home: &Path) -> Output {
    recall()
        .args(["hermes", "install"])
        .hermes_home(home)
        .model(&minilm())
        .arg("--no-hermes-command")
        .output()
}

fn uninstall(home: &Path) -> String {
    recall()
        .args(["hermes", "uninstall"])
        .hermes_home(home)
        .output()
        .assert_ok()
        .stdout
}

/// Every file under `dir` with its bytes and modification time.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>, std::time::SystemTime)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let meta = std::fs::metadata(&path).unwrap();
        if meta.is_file() {
            out.push((
                path.clone(),
                std::fs::read(&path).unwrap(),
                meta.modified().unwrap(),
            ));
        }
    }
    out.sort();
    out
}

fn assert_tool_answers(seen: &Value, via: &str) {
    assert_eq!(seen["loaded"], true, "{seen}");
    assert_eq!(seen["registered"], true);
    assert_eq!(seen["toolset"], "session_search");
    assert_eq!(seen["offered"], true);
    let result = &seen["result"];
    assert_eq!(result["success"], true, "{result}");
    assert_eq!(result["via"], via);
    let first = &result["results"][0];
    assert_eq!(first["session_id"], EXPECTED, "{result}");
    assert_eq!(first["link"], format!("@session:default/{EXPECTED}"));
    assert!(first["match_message_id"].is_i64());
    assert!(first["weak"].is_boolean(), "{first}");
    for (label, answer) in seen["hostile"].as_object().unwrap() {
        assert_eq!(answer["success"], true, "{label}: {answer}");
        assert_eq!(answer["via"], via, "{label}: {answer}");
    }
    assert_eq!(seen["no_query"]["success"], false);
    assert!(
        seen["no_query"]["error"]
            .as_str()
            .unwrap()
            .contains("query")
    );
    assert_eq!(seen["bad_limit"]["success"], false);
    assert_eq!(seen["hook_ran"], true);
}

#[test]
fn install_by_edit_then_uninstall_leaves_config_as_it_was() {
    require!(hermes_python());
    require!(minilm_dir());
    let (_tmp, home) = history();
    // No `hermes` command: recall edits config.yaml itself.
    let out = install(
        &home,
        &["--no-hermes-command", "--server", "http://127.0.0.1:9"],
    );
    assert!(out.contains("enabled it in"), "{out}");
    let config = std::fs::read_to_string(home.join("config.yaml")).unwrap();
    assert!(config.starts_with("# my Hermes settings\n"), "{config}");
    assert!(
        config.contains("# the good one") && config.contains("  - other-plugin\n  - recall\n"),
        "{config}"
    );
    assert_eq!(
        std::fs::read_to_string(home.join("config.yaml.recall-backup")).unwrap(),
        CONFIG
    );

    // No server answers at that URL: the tool runs the binary. Hermes has
    // written a message since install indexed: the agent is told.
    home.session(EXPECTED)
        .message("user", "and the nginx fix still holds");
    let seen = hermes_sees(&home);
    assert_tool_answers(&seen, "recall binary");
    let note = seen["result"]["index_note"].as_str().unwrap_or_default();
    assert!(
        note.starts_with("the index lacks 1 messages Hermes wrote since ")
            && note.contains("recall index"),
        "{seen}"
    );

    // A second install changes nothing.
    let plugin = home.join("plugins/recall");
    let (files, config_before) = (
        snapshot(&plugin),
        std::fs::read(home.join("config.yaml")).unwrap(),
    );
    let out = install(
        &home,
        &["--no-hermes-command", "--server", "http://127.0.0.1:9"],
    );
    assert!(out.contains("already installed"), "{out}");
    assert_eq!(snapshot(&plugin), files);
    assert_eq!(
        std::fs::read(home.join("config.yaml")).unwrap(),
        config_before
    );

    let out = uninstall(&home);
    assert!(out.contains("back as it was"), "{out}");
    assert_eq!(
        std::fs::read_to_string(home.join("config.yaml")).unwrap(),
        CONFIG
    );
    assert!(!plugin.exists() && !home.join("config.yaml.recall-backup").exists());
    let seen = hermes_sees(&home);
    assert_eq!(seen["registered"], false, "{seen}");
    assert_eq!(seen["offered"], false);
}

/// A config.yaml holding secrets stays private through install and
/// uninstall (its backup too); one recall cannot read as text is never
/// edited or replaced; a backup that uninstall cannot put back is kept.
#[test]
fn config_yaml_is_never_exposed_destroyed_or_lost() {
    require!(hermes_python());
    require!(minilm_dir());
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let no_hermes = ["--no-hermes-command", "--server", "http://127.0.0.1:9"];
    let (_tmp, home) = history();
    let config = home.join("config.yaml");
    let secret = format!("{CONFIG}api_key: sk-SECRET\n");
    std::fs::write(&config, &secret).unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    install(&home, &no_hermes);
    assert_eq!(mode(&config), 0o600);
    assert_eq!(mode(&home.join("config.yaml.recall-backup")), 0o600);
    uninstall(&home);
    assert_eq!(std::fs::read_to_string(&config).unwrap(), secret);
    assert_eq!(mode(&config), 0o600);

    // Not UTF-8: refused, naming the file, and left byte for byte.
    let latin1 = b"# r\xe9glages\nplugins:\n  enabled:\n  - other-plugin\n".to_vec();
    std::fs::write(&config, &latin1).unwrap();
    let Output { code, stderr, .. } = install_without_hermes(&home);
    assert!(
        code != 0 && stderr.contains("config.yaml is not UTF-8"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&config).unwrap(), latin1);
    assert!(!home.join("config.yaml.recall-backup").exists());

    // Edited since install: recall is taken out, and the backup stays.
    std::fs::write(&config, CONFIG).unwrap();
    install(&home, &no_hermes);
    let edited = std::fs::read_to_string(&config).unwrap() + "display:\n  skin: dark\n";
    std::fs::write(&config, &edited).unwrap();
    let out = uninstall(&home);
    assert!(out.contains("is kept at"), "{out}");
    assert_eq!(
        std::fs::read_to_string(home.join("config.yaml.recall-backup")).unwrap(),
        CONFIG
    );
    assert!(
        !std::fs::read_to_string(&config)
            .unwrap()
            .contains("- recall")
    );
}

/// Without the `hermes` command, install's edit keeps a byte-order mark and
/// CRLF line endings (uninstall gives back the same bytes, and Hermes reads
/// the edited file), and refuses YAML it would not keep, touching nothing.
#[test]
fn config_yaml_edit_keeps_its_bytes_or_refuses() {
    require!(hermes_python());
    require!(minilm_dir());
    let no_hermes = ["--no-hermes-command", "--server", "http://127.0.0.1:9"];
    let (_tmp, home) = history();
    let config = home.join("config.yaml");
    let windows = format!("\u{feff}{}", CONFIG.replace('\n', "\r\n"));
    std::fs::write(&config, &windows).unwrap();
    install(&home, &no_hermes);
    let edited = std::fs::read_to_string(&config).unwrap();
    assert!(
        edited.starts_with('\u{feff}') && edited.contains("  - other-plugin\r\n  - recall\r\n"),
        "{edited:?}"
    );
    assert_eq!(
        edited.replace("\r\n", "").matches('\n').count(),
        0,
        "{edited:?}"
    );
    assert_tool_answers(&hermes_sees(&home), "recall binary");
    uninstall(&home);
    assert_eq!(std::fs::read_to_string(&config).unwrap(), windows);

    let flow = "plugins:\n  enabled: [alpha,\n    beta]\n";
    std::fs::write(&config, flow).unwrap();
    let Output { code, stderr, .. } = install_without_hermes(&home);
    assert!(
        code != 0 && stderr.contains("plugins.enabled by hand"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&config).unwrap(), flow);
    assert!(!home.join("config.yaml.recall-backup").exists());
}

#[test]
fn install_with_the_hermes_command_and_a_running_server() {
    let python = require!(hermes_python());
    require!(minilm_dir());
    let (_tmp, home) = history();
    let hermes = python.with_file_name("hermes");
    assert!(
        hermes.is_file(),
        "no hermes command at {}",
        hermes.display()
    );
    install(
        &home,
        &["--hermes-bin", hermes.to_str().unwrap(), "--no-index"],
    );
    assert!(
        std::fs::read_to_string(home.join("config.yaml"))
            .unwrap()
            .contains("- recall"),
        "hermes plugins enable did not list recall"
    );

    // `recall serve` on a free port: the plugin's fast path.
    let server = Server::start(
        &minilm(),
        &["--watch", "--hermes-home", home.to_str().unwrap()],
    );
    let url = server.base.clone();
    install(
        &home,
        &["--hermes-bin", hermes.to_str().unwrap(), "--server", &url],
    );
    let seen = hermes_sees(&home);
    // The watcher may still be indexing the history when the first search comes.
    let seen = if seen["result"]["results"]
        .as_array()
        .is_some_and(|r| r.is_empty())
    {
        std::thread::sleep(std::time::Duration::from_secs(2));
        hermes_sees(&home)
    } else {
        seen
    };
    assert_tool_answers(&seen, "recall serve");

    let status = recall()
        .args(["hermes", "status"])
        .hermes_home(&home)
        .output()
        .assert_ok()
        .stdout;
    assert!(status.contains("enabled:  yes"), "{status}");
    assert!(status.contains("watcher running"), "{status}");
    assert!(status.contains("watcher:  running"), "{status}");
    assert!(status.contains("(0 messages not indexed yet)"), "{status}");
    drop(server);

    uninstall(&home);
    assert_eq!(
        std::fs::read_to_string(home.join("config.yaml")).unwrap(),
        CONFIG
    );
    let out = recall()
        .args(["hermes", "status"])
        .hermes_home(&home)
        .output();
    assert!(
        out.success() && out.stdout.contains("not installed"),
        "{}",
        out.stdout
    );
}

/// `recall ARGS` with service files under CONFIG_HOME and PATH as given.
fn with_service_files(config_home: &Path, path: &str, args: &[&str]) -> Output {
    recall()
        .args(args)
        .env("XDG_CONFIG_HOME", config_home)
        .env("PATH", path)
        .output()
}

/// `recall hermes install --service` of the history at HOME with MODEL, not indexing.
fn service_install<'a>(home: &'a str, model: &'a str) -> [&'a str; 9] {
    [
        "hermes",
        "install",
        "--no-index",
        "--no-hermes-command",
        "--service",
        "--hermes-home",
        home,
        "--model",
        model,
    ]
}

/// `recall hermes ARGS` with service files under CONFIG_HOME and no
/// `systemctl`/`launchctl` on PATH; it must succeed. Its standard output.
fn hermes_with_service(config_home: &Path, args: &[&str]) -> String {
    let args = [&["hermes"][..], args].concat();
    with_service_files(config_home, "/nonexistent", &args)
        .assert_ok()
        .stdout
}

#[test]
fn service_file_runs_serve_with_watch() {
    require!(hermes_python());
    require!(minilm_dir());
    let (tmp, home) = history();
    let config_home = tmp.path().join("xdg");
    let model = minilm();
    let (home_s, model_s) = (home.to_str().unwrap(), model.to_str().unwrap());
    let out = hermes_with_service(&config_home, &service_install(home_s, model_s)[1..]);
    let unit = config_home.join("systemd/user/recall-watch.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    assert!(
        text.contains(" \"serve\" \"--watch\" \"--hermes-home\" "),
        "{text}"
    );
    assert!(text.contains("\"--model\" "), "{text}");
    assert!(out.contains("systemctl --user"), "{out}");
    let out = hermes_with_service(&config_home, &["uninstall", "--hermes-home", home_s]);
    assert!(!unit.exists());
    assert!(
        out.contains(&format!(
            "removed the background service ({})",
            unit.display()
        )),
        "{out}"
    );
}

/// Where `systemctl --user` cannot reach a user bus (containers, WSL, some
/// servers), install says the service did not start, why, and the command
/// line that runs it in the background; `hermes status` says "installed,
/// not running" and `doctor` warns.
#[test]
fn a_service_that_cannot_start_says_so() {
    require!(hermes_python());
    require!(minilm_dir());
    use std::os::unix::fs::PermissionsExt;
    let (tmp, home) = history();
    let config_home = tmp.path().join("xdg");
    let bin = tmp.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let systemctl = bin.join("systemctl");
    std::fs::write(
        &systemctl,
        "#!/bin/sh\necho 'Failed to connect to bus: No medium found' >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&systemctl, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let model = minilm();
    let (home_s, model_s) = (home.to_str().unwrap(), model.to_str().unwrap());
    let recall = |args: &[&str]| with_service_files(&config_home, &path, args).stdout;
    let out = recall(&service_install(home_s, model_s));
    assert!(
        out.contains("not started: Failed to connect to bus: No medium found"),
        "{out}"
    );
    assert!(
        out.contains("nohup ") && out.contains(" serve --watch "),
        "{out}"
    );
    assert!(!out.contains("(the service does)"), "{out}");
    let status = recall(&["hermes", "status", "--hermes-home", home_s]);
    assert!(
        status.contains("service:  installed, not running: Failed to connect to bus"),
        "{status}"
    );
    let doctor = recall(&["doctor", "--hermes-home", home_s, "--model", model_s]);
    assert!(
        doctor.contains("warn  service: installed") && doctor.contains("not running"),
        "{doctor}"
    );
}

/// What install was told about the engine (`--dtype q8`) reaches the
/// plugin's fallback and the service: both then use the q8 index install
/// built, instead of refusing it as another model.
#[test]
fn q8_reaches_the_plugin_and_the_service() {
    require!(hermes_python());
    require!(minilm_dir());
    let (tmp, home) = history();
    let config_home = tmp.path().join("xdg");
    let model = minilm();
    let (home_s, model_s) = (home.to_str().unwrap(), model.to_str().unwrap());
    hermes_with_service(
        &config_home,
        &[
            "install",
            "--no-hermes-command",
            "--service",
            "--server",
            "http://127.0.0.1:9",
            "--dtype",
            "q8",
            "--hermes-home",
            home_s,
            "--model",
            model_s,
        ],
    );
    let settings: Value = serde_json::from_str(
        &std::fs::read_to_string(home.join("plugins/recall/recall.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(settings["dtype"], "q8", "{settings}");
    let unit = config_home.join("systemd/user/recall-watch.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    assert!(text.contains("\"--dtype\" \"q8\""), "{text}");
    // The tool, through the binary, searches the q8 index install built.
    assert_tool_answers(&hermes_sees(&home), "recall binary");
    let out = hermes_with_service(&config_home, &["uninstall", "--hermes-home", home_s]);
    assert!(!unit.exists());
    assert!(
        out.contains(&format!(
            "removed the background service ({})",
            unit.display()
        )),
        "{out}"
    );
}
