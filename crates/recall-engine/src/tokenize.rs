//! Text to token ids with the model's own `tokenizer.json`, special tokens
//! added, cut at an explicit maximum length that is always reported.

use std::collections::HashSet;
use std::path::Path;

use anyhow::{Result, anyhow};
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

/// One tokenised input.
#[derive(Debug, Clone)]
pub struct Tokens {
    pub ids: Vec<u32>,
    /// The input was longer than the maximum length and was cut.
    pub truncated: bool,
}

pub struct TextTokenizer {
    inner: Tokenizer,
    /// The same tokenizer without truncation or special tokens, for chunking.
    plain: Tokenizer,
    /// Special tokens the model adds around one input (`<s>`, `</s>`).
    added: usize,
    max_length: usize,
    /// `<s>`, `</s>`, `<pad>`, `<unk>` (or `[CLS]`, `[SEP]`, `[PAD]`, `[UNK]`):
    /// never carry lexical weight.
    special_ids: HashSet<u32>,
}

impl TextTokenizer {
    pub fn from_file(path: &Path, max_length: usize) -> Result<Self> {
        let mut inner = Tokenizer::from_file(path)
            .map_err(|e| anyhow!("{}: not a valid tokenizer.json: {e}", path.display()))?;
        // recall packs batches itself: padding is never wanted, and the file's own truncation is replaced.
        inner.with_padding(None);
        let mut plain = inner.clone();
        plain
            .with_truncation(None)
            .map_err(|e| anyhow!("cannot turn truncation off: {e}"))?;
        let added = inner.get_post_processor().map_or(0, |p| {
            use tokenizers::PostProcessor;
            p.added_tokens(false)
        });
        inner
            .with_truncation(Some(TruncationParams {
                max_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                direction: TruncationDirection::Right,
            }))
            .map_err(|e| anyhow!("cannot set truncation to {max_length}: {e}"))?;
        let special_ids = [
            "<s>", "</s>", "<pad>", "<unk>", "[CLS]", "[SEP]", "[PAD]", "[UNK]",
        ]
        .iter()
        .filter_map(|t| inner.token_to_id(t))
        .collect();
        Ok(Self {
            inner,
            plain,
            added,
            max_length,
            special_ids,
        })
    }

    pub fn max_length(&self) -> usize {
        self.max_length
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    pub fn token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn encode(&self, text: &str) -> Result<Tokens> {
        let encoding = self
            .inner
            .encode(text, true)
            .map_err(|e| anyhow!("cannot tokenise input: {e}"))?;
        let truncated = !encoding.get_overflowing().is_empty();
        Ok(Tokens {
            ids: encoding.get_ids().to_vec(),
            truncated,
        })
    }

    /// Special tokens added around every input.
    pub fn added_tokens(&self) -> usize {
        self.added
    }

    /// Byte spans of the tokens of `text`, without special tokens or truncation.
    pub fn spans(&self, text: &str) -> Result<Vec<(usize, usize)>> {
        let encoding = self
            .plain
            .encode(text, false)
            .map_err(|e| anyhow!("cannot tokenise input: {e}"))?;
        Ok(encoding.get_offsets().to_vec())
    }

    /// Tokens the model would see for `text`, special tokens included, uncut.
    pub fn count(&self, text: &str) -> Result<usize> {
        Ok(self.spans(text)?.len() + self.added)
    }
}

/// A rough token count for providers whose tokenizer recall lacks: CJK
/// characters count one each, other text one per three characters (more
/// than real tokenizers give, so chunks stay under the window).
pub fn estimate_tokens(text: &str) -> usize {
    let mut tokens = 0usize;
    let mut other = 0usize;
    for c in text.chars() {
        if is_cjk(c) {
            tokens += 1;
        } else if !c.is_whitespace() {
            other += 1;
        }
    }
    tokens + other.div_ceil(3) + 2
}

/// Whether `c` is a CJK character (Hangul, CJK ideographs and symbols,
/// full-width forms), which tokenizers count about one token each.
pub fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x1100..=0x11FF | 0x2E80..=0x9FFF | 0xA960..=0xA97F | 0xAC00..=0xD7FF
        | 0xF900..=0xFAFF | 0xFF00..=0xFFEF | 0x20000..=0x3FFFF)
}
