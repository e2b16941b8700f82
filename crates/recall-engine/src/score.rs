//! BGE-M3's relevance scores between two embeddings, as FlagEmbedding defines them.

use std::collections::BTreeMap;

/// Dot product; the cosine for normalised dense vectors.
pub fn dense(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Lexical matching score: Σ over shared token ids of wa·wb.
pub fn lexical(a: &BTreeMap<u32, f32>, b: &BTreeMap<u32, f32>) -> f32 {
    let (small, large) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    small
        .iter()
        .filter_map(|(id, wa)| large.get(id).map(|wb| wa * wb))
        .sum()
}

/// ColBERT late-interaction score: the mean over query vectors of the best
/// dot product with any passage vector.
pub fn colbert(query: &[Vec<f32>], passage: &[Vec<f32>]) -> f32 {
    if query.is_empty() || passage.is_empty() {
        return 0.0;
    }
    let total: f32 = query
        .iter()
        .map(|q| {
            passage
                .iter()
                .map(|p| dense(q, p))
                .fold(f32::NEG_INFINITY, f32::max)
        })
        .sum();
    total / query.len() as f32
}

/// Weights of the three scores in a combined score.
#[derive(Debug, Clone, Copy)]
pub struct Weights {
    pub dense: f32,
    pub sparse: f32,
    pub colbert: f32,
}

impl Default for Weights {
    /// FlagEmbedding's `compute_score` default: [1, 1, 1].
    fn default() -> Self {
        Self {
            dense: 1.0,
            sparse: 1.0,
            colbert: 1.0,
        }
    }
}

/// `(w0·dense + w1·sparse + w2·colbert) / (w0 + w1 + w2)`; absent scores count neither value nor weight.
pub fn combined(dense: Option<f32>, sparse: Option<f32>, colbert: Option<f32>, w: Weights) -> f32 {
    let parts = [(dense, w.dense), (sparse, w.sparse), (colbert, w.colbert)];
    let (sum, weight) = parts
        .iter()
        .filter_map(|(s, w)| s.map(|s| (s * w, *w)))
        .fold((0.0, 0.0), |(a, b), (s, w)| (a + s, b + w));
    if weight == 0.0 { 0.0 } else { sum / weight }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexical_sums_shared_ids_only() {
        let a = BTreeMap::from([(5, 0.5), (7, 0.25)]);
        let b = BTreeMap::from([(7, 2.0), (9, 1.0)]);
        assert_eq!(lexical(&a, &b), 0.5);
        assert_eq!(lexical(&a, &BTreeMap::new()), 0.0);
    }

    #[test]
    fn colbert_is_mean_of_max() {
        let q = vec![vec![1.0, 0.0], vec![0.0, 1.0]];
        let p = vec![vec![1.0, 0.0], vec![0.6, 0.8]];
        assert!((colbert(&q, &p) - (1.0 + 0.8) / 2.0).abs() < 1e-6);
    }

    #[test]
    fn combined_weights_present_scores() {
        let w = Weights {
            dense: 0.4,
            sparse: 0.2,
            colbert: 0.4,
        };
        assert!((combined(Some(1.0), Some(0.5), Some(0.0), w) - 0.5).abs() < 1e-6);
        assert!((combined(Some(1.0), None, None, w) - 1.0).abs() < 1e-6);
    }
}
