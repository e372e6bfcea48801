//! The log-probabilities of generated text, as the LLM server returns them: RQ-RAG's confidence in a
//! trajectory, and the first read's in its answer (`migres.read_first_logprobs`).

use serde::{Deserialize, Serialize};

/// The log-probabilities of the tokens of generated text.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AnswerLogprobs {
    /// Sum over the tokens: paper 004's Conf when the text is the final answer.
    pub sum: f64,
    pub tokens: u32,
}

impl AnswerLogprobs {
    /// exp(-mean log p) (paper 004's PPL): lower is better.
    pub fn perplexity(&self) -> f64 {
        if self.tokens == 0 { f64::INFINITY } else { (-self.sum / self.tokens as f64).exp() }
    }

    /// The probability of the whole text, exp(sum log p).
    pub fn probability(&self) -> f64 {
        self.sum.exp()
    }

    pub fn add(&mut self, other: &AnswerLogprobs) {
        self.sum += other.sum;
        self.tokens += other.tokens;
    }
}
