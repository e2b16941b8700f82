//! From token states to embeddings, as FlagEmbedding's `BGEM3FlagModel`
//! computes them: dense (pooled, normalised), sparse lexical weights and
//! ColBERT multi-vectors.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use candle_core::{Device, Tensor};
use candle_nn::{Linear, Module};

use crate::encoder::l2_normalize;
use crate::model::{Pooling, Weights};

/// BGE-M3's `colbert_linear` and `sparse_linear`.
pub struct M3Heads {
    colbert: Linear,
    colbert_dim: usize,
    sparse: Linear,
}

fn load_linear(path: &std::path::Path, out: usize, inp: usize, device: &Device) -> Result<Linear> {
    let weights = Weights::open(path)?;
    let weight = weights.get("weight", &[out, inp], device)?;
    let bias = weights.get("bias", &[out], device)?;
    Ok(Linear::new(weight, Some(bias)))
}

impl M3Heads {
    pub fn load(
        colbert: &std::path::Path,
        sparse: &std::path::Path,
        hidden: usize,
        device: &Device,
    ) -> Result<Self> {
        // FlagEmbedding's colbert_dim defaults to the hidden size; read the real one from the file.
        let colbert_dim = Weights::open(colbert)?
            .shape("weight")
            .and_then(|s| s.first().copied())
            .with_context(|| format!("{}: missing tensor `weight`", colbert.display()))?;
        Ok(Self {
            colbert: load_linear(colbert, colbert_dim, hidden, device)?,
            colbert_dim,
            sparse: load_linear(sparse, 1, hidden, device)?,
        })
    }

    pub fn colbert_dim(&self) -> usize {
        self.colbert_dim
    }

    /// `relu(sparse_linear(h))` for every packed token: `[total_tokens]`.
    pub fn token_weights(&self, hidden: &Tensor) -> Result<Vec<f32>> {
        Ok(self
            .sparse
            .forward(hidden)?
            .relu()?
            .flatten_all()?
            .to_vec1()?)
    }

    /// `normalize(colbert_linear(h))` for every packed token: `[total_tokens, colbert_dim]`.
    pub fn colbert_vectors(&self, hidden: &Tensor) -> Result<Tensor> {
        l2_normalize(&self.colbert.forward(hidden)?)
    }
}

/// The dense vector of each packed input: `[inputs, hidden]`.
pub fn pool(hidden: &Tensor, lens: &[usize], pooling: Pooling, normalize: bool) -> Result<Tensor> {
    let mut rows = Vec::with_capacity(lens.len());
    let mut offset = 0;
    for &len in lens {
        let tokens = hidden.narrow(0, offset, len)?;
        rows.push(match pooling {
            Pooling::Cls => tokens.get(0)?,
            Pooling::Mean => tokens.mean(0)?,
        });
        offset += len;
    }
    let pooled = Tensor::stack(&rows, 0)?;
    if normalize {
        l2_normalize(&pooled)
    } else {
        Ok(pooled)
    }
}

/// Lexical weights of one input: the max weight per token id, special
/// tokens and weights ≤ 0 dropped.
pub fn lexical_weights(
    ids: &[u32],
    weights: &[f32],
    is_special: impl Fn(u32) -> bool,
) -> BTreeMap<u32, f32> {
    let mut out = BTreeMap::new();
    for (&id, &w) in ids.iter().zip(weights) {
        if w > 0.0 && !is_special(id) {
            let slot = out.entry(id).or_insert(w);
            if w > *slot {
                *slot = w;
            }
        }
    }
    out
}
