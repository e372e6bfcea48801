//! The paper's retrieve-then-read baselines (Table 3), on the same actors as MIGRES:
//!
//! questions -> retrieve -> passages -> sentence_filter (top k, no threshold) -> evidence -> reader -> answers
//!
//! VANILLA shows the k best re-ranked passages whole; VANILLA-s cuts each to its sentences scoring at
//! or above the re-ranker threshold. One LLM call per question, no loop.

use crate::actors::stages::reader::Reader;
use crate::actors::stages::sentence_filter::FilterMode;
use crate::pipelines::declaration::{StageDecl, Startable, retrieve, sentence_filter};
use crate::topics::Topic;

pub const VANILLA: &[StageDecl] = &[
    retrieve(&[Topic::Questions]),
    sentence_filter(|s| s.sentence_filter(FilterMode::TOP_K, s.settings.migres.top_k)),
    READER,
];

pub const VANILLA_S: &[StageDecl] = &[
    retrieve(&[Topic::Questions]),
    sentence_filter(|s| s.sentence_filter(FilterMode::TOP_K_SENTENCES, s.settings.migres.top_k)),
    READER,
];

/// One answer call over the evidence shown (QPaug's answer step too).
pub const READER: StageDecl = StageDecl::llm::<Reader>(&[Topic::Evidence], &[Topic::Answers], |s| {
    Ok(Startable::new(Reader::new(s.llm(), s.settings.reader.compare_options)))
});
