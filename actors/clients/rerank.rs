//! The cross-encoder re-ranker: scores (query, passage) pairs with a raw relevance logit.
//! Default model: cross-encoder/ms-marco-MiniLM-L-12-v2 (int8 ONNX), installed by scripts/setup.sh.

use std::sync::Arc;

use opentelemetry::trace::{SpanKind, Status, TraceContextExt as _};
use opentelemetry::{Context, KeyValue};

use super::onnx::{ModelError, PairClassifier};
use super::score_cache::ScoreCache;
use crate::config::{ModelSettings, OnnxSettings};

#[derive(Clone)]
pub struct Reranker {
    model: Arc<PairClassifier>,
    /// `rerank.cache`: scores read back instead of scored again.
    cache: Option<Arc<ScoreCache>>,
}

impl Reranker {
    pub fn load(settings: &ModelSettings, onnx: &OnnxSettings) -> Result<Self, ModelError> {
        let model = PairClassifier::load("reranker", settings, onnx)?;
        let cache = ScoreCache::open(&settings.cache, model.graph())?.map(Arc::new);
        Ok(Reranker { model: Arc::new(model), cache })
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
        self.score_keeping(pairs, None).await
    }

    /// [`Reranker::score`], in a `rerank` span that says how many pairs scored at least `keep_at`.
    pub async fn score_keeping(
        &self,
        pairs: Vec<(String, String)>,
        keep_at: Option<f32>,
    ) -> Result<Vec<f32>, ModelError> {
        let attributes = vec![
            KeyValue::new("lacuna.rerank.pairs", pairs.len() as i64),
            KeyValue::new("lacuna.rerank.batch_size", self.model.encoder().batch_size as i64),
            KeyValue::new("lacuna.rerank.provider", format!("{:?}", self.model.provider()).to_lowercase()),
            KeyValue::new("openinference.span.kind", "RERANKER"),
        ];
        let trace = crate::telemetry::child_span("rerank", SpanKind::Internal, &Context::current(), attributes);
        let scores = self.scored(pairs).await;
        let span = trace.span();
        let scores = match scores {
            Ok(scores) => scores,
            Err(error) => {
                span.set_status(Status::error(error.to_string()));
                span.end();
                return Err(error);
            }
        };
        if let Some(threshold) = keep_at {
            let kept = scores.iter().filter(|&&score| score >= threshold).count();
            span.set_attribute(KeyValue::new("lacuna.rerank.kept", kept as i64));
        }
        span.end();
        Ok(scores)
    }

    /// The model's scores, those the cache holds read from it and the others stored in it.
    async fn scored(&self, pairs: Vec<(String, String)>) -> Result<Vec<f32>, ModelError> {
        let Some(cache) = &self.cache else { return self.classified(pairs).await };
        let found = cache.lookup(&pairs)?;
        let missing: Vec<(String, String)> =
            pairs.into_iter().zip(&found).filter(|(_, (_, score))| score.is_none()).map(|(pair, _)| pair).collect();
        let mut computed = self.classified(missing).await?.into_iter();
        let mut new = Vec::new();
        let scores = found
            .into_iter()
            .map(|(key, score)| {
                score.unwrap_or_else(|| {
                    let score = computed.next().expect("one score per pair scored");
                    new.push((key, score));
                    score
                })
            })
            .collect();
        // A cache that cannot be written costs a rescoring later, not this answer.
        if let Err(error) = cache.store(&new) {
            tracing::warn!(%error, "cannot write the re-ranker's score cache");
        }
        Ok(scores)
    }

    async fn classified(&self, pairs: Vec<(String, String)>) -> Result<Vec<f32>, ModelError> {
        let rows = self.model.classify(pairs).await?;
        Ok(rows.into_iter().map(|row| row.first().copied().unwrap_or(f32::MIN)).collect())
    }
}

/// How a passage or sentence is shown to the cross-encoder: with its title, which often names the
/// entity the text only calls "he" or "the film".
pub fn titled(title: &str, text: &str) -> String {
    if title.is_empty() { text.to_string() } else { format!("{title}. {text}") }
}
