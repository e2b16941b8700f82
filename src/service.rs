//! The background service `recall hermes install --service` sets up: a
//! systemd user unit on Linux, a launchd agent on macOS, running `recall
//! serve --watch` (or `recall watch`) for one Hermes profile. Writes,
//! starts, inspects and removes it; the CLI says what happened.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use crate::hermes_plugin::PluginSettings;

/// Where the service file goes: `~/Library/LaunchAgents` on macOS, the
/// systemd user directory under `$XDG_CONFIG_HOME` elsewhere.
pub fn path() -> Option<PathBuf> {
    if cfg!(target_os = "macos") {
        crate::paths::home_dir().map(|h| h.join("Library/LaunchAgents/ai.recall.watch.plist"))
    } else {
        crate::env::config_home().map(|c| c.join("systemd/user/recall-watch.service"))
    }
}

/// The path of the service file, when one is installed.
pub fn installed() -> Option<PathBuf> {
    path().filter(|p| p.is_file())
}

/// The service's command line: `recall serve --watch` (the model warm for
/// the plugin, indexing as Hermes writes), or `recall watch` when the chain
/// has no local engine to serve.
pub fn command(s: &PluginSettings, serve: bool) -> Vec<String> {
    let mut cmd = vec![s.binary.display().to_string()];
    if serve {
        cmd.extend(["serve".into(), "--watch".into()]);
    } else {
        cmd.push("watch".into());
    }
    cmd.extend(["--hermes-home".into(), s.hermes_home.display().to_string()]);
    if s.profile != "default" {
        cmd.extend(["--profile".into(), s.profile.clone()]);
    }
    if serve
        && let Some(port) = s
            .server
            .rsplit(':')
            .next()
            .filter(|p| p.parse::<u16>().is_ok())
    {
        cmd.extend(["--port".into(), port.to_string()]);
    }
    let engine = s.engine_args();
    if serve {
        // `serve` runs the local model only: the provider options are the index's.
        let mut it = engine.into_iter();
        while let Some(flag) = it.next() {
            let value = it.next().unwrap_or_default();
            if flag == "--model" || flag == "--dtype" {
                cmd.extend([flag, value]);
            }
        }
    } else {
        cmd.extend(engine);
    }
    cmd
}

/// Which service manager reads the file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Format {
    Systemd,
    Launchd,
}

impl Format {
    /// This system's.
    pub fn here() -> Self {
        if cfg!(target_os = "macos") {
            Format::Launchd
        } else {
            Format::Systemd
        }
    }
}

