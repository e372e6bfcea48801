//! The question's memory: everything MIGRES remembers between iterations, carried inside each event
//! so that stages are stateless (paper Section 3: known facts, earlier queries, passage use counts),
//! and the values it holds that the events share: where a node sits in its question's tree
//! ([`NodeRef`]), an RQ-RAG trajectory's steps, the evidence shown to an LLM, log-probabilities.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::logprobs::AnswerLogprobs;
use super::trace::{TraceKind, TraceStep};

/// A passage of the corpus, as retrieved.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Passage {
    pub id: String,
    pub title: String,
    pub text: String,
}

/// Where a known fact comes from: a passage that entails it, or the model's own knowledge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FactSource {
    /// At least one cited passage entails the fact.
    Verified,
    /// Written by knowledge prompting when no passage survived: not checked against any passage.
    ModelKnowledge,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct KnownFact {
    pub text: String,
    /// Passage ids that entail the fact (empty for model knowledge).
    pub citations: Vec<String>,
    pub source: FactSource,
    pub iteration: u32,
}

/// LLM spending of one question so far.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Usage {
    pub llm_calls: u32,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Prompt tokens the server served from its prefix cache, when it reports them.
    pub cached_tokens: u64,
    /// Tokens the model wrote as "knowledge" when no passage survived (knowledge prompting).
    pub knowledge_tokens: u64,
    /// Tokens of retrieved text shown to the LLM (paper Table 5's external knowledge tokens), counted
    /// with the re-ranker's WordPiece tokenizer: the LLM's own tokenizer is behind the endpoint.
    #[serde(default)]
    pub evidence_tokens: u64,
    /// Passages (or their kept sentences) shown to the LLM, over all iterations (paper Table 4).
    #[serde(default)]
    pub passages_shown: u32,
    /// LLM calls answered from Lacuna's response cache (also counted in `llm_calls`).
    #[serde(default)]
    pub cache_hits: u32,
    /// What the calls cost by `llm.prices`, in its currency (0 for models without a price): the
    /// tokens of re-asked replies included, cache hits free.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cost: f64,
    /// `cost` by stage.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cost_by_stage: BTreeMap<String, f64>,
}

fn is_zero(cost: &f64) -> bool {
    *cost == 0.0
}

impl Usage {
    /// Why this spending is over `budget`, if it is.
    pub fn over_budget(&self, budget: &crate::config::BudgetSettings) -> Option<String> {
        if budget.max_llm_calls > 0 && self.llm_calls >= budget.max_llm_calls {
            return Some(format!(
                "{} LLM calls spent, budget.max_llm_calls = {}",
                self.llm_calls, budget.max_llm_calls
            ));
        }
        if budget.max_tokens > 0 && self.tokens() >= budget.max_tokens {
            return Some(format!("{} tokens spent, budget.max_tokens = {}", self.tokens(), budget.max_tokens));
        }
        if budget.max_cost > 0.0 && self.cost >= budget.max_cost {
            return Some(format!("a cost of {:.4} spent, budget.max_cost = {}", self.cost, budget.max_cost));
        }
        None
    }

    /// Adds a child's spending to its parent's.
    pub fn add(&mut self, other: &Usage) {
        self.llm_calls += other.llm_calls;
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.cached_tokens += other.cached_tokens;
        self.knowledge_tokens += other.knowledge_tokens;
        self.evidence_tokens += other.evidence_tokens;
        self.passages_shown += other.passages_shown;
        self.cache_hits += other.cache_hits;
        self.cost += other.cost;
        for (stage, cost) in &other.cost_by_stage {
            *self.cost_by_stage.entry(stage.clone()).or_default() += cost;
        }
    }

