//! Typed configuration: config/default.toml (compiled in), then an optional file, then
//! `LACUNA__SECTION__KEY` environment variables. Unknown keys are errors, not silently ignored.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const DEFAULT_TOML: &str = include_str!("default.toml");

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub migres: MigresSettings,
    pub llm: LlmSettings,
    pub rerank: ModelSettings,
    pub nli: NliSettings,
    pub onnx: OnnxSettings,
    pub search: SearchSettings,
    pub bus: BusSettings,
    pub kafka: KafkaSettings,
    pub run: RunSettings,
    pub metrics: MetricsSettings,
    pub serve: ServeSettings,
    pub log: LogSettings,
    pub retry: RetrySettings,
    pub budget: BudgetSettings,
    /// `[stages.NAME]` for every stage of every pipeline; the names are the declared stages'
    /// (`pipelines/`), checked by `lacuna`'s start-up and by tests/topology.rs.
    pub stages: BTreeMap<String, StageSettings>,
    pub eval: EvalSettings,
    pub join: JoinSettings,
    pub qpaug: QpaugSettings,
    pub reader: ReaderSettings,
    pub raisf: RaisfSettings,
    pub rqrag: RqragSettings,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinSettings {
    /// A parent whose children are not all back this long after it split goes on without them.
    pub deadline_ms: u64,
    /// How often the join looks for parents past their deadline.
    pub tick_ms: u64,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct QpaugSettings {
    /// K: passages in the answer prompt, the self-generated one included (K-1 retrieved).
    pub top_k: usize,
}

/// The baselines' (and QPaug's) single answer call.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ReaderSettings {
    /// `migres.compare_options` for the reader: a two-option comparison is decided by the options'
    /// dates or numbers, copied from the shown passages by one more call and compared in code.
    pub compare_options: bool,
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

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RaisfSettings {
    /// Ask the self-knowledge module first (false: always retrieve, the paper's "w/o SKM" ablation).
    pub self_knowledge_check: bool,
    /// D_th: sub-questions nest at most this deep; a node at this depth answers from what it has.
    pub max_depth: u32,
    /// Passages retrieved and checked for relevance per (sub-)question.
    pub top_k: usize,
    /// Sub-questions kept from one decomposition.
    pub max_sub_questions: usize,
    pub self_knowledge: LlmOverride,
    pub relevance: LlmOverride,
    pub decompose: LlmOverride,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    /// The answer with the lowest perplexity.
    Perplexity,
    /// The answer with the highest mean token probability.
    Confidence,
    /// The answer whose trajectories' confidences sum highest (answers compared normalised).
    Ensemble,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RqragSettings {
    /// Refinement steps along a trajectory before it must answer.
    pub max_depth: u32,
    /// Refinements tried at each step: the first `width` of rewrite, decompose, disambiguate.
    pub width: usize,
    /// Passages shown per step.
    pub top_k: usize,
    pub selection: Selection,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MigresSettings {
    pub max_iterations: u32,
    pub retrieve_top_n: usize,
    pub top_k: usize,
    pub max_new_queries: usize,
    pub max_passage_uses: u32,
    pub rerank_threshold: f32,
    pub knowledge_prompting: bool,
    pub min_query_chars: usize,
    pub min_snippet_words: usize,
    pub max_snippet_words: usize,
    /// The sentence filter's own threshold: a passage that passed `rerank_threshold` keeps its
    /// sentences that score at least this.
    pub sentence_threshold: f32,
    /// What the main module is asked: to set an `answerable` flag, or to attempt an answer.
    pub decision_prompt: DecisionPrompt,
    /// Which decisions of the main module end the loop with an answer.
    pub acceptance: Acceptance,
    /// An accepted answer must be found among the verified facts' words (yes/no answers excepted),
    /// and those facts must cite at least `min_answer_passages` passages; otherwise the loop goes on.
    /// Facts from model knowledge do not count: a closed-book guess is not evidence.
    pub grounding_gate: bool,
    pub min_answer_passages: usize,
    /// Knowledge prompting starts at this iteration (the paper: 1, before any query was written).
    pub knowledge_from_iteration: u32,
    /// The main module reads the passages its facts cite, not the facts alone.
    pub main_sees_passages: bool,
    /// At the iteration limit, a non-answer ("None", "unknown") is asked again for a best guess.
    pub best_guess: bool,
    /// At the iteration limit, an answer that is still a non-answer (after the best guess) is read
    /// from the passages the re-ranker scored best for any query, whole, as VANILLA reads its top-k.
    pub reader_fallback: bool,
    /// At the iteration limit, the final answer reads the verified facts alone whenever there are
    /// any: a knowledge-prompted "fact" is a closed-book guess and must not outvote a passage.
    pub limit_reads_verified: bool,
    /// Self-consistency: the main module's decision is the vote of this many samples, each at
    /// `sample_temperature` with its own seed (1: one greedy call).
    pub decision_samples: u32,
    pub sample_temperature: f32,
    /// When the LLM writes no new query, the missing-information summary itself is searched before
    /// the question is declared exhausted.
    pub missing_as_query: bool,
    /// A question naming two options ("Which film came out first, A or B?") is answered with the
    /// option its copied dates or numbers choose, compared in code, not by the model.
    pub compare_options: bool,
    /// The `compare_options` call also reads the best-scored passages that no fact cites.
    pub compare_reads_found: bool,
}

/// When the main module's decision ends the loop.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Acceptance {
    /// `answerable` is true and the answer is not "unanswerable".
    Flag,
    /// Also a confidence of at least 4 and no missing information (the MIGRES code's rule).
    Official,
    /// Also a confidence of at least 4; what the model adds as missing does not matter.
    Confident,
}

/// The main module's prompt.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DecisionPrompt {
    /// The paper's: explanation, missing information, an `answerable` flag, then the answer. A small
    /// model talks itself out of answering: asked to name what is missing first, it always finds
    /// something, even when a fact states the answer.
    Flag,
    /// An answer attempt: explanation, then the answer or "unanswerable", then what is missing. The
    /// answer, not a flag, says whether the question is answered.
    Attempt,
}

#[derive(Clone, Debug, Deserialize)]
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

/// What a million tokens of one model cost, in any one currency.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub prompt: f64,
    pub completion: f64,
    /// Prompt tokens served from the server's prefix cache; `prompt` when not given.
    pub cached: Option<f64>,
}

