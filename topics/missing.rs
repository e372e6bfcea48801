//! `missing`: the main module found the facts insufficient and named what is missing, main -> query_gen.

use serde::{Deserialize, Serialize};

use super::{Memory, Topic, memory_event};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MissingEvent {
    pub schema_version: u32,
    pub memory: Memory,
    pub missing_information: String,
}

memory_event!(MissingEvent, Topic::Missing);
