//! q8's fidelity, measured on the model being loaded.
//!
//! int8 activations are quantised per token, so a model whose hidden states
//! carry a few channels far larger than the rest (the "outlier dimensions"
//! of real RoBERTa-family checkpoints, XLM-R and so BGE-M3 among them)
//! spends a token's range on them and flattens the others: its q8 vectors
//! can drift from f32's where a random or small model's do not. So the
//! first q8 load of a weights file runs [`TEXTS`] through the model in f32
//! and in q8 and compares the vectors; below [`FIDELITY_BAR`] a warning
//! says so (with the measured cosine) instead of letting a degraded index
//! be built in silence.
//!
//! The same f32 pass finds the channels each layer's q8 keeps in f32
//! (`crate::kernels::quant::outlier_channels`, from the largest magnitude every
//! input channel reaches on [`TEXTS`]). Both are cached per weights file
//! and q8 kernel in `<cache>/calibration/`: later loads cost nothing.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::{Device, Tensor};

use crate::dtype::Dtype;
use crate::encoder::Encoder;
use crate::model::{EncoderConfig, Pooling, Weights};
use crate::proj::{Outliers, ProjInputs};
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

/// The lowest cosine to f32, over [`TEXTS`], at which q8 is used without a
/// warning.
pub const FIDELITY_BAR: f32 = 0.995;

/// Bumped when `TEXTS` or the measure change: older results are measured again.
const VERSION: u32 = 2;

/// q8 against f32 on [`TEXTS`].
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Fidelity {
    /// The lowest cosine of a text's q8 vector to its f32 vector.
    pub min_cosine: f32,
    pub mean_cosine: f32,
}

/// What the check keeps of a weights file.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Calibration {
    fidelity: Fidelity,
    outliers: Vec<ProjInputs<Vec<usize>>>,
}

impl Calibration {
    fn read(path: &Path) -> Option<Self> {
        serde_json::from_slice(&std::fs::read(path).ok()?).ok()
    }

