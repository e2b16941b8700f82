//! Encoder throughput on fixed batch × length shapes, for `recall bench`
//! and the criterion benches. Inputs are synthetic token ids of exactly the
//! asked length, so every run does the same work whatever the tokenizer.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::embedder::{Embedder, Outputs};
use crate::tokenize::Tokens;

/// `batch` inputs of `tokens` tokens each (special tokens included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub batch: usize,
    pub tokens: usize,
}

/// The shapes the issue tracker and README report: a search query, short
/// messages, long messages, one whole document.
pub const DEFAULT_SHAPES: [Shape; 4] = [
    Shape {
        batch: 1,
        tokens: 16,
    },
    Shape {
        batch: 8,
        tokens: 128,
    },
    Shape {
        batch: 4,
        tokens: 512,
    },
    Shape {
        batch: 1,
        tokens: 8192,
    },
];

impl FromStr for Shape {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        let (b, t) = s
            .split_once(['x', 'X', '×'])
            .with_context(|| format!("shape `{s}` is not BATCHxTOKENS, e.g. 8x128"))?;
        let batch: usize = b
            .trim()
            .parse()
            .with_context(|| format!("shape `{s}`: bad batch size"))?;
        let tokens: usize = t
            .trim()
            .parse()
            .with_context(|| format!("shape `{s}`: bad token count"))?;
        if batch == 0 || tokens < 2 {
            bail!("shape `{s}`: needs at least 1 input of 2 tokens");
        }
        Ok(Shape { batch, tokens })
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.batch, self.tokens)
    }
}

#[derive(Debug, Clone)]
pub struct ShapeResult {
    pub shape: Shape,
    pub median: Duration,
    pub best: Duration,
    pub runs: usize,
    /// Peak resident memory of the process while this shape ran, if the OS tells.
    pub peak_rss: Option<u64>,
}

impl ShapeResult {
    pub fn tokens_per_s(&self) -> f64 {
        (self.shape.batch * self.shape.tokens) as f64 / self.median.as_secs_f64()
    }
    pub fn texts_per_s(&self) -> f64 {
        self.shape.batch as f64 / self.median.as_secs_f64()
    }
}

/// Inputs of exactly `shape`: `<s>`, deterministic ordinary token ids, `</s>`.
pub fn synthetic_inputs(embedder: &Embedder, shape: Shape) -> Result<Vec<Tokens>> {
    let vocab_size = embedder.info().vocab_size;
    let max = embedder.info().max_length;
    if shape.tokens > max {
        bail!(
            "shape {shape} needs inputs of {} tokens; the model takes at most {max}",
            shape.tokens
        );
    }
    let wrapper = embedder.tokenizer().encode("")?.ids;
    let (open, close) = match wrapper.as_slice() {
        [open, close] => (*open, *close),
        other => bail!("the tokenizer wraps an empty text as {other:?}, not as two special tokens"),
    };
    let mut state = 0x2545_f491_u64;
    let mut next_id = || loop {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let id = ((state >> 33) % vocab_size as u64) as u32;
        if !embedder.tokenizer().is_special(id) && id != open && id != close {
            return id;
        }
    };
    Ok((0..shape.batch)
        .map(|_| {
            let mut ids = Vec::with_capacity(shape.tokens);
            ids.push(open);
            ids.extend((0..shape.tokens - 2).map(|_| next_id()));
            ids.push(close);
            Tokens {
                ids,
                truncated: false,
            }
        })
        .collect())
}

/// Times `runs` passes of each shape after one warm-up pass.
pub fn run(
    embedder: &Embedder,
    shapes: &[Shape],
    runs: usize,
    outputs: Outputs,
    mut progress: impl FnMut(&ShapeResult),
) -> Result<Vec<ShapeResult>> {
    let mut results = Vec::with_capacity(shapes.len());
    for &shape in shapes {
        let inputs = synthetic_inputs(embedder, shape)?;
        reset_peak_rss();
        embedder.embed_tokens(&inputs, outputs)?;
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs.max(1) {
            let started = Instant::now();
            let out = embedder.embed_tokens(&inputs, outputs)?;
            times.push(started.elapsed());
            std::hint::black_box(out);
        }
        times.sort();
        let result = ShapeResult {
            shape,
            median: times[times.len() / 2],
            best: times[0],
            runs: times.len(),
            peak_rss: peak_rss(),
        };
        progress(&result);
        results.push(result);
    }
    Ok(results)
}

/// Resets the kernel's high-water mark of resident memory (Linux).
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Peak resident memory since the last reset, in bytes (Linux).
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse() {
        assert_eq!(
            "8x128".parse::<Shape>().unwrap(),
            Shape {
                batch: 8,
                tokens: 128
            }
        );
        assert_eq!(
            "1×16".parse::<Shape>().unwrap(),
            Shape {
                batch: 1,
                tokens: 16
            }
        );
        assert!("8".parse::<Shape>().is_err());
        assert!("0x5".parse::<Shape>().is_err());
    }
}
