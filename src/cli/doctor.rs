//! `recall doctor`: what recall finds on this machine, and what to do about
//! each problem. Reads only; changes nothing.

use anyhow::Result;
use clap::Args;
use recall::index::store::Store;
use recall::source::hermes::{Profile, StateDb};

use super::index::{HermesArgs, RoleArgs};
use super::{ModelArgs, ProviderArgs};

#[derive(Args)]
#[command(mut_arg("roles", |a| a.help(super::index::ROLES_AS_INDEXED)))]
pub struct DoctorArgs {
    #[command(flatten)]
    hermes: HermesArgs,
    #[command(flatten)]
    roles: RoleArgs,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    providers: ProviderArgs,
    /// Print one JSON object: each check's status (ok, warn, fail), what, detail and fix.
    #[arg(long)]
    json: bool,
}

/// The checks, printed as they are made (text) or at the end (JSON).
struct Report {
    problems: usize,
    warnings: usize,
    json: bool,
    checks: Vec<serde_json::Value>,
}

impl Report {
    fn add(&mut self, status: &str, what: &str, detail: String, fix: Option<&str>) {
        if self.json {
            self.checks.push(serde_json::json!({
                "status": status, "what": what, "detail": detail, "fix": fix,
            }));
            return;
        }
        let label = if status == "fail" { "FAIL" } else { status };
        println!("{label:<5} {what}: {detail}");
        if let Some(fix) = fix {
            println!("      → {fix}");
        }
    }

    fn ok(&mut self, what: &str, detail: String) {
        self.add("ok", what, detail, None);
    }

    fn warn(&mut self, what: &str, detail: String, fix: &str) {
        self.warnings += 1;
        self.add("warn", what, detail, Some(fix));
    }

    fn fail(&mut self, what: &str, detail: String, fix: &str) {
        self.problems += 1;
        self.add("fail", what, detail, Some(fix));
    }
}

pub fn run(args: DoctorArgs) -> Result<()> {
    let mut r = Report {
        problems: 0,
        warnings: 0,
        json: args.json,
        checks: Vec::new(),
    };
    let profiles = check_hermes(&args, &mut r);
    let index = check_index(&args, &profiles, &mut r)?;
    check_model(&args, index.model_dir.clone(), &mut r);
    check_providers(&args, &index, &mut r);
    check_plugin(&args, &mut r);
    check_service(&mut r);
    if r.json {
        println!(
            "{}",
            serde_json::json!({"problems": r.problems, "checks": r.checks})
        );
    }
    if r.problems > 0 {
        anyhow::bail!("{} problem(s) found", r.problems);
    }
    if !r.json {
        match r.warnings {
            0 => println!("no problems found"),
            n => println!("no problems found; {n} warning(s) above"),
        }
    }
    Ok(())
}

/// What the index check found, for the checks after it.
#[derive(Default)]
struct IndexSeen {
    store: Option<Store>,
    identity: Option<recall::space::Identity>,
    /// The model directory the index remembers.
    model_dir: Option<std::path::PathBuf>,
}

/// Hermes's home and each profile's database; the profiles found.
fn check_hermes(args: &DoctorArgs, r: &mut Report) -> Vec<Profile> {
    let profiles = match args.hermes.home() {
        Ok(home) if home.is_dir() => match args.hermes.profiles_even_missing() {
            Ok(p) => p,
            Err(e) => {
                r.fail(
                    "hermes",
                    format!("{e:#}"),
                    "check --hermes-home / HERMES_HOME",
                );
                Vec::new()
            }
        },
        Ok(home) => {
            r.fail(
                "hermes",
                format!("no Hermes home at {}", home.display()),
                "install Hermes, or point HERMES_HOME / --hermes-home at its directory",
            );
            Vec::new()
        }
        Err(e) => {
            r.fail(
                "hermes",
                format!("{e:#}"),
                "set HERMES_HOME or pass --hermes-home",
            );
            Vec::new()
        }
    };
    for p in &profiles {
        let what = format!("hermes profile {}", p.name);
        match StateDb::open(&p.state_db()) {
            Ok(db) => r.ok(
                &what,
                format!(
                    "{} (schema v{}, {} messages)",
                    p.state_db().display(),
                    db.schema_version().map_or("?".into(), |v| v.to_string()),
                    db.message_count().map_or("?".into(), |n| n.to_string())
                ),
            ),
            Err(e) => r.fail(
                &what,
                format!("{e:#}"),
                "start Hermes once so that it creates state.db",
            ),
        }
    }
    profiles
}

