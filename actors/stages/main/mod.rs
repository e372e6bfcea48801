//! main_module: the MIGRES main module (stage `main`). Given the verified facts (and, with
//! `migres.main_sees_passages`, the passages they cite) it answers, with confidence and explanation,
//! or says "unanswerable" and names the missing information, which sends the question round the loop
//! again. An answer ends the loop only when `migres.acceptance` and the grounding gate let it: a small
//! model often answers a two-hop question from belief after the first hop. At the iteration limit
//! it answers with what is known, and guesses rather than answer "None"; when even the guess is
//! "None", it reads the best passages it found, as VANILLA would.
//!
//! - `decision`: the decision call's three replies, their schemas, and the vote over samples.

mod decision;

use async_trait::async_trait;

use std::collections::{BTreeSet, HashSet};

use crate::actors::clients::{CallStats, LlmClient, LlmError};
use crate::actors::prompts::{self, NamedPrompt};
use crate::actors::runner::{Stage, StageError, decode};
use crate::actors::shared::accounting::{degrade, note_call};
use crate::actors::shared::answer::{FinalAnswer, answer_record, final_schema, given_answer, normalize_answer};
use crate::actors::shared::evidence::{documents, read, read_settled};
use crate::actors::shared::{one_shot, span, two_options};
use crate::config::{Acceptance, MigresSettings, Settings};
use crate::metrics::METRICS;
use crate::topics::{Event, Memory, MissingEvent, Outcome, Passage, Record, SCHEMA_VERSION, TraceKind, VerifiedEvent};
use decision::{Decision, Reply, decide_once, is_non_answer, says_answerable, vote};

pub struct Main {
    llm: LlmClient,
    settings: MigresSettings,
}

impl Main {
    pub fn new(llm: LlmClient, settings: MigresSettings) -> Self {
        Main { llm, settings }
    }

    async fn decide(&self, mut memory: Memory) -> Result<Record, StageError> {
        if memory.exhausted {
            return self.answer_at_limit(memory).await;
        }
        // With `stop_when_not_learning`, an iteration that verified nothing new ends the loop: with
        // a small model the next ones seldom find what this one could not, and each costs 3-4 calls.
        if self.settings.stop_when_not_learning && memory.iteration > 1 && memory.new_verified_facts() == 0 {
            memory.record(Self::NAME, TraceKind::StoppedLearning { new_facts: memory.new_facts() as u32 });
            return self.answer_at_limit(memory).await;
        }
        // An iteration that found no new fact cannot change the verdict: reuse the last missing
        // information instead of asking again (as the MIGRES code does).
        if memory.iteration > 1 && memory.new_facts() == 0 && !memory.last_missing.is_empty() {
            if memory.iteration >= self.settings.max_iterations {
                return self.answer_at_limit(memory).await;
            }
            let missing_information = memory.last_missing.clone();
            return Ok(MissingEvent { schema_version: SCHEMA_VERSION, memory, missing_information }.to_record());
        }

        let information = self.information(&memory, false);
        let template = self.reply().prompt().1;
        let previous_queries = memory.queries.join(" ");
        let prompt = prompts::fill(
            template,
            &[
                ("facts", &information),
                ("question", &memory.question_to_answer()),
                ("previous_queries", &previous_queries),
            ],
        );
        let (mut d, calls) = self.decision(&prompt).await?;
        for stats in &calls {
            note_call(&mut memory, Self::NAME, "main", stats);
        }
        let answer = d.answer.trim().to_string();
        let rejected = self.rejection(&memory, &d, &answer);
        // An answer the model gave that the rule or the gate held back (not a model's "unanswerable").
        let held_back = rejected.filter(|r| *r != "unanswerable");
        if let Some(reason) = held_back {
            METRICS.answers_rejected.with_label_values(&[reason]).inc();
            tracing::debug!(question_id = %memory.question_id, %answer, reason, "answer not accepted");
        }
        memory.record(
            Self::NAME,
            TraceKind::Decision {
                answerable: rejected.is_none(),
                answer: answer.clone(),
                confidence: d.confidence,
                missing_information: d.missing_information.clone(),
                forced: false,
                held_back: held_back.map(str::to_string),
            },
        );
        if rejected.is_none() {
            let given = FinalAnswer { answer, confidence: d.confidence, explanation: d.explanation };
            let given = self.settled(&mut memory, given).await?;
            let given = self.or_first_read(&mut memory, given).await?;
            return Ok(answer_record(memory, given.answer, given.confidence, given.explanation, Outcome::Answered));
        }
        if memory.iteration >= self.settings.max_iterations {
            // An answer held back only for want of confidence or evidence is still the best guess
            // there is: no need to ask for another.
            if held_back.is_some() {
                let given = FinalAnswer { answer, confidence: d.confidence, explanation: d.explanation };
                let given = self.settled(&mut memory, given).await?;
                let given = self.or_first_read(&mut memory, given).await?;
                return Ok(given_answer(memory, Self::NAME, given, Outcome::AnsweredAtLimit));
            }
            return self.answer_at_limit(memory).await;
        }
        // A too-short summary says nothing; the explanation names what is missing instead.
        let missing_information =
            if is_trivial(&d.missing_information) { d.explanation } else { d.missing_information };
        memory.last_missing = missing_information.clone();
        memory.proposed_queries = std::mem::take(&mut d.queries);
        Ok(MissingEvent { schema_version: SCHEMA_VERSION, memory, missing_information }.to_record())
    }

