//! Choosing one answer among the candidates of a question's trajectories (RQ-RAG, paper 004,
//! Section 2.3), computed from each answer's token log-probabilities:
//! - perplexity: the trajectory with the lowest perplexity over all it generated (refined queries and
//!   answer);
//! - confidence: the trajectory whose answer has the highest log-probability (the sum over its
//!   tokens, paper 004's Conf);
//! - ensemble: the answer (normalised) whose trajectories' confidences sum highest. The paper sums
//!   Conf; summing log-probabilities would make an answer more trajectories agree on score *lower*,
//!   so the probabilities exp(Conf) are summed instead.
//!
//! `select` chooses at the root; `refine` too, when a root answers without branching.

use std::collections::BTreeMap;

use crate::actors::shared::answer::{answer_record_with, normalize_answer};
use crate::config::Selection;
use crate::topics::{Answered, Candidate, Memory, Outcome, Record, TraceKind};

/// Each candidate's score under `selection` (higher is better), and the index of the best.
pub fn score(selection: Selection, candidates: &[Candidate]) -> (Vec<f64>, usize) {
    // Without log-probabilities every candidate scores the same and the first one wins.
    let conf = |c: &Candidate| c.logprobs.as_ref().map_or(f64::NEG_INFINITY, |l| l.sum);
    let scores: Vec<f64> = match selection {
        Selection::Perplexity => candidates
            .iter()
            .map(|c| -c.trajectory_logprobs.as_ref().or(c.logprobs.as_ref()).map_or(f64::INFINITY, |l| l.perplexity()))
            .collect(),
        Selection::Confidence => candidates.iter().map(conf).collect(),
        Selection::Ensemble => {
            let mut votes: BTreeMap<String, f64> = BTreeMap::new();
            for c in candidates {
                *votes.entry(normalize_answer(&c.answer)).or_default() += conf(c).exp();
            }
            candidates.iter().map(|c| votes[&normalize_answer(&c.answer)]).collect()
        }
    };
    // A written answer beats an empty one; ties go to the earliest trajectory.
    let key = |i: usize| (!candidates[i].answer.is_empty(), scores[i]);
    let best = (0..candidates.len())
        .max_by(|&a, &b| key(a).partial_cmp(&key(b)).unwrap_or(std::cmp::Ordering::Equal).then(b.cmp(&a)))
        .unwrap_or(0);
    (scores, best)
}

/// The root's answer: the chosen trajectory's, citing the passages that trajectory read.
pub fn choose_answer(
    mut memory: Memory,
    stage: &str,
    candidates: Vec<Candidate>,
    selection: Selection,
    outcome: Outcome,
) -> Record {
    let (scores, best) = score(selection, &candidates);
    let chosen = candidates[best].clone();
    let strategy = format!("{selection:?}").to_lowercase();
    let scored =
        candidates.iter().zip(&scores).map(|(c, s)| (format!("{}: {}", c.node.path_text(), c.answer), *s)).collect();
    memory.record(stage, TraceKind::Selected { strategy, answer: chosen.answer.clone(), scores: scored });
    memory.cited_passages.retain(|id, _| chosen.citations.contains(id));
    let mut answered = Answered::from_memory(memory, chosen.answer, chosen.confidence, chosen.explanation, outcome);
    answered.queries = chosen.queries;
    answered.candidates = candidates;
    answer_record_with(answered)
}
