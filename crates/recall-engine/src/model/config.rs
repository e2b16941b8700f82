//! What a model directory says about itself: `config.json` and the
//! sentence-transformers files (`modules.json`, `1_Pooling/config.json`,
//! `sentence_bert_config.json`, `tokenizer_config.json`).

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

/// The encoder families recall runs. They differ only in where position ids start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// XLM-RoBERTa (and RoBERTa): positions start after the padding index.
    XlmRoberta,
    /// BERT: positions start at 0.
    Bert,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// Exact GELU (erf), Hugging Face's `gelu`.
    Gelu,
    /// The tanh approximation (`gelu_new`, `gelu_pytorch_tanh`).
    GeluTanh,
    Relu,
}

/// The encoder's shape, from `config.json`.
#[derive(Debug, Clone)]
pub struct EncoderConfig {
    pub architecture: Architecture,
    pub model_type: String,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
    pub pad_token_id: u32,
    pub activation: Activation,
}

#[derive(Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    hidden_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    intermediate_size: Option<usize>,
    vocab_size: Option<usize>,
    max_position_embeddings: Option<usize>,
    type_vocab_size: Option<usize>,
    layer_norm_eps: Option<f64>,
    pad_token_id: Option<u32>,
    hidden_act: Option<String>,
    position_embedding_type: Option<String>,
}

impl EncoderConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let raw: RawConfig = serde_json::from_str(&text)
            .with_context(|| format!("{} is not valid JSON", path.display()))?;
        Self::from_raw(raw).with_context(|| format!("unsupported model config {}", path.display()))
    }

    fn from_raw(raw: RawConfig) -> Result<Self> {
        let model_type = raw
            .model_type
            .context("no \"model_type\": recall runs XLM-RoBERTa (bge-m3) and BERT encoders")?;
        let architecture = match model_type.as_str() {
            "xlm-roberta" | "roberta" | "camembert" => Architecture::XlmRoberta,
            "bert" => Architecture::Bert,
            other => bail!(
                "model_type \"{other}\" is not supported: recall runs XLM-RoBERTa (bge-m3) and BERT encoders"
            ),
        };
        if let Some(kind) = raw.position_embedding_type.as_deref()
            && kind != "absolute"
        {
            bail!("position_embedding_type \"{kind}\" is not supported, only \"absolute\"");
        }
        let activation = match raw.hidden_act.as_deref().unwrap_or("gelu") {
            "gelu" => Activation::Gelu,
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Activation::GeluTanh,
            "relu" => Activation::Relu,
            other => bail!("hidden_act \"{other}\" is not supported (gelu, gelu_new, relu)"),
        };
        let need = |v: Option<usize>, name: &str| -> Result<usize> {
            match v {
                Some(0) => bail!("\"{name}\" is 0"),
                Some(v) => Ok(v),
                None => bail!("missing \"{name}\""),
            }
        };
        let hidden_size = need(raw.hidden_size, "hidden_size")?;
        let num_heads = need(raw.num_attention_heads, "num_attention_heads")?;
        if hidden_size % num_heads != 0 {
            bail!("hidden_size {hidden_size} is not a multiple of num_attention_heads {num_heads}");
        }
        let pad_token_id = raw.pad_token_id.unwrap_or(match architecture {
            Architecture::XlmRoberta => 1,
            Architecture::Bert => 0,
        });
        let config = Self {
            architecture,
            model_type,
            hidden_size,
            num_layers: need(raw.num_hidden_layers, "num_hidden_layers")?,
            num_heads,
            intermediate_size: need(raw.intermediate_size, "intermediate_size")?,
            vocab_size: need(raw.vocab_size, "vocab_size")?,
            max_position_embeddings: need(raw.max_position_embeddings, "max_position_embeddings")?,
            type_vocab_size: raw.type_vocab_size.unwrap_or(1).max(1),
            layer_norm_eps: raw.layer_norm_eps.unwrap_or(1e-12),
            pad_token_id,
            activation,
        };
        if config.position_offset() >= config.max_position_embeddings {
            bail!(
                "max_position_embeddings {} leaves no room for tokens",
                config.max_position_embeddings
            );
        }
        Ok(config)
    }

    /// The position id of the first token. Hugging Face's XLM-R numbers real
    /// tokens from `padding_idx + 1`; BERT from 0.
    pub fn position_offset(&self) -> usize {
        match self.architecture {
            Architecture::XlmRoberta => self.pad_token_id as usize + 1,
            Architecture::Bert => 0,
        }
    }

    /// The most tokens (special tokens included) the position table can hold.
    pub fn max_tokens(&self) -> usize {
        self.max_position_embeddings - self.position_offset()
    }
}