    fn reply(&self) -> Reply {
        Reply::of(&self.settings)
    }

    /// The decision: one call, or with `decision_samples` > 1 the vote of that many samples, each
    /// with its own seed.
    async fn decision(&self, prompt: &str) -> Result<(Decision, Vec<CallStats>), StageError> {
        let (samples, kind) = (self.settings.decision_samples.max(1), self.reply());
        if samples == 1 {
            let reply = decide_once(&self.llm, kind, prompt).await?;
            return Ok((reply.value, vec![reply.stats]));
        }
        let calls = (1..=samples).map(|seed| {
            let llm = self.llm.sampling(self.settings.sample_temperature, u64::from(seed));
            async move { decide_once(&llm, kind, prompt).await }
        });
        let replies = futures::future::try_join_all(calls).await?;
        let stats = replies.iter().map(|r| r.stats.clone()).collect();
        Ok((vote(replies.into_iter().map(|r| r.value).collect()), stats))
    }

    /// Why the decision does not end the loop: "unanswerable" (the model says so; the MIGRES code's
    /// test is the word, the flag alone is not trusted), "not_confident" (`acceptance = "official"`
    /// or `"confident"`) or "ungrounded" (the grounding gate). None when it does.
    fn rejection(&self, memory: &Memory, d: &Decision, answer: &str) -> Option<&'static str> {
        if !says_answerable(d) {
            return Some("unanswerable");
        }
        let confident = match self.settings.acceptance {
            Acceptance::Flag => true,
            Acceptance::Official => d.confidence >= 4.0 && is_trivial(&d.missing_information),
            Acceptance::Confident => d.confidence >= 4.0,
        };
        if !confident {
            return Some("not_confident");
        }
        if self.settings.grounding_gate && !grounded(memory, answer, self.settings.min_answer_passages) {
            return Some("ungrounded");
        }
        None
    }

    /// What the answering prompts show as "Information": the known facts (the verified ones alone
    /// with `verified_only`, when there are any), then, with `main_sees_passages`, the passages the
    /// verified facts cite (their shown text), so the model can check a fact's wording against its
    /// source.
    fn information(&self, memory: &Memory, verified_only: bool) -> String {
        let facts = if verified_only { memory.verified_facts_text() } else { memory.facts_text() };
        if !self.settings.main_sees_passages || memory.cited_passages.is_empty() {
            return facts;
        }
        let passages: Vec<String> =
            memory.cited_passages.values().map(|p| format!("(Title: {}) {}", p.title, p.text)).collect();
        format!("{facts}\nPassages behind these facts:\n{}", passages.join("\n"))
    }

    /// T iterations passed or no new query can be written: answer from the known facts, and from
    /// the model's own knowledge where they fall short. With `best_guess`, a non-answer such as
    /// "None" is asked for once more as a guess: a guess can be right, "None" never is. With
    /// `reader_fallback`, a non-answer that stays one is read from the best passages found.
    async fn answer_at_limit(&self, mut memory: Memory) -> Result<Record, StageError> {
        let information = self.information(&memory, self.settings.limit_reads_verified);
        let question = memory.question_to_answer();
        let prompt = prompts::fill(prompts::FINAL_ANSWER, &[("facts", &information), ("question", &question)]);
        let reply = self.llm.structured::<FinalAnswer>(prompts::SYSTEM, &prompt, &final_schema()).await?;
        note_call(&mut memory, Self::NAME, "final_answer", &reply.stats);
        let mut given = reply.value;
        if self.settings.best_guess && is_non_answer(&given.answer) {
            let insisting = format!(
                "{question} (The Information may not settle it: give your best guess anyway, a name, date, number or yes/no. Never answer \"None\" or \"unknown\".)"
            );
            let prompt = prompts::fill(prompts::FINAL_ANSWER, &[("facts", &information), ("question", &insisting)]);
            let guess = self.llm.structured::<FinalAnswer>(prompts::SYSTEM, &prompt, &final_schema()).await?;
            note_call(&mut memory, Self::NAME, "best_guess", &guess.stats);
            if !is_non_answer(&guess.value.answer) {
                given = guess.value;
            }
        }
        if self.settings.reader_fallback && is_non_answer(&given.answer) && !memory.best_passages.is_empty() {
            return self.read_best_passages(memory, given).await;
        }
        self.give_at_limit(memory, given).await
    }

    async fn give_at_limit(&self, mut memory: Memory, given: FinalAnswer) -> Result<Record, StageError> {
        let given = self.settled(&mut memory, given).await?;
        let given = self.or_first_read(&mut memory, given).await?;
        Ok(given_answer(memory, Self::NAME, given, Outcome::AnsweredAtLimit))
    }

    /// The reader fallback: the facts settle nothing, so answer as VANILLA does, from the passages
    /// the re-ranker scored best for any query, whole: facts are distilled from the few passages over
    /// the threshold, and can miss what a passage says plainly. The passages read become the
    /// answer's citations; a non-answer from them too leaves the facts' answer standing, and so
    /// does a reply still unusable after its re-asks (marked degraded): a last try must not turn
    /// an answer in hand into an error record.
    async fn read_best_passages(&self, mut memory: Memory, given: FinalAnswer) -> Result<Record, StageError> {
        let passages: Vec<Passage> = memory.best_passages.iter().map(|p| p.passage.clone()).collect();
        let docs = documents(passages.iter().map(|p| (p.title.as_str(), p.text.as_str())));
        let reading = match read(&self.llm, &mut memory, Self::NAME, "reader_fallback", &docs).await {
            Ok(reading) if !is_non_answer(&reading.answer) => reading,
            Ok(_) => return self.give_at_limit(memory, given).await,
            Err(StageError::Llm(error @ LlmError::BadResponse(_))) => {
                degrade(&mut memory, Self::NAME, error.error_type(), format!("reader fallback: {error}"));
                return self.give_at_limit(memory, given).await;
            }
            Err(error) => return Err(error),
        };
        let (answer, explanation) = if self.settings.compare_options {
            two_options::settle(&self.llm, &mut memory, Self::NAME, &docs, reading.answer, reading.explanation).await?
        } else {
            (reading.answer, reading.explanation)
        };
        for passage in passages {
            memory.cited_passages.insert(passage.id.clone(), passage);
        }
        let read = self.as_written(&memory, FinalAnswer { answer, confidence: reading.confidence, explanation });
        let read = self.or_first_read(&mut memory, read).await?;
        Ok(given_answer(memory, Self::NAME, read, Outcome::AnsweredAtLimit))
    }

    /// With `compare_options`, a two-option question's answer as the options' copied dates or
    /// numbers decide it, compared in code (`two_options`); any other answer as given.
    async fn settled(&self, memory: &mut Memory, given: FinalAnswer) -> Result<FinalAnswer, StageError> {
        if !self.settings.compare_options {
            return Ok(self.as_written(memory, given));
        }
        let mut information = self.information(memory, true);
        if self.settings.compare_reads_found {
            information.push_str(&scored_uncited(memory));
        }
        let (answer, explanation) =
            two_options::settle(&self.llm, memory, Self::NAME, &information, given.answer, given.explanation).await?;
        Ok(self.as_written(memory, FinalAnswer { answer, confidence: given.confidence, explanation }))
    }

    /// With `migres.read_first`, when the loop ran: its answer, or the first read's where the loop's
    /// evidence does not write its own and the first read's passages do not fall short
    /// (`one_shot::choose`). With `ends_with_an_option`, a two-option question neither answer
    /// settles is compared once more over both reads' evidence first.
    async fn or_first_read(&self, memory: &mut Memory, given: FinalAnswer) -> Result<FinalAnswer, StageError> {
        if self.settings.final_read
            && let Some(read) = self.read_over_both(memory, &given).await?
        {
            return Ok(read);
        }
        let Some(first_read) = &memory.one_shot else { return Ok(given) };
        let asked = memory.question_to_answer();
        let settles = |answer: &str| one_shot::names_exactly_one_option(&asked, answer) != Some(false);
        let given = if self.settings.ends_with_an_option && !settles(&first_read.answer) && !settles(&given.answer) {
            self.compared_over_both_reads(memory, given).await?
        } else {
            given
        };
        let evidence = memory.verified_facts().map(|f| f.text.clone());
        let texts: Vec<String> = evidence.chain(one_shot::texts_of(memory.cited_passages.values())).collect();
        let choice = one_shot::Choice {
            checks: &self.settings.read_first_goes_on_when,
            ends_with_an_option: self.settings.ends_with_an_option,
        };
        Ok(one_shot::choose(memory, Self::NAME, given, &texts, choice))
    }

    /// `migres.final_read`: the reader, as the first read was made, over the first read's passages
    /// and then the loop's kept sentences (the text its verified facts cite) of passages the first
    /// read did not show, as many as fit [`FINAL_READ_TOKENS`]. A 1.5B model rewrites and loses
    /// what it answers from facts alone; here it sees raw text again, and what the loop found.
    /// Its answer is the question's, its passages the answer's citations; None where it reads a
    /// non-answer, or a reply still unusable after its re-asks (marked degraded), which leaves the
    /// choice between the two reads.
    async fn read_over_both(
        &self,
        memory: &mut Memory,
        given: &FinalAnswer,
    ) -> Result<Option<FinalAnswer>, StageError> {
        let Some(first_read) = &memory.one_shot else { return Ok(None) };
        let shown: HashSet<&str> = first_read.passages.iter().map(|p| p.id.as_str()).collect();
        let found = memory.cited_passages.values().filter(|p| !shown.contains(p.id.as_str()));
        let union: Vec<Passage> = first_read.passages.iter().chain(found).cloned().collect();
        let room = FINAL_READ_TOKENS
            .saturating_sub(approx_tokens(prompts::READER) + approx_tokens(&memory.question_to_answer()));
        let read: Vec<Passage> = within(union, room);
        let docs = documents(read.iter().map(|p| (p.title.as_str(), p.text.as_str())));
        let how = self.settings.compare_options;
        let reading = match read_settled(&self.llm, memory, Self::NAME, "final_read", &docs, how).await {
            Ok(reading) if !is_non_answer(&reading.answer) => reading,
            Ok(_) => return Ok(None),
            Err(StageError::Llm(error @ LlmError::BadResponse(_))) => {
                degrade(memory, Self::NAME, error.error_type(), format!("final read: {error}"));
                return Ok(None);
            }
            Err(error) => return Err(error),
        };
        let one_shot = memory.one_shot.take().map(|o| o.answer).unwrap_or_default();
        let (loop_answer, chosen) = (given.answer.clone(), reading.answer.clone());
        memory.record(Self::NAME, TraceKind::OneShotOrLoop { one_shot, loop_answer, chosen });
        for passage in read {
            memory.cited_passages.insert(passage.id.clone(), passage);
        }
        let explanation = format!("{} (Read again over both reads' passages.)", reading.explanation);
        Ok(Some(FinalAnswer { explanation, ..reading }))
    }

    /// `compare_options` over the loop's evidence and the first read's passages: the loop's own
    /// comparison lacked a value, and the first read's passages may write it.
    async fn compared_over_both_reads(
        &self,
        memory: &mut Memory,
        given: FinalAnswer,
    ) -> Result<FinalAnswer, StageError> {
        let mut information = self.information(memory, true);
        if let Some(first_read) = &memory.one_shot {
            let unseen: Vec<String> = first_read
                .passages
                .iter()
                .filter(|p| !memory.cited_passages.contains_key(&p.id))
                .map(|p| format!("(Title: {}) {}", p.title, p.text))
                .collect();
            if !unseen.is_empty() {
                information.push_str(&format!("\nPassages read first:\n{}", unseen.join("\n")));
            }
        }
        let (answer, explanation) =
            two_options::settle(&self.llm, memory, Self::NAME, &information, given.answer, given.explanation).await?;
        Ok(FinalAnswer { answer, explanation, ..given })
    }

    /// With `answer_span`, the answer as the cited passages and verified facts write the name that
    /// holds it (`span::evidence_span`); the explanation says so, for the audit.
    fn as_written(&self, memory: &Memory, given: FinalAnswer) -> FinalAnswer {
        if !self.settings.answer_span || memory.yes_no {
            return given;
        }
        let texts: Vec<&str> = memory
            .verified_facts()
            .map(|f| f.text.as_str())
            .chain(memory.cited_passages.values().map(|p| p.text.as_str()))
            .collect();
        match span::evidence_span(&given.answer, &texts) {
            Some(written) => {
                let explanation = format!("{} Written as the evidence writes it: {written}.", given.explanation);
                FinalAnswer { answer: written, explanation, ..given }
            }
            None => given,
        }
    }
}

