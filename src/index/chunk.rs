//! Splitting a message into chunks the model takes whole: a message that
//! fits is one chunk; a longer one becomes overlapping windows measured in
//! model tokens, cut only at token (so character) boundaries.

use anyhow::{Result, bail};

use recall_engine::tokenize::TextTokenizer;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkParams {
    /// Tokens per window, special tokens included.
    pub window: usize,
    /// Tokens shared by consecutive windows.
    pub overlap: usize,
}

impl Default for ChunkParams {
    fn default() -> Self {
        Self {
            window: 512,
            overlap: 64,
        }
    }
}

impl ChunkParams {
    pub fn check(&self, tokenizer: &TextTokenizer) -> Result<()> {
        let content = self.window.saturating_sub(tokenizer.added_tokens());
        if content == 0 {
            bail!("--chunk-tokens {} leaves no room for text", self.window);
        }
        if self.overlap >= content {
            bail!(
                "--chunk-overlap {} must be smaller than the window's {content} text tokens",
                self.overlap
            );
        }
        if self.window > tokenizer.max_length() {
            bail!(
                "--chunk-tokens {} is more than the model's limit of {}",
                self.window,
                tokenizer.max_length()
            );
        }
        Ok(())
    }
}

/// The chunks of `text`, in order.
pub fn chunk(text: &str, params: ChunkParams, tokenizer: &TextTokenizer) -> Result<Vec<String>> {
    let spans = tokenizer.spans(text)?;
    let content = params.window - tokenizer.added_tokens();
    if spans.len() <= content {
        return Ok(vec![text.to_string()]);
    }
    let mut chunks = Vec::new();
    let mut first = 0;
    loop {
        let mut last = (first + content).min(spans.len()) - 1;
        let start = floor_boundary(text, spans[first].0);
        // A piece of text can tokenise into more tokens than its span held
        // (a word cut in two, a prefix marker): shrink until it fits whole.
        let piece = loop {
            let piece = &text[start..ceil_boundary(text, spans[last].1)];
            let excess = tokenizer.count(piece)?.saturating_sub(params.window);
            if excess == 0 || last == first {
                break piece;
            }
            last = last.saturating_sub(excess).max(first);
        };
        chunks.push(piece.to_string());
        if last + 1 >= spans.len() {
            break;
        }
        // Step from where this window really ended, keeping the overlap.
        first = (last + 1).saturating_sub(params.overlap).max(first + 1);
    }
    Ok(chunks)
}

fn floor_boundary(text: &str, mut i: usize) -> usize {
    i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_boundary(text: &str, mut i: usize) -> usize {
    i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// How chunks are measured: in the model's own tokens when recall has its
/// tokenizer (always, with the local engine in the chain), else by an
/// estimate that over-counts (`tokenize::estimate_tokens`).
#[derive(Clone, Copy)]
pub enum Chunker<'a> {
    Tokens(&'a TextTokenizer),
    Estimate,
}

impl Chunker<'_> {
    pub fn check(&self, params: ChunkParams) -> Result<()> {
        match self {
            Chunker::Tokens(t) => params.check(t),
            Chunker::Estimate => {
                if params.overlap >= params.window.saturating_sub(2) {
                    bail!(
                        "--chunk-overlap {} must be smaller than --chunk-tokens {} less 2",
                        params.overlap,
                        params.window
                    );
                }
                Ok(())
            }
        }
    }

    pub fn chunk(&self, text: &str, params: ChunkParams) -> Result<Vec<String>> {
        match self {
            Chunker::Tokens(t) => chunk(text, params, t),
            Chunker::Estimate => Ok(chunk_estimated(text, params)),
        }
    }
}

/// Windows of at most `params.window` estimated tokens (two for the
/// special tokens), cut after whitespace where the window's last quarter has some.
fn chunk_estimated(text: &str, params: ChunkParams) -> Vec<String> {
    // Costs in thirds of a token: CJK 3, other visible characters 1.
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let cost = |c: char| -> usize {
        if recall_engine::tokenize::is_cjk(c) {
            3
        } else if c.is_whitespace() {
            0
        } else {
            1
        }
    };
    let budget = params.window.saturating_sub(2).max(1) * 3;
    let total: usize = chars.iter().map(|&(_, c)| cost(c)).sum();
    if total <= budget {
        return vec![text.to_string()];
    }
    let mut chunks = Vec::new();
    let mut first = 0;
    while first < chars.len() {
        let mut spent = 0;
        let mut end = first;
        while end < chars.len() && spent + cost(chars[end].1) <= budget {
            spent += cost(chars[end].1);
            end += 1;
        }
        if end == first {
            end = first + 1;
        }
        if end < chars.len() {
            let floor = first + (end - first) * 3 / 4;
            if let Some(ws) = (floor..end).rev().find(|&i| chars[i].1.is_whitespace()) {
                end = ws + 1;
            }
        }
        let from = chars[first].0;
        let to = chars.get(end).map_or(text.len(), |c| c.0);
        chunks.push(text[from..to].to_string());
        if end >= chars.len() {
            break;
        }
        // Step back by the overlap.
        let mut back = end;
        let mut kept = 0;
        while back > first + 1 && kept + cost(chars[back - 1].1) <= params.overlap * 3 {
            kept += cost(chars[back - 1].1);
            back -= 1;
        }
        first = back.max(first + 1);
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimated_chunks_fit_and_cover_the_text() {
        let params = ChunkParams {
            window: 40,
            overlap: 8,
        };
        let text = "The disk on the build server filled up again. ".repeat(20)
            + &"磁盘空间不足".repeat(30);
        let chunks = chunk_estimated(&text, params);
        assert!(chunks.len() > 3);
        for c in &chunks {
            assert!(
                recall_engine::tokenize::estimate_tokens(c) <= params.window + 1,
                "{c:?}"
            );
        }
        assert!(text.starts_with(&chunks[0]));
        assert!(text.ends_with(chunks.last().unwrap().as_str()));
        // Consecutive windows overlap, so no text falls between them.
        for w in chunks.windows(2) {
            let tail: String = w[0]
                .chars()
                .rev()
                .take(3)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            assert!(w[1].contains(tail.trim()), "{:?} / {:?}", w[0], w[1]);
        }
        assert_eq!(chunk_estimated("short", params), vec!["short".to_string()]);
    }
}
