//! `recall hermes install|uninstall|status`: the Hermes plugin (shipped in
//! `plugin/recall/`, compiled into the binary) put into a Hermes home and
//! enabled the way Hermes does, and taken out again leaving `config.yaml` as
//! it was.
//!
//! Enabling uses `hermes plugins enable recall` when the `hermes` command is
//! there (Hermes then rewrites `config.yaml` itself, comments dropped), and
//! otherwise a line edit of `plugins.enabled` that keeps the user's
//! comments, order and formatting, checked by a YAML parser to change
//! nothing else (or refused, leaving the file alone). Either way the previous `config.yaml` is
//! kept as `config.yaml.recall-backup`, and uninstall puts it back when
//! nothing else changed the file since; if something did, it removes only
//! `recall` from the list.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub const PLUGIN_NAME: &str = "recall";
const PLUGIN_YAML: &str = include_str!("../plugin/recall/plugin.yaml");
const PLUGIN_INIT: &str = include_str!("../plugin/recall/__init__.py");
const STATE_FILE: &str = "install-state.json";
const BACKUP_SUFFIX: &str = ".recall-backup";

/// What the plugin reads at run time (`recall.json` beside it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PluginSettings {
    /// The recall binary the plugin runs when no server answers.
    pub binary: PathBuf,
    /// `recall serve`'s base URL.
    pub server: String,
    pub hermes_home: PathBuf,
    pub profile: String,
    /// A model directory to pass as `--model` (None: recall's own default).
    pub model: Option<PathBuf>,
    /// `--dtype` for every recall the plugin or the service runs (None: f32),
    /// so that they embed as the index was built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// `--provider`, as install was given it (empty: the configured chain).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<String>,
    /// `--config`, as install was given it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<PathBuf>,
}

impl PluginSettings {
    /// The options that choose how recall embeds: what install was told,
    /// for every recall the plugin or the service runs.
    pub fn engine_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(model) = &self.model {
            args.extend(["--model".into(), model.display().to_string()]);
        }
        if let Some(dtype) = &self.dtype {
            args.extend(["--dtype".into(), dtype.clone()]);
        }
        if !self.providers.is_empty() {
            args.extend(["--provider".into(), self.providers.join(",")]);
        }
        if let Some(config) = &self.config {
            args.extend(["--config".into(), config.display().to_string()]);
        }
        args
    }
}

/// How the plugin was enabled, to undo exactly that.
#[derive(Debug, Serialize, Deserialize)]
struct InstallState {
    method: String,
    /// The config before install: its backup, or None when install created the file.
    backup: Option<PathBuf>,
    /// SHA-256 of config.yaml right after install.
    config_after: String,
}

/// The Hermes home of `profile` under `hermes_home` (the default profile is the home itself).
pub fn profile_home(hermes_home: &Path, profile: &str) -> PathBuf {
    if profile == "default" {
        hermes_home.to_path_buf()
    } else {
        hermes_home.join("profiles").join(profile)
    }
}

pub fn plugin_dir(profile_home: &Path) -> PathBuf {
    profile_home.join("plugins").join(PLUGIN_NAME)
}

/// What install did (nothing, the second time).
#[derive(Debug, Default, Serialize)]
pub struct InstallReport {
    pub plugin_dir: PathBuf,
    pub files_written: Vec<String>,
    /// `hermes` (the Hermes command) or `edit` (recall's edit of config.yaml); None: already enabled.
    pub enabled_by: Option<String>,
    pub backup: Option<PathBuf>,
}

