//! The LLM endpoint (`[llm]`), what it may cost a question (`[budget]`), and the circuit breaker that
//! turns an outage into a pause.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LlmSettings {
    pub base_url: String,
    pub model: String,
    pub api_key_env: String,
    pub timeout_ms: u64,
    pub max_retries: u32,
    pub retry_backoff_ms: u64,
    pub temperature: f32,
    pub max_tokens: u32,
    /// Structured replies write their reasoning keys (explanation) before the answer, as the
    /// schemas list them; false sorts the keys alphabetically (the answer first).
    pub reasoning_first: bool,
    /// Times a reply that does not parse, or stops at `max_tokens`, is asked again.
    pub max_reask: u32,
    /// The least temperature of a re-ask after an unparsable reply (with a new `seed`).
    pub reask_temperature: f32,
    /// When an endpoint that keeps failing stops being called (`clients/breaker.rs`).
    pub breaker: BreakerSettings,
    /// Prices per million tokens by model name, for the cost of each question and stage.
    pub prices: BTreeMap<String, Price>,
    pub max_concurrency: usize,
    /// Answer repeated calls from a content-addressed response cache (see `clients/llm_cache.rs`).
    pub cache: bool,
    /// With `cache`: `read_write` (misses go to the endpoint and are stored) or `replay` (a miss
    /// is an error: proves a run makes exactly the calls a recorded one made).
    pub cache_mode: CacheMode,
    /// Empty: <cache>/llm-responses.
    pub cache_dir: PathBuf,
}

/// An LLM endpoint for one module; empty fields take the `[llm]` value.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LlmOverride {
    // Where a module's model is served, and its key's name, do not shape its answers: a run resumed
    // against another endpoint of the same model is the same run (eval/resume.rs).
    #[serde(skip_serializing)]
    pub base_url: String,
    pub model: String,
    #[serde(skip_serializing)]
    pub api_key_env: String,
}

impl LlmOverride {
    pub fn apply(&self, llm: &LlmSettings) -> LlmSettings {
        let mut llm = llm.clone();
        let pick = |own: &str, base: &mut String| {
            if !own.is_empty() {
                *base = own.to_string();
            }
        };
        pick(&self.base_url, &mut llm.base_url);
        pick(&self.model, &mut llm.model);
        pick(&self.api_key_env, &mut llm.api_key_env);
        llm
    }
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CacheMode {
    ReadWrite,
    Replay,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerSettings {
    /// Transient failures in a row (any call of the process to one endpoint) that open the circuit.
    pub failures: u32,
    /// The first wait before a probe; each failed probe doubles it, up to `max_probe_ms`.
    pub probe_ms: u64,
    pub max_probe_ms: u64,
    /// A call gives up (an `llm_unreachable` error) once it has waited this long for the circuit;
    /// the circuit goes on probing, and closes when the endpoint answers.
    pub max_wait_ms: u64,
}

/// What a million tokens of one model cost, in any one currency.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub prompt: f64,
    pub completion: f64,
    /// Prompt tokens served from the server's prefix cache; `prompt` when not given.
    pub cached: Option<f64>,
}

/// Per-question caps on LLM spending (0: none). Checked before each event: a question already over
/// one ends in a `budget_exceeded` error record instead of making more calls.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetSettings {
    pub max_llm_calls: u32,
    /// Prompt plus completion tokens.
    pub max_tokens: u64,
    /// In the currency of `llm.prices`.
    pub max_cost: f64,
}
