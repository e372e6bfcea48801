//! Nodes of a fanned-out question: the sub-questions of RA-ISF and the trajectories of RQ-RAG. Each
//! node travels as its own event, keyed by its own id so any replica can take it, and ends in a
//! [`NodeResult`] that the join stage hands back to its parent.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Passage, TraceStep, Usage};

/// Where a node sits in its root question's tree: the root id and the child index at each level.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeRef {
    pub root_id: String,
    /// Empty for the root question itself.
    pub path: Vec<u32>,
}

impl NodeRef {
    pub fn root(root_id: impl Into<String>) -> Self {
        NodeRef { root_id: root_id.into(), path: Vec::new() }
    }

    pub fn is_root(&self) -> bool {
        self.path.is_empty()
    }

    /// Levels below the root: 0 for the root question.
    pub fn depth(&self) -> u32 {
        self.path.len() as u32
    }

    /// The `index`-th child (1-based, as people number sub-questions).
    pub fn child(&self, index: u32) -> NodeRef {
        let mut path = self.path.clone();
        path.push(index);
        NodeRef { root_id: self.root_id.clone(), path }
    }

    pub fn parent(&self) -> Option<NodeRef> {
        let (_, rest) = self.path.split_last()?;
        Some(NodeRef { root_id: self.root_id.clone(), path: rest.to_vec() })
    }

    /// The node's event key: the root id for the root, `<root>#1.2` below it.
    pub fn key(&self) -> String {
        if self.is_root() { self.root_id.clone() } else { format!("{}#{}", self.root_id, self.path_text()) }
    }

    /// "1.2" for the second child of the first child; "root" for the root.
    pub fn path_text(&self) -> String {
        if self.is_root() {
            return "root".to_string();
        }
        self.path.iter().map(u32::to_string).collect::<Vec<_>>().join(".")
    }

    /// True when `self` lies in the subtree of `ancestor` (or is it).
    pub fn is_within(&self, ancestor: &NodeRef) -> bool {
        self.root_id == ancestor.root_id && self.path.starts_with(&ancestor.path)
    }
}

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

/// The log-probabilities of the tokens of generated text.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AnswerLogprobs {
    /// Sum over the tokens: paper 004's Conf when the text is the final answer.
    pub sum: f64,
    pub tokens: u32,
}

impl AnswerLogprobs {
    /// exp(-mean log p) (paper 004's PPL): lower is better.
    pub fn perplexity(&self) -> f64 {
        if self.tokens == 0 { f64::INFINITY } else { (-self.sum / self.tokens as f64).exp() }
    }

    /// The probability of the whole text, exp(sum log p).
    pub fn probability(&self) -> f64 {
        self.sum.exp()
    }

    pub fn add(&mut self, other: &AnswerLogprobs) {
        self.sum += other.sum;
        self.tokens += other.tokens;
    }
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

/// One step of an RQ-RAG trajectory: how the query was refined, and what was found with it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrajectoryStep {
    /// "question" for the first retrieval, then "rewrite", "decompose" or "disambiguate".
    pub action: String,
    pub queries: Vec<String>,
    pub evidence: Vec<super::EvidenceItem>,
    /// Of the refinement the model wrote for this step, when the server returned them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<AnswerLogprobs>,
}
