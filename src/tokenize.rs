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
}
