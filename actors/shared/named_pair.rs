//! named_pair: the two things a question names to ask about between or together, for the
//! `option_unseen` check (`one_shot`) and its query per option (`retrieve`): a two-option question's
//! options (`two_options`), or two names joined by "and".

use crate::actors::shared::two_options::{NAME_JOINERS, Options, capitalised_run, is_name_word, options};

/// The two things a question names to ask about between or together: its two options ("A or B?"),
/// or two names joined by "and" ("Are A and B both ...?", "To what group do both A and B
/// belong?"). None where it names no such pair.
pub fn named_pair(question: &str) -> Option<Options> {
    if let Some(options) = options(question) {
        return Some(options);
    }
    let q = question.trim().trim_end_matches('?').trim_end();
    q.match_indices(" and ").find_map(|(at, joiner)| {
        let after = q[at + joiner.len()..].trim_start();
        let after = ["the ", "a ", "an "].iter().find_map(|a| after.strip_prefix(a)).unwrap_or(after);
        Options::new(&capitalised_run_before(&q[..at]), &capitalised_run(after))
    })
}

/// The trailing words of `text` that make a name, read backwards as [`capitalised_run`] reads
/// forwards; never the question's first word ("Are A and B ...": "Are" starts the sentence), and
/// nothing after a comma.
fn capitalised_run_before(text: &str) -> String {
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut taken: Vec<&str> = Vec::new();
    let mut pending: Vec<&str> = Vec::new();
    for (at, word) in words.iter().enumerate().skip(1).rev() {
        // A comma before the name: a list ("A, B and C") or a place ("Lindon, Vessary"), no pair.
        if word.ends_with(',') && at + 1 < words.len() {
            return String::new();
        }
        let bare = word.trim_end_matches(',');
        if is_name_word(bare) {
            taken.append(&mut pending);
            taken.push(bare);
        } else if !taken.is_empty() && NAME_JOINERS.contains(&bare.to_lowercase().as_str()) {
            pending.push(bare);
        } else {
            break;
        }
    }
    taken.reverse();
    taken.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(first: &str, second: &str) -> Option<Options> {
        Some(Options { first: first.into(), second: second.into() })
    }

    /// Question shapes of our own: two names joined by "and" are a pair as well as two options;
    /// the sentence's first word, a lower-case word or a comma ends a name.
    #[test]
    fn two_names_asked_about_together_are_a_pair() {
        assert_eq!(named_pair("Are Lone Tarn and Harrow Lights both films?"), opts("Lone Tarn", "Harrow Lights"));
        assert_eq!(
            named_pair("The Vessary Hound and the Lindon Terrier are both which kind of animal?"),
            opts("Vessary Hound", "Lindon Terrier"),
            "the sentence's first word is never a name's"
        );
        assert_eq!(
            named_pair("Were the Quill 16 and Ostra CP-9 made in the same country?"),
            opts("Quill 16", "Ostra CP-9")
        );
        assert_eq!(
            named_pair("Are Cal Verrin and The Lady of the Lake both Scottish?"),
            opts("Cal Verrin", "The Lady of the Lake")
        );
        assert_eq!(named_pair("Which came first, Lone Tarn or Harrow Lights?"), opts("Lone Tarn", "Harrow Lights"));
        assert_eq!(named_pair("Who founded the club in Lindon, Vessary and which year?"), None, "no name after and");
        assert_eq!(named_pair("Who was born in Lindon, Vessary and Harwick?"), None, "a list");
        assert_eq!(named_pair("Where was the father of Tom Quill born?"), None);
    }
}
