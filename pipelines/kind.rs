//! The pipelines Lacuna has, each with its declaration (`pipelines/<name>.rs`) and its own topics.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::{KafkaSettings, Settings};
use crate::pipelines::declaration::{StageDecl, StartError};
use crate::pipelines::{graph, migres, qpaug, raisf, rqrag, vanilla};
use crate::topics::BusError;
use crate::topics::kafka::KafkaBus;

/// Which method answers the questions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum PipelineKind {
    /// The MIGRES loop (paper 000).
    #[default]
    Migres,
    /// Top-k re-ranked passages, one answer call (paper Table 3 baseline).
    Vanilla,
    /// VANILLA with sentence-level filtering (paper Table 3 baseline).
    #[value(name = "vanilla-s")]
    #[serde(rename = "vanilla-s")]
    VanillaS,
    /// Question and passage augmentation (paper 002).
    Qpaug,
    /// Retrieval-augmented iterative self-feedback, with recursive sub-questions (paper 003).
    Raisf,
    /// Query refinement over a tree of trajectories, answer chosen by log-probabilities (paper 004).
    Rqrag,
}

impl PipelineKind {
    pub const ALL: [PipelineKind; 6] = [
        PipelineKind::Migres,
        PipelineKind::Vanilla,
        PipelineKind::VanillaS,
        PipelineKind::Qpaug,
        PipelineKind::Raisf,
        PipelineKind::Rqrag,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PipelineKind::Migres => "migres",
            PipelineKind::Vanilla => "vanilla",
            PipelineKind::VanillaS => "vanilla-s",
            PipelineKind::Qpaug => "qpaug",
            PipelineKind::Raisf => "raisf",
            PipelineKind::Rqrag => "rqrag",
        }
    }

    /// Its declaration: its stages, in the order events flow through them.
    pub fn stages(self) -> &'static [StageDecl] {
        match self {
            PipelineKind::Migres => migres::STAGES,
            PipelineKind::Vanilla => vanilla::VANILLA,
            PipelineKind::VanillaS => vanilla::VANILLA_S,
            PipelineKind::Qpaug => qpaug::STAGES,
            PipelineKind::Raisf => raisf::STAGES,
            PipelineKind::Rqrag => rqrag::STAGES,
        }
    }

    /// Its stage called `name`, or an error listing the ones it has.
    pub fn stage(self, name: &str) -> Result<&'static StageDecl, StartError> {
        self.stages().iter().find(|s| s.name == name).ok_or_else(|| StartError::UnknownStage {
            pipeline: self.name(),
            name: name.to_string(),
            stages: self.stages().iter().map(|s| s.name).collect::<Vec<_>>().join(", "),
        })
    }

    /// The name of every stage of every pipeline: the keys `[stages.*]` may have.
    pub fn all_stage_names() -> std::collections::BTreeSet<&'static str> {
        Self::ALL.iter().flat_map(|kind| kind.stages().iter().map(|s| s.name)).collect()
    }

    /// Sets every stage's `llm_concurrency`, and `llm.max_concurrency`, to `n`: a stage's own limit is
    /// what bounds its client, whatever its declaration says.
    pub fn limit_llm_calls(settings: &mut Settings, n: usize) {
        settings.llm.max_concurrency = n;
        for stage in Self::all_stage_names() {
            settings.stages.entry(stage.to_string()).or_default().llm_concurrency = Some(n);
        }
    }

    /// The most events one question can have in flight at once: 1 for a loop, the size of the tree
    /// for the pipelines that fan out (RA-ISF sub-questions, RQ-RAG trajectories).
    pub fn events_per_question(self, settings: &Settings) -> usize {
        let tree = |branching: usize, depth: u32| (0..=depth).map(|d| branching.saturating_pow(d)).sum::<usize>();
        match self {
            PipelineKind::Raisf => tree(settings.raisf.max_sub_questions.max(1), settings.raisf.max_depth),
            PipelineKind::Rqrag => tree(settings.rqrag.width.max(1), settings.rqrag.max_depth),
            _ => 1,
        }
    }

    /// Each pipeline has its own topics and consumer groups on a shared cluster (a `retrieve` of
    /// VANILLA must not take MIGRES's questions). MIGRES keeps the plain prefix.
    pub fn kafka_settings(self, kafka: &KafkaSettings) -> KafkaSettings {
        let mut kafka = kafka.clone();
        if self != PipelineKind::Migres {
            kafka.topic_prefix = format!("{}{}.", kafka.topic_prefix, self.name());
        }
        kafka
    }

    /// The Kafka bus on this pipeline's topics (`[kafka]` as configured), each of them created.
    pub async fn kafka_bus(self, settings: &Settings) -> Result<Arc<KafkaBus>, BusError> {
        let bus = KafkaBus::new(self.kafka_settings(&settings.kafka), &settings.bus)?;
        bus.ensure_topics(&graph::topics(self.stages())).await?;
        Ok(Arc::new(bus))
    }
}

impl std::fmt::Display for PipelineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