    /// Prompt and completion tokens together: what `budget.max_tokens` counts.
    pub fn tokens(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    pub question_id: String,
    pub question: String,
    /// 1 for the initial retrieval with the question itself, +1 for each round of new queries.
    pub iteration: u32,
    /// Every query issued so far, oldest first; new queries must differ from all of them.
    pub queries: Vec<String>,
    pub facts: Vec<KnownFact>,
    /// A passage's count rises when it is shown to the LLM and when a kept fact cites it.
    pub passage_uses: BTreeMap<String, u32>,
    /// The passages cited by kept facts, so the answer can show what each fact rests on.
    pub cited_passages: BTreeMap<String, Passage>,
    pub usage: Usage,
    /// The main module's last summary of what is missing, reused when an iteration adds no fact.
    #[serde(default)]
    pub last_missing: String,
    /// Set when no new query could be written: the main stage must answer with what it knows.
    #[serde(default)]
    pub exhausted: bool,
    /// Queries the main module wrote with its decision (`migres.queries_from_main`), for query_gen
    /// to filter and take instead of asking the LLM again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub proposed_queries: Vec<String>,
    /// The question wants "yes" or "no" (carried from the question event).
    #[serde(default)]
    pub yes_no: bool,
    /// Where this question sits when it is part of a fanned-out one (RA-ISF sub-questions, RQ-RAG
    /// trajectories); `None` for a question of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeRef>,
    /// The RQ-RAG trajectory so far.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trajectory: Vec<TrajectoryStep>,
    /// QPaug's self-generated passage ("Your knowledge"), shown beside the retrieved ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated_passage: Option<String>,
    /// The question event's `submission`, which sub-questions inherit.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub submission: String,
    /// The passages the re-ranker scored best for any query so far, whole, at most [`BEST_KEPT`],
    /// best first, whether or not they passed the threshold: what MIGRES reads when its facts settle
    /// nothing at the limit (`migres.reader_fallback`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub best_passages: Vec<ScoredPassage>,
    /// The first read's answer (`migres.read_first`) while the loop runs because a check found it
    /// unsupported: the final answer is chosen between it and the loop's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_shot: Option<OneShot>,
    pub trace: Vec<TraceStep>,
}

/// The answer of one read of the question's best passages, and the passages it read, whole.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OneShot {
    pub answer: String,
    pub confidence: f32,
    pub explanation: String,
    pub passages: Vec<Passage>,
    /// The checks that sent it round the loop, by name (`read_first_goes_on_when`): kept here, not
    /// read back from the trace, which an oversized event may have trimmed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub went_on: Vec<String>,
}

/// How many scored passages the memory keeps for the reader fallback: VANILLA's top-k.
pub const BEST_KEPT: usize = 5;

/// A passage and its best re-ranker score against any of the question's queries.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScoredPassage {
    pub passage: Passage,
    pub score: f32,
}

impl Memory {
    pub fn new(question_id: impl Into<String>, question: impl Into<String>) -> Self {
        Memory {
            question_id: question_id.into(),
            question: question.into(),
            iteration: 1,
            queries: Vec::new(),
            facts: Vec::new(),
            passage_uses: BTreeMap::new(),
            cited_passages: BTreeMap::new(),
            usage: Usage::default(),
            last_missing: String::new(),
            exhausted: false,
            proposed_queries: Vec::new(),
            yes_no: false,
            node: None,
            trajectory: Vec::new(),
            generated_passage: None,
            submission: String::new(),
            best_passages: Vec::new(),
            one_shot: None,
            trace: Vec::new(),
        }
    }

    /// The id of the question the user asked (its own id unless this is a node of a bigger one).
    pub fn root_id(&self) -> &str {
        self.node.as_ref().map_or(&self.question_id, |n| &n.root_id)
    }

    /// This question's node: the root of its own tree unless it is part of a bigger one.
    pub fn node_ref(&self) -> NodeRef {
        self.node.clone().unwrap_or_else(|| NodeRef::root(self.question_id.clone()))
    }

    /// A child question of this one, at child `index`: a fresh memory keyed by the child's node key.
    pub fn child(&self, index: u32, question: impl Into<String>) -> Memory {
        let node = self.node_ref().child(index);
        let mut child = Memory::new(node.key(), question);
        child.yes_no = false;
        child.node = Some(node);
        child.submission = self.submission.clone();
        child
    }

    pub fn uses(&self, passage_id: &str) -> u32 {
        self.passage_uses.get(passage_id).copied().unwrap_or(0)
    }

    /// A passage used `max_uses` times has given what it can and is never shown again.
    pub fn is_used_up(&self, passage_id: &str, max_uses: u32) -> bool {
        self.uses(passage_id) >= max_uses
    }

    pub fn count_use(&mut self, passage_id: &str) {
        *self.passage_uses.entry(passage_id.to_string()).or_insert(0) += 1;
    }

    /// True when `query` repeats an earlier query (after normalisation) or the question itself.
    pub fn has_asked(&self, query: &str) -> bool {
        let wanted = normalize_query(query);
        normalize_query(&self.question) == wanted || self.queries.iter().any(|q| normalize_query(q) == wanted)
    }

