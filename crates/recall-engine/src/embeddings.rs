//! The word-embedding table, read in the weights file's map where it can.

use anyhow::Result;
use candle_core::{Device, Tensor};

use crate::model::weights::{MappedF32, Weights};

/// The word-embedding table. BGE-M3's is 1 GB (250,002 tokens × 1024), of
/// which an input reads a few rows, so it stays in the weights file's map
/// where it can: the pages read are the page cache's, shared and
/// reclaimable, rather than a copy in the process's own memory that it
/// first has to fault in and fill (a third of BGE-M3's start-up).
pub(crate) enum WordEmbeddings {
    Mapped { table: MappedF32, hidden: usize },
    Tensor(Tensor),
}

pub(crate) const WORD_EMBEDDINGS: &str = "embeddings.word_embeddings.weight";

impl WordEmbeddings {
    pub(crate) fn load(
        weights: &Weights,
        vocab: usize,
        hidden: usize,
        dev: &Device,
    ) -> Result<Self> {
        let shape = [vocab, hidden];
        Ok(match weights.mapped_f32(WORD_EMBEDDINGS, &shape)? {
            Some(table) => Self::Mapped { table, hidden },
            None => Self::Tensor(weights.get(WORD_EMBEDDINGS, &shape, dev)?),
        })
    }

    /// The rows of `ids` (inside the vocabulary), `[ids.len(), hidden]` on
    /// `dev`.
    pub(crate) fn rows(&self, ids: Vec<u32>, dev: &Device) -> Result<Tensor> {
        let n = ids.len();
        Ok(match self {
            Self::Mapped { table, hidden } => {
                let table = table.data();
                let mut rows = Vec::with_capacity(n * hidden);
                for id in ids {
                    rows.extend_from_slice(&table[id as usize * hidden..][..*hidden]);
                }
                Tensor::from_vec(rows, (n, *hidden), dev)?
            }
            Self::Tensor(table) => table.index_select(&Tensor::from_vec(ids, n, dev)?, 0)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_embeddings_read_in_the_map_are_the_tensor_rows() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/tiny-bge-m3/model.safetensors");
        let mut weights = Weights::open(&path).unwrap();
        weights.detect_prefix(WORD_EMBEDDINGS).unwrap();
        let [vocab, hidden] = weights.shape(WORD_EMBEDDINGS).unwrap()[..] else {
            panic!("not a table")
        };
        let cpu = Device::Cpu;
        let mapped = WordEmbeddings::load(&weights, vocab, hidden, &cpu).unwrap();
        assert!(matches!(mapped, WordEmbeddings::Mapped { .. }));
        let table = weights
            .get(WORD_EMBEDDINGS, &[vocab, hidden], &cpu)
            .unwrap();
        let copied = WordEmbeddings::Tensor(table);
        let ids = vec![0, 5, vocab as u32 - 1, 5];
        let rows = |e: &WordEmbeddings| e.rows(ids.clone(), &cpu).unwrap();
        assert_eq!(rows(&mapped).dims(), [4, hidden]);
        assert_eq!(
            rows(&mapped).to_vec2::<f32>().unwrap(),
            rows(&copied).to_vec2::<f32>().unwrap()
        );
    }
}
