//! sentence_filter: the MIGRES knowledge filter. The cross-encoder scores each passage against the
//! query that found it and drops those below the threshold; the survivors are cut down to their
//! relevant sentences (or kept whole when the passage scores higher than its best sentence), and the
//! top k are shown to the leaf module. When nothing survives, the LLM writes what it knows instead
//! (knowledge prompting, paper 4.5), marked as model knowledge. The memory keeps the best-scored
//! passages, whole, for MIGRES's reader fallback at the limit.
//!
//! With `migres.read_first`, the first iteration also reads the passages once, as VANILLA-s does: an
//! answer no check finds unsupported ends the question here (`shared/one_shot.rs`).

use async_trait::async_trait;

use crate::actors::clients::rerank::titled;
use crate::actors::clients::{LlmClient, LlmError, Reranker};
use crate::actors::prompts::{self, NamedPrompt};
use crate::actors::runner::{Stage, StageError, decode};
use crate::actors::shared::accounting::{degrade, note_call};
use crate::actors::shared::answer::{FinalAnswer, given_answer};
use crate::actors::shared::evidence::{cite_shown, documents, read_settled_scored};
use crate::actors::shared::one_shot::reasons_to_go_on;
use crate::config::{GoOnWhen, MigresSettings, Settings};
use crate::topics::{
    Event, EvidenceEvent, EvidenceItem, EvidenceOrigin, Memory, OneShot, Outcome, Passage, PassagesEvent, Record,
    RetrievedPassage, SCHEMA_VERSION, TraceKind,
};

pub struct SentenceFilter {
    reranker: Reranker,
    llm: LlmClient,
    settings: MigresSettings,
    mode: FilterMode,
}

/// How much filtering a pipeline wants. MIGRES uses all of it; the paper's baselines take the top k
/// re-ranked passages whole (VANILLA) or cut to their relevant sentences (VANILLA-s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FilterMode {
    /// Drop passages scoring below `rerank_threshold` (otherwise only the top k are kept).
    pub passage_threshold: bool,
    /// Cut kept passages down to their sentences scoring at or above the threshold.
    pub sentences: bool,
    /// Ask the LLM what it knows when nothing survives (also needs `migres.knowledge_prompting`).
    pub knowledge_prompting: bool,
}

impl FilterMode {
    pub const MIGRES: FilterMode = FilterMode { passage_threshold: true, sentences: true, knowledge_prompting: true };
    pub const TOP_K: FilterMode = FilterMode { passage_threshold: false, sentences: false, knowledge_prompting: false };
    pub const TOP_K_SENTENCES: FilterMode =
        FilterMode { passage_threshold: false, sentences: true, knowledge_prompting: false };
}

/// What the first read (`migres.read_first`) leaves: the question's answer, or the question to filter
/// for the loop with its passages' scores.
enum FirstRead {
    Answered(Record),
    GoOn(PassagesEvent, Vec<f32>),
}

/// The hits of the question's own query (the first, listed first): what the first read sees, as
/// VANILLA-s would. What the `option_unseen` check's query per option found waits for the loop.
fn question_hits(event: &PassagesEvent) -> PassagesEvent {
    let question = event.queries.first();
    let hits = event.hits.iter().take_while(|hit| Some(&hit.query) == question).cloned().collect();
    PassagesEvent { hits, queries: question.cloned().into_iter().collect(), ..event.clone() }
}

/// A passage that passed the threshold, reduced to what will be shown.
struct Snippet {
    id: String,
    title: String,
    text: String,
    score: f32,
}

impl SentenceFilter {
    pub fn new(reranker: Reranker, llm: LlmClient, settings: MigresSettings) -> Self {
        SentenceFilter { reranker, llm, settings, mode: FilterMode::MIGRES }
    }

    pub fn with_mode(self, mode: FilterMode) -> Self {
        SentenceFilter { mode, ..self }
    }

