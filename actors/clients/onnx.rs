//! A text-pair classifier on ONNX Runtime: the shared engine of the cross-encoder re-ranker and the
//! ONNX NLI verifier.
//!
//! Inference is CPU-bound and blocking, so it runs on worker threads of its own, each owning one
//! ONNX session (`sessions`, each with `threads` intra-op threads). A worker forms a *round* from
//! the calls waiting for it: with `coalesce_ms = 0` one call, as before batching across events
//! existed; otherwise every call that arrives within `coalesce_ms` (up to `coalesce_max_pairs`
//! pairs), so the pairs of several events fill whole batches of similar length. A round's pairs are
//! sorted by length and cut into batches of `batch_size`, and each call gets its own rows back.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use ort::environment::Environment;
use ort::session::{Session, SessionInputValue};
use ort::value::Tensor;
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};
use tokio::sync::oneshot;

use crate::config::{ExecutionProvider, ModelSettings, OnnxSettings};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot load ONNX Runtime from {path}: {message} (run scripts/setup.sh, or set ORT_DYLIB_PATH)")]
    Runtime { path: PathBuf, message: String },
    #[error("cannot load model {path}: {message}")]
    Load { path: PathBuf, message: String },
    #[error("inference failed: {0}")]
    Inference(String),
    #[error("rerank.cache.mode = \"replay\" and the score cache has no entry {0} for this pair")]
    NotCached(String),
}

// ONNX Runtime allows one environment per process: load it once, remember the outcome.
static ENVIRONMENT: OnceLock<Result<Environment, String>> = OnceLock::new();

/// Loads `libonnxruntime.so` once per process; later calls get the first outcome.
pub fn init_runtime(library: &Path) -> Result<Environment, ModelError> {
    let outcome = ENVIRONMENT
        .get_or_init(|| ort::init_from(library).map_err(|e| e.to_string())?.build().map_err(|e| e.to_string()));
    outcome.clone().map_err(|message| ModelError::Runtime { path: library.to_path_buf(), message })
}

/// The CPUs this process may use: its cgroup quota or CPU affinity when set (a pod's `limits.cpu`),
/// not the node's core count, which would oversubscribe a small pod many times over.
pub fn cpu_quota() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// How many sessions, and intra-op threads each, a model runs with. 0 means derived from the CPU
/// quota: one single-threaded session per CPU. Pairs scored one at a time (the default batch size)
/// are small matrix products that split poorly across threads: on 2 CPUs two sessions of one thread
/// scored 26.2 pairs/s against 18.8 for one session of two (docs/performance.md).
pub fn resolve_parallelism(settings: &ModelSettings) -> (usize, usize) {
    let quota = cpu_quota();
    let (sessions, threads) = match (settings.sessions, settings.threads) {
        (0, 0) => (quota, 1),
        (0, threads) => (quota / threads.max(1), threads),
        (sessions, 0) => (sessions, quota / sessions),
        fixed => fixed,
    };
    (sessions.max(1), threads.max(1))
}

/// One model's ONNX session, built the same way for the workers and for `lacuna bench rerank`, and
/// the provider it runs on (`cuda` falls back to the CPU with a warning).
pub fn open_session(
    model_path: &Path,
    runtime: &Path,
    threads: usize,
    provider: ExecutionProvider,
) -> Result<(Session, ExecutionProvider), ModelError> {
    let environment = init_runtime(runtime)?;
    let load_error = |message: String| ModelError::Load { path: model_path.to_path_buf(), message };
    // `ort::Error<SessionBuilder>` is not Send: turn it into a string at once.
    let builder = Session::builder(&environment)
        .map_err(|e| load_error(e.to_string()))?
        .with_intra_threads(threads.max(1))
        .map_err(|e| load_error(e.to_string()))?;
    let (mut builder, used) = super::gpu::with_provider(builder, provider).map_err(load_error)?;
    Ok((builder.commit_from_file(model_path).map_err(|e| load_error(e.to_string()))?, used))
}

/// The tokenizer side of a pair classifier: turns a batch of pairs into the model's inputs.
#[derive(Clone)]
pub struct PairEncoder {
    tokenizer: Tokenizer,
    wants_token_types: bool,
    pub batch_size: usize,
    /// The `model` label of this model's metrics.
    pub label: &'static str,
}

/// One batch's model inputs, and how many of its tokens are real (not padding).
pub struct Encoded {
    pub inputs: Vec<(Cow<'static, str>, SessionInputValue<'static>)>,
    pub pairs: usize,
    pub real_tokens: usize,
    pub padded_tokens: usize,
}

