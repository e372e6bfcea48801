//! Typed configuration: config/default.toml (compiled in), then an optional file, then
//! `LACUNA__SECTION__KEY` environment variables. Unknown keys are errors, not silently ignored.
//!
//! One file per group of sections: `methods` (`[migres]`, `[reader]`, `[qpaug]`, `[raisf]`,
//! `[rqrag]`, `[join]`), `llm` (`[llm]`, `[budget]`), `models` (`[rerank]`, `[nli]`, `[onnx]`),
//! `search`, `bus` (`[bus]`, `[kafka]`, `[retry]`, `[stages.*]`) and `process` (`[run]`, `[serve]`,
//! `[eval]`, `[log]`, `[metrics]`, `[otel]`); `profiles` layers evaluation profiles over the defaults.

mod bus;
mod llm;
mod methods;
mod models;
mod process;
pub mod profiles;
mod search;

pub use bus::*;
pub use llm::*;
pub use methods::*;
pub use models::*;
pub use process::*;
pub use search::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const DEFAULT_TOML: &str = include_str!("default.toml");

#[derive(Clone, Debug, Deserialize, Serialize)]
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
    pub otel: OtelSettings,
    pub serve: ServeSettings,
    pub log: LogSettings,
    pub retry: RetrySettings,
    pub budget: BudgetSettings,
    /// `[stages.NAME]`, for the stages whose declared settings (`pipelines/`) a deployment
    /// changes; the names are checked against the declared stages by `lacuna`'s start-up.
    #[serde(default)]
    pub stages: BTreeMap<String, StageOverrides>,
    pub eval: EvalSettings,
    pub join: JoinSettings,
    pub qpaug: QpaugSettings,
    pub reader: ReaderSettings,
    pub raisf: RaisfSettings,
    pub rqrag: RqragSettings,
}

impl Settings {
    /// Checks `[stages.*]` against the stage names the pipelines declare: a section for a stage no
    /// pipeline has is a typo. A declared stage without one runs on its declaration's settings.
    pub fn check_stage_names<'a>(&self, declared: impl IntoIterator<Item = &'a str>) -> Result<(), String> {
        let declared: std::collections::BTreeSet<&str> = declared.into_iter().collect();
        if let Some(unknown) = self.stages.keys().find(|k| !declared.contains(k.as_str())) {
            let known = declared.iter().copied().collect::<Vec<_>>().join(", ");
            return Err(format!("[stages.{unknown}]: no pipeline has a stage {unknown:?} (stages: {known})"));
        }
        Ok(())
    }

    /// Defaults, then `file` if given, then the environment.
    pub fn load(file: Option<&Path>) -> Result<Settings, ::config::ConfigError> {
        Self::load_with(file, &[])
    }

    /// Defaults, then `layers` (a profile's TOML, see `profiles.rs`), then `file` if given, then the
    /// environment.
    pub fn load_with(file: Option<&Path>, layers: &[String]) -> Result<Settings, ::config::ConfigError> {
        let mut builder =
            ::config::Config::builder().add_source(::config::File::from_str(DEFAULT_TOML, ::config::FileFormat::Toml));
        for layer in layers {
            builder = builder.add_source(::config::File::from_str(layer, ::config::FileFormat::Toml));
        }
        if let Some(path) = file {
            builder = builder.add_source(::config::File::from(path.to_path_buf()).required(true));
        }
        let builder = builder.add_source(
            ::config::Environment::with_prefix("LACUNA")
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
        settings.validate().map_err(::config::ConfigError::Message)?;
        Ok(settings)
    }

    /// The compiled-in defaults alone (tests start from these).
    pub fn defaults() -> Settings {
        let mut settings: Settings = ::config::Config::builder()
            .add_source(::config::File::from_str(DEFAULT_TOML, ::config::FileFormat::Toml))
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
        fill(&mut self.rerank.cache.dir, "LACUNA_RERANK_CACHE_DIR", cache.join("rerank-scores"));
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
    fn a_drain_longer_than_the_poll_interval_is_refused() {
        let err = load("[kafka]\ndrain_timeout_ms = 30000\nmax_poll_interval_ms = 30000").unwrap_err();
        assert!(err.contains("kafka.drain_timeout_ms (30000) must be less than"), "{err}");
        assert!(load("[kafka]\ndrain_timeout_ms = 5000\nmax_poll_interval_ms = 30000").is_ok());
    }
}
