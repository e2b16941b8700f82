//! q8's fidelity, measured on the model being loaded, and how q8 runs it.
//!
//! int8 activations are quantised per token, so a model whose hidden states
//! carry a few channels far larger than the rest (the "outlier dimensions"
//! of real RoBERTa-family checkpoints, XLM-R and so BGE-M3 among them)
//! spends a token's range on them and flattens the others: its q8 vectors
//! can drift from f32's where a random or small model's do not. So the
//! first q8 load of a weights file runs [`TEXTS`] through the model in f32,
//! and from that pass:
//! - finds the channels each layer's q8 keeps in f32
//!   (`crate::kernels::quant::outlier_channels`, from the largest magnitude
//!   every input channel reaches);
//! - runs the texts through q8 and compares the vectors; while they miss
//!   the bars ([`FIDELITY_BAR`] for every text, [`MEAN_BAR`] for their
//!   mean), runs one more layer wholly in f32, the one whose int8 output
//!   strays furthest from f32's on f32's own input, and measures again.
//!   Outlier channels carried through a layer (by the values into the
//!   attention's context, by the feed-forward into its activations) are
//!   dense there, where no channel split removes them; a layer in f32 has
//!   no such error, and at worst every layer is (f32's vectors).
//!
//! The plan (`Q8Plan`) and the measurements are cached per weights file
//! and q8 kernel in `<cache>/calibration/`: later loads cost nothing.

use std::path::Path;

use anyhow::{Context, Result};
use candle_core::{Device, Tensor};

use crate::dtype::Dtype;
use crate::encoder::Encoder;
use crate::heads::M3Heads;
use crate::model::{EncoderConfig, Pooling, Weights};
use crate::proj::Q8Plan;
use crate::tokenize::TextTokenizer;

/// What the check reads: chat, commands, logs, code, JSON, prose, Chinese
/// and mixed text, and the one-word replies whose few tokens int8 errors
/// move most, as a Hermes history holds. Not the texts any test scores.
pub const TEXTS: &[&str] = &[
    "",
    "thanks",
    "yes, do it",
    "好的",
    "ls -la",
    "Can you help me figure out why the deploy keeps failing on the staging cluster?",
    "Sure. First, check the pod events with kubectl describe pod and look for ImagePullBackOff.",
    "sudo systemctl restart postgresql && journalctl -u postgresql --since '10 min ago'",
    "2026-03-14T08:22:51Z ERROR worker-3 connection pool exhausted (max=20, waiting=57)",
    "fn main() { let args: Vec<String> = std::env::args().collect(); println!(\"{:?}\", args); }",
    "{\"id\": 4711, \"status\": \"failed\", \"retries\": 3, \"error\": \"timeout after 30s\"}",
    "Remind me every Monday at 9am to send the weekly report to the finance team.",
    "The quarterly numbers look better than expected, mostly thanks to the new pricing tiers.",
    "我想把家里的路由器换成支持 Wi-Fi 6 的型号，预算在五百元左右，有什么推荐吗？",
    "请帮我总结一下这篇论文的主要贡献和实验结果，重点说明和基线方法的差别。",
    "把 nginx 的 access.log 按小时切分，然后统计每小时的 5xx 错误数量。",
    "Translate to English: 明天下午三点在二号会议室开项目复盘会。",
    "pip install -r requirements.txt fails with error: Microsoft Visual C++ 14.0 is required",
    "What is the difference between a mutex and a semaphore, and when should I use each?",
    "SELECT user_id, COUNT(*) FROM orders WHERE created_at > NOW() - INTERVAL '7 days' GROUP BY 1;",
    "Book a table for four at the Italian place near the office on Friday evening.",
];

/// The lowest cosine of a text's q8 vector to its f32 vector, over
/// [`TEXTS`], that q8 must reach on a model.
pub const FIDELITY_BAR: f32 = 0.995;

/// The lowest mean cosine, over [`TEXTS`], that q8 must reach.
pub const MEAN_BAR: f32 = 0.998;

/// The lowest cosine of a token's q8 ColBERT vector to its f32 one that q8
/// must reach on a model with BGE-M3's heads.
pub const COLBERT_BAR: f32 = 0.99;

/// Bumped when `TEXTS`, the measure, the bars or the plan change: older
/// results are measured again.
const VERSION: u32 = 3;

/// q8 against f32 on [`TEXTS`].
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Fidelity {
    /// The lowest cosine of a text's q8 vector to its f32 vector.
    pub min_cosine: f32,
    pub mean_cosine: f32,
    /// The lowest of a token's ColBERT vectors (BGE-M3's heads).
    pub colbert_min_cosine: Option<f32>,
}

