//! recall's configuration file (`~/.config/recall/config.toml`, `--config`
//! or `RECALL_CONFIG`): the embedding providers and the order they are
//! tried in. Built-in providers (`local`, `ollama`, `ark`, `openai`) need no
//! table; a table of the same name changes some of their settings.
//!
//! ```toml
//! chain = ["local", "ollama"]        # tried in this order; also RECALL_PROVIDERS / --provider
//!
//! [providers.ollama]
//! base_url = "http://127.0.0.1:11434"
//! model = "bge-m3"
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use super::http::Policy;
use super::remote::{Remote, RemoteSettings};
use super::{Chain, Input, Kind, Provider, Vector, ollama, openai};
use crate::env;
use crate::space::Identity;

/// A secret that never appears in `Debug` output, logs or messages.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"***\"")
    }
}

/// One `[providers.NAME]` table. Unset fields take the built-in's value.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    #[serde(rename = "type")]
    pub kind: Option<Kind>,
    /// Model name (remote) or model directory (local).
    pub model: Option<String>,
    pub base_url: Option<String>,
    /// The variable holding the API key (ARK_API_KEY for `ark`, OPENAI_API_KEY for `openai`).
    pub api_key_env: Option<String>,
    /// The API key itself; prefer `api_key_env`.
    pub api_key: Option<Secret>,
    /// The wire format of a `type = "openai"` provider: `openai` (`/embeddings`,
    /// the default) or `ark-multimodal` (Volcano Ark's `/embeddings/multimodal`).
    pub api: Option<String>,
    /// The model family, when the model name does not say it (e.g. an Ollama tag `my-m3`).
    pub space: Option<String>,
    /// The vector width the provider must give (checked on every answer).
    pub dimension: Option<usize>,
    /// Inputs per request.
    pub batch_size: Option<usize>,
    /// Requests in flight at once.
    pub concurrency: Option<usize>,
    pub timeout_secs: Option<f64>,
    pub connect_timeout_secs: Option<f64>,
    pub retries: Option<u32>,
    pub backoff_ms: Option<u64>,
    pub max_backoff_secs: Option<f64>,
    pub breaker_failures: Option<u32>,
    pub breaker_cooldown_secs: Option<f64>,
}

impl ProviderConfig {
    /// `self` over `base`: what `self` sets wins.
    fn over(self, base: ProviderConfig) -> ProviderConfig {
        macro_rules! pick {
            ($($f:ident),*) => { ProviderConfig { $($f: self.$f.or(base.$f)),* } };
        }
        pick!(
            kind,
            model,
            base_url,
            api_key_env,
            api_key,
            api,
            space,
            dimension,
            batch_size,
            concurrency,
            timeout_secs,
            connect_timeout_secs,
            retries,
            backoff_ms,
            max_backoff_secs,
            breaker_failures,
            breaker_cooldown_secs
        )
    }

    fn policy(&self) -> Policy {
        let d = Policy::default();
        Policy {
            timeout_secs: self.timeout_secs.unwrap_or(d.timeout_secs),
            connect_timeout_secs: self.connect_timeout_secs.unwrap_or(d.connect_timeout_secs),
            retries: self.retries.unwrap_or(d.retries),
            backoff_ms: self.backoff_ms.unwrap_or(d.backoff_ms),
            max_backoff_secs: self.max_backoff_secs.unwrap_or(d.max_backoff_secs),
            breaker_failures: self.breaker_failures.unwrap_or(d.breaker_failures).max(1),
            breaker_cooldown_secs: self
                .breaker_cooldown_secs
                .unwrap_or(d.breaker_cooldown_secs),
        }
    }
}