/// The index: it opens, whose vectors it holds, how far it lags Hermes.
fn check_index(args: &DoctorArgs, profiles: &[Profile], r: &mut Report) -> Result<IndexSeen> {
    let index_path = args.hermes.index_path()?;
    let mut seen = IndexSeen::default();
    if !index_path.is_file() {
        r.fail(
            "index",
            format!("none at {}", index_path.display()),
            "run `recall index` (or `recall hermes install`, which also adds the Hermes tool)",
        );
    } else {
        let opened_store = Store::open_existing(&index_path)
            .map_err(anyhow::Error::from)
            .and_then(|store| {
                let identity = store.identity()?;
                let remembered = store.model_dir()?;
                let chunks = store.counts()?.chunks;
                Ok((store, identity, remembered, chunks))
            });
        match opened_store {
            Ok((store, id, model_dir, chunks)) => {
                let existing: Vec<_> = profiles
                    .iter()
                    .filter(|p| p.state_db().is_file())
                    .cloned()
                    .collect();
                let lag = args
                    .roles
                    .selection()
                    .and_then(|selection| recall::index::lag(&store, &existing, &selection));
                let space = id.as_ref().map_or("no model yet".into(), |i| {
                    format!("{}, built by {} {}", i.space(), i.provider, i.model)
                });
                let detail = format!("{} ({chunks} chunks; {space})", index_path.display());
                match lag {
                    Ok(0) => r.ok("index", format!("{detail}; up to date")),
                    Ok(lag) => r.warn(
                        "index",
                        format!("{detail}; {lag} messages behind Hermes"),
                        "run `recall index` (it says why if it pauses), or keep `recall watch` running",
                    ),
                    Err(e) => r.warn(
                        "index",
                        format!("{detail}; cannot compare with Hermes: {e:#}"),
                        "check the Hermes profile above",
                    ),
                }
                seen = IndexSeen {
                    store: Some(store),
                    identity: id,
                    model_dir,
                };
            }
            Err(e) => r.fail(
                "index",
                format!("{e:#}"),
                "move the file aside and run `recall index` (it is rebuilt from Hermes; nothing of Hermes is lost)",
            ),
        }
    }
    Ok(seen)
}

/// The local model, the one the local provider would load: found, and its
/// files as their manifest recorded them.
fn check_model(args: &DoctorArgs, remembered: Option<std::path::PathBuf>, r: &mut Report) {
    use recall::model::locate;
    let configured = args
        .providers
        .config()
        .ok()
        .and_then(|c| c.provider("local").ok())
        .and_then(|p| p.model)
        .map(std::path::PathBuf::from);
    let model_dir = args
        .model
        .named_dir()
        .or(configured)
        .or(remembered.filter(|d| d.join("config.json").is_file()));
    match locate::locate(model_dir.as_deref()) {
        Ok(located) => match super::model::manifest_of(&located) {
            Ok(Some(manifest)) => match manifest.verify(&located.dir) {
                Ok(wrong) if wrong.is_empty() => r.ok(
                    "model",
                    format!("{} ({} files match their manifest)", located.dir.display(), manifest.files.len()),
                ),
                Ok(wrong) => r.fail(
                    "model",
                    format!(
                        "{}: {}",
                        located.dir.display(),
                        wrong.iter().map(|w| format!("{} {}", w.path, w.problem)).collect::<Vec<_>>().join("; ")
                    ),
                    "delete the wrong files and run `recall model fetch` (or import a good copy)",
                ),
                Err(e) => r.fail("model", format!("{e:#}"), "run `recall model verify` for details"),
            },
            Ok(None) => r.ok("model", format!("{} (no manifest recorded to check against)", located.dir.display())),
            Err(e) => r.warn("model", format!("{e:#}"), "run `recall model verify`"),
        },
        Err(e) => r.warn(
            "model",
            format!("{e:#}"),
            "run `recall model fetch` (2.3 GB), or use a provider that needs none: `--provider ollama`",
        ),
    }
}

