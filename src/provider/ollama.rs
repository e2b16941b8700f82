//! Ollama's `POST /api/embed` (batched; vectors L2-normalised by the server)
//! and `GET /api/tags` to check the model is there.

use anyhow::{Result, anyhow, bail};
use serde_json::{Value, json};

use super::Kind;
use super::http::Client;
use super::remote::{Api, floats};

pub const DEFAULT_BASE: &str = "http://127.0.0.1:11434";

pub struct Ollama;

impl Api for Ollama {
    fn kind(&self) -> Kind {
        Kind::Ollama
    }

    fn embed_url(&self, base: &str) -> String {
        format!("{base}/api/embed")
    }

    fn request(&self, model: &str, texts: &[&str]) -> Value {
        json!({ "model": model, "input": texts, "truncate": true })
    }

    fn parse(&self, answer: Value) -> Result<(Vec<Vec<f32>>, Option<usize>)> {
        let embeddings = answer["embeddings"]
            .as_array()
            .ok_or_else(|| anyhow!("the answer has no \"embeddings\" array"))?;
        let vectors = embeddings
            .iter()
            .enumerate()
            .map(|(i, v)| floats(v, &format!("embeddings[{i}]")))
            .collect::<Result<_>>()?;
        Ok((
            vectors,
            answer["prompt_eval_count"].as_u64().map(|n| n as usize),
        ))
    }

    fn check(
        &self,
        client: &Client,
        base: &str,
        model: &str,
        headers: &[(&str, String)],
    ) -> Result<()> {
        let tags = client.get_json(&format!("{base}/api/tags"), headers)?;
        let names: Vec<&str> = tags["models"]
            .as_array()
            .map(|m| m.iter().filter_map(|m| m["name"].as_str()).collect())
            .unwrap_or_default();
        let wanted = |n: &&str| *n == model || n.strip_suffix(":latest") == Some(model);
        if !names.iter().any(wanted) {
            bail!(
                "Ollama at {base} does not have the model {model:?} (it has: {}); run `ollama pull {model}`",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            );
        }
        Ok(())
    }
}