/// The most prompt tokens `migres.final_read` fills (issue 76): the reader's prompt, the question
/// and the passages together.
const FINAL_READ_TOKENS: usize = 3000;

/// Tokens of English text, roughly: four characters each.
fn approx_tokens(text: &str) -> usize {
    text.chars().count().div_ceil(4)
}

/// The passages, in order, while they fit `room` tokens (as the reader's documents list them).
fn within(passages: Vec<Passage>, room: usize) -> Vec<Passage> {
    let mut left = room;
    passages
        .into_iter()
        .take_while(|p| {
            let cost = approx_tokens(&p.title) + approx_tokens(&p.text) + 2;
            let fits = cost <= left;
            left = left.saturating_sub(cost);
            fits
        })
        .collect()
}

/// The best-scored passages that no kept fact cites, as a paragraph of the Information: a date the
/// leaf did not turn into a fact can still be copied from them.
fn scored_uncited(memory: &Memory) -> String {
    let uncited: Vec<String> = memory
        .best_passages
        .iter()
        .map(|p| &p.passage)
        .filter(|p| !memory.cited_passages.contains_key(&p.id))
        .map(|p| format!("(Title: {}) {}", p.title, p.text))
        .collect();
    if uncited.is_empty() { String::new() } else { format!("\nOther passages found:\n{}", uncited.join("\n")) }
}