    /// `migres.read_first`: the question's passages read once as VANILLA-s reads them (the top k, cut
    /// to their sentences), with `compare_options`, in the same words, so a run of VANILLA-s has
    /// already cached the calls. An answer that no check of `read_first_goes_on_when` finds unsupported
    /// ends the question; otherwise it waits in the memory, and the loop starts as it would have.
    async fn read_first(&self, mut event: PassagesEvent) -> Result<FirstRead, StageError> {
        // The passages are scored once, for the read's view and for the loop's filter alike. The
        // read sees the question's own hits; those of `option_unseen`'s query per option are scored
        // only for the loop, when the read goes on.
        let asked = question_hits(&event);
        let asked_scores = self.passage_scores(&asked.hits).await?;
        let view = self.filter(asked, FilterMode::TOP_K_SENTENCES, Some(asked_scores.clone())).await?;
        let memory = &mut event.memory;
        let docs = documents(view.evidence.iter().map(|e| (e.title.as_str(), e.text.as_str())));
        // A reply still unusable after its re-asks leaves the question to the loop, marked degraded:
        // the first read is a shortcut, not a step the question needs.
        let checks = &self.settings.read_first_goes_on_when;
        let unsure_check = checks.contains(&GoOnWhen::Unsure);
        let how = (self.settings.compare_options, self.settings.read_first_logprobs || unsure_check);
        let (given, answer_logprobs) =
            match read_settled_scored(&self.llm, memory, Self::NAME, "read_first", &docs, how).await {
                Ok(read) => read,
                Err(StageError::Llm(error @ LlmError::BadResponse(_))) => {
                    degrade(memory, Self::NAME, error.error_type(), format!("first read: {error}"));
                    let scores = self.rest_scored(&event, asked_scores).await?;
                    return Ok(FirstRead::GoOn(event, scores));
                }
                Err(error) => return Err(error),
            };
        let passages: Vec<Passage> = view
            .evidence
            .iter()
            .filter_map(|e| event.hits.iter().find(|h| h.passage.id == e.id))
            .map(|h| h.passage.clone())
            .collect();
        let mut went_on = reasons_to_go_on(checks, memory, &given.answer, &passages);
        let mean = answer_logprobs.as_ref().filter(|l| l.tokens > 0).map(|l| l.sum / f64::from(l.tokens));
        if unsure_check && mean.is_some_and(|mean| mean < self.settings.unsure_below) {
            went_on.push(GoOnWhen::Unsure.name().to_string());
        }
        let ids = view.evidence.iter().map(|e| e.id.clone()).collect();
        let (answer, went) = (given.answer.clone(), went_on.clone());
        memory.record(Self::NAME, TraceKind::ReadFirst { passages: ids, answer, went_on: went, answer_logprobs });
        if !went_on.is_empty() {
            let FinalAnswer { answer, confidence, explanation } = given;
            memory.one_shot = Some(OneShot { answer, confidence, explanation, passages, went_on });
            let scores = self.rest_scored(&event, asked_scores).await?;
            return Ok(FirstRead::GoOn(event, scores));
        }
        let mut memory = event.memory;
        // The view was filtered on a copy of the memory: what it showed counts here.
        let (shown, before) = (&view.memory.usage, memory.usage.clone());
        memory.usage.passages_shown += shown.passages_shown.saturating_sub(before.passages_shown);
        memory.usage.evidence_tokens += shown.evidence_tokens.saturating_sub(before.evidence_tokens);
        cite_shown(&mut memory, &view.evidence);
        Ok(FirstRead::Answered(given_answer(memory, Self::NAME, given, Outcome::Answered)))
    }

    /// Every hit's score, given those of the first hits (the question's own): the rest scored now.
    async fn rest_scored(&self, event: &PassagesEvent, mut scores: Vec<f32>) -> Result<Vec<f32>, StageError> {
        if let Some(rest) = event.hits.get(scores.len()..).filter(|rest| !rest.is_empty()) {
            scores.extend(self.passage_scores(rest).await?);
        }
        Ok(scores)
    }

    /// Each hit's passage scored against the query that found it.
    async fn passage_scores(&self, hits: &[RetrievedPassage]) -> Result<Vec<f32>, StageError> {
        let pairs = hits.iter().map(|h| (h.query.clone(), titled(&h.passage.title, &h.passage.text))).collect();
        Ok(self.reranker.score_keeping(pairs, Some(self.settings.rerank_threshold)).await?)
    }