    /// Whether the outlier channels are ascending and inside `config`'s
    /// layers: a damaged file is measured again, not trusted.
    fn fits(&self, config: &EncoderConfig) -> bool {
        let within = |channels: &[usize], k: usize| {
            channels.is_sorted_by(|a, b| a < b) && channels.last().is_none_or(|&c| c < k)
        };
        let (h, i) = (config.hidden_size, config.intermediate_size);
        self.outliers.len() == config.num_layers
            && self.outliers.iter().all(|l| {
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
}

impl Fidelity {
    /// Whether q8 passes the bar on this model.
    pub fn holds(&self) -> bool {
        self.min_cosine >= FIDELITY_BAR
    }

    fn warn_if_low(&self) {
        if !self.holds() {
            tracing::warn!(
                "--dtype q8: on recall's check texts this model's int8 vectors reach only {:.4} \
                 cosine to f32 (mean {:.4}; the bar is {FIDELITY_BAR}): an index built with them may \
                 miss what f32 finds. Use --dtype bf16 (within 0.9995 cosine of f32, half its memory) \
                 or f32 for this model.",
                self.min_cosine,
                self.mean_cosine
            );
        }
    }
}

/// The check of one q8 load: the cached result, or the f32 vectors to
/// compare the q8 model's with (measured before the q8 model is loaded, so
/// the two never take memory at once).
pub struct Check {
    path: PathBuf,
    outliers: Vec<ProjInputs<Vec<usize>>>,
    state: State,
}

enum State {
    Known(Fidelity),
    Measure {
        inputs: Vec<Vec<u32>>,
        reference: Vec<Vec<f32>>,
        pooling: Pooling,
    },
}

impl Check {
    /// Looks up the result for `weights` and this CPU's q8 kernel; without
    /// one, runs [`TEXTS`] through the f32 model (pooled by `pooling`, as
    /// the model's vectors are).
    pub fn prepare(
        config: &EncoderConfig,
        weights: &Path,
        cache_dir: &Path,
        tokenizer: &TextTokenizer,
        pooling: Pooling,
    ) -> Result<Self> {
        let key = crate::model::file_key(weights)?;
        let tag = crate::kernels::quant::Kernel::get().revision_tag();
        let path = cache_dir
            .join("calibration")
            .join(format!("{key}-{tag}-v{VERSION}.json"));
        if let Some(known) = Calibration::read(&path).filter(|c| c.fits(config)) {
            return Ok(Self {
                path,
                outliers: known.outliers,
                state: State::Known(known.fidelity),
            });
        }
        let inputs: Vec<Vec<u32>> = TEXTS
            .iter()
            .map(|t| tokenizer.encode(t).map(|t| t.ids))
            .collect::<Result<_>>()?;
        let f32 = Encoder::load(
            config,
            &mut Weights::open(weights)?,
            &Device::Cpu,
            Dtype::F32,
            &[],
            // Once per weights file: not worth a GB of disk.
            None,
        )?;
        let ids: Vec<&[u32]> = inputs.iter().map(Vec::as_slice).collect();
        let (hidden, peaks) = f32.forward_peaks(&ids)?;
        let reference = pooled(&hidden, &inputs, pooling)?;
        let outliers = (peaks.iter())
            .map(|layer| layer.map(|peaks| crate::kernels::quant::outlier_channels(peaks)))
            .collect();
        Ok(Self {
            path,
            outliers,
            state: State::Measure {
                inputs,
                reference,
                pooling,
            },
        })
    }

    /// The channels each layer's q8 keeps in f32: what to load the q8
    /// encoder with.
    pub fn outliers(&self) -> &Outliers {
        &self.outliers
    }

    /// Measures `q8` (unless known), keeps the result, and warns when it
    /// is below the bar.
    pub fn finish(self, q8: &Encoder) -> Result<Fidelity> {
        let fidelity = match self.state {
            State::Known(known) => known,
            State::Measure {
                inputs,
                reference,
                pooling,
            } => {
                let ids: Vec<&[u32]> = inputs.iter().map(Vec::as_slice).collect();
                let got = pooled(&q8.forward(&ids)?, &inputs, pooling)?;
                let cosines: Vec<f32> = reference
                    .iter()
                    .zip(&got)
                    .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x * y).sum())
                    .collect();
                let fidelity = Fidelity {
                    min_cosine: cosines.iter().copied().fold(f32::INFINITY, f32::min),
                    mean_cosine: cosines.iter().sum::<f32>() / cosines.len() as f32,
                };
                tracing::debug!(
                    "q8 against f32 on this model: cosine min {:.5}, mean {:.5}",
                    fidelity.min_cosine,
                    fidelity.mean_cosine
                );
                let calibration = Calibration {
                    fidelity,
                    outliers: self.outliers,
                };
                if let Err(e) = calibration.write(&self.path) {
                    tracing::warn!(
                        "cannot keep q8's check in {} ({e:#}): it runs again at the next start",
                        self.path.display()
                    );
                }
                fidelity
            }
        };
        fidelity.warn_if_low();
        Ok(fidelity)
    }
}

/// The L2-normalised vectors of `inputs`, from their `hidden` states.
fn pooled(hidden: &Tensor, inputs: &[Vec<u32>], pooling: Pooling) -> Result<Vec<Vec<f32>>> {
    let lens: Vec<usize> = inputs.iter().map(Vec::len).collect();
    Ok(crate::heads::pool(hidden, &lens, pooling, true)?.to_vec2::<f32>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_round_trips_and_a_damaged_one_is_measured_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("calibration/k.json");
        let fidelity = Fidelity {
            min_cosine: 0.99071,
            mean_cosine: 0.99862,
        };
        let calibration = Calibration {
            fidelity,
            outliers: vec![ProjInputs {
                qkv: vec![3, 99],
                output: vec![1004],
                ..Default::default()
            }],
        };
        calibration.write(&path).unwrap();
        assert_eq!(Calibration::read(&path), Some(calibration));
        assert!(!fidelity.holds());
        let fine = Fidelity {
            min_cosine: FIDELITY_BAR,
            ..fidelity
        };
        assert!(fine.holds());
        std::fs::write(&path, "{\"fidelity\": {\"min_cosine\": 0.99}}").unwrap();
        assert_eq!(Calibration::read(&path), None);
    }

    #[test]
    fn channels_that_do_not_fit_the_model_are_measured_again() {
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
        let with = |outliers| Calibration {
            fidelity: Fidelity {
                min_cosine: 1.0,
                mean_cosine: 1.0,
            },
            outliers,
        };
        let fine = vec![layer(vec![0, 7], vec![31]), layer(vec![], vec![8])];
        assert!(with(fine.clone()).fits(&config));
        // Past the hidden size; past the intermediate size; not ascending;
        // twice; a layer short.
        assert!(!with(vec![layer(vec![8], vec![]), fine[1].clone()]).fits(&config));
        assert!(!with(vec![layer(vec![], vec![32]), fine[1].clone()]).fits(&config));
        assert!(!with(vec![layer(vec![3, 1], vec![]), fine[1].clone()]).fits(&config));
        assert!(!with(vec![layer(vec![1, 1], vec![]), fine[1].clone()]).fits(&config));
        assert!(!with(fine[..1].to_vec()).fits(&config));
    }
}