/// A missing-information summary that names nothing ("", "None", "N/A").
fn is_trivial(missing: &str) -> bool {
    let normalized = normalize_answer(missing);
    missing.trim().chars().count() < 10 || matches!(normalized.as_str(), "none" | "nothing" | "na" | "not applicable")
}

/// The grounding gate: the verified facts cite at least `min_passages` passages, and every word of
/// the normalised answer is among the words of those facts or the passages they cite (a yes/no
/// answer needs only the passages). Facts from model knowledge are not evidence.
fn grounded(memory: &Memory, answer: &str, min_passages: usize) -> bool {
    let verified: Vec<_> = memory.verified_facts().collect();
    let cited: BTreeSet<&String> = verified.iter().flat_map(|f| &f.citations).collect();
    if verified.is_empty() || cited.len() < min_passages {
        return false;
    }
    let answer = normalize_answer(answer);
    if answer.is_empty() {
        return false;
    }
    if matches!(answer.as_str(), "yes" | "no") {
        return true;
    }
    let evidence: String = verified
        .iter()
        .map(|f| f.text.as_str())
        .chain(cited.iter().filter_map(|id| memory.cited_passages.get(*id)).map(|p| p.text.as_str()))
        .collect::<Vec<_>>()
        .join(" ");
    let words: HashSet<String> = normalize_answer(&evidence).split(' ').map(str::to_string).collect();
    answer.split(' ').all(|word| words.contains(word))
}