impl PairEncoder {
    fn load(
        label: &'static str,
        dir: &Path,
        batch_size: usize,
        max_length: usize,
        session: &Session,
    ) -> Result<Self, ModelError> {
        let tokenizer_path = dir.join("tokenizer.json");
        let mut tokenizer = Tokenizer::from_file(&tokenizer_path)
            .map_err(|e| ModelError::Load { path: tokenizer_path.clone(), message: e.to_string() })?;
        // The shipped tokenizer pads every input to 512 tokens; padding to the longest pair of the
        // batch makes short pairs many times cheaper.
        let mut padding = tokenizer.get_padding().cloned().unwrap_or_else(PaddingParams::default);
        padding.strategy = PaddingStrategy::BatchLongest;
        tokenizer.with_padding(Some(padding));
        tokenizer
            .with_truncation(Some(TruncationParams { max_length, ..Default::default() }))
            .map_err(|e| ModelError::Load { path: tokenizer_path, message: e.to_string() })?;
        let wants_token_types = session.inputs().iter().any(|input| input.name() == "token_type_ids");
        Ok(PairEncoder { tokenizer, wants_token_types, batch_size: batch_size.max(1), label })
    }

    /// The same encoder, batching by `batch_size`.
    pub fn with_batch_size(&self, batch_size: usize) -> PairEncoder {
        PairEncoder { batch_size: batch_size.max(1), ..self.clone() }
    }

    /// Word pieces in `text` (no special tokens; long texts count up to the truncation length).
    pub fn count_tokens(&self, text: &str) -> usize {
        self.tokenizer.encode(text, false).map(|e| e.get_ids().len()).unwrap_or(0)
    }

    /// The order in which pairs are batched: by length, so a batch pads little.
    pub fn length_order(pairs: &[(String, String)]) -> Vec<usize> {
        let mut order: Vec<usize> = (0..pairs.len()).collect();
        order.sort_by_key(|&i| pairs[i].0.len() + pairs[i].1.len());
        order
    }

    pub fn encode(&self, batch: Vec<(String, String)>) -> Result<Encoded, ModelError> {
        let n = batch.len();
        let encodings = self.tokenizer.encode_batch(batch, true).map_err(|e| inference(&e))?;
        let seq = encodings.first().map_or(0, |e| e.get_ids().len());
        let flatten = |f: fn(&tokenizers::Encoding) -> &[u32]| -> Vec<i64> {
            encodings.iter().flat_map(|e| f(e).iter().map(|&v| v as i64)).collect()
        };
        let real_tokens = encodings.iter().map(|e| e.get_attention_mask().iter().filter(|&&m| m == 1).count()).sum();
        let mut inputs: Vec<(Cow<'static, str>, SessionInputValue<'static>)> = vec![
            ("input_ids".into(), tensor(n, seq, flatten(|e| e.get_ids()))?.into()),
            ("attention_mask".into(), tensor(n, seq, flatten(|e| e.get_attention_mask()))?.into()),
        ];
        if self.wants_token_types {
            inputs.push(("token_type_ids".into(), tensor(n, seq, flatten(|e| e.get_type_ids()))?.into()));
        }
        Ok(Encoded { inputs, pairs: n, real_tokens, padded_tokens: n * seq })
    }

    /// Scores one encoded batch on `session`: the logits row of every pair, in batch order.
    pub fn run(&self, session: &mut Session, encoded: Encoded) -> Result<Vec<Vec<f32>>, ModelError> {
        let m = &crate::metrics::METRICS;
        m.model_batch_size.with_label_values(&[self.label]).observe(encoded.pairs as f64);
        m.model_pairs.with_label_values(&[self.label]).inc_by(encoded.pairs as u64);
        m.model_tokens.with_label_values(&[self.label, "real"]).inc_by(encoded.real_tokens as u64);
        m.model_tokens.with_label_values(&[self.label, "padded"]).inc_by(encoded.padded_tokens as u64);
        let _timer = m.model_inference_seconds.with_label_values(&[self.label]).start_timer();
        let outputs = session.run(encoded.inputs).map_err(|e| inference(&e))?;
        let (shape, logits) = outputs[0].try_extract_tensor::<f32>().map_err(|e| inference(&e))?;
        let width = shape.get(1).copied().unwrap_or(1).max(1) as usize;
        Ok(logits.chunks(width).map(|row| row.to_vec()).collect())
    }