/// Each provider of the chain: it answers, with vectors the index takes.
fn check_providers(args: &DoctorArgs, index: &IndexSeen, r: &mut Report) {
    match super::providers::survey(
        &args.providers,
        &args.model,
        index.identity.as_ref(),
        index.store.as_ref(),
        index.model_dir.clone(),
    ) {
        Ok(survey) => {
            let rows = survey["providers"].as_array().cloned().unwrap_or_default();
            for p in &rows {
                let what = format!("provider {}", p["name"].as_str().unwrap_or("?"));
                let model = p["model"].as_str().unwrap_or("?");
                if p["ok"] == true {
                    if p["fits_index"] == false {
                        r.warn(
                            &what,
                            format!("{model}: another vector space than the index's"),
                            "it cannot write into or search this index; `recall index --rebuild --provider NAME` moves the index to it",
                        );
                    } else {
                        r.ok(&what, format!("{model} ({} ms)", p["checked_ms"]));
                    }
                } else {
                    r.warn(
                        &what,
                        format!("{model}: {}", p["error"].as_str().unwrap_or("?")),
                        "see `recall providers`",
                    );
                }
            }
            let usable = rows
                .iter()
                .any(|p| p["ok"] == true && p["fits_index"] != false);
            if !usable {
                r.fail(
                    "providers",
                    "none of the chain can embed for this index: indexing pauses and search is keyword-only".into(),
                    "start one (e.g. `ollama serve`), fetch the model (`recall model fetch`), or fix config.toml",
                );
            }
        }
        Err(e) => r.fail("providers", format!("{e:#}"), "fix the configuration file"),
    }
}

/// The background service, where one is installed: running?
fn check_service(r: &mut Report) {
    use recall::service::{self, State};
    let Some(path) = service::installed() else {
        return;
    };
    match service::state(&path) {
        State::Running => r.ok("service", format!("running ({})", path.display())),
        State::NotRunning(why) => r.warn(
            "service",
            format!(
                "installed ({}) but not running: {why}; new messages are indexed after each turn only",
                path.display()
            ),
            "run `recall hermes install --service` again for the command that starts it here",
        ),
        State::NotInstalled => {}
    }
}

/// The Hermes plugin: installed, this version, enabled.
fn check_plugin(args: &DoctorArgs, r: &mut Report) {
    if let Ok(home) = args.hermes.home() {
        let profile = args
            .hermes
            .profile_name()
            .unwrap_or_else(|| "default".into());
        let profile_home = recall::hermes_plugin::profile_home(&home, &profile);
        let installed = recall::hermes_plugin::installed(&profile_home);
        match (installed.present, installed.current, installed.enabled) {
            (false, _, _) => r.warn(
                "plugin",
                "not installed: Hermes's agent cannot search by meaning".into(),
                "run `recall hermes install`",
            ),
            (true, false, _) => r.warn(
                "plugin",
                "from another recall version".into(),
                "run `recall hermes install` again",
            ),
            (true, true, false) => r.warn(
                "plugin",
                "installed, not enabled".into(),
                "run `recall hermes install` again",
            ),
            (true, true, true) => r.ok("plugin", "installed and enabled".into()),
        }
    }
}