/// How the dense vector is made from the token states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    Cls,
    Mean,
}

/// The sentence-transformers pipeline: pooling, normalisation, and the
/// length at which inputs are cut.
#[derive(Debug, Clone)]
pub struct SentenceConfig {
    pub pooling: Pooling,
    pub normalize: bool,
    /// `max_seq_length` from `sentence_bert_config.json`, or the tokenizer's `model_max_length`.
    pub max_seq_length: Option<usize>,
}

#[derive(Deserialize)]
struct Module {
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .with_context(|| format!("{} is not valid JSON of the expected shape", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

impl SentenceConfig {
    /// Reads the sentence-transformers files of `dir`. Without `modules.json`
    /// the model is pooled as BGE-M3 is: the `<s>`/`[CLS]` state, normalised.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let mut config = SentenceConfig {
            pooling: Pooling::Cls,
            normalize: true,
            max_seq_length: None,
        };
        if let Some(modules) = read_json::<Vec<Module>>(&dir.join("modules.json"))? {
            config.normalize = modules.iter().any(|m| m.kind.ends_with("models.Normalize"));
            if let Some(pooling) = modules.iter().find(|m| m.kind.ends_with("models.Pooling")) {
                let path = dir.join(&pooling.path).join("config.json");
                let raw: PoolingConfig = read_json(&path)?.with_context(|| {
                    format!(
                        "modules.json names a pooling module, but {} is missing",
                        path.display()
                    )
                })?;
                config.pooling = match (
                    raw.pooling_mode_cls_token,
                    raw.pooling_mode_mean_tokens,
                    raw.pooling_mode_max_tokens
                        || raw.pooling_mode_mean_sqrt_len_tokens
                        || raw.pooling_mode_weightedmean_tokens
                        || raw.pooling_mode_lasttoken,
                ) {
                    (true, false, false) => Pooling::Cls,
                    (false, true, false) => Pooling::Mean,
                    _ => bail!(
                        "{}: recall supports exactly one of CLS or mean pooling",
                        path.display()
                    ),
                };
            }
        }
        #[derive(Deserialize)]
        struct Sbert {
            max_seq_length: Option<usize>,
        }
        #[derive(Deserialize)]
        struct TokenizerConfig {
            model_max_length: Option<f64>,
        }
        config.max_seq_length = match read_json::<Sbert>(&dir.join("sentence_bert_config.json"))? {
            Some(Sbert {
                max_seq_length: Some(n),
            }) => Some(n),
            _ => read_json::<TokenizerConfig>(&dir.join("tokenizer_config.json"))?
                .and_then(|t| t.model_max_length)
                // Tokenizers without a limit say 1e30.
                .filter(|n| *n >= 1.0 && *n < 1e9)
                .map(|n| n as usize),
        };
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<EncoderConfig> {
        EncoderConfig::from_raw(serde_json::from_str(json).unwrap())
    }

    #[test]
    fn bge_m3_config_gives_8192_tokens() {
        let c = parse(
            r#"{"model_type":"xlm-roberta","hidden_size":1024,"num_hidden_layers":24,
            "num_attention_heads":16,"intermediate_size":4096,"vocab_size":250002,
            "max_position_embeddings":8194,"type_vocab_size":1,"layer_norm_eps":1e-5,
            "pad_token_id":1,"hidden_act":"gelu"}"#,
        )
        .unwrap();
        assert_eq!(c.position_offset(), 2);
        assert_eq!(c.max_tokens(), 8192);
        assert_eq!(c.activation, Activation::Gelu);
    }

    #[test]
    fn unsupported_model_type_is_named() {
        let e = parse(r#"{"model_type":"llama","hidden_size":8}"#).unwrap_err();
        assert!(format!("{e:#}").contains("model_type \"llama\""), "{e:#}");
    }

    #[test]
    fn missing_field_is_named() {
        let e =
            parse(r#"{"model_type":"bert","hidden_size":8,"num_attention_heads":2}"#).unwrap_err();
        assert!(format!("{e:#}").contains("num_hidden_layers"), "{e:#}");
    }
}
