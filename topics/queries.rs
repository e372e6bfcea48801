//! `queries`: new single-hop queries for the next iteration, query_gen -> retrieve.

use serde::{Deserialize, Serialize};

use super::{Memory, Topic, memory_event};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueriesEvent {
    pub schema_version: u32,
    /// Already advanced to the iteration these queries belong to.
    pub memory: Memory,
    pub queries: Vec<String>,
}

memory_event!(QueriesEvent, Topic::Queries);
