//! Answer scoring as the papers report it. Every metric takes the prediction and all gold labels
//! (answer plus aliases) and keeps the best label.
//!
//! - `em`, `f1`: SQuAD's, after SQuAD's normalisation exactly (lower case, ASCII punctuation removed,
//!   no articles a/an/the, single spaces). F1 has HotpotQA's rule: a prediction or label that is
//!   "yes", "no" or "noanswer" scores 0 unless both are the same.
//! - `lenient_em`: the MIGRES evaluation's EM. A label matches when the strings are equal, equal
//!   without spaces, a true/false label meets a yes/no prediction, or both have the same number of
//!   words and every label word is among the prediction's (any order).
//! - `cover_em`: the normalised label's words appear, in order and side by side, among the normalised
//!   prediction's (any lenient hit counts). Whole words only: gold "no" is not covered by "unknown",
//!   nor "1" by "1990".
//! - Questions whose gold answer is yes or no (StrategyQA, and HotpotQA's or 2Wiki's comparison
//!   questions with a yes/no gold) are scored on the prediction's polarity: the first "yes"/"no" (or
//!   "true"/"false") word of the answer against the gold answer. All four metrics are that match, as in
//!   the paper, where EM and Acc† are equal for StrategyQA.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::actors::shared::answer::contains_words;
pub use crate::actors::shared::answer::normalize_answer as normalize;

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Scores {
    pub em: f64,
    pub f1: f64,
    pub lenient_em: f64,
    pub cover_em: f64,
}

/// Scores a free-form answer against its labels.
pub fn score(prediction: &str, labels: &[String]) -> Scores {
    let prediction_norm = normalize(prediction);
    let mut best = Scores::default();
    for label in labels {
        let label_norm = normalize(label);
        if label_norm.is_empty() {
            continue;
        }
        let em = f64::from(u8::from(prediction_norm == label_norm));
        let lenient = f64::from(u8::from(lenient_match(&prediction_norm, &label_norm)));
        let cover = f64::from(u8::from(lenient > 0.0 || contains_words(&prediction_norm, &label_norm)));
        let f1 = token_f1(&prediction_norm, &label_norm);
        best.em = best.em.max(em);
        best.f1 = best.f1.max(f1);
        best.lenient_em = best.lenient_em.max(lenient);
        best.cover_em = best.cover_em.max(cover);
    }
    best
}

/// Scores a yes/no answer: right when its polarity is the gold one.
pub fn score_yes_no(prediction: &str, gold: bool) -> Scores {
    let right = f64::from(u8::from(polarity(prediction) == Some(gold)));
    Scores { em: right, f1: right, lenient_em: right, cover_em: right }
}

/// The first yes/no word of an answer ("Yes, because..." is yes); None when it has neither.
pub fn polarity(prediction: &str) -> Option<bool> {
    normalize(prediction).split_whitespace().find_map(|word| match word {
        "yes" | "true" => Some(true),
        "no" | "false" => Some(false),
        _ => None,
    })
}

fn lenient_match(prediction: &str, label: &str) -> bool {
    if prediction == label || prediction.replace(' ', "") == label.replace(' ', "") {
        return true;
    }
    match label {
        "true" => return prediction == "yes",
        "false" => return prediction == "no",
        _ => {}
    }
    let (p, l): (Vec<&str>, Vec<&str>) = (prediction.split(' ').collect(), label.split(' ').collect());
    p.len() == l.len() && l.iter().all(|w| p.contains(w))
}

