//! Dynamic batching: inputs of concurrent requests share forward passes.
//!
//! Requests put their (already tokenised) inputs into a queue, one line per
//! request; a single worker thread fills each forward pass by taking one
//! input from each waiting request in turn, until the next would exceed the
//! pass's token budget (an input longer than the budget gets a pass of its
//! own), runs the pass, and hands each input's embedding back to its request.
//! Taking inputs in turn means a request of 2,000 long inputs cannot keep a
//! short query waiting for more than the pass in progress: the query rides in
//! the next one. The queue is bounded: when it is full a request is refused at
//! once (the server answers 503 with Retry-After) instead of growing memory
//! without limit.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use tokio::sync::oneshot;

use super::metrics::Metrics;
use recall_engine::tokenize::Tokens;
use recall_engine::{Embedder, Embedding, Outputs};

#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("the server is busy: {queued} inputs are waiting (limit {limit}); retry shortly")]
    QueueFull { queued: usize, limit: usize },
    #[error("the model failed on this batch: {0}")]
    Failed(String),
    #[error("the server is shutting down")]
    Closed,
}

pub struct Batcher {
    shared: Arc<Shared>,
}

/// Inputs of the urgent lane that are queued or running: while there are
/// any, the other lane's passes pause at their next layer boundary, so a
/// query waits for at most one layer of a bulk pass, not the whole pass.
#[derive(Default)]
pub struct Gate {
    urgent: Mutex<usize>,
    clear: Condvar,
}

impl Gate {
    fn add(&self, n: usize) {
        *self.urgent.lock().unwrap() += n;
    }

    fn done(&self, n: usize) {
        let mut urgent = self.urgent.lock().unwrap();
        *urgent = urgent.saturating_sub(n);
        if *urgent == 0 {
            self.clear.notify_all();
        }
    }

    fn wait_clear(&self) {
        let mut urgent = self.urgent.lock().unwrap();
        while *urgent > 0 {
            urgent = self.clear.wait(urgent).unwrap();
        }
    }
}

/// A lane's place relative to the other.
#[derive(Clone)]
pub enum Priority {
    /// Its inputs hold the gate.
    Urgent(Arc<Gate>),
    /// Its passes wait at layer boundaries while the gate is held.
    Yielding(Arc<Gate>),
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    max_queue: usize,
    priority: Priority,
}

#[derive(Default)]
struct Queue {
    /// Waiting requests, oldest first, each with the inputs not yet taken.
    waiting: VecDeque<VecDeque<Item>>,
    /// Inputs in `waiting`.
    len: usize,
    closed: bool,
}

struct Item {
    job: Arc<Job>,
    slot: usize,
    tokens: Tokens,
    enqueued: Instant,
}

struct Job {
    outputs: Outputs,
    state: Mutex<JobState>,
}

type Reply = oneshot::Sender<Result<Vec<Embedding>, BatchError>>;

struct JobState {
    results: Vec<Option<Embedding>>,
    remaining: usize,
    reply: Option<Reply>,
}

impl Batcher {
    /// Starts the worker thread.
    pub fn start(
        embedder: Arc<Embedder>,
        max_batch_tokens: usize,
        max_queue: usize,
        metrics: Arc<Metrics>,
        priority: Priority,
    ) -> Self {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
            max_queue,
            priority,
        });
        let worker = shared.clone();
        std::thread::Builder::new()
            .name("recall-batch".into())
            .spawn(move || worker.run(&embedder, max_batch_tokens.max(1), &metrics))
            .expect("cannot start the batching thread");
        Self { shared }
    }

    /// Embeds `inputs` (in their order) alongside whatever else is queued.
    pub async fn embed(
        &self,
        inputs: Vec<Tokens>,
        outputs: Outputs,
    ) -> Result<Vec<Embedding>, BatchError> {
        if inputs.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, answer) = oneshot::channel();
        let job = Arc::new(Job {
            outputs,
            state: Mutex::new(JobState {
                results: vec![None; inputs.len()],
                remaining: inputs.len(),
                reply: Some(reply),
            }),
        });
        {
            let mut queue = self.shared.queue.lock().unwrap();
            if queue.closed {
                return Err(BatchError::Closed);
            }
            let queued = queue.len;
            if queued + inputs.len() > self.shared.max_queue && queued > 0 {
                return Err(BatchError::QueueFull {
                    queued,
                    limit: self.shared.max_queue,
                });
            }
            let now = Instant::now();
            if let Priority::Urgent(gate) = &self.shared.priority {
                gate.add(inputs.len());
            }
            queue.len += inputs.len();
            queue.waiting.push_back(
                inputs
                    .into_iter()
                    .enumerate()
                    .map(|(slot, tokens)| Item {
                        job: job.clone(),
                        slot,
                        tokens,
                        enqueued: now,
                    })
                    .collect(),
            );
        }
        self.shared.ready.notify_one();
        answer.await.unwrap_or(Err(BatchError::Closed))
    }

    /// Inputs waiting for a pass.
    pub fn queued(&self) -> usize {
        self.shared.queue.lock().unwrap().len
    }

    /// Lets the worker finish what is queued, then stop.
    pub fn close(&self) {
        self.shared.queue.lock().unwrap().closed = true;
        self.shared.ready.notify_all();
    }
}