/// One argument of a systemd `ExecStart=`: double-quoted, with `\` and `"`
/// escaped as C-style sequences, `%` (specifiers) as `%%` and `$`
/// (variables) as `$$` (systemd.service(5), systemd.unit(5)).
fn systemd_quote(arg: &str) -> String {
    let mut out = String::with_capacity(arg.len() + 2);
    out.push('"');
    for c in arg.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '%' => out.push_str("%%"),
            '$' => out.push_str("$$"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Text for an XML element's content.
fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

/// The unit (or plist) text that runs the service.
pub fn text(s: &PluginSettings, serve: bool, format: Format) -> String {
    let cmd = command(s, serve);
    match format {
        Format::Launchd => {
            let args: String = cmd
                .iter()
                .map(|a| format!("    <string>{}</string>\n", xml_escape(a)))
                .collect();
            format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
                 <!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n\
                 <plist version=\"1.0\">\n<dict>\n  <key>Label</key>\n  <string>ai.recall.watch</string>\n\
                 \x20 <key>ProgramArguments</key>\n  <array>\n{args}  </array>\n\
                 \x20 <key>RunAtLoad</key>\n  <true/>\n  <key>KeepAlive</key>\n  <true/>\n</dict>\n</plist>\n"
            )
        }
        Format::Systemd => format!(
            "[Unit]\nDescription=recall: local semantic memory for Hermes ({})\n\n\
             [Service]\nExecStart={}\nRestart=on-failure\nRestartSec=5\n\n\
             [Install]\nWantedBy=default.target\n",
            if serve {
                "embedding server + indexer"
            } else {
                "indexer"
            },
            cmd.iter()
                .map(|a| systemd_quote(a))
                .collect::<Vec<_>>()
                .join(" ")
        ),
    }
}

/// Writes the service file for this system; its path.
pub fn write(settings: &PluginSettings, serve: bool) -> Result<PathBuf> {
    let Some(path) = path() else {
        bail!("cannot tell where the service file goes: HOME is not set");
    };
    std::fs::create_dir_all(path.parent().unwrap())?;
    std::fs::write(&path, text(settings, serve, Format::here()))?;
    Ok(path)
}

/// Asks the service manager to start the service whose file is `path`;
/// why it is not running, when it is not.
pub fn start(path: &Path) -> Result<(), String> {
    let started = if cfg!(target_os = "macos") {
        run_tool("launchctl", &["load", "-w", &path.display().to_string()])
    } else {
        run_tool("systemctl", &["--user", "daemon-reload"]).and_then(|()| {
            run_tool(
                "systemctl",
                &["--user", "enable", "--now", "recall-watch.service"],
            )
        })
    };
    started.and_then(|()| match state(path) {
        State::Running => Ok(()),
        State::NotRunning(why) => Err(why),
        State::NotInstalled => Err("its file is gone".into()),
    })
}

/// The command that starts the installed service by hand.
pub fn manager_command(path: &Path) -> String {
    if cfg!(target_os = "macos") {
        format!("launchctl load -w {}", path.display())
    } else {
        "systemctl --user daemon-reload && systemctl --user enable --now recall-watch.service"
            .into()
    }
}

/// The same command run in the background by a shell, for where no
/// service manager runs (a container, WSL), its output appended to `log`.
pub fn background_command(settings: &PluginSettings, serve: bool, log: &Path) -> String {
    let command: Vec<String> = command(settings, serve)
        .iter()
        .map(|a| shell_quote(a))
        .collect();
    format!(
        "nohup {} >> {} 2>&1 &",
        command.join(" "),
        shell_quote(&log.display().to_string())
    )
}

/// Whether the service is installed and running, as its manager says.
pub enum State {
    NotInstalled,
    Running,
    /// Installed, not running: why, in the manager's words.
    NotRunning(String),
}

/// The state of the service whose file is `path`.
pub fn state(path: &Path) -> State {
    if !path.is_file() {
        return State::NotInstalled;
    }
    let asked = if cfg!(target_os = "macos") {
        run_tool("launchctl", &["list", "ai.recall.watch"])
    } else {
        run_tool(
            "systemctl",
            &["--user", "is-active", "--quiet", "recall-watch.service"],
        )
        .map_err(|why| {
            if why.is_empty() || why.starts_with("exit status") {
                "systemctl --user says it is not active".into()
            } else {
                why
            }
        })
    };
    match asked {
        Ok(()) => State::Running,
        Err(why) => State::NotRunning(why),
    }
}

/// `arg` as one word of a POSIX shell command line.
fn shell_quote(arg: &str) -> String {
    if !arg.is_empty()
        && arg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:@,+".contains(&b))
    {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', "'\\''"))
    }
}

/// Stops the service and removes its file, where one is installed: its
/// path, and whether its manager stopped it.
pub fn remove() -> Result<Option<(PathBuf, bool)>> {
    let Some(path) = installed() else {
        return Ok(None);
    };
    let stopped = if cfg!(target_os = "macos") {
        run_tool("launchctl", &["unload", &path.display().to_string()]).is_ok()
    } else {
        run_tool(
            "systemctl",
            &["--user", "disable", "--now", "recall-watch.service"],
        )
        .is_ok()
    };
    std::fs::remove_file(&path)?;
    Ok(Some((path, stopped)))
}

/// Runs `program`, its output captured; on failure, why: the last line it
/// wrote, or its exit status, or that it is not on PATH.
fn run_tool(program: &str, args: &[&str]) -> Result<(), String> {
    if crate::paths::on_path(program).is_none() {
        return Err(format!("{program} is not on PATH"));
    }
    let out = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let said =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    Err(said
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .map_or_else(|| out.status.to_string(), str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(odd: &str) -> PluginSettings {
        PluginSettings {
            binary: PathBuf::from(format!("/opt/{odd}/recall")),
            server: "http://127.0.0.1:11435".into(),
            hermes_home: PathBuf::from(format!("/home/me/{odd}/.hermes")),
            profile: "default".into(),
            model: Some(PathBuf::from(format!("/models/{odd}"))),
            dtype: Some("q8".into()),
            providers: vec!["local".into(), "ollama".into()],
            config: None,
        }
    }

    /// Splits an `ExecStart=` line as systemd does: double-quoted words,
    /// C escapes, `%%` and `$$`.
    fn systemd_words(line: &str) -> Vec<String> {
        let mut words = Vec::new();
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if c == ' ' {
                continue;
            }
            assert_eq!(c, '"', "every word is quoted: {line}");
            let mut word = String::new();
            loop {
                match chars.next().expect("closing quote") {
                    '"' => break,
                    '\\' => match chars.next().unwrap() {
                        'n' => word.push('\n'),
                        c => word.push(c),
                    },
                    '%' => {
                        assert_eq!(chars.next(), Some('%'), "a lone % is a specifier");
                        word.push('%');
                    }
                    '$' => {
                        assert_eq!(chars.next(), Some('$'), "a lone $ is a variable");
                        word.push('$');
                    }
                    c => word.push(c),
                }
            }
            words.push(word);
        }
        words
    }

    const ODD: &str = "a b%c$d\"e\\f&g<h>i'j";

    #[test]
    fn systemd_unit_keeps_every_character_of_every_argument() {
        let s = settings(ODD);
        let text = text(&s, true, Format::Systemd);
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .unwrap();
        let words = systemd_words(line);
        assert_eq!(words, command(&s, true), "{text}");
        assert!(words.contains(&"--dtype".to_string()) && words.contains(&"q8".to_string()));
        assert!(text.contains("embedding server"));
    }

    #[test]
    fn launchd_plist_escapes_xml() {
        let s = settings(ODD);
        let text = text(&s, true, Format::Launchd);
        let args: Vec<String> = text
            .lines()
            .filter_map(|l| {
                l.trim()
                    .strip_prefix("<string>")
                    .and_then(|l| l.strip_suffix("</string>"))
            })
            .skip(1) // the label
            .map(|a| {
                a.replace("&lt;", "<")
                    .replace("&gt;", ">")
                    .replace("&quot;", "\"")
                    .replace("&apos;", "'")
                    .replace("&amp;", "&")
            })
            .collect();
        assert_eq!(args, command(&s, true));
        for raw in ["<h>", "&g<", "d\"e"] {
            assert!(!text.contains(raw), "{raw} unescaped in {text}");
        }
    }

    #[test]
    fn without_a_local_engine_the_service_only_indexes() {
        let s = settings("x");
        let serve = command(&s, true);
        assert_eq!(&serve[1..3], ["serve", "--watch"]);
        assert!(!serve.contains(&"--provider".to_string()), "{serve:?}");
        let watch = command(&s, false);
        assert_eq!(watch[1], "watch");
        assert!(!watch.contains(&"--port".to_string()));
        assert!(
            watch
                .windows(2)
                .any(|w| w == ["--provider", "local,ollama"]),
            "{watch:?}"
        );
        assert!(watch.windows(2).any(|w| w == ["--dtype", "q8"]));
    }
}
