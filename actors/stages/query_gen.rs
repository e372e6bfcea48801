//! query_gen: writes at most 3 new single-hop queries for the missing information, each different
//! from every earlier query (MIGRES query generator). When none survives, the question cannot make
//! progress: it goes back to main marked exhausted, to be answered with what is known.

use std::collections::HashSet;
use std::sync::OnceLock;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::actors::clients::{LlmClient, Schema};
use crate::actors::prompts::{self, NamedPrompt};
use crate::actors::runner::{Stage, StageError, decode};
use crate::actors::shared::accounting::note_call;
use crate::config::{MigresSettings, Settings};
use crate::topics::memory::normalize_query;
use crate::topics::{Event, Memory, MissingEvent, QueriesEvent, Record, SCHEMA_VERSION, TraceKind, VerifiedEvent};

pub struct QueryGen {
    llm: LlmClient,
    settings: MigresSettings,
}

#[derive(Deserialize, JsonSchema)]
struct NewQueries {
    /// At most `migres.max_new_queries`, a bound the schema gets from the settings.
    #[schemars(length(min = 1))]
    queries: Vec<String>,
}

fn schema(max: usize) -> Schema {
    Schema::of::<NewQueries>("new_queries").with_max_items("queries", max)
}

impl QueryGen {
    pub fn new(llm: LlmClient, settings: MigresSettings) -> Self {
        QueryGen { llm, settings }
    }

    /// Keeps queries that are not trivial, not asked before, not repeated in the batch and not
    /// copied from the prompts' examples; at most `max_new_queries`. Returns (kept, dropped).
    pub fn filter(&self, memory: &Memory, proposed: Vec<String>) -> (Vec<String>, Vec<String>) {
        let (mut kept, mut dropped) = (Vec::new(), Vec::new());
        let mut batch = HashSet::new();
        let known = known_words(memory);
        for query in proposed {
            let query = query.trim().to_string();
            let fresh = query.chars().count() >= self.settings.min_query_chars
                && !memory.has_asked(&query)
                && !(self.settings.drop_example_names && names_an_example(&query, &known))
                && batch.insert(normalize_query(&query));
            if fresh && kept.len() < self.settings.max_new_queries {
                kept.push(query);
            } else {
                dropped.push(query);
            }
        }
        (kept, dropped)
    }

    async fn generate(&self, event: MissingEvent) -> Result<Record, StageError> {
        let MissingEvent { mut memory, missing_information, .. } = event;
        // The main module wrote them with its decision: no call, unless none of them is new.
        let proposed = std::mem::take(&mut memory.proposed_queries);
        if !proposed.is_empty() {
            let (queries, dropped) = self.filter(&memory, proposed);
            if !queries.is_empty() {
                return Ok(self.next_iteration(memory, queries, dropped));
            }
        }
        let prompt = prompts::fill(
            prompts::QUERY_GEN,
            &[
                ("question", &memory.question),
                ("previous_queries", &memory.queries.join(" ")),
                ("facts", &memory.facts_text()),
                ("missing", &missing_information),
            ],
        );
        let reply =
            self.llm.structured::<NewQueries>(prompts::SYSTEM, &prompt, &schema(self.settings.max_new_queries)).await?;
        note_call(&mut memory, Self::NAME, "query_gen", &reply.stats);
        let (mut queries, dropped) = self.filter(&memory, reply.value.queries);
        // Nothing new from the model: the summary of what is missing is a query of its own, often
        // a better one for BM25 than a rephrasing of the queries already asked.
        if queries.is_empty() && self.settings.missing_as_query {
            queries = self.filter(&memory, vec![missing_information.clone()]).0;
        }
        if queries.is_empty() {
            memory.record(Self::NAME, TraceKind::QueriesWritten { queries, dropped });
            memory.exhausted = true;
            return Ok(VerifiedEvent { schema_version: SCHEMA_VERSION, memory }.to_record());
        }
        Ok(self.next_iteration(memory, queries, dropped))
    }

    fn next_iteration(&self, mut memory: Memory, queries: Vec<String>, dropped: Vec<String>) -> Record {
        memory.record(Self::NAME, TraceKind::QueriesWritten { queries: queries.clone(), dropped });
        memory.queries.extend(queries.iter().cloned());
        memory.iteration += 1;
        QueriesEvent { schema_version: SCHEMA_VERSION, memory, queries }.to_record()
    }
}

/// Whether `query` names someone or something that only the prompts' worked examples hold (the 1.5B
/// model asked "When did Dorrin Maskell die?", the example's director, about other films): a name of
/// the examples that none of `known` (the question's words and what it learned) holds.
fn names_an_example(query: &str, known: &HashSet<String>) -> bool {
    static EXAMPLES: OnceLock<HashSet<String>> = OnceLock::new();
    let examples = EXAMPLES.get_or_init(|| {
        [prompts::MAIN_QUERIES, prompts::QUERY_GEN].iter().flat_map(|t| names(worked_examples(t))).collect()
    });
    names(query).iter().any(|name| examples.contains(name) && !known.contains(&name.to_lowercase()))
}

/// The worked examples of a template: from "Example 1" to the final "Now ...".
fn worked_examples(template: &str) -> &str {
    let start = template.find("Example 1").unwrap_or(template.len());
    let end = template.rfind("\nNow ").filter(|end| *end > start).unwrap_or(template.len());
    &template[start..end]
}

/// Capitalised words that do not start a line, a sentence or a quotation: names, not the words of a
/// sentence ("Who", "The", "Information:" at a line's start).
fn names(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in text.lines() {
        let mut starts_sentence = true;
        for token in line.split_whitespace() {
            let word = token.trim_matches(|c: char| !c.is_alphanumeric());
            let quoted = token.starts_with(['"', '\'', '[', '{']);
            let capitalised = word.chars().next().is_some_and(char::is_uppercase)
                && word.chars().any(char::is_lowercase)
                && word.chars().count() >= 3;
            if capitalised && !starts_sentence && !quoted {
                found.push(word.to_string());
            }
            starts_sentence = token.ends_with(['.', '!', '?', ';', ':']);
        }
    }
    found
}

/// The lower-cased words of what the question knows: the question, the queries asked, the facts, the
/// passages they cite and the missing information main named.
fn known_words(memory: &Memory) -> HashSet<String> {
    let mut texts: Vec<&str> = vec![&memory.question, &memory.last_missing];
    texts.extend(memory.queries.iter().map(String::as_str));
    texts.extend(memory.facts.iter().map(|f| f.text.as_str()));
    texts.extend(memory.cited_passages.values().flat_map(|p| [p.title.as_str(), p.text.as_str()]));
    texts
        .iter()
        .flat_map(|t| t.split(|c: char| !c.is_alphanumeric()))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

#[async_trait(?Send)]
impl Stage for QueryGen {
    const NAME: &'static str = "query_gen";

    fn prompts(_: &Settings) -> Vec<NamedPrompt> {
        vec![("query_gen", prompts::QUERY_GEN)]
    }

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let event: MissingEvent = decode(record)?;
        Ok(vec![self.generate(event).await?])
    }
}
