//! The cross-encoder re-ranker: scores (query, passage) pairs with a raw relevance logit.
//! Default model: cross-encoder/ms-marco-MiniLM-L-12-v2 (int8 ONNX), installed by scripts/setup.sh.

use std::sync::Arc;

use super::onnx::{ModelError, PairClassifier};
use crate::config::{ModelSettings, OnnxSettings};

#[derive(Clone)]
pub struct Reranker {
    model: Arc<PairClassifier>,
}

impl Reranker {
    pub fn load(settings: &ModelSettings, onnx: &OnnxSettings) -> Result<Self, ModelError> {
        Ok(Reranker { model: Arc::new(PairClassifier::load("reranker", settings, onnx)?) })
    }

    /// The classifier underneath, for `lacuna bench rerank`.
    pub fn model(&self) -> &PairClassifier {
        &self.model
    }

    /// Tokens of `text` as this model's tokenizer counts them (for knowledge-token accounting).
    pub fn count_tokens(&self, text: &str) -> usize {
        self.model.count_tokens(text)
    }

    /// One score per pair, in order; higher is more relevant. The pairs may share batches with other
    /// callers' (`coalesce_ms`).
    pub async fn score(&self, pairs: Vec<(String, String)>) -> Result<Vec<f32>, ModelError> {
        let rows = self.model.classify(pairs).await?;
        Ok(rows.into_iter().map(|row| row.first().copied().unwrap_or(f32::MIN)).collect())
    }
}

/// How a passage or sentence is shown to the cross-encoder: with its title, which often names the
/// entity the text only calls "he" or "the film".
pub fn titled(title: &str, text: &str) -> String {
    if title.is_empty() { text.to_string() } else { format!("{title}. {text}") }
}
