//! The cross-encoder re-ranker: scores (query, passage) pairs with a raw relevance logit.
//! Default model: cross-encoder/ms-marco-MiniLM-L-12-v2 (int8 ONNX), installed by scripts/setup.sh.

use std::sync::Arc;

use tokio::sync::Semaphore;

use super::onnx::{ModelError, PairClassifier};
use crate::settings::{ModelSettings, OnnxSettings};

#[derive(Clone)]
pub struct Reranker {
    model: Arc<PairClassifier>,
    // Bounds the queue of blocking inference jobs so a burst cannot pile up threads.
    slots: Arc<Semaphore>,
}

impl Reranker {
    pub fn load(settings: &ModelSettings, onnx: &OnnxSettings) -> Result<Self, ModelError> {
        let model = PairClassifier::load(
            "reranker",
            &settings.model_dir,
            &onnx.library_path,
            settings.threads,
            settings.batch_size,
            settings.max_length,
        )?;
        Ok(Reranker { model: Arc::new(model), slots: Arc::new(Semaphore::new(settings.max_queued_jobs.max(1))) })
    }

    /// Tokens of `text` as this model's tokenizer counts them (for knowledge-token accounting).
    pub fn count_tokens(&self, text: &str) -> usize {
        self.model.count_tokens(text)
    }

    /// One score per pair, in order; higher is more relevant.
    pub async fn score(&self, pairs: Vec<(String, String)>) -> Result<Vec<f32>, ModelError> {
        if pairs.is_empty() {
            return Ok(Vec::new());
        }
        let rows = run_blocking(&self.slots, self.model.clone(), pairs).await?;
        Ok(rows.into_iter().map(|row| row.first().copied().unwrap_or(f32::MIN)).collect())
    }
}

/// Runs inference on the blocking pool: ONNX takes milliseconds to seconds and must not stall the
/// actors' async threads.
pub(crate) async fn run_blocking(
    slots: &Semaphore,
    model: Arc<PairClassifier>,
    pairs: Vec<(String, String)>,
) -> Result<Vec<Vec<f32>>, ModelError> {
    let _slot = slots.acquire().await.expect("the semaphore is never closed");
    tokio::task::spawn_blocking(move || model.classify(&pairs))
        .await
        .map_err(|e| ModelError::Inference(format!("inference task failed: {e}")))?
}

/// How a passage or sentence is shown to the cross-encoder: with its title, which often names the
/// entity the text only calls "he" or "the film".
pub fn titled(title: &str, text: &str) -> String {
    if title.is_empty() { text.to_string() } else { format!("{title}. {text}") }
}