fn builtin(name: &str) -> Option<ProviderConfig> {
    let remote = |kind, base: String, model: &str, key: Option<&str>| ProviderConfig {
        kind: Some(kind),
        base_url: Some(base),
        model: Some(model.into()),
        api_key_env: key.map(str::to_string),
        ..Default::default()
    };
    Some(match name {
        "local" => ProviderConfig {
            kind: Some(Kind::Local),
            ..Default::default()
        },
        // Ollama's own variable for where its server is.
        "ollama" => remote(
            Kind::Ollama,
            env::OLLAMA_HOST
                .text()
                .map(|h| {
                    if h.contains("://") {
                        h
                    } else {
                        format!("http://{h}")
                    }
                })
                .unwrap_or_else(|| ollama::DEFAULT_BASE.into()),
            "bge-m3",
            None,
        ),
        "ark" => ProviderConfig {
            api: Some("ark-multimodal".into()),
            ..remote(
                Kind::Openai,
                openai::ARK_BASE.into(),
                "doubao-embedding-vision",
                Some(env::ARK_API_KEY.name),
            )
        },
        "openai" => remote(
            Kind::Openai,
            openai::OPENAI_BASE.into(),
            "text-embedding-3-small",
            Some(env::OPENAI_API_KEY.name),
        ),
        _ => return None,
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    chain: Option<Vec<String>>,
    #[serde(default)]
    providers: BTreeMap<String, ProviderConfig>,
}

/// The configuration as read: the file (if any), then the environment and flags.
#[derive(Debug, Default)]
pub struct Config {
    /// The file that was read, if any.
    pub path: Option<PathBuf>,
    /// For a person waiting (search): remote providers get one retry, a
    /// 20 s timeout and short backoffs, whatever the file says.
    pub interactive: bool,
    pub chain: Vec<String>,
    providers: BTreeMap<String, ProviderConfig>,
}

/// `$XDG_CONFIG_HOME/recall/config.toml`, else `~/.config/recall/config.toml`.
pub fn default_path() -> Option<PathBuf> {
    env::config_home().map(|d| d.join("recall").join("config.toml"))
}

/// Key names whose values are secrets: never printed, not even in a
/// syntax error about their line.
fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["key", "token", "secret", "password"]
        .iter()
        .any(|s| key.contains(s))
        && !key.ends_with("_env")
}

/// The file parsed. An error names the line and column and says what is
/// wrong without quoting the file: the quoted line may hold an API key, and
/// an error can reach an agent's model (the Hermes plugin's fallback). On a
/// line that sets a secret, only the key is named.
fn parse(text: &str) -> Result<File> {
    toml::from_str(text).map_err(|e| {
        let Some(span) = e.span() else {
            return anyhow::anyhow!("{}", e.message());
        };
        let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
        let content = text.lines().nth(line - 1).unwrap_or("");
        let key = content.split('=').next().unwrap_or("").trim();
        if !content.contains('=') {
            anyhow::anyhow!("line {line}: {}", e.message().trim_end())
        } else if is_secret_key(key) {
            anyhow::anyhow!(
                "line {line}: the value of `{key}` is not valid (not shown: it is a secret)"
            )
        } else {
            anyhow::anyhow!("line {line}, `{key}`: {}", e.message().trim_end())
        }
    })
}

/// Warns when `path` holds an API key and other users may read it (once
/// a process: a command may read its configuration more than once).
fn warn_if_exposed(path: &Path, file: &File) {
    #[cfg(unix)]
    {
        static WARNED: std::sync::Once = std::sync::Once::new();
        use std::os::unix::fs::PermissionsExt;
        let holds_key = file.providers.values().any(|p| p.api_key.is_some());
        let mode = std::fs::metadata(path).map_or(0, |m| m.permissions().mode());
        if holds_key && mode & 0o077 != 0 {
            WARNED.call_once(|| {
                tracing::warn!(
                    "{} holds an API key and other users can read it (mode {:o}): chmod 600 {}",
                    path.display(),
                    mode & 0o777,
                    path.display()
                )
            });
        }
    }
    #[cfg(not(unix))]
    let _ = (path, file);
}

impl Config {
    /// Reads `explicit` (which must exist), else `RECALL_CONFIG` (which must
    /// exist), else the default path (if it exists); `chain` (from a flag)
    /// or `RECALL_PROVIDERS` replace the file's chain.
    pub fn load(explicit: Option<&Path>, chain: &[String]) -> Result<Config> {
        let named = explicit
            .map(Path::to_path_buf)
            .or_else(|| env::CONFIG.get().map(PathBuf::from));
        let path = match named {
            Some(p) if !p.is_file() => {
                bail!("the configuration file {} does not exist", p.display())
            }
            Some(p) => Some(p),
            None => default_path().filter(|p| p.is_file()),
        };
        let file: File = match &path {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("cannot read {}", p.display()))?;
                let file = parse(&text).with_context(|| {
                    format!("{} is not a valid recall configuration", p.display())
                })?;
                warn_if_exposed(p, &file);
                file
            }
            None => File::default(),
        };
        let from_env: Vec<String> = env::PROVIDERS
            .text()
            .map(|v| split_names(&[v]))
            .unwrap_or_default();
        let chain = if !chain.is_empty() {
            split_names(chain)
        } else if !from_env.is_empty() {
            from_env
        } else {
            file.chain.unwrap_or_else(|| vec!["local".into()])
        };
        let config = Config {
            path,
            interactive: false,
            chain,
            providers: file.providers,
        };
        if config.chain.is_empty() {
            bail!(
                "the provider chain is empty: name at least one provider (local, ollama, ark, openai, or a [providers.NAME] table)"
            );
        }
        for name in &config.chain {
            config.provider(name)?;
        }
        Ok(config)
    }

    /// The settings of the provider `name`: the file's table over the built-in.
    pub fn provider(&self, name: &str) -> Result<ProviderConfig> {
        let own = self.providers.get(name).cloned();
        let merged = match (own, builtin(name)) {
            (Some(own), Some(base)) => own.over(base),
            (Some(own), None) => own,
            (None, Some(base)) => base,
            (None, None) => bail!(
                "unknown provider {name:?}: the built-in ones are local, ollama, ark and openai; \
                 others need a [providers.{name}] table in {}",
                self.path
                    .as_deref()
                    .or(default_path().as_deref())
                    .map_or("config.toml".into(), |p| p.display().to_string())
            ),
        };
        let kind = merged.kind.with_context(|| {
            format!("[providers.{name}] needs type = \"local\", \"ollama\" or \"openai\"")
        })?;
        if kind != Kind::Local && merged.base_url.is_none() {
            bail!("[providers.{name}] needs base_url");
        }
        if kind != Kind::Local && merged.model.is_none() {
            bail!("[providers.{name}] needs model");
        }
        Ok(merged)
    }

    /// The chain's providers, built; `local` makes each local one (the CLI
    /// decides where its model comes from).
    pub fn build(
        &self,
        local: &dyn Fn(&str, &ProviderConfig) -> Arc<dyn Provider>,
    ) -> Result<Chain> {
        let mut providers = Vec::new();
        for name in &self.chain {
            let p = self.provider(name)?;
            providers.push(match p.kind.unwrap() {
                Kind::Local => local(name, &p),
                kind => Arc::new(remote(name, &p, kind, self.interactive)?) as Arc<dyn Provider>,
            });
        }
        Ok(Chain::new(providers))
    }
}