impl Fidelity {
    /// Whether q8 passes the bars on this model.
    pub fn holds(&self) -> bool {
        self.min_cosine >= FIDELITY_BAR
            && self.mean_cosine >= MEAN_BAR
            && self.colbert_min_cosine.is_none_or(|c| c >= COLBERT_BAR)
    }

    fn of(reference: &Vectors, got: &Vectors) -> Self {
        let dense = cosines(&reference.dense, &got.dense);
        let min = |c: &[f32]| c.iter().copied().fold(f32::INFINITY, f32::min);
        Self {
            min_cosine: min(&dense),
            mean_cosine: dense.iter().sum::<f32>() / dense.len() as f32,
            colbert_min_cosine: (reference.colbert.as_ref())
                .zip(got.colbert.as_ref())
                .map(|(a, b)| min(&cosines(a, b))),
        }
    }
}

fn cosines(a: &[Vec<f32>], b: &[Vec<f32>]) -> Vec<f32> {
    (a.iter().zip(b))
        .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x * y).sum())
        .collect()
}

impl std::fmt::Display for Fidelity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cosine min {:.5}, mean {:.5}",
            self.min_cosine, self.mean_cosine
        )?;
        match self.colbert_min_cosine {
            Some(c) => write!(f, ", ColBERT min {c:.5}"),
            None => Ok(()),
        }
    }
}

/// How q8 runs a model, and what it measured there.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Calibration {
    /// With int8 in every layer (outlier channels apart).
    pub int8: Fidelity,
    /// As `plan` runs it.
    pub fidelity: Fidelity,
    pub plan: Q8Plan,
}

impl Calibration {
    /// The calibration of `weights` for this CPU's q8 kernel: the cached
    /// one, or measured now (see the module's text) and kept.
    pub fn of(
        config: &EncoderConfig,
        weights: &Path,
        cache_dir: &Path,
        tokenizer: &TextTokenizer,
        outputs: &Outputs,
    ) -> Result<Self> {
        let key = crate::model::file_key(weights)?;
        let tag = crate::kernels::quant::Q8Kernel::get().revision_tag();
        let path = cache_dir
            .join("calibration")
            .join(format!("{key}-{tag}-v{VERSION}.json"));
        if let Some(known) = Self::read(&path).filter(|c| c.fits(config)) {
            return Ok(known);
        }
        let calibration = Self::measure(config, weights, tokenizer, outputs)?;
        tracing::debug!(
            "q8 against f32 on this model: {} (int8 in every layer: {})",
            calibration.fidelity,
            calibration.int8
        );
        if let Err(e) = calibration.write(&path) {
            tracing::warn!(
                "cannot keep q8's check in {} ({e:#}): it runs again at the next start",
                path.display()
            );
        }
        Ok(calibration)
    }

    fn measure(
        config: &EncoderConfig,
        weights: &Path,
        tokenizer: &TextTokenizer,
        outputs: &Outputs,
    ) -> Result<Self> {
        let inputs: Vec<Vec<u32>> = TEXTS
            .iter()
            .map(|t| tokenizer.encode(t).map(|t| t.ids))
            .collect::<Result<_>>()?;
        let ids: Vec<&[u32]> = inputs.iter().map(Vec::as_slice).collect();
        let lens: Vec<usize> = inputs.iter().map(Vec::len).collect();
        let mut weights = Weights::open(weights)?;
        // Once per weights file: not worth a GB of disk.
        let load = |weights: &mut Weights, dtype, plan: &Q8Plan| {
            Encoder::load(config, weights, &Device::Cpu, dtype, plan, None)
        };
        // The f32 model goes before the q8 one comes: the two never take
        // memory at once.
        let trace = load(&mut weights, Dtype::F32, &Q8Plan::default())?.forward_trace(&ids)?;
        let reference = outputs.of(trace.hidden.last().context("no layers")?, &lens)?;
        let mut plan = Q8Plan {
            outliers: (trace.peaks.iter())
                .map(|layer| layer.map(|peaks| crate::kernels::quant::outlier_channels(peaks)))
                .collect(),
            f32_layers: Vec::new(),
        };
        let mut q8 = load(&mut weights, Dtype::Q8, &plan)?;
        let measure = |q8: &Encoder| -> Result<Fidelity> {
            let got = outputs.of(&q8.forward(&ids)?, &lens)?;
            Ok(Fidelity::of(&reference, &got))
        };
        let int8 = measure(&q8)?;
        let mut fidelity = int8;
        if !int8.holds() {
            // Worst first: how far each layer's int8 output strays from
            // f32's on the same (f32) input.
            let mut strays = (0..q8.num_layers())
                .map(|i| {
                    let got = q8.layer(i, &trace.hidden[i], &lens, None)?;
                    Ok((relative_error(&got, &trace.hidden[i + 1])?, i))
                })
                .collect::<Result<Vec<(f32, usize)>>>()?;
            strays.sort_by(|a, b| b.0.total_cmp(&a.0));
            for (_, layer) in strays {
                q8.demote(layer, &weights)?;
                plan.f32_layers.push(layer);
                fidelity = measure(&q8)?;
                if fidelity.holds() {
                    break;
                }
            }
            plan.f32_layers.sort_unstable();
        }
        Ok(Self {
            int8,
            fidelity,
            plan,
        })
    }