    /// The evidence `mode` keeps of the event's hits; `scores` are the hits' passage scores when
    /// they are known already.
    async fn filter(
        &self,
        event: PassagesEvent,
        mode: FilterMode,
        scores: Option<Vec<f32>>,
    ) -> Result<EvidenceEvent, StageError> {
        let PassagesEvent { mut memory, queries, hits, .. } = event;
        let threshold = self.settings.rerank_threshold;

        let scores = match scores {
            Some(scores) => scores,
            None => self.passage_scores(&hits).await?,
        };
        let mut kept = Vec::new();
        for (hit, &score) in hits.iter().zip(&scores) {
            let keep = score >= threshold || !mode.passage_threshold;
            memory.record(
                Self::NAME,
                TraceKind::PassageScored {
                    query: hit.query.clone(),
                    passage_id: hit.passage.id.clone(),
                    score,
                    kept: keep,
                },
            );
            if keep {
                kept.push((hit, score));
            }
        }
        if mode.passage_threshold {
            // Under the threshold is not irrelevant: MIGRES's reader fallback reads the best five of
            // every query's hits (the baselines' modes show their top k anyway).
            memory.note_scored(hits.iter().map(|h| &h.passage).zip(scores.iter().copied()));
        } else {
            // Without a threshold only the k best can be shown: do not score the sentences of the rest.
            kept.sort_by(|a, b| b.1.total_cmp(&a.1));
            kept.truncate(self.settings.top_k);
        }
        // Score every sentence of every surviving passage in one batch.
        let sentences: Vec<Vec<String>> = kept
            .iter()
            .map(|(hit, _)| match mode.sentences {
                true => sentences_outside_query(&hit.passage.text, &hit.query),
                false => Vec::new(),
            })
            .collect();
        let pairs = kept
            .iter()
            .zip(&sentences)
            .flat_map(|((hit, _), list)| list.iter().map(|s| (hit.query.clone(), titled(&hit.passage.title, s))))
            .collect();
        let mut sentence_scores =
            self.reranker.score_keeping(pairs, Some(self.settings.sentence_threshold)).await?.into_iter();

        let mut snippets: Vec<Snippet> = Vec::new();
        for ((hit, passage_score), list) in kept.iter().zip(sentences) {
            let scores: Vec<f32> = sentence_scores.by_ref().take(list.len()).collect();
            let whole = match scores.iter().copied().reduce(f32::max) {
                _ if !mode.sentences => true,
                // A passage whose every sentence repeats the query has nothing new to say.
                None => continue,
                Some(best) => best < *passage_score,
            };
            let text = if whole {
                hit.passage.text.clone()
            } else {
                let mut chosen: Vec<&str> = Vec::new();
                for (sentence, score) in list.iter().zip(&scores) {
                    if *score >= self.settings.sentence_threshold && !overlaps_kept(sentence, &snippets) {
                        chosen.push(sentence);
                    }
                }
                chosen.join(" ")
            };
            if text.is_empty() {
                continue;
            }
            memory.record(
                Self::NAME,
                TraceKind::SentencesKept {
                    passage_id: hit.passage.id.clone(),
                    sentences: if whole { Vec::new() } else { vec![text.clone()] },
                    whole_passage: whole,
                    score: *passage_score,
                },
            );
            snippets.push(Snippet {
                id: hit.passage.id.clone(),
                title: hit.passage.title.clone(),
                text,
                score: *passage_score,
            });
        }

        let evidence = self.show_top_k(&mut memory, snippets);
        // Not in the first iteration by default: its query is the whole question, so the model's
        // closed-book guess at the answer would come back as a "fact".
        let knowledge = self.settings.knowledge_prompting
            && mode.knowledge_prompting
            && memory.iteration >= self.settings.knowledge_from_iteration;
        if !evidence.is_empty() || !knowledge {
            return Ok(EvidenceEvent { schema_version: SCHEMA_VERSION, memory, queries, evidence });
        }
        let evidence = self.knowledge(&mut memory, &queries).await?.into_iter().collect();
        Ok(EvidenceEvent { schema_version: SCHEMA_VERSION, memory, queries, evidence })
    }

    /// The best k snippets, best first. Showing a passage counts as one use (MIGRES memory rule),
    /// counted before the too-short check as in the MIGRES code.
    fn show_top_k(&self, memory: &mut Memory, mut snippets: Vec<Snippet>) -> Vec<EvidenceItem> {
        snippets.sort_by(|a, b| b.score.total_cmp(&a.score));
        let mut shown = Vec::new();
        for snippet in snippets {
            if shown.len() == self.settings.top_k {
                break;
            }
            if memory.is_used_up(&snippet.id, self.settings.max_passage_uses) {
                continue;
            }
            memory.count_use(&snippet.id);
            let words = snippet.text.split_whitespace().count();
            if words < self.settings.min_snippet_words {
                continue;
            }
            // Some corpora hold whole articles: five of them would overflow a small model's context.
            let text = if words > self.settings.max_snippet_words {
                let kept: Vec<&str> = snippet.text.split_whitespace().take(self.settings.max_snippet_words).collect();
                format!("{} ...", kept.join(" "))
            } else {
                snippet.text
            };
            let snippet = Snippet { text, ..snippet };
            memory.usage.evidence_tokens += self.reranker.count_tokens(&snippet.text) as u64;
            memory.usage.passages_shown += 1;
            shown.push(EvidenceItem {
                id: snippet.id,
                title: snippet.title,
                text: snippet.text,
                score: snippet.score,
                origin: EvidenceOrigin::Passage,
            });
        }
        shown
    }

