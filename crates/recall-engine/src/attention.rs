//! Scaled dot-product attention on the CPU, for inputs packed end to end
//! (no padding), through recall's own kernels: the f32 panel kernel
//! (`matmul::PackedLinear`, on CPUs with AVX2 and FMA) or, for `--dtype q8`,
//! the int8 kernels (`quant`) for the scores.
//!
//! Per input and head (in parallel), the keys are packed as a linear
//! layer's weight (`Q · Kᵀ` is then that layer applied to the queries) and
//! the values as one whose transpose is `V` (`P · V`). Only the softmax runs
//! between the two products, in place on the scores; a query block keeps at
//! most `MAX_SCORES` of them, so long inputs stay in cache. The q/k/v split
//! is one gather per head, not candle's narrow/transpose/contiguous copies.

use candle_core::{Device, Tensor};
use rayon::prelude::*;

use crate::kernels::bf16::Bf16Linear;
use crate::kernels::matmul::{Dst, PackedLinear, packed_available};
use crate::kernels::quant::QLinear;

/// Scores per query block: 1 MiB, so the block is still in L2 when the
/// softmax and `P · V` read it back (docs/benchmarks.md, "Choices").
const MAX_SCORES: usize = 256 << 10;

/// How `Q · Kᵀ` is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scores {
    /// f32, the panel kernel: needs `packed_available()`.
    F32,
    /// Keys quantised per key, queries per row: the int8 kernels. `P · V`
    /// stays f32: quantising the probabilities too is faster on long inputs
    /// but costs more fidelity than q8's bar allows (docs/benchmarks.md,
    /// "Choices").
    Q8,
    /// Keys and values in bf16 (`crate::kernels::bf16`), sums in f32.
    Bf16,
}

enum Keys {
    F32(PackedLinear),
    Q8(QLinear),
    Bf16(Bf16Linear),
}

enum Values {
    Packed(PackedLinear),
    Bf16(Bf16Linear),
    /// CPUs without AVX2 and FMA (q8 only): candle's matmul.
    Tensor(Tensor),
}