/// Copies the plugin into `profile_home` and enables it. `hermes_bin` is
/// the Hermes command to enable it with, when there is one.
pub fn install(
    profile_home: &Path,
    settings: &PluginSettings,
    hermes_bin: Option<&Path>,
) -> Result<InstallReport> {
    if !profile_home.is_dir() {
        bail!(
            "no Hermes home at {}: install Hermes first, or pass --hermes-home",
            profile_home.display()
        );
    }
    // Read before anything is written: a config.yaml recall cannot read as
    // text is never edited (nor replaced), only named.
    let config = profile_home.join("config.yaml");
    let before = read_config(&config)?;
    let dir = plugin_dir(profile_home);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut report = InstallReport {
        plugin_dir: dir.clone(),
        ..Default::default()
    };
    let settings_json = serde_json::to_string_pretty(settings)? + "\n";
    for (name, content) in [
        ("plugin.yaml", PLUGIN_YAML),
        ("__init__.py", PLUGIN_INIT),
        ("recall.json", settings_json.as_str()),
    ] {
        let path = dir.join(name);
        if std::fs::read_to_string(&path).ok().as_deref() != Some(content) {
            std::fs::write(&path, content)
                .with_context(|| format!("cannot write {}", path.display()))?;
            report.files_written.push(name.to_string());
        }
    }

    if before
        .as_deref()
        .is_some_and(|t| enabled_plugins(t).iter().any(|p| p == PLUGIN_NAME))
    {
        return Ok(report);
    }
    // Without the Hermes command, the edit is made (or refused) before
    // anything of the user's is copied or written.
    let edited = match hermes_bin {
        Some(_) => None,
        None => Some(add_enabled(before.as_deref().unwrap_or(""), PLUGIN_NAME)?),
    };
    let backup = match &before {
        Some(text) => {
            let path = with_suffix(&config, BACKUP_SUFFIX);
            write_like(&path, text.as_bytes(), &config).with_context(|| {
                format!("cannot back up {} to {}", config.display(), path.display())
            })?;
            Some(path)
        }
        None => None,
    };
    let method = match (hermes_bin, edited) {
        (Some(hermes), _) => {
            let out = std::process::Command::new(hermes)
                .args(["plugins", "enable", PLUGIN_NAME, "--no-allow-tool-override"])
                .env("HERMES_HOME", profile_home)
                .stdin(std::process::Stdio::null())
                .output()
                .with_context(|| format!("cannot run {}", hermes.display()))?;
            let text = std::fs::read_to_string(&config).unwrap_or_default();
            if !out.status.success() || !enabled_plugins(&text).iter().any(|p| p == PLUGIN_NAME) {
                bail!(
                    "`{} plugins enable {PLUGIN_NAME}` did not enable the plugin: {}",
                    hermes.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            "hermes"
        }
        (None, edited) => {
            std::fs::write(&config, edited.unwrap_or_default())
                .with_context(|| format!("cannot write {}", config.display()))?;
            "edit"
        }
    };
    let after = std::fs::read(&config)?;
    let state = InstallState {
        method: method.to_string(),
        backup: backup.clone(),
        config_after: sha256(&after),
    };
    std::fs::write(dir.join(STATE_FILE), serde_json::to_string_pretty(&state)?)?;
    report.enabled_by = Some(method.to_string());
    report.backup = backup;
    Ok(report)
}

/// `config` as text; None when there is none. A file that cannot be read,
/// or is not UTF-8, is an error naming it: editing what was not understood
/// would destroy it.
fn read_config(config: &Path) -> Result<Option<String>> {
    let bytes = match std::fs::read(config) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", config.display())),
    };
    match String::from_utf8(bytes) {
        Ok(text) => Ok(Some(text)),
        Err(e) => bail!(
            "{} is not UTF-8 text (byte {} is not): recall leaves it as it is; fix its encoding, or enable the plugin \
             with `hermes plugins enable {PLUGIN_NAME}`",
            config.display(),
            e.utf8_error().valid_up_to()
        ),
    }
}

/// Writes `bytes` to `path` with the permissions (and, where this process
/// may, the owner) of `like`: a copy of a file holding API keys is as
/// private as the file.
fn write_like(path: &Path, bytes: &[u8], like: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::io::Write;
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
        let meta = std::fs::metadata(like)?;
        let mode = meta.permissions().mode() & 0o7777;
        // Created with the mode (never readable by others in between), and
        // set again for a file that was there already.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(path)?;
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        let _ = std::os::unix::fs::fchown(&file, Some(meta.uid()), Some(meta.gid()));
        file.write_all(bytes)?;
        file.sync_all()?;
        Ok(())
    }
    #[cfg(not(unix))]
    {
        let _ = like;
        Ok(std::fs::write(path, bytes)?)
    }
}

/// What uninstall did.
#[derive(Debug, Default, Serialize)]
pub struct UninstallReport {
    pub removed_plugin: bool,
    /// `restored` (config.yaml put back as it was), `removed` (only recall
    /// taken out of plugins.enabled, the file having changed since), or None.
    pub config: Option<String>,
    /// The copy of config.yaml from before install, when it was not put
    /// back: kept, since it may hold what the file no longer has (comments
    /// that `hermes plugins enable` dropped).
    pub kept_backup: Option<PathBuf>,
}

