//! An answer's provenance as this process sees it (`topics/provenance.rs`): built once when the
//! process loads its parts, and stamped by the runner on every record its stages publish to
//! `answers`. The prompts are those of the whole pipeline, not only this process's stages: every
//! stage of a deployment runs the same build and configuration.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::actors::clients::Search;
use crate::config::Settings;
use crate::pipelines::kind::PipelineKind;
use crate::topics::Provenance;
use crate::topics::provenance::{file_sha256, sha256_hex};

/// The git commit this binary was built from (`build.rs`).
pub const COMMIT: &str = env!("LACUNA_COMMIT");

/// The provenance of `pipeline`'s answers under `settings`, reading `search`'s generation now (each
/// record then names the generations its own retrievals read). The model is the configured one
/// until `Parts::with_served_model` names the endpoint's.
pub fn provenance(settings: &Settings, pipeline: PipelineKind, search: Option<&Search>) -> Provenance {
    let mut prompts_sha256 = BTreeMap::new();
    for stage in pipeline.stages() {
        for (name, text) in (stage.prompts)(settings) {
            prompts_sha256.insert(name.to_string(), sha256_hex(text.as_bytes()));
        }
    }
    Provenance {
        version: env!("CARGO_PKG_VERSION").to_string(),
        commit: COMMIT.to_string(),
        pipeline: pipeline.name().to_string(),
        config_sha256: config_sha256(settings),
        prompts_sha256,
        model: settings.llm.model.clone(),
        // The graph the settings load: the float one on CUDA where setup derived it.
        reranker_sha256: file_sha256(&settings.rerank.graph_path(settings.onnx.execution_provider)),
        index_generation: search.and_then(Search::generation).into_iter().collect(),
        trace_id: None,
    }
}

/// The hash of the effective configuration as JSON, its secret values replaced. Secrets live in
/// environment variables that the configuration only names, except a librdkafka property that a
/// deployment wrote inline (`sasl.password=...`): its value is left out.
pub fn config_sha256(settings: &Settings) -> String {
    let mut value = serde_json::to_value(settings).expect("settings serialise");
    // Where traces go shapes no answer: turning them on must not make a run look like another's.
    if let Some(settings) = value.as_object_mut() {
        settings.remove("otel");
    }
    if let Some(Value::Array(properties)) = value.pointer_mut("/kafka/properties") {
        for property in properties.iter_mut() {
            if let Some(text) = property.as_str()
                && let Some((key, _)) = text.split_once('=')
                && is_secret_property(key)
            {
                *property = Value::String(format!("{key}=<secret>"));
            }
        }
    }
    sha256_hex(&serde_json::to_vec(&value).expect("JSON serialises"))
}

/// librdkafka properties whose values are credentials.
fn is_secret_property(key: &str) -> bool {
    let key = key.trim().to_ascii_lowercase();
    ["password", "secret", "token", "key.pem", "jaas.config"].iter().any(|word| key.contains(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_hash_moves_with_a_setting_but_not_with_an_inline_secret() {
        let settings = Settings::defaults();
        let mut stopped = settings.clone();
        stopped.migres.stop_when_not_learning = !settings.migres.stop_when_not_learning;
        assert_ne!(config_sha256(&settings), config_sha256(&stopped), "a setting that shapes answers");

        let with_password = |password: &str| {
            let mut s = settings.clone();
            s.kafka.properties = vec!["security.protocol=SASL_SSL".into(), format!("sasl.password={password}")];
            config_sha256(&s)
        };
        assert_eq!(with_password("hunter2"), with_password("correct horse"), "the password is not hashed");
        let mut plain = settings.clone();
        plain.kafka.properties = vec!["security.protocol=SSL".into(), "sasl.password=x".into()];
        assert_ne!(with_password("x"), config_sha256(&plain), "other properties are");

        let mut traced = settings.clone();
        traced.otel.endpoint = "http://127.0.0.1:4318".into();
        traced.otel.sampling_ratio = 1.0;
        assert_eq!(config_sha256(&settings), config_sha256(&traced), "where traces go shapes no answer");
    }

    #[test]
    fn the_prompts_are_the_ones_the_configuration_asks_with() {
        let mut settings = Settings::defaults();
        let names = |settings: &Settings| {
            provenance(settings, PipelineKind::Migres, None).prompts_sha256.into_keys().collect::<Vec<_>>()
        };
        let default = names(&settings);
        for name in ["main", "query_gen", "leaf", "final_answer", "entailment_lenient"] {
            assert!(default.contains(&name.to_string()), "{name} in {default:?}");
        }
        assert!(!default.contains(&"main_queries".to_string()) && !default.contains(&"augment".to_string()));
        settings.migres.queries_from_main = true;
        assert!(names(&settings).contains(&"main_queries".to_string()));
        assert!(!names(&settings).contains(&"main".to_string()));
        let vanilla = provenance(&settings, PipelineKind::VanillaS, None).prompts_sha256;
        assert!(vanilla.contains_key("reader") && !vanilla.contains_key("leaf"), "{vanilla:?}");
    }
}
