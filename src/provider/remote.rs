//! What the Ollama and OpenAI-compatible providers share: batches split to
//! the provider's limit and sent in parallel, the vector space learned from
//! the first answer (or stated in the configuration), every answer checked.

use std::sync::Mutex;

use anyhow::{Context, Result, anyhow};
use serde_json::Value;

use super::http::{Client, Policy};
use super::{Input, Kind, Vector, check_vectors, family_of};
use crate::space::Identity;
use recall_engine::tokenize::estimate_tokens;

/// One wire format: how to ask, and how to read the vectors out of the answer.
pub trait Api: Send + Sync {
    fn kind(&self) -> Kind;
    fn embed_url(&self, base: &str) -> String;
    fn request(&self, model: &str, texts: &[&str]) -> Value;
    /// Vectors in input order, and the tokens the provider counted, if it says.
    fn parse(&self, answer: Value) -> Result<(Vec<Vec<f32>>, Option<usize>)>;
    /// The most inputs one request may carry, when the API has a limit.
    fn max_batch(&self) -> Option<usize> {
        None
    }

    /// A cheap check that the server is up and has the model, before the first embedding.
    fn check(
        &self,
        _client: &Client,
        _base: &str,
        _model: &str,
        _headers: &[(&str, String)],
    ) -> Result<()> {
        Ok(())
    }
}

pub struct Remote {
    pub name: String,
    pub base: String,
    pub model: String,
    pub api: Box<dyn Api>,
    pub client: Client,
    pub headers: Vec<(&'static str, String)>,
    /// Inputs per request.
    pub batch: usize,
    /// Requests at once.
    pub concurrency: usize,
    /// The configuration's `space` (family) and `dimension`, when given.
    pub family: Option<String>,
    pub dimension: Option<usize>,
    known: Mutex<Option<Identity>>,
}

/// What a remote provider is configured with (`Remote::new`).
pub struct RemoteSettings<'a> {
    pub name: &'a str,
    pub base: &'a str,
    pub model: &'a str,
    pub api: Box<dyn Api>,
    pub policy: Policy,
    pub headers: Vec<(&'static str, String)>,
    /// Inputs per request, at most the API's limit.
    pub batch: usize,
    /// Requests at once, at least one.
    pub concurrency: usize,
    /// The configuration's `space` (family) and `dimension`, when given.
    pub family: Option<String>,
    pub dimension: Option<usize>,
}

impl Remote {
    pub fn new(settings: RemoteSettings) -> Self {
        let RemoteSettings {
            name,
            base,
            model,
            api,
            policy,
            headers,
            batch,
            concurrency,
            family,
            dimension,
        } = settings;
        let batch = batch.clamp(1, api.max_batch().unwrap_or(usize::MAX));
        let secret = headers
            .iter()
            .find(|(k, _)| *k == "Authorization")
            .map(|(_, v)| v.trim_start_matches("Bearer ").to_string());
        Self {
            name: name.to_string(),
            base: base.trim_end_matches('/').to_string(),
            model: model.to_string(),
            api,
            client: Client::new(name, policy, secret),
            headers,
            batch,
            concurrency: concurrency.max(1),
            family,
            dimension,
            known: Mutex::new(None),
        }
    }

    pub fn describe(&self) -> String {
        format!("{} at {}", self.model, shown_url(&self.base))
    }

    /// The identity, learned by embedding one probe text the first time.
    pub fn identity(&self) -> Result<Identity> {
        if let Some(known) = self.known.lock().unwrap().clone() {
            return Ok(known);
        }
        self.api
            .check(&self.client, &self.base, &self.model, &self.headers)?;
        // Two texts: a vector cut short in the answer shows as two widths.
        let probe = self.send(
            &[
                "recall: which space are your vectors in?",
                "recall 的向量空间",
            ],
            true,
        )?;
        let dimension = probe[0].dense.len();
        let identity = Identity {
            provider: self.api.kind().as_str().into(),
            model: self.model.clone(),
            family: self
                .family
                .clone()
                .unwrap_or_else(|| family_of(&self.model)),
            revision: String::new(),
            weights_bytes: 0,
            dimension,
            normalized: true,
            sparse: false,
            chunk_tokens: 0,
            chunk_overlap: 0,
        };
        *self.known.lock().unwrap() = Some(identity.clone());
        Ok(identity)
    }

