//! Splitting a message into chunks the model takes whole: a message that
//! fits is one chunk; a longer one becomes overlapping windows measured in
//! model tokens, cut only at token (so character) boundaries.

use anyhow::{Result, bail};

use crate::tokenize::TextTokenizer;

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
