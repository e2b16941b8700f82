//! `recall hermes install|uninstall|status`.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use recall::hermes_plugin::{self, PluginSettings};
use recall::serve::DEFAULT_PORT;
use recall::service;

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
        args.hermes_bin
            .clone()
            .or_else(|| recall::paths::on_path("hermes"))
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
        let service = service::path();
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
                    let state = service::state(p);
                    serde_json::json!({
                        "path": p,
                        "installed": p.is_file(),
                        "running": matches!(state, service::State::Running),
                        "not_running_because": match state {
                            service::State::NotRunning(why) => Some(why),
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
                match service::state(&path) {
                    service::State::NotInstalled => "not installed".into(),
                    service::State::Running =>
                        format!("installed and running ({})", path.display()),
                    service::State::NotRunning(why) =>
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

/// Writes the service file and starts it; whether it runs. Where the
/// service manager cannot start it, says why and how to run the same
/// command in the background instead.
fn install_service(settings: &PluginSettings, serve: bool) -> Result<bool> {
    let path = service::write(settings, serve)?;
    println!("wrote {}", path.display());
    let why = match service::start(&path) {
        Ok(()) => {
            println!("started the service");
            return Ok(true);
        }
        Err(why) => why,
    };
    let log = settings.hermes_home.join("recall").join("serve.log");
    println!("the service is installed but not started: {why}");
    println!("  start it with: {}", service::manager_command(&path));
    println!(
        "  or, where no service manager runs (a container, WSL), in the background:\n  {}",
        service::background_command(settings, serve, &log)
    );
    Ok(false)
}

fn uninstall_service() -> Result<()> {
    if let Some((path, stopped)) = service::remove()? {
        println!(
            "{} the background service ({})",
            if stopped {
                "stopped and removed"
            } else {
                "removed"
            },
            path.display()
        );
    }
    Ok(())
}