/// HotpotQA's answer F1: SQuAD's token F1, except that a yes/no/noanswer on either side scores only
/// when both sides are the same.
fn token_f1(prediction: &str, label: &str) -> f64 {
    let special = |s: &str| matches!(s, "yes" | "no" | "noanswer");
    if (special(prediction) || special(label)) && prediction != label {
        return 0.0;
    }
    let p: Vec<&str> = prediction.split_whitespace().collect();
    let l: Vec<&str> = label.split_whitespace().collect();
    if p.is_empty() || l.is_empty() {
        return f64::from(u8::from(p == l));
    }
    // Multiset overlap: each label word can be matched once.
    let mut remaining = l.clone();
    let mut common = 0usize;
    for word in &p {
        if let Some(i) = remaining.iter().position(|w| w == word) {
            remaining.swap_remove(i);
            common += 1;
        }
    }
    if common == 0 {
        return 0.0;
    }
    let precision = common as f64 / p.len() as f64;
    let recall = common as f64 / l.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

/// Distinct passages in `found` that are gold, over the gold count (recall of gold passages).
pub fn passage_recall(found: &[String], gold: &[String]) -> Option<f64> {
    if gold.is_empty() {
        return None;
    }
    let found: HashSet<&String> = found.iter().collect();
    Some(gold.iter().filter(|g| found.contains(g)).count() as f64 / gold.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(l: &[&str]) -> Vec<String> {
        l.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn normalisation_is_squads() {
        // SQuAD removes punctuation rather than splitting at it (MuSiQue gold "A.P.J. Abdul Kalam").
        assert_eq!(normalize("The  Eiffel-Tower!"), "eiffeltower");
        assert_eq!(normalize("A.P.J. Abdul Kalam"), "apj abdul kalam");
        assert_eq!(normalize("U.S. Marshal Rooster Cogburn"), "us marshal rooster cogburn");
        // Articles are whole words, bounded by any non-word character as Python's \b is.
        assert_eq!(normalize("“An” apple"), "“ ” apple");
        assert_eq!(normalize("Theodor W. Adorno"), "theodor w adorno");
        // MuSiQue gold "8,515": the prediction "8515" is an exact match.
        assert_eq!(score("8515", &labels(&["8,515"])).em, 1.0);
        assert_eq!(score("Hewlett-Packard", &labels(&["Hewlett-Packard"])).em, 1.0);
    }

    #[test]
    fn cover_em_matches_whole_words_only() {
        // Raw substring tests took "unknown" for gold "no" and "1990" for gold "1".
        assert_eq!(score("unknown", &labels(&["no"])).cover_em, 0.0);
        assert_eq!(score("in 1990", &labels(&["1"])).cover_em, 0.0);
        // HotpotQA gold "St. Louis, Missouri" inside a longer answer.
        assert_eq!(
            score("He was born in St. Louis, Missouri in 1935", &labels(&["St. Louis, Missouri"])).cover_em,
            1.0
        );
        assert_eq!(score("Louis Missouri", &labels(&["St. Louis, Missouri"])).cover_em, 0.0);
    }

    #[test]
    fn f1_has_hotpotqas_yes_no_rule() {
        // A "no" shares its one word with "no man's land" but is not a partial answer.
        assert_eq!(score("no", &labels(&["no man's land"])).f1, 0.0);
        assert_eq!(score("Noanswer", &labels(&["no answer"])).f1, 0.0);
        assert_eq!(score("yes", &labels(&["yes"])).f1, 1.0);
    }

    #[test]
    fn exact_match_and_f1() {
        let s = score("the Eiffel Tower", &labels(&["Eiffel Tower"]));
        assert_eq!((s.em, s.f1), (1.0, 1.0));
        let s = score("Paris, France", &labels(&["Paris"]));
        assert_eq!(s.em, 0.0);
        assert!((s.f1 - 2.0 / 3.0).abs() < 1e-9, "{}", s.f1);
        assert_eq!(s.cover_em, 1.0);
        assert_eq!(s.lenient_em, 0.0, "different word counts are not a lenient match");
    }

    #[test]
    fn lenient_em_accepts_reordered_words_and_spacing() {
        assert_eq!(score("Smith John", &labels(&["John Smith"])).lenient_em, 1.0);
        assert_eq!(score("Kuala Lumpur", &labels(&["KualaLumpur"])).lenient_em, 1.0);
        assert_eq!(score("yes", &labels(&["true"])).lenient_em, 1.0);
        assert_eq!(score("no", &labels(&["true"])).lenient_em, 0.0);
        assert_eq!(score("John Brown", &labels(&["John Smith"])).lenient_em, 0.0);
    }

    #[test]
    fn the_best_label_counts() {
        let s = score("Spurs", &labels(&["Tottenham Hotspur", "Spurs"]));
        assert_eq!(s.em, 1.0);
    }

    #[test]
    fn yes_no_answers_are_scored_on_polarity() {
        assert_eq!(score_yes_no("No, it will not.", false).em, 1.0);
        assert_eq!(score_yes_no("Yes", false).em, 0.0);
        assert_eq!(score_yes_no("It is unclear", true).em, 0.0);
        assert_eq!(polarity("True."), Some(true));
    }

    #[test]
    fn recall_of_gold_passages() {
        let gold = labels(&["a", "b"]);
        assert_eq!(passage_recall(&labels(&["b", "c"]), &gold), Some(0.5));
        assert_eq!(passage_recall(&labels(&["c"]), &[]), None);
    }
}
