//! Nodes of a fanned-out question: the sub-questions of RA-ISF and the trajectories of RQ-RAG. Each
//! node travels as its own event, keyed by its own id so any replica can take it, and ends in a
//! [`NodeResult`] that the join stage hands back to its parent.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{AnswerLogprobs, NodeRef, Passage, TraceStep, Usage};

/// One answer a node arrived at. RA-ISF nodes give one; an RQ-RAG subtree gives one per trajectory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Candidate {
    pub answer: String,
    pub confidence: f32,
    pub explanation: String,
    /// The node that wrote it.
    #[schema(value_type = Object)]
    pub node: NodeRef,
    /// The queries its trajectory searched with, in order (RQ-RAG).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queries: Vec<String>,
    /// Token log-probabilities of the answer, when the server returned them (RQ-RAG's selection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<AnswerLogprobs>,
    /// The same over everything the trajectory generated: its refined queries and the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trajectory_logprobs: Option<AnswerLogprobs>,
    /// The passages this answer was read from, by id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub citations: Vec<String>,
}

/// What a finished node hands back to its parent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeResult {
    pub node: NodeRef,
    pub question: String,
    pub candidates: Vec<Candidate>,
    /// The node's whole spending, its own subtree included: the parent adds it to its own.
    pub usage: Usage,
    pub cited_passages: BTreeMap<String, Passage>,
    pub trace: Vec<TraceStep>,
}

/// `nodes`: a sub-question to solve like a question of its own (RA-ISF's recursion).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeEvent {
    pub schema_version: u32,
    /// `memory.node` says where it sits; `memory.question` is the sub-question.
    pub memory: super::Memory,
}

super::memory_event!(NodeEvent, super::Topic::Nodes);
