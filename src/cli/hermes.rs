//! `recall hermes install|uninstall|status`.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use recall::hermes_plugin::{self, PluginSettings};
use recall::serve::DEFAULT_PORT;

use super::ModelArgs;
use super::index::{ChunkArgs, HermesArgs, RoleArgs, index_with};

#[derive(Subcommand)]
pub enum HermesCommand {
    /// Copy the plugin into $HERMES_HOME/plugins/recall, enable it, and index the history once.
    #[command(
        after_help = "Examples:\n  recall hermes install\n  recall hermes install --service --dtype q8\n  recall hermes install --profile work --provider local,ollama"
    )]
    Install(Box<InstallArgs>),
    /// Disable and remove the plugin (and the service, if installed), leaving config.yaml as it was.
    #[command(
        after_help = "Examples:\n  recall hermes uninstall\n  recall hermes uninstall --profile work"
    )]
    Uninstall(UninstallArgs),
    /// Is the plugin installed and enabled, is recall serve (the watcher) running, how far behind is the index.
    #[command(after_help = "Examples:\n  recall hermes status\n  recall hermes status --json")]
    Status(StatusArgs),
}

#[derive(Args)]
pub struct InstallArgs {
    #[command(flatten)]
    hermes: HermesArgs,
    #[command(flatten)]
    roles: RoleArgs,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    providers: super::ProviderArgs,
    #[command(flatten)]
    chunk: ChunkArgs,
    /// The `recall serve` the plugin asks first.
    #[arg(long, default_value_t = format!("http://127.0.0.1:{DEFAULT_PORT}"), value_name = "URL")]
    server: String,
    /// The Hermes command used to enable the plugin. Default: `hermes` on PATH; without one,
    /// recall edits plugins.enabled in config.yaml itself (keeping comments, with a backup).
    #[arg(long, value_name = "PATH")]
    hermes_bin: Option<PathBuf>,
    /// Edit config.yaml even when the `hermes` command is there.
    #[arg(long, conflicts_with = "hermes_bin")]
    no_hermes_command: bool,
    /// Skip the first index.
    #[arg(long)]
    no_index: bool,
    /// Also install a background service running `recall serve --watch`
    /// (a systemd user unit on Linux, a launchd agent on macOS).
    #[arg(long)]
    service: bool,
}

#[derive(Args)]
pub struct UninstallArgs {
    /// Hermes home directory. Default: $HERMES_HOME, else ~/.hermes.
    #[arg(long, value_name = "DIR")]
    hermes_home: Option<PathBuf>,
    /// The Hermes profile (default: the default one).
    #[arg(long, value_name = "NAME", default_value = "default")]
    profile: String,
}

#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    target: UninstallArgs,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

impl UninstallArgs {
    fn home(&self) -> Result<PathBuf> {
        match &self.hermes_home {
            Some(h) => Ok(h.clone()),
            None => recall::source::hermes::default_home().ok_or_else(|| {
                anyhow::anyhow!("cannot find Hermes: set HERMES_HOME or pass --hermes-home")
            }),
        }
    }
}

