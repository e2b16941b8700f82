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

/// Most chunks one message gives: Hermes does not cap a message's size, and
/// one pasted log or file of megabytes would otherwise cost more to embed
/// than the rest of a history. The rest of such a message is left out, and
/// counted (`recall stats`).
pub const MAX_CHUNKS_PER_MESSAGE: usize = 64;

/// Bytes of a message read per token of its chunks at most, so that the
/// tokenizer never reads megabytes to find the first chunks.
const HEAD_BYTES_PER_TOKEN: usize = 32;

/// A message's chunks, in order, and the bytes at its end they leave out.
#[derive(Debug, PartialEq)]
pub struct Chunks {
    pub pieces: Vec<String>,
    pub skipped_bytes: usize,
}

impl Chunks {
    /// `pieces`, which end at byte `end` of `text`.
    fn of(text: &str, pieces: Vec<String>, end: usize) -> Self {
        Self {
            pieces,
            skipped_bytes: text.len() - end,
        }
    }
}

/// The part of `text` that `MAX_CHUNKS_PER_MESSAGE` windows can reach.
fn head(text: &str, params: ChunkParams) -> &str {
    let bytes = MAX_CHUNKS_PER_MESSAGE
        .saturating_mul(params.window)
        .saturating_mul(HEAD_BYTES_PER_TOKEN);
    &text[..floor_boundary(text, bytes)]
}

/// The chunks of `text`, in order: at most `MAX_CHUNKS_PER_MESSAGE`.
pub fn chunk(text: &str, params: ChunkParams, tokenizer: &TextTokenizer) -> Result<Chunks> {
    let whole = text;
    let text = head(whole, params);
    let spans = tokenizer.spans(text)?;
    let content = params.window - tokenizer.added_tokens();
    if spans.len() <= content {
        return Ok(Chunks::of(whole, vec![text.to_string()], text.len()));
    }
    let mut chunks = Vec::new();
    let mut first = 0;
    loop {
        let mut last = (first + content).min(spans.len()) - 1;
        let start = floor_boundary(text, spans[first].0);
        // A piece of text can tokenise into more tokens than its span held
        // (a word cut in two, a prefix marker): shrink until it fits whole.
        let (piece, end) = loop {
            let end = ceil_boundary(text, spans[last].1);
            let piece = &text[start..end];
            let excess = tokenizer.count(piece)?.saturating_sub(params.window);
            if excess == 0 || last == first {
                break (piece, end);
            }
            last = last.saturating_sub(excess).max(first);
        };
        chunks.push(piece.to_string());
        if last + 1 >= spans.len() {
            // The head's last token: the head may end inside a word.
            return Ok(Chunks::of(whole, chunks, text.len()));
        }
        if chunks.len() == MAX_CHUNKS_PER_MESSAGE {
            return Ok(Chunks::of(whole, chunks, end));
        }
        // Step from where this window really ended, keeping the overlap.
        first = (last + 1).saturating_sub(params.overlap).max(first + 1);
    }
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

    pub fn chunk(&self, text: &str, params: ChunkParams) -> Result<Chunks> {
        match self {
            Chunker::Tokens(t) => chunk(text, params, t),
            Chunker::Estimate => Ok(chunk_estimated(text, params)),
        }
    }
}

/// Windows of at most `params.window` estimated tokens (two for the
/// special tokens), cut after whitespace where the window's last quarter has
/// some; at most `MAX_CHUNKS_PER_MESSAGE`.
fn chunk_estimated(text: &str, params: ChunkParams) -> Chunks {
    let whole = text;
    let text = head(whole, params);
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
        return Chunks::of(whole, vec![text.to_string()], text.len());
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
            return Chunks::of(whole, chunks, text.len());
        }
        if chunks.len() == MAX_CHUNKS_PER_MESSAGE {
            return Chunks::of(whole, chunks, to);
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
    Chunks::of(whole, chunks, text.len())
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
        assert_eq!(chunks.skipped_bytes, 0);
        let chunks = chunks.pieces;
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
        assert_eq!(chunk_estimated("short", params).pieces, ["short"]);
    }

    #[test]
    fn a_message_gives_at_most_its_share_of_chunks() {
        let params = ChunkParams {
            window: 40,
            overlap: 8,
        };
        let line = |i: usize| format!("Line {i} of the build log says the disk filled up. ");
        let text: String = (0..2_000).map(line).collect();
        let chunks = chunk_estimated(&text, params);
        assert_eq!(chunks.pieces.len(), MAX_CHUNKS_PER_MESSAGE);
        let covered = text.find(chunks.pieces.last().unwrap().as_str()).unwrap()
            + chunks.pieces.last().unwrap().len();
        assert!(covered < text.len());
        assert_eq!(chunks.skipped_bytes, text.len() - covered);
        // Megabytes of it: only the head is read, and the rest counted.
        let huge: String = (0..200_000).map(line).collect();
        let chunks = chunk_estimated(&huge, params);
        assert_eq!(chunks.pieces.len(), MAX_CHUNKS_PER_MESSAGE);
        assert!(chunks.skipped_bytes > huge.len() - head(&huge, params).len());
    }
}
