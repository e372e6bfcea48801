//! `verified`: a question's memory, ready to be answered from. MIGRES: with this iteration's
//! entailed facts added, verify -> main; query_gen also sends here, with `memory.exhausted`, when
//! it could write no new query. RQ-RAG: a trajectory done refining, refine -> trajectory_answer.

use serde::{Deserialize, Serialize};

use super::{Memory, Topic, memory_event};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VerifiedEvent {
    pub schema_version: u32,
    pub memory: Memory,
}

memory_event!(VerifiedEvent, Topic::Verified);