/// Disables and removes the plugin from `profile_home`.
pub fn uninstall(profile_home: &Path) -> Result<UninstallReport> {
    let dir = plugin_dir(profile_home);
    let config = profile_home.join("config.yaml");
    let mut report = UninstallReport::default();
    let state: Option<InstallState> = std::fs::read_to_string(dir.join(STATE_FILE))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let current = std::fs::read(&config).ok();
    match (&state, &current) {
        (Some(state), Some(now)) if sha256(now) == state.config_after => {
            match &state.backup {
                Some(backup) => std::fs::copy(backup, &config)
                    .map(|_| ())
                    .with_context(|| format!("cannot restore {}", config.display()))?,
                None => std::fs::remove_file(&config)?,
            }
            report.config = Some("restored".into());
        }
        (_, Some(_)) => {
            // Changed since install: only recall comes out of the list, by
            // the same edit (or not at all) as install's.
            let text = read_config(&config)?.unwrap_or_default();
            if enabled_plugins(&text).iter().any(|p| p == PLUGIN_NAME) {
                let edited = remove_enabled(&text, PLUGIN_NAME)
                    .with_context(|| format!("cannot edit {}", config.display()))?;
                std::fs::write(&config, edited)?;
                report.config = Some("removed".into());
            }
        }
        _ => {}
    }
    if let Some(backup) = state.as_ref().and_then(|s| s.backup.as_ref()) {
        if report.config.as_deref() == Some("restored") {
            let _ = std::fs::remove_file(backup);
        } else if backup.exists() {
            report.kept_backup = Some(backup.clone());
        }
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("cannot remove {}", dir.display()))?;
        report.removed_plugin = true;
    }
    Ok(report)
}

/// What a profile has of the plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Installed {
    /// Its files are there.
    pub present: bool,
    /// They are this version's.
    pub current: bool,
    /// `config.yaml`'s `plugins.enabled` lists it.
    pub enabled: bool,
}

/// Is the plugin installed (this version's files) and enabled in `profile_home`?
pub fn installed(profile_home: &Path) -> Installed {
    let dir = plugin_dir(profile_home);
    let present = dir.join("__init__.py").is_file();
    let current = std::fs::read_to_string(dir.join("__init__.py"))
        .ok()
        .as_deref()
        == Some(PLUGIN_INIT);
    let enabled = std::fs::read_to_string(profile_home.join("config.yaml"))
        .map(|t| enabled_plugins(&t).iter().any(|p| p == PLUGIN_NAME))
        .unwrap_or(false);
    Installed {
        present,
        current,
        enabled,
    }
}

