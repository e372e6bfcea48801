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

/// A client for one stage, with that stage's own limit on LLM calls in flight.
fn llm_for(settings: &Settings, stage: &StageSettings) -> LlmClient {
    let mut llm = settings.llm.clone();
    llm.max_concurrency = stage.llm_concurrency;
    LlmClient::new(llm)
}

impl MigresPipeline {
    /// Starts every stage on the in-process bus.
    pub async fn start(settings: &Settings, parts: Parts) -> Result<Self, BusError> {
        let bus: Arc<dyn Bus> = Arc::new(InProcessBus::new(settings.bus.queue_capacity));
        Self::start_on(bus, settings, parts).await
    }

    /// Starts every stage on `bus`: the stages cannot tell which bus it is.
    pub async fn start_on(bus: Arc<dyn Bus>, settings: &Settings, parts: Parts) -> Result<Self, BusError> {
        let (s, m, r) = (&settings.stages, &settings.migres, &settings.retry);
        let nli = match parts.onnx_nli {
            Some(model) => Nli::Onnx(model),
            None => Nli::LlmJudge(llm_for(settings, &s.verify)),
        };
        // Subscribe the sinks before any stage can publish to them.
        let answers = bus.subscribe(&[Topic::Answers], "answers").await?;
        let dead_letters = Arc::new(AtomicU64::new(0));
        let mut dead_letter_feed = bus.subscribe(&[Topic::DeadLetters], "dead_letters").await?;
        let counter = dead_letters.clone();
        // Drained so the topic never fills; each one was logged by the stage that gave up.
        actix::spawn(async move {
            while let Some(delivery) = dead_letter_feed.next().await {
                counter.fetch_add(1, Ordering::Relaxed);
                delivery.ack();
            }
        });
        let stages = vec![
            spawn_stage(Retrieve::new(parts.search, m.clone()), bus.clone(), &s.retrieve, r).await?,
            spawn_stage(
                SentenceFilter::new(parts.reranker, llm_for(settings, &s.sentence_filter), m.clone()),
                bus.clone(),
                &s.sentence_filter,
                r,
            )
            .await?,
            spawn_stage(Leaf::new(llm_for(settings, &s.leaf)), bus.clone(), &s.leaf, r).await?,
            spawn_stage(Verify::new(nli), bus.clone(), &s.verify, r).await?,
            spawn_stage(Main::new(llm_for(settings, &s.main), m.clone()), bus.clone(), &s.main, r).await?,
            spawn_stage(QueryGen::new(llm_for(settings, &s.query_gen), m.clone()), bus.clone(), &s.query_gen, r)
                .await?,
        ];
        Ok(MigresPipeline { bus, stages, answers, max_open_questions: settings.run.max_open_questions, dead_letters })
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
