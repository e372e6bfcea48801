//! QPaug (paper 002), question and passage augmentation, on the same actors:
//!
//! questions -> augment -> queries -> retrieve -> passages -> sentence_filter (top K-1) -> evidence -> reader -> answers
//!
//! augment writes the step-by-step decomposition that is searched with the question, and the model's
//! own passage, which the reader shows after the K-1 retrieved ones as "Your knowledge".

use crate::actors::stages::augment::Augment;
use crate::actors::stages::sentence_filter::FilterMode;
use crate::pipelines::declaration::{StageDecl, Startable, retrieve, sentence_filter};
use crate::pipelines::vanilla::READER;
use crate::topics::Topic;

pub const STAGES: &[StageDecl] = &[
    StageDecl::llm::<Augment>(&[Topic::Questions], &[Topic::Queries], |s| Ok(Startable::new(Augment::new(s.llm())))),
    // augment starts every question, so retrieve takes queries only.
    retrieve(&[Topic::Queries]),
    sentence_filter(|s| s.sentence_filter(FilterMode::TOP_K, s.settings.qpaug.top_k - 1)),
    READER,
];
