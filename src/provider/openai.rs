//! OpenAI's `POST {base}/embeddings`, which Volcano Ark, OpenAI itself and
//! `recall serve` all speak. Floats are asked for explicitly (some servers
//! default to base64).

use anyhow::{Result, anyhow, bail};
use serde_json::{Value, json};

use super::Kind;
use super::remote::{Api, floats};

/// Volcano Ark's OpenAI-compatible endpoint (the Volcano Ark guide used `/api/coding/v3`).
pub const ARK_BASE: &str = "https://ark.cn-beijing.volces.com/api/v3";
pub const OPENAI_BASE: &str = "https://api.openai.com/v1";

pub struct OpenAi;

impl Api for OpenAi {
    fn kind(&self) -> Kind {
        Kind::Openai
    }

    fn embed_url(&self, base: &str) -> String {
        format!("{base}/embeddings")
    }

    fn request(&self, model: &str, texts: &[&str]) -> Value {
        json!({ "model": model, "input": texts, "encoding_format": "float" })
    }

    fn parse(&self, answer: Value) -> Result<(Vec<Vec<f32>>, Option<usize>)> {
        let data = answer["data"]
            .as_array()
            .ok_or_else(|| anyhow!("the answer has no \"data\" array"))?;
        // `data` is in input order by `index`; a server may not sort it.
        let mut indexed = Vec::with_capacity(data.len());
        for (i, item) in data.iter().enumerate() {
            let index = item["index"].as_u64().map_or(i, |n| n as usize);
            indexed.push((
                index,
                floats(&item["embedding"], &format!("data[{i}].embedding"))?,
            ));
        }
        indexed.sort_by_key(|(i, _)| *i);
        if indexed
            .iter()
            .enumerate()
            .any(|(i, (index, _))| i != *index)
        {
            bail!("the answer's indexes are not 0..{}", indexed.len());
        }
        let tokens = answer["usage"]["prompt_tokens"]
            .as_u64()
            .map(|n| n as usize);
        Ok((indexed.into_iter().map(|(_, v)| v).collect(), tokens))
    }
}

/// Volcano Ark's multimodal embedding API, where its documentation serves
/// `doubao-embedding-vision`: `POST {base}/embeddings/multimodal` with
/// `input: [{"type": "text", "text": ...}]`. Everything in one request
/// becomes one vector, so each request carries one text (`batch_size` 1;
/// `concurrency` gives the parallelism).
pub struct ArkMultimodal;

impl Api for ArkMultimodal {
    fn kind(&self) -> Kind {
        Kind::Openai
    }

    fn max_batch(&self) -> Option<usize> {
        Some(1)
    }

    fn embed_url(&self, base: &str) -> String {
        format!("{base}/embeddings/multimodal")
    }

    fn request(&self, model: &str, texts: &[&str]) -> Value {
        let input: Vec<Value> = texts
            .iter()
            .map(|t| json!({ "type": "text", "text": t }))
            .collect();
        json!({ "model": model, "input": input, "encoding_format": "float" })
    }

    fn parse(&self, answer: Value) -> Result<(Vec<Vec<f32>>, Option<usize>)> {
        let tokens = answer["usage"]["prompt_tokens"]
            .as_u64()
            .map(|n| n as usize);
        match &answer["data"] {
            Value::Object(_) => Ok((
                vec![floats(&answer["data"]["embedding"], "data.embedding")?],
                tokens,
            )),
            Value::Array(_) => OpenAi.parse(answer),
            _ => bail!("the answer has no \"data\""),
        }
    }
}
