//! A pipeline as data. Each pipeline declares its stages once, as a list of [`StageDecl`]s: the
//! stage's name (taken from its type), the topics it reads and writes, the parts it needs, and how it
//! is built. Spawning, part loading, `lacuna stage`'s name check, the `[stages.*]` settings keys,
//! `lacuna topics`, `lacuna graph` (the README's diagrams) and the Helm chart's stage lists all come
//! from these lists; `tests/topology.rs` checks that every topic has both ends.

use std::sync::Arc;

use futures::future::LocalBoxFuture;

use crate::actors::clients::{LlmClient, Nli};
use crate::actors::prompts::NamedPrompt;
use crate::actors::runner::{RunnerSettings, RunningStage, Stage, Wiring, spawn_stage};
use crate::actors::stages::sentence_filter::{FilterMode, SentenceFilter};
use crate::config::{LlmOverride, Settings, StageSettings};
use crate::pipelines::parts::{Part, Parts};
use crate::topics::{Bus, BusError, Topic};

/// How many replicas of a stage may run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replicas {
    /// As many as the topics have partitions: the stage keeps no state.
    Scaled,
    /// Exactly one: it reads its whole state back on start (the join).
    One,
}

/// One stage of one pipeline.
pub struct StageDecl {
    /// The stage type's [`Stage::NAME`]: also its config key, consumer group and Helm Deployment.
    pub name: &'static str,
    /// The topics it consumes, in priority order (loop inputs before new work).
    pub inputs: &'static [Topic],
    /// The topics its outputs go to. A stage that fails an event also writes an error record (to
    /// `answers`, or to `joins` for a sub-question) and a dead letter: every stage may, so those are
    /// not listed.
    pub outputs: &'static [Topic],
    pub needs: &'static [Part],
    pub replicas: Replicas,
    /// How it runs unless `[stages.NAME]` says otherwise.
    pub runs: StageSettings,
    /// The prompts it can ask with under the settings: the stage type's own declaration
    /// ([`Stage::prompts`]), which provenance hashes.
    pub prompts: fn(&Settings) -> Vec<NamedPrompt>,
    /// Builds the stage from the settings and the loaded parts.
    pub build: fn(&StageStart<'_>) -> Result<Startable, StartError>,
}

impl StageDecl {
    /// A scaled stage of type `S` that needs only the LLM, the commonest kind: its name and prompts
    /// are the type's.
    pub const fn llm<S: Stage>(
        inputs: &'static [Topic],
        outputs: &'static [Topic],
        build: fn(&StageStart<'_>) -> Result<Startable, StartError>,
    ) -> StageDecl {
        StageDecl {
            name: S::NAME,
            prompts: S::prompts,
            inputs,
            outputs,
            needs: &[Part::Llm],
            replicas: Replicas::Scaled,
            runs: StageSettings::LLM,
            build,
        }
    }

    /// Its settings: the declared ones, with `[stages.NAME]` applied.
    pub fn settings(&self, settings: &Settings) -> StageSettings {
        self.runs.with(settings.stages.get(self.name))
    }

    pub fn needs(&self, part: Part) -> bool {
        self.needs.contains(&part)
    }

    pub fn wiring(&self) -> Wiring {
        Wiring { inputs: self.inputs, outputs: self.outputs }
    }

    /// Builds the stage and starts it on `bus`.
    pub async fn start(
        &self,
        bus: Arc<dyn Bus>,
        settings: &Settings,
        parts: &Parts,
    ) -> Result<RunningStage, StartError> {
        let own = self.settings(settings);
        let start = StageStart { name: self.name, settings, parts, own: &own };
        let startable = (self.build)(&start)?;
        if startable.name != self.name {
            return Err(StartError::Misdeclared { declared: self.name, built: startable.name });
        }
        let runner = RunnerSettings::new(&own, settings).with_provenance(parts.provenance.clone());
        Ok((startable.start)(bus, self.wiring(), runner).await?)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{pipeline} has no stage {name:?}; its stages are {stages}")]
    UnknownStage { pipeline: &'static str, name: String, stages: String },
    #[error("stage {stage} needs the {part}, which was not loaded")]
    MissingPart { stage: &'static str, part: &'static str },
    #[error("stage declared as {declared} builds {built}")]
    Misdeclared { declared: &'static str, built: &'static str },
    #[error(transparent)]
    Bus(#[from] BusError),
}

type StartFn =
    Box<dyn FnOnce(Arc<dyn Bus>, Wiring, RunnerSettings) -> LocalBoxFuture<'static, Result<RunningStage, BusError>>>;

/// A built stage, ready to be started on a bus with the wiring its declaration gives.
pub struct Startable {
    name: &'static str,
    start: StartFn,
}

impl Startable {
    pub fn new<S: Stage>(stage: S) -> Startable {
        let start: StartFn =
            Box::new(move |bus, wiring, runner| Box::pin(async move { spawn_stage(stage, bus, wiring, runner).await }));
        Startable { name: S::NAME, start }
    }
}

/// What a stage's `build` gets: the settings, its own (declared, then `[stages.NAME]`) and the
/// loaded parts.
pub struct StageStart<'a> {
    pub name: &'static str,
    pub settings: &'a Settings,
    pub parts: &'a Parts,
    pub own: &'a StageSettings,
}

impl StageStart<'_> {
    /// An LLM client for this stage, with the stage's own limit on calls in flight.
    pub fn llm(&self) -> LlmClient {
        self.llm_with(&LlmOverride::default())
    }

    /// The same on another endpoint or model (a module with its own, e.g. RA-ISF's).
    pub fn llm_with(&self, endpoint: &LlmOverride) -> LlmClient {
        let mut llm = endpoint.apply(&self.settings.llm);
        llm.max_concurrency = self.own.llm_concurrency;
        LlmClient::new(llm).for_stage(self.name)
    }

    fn missing(&self, part: Part) -> StartError {
        StartError::MissingPart { stage: self.name, part: part.name() }
    }

    pub fn search(&self) -> Result<crate::actors::clients::Search, StartError> {
        self.parts.search.clone().ok_or_else(|| self.missing(Part::Search))
    }

    /// The entailment check: the ONNX model when one was loaded, else the LLM as a judge.
    pub fn nli(&self) -> Nli {
        match &self.parts.onnx_nli {
            Some(model) => Nli::Onnx(model.clone()),
            None => Nli::LlmJudge(self.llm(), self.settings.nli.entailment_prompt),
        }
    }

    /// sentence_filter filtering as `mode` asks, showing `top_k` passages.
    pub fn sentence_filter(&self, mode: FilterMode, top_k: usize) -> Result<Startable, StartError> {
        let reranker = self.parts.reranker.clone().ok_or_else(|| self.missing(Part::Reranker))?;
        let mut migres = self.settings.migres.clone();
        migres.top_k = top_k;
        Ok(Startable::new(SentenceFilter::new(reranker, self.llm(), migres).with_mode(mode)))
    }
}

/// Every pipeline's retrieve: BM25 for the queries of `inputs` (and new questions when listed).
pub const fn retrieve(inputs: &'static [Topic]) -> StageDecl {
    StageDecl {
        name: crate::actors::stages::retrieve::Retrieve::NAME,
        prompts: crate::actors::stages::retrieve::Retrieve::prompts,
        inputs,
        outputs: &[Topic::Passages],
        needs: &[Part::Search],
        replicas: Replicas::Scaled,
        // No LLM call: its one LLM slot is never used.
        runs: StageSettings { max_in_flight: 8, llm_concurrency: 1 },
        build: |s| {
            Ok(Startable::new(crate::actors::stages::retrieve::Retrieve::new(s.search()?, s.settings.migres.clone())))
        },
    }
}

/// sentence_filter as `build` configures it (the filtering mode and k differ per pipeline).
pub const fn sentence_filter(build: fn(&StageStart<'_>) -> Result<Startable, StartError>) -> StageDecl {
    StageDecl {
        name: SentenceFilter::NAME,
        prompts: SentenceFilter::prompts,
        inputs: &[Topic::Passages],
        outputs: &[Topic::Evidence],
        // The LLM writes what it knows when nothing passes the filter (MIGRES's knowledge prompting).
        needs: &[Part::Reranker, Part::Llm],
        replicas: Replicas::Scaled,
        // Re-ranking is CPU work between awaits: more events at once keep the scoring workers fed.
        runs: StageSettings { max_in_flight: 16, llm_concurrency: 2 },
        build,
    }
}

/// The join of the pipelines that fan out; one replica, as it reads its whole state on start.
pub const JOIN: StageDecl = StageDecl {
    name: crate::actors::stages::join::Join::NAME,
    prompts: crate::actors::stages::join::Join::prompts,
    inputs: &[Topic::Joins],
    outputs: &[Topic::Joined, Topic::JoinState],
    needs: &[],
    replicas: Replicas::One,
    runs: StageSettings { max_in_flight: 16, llm_concurrency: 1 },
    build: |s| {
        let tick = std::time::Duration::from_millis(s.settings.join.tick_ms.max(10));
        let bus = &s.settings.bus;
        Ok(Startable::new(crate::actors::stages::join::Join::new(tick, bus.max_event_bytes, bus.progress_timeout())))
    },
};
