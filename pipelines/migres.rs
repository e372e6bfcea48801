//! The MIGRES pipeline on the embedded bus:
//!
//! questions -> retrieve -> passages -> sentence_filter -> evidence -> leaf -> facts -> verify -> verified -> main -> answers
//! and main -> missing -> query_gen -> queries -> retrieve, until an answer or T iterations.
//!
//! Every stage is an actor on its own thread; the topics are bounded queues. `run` admits at most
//! `run.max_open_questions` questions into the loop at once and returns exactly one record per question.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::actors::clients::{LlmClient, Nli};
use crate::actors::leaf::Leaf;
use crate::actors::main::Main;
use crate::actors::query_gen::QueryGen;
use crate::actors::retrieve::Retrieve;
use crate::actors::sentence_filter::SentenceFilter;
use crate::actors::stage::{RunningStage, spawn_stage};
use crate::actors::verify::Verify;
use crate::pipelines::parts::Parts;
use crate::settings::{Settings, StageSettings};
use crate::topics::in_process::InProcessBus;
use crate::topics::{AnswerRecord, Bus, BusError, Event, QuestionEvent, Subscription, Topic, VersionedAnswer};

pub struct MigresPipeline {
    bus: Arc<dyn Bus>,
    stages: Vec<RunningStage>,
    answers: Box<dyn Subscription>,
    max_open_questions: usize,
    /// Dead letters seen (the question also got an error record).
    pub dead_letters: Arc<AtomicU64>,
}

/// The MIGRES stages, in the order of the loop.
pub const STAGES: [&str; 6] = ["retrieve", "sentence_filter", "leaf", "verify", "main", "query_gen"];

/// Starts the stage called `name` on `bus` with the parts it needs.
pub async fn spawn_named(
    name: &str,
    bus: Arc<dyn Bus>,
    settings: &Settings,
    parts: &Parts,
) -> Result<RunningStage, BusError> {
    let (s, m, r) = (&settings.stages, &settings.migres, &settings.retry);
    let missing = |part: &str| BusError::Transport(format!("stage {name} needs the {part}, which was not loaded"));
    match name {
        "retrieve" => {
            let search = parts.search.clone().ok_or_else(|| missing("search index"))?;
            spawn_stage(Retrieve::new(search, m.clone()), bus, &s.retrieve, r).await
        }
        "sentence_filter" => {
            let reranker = parts.reranker.clone().ok_or_else(|| missing("re-ranker"))?;
            let stage =
                SentenceFilter::new(reranker, llm_for(settings, &s.sentence_filter, "sentence_filter"), m.clone());
            spawn_stage(stage, bus, &s.sentence_filter, r).await
        }
        "leaf" => spawn_stage(Leaf::new(llm_for(settings, &s.leaf, "leaf")), bus, &s.leaf, r).await,
        "verify" => {
            let nli = match &parts.onnx_nli {
                Some(model) => Nli::Onnx(model.clone()),
                None => Nli::LlmJudge(llm_for(settings, &s.verify, "verify")),
            };
            spawn_stage(Verify::new(nli), bus, &s.verify, r).await
        }
        "main" => spawn_stage(Main::new(llm_for(settings, &s.main, "main"), m.clone()), bus, &s.main, r).await,
        "query_gen" => {
            spawn_stage(QueryGen::new(llm_for(settings, &s.query_gen, "query_gen"), m.clone()), bus, &s.query_gen, r)
                .await
        }
        other => Err(BusError::Transport(format!("no stage {other:?}; stages are {}", STAGES.join(", ")))),
    }
}

/// A client for one stage, with that stage's own limit on LLM calls in flight.
fn llm_for(settings: &Settings, stage: &StageSettings, name: &str) -> LlmClient {
    let mut llm = settings.llm.clone();
    llm.max_concurrency = stage.llm_concurrency;
    LlmClient::new(llm).for_stage(name)
}

impl MigresPipeline {
    /// Starts every stage on the in-process bus.
    pub async fn start(settings: &Settings, parts: Parts) -> Result<Self, BusError> {
        let bus: Arc<dyn Bus> = Arc::new(InProcessBus::new(settings.bus.queue_capacity));
        let pipeline = Self::start_on(bus.clone(), settings, parts).await?;
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

    /// Starts every stage on `bus`: the stages cannot tell which bus it is.
    pub async fn start_on(bus: Arc<dyn Bus>, settings: &Settings, parts: Parts) -> Result<Self, BusError> {
        // Subscribe the answer sink before any stage can publish to it.
        let answers = bus.subscribe(&[Topic::Answers], "answers").await?;
        let mut stages = Vec::new();
        for name in STAGES {
            stages.push(spawn_named(name, bus.clone(), settings, &parts).await?);
        }
        Ok(MigresPipeline {
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
