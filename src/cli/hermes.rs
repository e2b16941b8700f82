//! `recall hermes install|uninstall|status`.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use recall::hermes_plugin::{self, PluginSettings};
use recall::serve::DEFAULT_PORT;

use super::ModelArgs;
use super::index::{ChunkArgs, HermesArgs, index_with};

#[derive(Subcommand)]
pub enum HermesCommand {
    /// Copy the plugin into $HERMES_HOME/plugins/recall, enable it, and index the history once.
    Install(Box<InstallArgs>),
    /// Disable and remove the plugin (and the service, if installed), leaving config.yaml as it was.
    Uninstall(UninstallArgs),
    /// Is the plugin installed and enabled, is recall serve (the watcher) running, how far behind is the index.
    Status(UninstallArgs),
}

#[derive(Args)]
pub struct InstallArgs {
    #[command(flatten)]
    hermes: HermesArgs,
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
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
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
    if args.service {
        install_service(&settings)?;
    }
    if !args.no_index {
        index_with(
            &args.hermes,
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
        if args.service {
            " (the service does)"
        } else {
            " (or install with --service)"
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

fn status(args: UninstallArgs) -> Result<()> {
    let home = args.home()?;
    let profile_home = hermes_plugin::profile_home(&home, &args.profile);
    let (present, current, enabled) = hermes_plugin::installed(&profile_home);
    let settings = hermes_plugin::read_settings(&profile_home);
    println!(
        "plugin:   {}",
        match (present, current) {
            (false, _) => "not installed (run `recall hermes install`)".to_string(),
            (true, true) => format!(
                "installed in {}",
                hermes_plugin::plugin_dir(&profile_home).display()
            ),
            (true, false) =>
                "installed, from another recall version (run `recall hermes install` again)".into(),
        }
    );
    println!("enabled:  {}", if enabled { "yes" } else { "no" });
    let server = settings
        .as_ref()
        .map(|s| s.server.clone())
        .unwrap_or_else(|| format!("http://127.0.0.1:{DEFAULT_PORT}"));
    let info = ureq::get(&format!("{server}/info"))
        .config()
        .timeout_global(Some(std::time::Duration::from_secs(2)))
        .build()
        .call()
        .ok()
        .and_then(|mut r| r.body_mut().read_json::<serde_json::Value>().ok());
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
            println!("server:   {server} is not answering (searches run the recall binary: slower)")
        }
    }
    let hermes = HermesArgs::for_home(&home, &args.profile);
    let index = hermes.index_path()?;
    if index.is_file() {
        let store = recall::index::store::Store::open_existing(&index)?;
        let lag = recall::index::lag(&store, &hermes.profiles()?, &hermes.selection()?)?;
        println!(
            "index:    {} ({lag} messages not indexed yet)",
            index.display()
        );
    } else {
        println!(
            "index:    none yet at {} (run `recall index`)",
            index.display()
        );
    }
    println!(
        "watcher:  {}",
        if recall::watch::is_watched(&index) {
            "running (recall watch or recall serve --watch)"
        } else {
            "not running: new messages are indexed after each turn only (start `recall serve --watch`)"
        }
    );
    if let Some(path) = service_path() {
        println!(
            "service:  {}",
            if path.is_file() {
                format!("installed ({})", path.display())
            } else {
                "not installed".into()
            }
        );
    }
    Ok(())
}

// ---- the background service ---------------------------------------------

fn service_path() -> Option<PathBuf> {
    if cfg!(target_os = "macos") {
        std::env::var_os("HOME")
            .map(|h| PathBuf::from(h).join("Library/LaunchAgents/ai.recall.watch.plist"))
    } else {
        std::env::var_os("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
            .map(|c| c.join("systemd/user/recall-watch.service"))
    }
}

fn serve_command(s: &PluginSettings) -> Vec<String> {
    let mut cmd = vec![
        s.binary.display().to_string(),
        "serve".into(),
        "--watch".into(),
        "--hermes-home".into(),
        s.hermes_home.display().to_string(),
    ];
    if s.profile != "default" {
        cmd.extend(["--profile".into(), s.profile.clone()]);
    }
    if let Some(port) = s
        .server
        .rsplit(':')
        .next()
        .filter(|p| p.parse::<u16>().is_ok())
    {
        cmd.extend(["--port".into(), port.to_string()]);
    }
    if let Some(model) = &s.model {
        cmd.extend(["--model".into(), model.display().to_string()]);
    }
    cmd
}

/// The unit (or plist) text that runs `recall serve --watch`.
fn service_text(s: &PluginSettings) -> String {
    let cmd = serve_command(s);
    if cfg!(target_os = "macos") {
        let args: String = cmd
            .iter()
            .map(|a| format!("    <string>{a}</string>\n"))
            .collect();
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
             <!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n\
             <plist version=\"1.0\">\n<dict>\n  <key>Label</key>\n  <string>ai.recall.watch</string>\n\
             \x20 <key>ProgramArguments</key>\n  <array>\n{args}  </array>\n\
             \x20 <key>RunAtLoad</key>\n  <true/>\n  <key>KeepAlive</key>\n  <true/>\n</dict>\n</plist>\n"
        )
    } else {
        let quoted: Vec<String> = cmd
            .iter()
            .map(|a| {
                if a.contains(' ') {
                    format!("\"{a}\"")
                } else {
                    a.clone()
                }
            })
            .collect();
        format!(
            "[Unit]\nDescription=recall: local semantic memory for Hermes (embedding server + indexer)\n\n\
             [Service]\nExecStart={}\nRestart=on-failure\nRestartSec=5\n\n\
             [Install]\nWantedBy=default.target\n",
            quoted.join(" ")
        )
    }
}

fn install_service(settings: &PluginSettings) -> Result<()> {
    let Some(path) = service_path() else {
        bail!("cannot tell where the service file goes: HOME is not set");
    };
    std::fs::create_dir_all(path.parent().unwrap())?;
    std::fs::write(&path, service_text(settings))?;
    println!("wrote {}", path.display());
    let started = if cfg!(target_os = "macos") {
        run_quietly("launchctl", &["load", "-w", &path.display().to_string()])
    } else {
        run_quietly("systemctl", &["--user", "daemon-reload"])
            && run_quietly(
                "systemctl",
                &["--user", "enable", "--now", "recall-watch.service"],
            )
    };
    if started {
        println!("started the service");
    } else if cfg!(target_os = "macos") {
        println!("start it with: launchctl load -w {}", path.display());
    } else {
        println!(
            "start it with: systemctl --user daemon-reload && systemctl --user enable --now recall-watch.service"
        );
    }
    Ok(())
}

fn uninstall_service() -> Result<()> {
    let Some(path) = service_path().filter(|p| p.is_file()) else {
        return Ok(());
    };
    if cfg!(target_os = "macos") {
        run_quietly("launchctl", &["unload", &path.display().to_string()]);
    } else {
        run_quietly(
            "systemctl",
            &["--user", "disable", "--now", "recall-watch.service"],
        );
    }
    std::fs::remove_file(&path)?;
    println!("removed {}", path.display());
    Ok(())
}

fn run_quietly(program: &str, args: &[&str]) -> bool {
    find_on_path(program).is_some()
        && std::process::Command::new(program)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .is_ok_and(|o| o.status.success())
}
