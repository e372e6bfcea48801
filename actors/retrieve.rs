//! retrieve: BM25 top-n for every query of the iteration. A new question starts its memory here and
//! is its own first query (MIGRES iteration 1); passages the memory has used up are not passed on.

use std::collections::HashSet;

use async_trait::async_trait;

use crate::actors::clients::Search;
use crate::actors::stage::{Stage, StageError, decode};
use crate::settings::MigresSettings;
use crate::topics::{
    Event, Memory, PassagesEvent, QueriesEvent, QuestionEvent, Record, RetrievedPassage, SCHEMA_VERSION, Topic,
    TraceKind,
};

pub struct Retrieve {
    search: Search,
    settings: MigresSettings,
    /// False when another stage starts questions (QPaug's augment, RA-ISF's self_knowledge).
    takes_questions: bool,
}

impl Retrieve {
    pub fn new(search: Search, settings: MigresSettings) -> Self {
        Retrieve { search, settings, takes_questions: true }
    }

    /// Consumes `queries` only.
    pub fn queries_only(self) -> Self {
        Retrieve { takes_questions: false, ..self }
    }

    async fn retrieve(&self, mut memory: Memory, queries: Vec<String>) -> Result<PassagesEvent, StageError> {
        let mut hits = Vec::new();
        // A passage found by several queries is passed on once, with the first query that found it.
        let mut seen = HashSet::new();
        for query in &queries {
            let found = self.search.search(query, self.settings.retrieve_top_n).await?;
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
            memory.record(Self::NAME, TraceKind::Retrieved { query: query.clone(), hits: listed, skipped_used_up });
        }
        Ok(PassagesEvent { schema_version: SCHEMA_VERSION, memory, queries, hits })
    }
}

#[async_trait(?Send)]
impl Stage for Retrieve {
    const NAME: &'static str = "retrieve";

    fn inputs(&self) -> &'static [Topic] {
        // Questions already in the loop go before new ones.
        if self.takes_questions { &[Topic::Queries, Topic::Questions] } else { &[Topic::Queries] }
    }

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let (memory, queries) = match record.topic {
            Topic::Questions => {
                let question: QuestionEvent = decode(record)?;
                let mut memory = Memory::new(question.id, question.question.clone());
                memory.yes_no = question.yes_no;
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
