//! The embedding stage of a run: messages chunked, looked up in the
//! embedding cache, embedded in length-sorted groups by the first provider
//! that may, and written by another thread while the next group embeds.

use std::sync::mpsc;
use std::time::Instant;

use anyhow::Result;
use rayon::prelude::*;

use super::admission::{Embedders, NotEmbedded};
use super::chunk::{ChunkParams, Chunker};
use super::snapshot::DENSE_ONLY;
use super::store::{ChunkRow, MessageRow, Store};
use super::{IndexOptions, ProgressFn, Report};
use crate::provider::{Input, Unavailable};
use crate::source::hermes::Message;
use recall_engine::tokenize::Tokens;

/// Tokens embedded per group (one writer transaction per group).
const GROUP_TOKENS: usize = 16_384;

/// A message cut into chunks, with what is known of their embeddings.
pub(super) struct Pending {
    message: Message,
    fingerprint: String,
    chunks: Vec<PendingChunk>,
    /// Bytes at the message's end past its last chunk (`MAX_CHUNKS_PER_MESSAGE`).
    skipped_bytes: usize,
}

struct PendingChunk {
    text: String,
    /// Token ids when recall's own tokenizer cut the chunk.
    tokens: Option<Tokens>,
    token_count: usize,
    cached: Option<ChunkRow>,
}

/// Messages chunked, embedded and written per wave: early commits, bounded memory.
const WAVE_MESSAGES: usize = 512;

/// Length-sorted groups of about `GROUP_TOKENS` tokens.
fn groups(mut pending: Vec<Pending>) -> Vec<Vec<Pending>> {
    let size = |p: &Pending| p.chunks.iter().map(|c| c.token_count).sum::<usize>();
    pending.sort_by_key(|p| std::cmp::Reverse(size(p)));
    let mut groups: Vec<Vec<Pending>> = Vec::new();
    let mut tokens_in_group = usize::MAX;
    for p in pending {
        let n = size(&p);
        if tokens_in_group.saturating_add(n) > GROUP_TOKENS {
            groups.push(Vec::new());
            tokens_in_group = 0;
        }
        tokens_in_group += n;
        groups.last_mut().unwrap().push(p);
    }
    groups
}

/// The embedding stage of one run: chunk, look up the cache, embed the
/// rest with the chain, hand rows to the writer.
pub(super) struct Stage<'a> {
    pub(super) embedders: &'a Embedders<'a>,
    pub(super) chunker: Chunker<'a>,
    /// The index builder's cache namespace: the cache is read under it.
    pub(super) namespace: &'a str,
    pub(super) sparse: bool,
}

