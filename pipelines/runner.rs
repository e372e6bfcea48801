//! `Pipeline` runs every stage of one pipeline in this process, on the in-process bus or on Kafka.
//!
//! Every stage is an actor; the topics are bounded queues. `run` admits at most
//! `run.max_open_questions` questions at once and returns exactly one record per question.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::actors::runner::RunningStage;
use crate::config::Settings;
use crate::pipelines::declaration::StartError;
use crate::pipelines::kind::PipelineKind;
use crate::pipelines::parts::Parts;
use crate::topics::in_process::InProcessBus;
use crate::topics::{AnswerRecord, Bus, BusError, Event, QuestionEvent, Subscription, Topic, VersionedAnswer};

/// Where a pipeline's topics live when all its stages run in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// Bounded queues in this process.
    InProcess,
    /// The pipeline's topics on kafka.brokers, each stage its own consumer group.
    Kafka,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error("stage {stage} failed: {reason}")]
    StageFailed { stage: &'static str, reason: String },
}

/// The first of `stages` to fail, with its reason; pending while all run.
async fn first_failure(stages: &[RunningStage]) -> (&'static str, String) {
    if stages.is_empty() {
        return std::future::pending().await;
    }
    let watches = stages.iter().map(|stage| Box::pin(async move { (stage.name, stage.failed().await) }));
    futures::future::select_all(watches).await.0
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
    pub async fn start(kind: PipelineKind, settings: &Settings, parts: Parts) -> Result<Self, StartError> {
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
            Transport::Kafka => Pipeline::start_on(kind, kind.kafka_bus(settings).await?, settings, parts).await?,
        })
    }

    /// Starts every stage on `bus`: the stages cannot tell which bus it is.
    pub async fn start_on(
        kind: PipelineKind,
        bus: Arc<dyn Bus>,
        settings: &Settings,
        parts: Parts,
    ) -> Result<Self, StartError> {
        Self::start_on_without(kind, bus, settings, parts, &[]).await
    }

    /// Starts every stage on `bus` but those named in `elsewhere`, which run in processes of their own
    /// on the same topics (`lacuna bench pipeline --stage-processes`).
    pub async fn start_on_without(
        kind: PipelineKind,
        bus: Arc<dyn Bus>,
        settings: &Settings,
        parts: Parts,
        elsewhere: &[&str],
    ) -> Result<Self, StartError> {
        // Subscribe the answer sink before any stage can publish to it.
        let answers = bus.subscribe(&[Topic::Answers], "answers").await?;
        let mut stages = Vec::new();
        for stage in kind.stages().iter().filter(|stage| !elsewhere.contains(&stage.name)) {
            stages.push(stage.start(bus.clone(), settings, &parts).await?);
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
    /// Redelivered or repeated answers for a question already answered are ignored. A stage that
    /// fails ends the run with its reason: no answer could come through it.
    pub async fn run<I, F>(&mut self, questions: I, mut on_record: F) -> Result<(), RunError>
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
                let mut record = question.to_record();
                record.trace = crate::telemetry::question_headers(&question.id, None);
                self.bus.publish(record).await?;
            }
            if open.is_empty() {
                return Ok(());
            }
            let record = self.next_record().await?;
            let id = record.question_id().to_string();
            if open.remove(&id) && done.insert(id) {
                on_record(record);
            }
        }
    }

    /// The next record on the answers topic, whichever question it ends (callers dedupe). A stage
    /// that fails ends the wait with its reason: no answer could come through it.
    pub async fn next_record(&mut self) -> Result<AnswerRecord, RunError> {
        loop {
            let delivery = tokio::select! {
                delivery = self.answers.next() => delivery.ok_or(BusError::Closed)?,
                (stage, reason) = first_failure(&self.stages) => return Err(RunError::StageFailed { stage, reason }),
            };
            let decoded = VersionedAnswer::from_payload(&delivery.record.payload);
            delivery.ack();
            match decoded {
                Ok(answer) => return Ok(answer.record),
                Err(error) => tracing::error!(%error, "undecodable answer record"),
            }
        }
    }

    /// The bus the stages run on: where questions go in.
    pub fn bus(&self) -> Arc<dyn Bus> {
        self.bus.clone()
    }

    /// Answers one question.
    pub async fn ask(&mut self, question: QuestionEvent) -> Result<AnswerRecord, RunError> {
        let mut answer = None;
        self.run([question], |record| answer = Some(record)).await?;
        Ok(answer.ok_or(BusError::Closed)?)
    }

    pub fn stop(self) {
        for stage in &self.stages {
            stage.stop();
        }
    }
}
