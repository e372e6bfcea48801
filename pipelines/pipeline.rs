//! A pipeline is a set of stages joined by topics; `PipelineKind` names the ones Lacuna has and
//! `Pipeline` runs one of them in this process, on the in-process bus or on Kafka.
//!
//! Every stage is an actor; the topics are bounded queues. `run` admits at most
//! `run.max_open_questions` questions at once and returns exactly one record per question.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::actors::stage::RunningStage;
use crate::pipelines::parts::Parts;
use crate::pipelines::{migres, qpaug, raisf, rqrag, vanilla};
use crate::settings::{KafkaSettings, Settings};
use crate::topics::in_process::InProcessBus;
use crate::topics::kafka::KafkaBus;
use crate::topics::{AnswerRecord, Bus, BusError, Event, QuestionEvent, Subscription, Topic, VersionedAnswer};

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

    /// Its stages, in the order events flow through them.
    pub fn stages(self) -> &'static [&'static str] {
        match self {
            PipelineKind::Migres => &migres::STAGES,
            PipelineKind::Vanilla | PipelineKind::VanillaS => &vanilla::STAGES,
            PipelineKind::Qpaug => &qpaug::STAGES,
            PipelineKind::Raisf => &raisf::STAGES,
            PipelineKind::Rqrag => &rqrag::STAGES,
        }
    }

    /// Starts its stage called `name` on `bus`.
    pub async fn spawn_stage(
        self,
        name: &str,
        bus: Arc<dyn Bus>,
        settings: &Settings,
        parts: &Parts,
    ) -> Result<RunningStage, BusError> {
        match self {
            PipelineKind::Migres => migres::spawn_named(name, bus, settings, parts).await,
            PipelineKind::Vanilla => vanilla::spawn_named(name, false, bus, settings, parts).await,
            PipelineKind::VanillaS => vanilla::spawn_named(name, true, bus, settings, parts).await,
            PipelineKind::Qpaug => qpaug::spawn_named(name, bus, settings, parts).await,
            PipelineKind::Raisf => raisf::spawn_named(name, bus, settings, parts).await,
            PipelineKind::Rqrag => rqrag::spawn_named(name, bus, settings, parts).await,
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

    /// The Kafka bus on this pipeline's topics (`kafka` as configured), every topic created.
    pub async fn kafka_bus(self, kafka: &KafkaSettings) -> Result<Arc<KafkaBus>, BusError> {
        let bus = KafkaBus::new(self.kafka_settings(kafka))?;
        bus.ensure_topics().await?;
        Ok(Arc::new(bus))
    }
}

impl std::fmt::Display for PipelineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a pipeline's topics live when all its stages run in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// Bounded queues in this process.
    InProcess,
    /// The pipeline's topics on kafka.brokers, each stage its own consumer group.
    Kafka,
}

pub struct Pipeline {
    bus: Arc<dyn Bus>,
    stages: Vec<RunningStage>,
    answers: Box<dyn Subscription>,
    max_open_questions: usize,
    /// Dead letters seen (the question also got an error record).
    pub dead_letters: Arc<AtomicU64>,
}

impl Pipeline {
    /// Starts every stage of `kind` on the in-process bus.
    pub async fn start(kind: PipelineKind, settings: &Settings, parts: Parts) -> Result<Self, BusError> {
        // The stages form cycles of bounded queues: they must hold every event the open questions can
        // have in flight, or a full cycle could wait on itself. Fan-out multiplies that number.
        let needed = settings.run.max_open_questions * kind.events_per_question(settings) + 1;
        let bus: Arc<dyn Bus> = Arc::new(InProcessBus::new(settings.bus.queue_capacity.max(needed)));
        let pipeline = Self::start_on(kind, bus.clone(), settings, parts).await?;
        // Nothing durable keeps dead letters in process: count them (each question also got an
        // error record) so the topic never fills. On Kafka they stay for `lacuna dlq replay`.
        let mut dead_letter_feed = bus.subscribe(&[Topic::DeadLetters], "dead_letters").await?;
        let counter = pipeline.dead_letters.clone();
        actix::spawn(async move {
            while let Some(delivery) = dead_letter_feed.next().await {
                counter.fetch_add(1, Ordering::Relaxed);
                delivery.ack();
            }
        });
        Ok(pipeline)
    }

    /// Starts every stage of `kind` on `transport`.
    pub async fn start_with(
        kind: PipelineKind,
        transport: Transport,
        settings: &Settings,
        parts: Parts,
    ) -> anyhow::Result<Self> {
        Ok(match transport {
            Transport::InProcess => Pipeline::start(kind, settings, parts).await?,
            Transport::Kafka => {
                Pipeline::start_on(kind, kind.kafka_bus(&settings.kafka).await?, settings, parts).await?
            }
        })
    }

    /// Starts every stage on `bus`: the stages cannot tell which bus it is.
    pub async fn start_on(
        kind: PipelineKind,
        bus: Arc<dyn Bus>,
        settings: &Settings,
        parts: Parts,
    ) -> Result<Self, BusError> {
        // Subscribe the answer sink before any stage can publish to it.
        let answers = bus.subscribe(&[Topic::Answers], "answers").await?;
        let mut stages = Vec::new();
        for name in kind.stages() {
            stages.push(kind.spawn_stage(name, bus.clone(), settings, &parts).await?);
        }
        Ok(Pipeline {
            bus,
            stages,
            answers,
            max_open_questions: settings.run.max_open_questions,
            dead_letters: Arc::new(AtomicU64::new(0)),
        })
    }

    pub fn stages(&self) -> &[RunningStage] {
        &self.stages
    }

    /// Runs `questions` through the loop, calling `on_record` once per question as each finishes.
    /// Redelivered or repeated answers for a question already answered are ignored.
    pub async fn run<I, F>(&mut self, questions: I, mut on_record: F) -> Result<(), BusError>
    where
        I: IntoIterator<Item = QuestionEvent>,
        F: FnMut(AnswerRecord),
    {
        let mut pending = questions.into_iter();
        let mut open: HashSet<String> = HashSet::new();
        let mut done: HashSet<String> = HashSet::new();
        loop {
            while open.len() < self.max_open_questions {
                let Some(question) = pending.next() else { break };
                open.insert(question.id.clone());
                self.bus.publish(question.to_record()).await?;
            }
            if open.is_empty() {
                return Ok(());
            }
            let Some(delivery) = self.answers.next().await else { return Err(BusError::Closed) };
            let decoded = VersionedAnswer::from_payload(&delivery.record.payload);
            delivery.ack();
            let record = match decoded {
                Ok(answer) => answer.record,
                Err(error) => {
                    tracing::error!(%error, "undecodable answer record");
                    continue;
                }
            };
            let id = record.question_id().to_string();
            if open.remove(&id) && done.insert(id) {
                on_record(record);
            }
        }
    }

    /// Answers one question.
    pub async fn ask(&mut self, question: QuestionEvent) -> Result<AnswerRecord, BusError> {
        let mut answer = None;
        self.run([question], |record| answer = Some(record)).await?;
        answer.ok_or(BusError::Closed)
    }

    pub fn stop(self) {
        for stage in &self.stages {
            stage.stop();
        }
    }
}
