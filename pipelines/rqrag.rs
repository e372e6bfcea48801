//! RQ-RAG (paper 004, Section 2.3), query refinement over a tree of trajectories, on the same actors:
//!
//! questions, queries -> retrieve -> passages -> sentence_filter (top k) -> evidence -> refine
//!   -> (below the depth limit) joins + one queries event per refinement (rewrite, decompose,
//!      disambiguate), each a trajectory of its own, back to retrieve
//!   -> (at the limit) verified -> trajectory_answer: the trajectory's answer with its token
//!      log-probabilities -> joins (the root's, when it could not branch: answers)
//! joins -> join -> joined -> select -> (below the root) joins, (at the root) answers
//!
//! `select` chooses by perplexity, confidence or ensemble; every trajectory's answer stays in the
//! answer record.

use std::time::Duration;

use crate::actors::runner::Stage;
use crate::actors::stages::refine::Refine;
use crate::actors::stages::select::Select;
use crate::actors::stages::sentence_filter::FilterMode;
use crate::actors::stages::trajectory_answer::TrajectoryAnswer;
use crate::config::StageSettings;
use crate::pipelines::declaration::{JOIN, Replicas, StageDecl, Startable, retrieve, sentence_filter};
use crate::topics::Topic;

pub const STAGES: &[StageDecl] = &[
    retrieve(&[Topic::Queries, Topic::Questions]),
    sentence_filter(|s| s.sentence_filter(FilterMode::TOP_K, s.settings.rqrag.top_k)),
    StageDecl::llm::<Refine>(&[Topic::Evidence], &[Topic::Joins, Topic::Queries, Topic::Verified], |s| {
        let deadline = Duration::from_millis(s.settings.join.deadline_ms);
        Ok(Startable::new(Refine::new(s.llm(), s.settings.rqrag.clone(), deadline)))
    }),
    StageDecl::llm::<TrajectoryAnswer>(&[Topic::Verified], &[Topic::Answers, Topic::Joins], |s| {
        Ok(Startable::new(TrajectoryAnswer::new(s.llm(), s.settings.rqrag.selection)))
    }),
    JOIN,
    // Chooses from log-probabilities the trajectories brought: no LLM call of its own.
    StageDecl {
        name: Select::NAME,
        prompts: Select::prompts,
        inputs: &[Topic::Joined],
        outputs: &[Topic::Answers, Topic::Joins],
        needs: &[],
        replicas: Replicas::Scaled,
        runs: StageSettings { max_in_flight: 8, llm_concurrency: 1 },
        build: |s| Ok(Startable::new(Select::new(s.settings.rqrag.selection))),
    },
];