pub fn read_settings(profile_home: &Path) -> Option<PluginSettings> {
    let text = std::fs::read_to_string(plugin_dir(profile_home).join("recall.json")).ok()?;
    serde_json::from_str(&text).ok()
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

// ---- plugins.enabled in config.yaml, edited as lines -------------------

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

fn is_blank_or_comment(line: &str) -> bool {
    let t = line.trim_start();
    t.is_empty() || t.starts_with('#')
}

/// The value part of `key: value  # comment`, and the comment (with its spaces).
fn split_comment(value: &str) -> (&str, &str) {
    match value.find(" #") {
        Some(at) => {
            let end = value[..at].trim_end().len();
            (&value[..end], &value[end..])
        }
        None => (value.trim_end(), ""),
    }
}

fn unquote(s: &str) -> String {
    s.trim().trim_matches(|c| c == '"' || c == '\'').to_string()
}

/// Where `plugins.enabled` is: (line of `plugins:`, end of its block, line of `enabled:` if any).
fn locate(lines: &[&str]) -> Option<(usize, usize, Option<usize>)> {
    let start = lines.iter().position(|l| {
        l.starts_with("plugins:") && split_comment(&l["plugins:".len()..]).0.is_empty()
    })?;
    let mut end = start + 1;
    while end < lines.len() && (is_blank_or_comment(lines[end]) || indent(lines[end]) > 0) {
        end += 1;
    }
    let child = lines[start + 1..end]
        .iter()
        .find(|l| !is_blank_or_comment(l))
        .map(|l| indent(l));
    let enabled = child.and_then(|ci| {
        (start + 1..end)
            .find(|&i| indent(lines[i]) == ci && lines[i].trim_start().starts_with("enabled:"))
    });
    Some((start, end, enabled))
}

/// Lines of the block list under `enabled:` at `at` (items may sit at the key's indent).
fn block_items(lines: &[&str], at: usize, end: usize) -> Vec<usize> {
    let key_indent = indent(lines[at]);
    let mut items = Vec::new();
    for (i, line) in lines.iter().enumerate().take(end).skip(at + 1) {
        if is_blank_or_comment(line) {
            continue;
        }
        if indent(line) >= key_indent && line.trim_start().starts_with("- ") {
            items.push(i);
        } else {
            break;
        }
    }
    items
}

/// The names in `plugins.enabled`.
pub fn enabled_plugins(text: &str) -> Vec<String> {
    let text = text.strip_prefix(BOM).unwrap_or(text);
    let lines: Vec<&str> = text.lines().collect();
    let Some((_, end, Some(at))) = locate(&lines) else {
        return Vec::new();
    };
    let value = split_comment(lines[at].trim_start()["enabled:".len()..].trim()).0;
    if let Some(inner) = value.strip_prefix('[') {
        return inner
            .trim_end_matches(']')
            .split(',')
            .map(unquote)
            .filter(|s| !s.is_empty())
            .collect();
    }
    block_items(&lines, at, end)
        .into_iter()
        .map(|i| unquote(split_comment(&lines[i].trim_start()[2..]).0))
        .collect()
}

const BOM: &str = "\u{feff}";

/// `text` with `name` added to `plugins.enabled`, everything else untouched.
pub fn add_enabled(text: &str, name: &str) -> Result<String> {
    edit(text, name, Change::Add)
}

/// `text` with `name` taken out of `plugins.enabled`.
pub fn remove_enabled(text: &str, name: &str) -> Result<String> {
    edit(text, name, Change::Remove)
}

#[derive(Clone, Copy, PartialEq)]
enum Change {
    Add,
    Remove,
}

/// The line edit, then a check by a YAML parser that it changed nothing but
/// the list: a construct the edit does not know is refused, never mangled.
/// The byte-order mark and the line endings are kept.
fn edit(text: &str, name: &str, change: Change) -> Result<String> {
    let (bom, body) = match text.strip_prefix(BOM) {
        Some(body) => (BOM, body),
        None => ("", text),
    };
    let crlf = body.matches("\r\n").count();
    let newline = match (crlf, body.matches('\n').count()) {
        (0, _) => "\n",
        (crlf, lf) if crlf == lf => "\r\n",
        _ => bail!(
            "config.yaml mixes CRLF and LF line endings, which recall's edit would not keep: {}",
            by_hand(name, change)
        ),
    };
    let lines: Vec<&str> = body.lines().collect();
    let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    match change {
        Change::Add => add_lines(&lines, &mut out, name)?,
        Change::Remove => remove_lines(&lines, &mut out, name),
    }
    let mut edited = out.join(newline);
    if body.ends_with('\n') || body.is_empty() {
        edited.push_str(newline);
    }
    let before =
        parse_enabled(body).map_err(|e| anyhow::anyhow!("{e}: {}", by_hand(name, change)))?;
    let mut want = before.1.clone();
    match change {
        Change::Add => want.push(yaml_rust2::Yaml::String(name.to_string())),
        Change::Remove => want.retain(|item| item.as_str() != Some(name)),
    }
    match parse_enabled(&edited) {
        Ok((rest, list)) if rest == before.0 && list == want => Ok(format!("{bom}{edited}")),
        _ => bail!(
            "config.yaml writes plugins.enabled (or what is around it) in a form recall's line edit \
             does not keep: {}",
            by_hand(name, change)
        ),
    }
}

fn by_hand(name: &str, change: Change) -> String {
    match change {
        Change::Add => format!(
            "add {name} to plugins.enabled by hand, or install with the `hermes` command on PATH"
        ),
        Change::Remove => format!("remove {name} from plugins.enabled by hand"),
    }
}

/// A config.yaml as YAML: the document without `plugins.enabled`, and that
/// list (empty when absent or null).
fn parse_enabled(text: &str) -> Result<(yaml_rust2::Yaml, Vec<yaml_rust2::Yaml>)> {
    use yaml_rust2::Yaml;
    let mut docs = yaml_rust2::YamlLoader::load_from_str(text)
        .map_err(|e| anyhow::anyhow!("config.yaml is not YAML recall can read ({e})"))?;
    if docs.len() > 1 {
        bail!("config.yaml holds {} YAML documents", docs.len());
    }
    // A file of comments only is an empty mapping, as Hermes reads it.
    let mut doc = match docs.pop() {
        None | Some(Yaml::Null) => Yaml::Hash(Default::default()),
        Some(doc) => doc,
    };
    let key = |k: &str| Yaml::String(k.to_string());
    let mut enabled = Yaml::Null;
    if let Yaml::Hash(top) = &mut doc {
        if let Some(Yaml::Hash(plugins)) = top.get_mut(&key("plugins")) {
            enabled = plugins.remove(&key("enabled")).unwrap_or(Yaml::Null);
        }
        if matches!(top.get(&key("plugins")), Some(Yaml::Null))
            || matches!(top.get(&key("plugins")), Some(Yaml::Hash(h)) if h.is_empty())
        {
            top.remove(&key("plugins"));
        }
    }
    let list = match enabled {
        Yaml::Null => Vec::new(),
        Yaml::Array(items) => items,
        other => bail!("config.yaml's plugins.enabled is {other:?}, not a list"),
    };
    Ok((doc, list))
}

fn add_lines(lines: &[&str], out: &mut Vec<String>, name: &str) -> Result<()> {
    match locate(lines) {
        None => {
            if lines.iter().any(|l| l.starts_with("plugins:")) {
                bail!(
                    "config.yaml writes `plugins:` on one line, which recall does not edit: {}",
                    by_hand(name, Change::Add)
                );
            }
            if out.last().is_some_and(|l| !l.trim().is_empty()) {
                out.push(String::new());
            }
            out.extend([
                "plugins:".into(),
                "  enabled:".into(),
                format!("    - {name}"),
            ]);
        }
        Some((start, end, None)) => {
            let ci = lines[start + 1..end]
                .iter()
                .find(|l| !is_blank_or_comment(l))
                .map_or(2, |l| indent(l));
            let pad = " ".repeat(ci);
            out.insert(start + 1, format!("{pad}enabled:"));
            out.insert(start + 2, format!("{pad}  - {name}"));
        }
        Some((_, end, Some(at))) => {
            let line = lines[at];
            let key_end = indent(line) + "enabled:".len();
            let (value, comment) = split_comment(line[key_end..].trim_start());
            if let Some(inner) = value.strip_prefix('[') {
                let inner = inner.trim_end_matches(']').trim();
                let list = if inner.is_empty() {
                    name.to_string()
                } else {
                    format!("{inner}, {name}")
                };
                out[at] = format!("{}enabled: [{list}]{comment}", &line[..indent(line)]);
            } else {
                let items = block_items(lines, at, end);
                let (after, pad) = match items.last() {
                    Some(&last) => (last, " ".repeat(indent(lines[last]))),
                    None => (at, " ".repeat(indent(line) + 2)),
                };
                if items.is_empty() && !value.is_empty() {
                    // `enabled: null` or `enabled: ~`: the list replaces the
                    // value (any other value fails the check after the edit).
                    out[at] = format!("{}enabled:{comment}", &line[..indent(line)]);
                }
                out.insert(after + 1, format!("{pad}- {name}"));
            }
        }
    }
    Ok(())
}

fn remove_lines(lines: &[&str], out: &mut Vec<String>, name: &str) {
    let Some((_, end, Some(at))) = locate(lines) else {
        return;
    };
    let line = lines[at];
    let key_end = indent(line) + "enabled:".len();
    let (value, comment) = split_comment(line[key_end..].trim_start());
    if let Some(inner) = value.strip_prefix('[') {
        let kept: Vec<&str> = inner
            .trim_end_matches(']')
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty() && unquote(s) != name)
            .collect();
        out[at] = format!(
            "{}enabled: [{}]{comment}",
            &line[..indent(line)],
            kept.join(", ")
        );
    } else if let Some(i) = block_items(lines, at, end)
        .into_iter()
        .find(|&i| unquote(split_comment(&lines[i].trim_start()[2..]).0) == name)
    {
        out.remove(i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const USER: &str = "# my Hermes\nmodel:\n  default: x   # keep me\nplugins:\n  # mine\n  enabled:\n  - other   # first\n  disabled: []\nterminal:\n  backend: local\n";

    #[test]
    fn block_list_keeps_comments_and_order() {
        let added = add_enabled(USER, "recall").unwrap();
        assert_eq!(enabled_plugins(&added), ["other", "recall"]);
        assert!(
            added.contains("# my Hermes")
                && added.contains("# keep me")
                && added.contains("# first")
        );
        assert_eq!(remove_enabled(&added, "recall").unwrap(), USER);
    }

    #[test]
    fn flow_lists_missing_keys_and_missing_files() {
        let flow = "plugins:\n  enabled: [a, 'b']  # note\n";
        let added = add_enabled(flow, "recall").unwrap();
        assert_eq!(added, "plugins:\n  enabled: [a, 'b', recall]  # note\n");
        assert_eq!(enabled_plugins(&added), ["a", "b", "recall"]);
        assert_eq!(remove_enabled(&added, "recall").unwrap(), flow);

        let empty = add_enabled("plugins:\n  enabled: []\n", "recall").unwrap();
        assert_eq!(enabled_plugins(&empty), ["recall"]);

        let no_key = "plugins:\n    disabled: [x]\nother: 1\n";
        let added = add_enabled(no_key, "recall").unwrap();
        assert_eq!(
            added,
            "plugins:\n    enabled:\n      - recall\n    disabled: [x]\nother: 1\n"
        );
        assert_eq!(enabled_plugins(&added), ["recall"]);

        let none = add_enabled("model:\n  default: x\n", "recall").unwrap();
        assert_eq!(
            none,
            "model:\n  default: x\n\nplugins:\n  enabled:\n    - recall\n"
        );
        assert_eq!(
            enabled_plugins(&add_enabled("", "recall").unwrap()),
            ["recall"]
        );

        let null = add_enabled("plugins:\n  enabled: ~\n", "recall").unwrap();
        assert_eq!(enabled_plugins(&null), ["recall"]);

        assert!(add_enabled("plugins: {enabled: [a]}\n", "recall").is_err());
    }

    #[test]
    fn anchors_aliases_and_neighbouring_keys_are_left_alone() {
        let text = "defaults: &defaults\n  timeout: 30\nplugins:\n  <<: *defaults\n  enabled: &mine\n    - a\n  entries:\n    a: {settings: {x: 1}}\nother: *defaults\n";
        let added = add_enabled(text, "recall").unwrap();
        assert_eq!(
            added,
            "defaults: &defaults\n  timeout: 30\nplugins:\n  <<: *defaults\n  enabled: &mine\n    - a\n    - recall\n  entries:\n    a: {settings: {x: 1}}\nother: *defaults\n"
        );
        assert_eq!(enabled_plugins(&added), ["a", "recall"]);
        assert_eq!(remove_enabled(&added, "recall").unwrap(), text);

        // The list's anchor used elsewhere: adding to it would change that too.
        let aliased = format!("{text}more: *mine\n");
        let err = add_enabled(&aliased, "recall").unwrap_err().to_string();
        assert!(err.contains("by hand"), "{err}");
    }

    #[test]
    fn byte_order_mark_and_line_endings_are_kept() {
        for text in [
            "\u{feff}plugins:\n  enabled:\n    - a\n",
            "plugins:\r\n  enabled:\r\n    - a   # mine\r\nother: 1\r\n",
            "\u{feff}# top\r\nplugins:\r\n  enabled: [a]\r\n",
        ] {
            let added = add_enabled(text, "recall").unwrap();
            assert_eq!(enabled_plugins(&added), ["a", "recall"], "{added:?}");
            assert_eq!(added.starts_with(BOM), text.starts_with(BOM), "{added:?}");
            let bare_lf = added.replace("\r\n", "").contains('\n');
            assert_eq!(bare_lf, !text.contains('\r'), "{added:?}");
            assert_eq!(added.matches("plugins:").count(), 1, "{added:?}");
            assert_eq!(remove_enabled(&added, "recall").unwrap(), text);
        }
        let err = add_enabled("plugins:\r\n  enabled:\n  - a\n", "recall").unwrap_err();
        assert!(err.to_string().contains("mixes CRLF and LF"), "{err}");
    }

    #[test]
    fn yaml_the_line_edit_cannot_keep_is_refused() {
        for text in [
            "plugins:\n  enabled: [alpha,\n    beta]\n",
            "plugins:\n  enabled:\n    - >-\n      long\n      name\n",
            "plugins:\n  enabled: \"recallx\"\n",
            "plugins:\n  enabled:\n    - a\n---\nplugins: {}\n",
            "plugins:\n  enabled: [a\n",
        ] {
            let err = add_enabled(text, "recall").unwrap_err().to_string();
            assert!(err.contains("by hand"), "{text:?}: {err}");
            if text.contains("recallx") {
                let err = remove_enabled(text, "recall").unwrap_err().to_string();
                assert!(err.contains("not a list"), "{err}");
            }
        }
    }
}