    pub fn embed(&self, inputs: &[Input]) -> Result<Vec<Vector>> {
        let texts: Vec<&str> = inputs.iter().map(|i| i.text).collect();
        let mut out = self.embed_texts(&texts, false)?;
        for (v, input) in out.iter_mut().zip(inputs) {
            if let Some(t) = input.tokens {
                v.tokens = t.ids.len();
            }
        }
        Ok(out)
    }

    /// `texts` in batches of `batch`, `concurrency` requests at a time.
    fn embed_texts(&self, texts: &[&str], first_contact: bool) -> Result<Vec<Vector>> {
        let batches: Vec<&[&str]> = texts.chunks(self.batch).collect();
        let mut results: Vec<Option<Result<Vec<Vector>>>> =
            (0..batches.len()).map(|_| None).collect();
        // `concurrency` workers take batches in turn.
        let next = std::sync::atomic::AtomicUsize::new(0);
        let slots = Mutex::new(&mut results);
        std::thread::scope(|s| {
            for _ in 0..self.concurrency.min(batches.len()) {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(batch) = batches.get(i) else { break };
                        let r = self.send(batch, first_contact);
                        let failed = r.is_err();
                        slots.lock().unwrap()[i] = Some(r);
                        if failed {
                            // The others stop taking work: the call fails anyway.
                            next.store(batches.len(), std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        let mut out = Vec::with_capacity(texts.len());
        for r in results {
            out.extend(r.context("a batch was not sent")??);
        }
        Ok(out)
    }

    /// One request, checked: the expected count, dimension and finite values.
    fn send(&self, texts: &[&str], first_contact: bool) -> Result<Vec<Vector>> {
        let expected = self
            .dimension
            .or_else(|| self.known.lock().unwrap().as_ref().map(|k| k.dimension));
        let url = self.api.embed_url(&self.base);
        let body = self.api.request(&self.model, texts);
        let vectors = self
            .client
            .post_json(&url, &self.headers, &body, first_contact, |answer| {
                let (vectors, _) = self.api.parse(answer)?;
                check_vectors(&self.name, texts.len(), expected, vectors)
            })
            .with_context(|| format!("{} ({})", self.name, self.describe()))?;
        Ok(vectors
            .into_iter()
            .zip(texts)
            .map(|(dense, text)| Vector {
                dense,
                sparse: None,
                tokens: estimate_tokens(text),
            })
            .collect())
    }
}

/// An array of numbers as f32 (`null` or text is refused by name).
pub fn floats(v: &Value, what: &str) -> Result<Vec<f32>> {
    v.as_array()
        .ok_or_else(|| anyhow!("{what} is not an array"))?
        .iter()
        .map(|x| {
            x.as_f64()
                .map(|f| f as f32)
                .ok_or_else(|| anyhow!("{what} holds {x}, not a number"))
        })
        .collect()
}

/// `url` without what may hold a secret: `user:pass@` and the query.
pub fn shown_url(url: &str) -> String {
    let url = url.split(['?', '#']).next().unwrap_or(url);
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('/') {
            Some((authority, path)) => {
                let host = authority.rsplit('@').next().unwrap_or(authority);
                format!("{scheme}://{host}/{path}")
            }
            None => format!("{scheme}://{}", rest.rsplit('@').next().unwrap_or(rest)),
        },
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::shown_url;

    #[test]
    fn urls_are_shown_without_credentials() {
        assert_eq!(
            shown_url("https://u:p@h.example/v1?api-key=k"),
            "https://h.example/v1"
        );
        assert_eq!(
            shown_url("http://127.0.0.1:11434"),
            "http://127.0.0.1:11434"
        );
        assert_eq!(shown_url("http://me@h:1"), "http://h:1");
    }
}
