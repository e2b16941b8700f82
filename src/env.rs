//! Every environment variable recall reads, declared once with what it sets,
//! and the only place that reads them (the engine's own are in
//! `recall_engine::env`).
//!
//! `recall --help`'s list and the README's table are generated from [`all`]:
//! a test fails when the README's differs, so a new variable cannot go
//! undocumented.

use std::path::PathBuf;

pub use recall_engine::env::{CACHE_DIR, HOME, PACK_CACHE, Var, named};

/// The model directory.
pub const MODEL: Var = Var {
    name: "RECALL_MODEL",
    doc: "the model directory (as `--model`)",
};
/// The encoder's weights' type.
pub const DTYPE: Var = Var {
    name: "RECALL_DTYPE",
    doc: "`f32`, `bf16` or `q8` (as `--dtype`)",
};
/// The providers' configuration file.
pub const CONFIG: Var = Var {
    name: "RECALL_CONFIG",
    doc: "the embedding providers' `config.toml` (as `--config`)",
};
/// The provider chain.
pub const PROVIDERS: Var = Var {
    name: "RECALL_PROVIDERS",
    doc: "the provider chain, comma-separated (as `--provider`)",
};
/// The key `recall serve` requires.
pub const API_KEY: Var = Var {
    name: "RECALL_API_KEY",
    doc: "the key `recall serve` requires (as `--api-key`)",
};
/// The log filter.
pub const LOG: Var = Var {
    name: "RECALL_LOG",
    doc: "log filter on standard error (`debug`, `recall=trace`); beats `-q`/`-v`",
};
/// Hermes's home.
pub const HERMES_HOME: Var = Var {
    name: "HERMES_HOME",
    doc: "Hermes's home (default `~/.hermes`)",
};
/// Where Ollama's server is, Ollama's own variable.
pub const OLLAMA_HOST: Var = Var {
    name: "OLLAMA_HOST",
    doc: "the ollama provider's address (default `http://127.0.0.1:11434`)",
};
/// The built-in ark provider's key.
pub const ARK_API_KEY: Var = Var {
    name: "ARK_API_KEY",
    doc: "the key of the built-in ark provider (Volcano Ark)",
};
/// The built-in openai provider's key.
pub const OPENAI_API_KEY: Var = Var {
    name: "OPENAI_API_KEY",
    doc: "the key of the built-in openai provider",
};
/// The Hugging Face home.
pub const HF_HOME: Var = Var {
    name: "HF_HOME",
    doc: "the Hugging Face home: its `hub` cache and `token` (default `~/.cache/huggingface`)",
};
/// The Hugging Face hub cache.
pub const HF_HUB_CACHE: Var = Var {
    name: "HF_HUB_CACHE",
    doc: "the Hugging Face hub cache, where models are found and downloaded (default `$HF_HOME/hub`)",
};
/// A Hugging Face mirror.
pub const HF_ENDPOINT: Var = Var {
    name: "HF_ENDPOINT",
    doc: "a Hugging Face mirror to download from (default `https://huggingface.co`)",
};
/// The Hugging Face token.
pub const HF_TOKEN: Var = Var {
    name: "HF_TOKEN",
    doc: "the Hugging Face token (default: the `token` file in `$HF_HOME`)",
};
/// Hugging Face's offline mode.
pub const HF_HUB_OFFLINE: Var = Var {
    name: "HF_HUB_OFFLINE",
    doc: "`1`: never download; use what is in the cache",
};
/// Where configuration goes.
pub const XDG_CONFIG_HOME: Var = Var {
    name: "XDG_CONFIG_HOME",
    doc: "where configuration goes: recall's `config.toml`, the systemd unit (default `~/.config`)",
};
/// No colour, <https://no-color.org>.
pub const NO_COLOR: Var = Var {
    name: "NO_COLOR",
    doc: "no colour when set (see `--color`)",
};
/// The terminal's type.
pub const TERM: Var = Var {
    name: "TERM",
    doc: "no colour when `dumb` (see `--color`)",
};
/// The directories searched for programs.
pub const PATH: Var = Var {
    name: "PATH",
    doc: "where `recall hermes install` looks for the `hermes` command",
};

