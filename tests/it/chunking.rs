//! Chunking long messages into windows the model takes whole.

use crate::common::*;
use recall::index::chunk::{ChunkParams, MAX_CHUNKS_PER_MESSAGE, chunk};
use recall_engine::tokenize::TextTokenizer;

#[test]
fn long_text_becomes_overlapping_windows_that_fit() {
    let tokenizer =
        TextTokenizer::from_file(&tiny_model_dir().join("tokenizer.json"), 256).unwrap();
    let sentence =
        "The server ran out of disk space, 服务器磁盘空间不足, so we cleaned docker images 🚀. ";
    let text = sentence.repeat(40);
    let params = ChunkParams {
        window: 64,
        overlap: 8,
    };
    params.check(&tokenizer).unwrap();
    let chunks = chunk(&text, params, &tokenizer).unwrap();
    assert_eq!(chunks.skipped_bytes, 0);
    let chunks = chunks.pieces;
    assert!(chunks.len() > 5, "{} chunks", chunks.len());
    for c in &chunks {
        assert!(
            tokenizer.count(c).unwrap() <= 64,
            "chunk of {} tokens: {c:?}",
            tokenizer.count(c).unwrap()
        );
        assert!(text.contains(c.as_str()));
    }
    assert!(text.starts_with(chunks[0].as_str()));
    assert!(text.trim_end().ends_with(chunks.last().unwrap().trim_end()));
    // Consecutive windows overlap: each starts inside the previous one.
    let mut prev_start = 0;
    for pair in chunks.windows(2) {
        let start = text
            .match_indices(pair[1].as_str())
            .map(|(i, _)| i)
            .find(|&i| i > prev_start)
            .unwrap();
        assert!(start < prev_start + pair[0].len(), "windows do not overlap");
        prev_start = start;
    }
    // A message that fits stays whole.
    assert_eq!(
        chunk(sentence, params, &tokenizer).unwrap().pieces,
        vec![sentence.to_string()]
    );
    // A message far longer than its share stops at it; the rest is counted.
    let numbered: String = (0..5_000)
        .map(|i| format!("step {i}: {sentence}"))
        .collect();
    let capped = chunk(&numbered, params, &tokenizer).unwrap();
    assert_eq!(capped.pieces.len(), MAX_CHUNKS_PER_MESSAGE);
    let last = capped.pieces.last().unwrap();
    let end = numbered.find(last.as_str()).unwrap() + last.len();
    assert_eq!(capped.skipped_bytes, numbered.len() - end);
    // Parameters that leave no room are refused.
    assert!(
        ChunkParams {
            window: 64,
            overlap: 62
        }
        .check(&tokenizer)
        .is_err()
    );
    assert!(
        ChunkParams {
            window: 1000,
            overlap: 8
        }
        .check(&tokenizer)
        .is_err()
    );
}
