//! A query's words for the word index: runs of letters and digits,
//! lowercased, without English function words and without CJK (the trigram
//! index finds CJK text; the word tokenizer would take a whole CJK run as
//! one word). Stemming is the index's own (FTS5's porter tokenizer), applied
//! to these words when they are matched.

/// Words that say nothing about what a question is about. Without them, a
/// question's `OR` of words matches the passages sharing its content words,
/// not every passage holding "the" or "did"; IDF alone ranks them lower but
/// still lets them in (measured on the dev conversations: docs/search.md).
/// Sorted, for a binary search.
const STOP_WORDS: &[&str] = &[
    "a",
    "about",
    "above",
    "after",
    "again",
    "against",
    "all",
    "am",
    "an",
    "and",
    "any",
    "are",
    "as",
    "at",
    "be",
    "because",
    "been",
    "before",
    "being",
    "below",
    "between",
    "both",
    "but",
    "by",
    "can",
    "could",
    "did",
    "do",
    "does",
    "doing",
    "down",
    "during",
    "each",
    "few",
    "for",
    "from",
    "further",
    "had",
    "has",
    "have",
    "having",
    "he",
    "her",
    "here",
    "hers",
    "herself",
    "him",
    "himself",
    "his",
    "how",
    "i",
    "if",
    "in",
    "into",
    "is",
    "it",
    "its",
    "itself",
    "just",
    "me",
    "more",
    "most",
    "my",
    "myself",
    "no",
    "nor",
    "not",
    "now",
    "of",
    "off",
    "on",
    "once",
    "only",
    "or",
    "other",
    "our",
    "ours",
    "ourselves",
    "out",
    "over",
    "own",
    "same",
    "she",
    "should",
    "so",
    "some",
    "such",
    "than",
    "that",
    "the",
    "their",
    "theirs",
    "them",
    "themselves",
    "then",
    "there",
    "these",
    "they",
    "this",
    "those",
    "through",
    "to",
    "too",
    "under",
    "until",
    "up",
    "very",
    "was",
    "we",
    "were",
    "what",
    "when",
    "where",
    "which",
    "while",
    "who",
    "whom",
    "why",
    "will",
    "with",
    "would",
    "you",
    "your",
    "yours",
    "yourself",
    "yourselves",
];

/// The distinct words of `query` worth matching, in order of appearance.
pub fn query_words(query: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for word in query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        if word.chars().any(recall_engine::tokenize::is_cjk) {
            continue;
        }
        let word = word.to_lowercase();
        if word.chars().count() < 2 || STOP_WORDS.binary_search(&word.as_str()).is_ok() {
            continue;
        }
        if !out.contains(&word) {
            out.push(word);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_words_are_sorted() {
        assert!(STOP_WORDS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_question_keeps_its_content_words() {
        assert_eq!(
            query_words("When did Priya go to the pottery class?"),
            ["priya", "go", "pottery", "class"]
        );
        assert_eq!(
            query_words("nginx -t: \"unexpected\" end-of-file"),
            ["nginx", "unexpected", "end", "file"]
        );
        assert_eq!(query_words("Café über 服务器 磁盘"), ["café", "über"]);
        assert!(query_words("what is it?").is_empty());
    }
}
