//! Whether recall's own output is coloured: `--color`, then the
//! conventions (`NO_COLOR`, `TERM=dumb`, not a terminal).

use std::io::IsTerminal;
use std::sync::OnceLock;

/// `--color`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorWhen {
    /// When writing to a terminal, unless NO_COLOR is set or TERM=dumb.
    Auto,
    /// Even when writing to a file or a pipe.
    Always,
    /// Never.
    Never,
}

static WHEN: OnceLock<ColorWhen> = OnceLock::new();

pub fn init(when: ColorWhen) {
    let _ = WHEN.set(when);
}

fn colour(terminal: bool) -> bool {
    decide(
        WHEN.get().copied().unwrap_or(ColorWhen::Auto),
        terminal,
        recall::env::NO_COLOR.get().as_deref(),
        recall::env::TERM.get().as_deref(),
    )
}

/// The rule: `--color always/never` wins; `auto` colours a terminal unless
/// NO_COLOR is set to anything but the empty string (no-color.org) or TERM=dumb.
fn decide(
    when: ColorWhen,
    terminal: bool,
    no_color: Option<&std::ffi::OsStr>,
    term: Option<&std::ffi::OsStr>,
) -> bool {
    match when {
        ColorWhen::Always => true,
        ColorWhen::Never => false,
        ColorWhen::Auto => {
            terminal && no_color.is_none_or(|v| v.is_empty()) && term.is_none_or(|t| t != "dumb")
        }
    }
}

/// Whether standard output is coloured.
pub fn stdout() -> bool {
    colour(std::io::stdout().is_terminal())
}

/// Whether standard error is coloured.
pub fn stderr() -> bool {
    colour(std::io::stderr().is_terminal())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn conventions() {
        let xterm = Some(OsStr::new("xterm-256color"));
        let set = Some(OsStr::new("1"));
        assert!(decide(ColorWhen::Auto, true, None, xterm));
        assert!(decide(ColorWhen::Auto, true, None, None));
        // Not a terminal, NO_COLOR set, TERM=dumb: plain text.
        assert!(!decide(ColorWhen::Auto, false, None, xterm));
        assert!(!decide(ColorWhen::Auto, true, set, xterm));
        assert!(!decide(
            ColorWhen::Auto,
            true,
            None,
            Some(OsStr::new("dumb"))
        ));
        // NO_COLOR= (empty) is not set, by the convention.
        assert!(decide(ColorWhen::Auto, true, Some(OsStr::new("")), xterm));
        // An explicit --color wins over everything.
        assert!(decide(
            ColorWhen::Always,
            false,
            set,
            Some(OsStr::new("dumb"))
        ));
        assert!(!decide(ColorWhen::Never, true, None, xterm));
    }
}
