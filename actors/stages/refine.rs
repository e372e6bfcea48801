//! refine: one step of an RQ-RAG trajectory (paper 004, Section 2.3). With what the step retrieved
//! in hand, the trajectory either branches, one child per refinement (rewrite, decompose or
//! disambiguate the query), each child searching with its own refined query as an event of its own;
//! or, at the depth limit, goes to `trajectory_answer` to be answered.

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::actors::clients::{LlmClient, Schema};
use crate::actors::prompts::{self, NamedPrompt};
use crate::actors::runner::{Stage, StageError, decode};
use crate::actors::shared::accounting::note_call;
use crate::actors::shared::evidence::{cite_shown, documents};
use crate::actors::shared::fanout::expect_record;
use crate::config::{RqragSettings, Settings};
use crate::topics::{
    Event, EvidenceEvent, Memory, QueriesEvent, Record, SCHEMA_VERSION, TraceKind, TrajectoryStep, VerifiedEvent,
};

/// The refinements, in the order `rqrag.width` takes them, with what each asks of the model.
pub const ACTIONS: [(&str, &str); 3] = [
    (
        "rewrite",
        "Rewrite the query so that a search engine finds the information still needed to answer the Question. Write one query.",
    ),
    (
        "decompose",
        "Decompose what is still needed to answer the Question into simpler single-hop queries. Write one to three queries.",
    ),
    (
        "disambiguate",
        "Make the query unambiguous: say exactly which person, place, work or sense is meant. Write one query.",
    ),
];

pub struct Refine {
    llm: LlmClient,
    settings: RqragSettings,
    deadline: std::time::Duration,
}

#[derive(Deserialize, JsonSchema)]
struct Queries {
    #[schemars(length(min = 1, max = 3))]
    queries: Vec<String>,
}

fn queries_schema() -> Schema {
    Schema::of::<Queries>("refined_queries")
}

/// The trajectory so far as the prompts show it: each step's queries and what they found.
fn trajectory_text(memory: &Memory) -> String {
    let mut out = Vec::new();
    for (i, step) in memory.trajectory.iter().enumerate() {
        out.push(format!("Step {} ({}): {}", i + 1, step.action, step.queries.join(" | ")));
        out.push(documents(step.evidence.iter().map(|e| (e.title.as_str(), e.text.as_str()))));
    }
    out.join("\n")
}

impl Refine {
    pub fn new(llm: LlmClient, settings: RqragSettings, deadline: std::time::Duration) -> Self {
        Refine { llm, settings, deadline }
    }

    /// The child trajectory that refines with `action`, or `None` when the model wrote no new query.
    async fn branch(
        &self,
        memory: &mut Memory,
        index: u32,
        action: (&str, &str),
    ) -> Result<Option<Memory>, StageError> {
        let (name, instruction) = action;
        let prompt = prompts::fill(
            prompts::REFINE,
            &[("instruction", instruction), ("trajectory", &trajectory_text(memory)), ("question", &memory.question)],
        );
        let reply = self.llm.structured_scored::<Queries>(prompts::SYSTEM, &prompt, &queries_schema(), true).await?;
        note_call(memory, Self::NAME, name, &reply.stats);
        let mut queries: Vec<String> = Vec::new();
        for query in reply.value.queries {
            let query = query.trim().to_string();
            if !query.is_empty() && !memory.has_asked(&query) && !queries.contains(&query) {
                queries.push(query);
            }
        }
        if queries.is_empty() {
            return Ok(None);
        }
        let mut child = memory.child(index, memory.question.clone());
        child.yes_no = memory.yes_no;
        child.queries = memory.queries.iter().chain(&queries).cloned().collect();
        child.trajectory = memory.trajectory.clone();
        let logprobs = reply.stats.logprobs.clone();
        child.trajectory.push(TrajectoryStep { action: name.to_string(), queries, evidence: Vec::new(), logprobs });
        Ok(Some(child))
    }
}

#[async_trait(?Send)]
impl Stage for Refine {
    const NAME: &'static str = "refine";

    fn prompts(_: &Settings) -> Vec<NamedPrompt> {
        vec![("refine", prompts::REFINE)]
    }

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let EvidenceEvent { mut memory, queries, evidence, .. } = decode(record)?;
        cite_shown(&mut memory, &evidence);
        match memory.trajectory.last_mut() {
            Some(step) => step.evidence = evidence,
            // The root's first step searches with the question itself.
            None => {
                memory.trajectory.push(TrajectoryStep { action: "question".into(), queries, evidence, logprobs: None })
            }
        }
        if memory.node_ref().depth() < self.settings.max_depth {
            let mut children = Vec::new();
            for (i, action) in ACTIONS.iter().take(self.settings.width).enumerate() {
                if let Some(child) = self.branch(&mut memory, i as u32 + 1, *action).await? {
                    children.push(child);
                }
            }
            if !children.is_empty() {
                let named = children
                    .iter()
                    .map(|c| (c.question_id.clone(), c.queries.last().cloned().unwrap_or_default()))
                    .collect();
                memory.record(Self::NAME, TraceKind::FannedOut { children: named });
                let mut out = vec![expect_record(&memory, &children, self.deadline)];
                for child in children {
                    let queries = child.trajectory.last().map(|s| s.queries.clone()).unwrap_or_default();
                    out.push(QueriesEvent { schema_version: SCHEMA_VERSION, memory: child, queries }.to_record());
                }
                return Ok(out);
            }
        }
        // At the depth limit, or with nothing new to search for: the trajectory is done refining.
        Ok(vec![VerifiedEvent { schema_version: SCHEMA_VERSION, memory }.to_record()])
    }
}
