//! retrieve: BM25 top-n for every query of the iteration. A new question starts its memory here and
//! is its own first query (MIGRES iteration 1); passages the memory has used up are not passed on.

use std::collections::HashSet;

use async_trait::async_trait;

use crate::actors::clients::Search;
use crate::actors::prompts::NamedPrompt;
use crate::actors::runner::{Stage, StageError, decode};
use crate::config::{MigresSettings, Settings};
use crate::topics::{
    Event, Memory, PassagesEvent, QueriesEvent, QuestionEvent, Record, RetrievedPassage, SCHEMA_VERSION, Topic,
    TraceKind,
};

/// Takes `queries`, and `questions` in the pipelines where no other stage starts them.
pub struct Retrieve {
    search: Search,
    settings: MigresSettings,
}

impl Retrieve {
    pub fn new(search: Search, settings: MigresSettings) -> Self {
        Retrieve { search, settings }
    }

    async fn retrieve(&self, mut memory: Memory, queries: Vec<String>) -> Result<PassagesEvent, StageError> {
        let mut hits = Vec::new();
        // A passage found by several queries is passed on once, with the first query that found it.
        let mut seen = HashSet::new();
        for query in &queries {
            let (found, generation) = self.search.search_with_generation(query, self.settings.retrieve_top_n).await?;
            let mut listed = Vec::new();
            let mut skipped_used_up = 0;
            for (passage, bm25) in found {
                if memory.is_used_up(&passage.id, self.settings.max_passage_uses) {
                    skipped_used_up += 1;
                    continue;
                }
                listed.push((passage.id.clone(), bm25));
                if seen.insert(passage.id.clone()) {
                    hits.push(RetrievedPassage { query: query.clone(), passage, bm25 });
                }
            }
            memory.record(
                Self::NAME,
                TraceKind::Retrieved { query: query.clone(), hits: listed, skipped_used_up, generation },
            );
        }
        Ok(PassagesEvent { schema_version: SCHEMA_VERSION, memory, queries, hits })
    }
}

#[async_trait(?Send)]
impl Stage for Retrieve {
    const NAME: &'static str = "retrieve";

    /// Retrieval asks no LLM.
    fn prompts(_: &Settings) -> Vec<NamedPrompt> {
        Vec::new()
    }

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let (memory, queries) = match record.topic {
            Topic::Questions => {
                let question: QuestionEvent = decode(record)?;
                let mut memory = question.memory();
                memory.queries.push(question.question.clone());
                (memory, vec![question.question])
            }
            _ => {
                let event: QueriesEvent = decode(record)?;
                (event.memory, event.queries)
            }
        };
        Ok(vec![self.retrieve(memory, queries).await?.to_record()])
    }
}
