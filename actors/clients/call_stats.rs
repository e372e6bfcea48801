//! What one LLM call spent: its tokens, re-asks and cost, kept apart from the client that makes the
//! call so that the accounting of an attempt (`attempt_spend`) and of a question can use it without
//! the client.

use crate::config::Price;
use crate::topics::AnswerLogprobs;

/// What one call cost, for the question's usage and trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CallStats {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
    pub latency_ms: u64,
    pub attempts: u32,
    /// Answered from the response cache: nothing was sent (the tokens are those of the first call).
    pub cache_hit: bool,
    /// The completion's token log-probabilities, when asked for and returned.
    pub logprobs: Option<AnswerLogprobs>,
    /// Those of the tokens that wrote the reply's top-level "answer" string, when there is one
    /// (`value_logprobs`).
    pub answer_logprobs: Option<AnswerLogprobs>,
    /// Unusable replies asked again before this one (`llm.max_reask`); their tokens are counted.
    pub reasks: u32,
    /// The reply stopped at `max_tokens` (free-text calls keep it as cut).
    pub truncated: bool,
    /// The tokens sent and written, re-asks included, at `llm.prices` for this model (0 without a
    /// price, and for cache hits: nothing was sent).
    pub cost: f64,
}

impl CallStats {
    pub(super) fn add(&mut self, other: &CallStats) {
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.cached_tokens += other.cached_tokens;
        self.attempts += other.attempts;
    }
}

impl CallStats {
    /// What these tokens cost at `price`: prompt tokens the server took from its prefix cache at
    /// `price.cached`, the rest at `price.prompt`, the completion at `price.completion`.
    pub fn cost_at(&self, price: &Price) -> f64 {
        let cached = self.cached_tokens.min(self.prompt_tokens);
        let fresh = self.prompt_tokens - cached;
        (fresh as f64 * price.prompt
            + cached as f64 * price.cached.unwrap_or(price.prompt)
            + self.completion_tokens as f64 * price.completion)
            / 1e6
    }
}
