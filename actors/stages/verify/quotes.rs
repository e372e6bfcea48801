//! The per-leaf entailment judge (`nli.calls = "per_leaf"`): one call judges every fact of a leaf
//! call against the passages the leaf was shown, and quotes the words that state each. The verdict
//! is not taken on trust: a small judge accepted "X, a band that disbanded in <year>" with a year its
//! passage never gives. A fact is entailed only when the judge names a passage the fact may rest
//! on, its quote is in that passage (words compared normalised, as exact match compares answers),
//! and every number of the fact is in that passage too. A small judge often rewrites what it quotes
//! ("died on 29 May 1899" from "( February 26, 1822 – May 29, 1899)", "released in 2007" from "is a
//! 2007 film"): with `nli.quote_match = "names_and_numbers"` such a quote still counts when every
//! name and number in it is a word of the passage, so the names and numbers a fact asserts stay
//! grounded while the wording may differ. A fact its passage holds word for word needs no call.

use std::collections::HashSet;

use schemars::JsonSchema;
use serde::Deserialize;

use crate::actors::clients::{CallStats, LlmClient, LlmError, Schema};
use crate::actors::prompts;
use crate::actors::shared::answer::{contains_words, normalize_answer};
use crate::actors::stages::leaf::render_passages;
use crate::config::QuoteMatch;
use crate::topics::EvidenceItem;

/// A fact to judge, and the evidence items (by position) it may rest on.
pub struct Claim<'a> {
    pub text: &'a str,
    pub allowed: Vec<usize>,
}

/// What the judge and the checks found for one claim.
#[derive(Debug, PartialEq)]
pub struct Finding {
    /// The evidence item the judge named, when it named a valid one.
    pub passage: Option<usize>,
    pub quote: String,
    /// Why the claim is not entailed; None when it is.
    pub refused: Option<&'static str>,
}

#[derive(Deserialize, JsonSchema)]
struct QuotedVerdicts {
    verdicts: Vec<QuotedVerdict>,
}

/// The quote comes before the verdict, so the model copies the words before it decides.
#[derive(Deserialize, JsonSchema)]
struct QuotedVerdict {
    fact: i64,
    passage: i64,
    quote: String,
    supported: bool,
}

fn schema() -> Schema {
    Schema::of::<QuotedVerdicts>("quoted_verdicts")
}

/// The first of `allowed` whose shown text holds `fact` word for word (normalised).
pub fn verbatim(fact: &str, evidence: &[EvidenceItem], allowed: &[usize]) -> Option<usize> {
    allowed.iter().copied().find(|&i| quoted_in(fact, &evidence[i].text))
}

/// The first of `allowed` that holds each name and number of `fact` (`nli.unjudged =
/// "names_and_numbers"`): a fact with none asserts nothing this rule can check, and goes to the judge.
pub fn names_and_numbers_held(fact: &str, evidence: &[EvidenceItem], allowed: &[usize]) -> Option<usize> {
    allowed.iter().copied().find(|&i| names_and_numbers_in(fact, &evidence[i]) && numbers_in(fact, &evidence[i]))
}