impl Shared {
    fn run(&self, embedder: &Embedder, budget: usize, metrics: &Metrics) {
        while let Some(pass) = self.next_pass(budget) {
            let started = Instant::now();
            for item in &pass {
                metrics.queue_seconds(started.duration_since(item.enqueued));
            }
            // One pass serves every request in it, so it computes what any of them asked for.
            let none = Outputs {
                dense: false,
                sparse: false,
                colbert: false,
            };
            let outputs = pass.iter().fold(none, |a, i| Outputs {
                dense: a.dense || i.job.outputs.dense,
                sparse: a.sparse || i.job.outputs.sparse,
                colbert: a.colbert || i.job.outputs.colbert,
            });
            let tokens: Vec<Tokens> = pass.iter().map(|i| i.tokens.clone()).collect();
            let result = match &self.priority {
                Priority::Yielding(gate) => {
                    embedder.embed_tokens_with(&tokens, outputs, &|| gate.wait_clear())
                }
                Priority::Urgent(_) => embedder.embed_tokens(&tokens, outputs),
            };
            if let Priority::Urgent(gate) = &self.priority {
                gate.done(pass.len());
            }
            metrics.pass(
                pass.len(),
                tokens.iter().map(|t| t.ids.len()).sum(),
                started.elapsed(),
            );
            tracing::debug!(
                "{} pass: {} inputs, {} tokens, waited {:?}, took {:?}",
                match self.priority {
                    Priority::Urgent(_) => "query",
                    Priority::Yielding(_) => "bulk",
                },
                pass.len(),
                tokens.iter().map(|t| t.ids.len()).sum::<usize>(),
                started.duration_since(pass[0].enqueued),
                started.elapsed()
            );
            match result {
                Ok(embeddings) => {
                    for (item, mut e) in pass.into_iter().zip(embeddings) {
                        let wanted = item.job.outputs;
                        if !wanted.dense {
                            e.dense = None;
                        }
                        if !wanted.sparse {
                            e.sparse = None;
                        }
                        if !wanted.colbert {
                            e.colbert = None;
                        }
                        item.job.deliver(item.slot, e);
                    }
                }
                Err(err) => {
                    let message = format!("{err:#}");
                    for item in pass {
                        item.job.fail(&message);
                    }
                }
            }
        }
    }

    /// The next pass's inputs, one from each waiting request in turn; None
    /// once closed and drained.
    fn next_pass(&self, budget: usize) -> Option<Vec<Item>> {
        let mut queue = self.queue.lock().unwrap();
        while queue.len == 0 {
            if queue.closed {
                return None;
            }
            queue = self.ready.wait(queue).unwrap();
        }
        let mut pass: Vec<Item> = Vec::new();
        let mut tokens = 0;
        'fill: loop {
            let mut took = false;
            for request in queue.waiting.iter_mut() {
                let Some(next) = request.front() else {
                    continue;
                };
                let len = next.tokens.ids.len();
                if !pass.is_empty() && tokens + len > budget {
                    break 'fill;
                }
                tokens += len;
                pass.extend(request.pop_front());
                took = true;
            }
            if !took {
                break;
            }
        }
        queue.waiting.retain(|r| !r.is_empty());
        queue.len -= pass.len();
        Some(pass)
    }
}

impl Job {
    fn deliver(&self, slot: usize, embedding: Embedding) {
        let mut state = self.state.lock().unwrap();
        state.results[slot] = Some(embedding);
        state.remaining -= 1;
        if state.remaining == 0
            && let Some(reply) = state.reply.take()
        {
            let results = std::mem::take(&mut state.results);
            let _ = reply.send(Ok(results.into_iter().flatten().collect()));
        }
    }

    fn fail(&self, message: &str) {
        if let Some(reply) = self.state.lock().unwrap().reply.take() {
            let _ = reply.send(Err(BatchError::Failed(message.to_string())));
        }
    }
}