    /// Every pair's logits row, in input order: sorted by length, cut into batches, scored.
    fn classify(&self, session: &mut Session, pairs: &[(String, String)]) -> Result<Vec<Vec<f32>>, ModelError> {
        let mut rows = vec![Vec::new(); pairs.len()];
        for chunk in Self::length_order(pairs).chunks(self.batch_size) {
            let batch: Vec<(String, String)> = chunk.iter().map(|&i| pairs[i].clone()).collect();
            for (row, &i) in self.run(session, self.encode(batch)?)?.into_iter().zip(chunk) {
                rows[i] = row;
            }
        }
        Ok(rows)
    }
}

fn inference(e: &dyn std::fmt::Display) -> ModelError {
    ModelError::Inference(e.to_string())
}

fn tensor(rows: usize, cols: usize, data: Vec<i64>) -> Result<Tensor<i64>, ModelError> {
    Tensor::from_array(([rows, cols], data)).map_err(|e| inference(&e))
}

/// One caller's pairs and where its rows go.
struct Job {
    pairs: Vec<(String, String)>,
    reply: oneshot::Sender<Result<Vec<Vec<f32>>, ModelError>>,
}

/// How a worker gathers a round.
#[derive(Clone, Copy)]
struct Coalescing {
    wait: Duration,
    max_pairs: usize,
}

pub struct PairClassifier {
    encoder: Arc<PairEncoder>,
    jobs: Sender<Job>,
    sessions: usize,
    threads: usize,
    provider: ExecutionProvider,
    graph: PathBuf,
    /// The workers' sessions, for [`PairClassifier::release`].
    slots: Vec<Arc<Mutex<Option<Session>>>>,
}

impl PairClassifier {
    /// Loads the graph for the provider the sessions run on (`ModelSettings::graph_path`) and
    /// `tokenizer.json` from `settings.model_dir`, and starts the workers. On CUDA the `cuda` table's
    /// batch, sessions and coalescing apply; a CUDA provider that does not start falls back to the
    /// CPU with the CPU's settings and graph.
    pub fn load(label: &'static str, settings: &ModelSettings, onnx: &OnnxSettings) -> Result<Self, ModelError> {
        let mut provider = super::gpu::expected(onnx.execution_provider);
        let (settings, model_path, sessions, threads, opened) = loop {
            let settings = settings.on(provider);
            let (sessions, threads) = resolve_parallelism(&settings);
            let model_path = settings.graph_path(provider);
            let (first, used) = open_session(&model_path, &onnx.library_path, threads, provider)?;
            if used != provider {
                provider = used;
                continue;
            }
            let mut opened = vec![first];
            for _ in 1..sessions {
                opened.push(open_session(&model_path, &onnx.library_path, threads, provider)?.0);
            }
            break (settings, model_path, sessions, threads, opened);
        };
        tracing::info!(model = label, graph = %model_path.display(), ?provider, sessions, threads, "model loaded");
        let encoder = Arc::new(PairEncoder::load(
            label,
            &settings.model_dir,
            settings.batch_size,
            settings.max_length,
            &opened[0],
        )?);
        let coalescing = Coalescing {
            wait: Duration::from_millis(settings.coalesce_ms),
            max_pairs: settings.coalesce_max_pairs.max(1),
        };
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        // Workers take turns at the queue: while one scores a round, the next gathers its own.
        let queue = Arc::new(Mutex::new(queue));
        let mut slots = Vec::new();
        for (n, session) in opened.into_iter().enumerate() {
            let (encoder, queue) = (encoder.clone(), queue.clone());
            let slot = held(session);
            slots.push(slot.clone());
            std::thread::Builder::new()
                .name(format!("{label}-{n}"))
                .spawn(move || work(&slot, &encoder, &queue, coalescing))
                .map_err(|e| ModelError::Load {
                    path: model_path.clone(),
                    message: format!("cannot start a worker: {e}"),
                })?;
        }
        Ok(PairClassifier { encoder, jobs, sessions, threads, provider, graph: model_path, slots })
    }

    /// Drops this model's sessions now, as [`release_sessions`] drops every model's.
    pub fn release(&self) -> usize {
        empty(self.slots.iter().cloned())
    }

    /// The graph file the sessions loaded.
    pub fn graph(&self) -> &Path {
        &self.graph
    }

    pub fn encoder(&self) -> &PairEncoder {
        &self.encoder
    }

    /// (sessions, intra-op threads per session) as resolved from the settings and the CPU quota.
    pub fn parallelism(&self) -> (usize, usize) {
        (self.sessions, self.threads)
    }

    /// Where the sessions run: `cuda` only when the CUDA provider started.
    pub fn provider(&self) -> ExecutionProvider {
        self.provider
    }