/// One call for all `claims`, numbered as `Fact i`, over all of `evidence`, numbered as the leaf saw it.
pub async fn judge(
    llm: &LlmClient,
    evidence: &[EvidenceItem],
    claims: &[Claim<'_>],
    quote_match: QuoteMatch,
) -> Result<(Vec<Finding>, CallStats), LlmError> {
    let facts: Vec<String> = claims.iter().enumerate().map(|(i, claim)| format!("Fact {i}: {}", claim.text)).collect();
    let prompt = prompts::fill(
        prompts::ENTAILMENT_QUOTES,
        &[("passages", &render_passages(evidence)), ("facts", &facts.join("\n"))],
    );
    let reply = llm.structured::<QuotedVerdicts>(prompts::SYSTEM, &prompt, &schema()).await?;
    let findings = claims
        .iter()
        .enumerate()
        .map(|(i, claim)| {
            // The first verdict on a fact counts: a model that repeats itself does not get two tries.
            let verdict = reply.value.verdicts.iter().find(|v| usize::try_from(v.fact) == Ok(i));
            check(claim, verdict, evidence, quote_match)
        })
        .collect();
    Ok((findings, reply.stats))
}

fn check(
    claim: &Claim<'_>,
    verdict: Option<&QuotedVerdict>,
    evidence: &[EvidenceItem],
    quote_match: QuoteMatch,
) -> Finding {
    let Some(verdict) = verdict else {
        return Finding { passage: None, quote: String::new(), refused: Some("no verdict") };
    };
    let passage = usize::try_from(verdict.passage).ok().filter(|&i| i < evidence.len());
    let refused = match passage {
        _ if !verdict.supported => Some("not entailed"),
        Some(p) if !claim.allowed.contains(&p) => Some("the passage named is not one it may rest on"),
        None => Some("no passage named"),
        Some(p) if !quote_holds(&verdict.quote, &evidence[p], quote_match) => Some("the quote is not in the passage"),
        Some(p) if !numbers_in(claim.text, &evidence[p]) => Some("a number of the fact is not in the passage"),
        Some(_) => None,
    };
    Finding { passage, quote: verdict.quote.trim().to_string(), refused }
}

/// `quote`'s words, normalised, are a contiguous run of `text`'s.
pub fn quoted_in(quote: &str, text: &str) -> bool {
    let quote = normalize_answer(quote);
    !quote.is_empty() && contains_words(&normalize_answer(text), &quote)
}

fn quote_holds(quote: &str, item: &EvidenceItem, quote_match: QuoteMatch) -> bool {
    quoted_in(quote, &item.text) || (quote_match == QuoteMatch::NamesAndNumbers && names_and_numbers_in(quote, item))
}

/// The quote as a small judge rewrote it: it has names or numbers (words written with a capital
/// letter or a digit), and each is a word of the item (title or text), compared normalised.
fn names_and_numbers_in(quote: &str, item: &EvidenceItem) -> bool {
    let held: HashSet<String> =
        normalize_answer(&format!("{} {}", item.title, item.text)).split_whitespace().map(String::from).collect();
    let is_key = |word: &&str| word.starts_with(char::is_uppercase) || word.contains(|c: char| c.is_ascii_digit());
    // An article written with a capital ("The") normalises to nothing and asserts nothing.
    let keys: Vec<String> = quote
        .split_whitespace()
        .filter(is_key)
        .flat_map(|w| normalize_answer(w).split_whitespace().map(String::from).collect::<Vec<_>>())
        .collect();
    !keys.is_empty() && keys.iter().all(|key| held.contains(key))
}

/// Every number written in digits in `fact` is one of the item's (title or text).
fn numbers_in(fact: &str, item: &EvidenceItem) -> bool {
    let held: HashSet<&str> = numbers(&item.title).chain(numbers(&item.text)).collect();
    numbers(fact).all(|n| held.contains(n))
}

fn numbers(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !c.is_ascii_digit()).filter(|run| !run.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topics::EvidenceOrigin;

    fn item(title: &str, text: &str) -> EvidenceItem {
        EvidenceItem {
            id: title.into(),
            title: title.into(),
            text: text.into(),
            score: 1.0,
            origin: EvidenceOrigin::Passage,
        }
    }

    fn verdict(fact: i64, passage: i64, quote: &str, supported: bool) -> QuotedVerdict {
        QuotedVerdict { fact, passage, quote: quote.into(), supported }
    }

    const ORLEN: &str = "The Orlen Brothers were a Welsh folk band formed in Cardiff. They released four albums.";

    #[test]
    fn a_fact_in_the_questions_shape_with_a_year_the_passage_lacks_is_refused() {
        // The judge quotes real words and says "supported"; the year is the fact's own invention.
        let evidence = [item("The Orlen Brothers", ORLEN)];
        let claim =
            Claim { text: "The Orlen Brothers were a Welsh folk band that disbanded in 1998.", allowed: vec![0] };
        let finding = check(
            &claim,
            Some(&verdict(0, 0, "a Welsh folk band formed in Cardiff", true)),
            &evidence,
            QuoteMatch::Words,
        );
        assert_eq!(finding.refused, Some("a number of the fact is not in the passage"));
    }

    #[test]
    fn a_quote_the_passage_does_not_hold_is_refused() {
        let evidence = [item("The Orlen Brothers", ORLEN)];
        let claim = Claim { text: "The Orlen Brothers disbanded after their fourth album.", allowed: vec![0] };
        let finding = check(
            &claim,
            Some(&verdict(0, 0, "the band split after the fourth album", true)),
            &evidence,
            QuoteMatch::Words,
        );
        assert_eq!(finding.refused, Some("the quote is not in the passage"));
    }

    #[test]
    fn a_rewritten_quote_counts_when_the_passage_holds_its_names_and_numbers() {
        let evidence = [item("Mira Colvane", "Mira Colvane( March 3, 1871 – June 12, 1930) was a Scottish painter.")];
        let claim = Claim { text: "Mira Colvane died on 12 June 1930.", allowed: vec![0] };
        let check_quote =
            |quote: &str, quote_match| check(&claim, Some(&verdict(0, 0, quote, true)), &evidence, quote_match);
        // The date as the judge writes it, not as the passage does: only names_and_numbers takes it.
        assert_eq!(check_quote("died on 12 June 1930", QuoteMatch::NamesAndNumbers).refused, None);
        assert_eq!(
            check_quote("died on 12 June 1930", QuoteMatch::Words).refused,
            Some("the quote is not in the passage")
        );
        // A name the passage lacks, or a number it does not give, is still not in it; nor is a quote
        // with neither.
        for quote in ["died in Glasgow on 12 June 1930", "died on 12 June 1931", "was a painter who died"] {
            let finding = check_quote(quote, QuoteMatch::NamesAndNumbers);
            assert_eq!(finding.refused, Some("the quote is not in the passage"), "{quote}");
        }
    }

    #[test]
    fn a_quote_found_in_a_passage_the_fact_may_rest_on_entails_it() {
        let evidence = [item("Other", "Nothing here."), item("The Orlen Brothers", ORLEN)];
        let claim = Claim { text: "The Orlen Brothers were formed in Cardiff.", allowed: vec![1] };
        // Case, punctuation and articles are not the judge's to get right.
        let finding = check(
            &claim,
            Some(&verdict(0, 1, "Welsh folk band, formed in cardiff", true)),
            &evidence,
            QuoteMatch::Words,
        );
        assert_eq!(
            finding,
            Finding { passage: Some(1), quote: "Welsh folk band, formed in cardiff".into(), refused: None }
        );
        let elsewhere = check(&claim, Some(&verdict(0, 0, "Nothing here", true)), &evidence, QuoteMatch::Words);
        assert_eq!(elsewhere.refused, Some("the passage named is not one it may rest on"));
        assert_eq!(check(&claim, None, &evidence, QuoteMatch::Words).refused, Some("no verdict"));
        assert_eq!(
            check(&claim, Some(&verdict(0, 1, "formed in Cardiff", false)), &evidence, QuoteMatch::Words).refused,
            Some("not entailed")
        );
    }

    #[test]
    fn numbers_are_compared_whole_and_may_come_from_the_title() {
        let evidence = item("Stille Wasser (2007 film)", "Stille Wasser is a German film released in 19 cinemas.");
        assert!(numbers_in("Stille Wasser (2007 film) was released in 19 cinemas.", &evidence));
        assert!(!numbers_in("Stille Wasser was released in 1907.", &evidence), "19 is not 1907");
    }

    #[test]
    fn names_and_numbers_keep_a_fact_only_when_a_passage_it_may_rest_on_holds_each() {
        let colvane = "Mira Colvane( March 3, 1871 – June 12, 1930) was a Scottish painter.";
        let evidence = [item("Other", "Nothing here."), item("Mira Colvane", colvane)];
        let held = |fact: &str, allowed: &[usize]| names_and_numbers_held(fact, &evidence, allowed);
        assert_eq!(held("Mira Colvane died on 12 June 1930.", &[0, 1]), Some(1));
        // A year the passage never gives, a name it lacks, or the right passage not among those the
        // fact may rest on: the judge is asked.
        assert_eq!(held("Mira Colvane died on 12 June 1931.", &[0, 1]), None);
        assert_eq!(held("Mira Colvane was a painter from Glasgow.", &[0, 1]), None);
        assert_eq!(held("Mira Colvane died on 12 June 1930.", &[0]), None);
        // The question's shape with a year filled in, as the held-out trace showed, is not kept.
        let orlen = [item("The Orlen Brothers", ORLEN)];
        let shaped = "The Orlen Brothers were a Welsh folk band that disbanded in 1998.";
        assert_eq!(names_and_numbers_held(shaped, &orlen, &[0]), None);
        // Nothing to check is not a pass.
        assert_eq!(names_and_numbers_held("she was a painter.", &evidence, &[1]), None);
    }

    #[test]
    fn a_fact_its_passage_holds_word_for_word_needs_no_judge() {
        let evidence = [item("A", "Something else."), item("The Orlen Brothers", ORLEN)];
        assert_eq!(
            verbatim("The Orlen Brothers were a Welsh folk band formed in Cardiff.", &evidence, &[0, 1]),
            Some(1)
        );
        assert_eq!(verbatim("The Orlen Brothers were a band.", &evidence, &[0, 1]), None);
        assert_eq!(verbatim("They released four albums.", &evidence, &[0]), None, "only the passages it may rest on");
    }
}