#[async_trait(?Send)]
impl Stage for Main {
    const NAME: &'static str = "main";

    /// The decision prompt the settings choose, the final answer's, and the comparison and reader
    /// prompts where their levers are on.
    fn prompts(settings: &Settings) -> Vec<NamedPrompt> {
        let migres = &settings.migres;
        let mut used = vec![Reply::of(migres).prompt(), ("final_answer", prompts::FINAL_ANSWER)];
        if migres.compare_options {
            used.push(("compare_options", prompts::COMPARE_OPTIONS));
        }
        if migres.reader_fallback || (migres.read_first && migres.final_read) {
            used.push(("reader", prompts::READER));
        }
        used
    }

    async fn process(&self, record: &Record) -> Result<Vec<Record>, StageError> {
        let event: VerifiedEvent = decode(record)?;
        Ok(vec![self.decide(event.memory).await?])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::topics::{FactSource, KnownFact, Passage};

    fn memory_with(facts: &[(&str, &[&str], FactSource)]) -> Memory {
        let mut memory = Memory::new("q", "Where was the goalkeeper of Harwick Rovers born?");
        for (text, citations, source) in facts {
            for id in *citations {
                memory.cited_passages.insert(
                    id.to_string(),
                    Passage { id: id.to_string(), title: id.to_string(), text: format!("passage {id}") },
                );
            }
            memory.facts.push(KnownFact {
                text: text.to_string(),
                citations: citations.iter().map(|c| c.to_string()).collect(),
                source: *source,
                iteration: 1,
            });
        }
        memory
    }

    #[test]
    fn an_answer_from_belief_after_the_first_hop_is_not_grounded() {
        // The first hop is known; the answer names a place no fact or cited passage mentions.
        let memory = memory_with(&[("Tom Quill is the goalkeeper of Harwick Rovers.", &["p1"], FactSource::Verified)]);
        assert!(!grounded(&memory, "Lindon", 1));
        let memory = memory_with(&[
            ("Tom Quill is the goalkeeper of Harwick Rovers.", &["p1"], FactSource::Verified),
            ("Tom Quill was born in Lindon, Vessary.", &["p2"], FactSource::Verified),
        ]);
        assert!(grounded(&memory, "Lindon, Vessary", 2));
        assert!(grounded(&memory, "the Lindon", 2), "normalised as scoring does");
        assert!(!grounded(&memory, "Lindon", 3), "too few cited passages");
    }

    #[test]
    fn model_knowledge_is_not_evidence() {
        let memory = memory_with(&[("Tom Quill was born in Lindon.", &[], FactSource::ModelKnowledge)]);
        assert!(!grounded(&memory, "Lindon", 0));
        assert!(!grounded(&memory, "yes", 0));
    }

    #[test]
    fn the_answer_at_the_limit_reads_verified_facts_over_closed_book_guesses() {
        let memory = memory_with(&[
            ("Tom Quill plays for Harwick Rovers.", &["p1"], FactSource::Verified),
            ("Harwick Rovers are based in Lindon.", &["p2"], FactSource::Verified),
            ("Harwick Rovers are based in Vessary.", &[], FactSource::ModelKnowledge),
        ]);
        let text = memory.verified_facts_text();
        assert!(text.contains("Lindon") && text.contains("Tom Quill"), "{text}");
        assert!(!text.contains("Vessary"), "a closed-book guess beside verified facts: {text}");
        assert!(memory.facts_text().contains("Vessary"), "the loop's decisions still read every fact");
        let guesses_only = memory_with(&[("Harwick Rovers are based in Vessary.", &[], FactSource::ModelKnowledge)]);
        assert!(guesses_only.verified_facts_text().contains("Vessary"), "guesses count when nothing is verified");
    }
}