    fn read(path: &Path) -> Option<Self> {
        serde_json::from_slice(&std::fs::read(path).ok()?).ok()
    }

    /// Whether the plan fits `config`'s layers (channels and layers
    /// ascending and inside them): a damaged file is measured again, not
    /// trusted.
    fn fits(&self, config: &EncoderConfig) -> bool {
        let within = |items: &[usize], k: usize| {
            items.is_sorted_by(|a, b| a < b) && items.last().is_none_or(|&c| c < k)
        };
        let (h, i) = (config.hidden_size, config.intermediate_size);
        self.plan.outliers.len() == config.num_layers
            && within(&self.plan.f32_layers, config.num_layers)
            && self.plan.outliers.iter().all(|l| {
                within(&l.qkv, h)
                    && within(&l.attn_out, h)
                    && within(&l.intermediate, h)
                    && within(&l.output, i)
            })
    }

    fn write(&self, path: &Path) -> Result<()> {
        let dir = path
            .parent()
            .context("a calibration file has a directory")?;
        std::fs::create_dir_all(dir)?;
        let tmp = tempfile::NamedTempFile::new_in(dir)?;
        std::fs::write(tmp.path(), serde_json::to_vec(self)?)?;
        tmp.persist(path)?;
        Ok(())
    }

    /// Says what q8 does on this model: which layers run in f32 (every
    /// load), with a warning where that is most of them.
    pub fn report(&self, layers: usize) {
        let f32_layers = &self.plan.f32_layers;
        if f32_layers.is_empty() {
            return;
        }
        let colbert = match self.int8.colbert_min_cosine {
            Some(_) => format!(", each ColBERT vector {COLBERT_BAR}"),
            None => String::new(),
        };
        let message = format!(
            "q8 (`Dtype::Q8`): on recall's check texts, int8 in every layer of this model misses \
             the bars (cosine to f32: each text {FIDELITY_BAR}, their mean {MEAN_BAR}{colbert}) \
             with {}; so {} of its {layers} layers run in f32 (layers {}), which reach {}",
            self.int8,
            f32_layers.len(),
            (f32_layers.iter().map(usize::to_string))
                .collect::<Vec<_>>()
                .join(", "),
            self.fidelity,
        );
        if 2 * f32_layers.len() > layers {
            tracing::warn!(
                "{message}. q8 saves little on this model: bf16 (`Dtype::Bf16`, within 0.9995 cosine \
                 of f32, half its memory) may serve better."
            );
        } else {
            tracing::info!("{message}.");
        }
    }
}

/// `‖got - want‖ / ‖want‖`.
fn relative_error(got: &Tensor, want: &Tensor) -> Result<f32> {
    let err = got.sub(want)?.sqr()?.sum_all()?.to_scalar::<f32>()?;
    let norm = want.sqr()?.sum_all()?.to_scalar::<f32>()?;
    Ok((err / norm.max(f32::MIN_POSITIVE)).sqrt())
}

/// What the check compares: the model's vectors, as `crate::Embedder`
/// makes them from the last hidden states.
pub struct Outputs<'a> {
    pub pooling: Pooling,
    /// BGE-M3's heads, for the ColBERT vectors.
    pub heads: Option<&'a M3Heads>,
}

/// The vectors of one run over [`TEXTS`].
struct Vectors {
    /// L2-normalised, per text.
    dense: Vec<Vec<f32>>,
    /// Per token after each text's first (what `crate::Embedder` gives).
    colbert: Option<Vec<Vec<f32>>>,
}