impl Price {
    pub fn cost(&self, stats: &crate::actors::clients::CallStats) -> f64 {
        let cached = stats.cached_tokens.min(stats.prompt_tokens);
        let fresh = stats.prompt_tokens - cached;
        (fresh as f64 * self.prompt
            + cached as f64 * self.cached.unwrap_or(self.prompt)
            + stats.completion_tokens as f64 * self.completion)
            / 1e6
    }
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

impl BudgetSettings {
    /// Why `usage` is over budget, if it is.
    pub fn exceeded(&self, usage: &crate::topics::Usage) -> Option<String> {
        if self.max_llm_calls > 0 && usage.llm_calls >= self.max_llm_calls {
            return Some(format!("{} LLM calls spent, budget.max_llm_calls = {}", usage.llm_calls, self.max_llm_calls));
        }
        if self.max_tokens > 0 && usage.tokens() >= self.max_tokens {
            return Some(format!("{} tokens spent, budget.max_tokens = {}", usage.tokens(), self.max_tokens));
        }
        if self.max_cost > 0.0 && usage.cost >= self.max_cost {
            return Some(format!("a cost of {:.4} spent, budget.max_cost = {}", usage.cost, self.max_cost));
        }
        None
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerSettings {
    /// Transient failures in a row (any call of the process to one endpoint) that open the circuit.
    pub failures: u32,
    /// The first wait before a probe; each failed probe doubles it, up to `max_probe_ms`.
    pub probe_ms: u64,
    pub max_probe_ms: u64,
    /// A call gives up (an `llm_unreachable` error) once the circuit has been open this long.
    pub max_wait_ms: u64,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CacheMode {
    ReadWrite,
    Replay,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    pub model_dir: PathBuf,
    pub batch_size: usize,
    pub max_length: usize,
    /// Sessions scoring at once, each on its own worker thread; 0: one per CPU of the quota.
    pub sessions: usize,
    /// Intra-op threads per session; 0: the CPU quota shared out among the sessions.
    pub threads: usize,
    /// How long a worker waits for more calls to fill a round; 0: one call per round.
    pub coalesce_ms: u64,
    /// The most pairs a round gathers.
    pub coalesce_max_pairs: usize,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum NliBackend {
    Llm,
    Onnx,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NliSettings {
    pub backend: NliBackend,
    /// The LLM judge's prompt: `strict` (every part of a fact must be in the passage) or `lenient`
    /// (the fact's new information must be; words that name its subject as the question did need not).
    pub entailment_prompt: EntailmentPrompt,
    pub entailment_label: usize,
    /// A fact none of its citations entails is checked against up to this many passages the leaf
    /// was shown but did not cite, and kept citing the one that entails it (0: the paper's check).
    pub recite_uncited: usize,
    pub model: ModelSettings,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EntailmentPrompt {
    Strict,
    Lenient,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnnxSettings {
    pub library_path: PathBuf,
    pub execution_provider: ExecutionProvider,
}

/// Where ONNX models run.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionProvider {
    Cpu,
    /// CUDA, falling back to the CPU with a warning when the runtime or the GPU is missing.
    Cuda,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchSettings {
    pub backend: SearchBackend,
    pub index_dir: PathBuf,
    pub meilisearch: MeiliSettings,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum SearchBackend {
    /// A tantivy BM25 index on local disk (`search.index_dir`).
    Tantivy,
    /// An index on a Meilisearch server (`search.meilisearch`).
    Meilisearch,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeiliSettings {
    pub url: String,
    /// The index uid.
    pub index: String,
    /// Name of the environment variable holding the API key (never the key itself).
    pub api_key_env: String,
    pub timeout_ms: u64,
    pub max_retries: u32,
    pub retry_backoff_ms: u64,
    /// Documents per upload when indexing.
    pub batch_size: usize,
    /// How long to wait for one indexing task.
    pub task_timeout_ms: u64,
    pub matching_strategy: MatchingStrategy,
}

/// Which query words Meilisearch may drop when not every word matches a document. Meilisearch does
/// not rank by any-word overlap the way BM25 does, so for a whole natural-language question this
/// decides most of its recall (README, "Recall: what you trade").
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum MatchingStrategy {
    /// Drop the words from the end of the query first (Meilisearch's own default).
    Last,
    /// Keep every word.
    All,
    /// Drop the most frequent words first, so the rare, telling ones stay.
    Frequency,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BusSettings {
    pub queue_capacity: usize,
    /// The largest event published, on either bus (Kafka's `message.max.bytes`).
    pub max_event_bytes: usize,
    /// The event schema written to Kafka: this build's (0), or the previous one while replicas of
    /// the previous build still run (see `topics/schema.rs`).
    pub write_schema_version: u32,
    /// Events each stage remembers having finished, to skip repeats (`actors/dedupe.rs`); 0: off.
    pub dedupe_window: usize,
    /// Stages publish the trace steps they add to the `progress` topic (for `lacuna serve`).
    pub progress: bool,
    /// The longest a stage waits to publish one progress record before dropping it.
    pub progress_timeout_ms: u64,
}

impl BusSettings {
    /// How long a stage may wait to publish one progress record; `None` when progress is off.
    pub fn progress_timeout(&self) -> Option<std::time::Duration> {
        self.progress.then(|| std::time::Duration::from_millis(self.progress_timeout_ms))
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    pub brokers: String,
    pub topic_prefix: String,
    pub partitions: i32,
    pub replication_factor: i32,
    pub session_timeout_ms: u64,
    pub max_poll_interval_ms: u64,
    pub instance_id: String,
    pub message_timeout_ms: u64,
    pub prefetch: usize,
    /// How long a revocation waits for the revoked partitions' started work before letting them go.
    pub drain_timeout_ms: u64,
    /// Any librdkafka property, set on every client (TLS, SASL mechanism and user, timeouts), as
    /// `property=value` (a list of strings: the config loader splits table keys at dots).
    #[serde(default)]
    pub properties: Vec<String>,
    /// librdkafka properties whose values are secrets, as `property=ENVIRONMENT_VARIABLE`.
    #[serde(default)]
    pub secret_properties: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSettings {
    pub max_open_questions: usize,
    pub max_question_chars: usize,
}

/// `lacuna serve`: the HTTP API and the live page (docs/serve.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeSettings {
    pub listen: String,
    /// Questions accepted and not yet answered, at most; past it a POST gets 429 with Retry-After.
    pub max_open_questions: usize,
    /// Questions in one POST, at most.
    pub max_batch: usize,
    /// A larger request body gets 413.
    pub max_body_bytes: usize,
    /// The environment variable holding the bearer token the API requires; empty: no auth.
    pub token_env: String,
    /// Origins allowed to call the API from a browser (CORS); empty: none.
    pub cors_origins: Vec<String>,
    /// How long `POST /v1/answer` waits by default before answering 202 with the question's URL.
    pub answer_timeout_ms: u64,
    /// Finished questions kept for `GET` (the oldest are forgotten first).
    pub keep_finished: usize,
    /// The Retry-After of a 429, in seconds.
    pub retry_after_s: u64,
    /// Over Kafka: this replica's name in its consumer groups (empty: the host name). Each replica
    /// reads every answer and progress partition in its own groups.
    pub replica_id: String,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    pub format: LogFormat,
    pub filter: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSettings {
    pub listen: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalSettings {
    pub judge_base_url: String,
    pub judge_model: String,
    pub judge_api_key_env: String,
}

/// The pause before retry `attempt` (from 1): `base_ms`, doubled per attempt, at most six times,
/// ±20%. Every retry loop (LLM calls, Meilisearch calls, events, publishes) waits this way; the
/// jitter keeps the replicas that one outage failed together from retrying together.
pub fn backoff(base_ms: u64, attempt: u32) -> std::time::Duration {
    jittered(std::time::Duration::from_millis(base_ms.saturating_mul(1 << attempt.saturating_sub(1).min(6))))
}

/// `interval` ±20%, so that many processes waiting on one endpoint spread out.
pub fn jittered(interval: std::time::Duration) -> std::time::Duration {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    let factor = 0.8 + 0.4 * f64::from(nanos % 1000) / 1000.0;
    interval.mul_f64(factor)
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySettings {
    pub max_attempts: u32,
    pub backoff_ms: u64,
    /// Attempts per publish on transient bus errors, with the same backoff.
    pub publish_attempts: u32,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageSettings {
    /// Events processed at once: the stage's one bound on taken, unfinished work. Never below
    /// `llm_concurrency`, so every LLM slot can be in use.
    pub max_in_flight: usize,
    /// LLM calls in flight at once.
    pub llm_concurrency: usize,
}

impl Settings {
    /// Checks `[stages.*]` against the stage names the pipelines declare: a section for a stage no
    /// pipeline has is a typo, and a declared stage without one cannot start.
    pub fn check_stage_names<'a>(&self, declared: impl IntoIterator<Item = &'a str>) -> Result<(), String> {
        let declared: std::collections::BTreeSet<&str> = declared.into_iter().collect();
        if let Some(unknown) = self.stages.keys().find(|k| !declared.contains(k.as_str())) {
            let known = declared.iter().copied().collect::<Vec<_>>().join(", ");
            return Err(format!("[stages.{unknown}]: no pipeline has a stage {unknown:?} (stages: {known})"));
        }
        if let Some(missing) = declared.iter().find(|d| !self.stages.contains_key(**d)) {
            return Err(format!("no [stages.{missing}] section"));
        }
        Ok(())
    }

    /// Defaults, then `file` if given, then the environment.
    pub fn load(file: Option<&Path>) -> Result<Settings, config::ConfigError> {
        Self::load_with(file, &[])
    }

    /// Defaults, then `layers` (a profile's TOML, see `profiles.rs`), then `file` if given, then the
    /// environment.
    pub fn load_with(file: Option<&Path>, layers: &[String]) -> Result<Settings, config::ConfigError> {
        let mut builder =
            config::Config::builder().add_source(config::File::from_str(DEFAULT_TOML, config::FileFormat::Toml));
        for layer in layers {
            builder = builder.add_source(config::File::from_str(layer, config::FileFormat::Toml));
        }
        if let Some(path) = file {
            builder = builder.add_source(config::File::from(path.to_path_buf()).required(true));
        }
        let builder = builder.add_source(
            config::Environment::with_prefix("LACUNA")
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true)
                // LACUNA__KAFKA__PROPERTIES="security.protocol=SASL_SSL;sasl.mechanisms=PLAIN": values may
                // hold commas (cipher lists), not semicolons.
                .list_separator(";")
                .with_list_parse_key("kafka.properties")
                .with_list_parse_key("kafka.secret_properties")
                .with_list_parse_key("serve.cors_origins"),
        );
        let mut settings: Settings = builder.build()?.try_deserialize()?;
        settings.fill_install_paths();
        settings.validate().map_err(config::ConfigError::Message)?;
        Ok(settings)
    }

    /// The compiled-in defaults alone (tests start from these).
    pub fn defaults() -> Settings {
        let mut settings: Settings = config::Config::builder()
            .add_source(config::File::from_str(DEFAULT_TOML, config::FileFormat::Toml))
            .build()
            .and_then(|c| c.try_deserialize())
            .expect("config/default.toml is valid");
        settings.fill_install_paths();
        settings
    }

    /// Empty model paths point where scripts/setup.sh installs things.
    fn fill_install_paths(&mut self) {
        let cache = cache_dir();
        fill(&mut self.onnx.library_path, "ORT_DYLIB_PATH", cache.join("onnxruntime/libonnxruntime.so.1.31.1"));
        fill(&mut self.rerank.model_dir, "LACUNA_RERANKER_DIR", cache.join("reranker"));
        fill(&mut self.nli.model.model_dir, "LACUNA_NLI_DIR", cache.join("nli"));
        fill(&mut self.llm.cache_dir, "LACUNA_LLM_CACHE_DIR", cache.join("llm-responses"));
    }

    fn validate(&self) -> Result<(), String> {
        let m = &self.migres;
        if m.max_iterations == 0 || m.top_k == 0 || m.retrieve_top_n == 0 || m.max_passage_uses == 0 {
            return Err("migres.max_iterations, top_k, retrieve_top_n and max_passage_uses must be positive".into());
        }
        if self.rqrag.width == 0 || self.rqrag.width > 3 {
            return Err("rqrag.width must be 1, 2 or 3 (rewrite, decompose, disambiguate)".into());
        }
        if self.qpaug.top_k < 2 {
            return Err("qpaug.top_k must be at least 2 (K-1 retrieved passages plus the generated one)".into());
        }
        if self.bus.write_schema_version != 0 {
            crate::topics::schema::check_write_version(self.bus.write_schema_version)?;
        }
        if self.run.max_open_questions == 0 || self.run.max_open_questions >= self.bus.queue_capacity {
            return Err(format!(
                "run.max_open_questions ({}) must be between 1 and bus.queue_capacity ({}) - 1",
                self.run.max_open_questions, self.bus.queue_capacity
            ));
        }
        // The rebalance waits for the drain, and the broker drops a member that keeps it waiting
        // past max.poll.interval.ms: its partitions would move twice.
        if self.kafka.drain_timeout_ms >= self.kafka.max_poll_interval_ms {
            return Err(format!(
                "kafka.drain_timeout_ms ({}) must be less than kafka.max_poll_interval_ms ({})",
                self.kafka.drain_timeout_ms, self.kafka.max_poll_interval_ms
            ));
        }
        Ok(())
    }
}

/// `$LACUNA_CACHE`, else `~/.cache/lacuna`: where scripts/setup.sh puts models and runtimes.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LACUNA_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache/lacuna")
}

fn fill(path: &mut PathBuf, env: &str, fallback: PathBuf) {
    if !path.as_os_str().is_empty() {
        return;
    }
    *path = std::env::var_os(env).filter(|v| !v.is_empty()).map(PathBuf::from).unwrap_or(fallback);
}

#[cfg(test)]
mod tests {
    use super::Settings;

    fn load(layer: &str) -> Result<Settings, String> {
        Settings::load_with(None, &[layer.to_string()]).map_err(|e| e.to_string())
    }

    #[test]
    fn backoff_doubles_within_a_fifth_either_way() {
        for (attempt, base) in [(1, 100.0), (2, 200.0), (3, 400.0), (9, 6400.0)] {
            let ms = super::backoff(100, attempt).as_secs_f64() * 1000.0;
            assert!((0.8 * base..=1.2 * base).contains(&ms), "attempt {attempt}: {ms} ms");
        }
    }

    #[test]
    fn a_drain_longer_than_the_poll_interval_is_refused() {
        let err = load("[kafka]\ndrain_timeout_ms = 30000\nmax_poll_interval_ms = 30000").unwrap_err();
        assert!(err.contains("kafka.drain_timeout_ms (30000) must be less than"), "{err}");
        assert!(load("[kafka]\ndrain_timeout_ms = 5000\nmax_poll_interval_ms = 30000").is_ok());
    }
}
