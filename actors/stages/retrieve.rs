//! retrieve: BM25 top-n for every query of the iteration. A new question starts its memory here and
//! is its own first query (MIGRES iteration 1); passages the memory has used up are not passed on.

use std::collections::HashSet;

use async_trait::async_trait;

use crate::actors::clients::Search;
use crate::actors::prompts::NamedPrompt;
use crate::actors::runner::{Stage, StageError, decode};
use crate::actors::shared::named_pair;
use crate::config::{GoOnWhen, MigresSettings, Settings};
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
                let mut queries = vec![question.question.clone()];
                let looks_up_each =
                    self.settings.read_first && self.settings.read_first_goes_on_when.contains(&GoOnWhen::OptionUnseen);
                if looks_up_each {
                    queries.extend(query_per_option(&question.question));
                }
                memory.queries.extend(queries.iter().cloned());
                (memory, queries)
            }
            _ => {
                let event: QueriesEvent = decode(record)?;
                (event.memory, event.queries)
            }
        };
        Ok(vec![self.retrieve(memory, queries).await?.to_record()])
    }
}

/// With the `option_unseen` check, a question about two named things also looks each one up: its
/// name, then the question's words outside both names. One BM25 query over the whole question often
/// ranks one thing's pages alone in the top few; the loop starts from both.
fn query_per_option(question: &str) -> Vec<String> {
    let Some(pair) = named_pair::named_pair(question) else { return Vec::new() };
    let rest = question.replace(&pair.first, " ").replace(&pair.second, " ");
    let rest: Vec<&str> = rest
        .split_whitespace()
        .filter(|w| !matches!(w.trim_matches(|c: char| !c.is_alphanumeric()), "" | "or" | "and"))
        .collect();
    [pair.first, pair.second].into_iter().map(|name| format!("{name} {}", rest.join(" "))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_of_two_named_things_is_looked_up_with_the_rest_of_the_question() {
        assert_eq!(
            query_per_option("Which film came out first, Lone Tarn or Harrow Lights?"),
            ["Lone Tarn Which film came out first,", "Harrow Lights Which film came out first,"]
        );
        assert_eq!(
            query_per_option("Are Cal Verrin and Tom Quill both goalkeepers?"),
            ["Cal Verrin Are both goalkeepers?", "Tom Quill Are both goalkeepers?"]
        );
        assert!(query_per_option("Where was the father of Tom Quill born?").is_empty());
    }
}