impl Stage<'_> {
    /// Chunks and tokenises `wave`, taking what the cache has.
    fn prepare(
        &self,
        wave: Vec<(Message, String)>,
        cache: &Store,
        params: ChunkParams,
    ) -> Result<Vec<Pending>> {
        let mut pending: Vec<Pending> = wave
            .into_par_iter()
            .map(|(message, fingerprint)| -> Result<Pending> {
                let cut = self.chunker.chunk(&message.text, params)?;
                let chunks = cut
                    .pieces
                    .into_iter()
                    .map(|text| {
                        let tokens = match self.chunker {
                            Chunker::Tokens(t) => Some(t.encode(&text)?),
                            Chunker::Estimate => None,
                        };
                        let token_count = tokens.as_ref().map_or_else(
                            || recall_engine::tokenize::estimate_tokens(&text),
                            |t| t.ids.len(),
                        );
                        Ok(PendingChunk {
                            text,
                            tokens,
                            token_count,
                            cached: None,
                        })
                    })
                    .collect::<Result<_>>()?;
                Ok(Pending {
                    message,
                    fingerprint,
                    chunks,
                    skipped_bytes: cut.skipped_bytes,
                })
            })
            .collect::<Result<_>>()?;
        for p in &mut pending {
            for c in &mut p.chunks {
                c.cached = cache.cached(self.namespace, &c.text, c.token_count)?;
            }
        }
        Ok(pending)
    }

    /// Embeds what `group` lacks and assembles its rows, in batches with the
    /// cache namespace of the provider that embedded them. When a provider
    /// refuses the group, it is halved until the message it refuses is
    /// found; that message is left out (and counted), the rest go on.
    fn embed_group(
        &self,
        mut group: Vec<Pending>,
        report: &mut Report,
    ) -> Result<Vec<(Vec<MessageRow>, String)>, Unavailable> {
        match self.embed_whole(&mut group, report) {
            Ok(rows) => Ok(vec![rows]),
            Err(NotEmbedded::Unavailable(u)) => Err(u),
            Err(NotEmbedded::Rejected(why)) if group.len() == 1 => {
                report.rejected_messages += 1;
                tracing::warn!(
                    "message {} of session {} left out: {why}",
                    group[0].message.id,
                    group[0].message.session_id
                );
                Ok(Vec::new())
            }
            Err(NotEmbedded::Rejected(_)) => {
                let second = group.split_off(group.len() / 2);
                let mut rows = self.embed_group(group, report)?;
                rows.extend(self.embed_group(second, report)?);
                Ok(rows)
            }
        }
    }

    /// `embed_group` in one call: the group is left as it was on failure.
    fn embed_whole(
        &self,
        group: &mut Vec<Pending>,
        report: &mut Report,
    ) -> Result<(Vec<MessageRow>, String), NotEmbedded> {
        let missing: Vec<Input> = group
            .iter()
            .flat_map(|p| p.chunks.iter().filter(|c| c.cached.is_none()))
            .map(|c| Input {
                text: &c.text,
                tokens: c.tokens.as_ref(),
            })
            .collect();
        let (vectors, by) = if missing.is_empty() {
            (Vec::new(), None)
        } else {
            let (v, by) = self.embedders.embed(&missing, self.sparse)?;
            *report.embedded_by.entry(by.clone()).or_default() += v.len();
            (v, Some(by))
        };
        let namespace = match by.as_deref() {
            Some(name) => self.embedders.namespace_of(name),
            None => self.namespace.to_string(),
        };
        let mut embedded = vectors.into_iter();
        let mut rows = Vec::with_capacity(group.len());
        for p in std::mem::take(group) {
            let mut chunks = Vec::with_capacity(p.chunks.len());
            for c in p.chunks {
                report.chunks += 1;
                report.truncated_chunks += c.tokens.as_ref().is_some_and(|t| t.truncated) as usize;
                let row = match c.cached {
                    Some(row) => {
                        report.cached_chunks += 1;
                        row
                    }
                    None => {
                        // `embed` checked there is one vector per input.
                        let v = embedded.next().expect("one vector per input");
                        report.tokens += v.tokens;
                        ChunkRow {
                            text: c.text,
                            tokens: v.tokens,
                            dense: v.dense,
                            sparse: v.sparse,
                        }
                    }
                };
                chunks.push(row);
            }
            let dense_only = self.sparse && chunks.iter().any(|c| c.sparse.is_none());
            if p.skipped_bytes > 0 {
                report.capped_messages += 1;
                if report.capped_ids.len() < 10 {
                    report.capped_ids.push(p.message.id);
                }
            }
            rows.push(MessageRow {
                id: p.message.id,
                session_id: p.message.session_id,
                role: p.message.role,
                timestamp: p.message.timestamp,
                fingerprint: if dense_only {
                    format!("{}{DENSE_ONLY}", p.fingerprint)
                } else {
                    p.fingerprint
                },
                chunks,
                skipped_bytes: p.skipped_bytes,
            });
        }
        report.embedded_messages += rows.len();
        Ok((rows, namespace))
    }

    /// Three stages at once: a preparer chunks and tokenises the next wave
    /// (reading the cache through its own connection), this thread embeds,
    /// and a writer commits what was embedded. When no provider can embed,
    /// the run stops after committing what it has (`report.paused`).
    pub(super) fn run(
        &self,
        store: &mut Store,
        profile: &str,
        todo: Vec<(Message, String)>,
        options: &IndexOptions,
        progress: ProgressFn,
        report: &mut Report,
    ) -> Result<()> {
        if todo.is_empty() {
            return Ok(());
        }
        let total = todo.len();
        progress(0, total, 0, 0);
        let cache = Store::open(store.path())?;
        let (group_tx, group_rx) = mpsc::sync_channel::<Vec<Pending>>(2);
        let (row_tx, row_rx) = mpsc::sync_channel::<(Vec<MessageRow>, String)>(1);
        std::thread::scope(|scope| -> Result<()> {
            let preparer = scope.spawn(move || -> Result<()> {
                let mut todo = todo.into_iter().peekable();
                while todo.peek().is_some() {
                    let wave: Vec<_> = todo.by_ref().take(WAVE_MESSAGES).collect();
                    for group in groups(self.prepare(wave, &cache, options.chunk)?) {
                        if group_tx.send(group).is_err() {
                            return Ok(()); // the embedder stopped; its error is reported
                        }
                    }
                }
                Ok(())
            });
            let writer = scope.spawn(move || -> Result<()> {
                for (rows, namespace) in row_rx {
                    store.put_messages(profile, &namespace, &rows)?;
                }
                Ok(())
            });
            let mut done = 0;
            let result = (|| -> Result<()> {
                for group in group_rx {
                    let started = Instant::now();
                    let size = group.len();
                    let embedded = self.embed_group(group, report);
                    report.embed_seconds += started.elapsed().as_secs_f64();
                    let batches = match embedded {
                        Ok(batches) => batches,
                        Err(unavailable) => {
                            self.embedders.refuse_if_none_fits()?;
                            report.paused = Some(unavailable.to_string());
                            report.pending_messages += total - done;
                            break;
                        }
                    };
                    done += size;
                    // The writer failing ends the loop; its error is reported below.
                    if batches.into_iter().any(|rows| row_tx.send(rows).is_err()) {
                        break;
                    }
                    progress(done, total, report.chunks, report.tokens);
                }
                Ok(())
            })();
            drop(row_tx);
            let joined = |h: std::thread::ScopedJoinHandle<'_, Result<()>>, what: &str| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("the index {what} thread panicked"))?
            };
            // Dropping the receiver (by returning) stops the preparer.
            let prepared = joined(preparer, "preparer");
            let written = joined(writer, "writer");
            result.and(prepared).and(written)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message of one chunk per entry of `chunk_tokens`.
    fn pending(id: i64, chunk_tokens: &[usize]) -> Pending {
        Pending {
            message: Message {
                id,
                session_id: "s".into(),
                role: "user".into(),
                timestamp: 0.0,
                text: String::new(),
            },
            fingerprint: String::new(),
            chunks: chunk_tokens
                .iter()
                .map(|&token_count| PendingChunk {
                    text: String::new(),
                    tokens: None,
                    token_count,
                    cached: None,
                })
                .collect(),
            skipped_bytes: 0,
        }
    }

    #[test]
    fn groups_are_longest_first_and_within_the_budget() {
        let sizes = [300, 9_000, 40, 8_000, 7_000, 512, 1];
        let all: Vec<Pending> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| pending(i as i64, &[n / 2, n - n / 2]))
            .collect();
        let groups = groups(all);
        let tokens = |p: &Pending| p.chunks.iter().map(|c| c.token_count).sum::<usize>();
        let order: Vec<usize> = groups.iter().flatten().map(tokens).collect();
        let mut sorted = sizes.to_vec();
        sorted.sort_by(|a, b| b.cmp(a));
        assert_eq!(order, sorted, "every message once, longest first");
        for group in &groups {
            assert!(!group.is_empty());
            let sum: usize = group.iter().map(tokens).sum();
            assert!(sum <= GROUP_TOKENS || group.len() == 1, "{sum}");
        }
        // 9,000 and 8,000 cannot share a group; 8,000 takes all the rest.
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[1].len(), sizes.len() - 1);
    }

    #[test]
    fn a_message_over_the_budget_gets_a_group_of_its_own() {
        let groups = groups(vec![pending(1, &[GROUP_TOKENS + 1]), pending(2, &[10])]);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0][0].message.id, 1);
        assert!(super::groups(Vec::new()).is_empty());
    }
}
