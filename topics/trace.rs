//! The trace of a question: every query, passage score, kept sentence, fact, verdict and LLM call,
//! in order. It travels with the memory and ends in the answer record, so an answer can be audited.

use serde::{Deserialize, Serialize};

use super::logprobs::AnswerLogprobs;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceStep {
    pub stage: String,
    pub iteration: u32,
    #[serde(flatten)]
    pub kind: TraceKind,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TraceKind {
    Retrieved {
        query: String,
        hits: Vec<(String, f32)>,
        skipped_used_up: usize,
        /// The generation of the index the hits came from (`Search::generation`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        generation: Option<String>,
    },
    PassageScored {
        query: String,
        passage_id: String,
        score: f32,
        kept: bool,
    },
    SentencesKept {
        passage_id: String,
        sentences: Vec<String>,
        whole_passage: bool,
        score: f32,
    },
    KnowledgePrompted {
        queries: Vec<String>,
        text: String,
    },
    /// The stage went on without what it asked for instead of ending the question: its reply
    /// stayed unusable after re-asks, or was cut short. The record lists such stages in `degraded`.
    Degraded {
        cause: String,
        message: String,
    },
    /// The trace was cut to keep its event under `bus.max_event_bytes` (see `topics/size.rs`).
    Trimmed {
        removed_steps: u64,
        limit_bytes: u64,
    },
    LlmCall {
        purpose: String,
        prompt_tokens: u64,
        completion_tokens: u64,
        cached_tokens: u64,
        latency_ms: u64,
        attempts: u32,
        /// Unusable replies asked again before this one.
        #[serde(default, skip_serializing_if = "is_zero")]
        reasks: u32,
    },
    FactProposed {
        fact: String,
        citations: Vec<String>,
        dropped_citations: Vec<String>,
    },
    Verdict {
        fact: String,
        passage_id: String,
        entailed: bool,
        /// The passage's words the judge quoted for the fact (`nli.calls = "per_leaf"`), or the fact
        /// itself when the passage holds it word for word and no judge was asked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        quote: Option<String>,
    },
    FactKept {
        fact: String,
        citations: Vec<String>,
        verified: bool,
    },
    FactDropped {
        fact: String,
        reason: String,
    },
    Decision {
        answerable: bool,
        answer: String,
        confidence: f32,
        missing_information: String,
        forced: bool,
        /// Why an answer the model gave did not end the loop ("not_confident", "ungrounded"); an
        /// optional field, so readers of schema version 2 without it read it as absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        held_back: Option<String>,
    },
    /// `migres.stop_when_not_learning`: the iteration verified no new fact, so the loop answers now
    /// (`new_facts` counts what it learned from the model's own knowledge, which does not count).
    StoppedLearning {
        new_facts: u32,
    },
    QueriesWritten {
        queries: Vec<String>,
        dropped: Vec<String>,
    },
    /// QPaug: the question's step-by-step augmentation and the model's own passage.
    Augmented {
        augmentation: String,
        generated_passage: String,
    },
    /// RA-ISF's self-knowledge module: can the model answer without retrieval?
    SelfKnowledge {
        known: bool,
    },
    /// RA-ISF's passage relevance module, per passage.
    Relevance {
        passage_id: String,
        relevant: bool,
    },
    /// A node split into children (RA-ISF sub-questions, RQ-RAG refined queries).
    FannedOut {
        children: Vec<(String, String)>,
    },
    /// The join handed the children's results back (`missing` ones did not return by the deadline).
    Joined {
        returned: Vec<String>,
        missing: Vec<String>,
        /// Each returned child's answers (node key, answer), so the trace shows what came back.
        #[serde(default)]
        answers: Vec<(String, String)>,
    },
    /// A sub-question or trajectory gave up; its parent goes on without its answer.
    Failed {
        error_type: String,
        message: String,
    },
    /// RQ-RAG: the answer chosen among the trajectories' answers, and each one's score.
    Selected {
        strategy: String,
        answer: String,
        scores: Vec<(String, f64)>,
    },
    /// A two-option question's answer settled by comparing the options' copied dates or numbers,
    /// or by the option a verified fact links the answer to (`migres.compare_options`).
    OptionsSettled {
        /// Each option and the value copied for it (empty when no comparison was asked for).
        values: Vec<(String, String)>,
        answer_before: String,
        answer: String,
    },
    /// `migres.read_first`: the answer of one read of the question's best passages, and the checks
    /// that found it unsupported and sent the question round the loop (none: it is the answer).
    ReadFirst {
        /// The passages read, as shown.
        passages: Vec<String>,
        answer: String,
        went_on: Vec<String>,
        /// The log-probabilities of the answer's tokens, when the read asked for them
        /// (`migres.read_first_logprobs`, or the `unsure` check).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answer_logprobs: Option<AnswerLogprobs>,
    },
    /// The final answer chosen between the first read's and the loop's by which the evidence behind
    /// each writes (a tie keeps the first read's).
    OneShotOrLoop {
        one_shot: String,
        loop_answer: String,
        chosen: String,
    },
    /// A step of a kind this build does not know, written by a later one during a rolling upgrade:
    /// read rather than refused, its details are not kept.
    #[serde(other)]
    Unknown,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
