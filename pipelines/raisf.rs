//! RA-ISF (paper 003, Algorithm 1), retrieval-augmented iterative self-feedback, on the same actors:
//!
//! questions, nodes -> self_knowledge -> (known: answer) or queries -> retrieve -> passages
//!   -> sentence_filter (top k) -> evidence -> relevance -> (relevant passages: answer)
//!   or missing -> decompose -> (below D_th) joins + nodes: one sub-question per node, solved from
//!   self_knowledge on; joins -> join -> joined -> compose -> the answer from the sub-answers
//!
//! A node's answer goes to `answers` for a root question, to `joins` (its parent) otherwise. The three
//! modules (self-knowledge, relevance, decomposition) are three stages, each with its endpoint from
//! `raisf.*`.

use std::time::Duration;

use crate::actors::stages::compose::Compose;
use crate::actors::stages::decompose::Decompose;
use crate::actors::stages::relevance::Relevance;
use crate::actors::stages::self_knowledge::SelfKnowledge;
use crate::actors::stages::sentence_filter::FilterMode;
use crate::pipelines::declaration::{JOIN, StageDecl, Startable, retrieve, sentence_filter};
use crate::topics::Topic;

pub const STAGES: &[StageDecl] = &[
    // Sub-questions before new questions: a question already split finishes first.
    StageDecl::llm::<SelfKnowledge>(
        &[Topic::Nodes, Topic::Questions],
        &[Topic::Answers, Topic::Joins, Topic::Queries],
        |s| {
            let raisf = &s.settings.raisf;
            let module = raisf.self_knowledge_check.then(|| s.llm_with(&raisf.self_knowledge));
            Ok(Startable::new(SelfKnowledge::new(module, s.llm())))
        },
    ),
    retrieve(&[Topic::Queries]),
    sentence_filter(|s| s.sentence_filter(FilterMode::TOP_K, s.settings.raisf.top_k)),
    StageDecl::llm::<Relevance>(&[Topic::Evidence], &[Topic::Answers, Topic::Joins, Topic::Missing], |s| {
        Ok(Startable::new(Relevance::new(s.llm_with(&s.settings.raisf.relevance), s.llm())))
    }),
    StageDecl::llm::<Decompose>(&[Topic::Missing], &[Topic::Answers, Topic::Joins, Topic::Nodes], |s| {
        let raisf = &s.settings.raisf;
        let deadline = Duration::from_millis(s.settings.join.deadline_ms);
        Ok(Startable::new(Decompose::new(s.llm_with(&raisf.decompose), s.llm(), raisf.clone(), deadline)))
    }),
    JOIN,
    StageDecl::llm::<Compose>(&[Topic::Joined], &[Topic::Answers, Topic::Joins], |s| {
        Ok(Startable::new(Compose::new(s.llm())))
    }),
];