/// Attention over `qkv: [total, 3 × heads × head_dim]` (query rows
/// pre-scaled by 1/√head_dim), the inputs of `lens` packed end to end;
/// returns `[total, heads × head_dim]`.
pub fn attention(
    qkv: &[f32],
    lens: &[usize],
    heads: usize,
    head_dim: usize,
    scores: Scores,
) -> candle_core::Result<Vec<f32>> {
    let h = heads * head_dim;
    let total: usize = lens.iter().sum();
    if qkv.len() != total * 3 * h {
        candle_core::bail!(
            "attention: qkv has {} floats, not {total} × 3 × {h}",
            qkv.len()
        );
    }
    if scores != Scores::Q8 && !packed_available() {
        candle_core::bail!("{scores:?} attention kernel on a CPU without AVX2 and FMA");
    }
    let mut tasks = Vec::with_capacity(lens.len() * heads);
    let mut offset = 0;
    for &len in lens {
        tasks.extend((0..heads).map(|head| (offset, len, head)));
        offset += len;
    }
    // Every task writes all of its input's rows in its head's columns.
    let mut out = Vec::<f32>::with_capacity(total * h);
    let dst = Dst(out.as_mut_ptr());
    tasks.into_par_iter().try_for_each(|(offset, len, head)| {
        let (d, col) = (head_dim, head * head_dim);
        let [mut q, mut k, mut v] = std::array::from_fn(|_| Vec::with_capacity(len * d));
        for i in 0..len {
            let row = &qkv[(offset + i) * 3 * h..(offset + i + 1) * 3 * h];
            q.extend_from_slice(&row[col..col + d]);
            k.extend_from_slice(&row[h + col..h + col + d]);
            v.extend_from_slice(&row[2 * h + col..2 * h + col + d]);
        }
        let keys = match scores {
            Scores::F32 => Keys::F32(PackedLinear::pack(&k, len, d)),
            Scores::Q8 => Keys::Q8(QLinear::quantize(&k, len, d)),
            Scores::Bf16 => Keys::Bf16(Bf16Linear::pack(&k, len, d)),
        };
        let values = if scores == Scores::Bf16 {
            Values::Bf16(Bf16Linear::pack_transposed(&v, len, d))
        } else if packed_available() {
            Values::Packed(PackedLinear::pack_transposed(&v, len, d))
        } else {
            Values::Tensor(Tensor::from_vec(v, (len, d), &Device::Cpu)?)
        };
        let rows = (MAX_SCORES / len).clamp(1, len);
        for start in (0..len).step_by(rows) {
            let n = rows.min(len - start);
            let queries = &q[start * d..(start + n) * d];
            let mut probs = match &keys {
                Keys::F32(keys) => keys.matmul_t(queries, n),
                Keys::Q8(keys) => keys.matmul_t(queries, n),
                Keys::Bf16(keys) => keys.matmul_t(queries, n),
            };
            probs
                .chunks_mut(len)
                .for_each(crate::kernels::fused::softmax);
            let context = match &values {
                Values::Packed(values) => values.matmul_t(&probs, n),
                Values::Bf16(values) => values.matmul_t(&probs, n),
                Values::Tensor(values) => Tensor::from_vec(probs, (n, len), &Device::Cpu)?
                    .matmul(values)?
                    .flatten_all()?
                    .to_vec1::<f32>()?,
            };
            for (i, c) in context.chunks(d).enumerate() {
                // SAFETY: row offset + start + i < total, so the offset lies
                // inside `out`'s total × h floats of capacity.
                let o = unsafe { dst.at((offset + start + i) * h + col) };
                // SAFETY: `context` is n × d floats, so `c` is d of them;
                // `o` is row offset + start + i, columns col..col + d <= h,
                // of `out`: this task's alone (its input's rows, its head's
                // columns), and no part of `context`.
                unsafe { std::ptr::copy_nonoverlapping(c.as_ptr(), o, d) };
            }
        }
        Ok::<(), candle_core::Error>(())
    })?;
    // SAFETY: the capacity is total × h, and the tasks (all of them
    // succeeded, or `?` returned) wrote every row of their head's columns,
    // for every input and head: all total × h floats.
    unsafe { out.set_len(total * h) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::quant::tests::values;

    /// The attention of `qkv` computed one score at a time.
    fn reference(qkv: &[f32], lens: &[usize], heads: usize, d: usize) -> Vec<f32> {
        let h = heads * d;
        let mut out = vec![0f32; lens.iter().sum::<usize>() * h];
        let mut offset = 0;
        for &len in lens {
            for head in 0..heads {
                let at = |i: usize, part: usize, c: usize| {
                    qkv[(offset + i) * 3 * h + part * h + head * d + c]
                };
                for i in 0..len {
                    let mut p: Vec<f32> = (0..len)
                        .map(|j| (0..d).map(|c| at(i, 0, c) * at(j, 1, c)).sum())
                        .collect();
                    crate::kernels::fused::softmax(&mut p);
                    for c in 0..d {
                        out[(offset + i) * h + head * d + c] =
                            (0..len).map(|j| p[j] * at(j, 2, c)).sum();
                    }
                }
            }
            offset += len;
        }
        out
    }

    fn check(scores: Scores, tolerance: f32) {
        // Lengths of one, under and over a panel; head widths of MiniLM and
        // BGE-M3.
        for (lens, heads, d) in [(vec![5usize, 70, 1], 2, 16), (vec![130, 3], 3, 64)] {
            let total = lens.iter().sum::<usize>();
            let qkv = values(total * 3 * heads * d, 7919, 1.0);
            let got = attention(&qkv, &lens, heads, d, scores).unwrap();
            let want = reference(&qkv, &lens, heads, d);
            for (idx, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= tolerance,
                    "{scores:?} {lens:?}×{heads}×{d} at {idx}: {g} vs {w}"
                );
            }
        }
    }

    #[test]
    fn f32_matches_a_plain_loop() {
        if !packed_available() {
            eprintln!("f32 attention kernel: this CPU lacks AVX2/FMA; the encoder uses candle's");
            return;
        }
        check(Scores::F32, 1e-5);
    }

    #[test]
    fn q8_is_close_to_f32_attention() {
        // The queries' rounding step doubles with the AVX2 kernel's 7-bit
        // activations (`Q8Kernel::activation_levels`), and so does the error.
        let levels = crate::kernels::quant::Q8Kernel::get().activation_levels() as f32;
        check(Scores::Q8, 0.02 * 255.0 / levels);
    }

    #[test]
    fn bf16_is_close_to_f32_attention() {
        if !packed_available() {
            eprintln!("bf16 attention kernel: this CPU lacks AVX2/FMA; the encoder uses candle's");
            return;
        }
        // bf16 keeps 8 significant bits: a relative step of 2⁻⁸ per value.
        check(Scores::Bf16, 0.01);
    }
}