    /// Knowledge prompting with every query of the iteration in one call; refusals are discarded.
    async fn knowledge(&self, memory: &mut Memory, queries: &[String]) -> Result<Option<EvidenceItem>, StageError> {
        if queries.is_empty() {
            return Ok(None);
        }
        let prompt = prompts::fill(prompts::KNOWLEDGE, &[("query", &queries.join(" "))]);
        let reply = self.llm.text(prompts::SYSTEM, &prompt).await?;
        note_call(memory, Self::NAME, "knowledge", &reply.stats);
        memory.usage.knowledge_tokens += reply.stats.completion_tokens;
        let text = reply.value.trim().to_string();
        memory.record(Self::NAME, TraceKind::KnowledgePrompted { queries: queries.to_vec(), text: text.clone() });
        if is_refusal(&text) {
            return Ok(None);
        }
        Ok(Some(EvidenceItem {
            id: format!("knowledge-{}", memory.iteration),
            title: "Model knowledge".to_string(),
            text,
            score: 0.0,
            origin: EvidenceOrigin::ModelKnowledge,
        }))
    }
}

#[async_trait(?Send)]
impl Stage for SentenceFilter {
    const NAME: &'static str = "sentence_filter";

    /// Knowledge prompting's, when it is on, and the first read's (the reader's, and the comparison's
    /// where `compare_options` is on).
    fn prompts(settings: &Settings) -> Vec<NamedPrompt> {
        let migres = &settings.migres;
        let mut used = Vec::new();
        if migres.knowledge_prompting {
            used.push(("knowledge", prompts::KNOWLEDGE));
        }
        if migres.read_first {
            used.push(("reader", prompts::READER));
            if migres.compare_options {
                used.push(("compare_options", prompts::COMPARE_OPTIONS));
            }
        }
        used
    }

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let mut event: PassagesEvent = decode(record)?;
        let first = event.memory.iteration == 1 && event.memory.one_shot.is_none();
        let mut scores = None;
        if self.settings.read_first && self.mode == FilterMode::MIGRES && first {
            (event, scores) = match self.read_first(event).await? {
                FirstRead::Answered(answer) => return Ok(vec![answer]),
                FirstRead::GoOn(event, known) => (event, Some(known)),
            };
        }
        Ok(vec![self.filter(event, self.mode, scores).await?.to_record()])
    }
}

/// Splits a passage into sentences: a break after `.`, `!` or `?` and white space, where the next
/// piece starts with a capital letter, digit or quote (so "e.g. the" and "St. louis" stay whole).
/// Sentences the query already contains are dropped: they add nothing.
pub fn sentences_outside_query(text: &str, query: &str) -> Vec<String> {
    let query = query.to_lowercase();
    split_sentences(text).into_iter().filter(|s| !query.contains(&s.to_lowercase())).collect()
}

pub fn split_sentences(text: &str) -> Vec<String> {
    let mut sentences: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        current.push(c);
        if matches!(c, '.' | '!' | '?') && chars.peek().is_some_and(|n| n.is_whitespace()) {
            let rest: String = chars.clone().skip_while(|n| n.is_whitespace()).take(1).collect();
            let starts_sentence =
                rest.chars().next().is_some_and(|n| n.is_uppercase() || n.is_ascii_digit() || n == '"');
            if starts_sentence {
                sentences.push(current.trim().to_string());
                current.clear();
            }
        }
    }
    if !current.trim().is_empty() {
        sentences.push(current.trim().to_string());
    }
    sentences.retain(|s| !s.is_empty());
    sentences
}

/// The same sentence found through two passages (or contained in a kept one) is shown once.
fn overlaps_kept(sentence: &str, kept: &[Snippet]) -> bool {
    kept.iter().any(|s| s.text.contains(sentence) || sentence.contains(s.text.as_str()))
}

/// The MIGRES code's refusal markers, plus the "I don't know" our prompt asks for.
fn is_refusal(text: &str) -> bool {
    let lower = text.to_lowercase();
    text.is_empty()
        || ["sorry", "2022", "no publicly available information", "i don't know", "i do not know"]
            .iter()
            .any(|marker| lower.contains(marker))
}
