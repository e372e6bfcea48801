//! What several stages share; a helper moves here from the stage that wrote it first once a second
//! stage needs it.
//!
//! - `answer`: how a question ends: the final answer, answer and error records, answer normalisation.
//! - `evidence`: numbered documents shown to the LLM, one answer call over them, and their citations.
//! - `fanout`: a splitting node's children registered with the join, results sent back to the parent.
//! - `named_pair`: the two things a question names to compare or join ("A or B?", "A and B both").
//! - `one_shot`: `migres.read_first`'s checks of the first read's answer, and the choice between it
//!   and the loop's.
//! - `selection`: choosing one answer among trajectories by perplexity, confidence or ensemble (RQ-RAG).
//! - `span`: an answer mapped to the whole name the evidence writes it as, stray punctuation stripped.
//! - `two_options`: "which of A or B" questions: the model copies each option's value, code compares.
//! - `accounting`: each LLM call, and each step that went on degraded, written to usage and trace.

pub mod accounting;
pub mod answer;
pub mod evidence;
pub mod fanout;
pub mod named_pair;
pub mod one_shot;
pub mod selection;
pub mod span;
pub mod two_options;