/// `a,b` and repeated flags alike.
fn split_names(values: &[String]) -> Vec<String> {
    values
        .iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

fn remote(name: &str, p: &ProviderConfig, kind: Kind, interactive: bool) -> Result<RemoteProvider> {
    let key = match (&p.api_key, &p.api_key_env) {
        (Some(Secret(k)), _) => Some(k.trim().to_string()),
        (None, Some(var)) => env::named(var).map(|k| k.trim().to_string()),
        (None, None) => None,
    };
    let mut headers = Vec::new();
    if let Some(key) = key {
        headers.push(("Authorization", format!("Bearer {key}")));
    }
    let mut policy = p.policy();
    policy
        .check()
        .with_context(|| format!("[providers.{name}]"))?;
    if interactive {
        policy.retries = policy.retries.min(1);
        policy.timeout_secs = policy.timeout_secs.min(20.0);
        policy.max_backoff_secs = policy.max_backoff_secs.min(2.0);
    }
    let missing_key = kind == Kind::Openai
        && headers.is_empty()
        && p.api_key_env.is_some()
        && !p
            .base_url
            .as_deref()
            .is_some_and(|b| b.starts_with("http://"));
    let api: Box<dyn super::remote::Api> = match (kind, p.api.as_deref()) {
        (Kind::Ollama, None) => Box::new(ollama::Ollama),
        (Kind::Openai, None | Some("openai")) => Box::new(openai::OpenAi),
        (Kind::Openai, Some("ark-multimodal")) => Box::new(openai::ArkMultimodal),
        (_, Some(other)) => bail!(
            "[providers.{name}] api = {other:?}: type = \"openai\" takes api = \"openai\" or \"ark-multimodal\"; other types take none"
        ),
        (Kind::Local, None) => unreachable!("local providers are not remote"),
    };
    let (batch, concurrency) = match kind {
        Kind::Ollama => (64, 1),
        _ => (256, 4),
    };
    Ok(RemoteProvider {
        remote: Remote::new(RemoteSettings {
            name,
            base: p.base_url.as_deref().unwrap_or_default(),
            model: p.model.as_deref().unwrap_or_default(),
            api,
            policy,
            headers,
            batch: p.batch_size.unwrap_or(batch),
            concurrency: p.concurrency.unwrap_or(concurrency),
            family: p.space.clone(),
            dimension: p.dimension,
        }),
        missing_key: missing_key.then(|| p.api_key_env.clone().unwrap_or_default()),
    })
}

/// An Ollama or OpenAI-compatible provider.
pub struct RemoteProvider {
    remote: Remote,
    /// The variable that should hold the API key, when it is empty.
    missing_key: Option<String>,
}

impl Provider for RemoteProvider {
    fn name(&self) -> &str {
        &self.remote.name
    }

    fn kind(&self) -> Kind {
        self.remote.api.kind()
    }

    fn describe(&self) -> String {
        self.remote.describe()
    }

    fn identity(&self) -> Result<Identity, super::Error> {
        if let Some(var) = &self.missing_key {
            return Err(anyhow::anyhow!(
                "no API key: set {var}, or api_key_env in [providers.{}]",
                self.remote.name
            )
            .into());
        }
        Ok(self.remote.identity()?)
    }

    fn embed(&self, inputs: &[Input], _sparse: bool) -> Result<Vec<Vector>, super::Error> {
        self.identity()?;
        Ok(self.remote.embed(inputs)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_syntax_error_never_shows_a_secret() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("config.toml");
        let text = "chain = [\"ark\"]\n\n[providers.ark]\nkind = \"openai\"\nurl = \"https://example.invalid/v1\"\napi_key = sk-LEAKME-123\n";
        std::fs::write(&path, text).unwrap();
        let err = format!("{:#}", Config::load(Some(&path), &[]).unwrap_err());
        assert!(!err.contains("LEAKME"), "{err}");
        assert!(err.contains("line 6") && err.contains("`api_key`"), "{err}");
        // Another line's error says where and what, without quoting the file.
        std::fs::write(&path, "chain = [\"local\"\n").unwrap();
        let err = format!("{:#}", Config::load(Some(&path), &[]).unwrap_err());
        assert!(
            err.contains("line 1, `chain`") && !err.contains("chain = "),
            "{err}"
        );
        assert!(is_secret_key("api_key") && is_secret_key("Token"));
        assert!(!is_secret_key("api_key_env") && !is_secret_key("url"));
    }
}
