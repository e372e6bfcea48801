//! trajectory_answer: the end of an RQ-RAG trajectory (paper 004, Section 2.3). A trajectory that
//! `refine` took to the depth limit, or that could refine no further, answers from everything its
//! steps retrieved, keeping the token log-probabilities of what it generated so that `select` can
//! choose among the trajectories. A trajectory that is the whole question (depth 0) answers the
//! question itself.

use async_trait::async_trait;

use crate::actors::clients::LlmClient;
use crate::actors::prompts::{self, NamedPrompt};
use crate::actors::runner::{Stage, StageError, decode};
use crate::actors::shared::accounting::note_call;
use crate::actors::shared::evidence::documents;
use crate::actors::shared::fanout::{is_root, result_record};
use crate::actors::shared::selection::choose_answer;
use crate::config::{Selection, Settings};
use crate::topics::{Candidate, Memory, Outcome, Record, VerifiedEvent};

pub struct TrajectoryAnswer {
    llm: LlmClient,
    selection: Selection,
}

impl TrajectoryAnswer {
    pub fn new(llm: LlmClient, selection: Selection) -> Self {
        TrajectoryAnswer { llm, selection }
    }

    /// The trajectory's answer from everything it found, with its token log-probabilities.
    async fn answer(&self, memory: &mut Memory) -> Result<Candidate, StageError> {
        let found = memory.trajectory.iter().flat_map(|s| &s.evidence);
        let docs = documents(found.clone().map(|e| (e.title.as_str(), e.text.as_str())));
        let citations = found.map(|e| e.id.clone()).collect();
        let prompt = prompts::fill(
            prompts::TRAJECTORY_ANSWER,
            &[("documents", &docs), ("question", &memory.question_to_answer())],
        );
        let reply = self.llm.line_with_logprobs(prompts::SYSTEM, &prompt).await?;
        note_call(memory, Self::NAME, "answer", &reply.stats);
        let answer = reply.value.trim().lines().next().unwrap_or_default().trim().trim_end_matches('.').to_string();
        let logprobs = reply.stats.logprobs.clone();
        // PPL is over everything the trajectory generated (paper 004, Section 2.3).
        let trajectory_logprobs = logprobs.as_ref().map(|answer| {
            let mut all = answer.clone();
            memory.trajectory.iter().filter_map(|s| s.logprobs.as_ref()).for_each(|l| all.add(l));
            all
        });
        let steps: Vec<String> =
            memory.trajectory.iter().map(|s| format!("{}: {}", s.action, s.queries.join(" | "))).collect();
        Ok(Candidate {
            answer,
            confidence: logprobs.as_ref().map_or(0.0, |l| l.probability() as f32),
            explanation: steps.join(" -> "),
            node: memory.node_ref(),
            queries: memory.trajectory.iter().flat_map(|s| s.queries.clone()).collect(),
            logprobs,
            trajectory_logprobs,
            citations,
        })
    }
}

#[async_trait(?Send)]
impl Stage for TrajectoryAnswer {
    const NAME: &'static str = "trajectory_answer";

    fn prompts(_: &Settings) -> Vec<NamedPrompt> {
        vec![("trajectory_answer", prompts::TRAJECTORY_ANSWER)]
    }

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let VerifiedEvent { mut memory, .. } = decode(record)?;
        let candidate = self.answer(&mut memory).await?;
        if is_root(&memory) {
            return Ok(vec![choose_answer(memory, Self::NAME, vec![candidate], self.selection, Outcome::Answered)]);
        }
        Ok(vec![result_record(memory, vec![candidate])])
    }
}