impl Outputs<'_> {
    /// The vectors of inputs of `lens` tokens, from their `hidden` states.
    fn of(&self, hidden: &Tensor, lens: &[usize]) -> Result<Vectors> {
        let dense = crate::heads::pool(hidden, lens, self.pooling, true)?.to_vec2::<f32>()?;
        let colbert = match self.heads {
            Some(heads) => {
                let all = heads.colbert_vectors(hidden)?.to_vec2::<f32>()?;
                let mut offset = 0;
                let mut kept = Vec::with_capacity(all.len());
                for &len in lens {
                    kept.extend_from_slice(&all[offset + 1..offset + len]);
                    offset += len;
                }
                Some(kept)
            }
            None => None,
        };
        Ok(Vectors { dense, colbert })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proj::ProjInputs;

    fn calibration(outliers: Vec<ProjInputs<Vec<usize>>>, f32_layers: Vec<usize>) -> Calibration {
        let fidelity = Fidelity {
            min_cosine: 1.0,
            mean_cosine: 1.0,
            colbert_min_cosine: None,
        };
        Calibration {
            int8: fidelity,
            fidelity,
            plan: Q8Plan {
                outliers,
                f32_layers,
            },
        }
    }

    #[test]
    fn a_result_round_trips_and_a_damaged_one_is_measured_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("calibration/k.json");
        let low = Fidelity {
            min_cosine: 0.99071,
            mean_cosine: 0.99862,
            colbert_min_cosine: Some(0.9),
        };
        let outliers = vec![ProjInputs {
            qkv: vec![3, 99],
            output: vec![1004],
            ..Default::default()
        }];
        let calibration = Calibration {
            int8: low,
            ..calibration(outliers, vec![0])
        };
        calibration.write(&path).unwrap();
        assert_eq!(Calibration::read(&path), Some(calibration));
        std::fs::write(&path, "{\"fidelity\": {\"min_cosine\": 0.99}}").unwrap();
        assert_eq!(Calibration::read(&path), None);
    }

    #[test]
    fn every_bar_holds_or_it_does_not() {
        let at = |min_cosine, mean_cosine, colbert_min_cosine| {
            Fidelity {
                min_cosine,
                mean_cosine,
                colbert_min_cosine,
            }
            .holds()
        };
        assert!(at(FIDELITY_BAR, MEAN_BAR, None));
        assert!(at(FIDELITY_BAR, MEAN_BAR, Some(COLBERT_BAR)));
        assert!(!at(0.99071, 0.99862, None));
        assert!(!at(FIDELITY_BAR, 0.9979, None));
        assert!(!at(0.9949, 0.9999, None));
        assert!(!at(0.9999, 0.9999, Some(0.9899)));
        let vectors = |dense: Vec<Vec<f32>>, colbert| Vectors { dense, colbert };
        let f = Fidelity::of(
            &vectors(
                vec![vec![1.0, 0.0], vec![0.0, 1.0]],
                Some(vec![vec![1.0, 0.0]]),
            ),
            &vectors(
                vec![vec![1.0, 0.0], vec![0.6, 0.8]],
                Some(vec![vec![0.8, 0.6]]),
            ),
        );
        assert_eq!(
            (f.min_cosine, f.mean_cosine, f.colbert_min_cosine),
            (0.8, 0.9, Some(0.8))
        );
    }

    #[test]
    fn a_plan_that_does_not_fit_the_model_is_measured_again() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.json");
        std::fs::write(
            &config,
            r#"{"model_type":"bert","hidden_size":8,"num_hidden_layers":2,
            "num_attention_heads":2,"intermediate_size":32,"vocab_size":100,
            "max_position_embeddings":64,"type_vocab_size":2}"#,
        )
        .unwrap();
        let config = EncoderConfig::from_file(&config).unwrap();
        let layer = |qkv: Vec<usize>, output: Vec<usize>| ProjInputs {
            qkv,
            output,
            ..Default::default()
        };
        let with = |outliers| calibration(outliers, vec![]);
        let fine = vec![layer(vec![0, 7], vec![31]), layer(vec![], vec![8])];
        assert!(with(fine.clone()).fits(&config));
        assert!(calibration(fine.clone(), vec![0, 1]).fits(&config));
        // Past the hidden size; past the intermediate size; not ascending;
        // twice; a layer short.
        assert!(!with(vec![layer(vec![8], vec![]), fine[1].clone()]).fits(&config));
        assert!(!with(vec![layer(vec![], vec![32]), fine[1].clone()]).fits(&config));
        assert!(!with(vec![layer(vec![3, 1], vec![]), fine[1].clone()]).fits(&config));
        assert!(!with(vec![layer(vec![1, 1], vec![]), fine[1].clone()]).fits(&config));
        assert!(!with(fine[..1].to_vec()).fits(&config));
        // f32 layers past the last, or not ascending.
        assert!(!calibration(fine.clone(), vec![2]).fits(&config));
        assert!(!calibration(fine, vec![1, 0]).fits(&config));
    }
}