/// Every variable recall reads, the engine's among them, in the order the
/// documentation lists them.
pub fn all() -> Vec<Var> {
    use recall_engine::env as engine;
    let mut vars = vec![MODEL, DTYPE, engine::CACHE_DIR, engine::PACK_CACHE];
    vars.extend([CONFIG, PROVIDERS, API_KEY, LOG]);
    vars.extend([engine::MATMUL, engine::Q8, engine::BF16]);
    vars.extend([HERMES_HOME, OLLAMA_HOST, ARK_API_KEY, OPENAI_API_KEY]);
    vars.extend([HF_HOME, HF_HUB_CACHE, HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE]);
    vars.extend([XDG_CONFIG_HOME, engine::XDG_CACHE_HOME, HOME, PATH]);
    vars.extend([NO_COLOR, TERM]);
    vars
}

/// The directories in `PATH`.
pub fn path_dirs() -> Vec<PathBuf> {
    PATH.get()
        .map(|paths| std::env::split_paths(&paths).collect())
        .unwrap_or_default()
}

/// Where the user's configuration goes: `$XDG_CONFIG_HOME`, else `~/.config`.
pub fn config_home() -> Option<PathBuf> {
    XDG_CONFIG_HOME
        .get()
        .map(PathBuf::from)
        .or_else(|| HOME.get().map(|h| PathBuf::from(h).join(".config")))
}

/// `recall --help`'s list of the variables, aligned.
pub fn help() -> String {
    let vars = all();
    let width = vars.iter().map(|v| v.name.len()).max().unwrap_or(0);
    let mut out = String::from("Environment:\n");
    for v in &vars {
        out.push_str(&format!(
            "  {:width$}  {}\n",
            v.name,
            v.doc.replace('`', "")
        ));
    }
    out
}

/// The README's table of the variables (Markdown).
pub fn markdown_table() -> String {
    let mut out = String::from("| variable | what it sets |\n|---|---|\n");
    for v in all() {
        out.push_str(&format!("| `{}` | {} |\n", v.name, v.doc));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const README_START: &str = "<!-- environment: generated from src/env.rs -->\n";
    const README_END: &str = "<!-- end of environment -->";

    /// The README's table is `markdown_table()`. When it is not, the test
    /// writes the right one and fails, so that running it once more passes
    /// and the change shows in `git diff` (as rust-analyzer's generated
    /// docs do).
    #[test]
    fn readme_lists_every_variable() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
        let readme = std::fs::read_to_string(&path).unwrap();
        let start = readme
            .find(README_START)
            .expect("README's environment marker")
            + README_START.len();
        let end = start
            + readme[start..]
                .find(README_END)
                .expect("README's end marker");
        let want = markdown_table();
        if readme[start..end] != want {
            let fixed = format!("{}{want}{}", &readme[..start], &readme[end..]);
            std::fs::write(&path, fixed).unwrap();
            panic!("README.md's environment table was out of date: rewritten; run the test again");
        }
    }

    #[test]
    fn names_are_unique() {
        let vars = all();
        let mut names: Vec<_> = vars.iter().map(|v| v.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), vars.len());
    }

    /// Every variable declared in either home is in `all()`, so none goes
    /// unlisted in `--help` and the README.
    #[test]
    fn every_declared_variable_is_listed() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let listed: Vec<&str> = all().iter().map(|v| v.name).collect();
        for home in ["src/env.rs", "crates/recall-engine/src/env.rs"] {
            let text = std::fs::read_to_string(root.join(home)).unwrap();
            let declared: Vec<&str> = text
                .lines()
                .filter_map(|l| l.trim().strip_prefix("name: \""))
                .filter_map(|l| l.strip_suffix("\","))
                .collect();
            assert!(!declared.is_empty(), "no declarations found in {home}");
            for name in declared {
                assert!(
                    listed.contains(&name),
                    "{name} ({home}) is not in env::all()"
                );
            }
        }
    }

    /// Nothing outside the two declared homes reads the environment, so the
    /// lists above are complete.
    #[test]
    fn no_variable_is_read_elsewhere() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let homes = [
            root.join("src/env.rs"),
            root.join("crates/recall-engine/src/env.rs"),
        ];
        let mut found = Vec::new();
        let mut dirs = vec![root.join("src"), root.join("crates/recall-engine/src")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") && !homes.contains(&path) {
                    let text = std::fs::read_to_string(&path).unwrap();
                    for (n, line) in text.lines().enumerate() {
                        if ["env::var(", "env::var_os(", "env::vars(", "try_from_env("]
                            .iter()
                            .any(|call| line.contains(call))
                        {
                            found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                        }
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "read the environment through src/env.rs:\n{}",
            found.join("\n")
        );
    }
}
