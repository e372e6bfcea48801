//! The re-ranker threshold δ by the MIGRES recipe (paper Table 11 note): search each question with
//! itself, score the retrieved passages with the cross-encoder, and choose δ so that at least a
//! fraction `keep` (0.8) of the questions still have one passage scoring δ or more. The lowest such δ
//! is minus infinity, so the recipe means the highest: the `keep`-quantile from the top of the
//! questions' best scores. A threshold is specific to a re-ranker model: recalibrate when it changes.

use serde::Serialize;

use super::dataset::EvalQuestion;
use crate::actors::clients::rerank::titled;
use crate::actors::clients::{Reranker, TantivySearch};

#[derive(Clone, Debug, Serialize)]
pub struct Calibration {
    pub questions: usize,
    pub keep: f64,
    /// The highest δ that keeps at least `keep` of the questions.
    pub threshold: f32,
    /// Share of questions with a passage at or above δ (at least `keep`).
    pub kept: f64,
    /// Share of the gold passages BM25 found that score at or above δ (what the filter lets through).
    pub gold_passing: Option<f64>,
    /// The best score of each question, highest first.
    pub best_scores: Vec<f32>,
}

pub async fn calibrate(
    search: &TantivySearch,
    reranker: &Reranker,
    questions: &[EvalQuestion],
    top_n: usize,
    keep: f64,
) -> anyhow::Result<Calibration> {
    anyhow::ensure!(!questions.is_empty(), "no questions to calibrate on");
    anyhow::ensure!(keep > 0.0 && keep <= 1.0, "keep must be in (0, 1]");
    let mut best_scores = Vec::new();
    // (score, is gold) of every retrieved passage, to see how much gold the threshold passes.
    let mut gold_scores: Vec<f32> = Vec::new();
    for question in questions {
        let hits = search.search(&question.question, top_n)?;
        let pairs = hits.iter().map(|(p, _)| (question.question.clone(), titled(&p.title, &p.text))).collect();
        let scores = reranker.score(pairs).await?;
        best_scores.push(scores.iter().copied().fold(f32::NEG_INFINITY, f32::max));
        for ((passage, _), score) in hits.iter().zip(&scores) {
            if question.gold_doc_ids.contains(&passage.id) {
                gold_scores.push(*score);
            }
        }
    }
    best_scores.sort_by(|a, b| b.total_cmp(a));
    let needed = ((keep * best_scores.len() as f64).ceil() as usize).clamp(1, best_scores.len());
    let threshold = best_scores[needed - 1];
    let kept = best_scores.iter().filter(|s| **s >= threshold).count() as f64 / best_scores.len() as f64;
    let gold_passing = (!gold_scores.is_empty())
        .then(|| gold_scores.iter().filter(|s| **s >= threshold).count() as f64 / gold_scores.len() as f64);
    Ok(Calibration { questions: questions.len(), keep, threshold, kept, gold_passing, best_scores })
}
