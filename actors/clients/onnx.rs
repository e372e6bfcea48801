//! A text-pair classifier on ONNX Runtime: the shared engine of the cross-encoder re-ranker and the
//! ONNX NLI verifier. Inference is CPU-bound and blocking: callers run it on the blocking pool.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use ort::environment::Environment;
use ort::session::{Session, SessionInputValue};
use ort::value::Tensor;
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot load ONNX Runtime from {path}: {message} (run scripts/setup.sh, or set ORT_DYLIB_PATH)")]
    Runtime { path: PathBuf, message: String },
    #[error("cannot load model {path}: {message}")]
    Load { path: PathBuf, message: String },
    #[error("inference failed: {0}")]
    Inference(String),
}

// ONNX Runtime allows one environment per process: load it once, remember the outcome.
static ENVIRONMENT: OnceLock<Result<Environment, String>> = OnceLock::new();

/// Loads `libonnxruntime.so` once per process; later calls get the first outcome.
pub fn init_runtime(library: &Path) -> Result<Environment, ModelError> {
    let outcome = ENVIRONMENT
        .get_or_init(|| ort::init_from(library).map_err(|e| e.to_string())?.build().map_err(|e| e.to_string()));
    outcome.clone().map_err(|message| ModelError::Runtime { path: library.to_path_buf(), message })
}

pub struct PairClassifier {
    // `Session::run` takes `&mut self`; one inference at a time per model, the caller bounds the queue.
    session: Mutex<Session>,
    tokenizer: Tokenizer,
    wants_token_types: bool,
    batch_size: usize,
    /// The `model` label of this model's metrics.
    label: &'static str,
}

impl PairClassifier {
    /// Loads `model.onnx` and `tokenizer.json` from `dir`.
    pub fn load(
        label: &'static str,
        dir: &Path,
        runtime: &Path,
        threads: usize,
        batch_size: usize,
        max_length: usize,
    ) -> Result<Self, ModelError> {
        let environment = init_runtime(runtime)?;
        let model_path = dir.join("model.onnx");
        let load_error = |message: String| ModelError::Load { path: model_path.clone(), message };
        // `ort::Error<SessionBuilder>` is not Send: turn it into a string at once.
        let session = Session::builder(&environment)
            .map_err(|e| load_error(e.to_string()))?
            .with_intra_threads(threads.max(1))
            .map_err(|e| load_error(e.to_string()))?
            .commit_from_file(&model_path)
            .map_err(|e| load_error(e.to_string()))?;
        let wants_token_types = session.inputs().iter().any(|input| input.name() == "token_type_ids");

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
        Ok(PairClassifier {
            session: Mutex::new(session),
            tokenizer,
            wants_token_types,
            batch_size: batch_size.max(1),
            label,
        })
    }

    /// Word pieces in `text` (no special tokens; long texts count up to the truncation length).
    pub fn count_tokens(&self, text: &str) -> usize {
        self.tokenizer.encode(text, false).map(|e| e.get_ids().len()).unwrap_or(0)
    }

    /// The logits row of every pair, in input order.
    pub fn classify(&self, pairs: &[(String, String)]) -> Result<Vec<Vec<f32>>, ModelError> {
        // Batching pairs of similar length keeps padding (wasted compute) small.
        let mut order: Vec<usize> = (0..pairs.len()).collect();
        order.sort_by_key(|&i| pairs[i].0.len() + pairs[i].1.len());
        let mut rows = vec![Vec::new(); pairs.len()];
        for chunk in order.chunks(self.batch_size) {
            let batch: Vec<(String, String)> = chunk.iter().map(|&i| pairs[i].clone()).collect();
            for (row, &i) in self.classify_batch(batch)?.into_iter().zip(chunk) {
                rows[i] = row;
            }
        }
        Ok(rows)
    }

    fn classify_batch(&self, batch: Vec<(String, String)>) -> Result<Vec<Vec<f32>>, ModelError> {
        let inference = |e: &dyn std::fmt::Display| ModelError::Inference(e.to_string());
        let n = batch.len();
        let encodings = self.tokenizer.encode_batch(batch, true).map_err(|e| inference(&e))?;
        let seq = encodings.first().map_or(0, |e| e.get_ids().len());
        let flatten = |f: fn(&tokenizers::Encoding) -> &[u32]| -> Vec<i64> {
            encodings.iter().flat_map(|e| f(e).iter().map(|&v| v as i64)).collect()
        };
        let mut inputs: Vec<(Cow<'_, str>, SessionInputValue<'_>)> = vec![
            ("input_ids".into(), tensor(n, seq, flatten(|e| e.get_ids()))?.into()),
            ("attention_mask".into(), tensor(n, seq, flatten(|e| e.get_attention_mask()))?.into()),
        ];
        if self.wants_token_types {
            inputs.push(("token_type_ids".into(), tensor(n, seq, flatten(|e| e.get_type_ids()))?.into()));
        }
        let m = &crate::metrics::METRICS;
        m.model_batch_size.with_label_values(&[self.label]).observe(n as f64);
        m.model_pairs.with_label_values(&[self.label]).inc_by(n as u64);
        let _timer = m.model_inference_seconds.with_label_values(&[self.label]).start_timer();
        let mut session = self.session.lock().unwrap();
        let outputs = session.run(inputs).map_err(|e| inference(&e))?;
        let (shape, logits) = outputs[0].try_extract_tensor::<f32>().map_err(|e| inference(&e))?;
        let width = shape.get(1).copied().unwrap_or(1).max(1) as usize;
        Ok(logits.chunks(width).map(|row| row.to_vec()).collect())
    }
}

fn tensor(rows: usize, cols: usize, data: Vec<i64>) -> Result<Tensor<i64>, ModelError> {
    Tensor::from_array(([rows, cols], data)).map_err(|e| ModelError::Inference(e.to_string()))
}