    /// Keeps the best [`BEST_KEPT`] passages among those already kept and `scored`; a passage
    /// scored for two queries counts once, at its better score. Only a passage that makes the list
    /// is copied: this runs on every hit the re-ranker scores.
    pub fn note_scored<'a>(&mut self, scored: impl IntoIterator<Item = (&'a Passage, f32)>) {
        for (passage, score) in scored {
            // The list is kept sorted, best first, so its last is the one a newcomer must beat.
            let makes_the_list = self.best_passages.len() < BEST_KEPT
                || self.best_passages.last().is_some_and(|lowest| score > lowest.score);
            if let Some(kept) = self.best_passages.iter_mut().find(|kept| kept.passage.id == passage.id) {
                kept.score = kept.score.max(score);
            } else if makes_the_list {
                self.best_passages.push(ScoredPassage { passage: passage.clone(), score });
            } else {
                continue;
            }
            self.best_passages.sort_by(|a, b| b.score.total_cmp(&a.score));
            self.best_passages.truncate(BEST_KEPT);
        }
    }

    /// Facts kept in the current iteration.
    pub fn new_facts(&self) -> usize {
        self.facts.iter().filter(|f| f.iteration == self.iteration).count()
    }

    /// Facts kept in the current iteration that a passage entails (not model knowledge).
    pub fn new_verified_facts(&self) -> usize {
        self.facts.iter().filter(|f| f.iteration == self.iteration && f.source == FactSource::Verified).count()
    }

    /// Known facts as the prompts show them: joined with "; ", or "None" (as in the MIGRES code).
    pub fn facts_text(&self) -> String {
        if self.facts.is_empty() {
            return "None".to_string();
        }
        self.facts.iter().map(|f| f.text.as_str()).collect::<Vec<_>>().join("; ")
    }

    /// The facts a cited passage entails (not model knowledge): the only evidence an answer has.
    pub fn verified_facts(&self) -> impl Iterator<Item = &KnownFact> {
        self.facts.iter().filter(|f| f.source == FactSource::Verified)
    }

    /// The verified facts alone, or all facts when none is verified: what an answer that must not
    /// rest on closed-book guesses reads when there is evidence.
    pub fn verified_facts_text(&self) -> String {
        let verified: Vec<&str> = self.verified_facts().map(|f| f.text.as_str()).collect();
        if verified.is_empty() {
            return self.facts_text();
        }
        verified.join("; ")
    }

    /// The question as the answering prompts show it. For a yes/no question it carries the MIGRES
    /// instruction for StrategyQA (paper Table 17): reason from the Information whether the answer is
    /// "yes" or "no".
    pub fn question_to_answer(&self) -> String {
        if self.yes_no {
            format!(
                "{} (Your task is to reason from the Information whether the answer to the Question is \"yes\" or \"no\": answer \"yes\" or \"no\".)",
                self.question
            )
        } else {
            self.question.clone()
        }
    }

    pub fn record(&mut self, stage: &str, kind: TraceKind) {
        self.trace.push(TraceStep { stage: stage.to_string(), iteration: self.iteration, kind });
    }
}

/// Lower-case words without punctuation: "Who directed Levity?" and "who directed levity" are one query.
pub fn normalize_query(query: &str) -> String {
    query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.to_lowercase())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Where a node sits in its root question's tree: the root id and the child index at each level.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeRef {
    pub root_id: String,
    /// Empty for the root question itself.
    pub path: Vec<u32>,
}

impl NodeRef {
    pub fn root(root_id: impl Into<String>) -> Self {
        NodeRef { root_id: root_id.into(), path: Vec::new() }
    }

    pub fn is_root(&self) -> bool {
        self.path.is_empty()
    }

    /// Levels below the root: 0 for the root question.
    pub fn depth(&self) -> u32 {
        self.path.len() as u32
    }

    /// The `index`-th child (1-based, as people number sub-questions).
    pub fn child(&self, index: u32) -> NodeRef {
        let mut path = self.path.clone();
        path.push(index);
        NodeRef { root_id: self.root_id.clone(), path }
    }

    pub fn parent(&self) -> Option<NodeRef> {
        let (_, rest) = self.path.split_last()?;
        Some(NodeRef { root_id: self.root_id.clone(), path: rest.to_vec() })
    }

    /// The node's event key: the root id for the root, `<root>#1.2` below it.
    pub fn key(&self) -> String {
        if self.is_root() { self.root_id.clone() } else { format!("{}#{}", self.root_id, self.path_text()) }
    }

    /// "1.2" for the second child of the first child; "root" for the root.
    pub fn path_text(&self) -> String {
        if self.is_root() {
            return "root".to_string();
        }
        self.path.iter().map(u32::to_string).collect::<Vec<_>>().join(".")
    }

    /// True when `self` lies in the subtree of `ancestor` (or is it).
    pub fn is_within(&self, ancestor: &NodeRef) -> bool {
        self.root_id == ancestor.root_id && self.path.starts_with(&ancestor.path)
    }
}
/// One step of an RQ-RAG trajectory: how the query was refined, and what was found with it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrajectoryStep {
    /// "question" for the first retrieval, then "rewrite", "decompose" or "disambiguate".
    pub action: String,
    pub queries: Vec<String>,
    pub evidence: Vec<EvidenceItem>,
    /// Of the refinement the model wrote for this step, when the server returned them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<AnswerLogprobs>,
}
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvidenceOrigin {
    Passage,
    /// Written by the LLM when no passage survived filtering (knowledge prompting, paper 4.5).
    ModelKnowledge,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvidenceItem {
    /// The passage id, or `knowledge-<iteration>` for model knowledge.
    pub id: String,
    pub title: String,
    /// What the leaf module is shown: the kept sentences in their original order, or the whole
    /// passage. The entailment check reads the same text (as the MIGRES code does).
    pub text: String,
    pub score: f32,
    pub origin: EvidenceOrigin,
}