pub fn run(cmd: HermesCommand) -> Result<()> {
    match cmd {
        HermesCommand::Install(args) => install(*args),
        HermesCommand::Uninstall(args) => uninstall(args),
        HermesCommand::Status(args) => status(args),
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    recall::env::path_dirs()
        .into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn install(args: InstallArgs) -> Result<()> {
    if args.hermes.all_profiles() {
        bail!("install into one profile at a time: --profile NAME");
    }
    let home = args.hermes.home()?;
    let profile = args
        .hermes
        .profile_name()
        .unwrap_or_else(|| "default".into());
    let profile_home = hermes_plugin::profile_home(&home, &profile);
    let binary = std::env::current_exe()?;
    let settings = PluginSettings {
        binary: binary.canonicalize().unwrap_or(binary),
        server: args.server.trim_end_matches('/').to_string(),
        hermes_home: home.canonicalize().unwrap_or(home.clone()),
        profile: profile.clone(),
        model: args.model.named_dir(),
        dtype: (args.model.dtype() != recall::Dtype::F32).then(|| args.model.dtype().to_string()),
        providers: args.providers.named().to_vec(),
        config: args.providers.config_file(),
    };
    let hermes_bin = if args.no_hermes_command {
        None
    } else {
        args.hermes_bin.clone().or_else(|| find_on_path("hermes"))
    };
    let report = hermes_plugin::install(&profile_home, &settings, hermes_bin.as_deref())?;
    if report.files_written.is_empty() && report.enabled_by.is_none() {
        println!(
            "the recall plugin is already installed and enabled in {}",
            report.plugin_dir.display()
        );
    } else {
        println!(
            "installed the recall plugin in {}",
            report.plugin_dir.display()
        );
        match &report.enabled_by {
            Some(by) if by == "hermes" => {
                println!("enabled it with `hermes plugins enable recall`")
            }
            Some(_) => println!(
                "enabled it in {}",
                profile_home.join("config.yaml").display()
            ),
            None => {}
        }
        if let Some(backup) = &report.backup {
            println!("the previous config.yaml is kept as {}", backup.display());
        }
    }
    let mut service_running = false;
    if args.service {
        // Without recall's own engine in the chain there is no model to
        // serve: the service then only indexes, through the chain.
        let config = args.providers.config()?;
        let local = config.chain.iter().any(|name| {
            config
                .provider(name)
                .is_ok_and(|p| p.kind == Some(recall::provider::Kind::Local))
        });
        service_running = install_service(&settings, local)?;
    }
    if !args.no_index {
        index_with(
            &args.hermes,
            &args.roles,
            &args.model,
            &args.providers,
            &args.chunk,
            false,
            false,
        )?;
    }
    println!(
        "Hermes now has the semantic_session_search tool. For millisecond searches and \
         real-time indexing, keep `recall serve --watch` running{}.",
        match (args.service, service_running) {
            (true, true) => " (the service does)",
            (true, false) => " (the service does once it runs: see above)",
            (false, _) => " (or install with --service)",
        }
    );
    Ok(())
}

fn uninstall(args: UninstallArgs) -> Result<()> {
    let profile_home = hermes_plugin::profile_home(&args.home()?, &args.profile);
    let report = hermes_plugin::uninstall(&profile_home)?;
    match report.config.as_deref() {
        Some("restored") => println!("config.yaml is back as it was before install"),
        Some(_) => println!(
            "removed recall from plugins.enabled in config.yaml (the file had changed since install)"
        ),
        None => {}
    }
    if let Some(backup) = &report.kept_backup {
        println!(
            "config.yaml as it was before install is kept at {} (remove it when you no longer need it)",
            backup.display()
        );
    }
    if report.removed_plugin {
        println!(
            "removed {}",
            hermes_plugin::plugin_dir(&profile_home).display()
        );
    } else {
        println!(
            "the recall plugin was not installed in {}",
            profile_home.display()
        );
    }
    uninstall_service()?;
    Ok(())
}

/// Prints the plugin's, the server's, the index's, the watcher's and the
/// service's state, as text or as one JSON object.
fn status(args: StatusArgs) -> Result<()> {
    let status = Status::gather(&args.target)?;
    if args.json {
        status.print_json();
    } else {
        status.print_text();
    }
    Ok(())
}

/// What `recall hermes status` reports on a profile, all gathered before any is printed.
struct Status {
    profile_home: PathBuf,
    plugin: hermes_plugin::Installed,
    settings: Option<PluginSettings>,
    /// The server the plugin asks (its settings', else the default port's).
    server: String,
    /// The server's `/info`, when it answered.
    info: Option<serde_json::Value>,
    index: PathBuf,
    /// Messages not indexed yet; `None` when there is no index.
    lag: Option<usize>,
    /// A watcher (`recall watch` or `recall serve --watch`) follows the index.
    watched: bool,
    /// The service's file, where this system has a service manager recall knows.
    service: Option<PathBuf>,
}

impl Status {
    fn gather(target: &UninstallArgs) -> Result<Self> {
        let home = target.home()?;
        let profile = &target.profile;
        let profile_home = hermes_plugin::profile_home(&home, profile);
        let plugin = hermes_plugin::installed(&profile_home);
        let settings = hermes_plugin::read_settings(&profile_home);
        let server = settings
            .as_ref()
            .map(|s| s.server.clone())
            .unwrap_or_else(|| format!("http://127.0.0.1:{DEFAULT_PORT}"));
        let info = server_info(&server);
        let hermes = HermesArgs::for_home(&home, profile);
        let index = hermes.index_path()?;
        let lag = index_lag(&hermes, &index)?;
        let watched = recall::watch::is_watched(&index);
        let service = service_path();
        Ok(Self {
            profile_home,
            plugin,
            settings,
            server,
            info,
            index,
            lag,
            watched,
            service,
        })
    }

    /// Prints the status as one JSON object.
    fn print_json(&self) {
        let Self {
            profile_home,
            plugin:
                hermes_plugin::Installed {
                    present,
                    current,
                    enabled,
                },
            settings,
            server,
            info,
            index,
            lag,
            watched,
            service,
        } = self;
        println!(
            "{}",
            serde_json::json!({
                "plugin": {
                    "dir": hermes_plugin::plugin_dir(profile_home),
                    "installed": present, "current": current, "enabled": enabled,
                    "settings": settings,
                },
                "server": {
                    "url": server, "up": info.is_some(),
                    "model_id": info.as_ref().map(|i| i["model_id"].clone()),
                    "watching": info.as_ref().map(|i| i["watching"] == true),
                },
                "index": {"path": index, "exists": lag.is_some(), "lag_messages": lag},
                "watcher_running": watched,
                "service": service.as_ref().map(|p| {
                    let state = service_state(p);
                    serde_json::json!({
                        "path": p,
                        "installed": p.is_file(),
                        "running": matches!(state, ServiceState::Running),
                        "not_running_because": match state {
                            ServiceState::NotRunning(why) => Some(why),
                            _ => None,
                        },
                    })
                }),
            })
        );
    }

    /// Prints the status as one line per part, each saying what to do when it is off.
    fn print_text(self) {
        let Self {
            profile_home,
            plugin:
                hermes_plugin::Installed {
                    present,
                    current,
                    enabled,
                },
            settings: _,
            server,
            info,
            index,
            lag,
            watched,
            service,
        } = self;
        println!(
            "plugin:   {}",
            match (present, current) {
                (false, _) => "not installed (run `recall hermes install`)".to_string(),
                (true, true) => format!(
                    "installed in {}",
                    hermes_plugin::plugin_dir(&profile_home).display()
                ),
                (true, false) =>
                    "installed, from another recall version (run `recall hermes install` again)"
                        .into(),
            }
        );
        println!("enabled:  {}", if enabled { "yes" } else { "no" });
        match info {
            Some(info) => println!(
                "server:   {server} is up ({}), watcher {}",
                info["model_id"].as_str().unwrap_or("?"),
                if info["watching"] == true {
                    "running"
                } else {
                    "off (start it with --watch)"
                }
            ),
            None => {
                println!(
                    "server:   {server} is not answering (searches run the recall binary: slower)"
                )
            }
        }
        match lag {
            Some(lag) => println!(
                "index:    {} ({lag} messages not indexed yet)",
                index.display()
            ),
            None => println!(
                "index:    none yet at {} (run `recall index`)",
                index.display()
            ),
        }
        println!(
            "watcher:  {}",
            if watched {
                "running (recall watch or recall serve --watch)"
            } else {
                "not running: new messages are indexed after each turn only (start `recall serve --watch`)"
            }
        );
        if let Some(path) = service {
            println!(
                "service:  {}",
                match service_state(&path) {
                    ServiceState::NotInstalled => "not installed".into(),
                    ServiceState::Running => format!("installed and running ({})", path.display()),
                    ServiceState::NotRunning(why) =>
                        format!("installed, not running: {why} ({})", path.display()),
                }
            );
        }
    }
}

/// The `/info` of the recall server at `server`, if it answers within 2 s.
fn server_info(server: &str) -> Option<serde_json::Value> {
    ureq::get(&format!("{server}/info"))
        .config()
        .timeout_global(Some(std::time::Duration::from_secs(2)))
        .build()
        .call()
        .ok()
        .and_then(|mut r| r.body_mut().read_json::<serde_json::Value>().ok())
}

/// How many of the profile's messages `index` has not indexed yet; `None`
/// when there is no index there.
fn index_lag(hermes: &HermesArgs, index: &std::path::Path) -> Result<Option<usize>> {
    Ok(if index.is_file() {
        let store = recall::index::store::Store::open_existing(index)?;
        Some(recall::index::lag(
            &store,
            &hermes.profiles()?,
            &recall::source::hermes::Selection::default(),
        )?)
    } else {
        None
    })
}

// ---- the background service ---------------------------------------------

fn service_path() -> Option<PathBuf> {
    if cfg!(target_os = "macos") {
        recall::paths::home_dir().map(|h| h.join("Library/LaunchAgents/ai.recall.watch.plist"))
    } else {
        recall::env::config_home().map(|c| c.join("systemd/user/recall-watch.service"))
    }
}

/// The service's command line: `recall serve --watch` (the model warm for
/// the plugin, indexing as Hermes writes), or `recall watch` when the chain
/// has no local engine to serve.
fn service_command(s: &PluginSettings, serve: bool) -> Vec<String> {
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

/// Where a service file is read.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ServiceFormat {
    Systemd,
    Launchd,
}

impl ServiceFormat {
    fn here() -> Self {
        if cfg!(target_os = "macos") {
            ServiceFormat::Launchd
        } else {
            ServiceFormat::Systemd
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
fn service_text(s: &PluginSettings, serve: bool, format: ServiceFormat) -> String {
    let cmd = service_command(s, serve);
    match format {
        ServiceFormat::Launchd => {
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
        ServiceFormat::Systemd => format!(
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

/// Writes the service file and starts it; whether it runs. Where the
/// service manager cannot start it, says why and how to run the same
/// command in the background instead.
fn install_service(settings: &PluginSettings, serve: bool) -> Result<bool> {
    let Some(path) = service_path() else {
        bail!("cannot tell where the service file goes: HOME is not set");
    };
    std::fs::create_dir_all(path.parent().unwrap())?;
    std::fs::write(&path, service_text(settings, serve, ServiceFormat::here()))?;
    println!("wrote {}", path.display());
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
    let why = match started.and_then(|()| match service_state(&path) {
        ServiceState::Running => Ok(()),
        ServiceState::NotRunning(why) => Err(why),
        ServiceState::NotInstalled => Err("its file is gone".into()),
    }) {
        Ok(()) => {
            println!("started the service");
            return Ok(true);
        }
        Err(why) => why,
    };
    let manager = if cfg!(target_os = "macos") {
        format!("launchctl load -w {}", path.display())
    } else {
        "systemctl --user daemon-reload && systemctl --user enable --now recall-watch.service"
            .into()
    };
    let log = settings.hermes_home.join("recall").join("serve.log");
    let command: Vec<String> = service_command(settings, serve)
        .iter()
        .map(|a| shell_quote(a))
        .collect();
    println!("the service is installed but not started: {why}");
    println!("  start it with: {manager}");
    println!(
        "  or, where no service manager runs (a container, WSL), in the background:\n  nohup {} >> {} 2>&1 &",
        command.join(" "),
        shell_quote(&log.display().to_string())
    );
    Ok(false)
}

/// Whether the service is installed and running, as its manager says.
pub(super) enum ServiceState {
    NotInstalled,
    Running,
    /// Installed, not running: why, in the manager's words.
    NotRunning(String),
}

/// The state of the service whose file is `path`.
pub(super) fn service_state(path: &std::path::Path) -> ServiceState {
    if !path.is_file() {
        return ServiceState::NotInstalled;
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
        Ok(()) => ServiceState::Running,
        Err(why) => ServiceState::NotRunning(why),
    }
}

/// The path of the service file, for `doctor`.
pub(super) fn installed_service() -> Option<PathBuf> {
    service_path().filter(|p| p.is_file())
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

fn uninstall_service() -> Result<()> {
    let Some(path) = service_path().filter(|p| p.is_file()) else {
        return Ok(());
    };
    let stopped = if cfg!(target_os = "macos") {
        run_quietly("launchctl", &["unload", &path.display().to_string()])
    } else {
        run_quietly(
            "systemctl",
            &["--user", "disable", "--now", "recall-watch.service"],
        )
    };
    std::fs::remove_file(&path)?;
    println!(
        "{} the background service ({})",
        if stopped {
            "stopped and removed"
        } else {
            "removed"
        },
        path.display()
    );
    Ok(())
}

fn run_quietly(program: &str, args: &[&str]) -> bool {
    run_tool(program, args).is_ok()
}

/// Runs `program`, its output captured; on failure, why: the last line it
/// wrote, or its exit status, or that it is not on PATH.
fn run_tool(program: &str, args: &[&str]) -> Result<(), String> {
    if find_on_path(program).is_none() {
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
        let text = service_text(&s, true, ServiceFormat::Systemd);
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .unwrap();
        let words = systemd_words(line);
        assert_eq!(words, service_command(&s, true), "{text}");
        assert!(words.contains(&"--dtype".to_string()) && words.contains(&"q8".to_string()));
        assert!(text.contains("embedding server"));
    }

    #[test]
    fn launchd_plist_escapes_xml() {
        let s = settings(ODD);
        let text = service_text(&s, true, ServiceFormat::Launchd);
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
        assert_eq!(args, service_command(&s, true));
        for raw in ["<h>", "&g<", "d\"e"] {
            assert!(!text.contains(raw), "{raw} unescaped in {text}");
        }
    }

    #[test]
    fn without_a_local_engine_the_service_only_indexes() {
        let s = settings("x");
        let serve = service_command(&s, true);
        assert_eq!(&serve[1..3], ["serve", "--watch"]);
        assert!(!serve.contains(&"--provider".to_string()), "{serve:?}");
        let watch = service_command(&s, false);
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