    /// Word pieces in `text` (no special tokens; long texts count up to the truncation length).
    pub fn count_tokens(&self, text: &str) -> usize {
        self.encoder.count_tokens(text)
    }

    /// The logits row of every pair, in input order. Waits for a worker; never blocks the caller's
    /// thread.
    pub async fn classify(&self, pairs: Vec<(String, String)>) -> Result<Vec<Vec<f32>>, ModelError> {
        if pairs.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, rows) = oneshot::channel();
        let stopped = || ModelError::Inference(format!("the {} workers have stopped", self.encoder.label));
        self.jobs.send(Job { pairs, reply }).map_err(|_| stopped())?;
        rows.await.map_err(|_| stopped())?
    }
}

/// A worker's life: gather a round, score it, hand each job its rows; ends when every
/// [`PairClassifier`] handle is gone. A round holds the session's slot, so [`release_sessions`]
/// waits for it; after the release, calls get an error.
fn work(slot: &Mutex<Option<Session>>, encoder: &PairEncoder, queue: &Mutex<Receiver<Job>>, coalescing: Coalescing) {
    while let Some(round) = gather(queue, coalescing) {
        let pairs: Vec<(String, String)> = round.iter().flat_map(|job| job.pairs.iter().cloned()).collect();
        let mut session = slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let scored = match session.as_mut() {
            Some(session) => encoder.classify(session, &pairs),
            None => Err(ModelError::Inference(format!(
                "the {} sessions were released: the process is ending",
                encoder.label
            ))),
        };
        match scored {
            Ok(rows) => {
                let mut rows = rows.into_iter();
                for job in round {
                    let own: Vec<Vec<f32>> = rows.by_ref().take(job.pairs.len()).collect();
                    // A caller that gave up (its event was cancelled) no longer wants its rows.
                    let _ = job.reply.send(Ok(own));
                }
            }
            Err(error) => {
                for job in round {
                    let _ = job.reply.send(Err(ModelError::Inference(error.to_string())));
                }
            }
        }
    }
}

/// Every worker's session, so that the process can drop them all before it exits.
static SESSIONS: Mutex<Vec<Weak<Mutex<Option<Session>>>>> = Mutex::new(Vec::new());

/// `session` in a slot that [`release_sessions`] can empty.
fn held(session: Session) -> Arc<Mutex<Option<Session>>> {
    // A process that exits early (a failed Kafka transaction) drops them first too.
    crate::telemetry::exit::at_exit("onnx sessions", || {
        release_sessions();
    });
    let slot = Arc::new(Mutex::new(Some(session)));
    let mut sessions = SESSIONS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    sessions.retain(|weak| weak.strong_count() > 0);
    sessions.push(Arc::downgrade(&slot));
    slot
}

/// Drops every worker's session now, each after its round in progress, and says how many. The
/// process calls this before it exits: a session left to the exit is torn down after the CUDA
/// driver, and the CUDA provider then aborts the process ("CUDA failure 4: driver shutting down" in
/// `cudaFreeHost`). Workers stay, answering every later call with an error.
pub fn release_sessions() -> usize {
    let sessions = std::mem::take(&mut *SESSIONS.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
    empty(sessions.iter().filter_map(Weak::upgrade))
}

/// Empties `slots`, each after its round in progress; how many still held a session.
fn empty(slots: impl Iterator<Item = Arc<Mutex<Option<Session>>>>) -> usize {
    slots.filter(|slot| slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take().is_some()).count()
}

/// The next round: the first job waiting, then with coalescing every job arriving within the wait,
/// up to the pair cap. `None` once the queue is closed and empty.
fn gather(queue: &Mutex<Receiver<Job>>, coalescing: Coalescing) -> Option<Vec<Job>> {
    // A worker that panicked poisons nothing it held mid-update: the receiver is still whole.
    let queue = queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let first = queue.recv().ok()?;
    let mut pairs = first.pairs.len();
    let mut round = vec![first];
    if coalescing.wait.is_zero() {
        return Some(round);
    }
    let deadline = Instant::now() + coalescing.wait;
    while pairs < coalescing.max_pairs {
        // Jobs already waiting join at once: under load a round fills without waiting at all.
        let next = match queue.try_recv() {
            Ok(job) => Ok(job),
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => queue.recv_timeout(deadline.saturating_duration_since(Instant::now())),
        };
        match next {
            Ok(job) => {
                pairs += job.pairs.len();
                round.push(job);
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
        }
    }
    Some(round)
}
