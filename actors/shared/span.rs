//! Answers as the evidence writes them. A small model's answer is often right in substance and
//! wrong in form: a name cut short ("Chesney" for "Kenny Chesney"), a series named by its parent
//! title instead of the spin-off's own, stray quote marks or a closing period. Exact match scores
//! all of these wrong, and a reader cannot look them up. So an answer is mapped to the whole name
//! that holds its words in the cited passages and verified facts, as they write it most often, and
//! stripped of punctuation that belongs to no name.

/// Marks a model wraps an answer in that are the same on both sides: never part of a name at its ends.
const SYMMETRIC: &[char] = &['"', '\'', '`', '*'];

/// Brackets and quotes that open and close: stripped in pairs around the answer, or alone when the
/// answer holds no partner for them; kept when the answer opens what it closes ("City (film)").
const PAIRS: &[(char, char)] = &[('(', ')'), ('[', ']'), ('“', '”'), ('‘', '’'), ('«', '»')];

/// Capitalised words that start sentences, not names: never taken in on the left.
const SENTENCE_STARTS: &[&str] = &[
    "a", "an", "in", "on", "at", "by", "for", "from", "with", "during", "after", "before", "when", "while", "his",
    "her", "its", "their", "this", "that", "these", "those", "it", "he", "she", "they", "we", "as", "since", "both",
    "is", "was", "born", "also", "and", "but", "or", "of", "to",
];

/// Words that join the capitalised words of one name ("House of Commons", "Gone with the Wind").
const JOINERS: &[&str] = &["of", "the", "de", "del", "la", "le", "van", "von", "der", "and", "&", "for", "on", "in"];

/// `answer` without the punctuation around it that belongs to no name: wrapping quote marks and
/// brackets, and a closing period, comma, colon or semicolon ("Murcia." but not "U.S." or "Jr.").
pub fn strip_stray_punctuation(answer: &str) -> String {
    let mut text = answer.trim();
    loop {
        let before = text;
        text = unwrapped(text);
        text = text.trim_end_matches([',', ';', ':']).trim_end();
        if let Some(stem) = text.strip_suffix('.')
            && !stem.contains('.')
            && stem.rsplit(' ').next().is_some_and(|last| last.chars().count() > 2)
        {
            text = stem.trim_end();
        }
        if text == before {
            break;
        }
    }
    text.to_string()
}

/// `text` without the wrapping marks at its ends that belong to no name.
fn unwrapped(text: &str) -> &str {
    let mut text = text.trim_matches(|c| SYMMETRIC.contains(&c)).trim();
    for &(open, close) in PAIRS {
        let count = |c: char| text.matches(c).count();
        let inner = text.strip_prefix(open).and_then(|t| t.strip_suffix(close));
        if let Some(inner) = inner.filter(|inner| balanced(inner, open, close)) {
            text = inner.trim();
        } else if text.ends_with(close) && count(open) < count(close) {
            text = text[..text.len() - close.len_utf8()].trim_end();
        } else if text.starts_with(open) && count(open) > count(close) {
            text = text[open.len_utf8()..].trim_start();
        }
    }
    text
}

/// Every `close` in `text` closes an `open` before it, and every `open` is closed: "(film) and (tv)"
/// is not one pair around "film) and (tv".
fn balanced(text: &str, open: char, close: char) -> bool {
    let mut depth = 0i32;
    for c in text.chars() {
        depth += i32::from(c == open) - i32::from(c == close);
        if depth < 0 {
            return false;
        }
    }
    depth == 0
}

/// One word of a text: as written, and as compared (lower case, letters and digits only).
struct Word<'a> {
    written: &'a str,
    key: String,
}

fn words(text: &str) -> Vec<Word<'_>> {
    text.split_whitespace()
        .map(|written| Word {
            written,
            key: written.chars().filter(|c| c.is_alphanumeric()).collect::<String>().to_lowercase(),
        })
        .filter(|w| !w.key.is_empty())
        .collect()
}

fn capitalised(word: &str) -> bool {
    word.trim_start_matches(|c: char| !c.is_alphanumeric())
        .chars()
        .next()
        .is_some_and(|c| c.is_uppercase() || c.is_ascii_digit())
}

/// A word that ends a clause: what follows it is not part of the same name ("Paris, France").
fn ends_clause(word: &str) -> bool {
    word.ends_with([',', '.', ';', '!', '?', ')', '"', '”'])
}

/// The name `answer` is part of in `texts`, as they write it most often; None when the answer is
/// yes/no, not a name there (lower case), written there only as it is, or when two readings tie.
pub fn evidence_span(answer: &str, texts: &[&str]) -> Option<String> {
    let wanted: Vec<String> = words(answer).into_iter().map(|w| w.key).collect();
    if wanted.is_empty() || matches!(wanted.as_slice(), [w] if w == "yes" || w == "no") {
        return None;
    }
    let mut readings: Vec<(String, usize)> = Vec::new();
    for text in texts {
        let words = words(text);
        for start in 0..words.len().saturating_sub(wanted.len() - 1) {
            let end = start + wanted.len();
            if words[start..end].iter().map(|w| &w.key).ne(wanted.iter()) {
                continue;
            }
            if !capitalised(words[start].written) {
                continue;
            }
            let (from, to) = widen(&words, start, end);
            let reading = words[from..to].iter().map(|w| w.written).collect::<Vec<_>>().join(" ");
            let reading = strip_stray_punctuation(&reading);
            match readings.iter_mut().find(|(r, _)| *r == reading) {
                Some((_, count)) => *count += 1,
                None => readings.push((reading, 1)),
            }
        }
    }
    readings.sort_by(|a, b| b.1.cmp(&a.1));
    let (best, count) = readings.first()?;
    if readings.get(1).is_some_and(|(_, second)| second == count) {
        return None;
    }
    let as_written = strip_stray_punctuation(answer);
    (words(best).len() > wanted.len() && *best != as_written).then(|| best.clone())
}

/// The words `start..end` widened over the capitalised words (and joiners between them) of the same
/// name on either side.
fn widen(words: &[Word<'_>], start: usize, end: usize) -> (usize, usize) {
    let (mut from, mut to) = (start, end);
    while from > 0 {
        let before = words[from - 1].written;
        let name_word = capitalised(before) && !SENTENCE_STARTS.contains(&words[from - 1].key.as_str());
        if !name_word || ends_clause(before) {
            break;
        }
        from -= 1;
    }
    while to < words.len() && !ends_clause(words[to - 1].written) {
        let next = &words[to];
        if capitalised(next.written) {
            to += 1;
        } else if JOINERS.contains(&next.key.as_str())
            && !ends_clause(next.written)
            && words.get(to + 1).is_some_and(|w| capitalised(w.written))
        {
            to += 2;
        } else {
            break;
        }
    }
    (from, to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stray_punctuation_goes_and_a_names_own_stays() {
        assert_eq!(strip_stray_punctuation("\"Blue Harbour\""), "Blue Harbour");
        assert_eq!(strip_stray_punctuation("Blue Harbour\"\""), "Blue Harbour");
        assert_eq!(strip_stray_punctuation("Murcia."), "Murcia");
        assert_eq!(strip_stray_punctuation("(the Alder Trust),"), "the Alder Trust");
        assert_eq!(strip_stray_punctuation("U.S."), "U.S.");
        assert_eq!(strip_stray_punctuation("Sammy Davis Jr."), "Sammy Davis Jr.");
        assert_eq!(strip_stray_punctuation("St. Kilda"), "St. Kilda");
    }

    /// A bracket or quote that the answer itself opens is the name's own: "(film)" of a title whose
    /// closing bracket went with the stray ones left "Love in a Fallen City (film" in an answer record.
    #[test]
    fn a_closing_bracket_whose_opening_is_in_the_answer_stays() {
        assert_eq!(strip_stray_punctuation("Harbour Lights (film)"), "Harbour Lights (film)");
        assert_eq!(strip_stray_punctuation("\"Harbour Lights (film)\"."), "Harbour Lights (film)");
        assert_eq!(strip_stray_punctuation("Harbour Lights [1953]"), "Harbour Lights [1953]");
        assert_eq!(strip_stray_punctuation("Harbour Lights)"), "Harbour Lights", "a closer with no opener goes");
        assert_eq!(strip_stray_punctuation("(Harbour Lights"), "Harbour Lights", "and an opener with no closer");
        assert_eq!(strip_stray_punctuation("(film) and (tv)"), "(film) and (tv)", "two pairs, not one around both");
    }

    /// Shapes of our own: a name cut short, a series named by its parent title, and what must stay.
    #[test]
    fn an_answer_becomes_the_whole_name_the_evidence_holds() {
        let passages = [
            "Night Ledger: The Quiet Years is a spin-off of Night Ledger, broadcast from 2004.",
            "The spin-off Night Ledger: The Quiet Years ran for four seasons.",
        ];
        assert_eq!(evidence_span("Night Ledger", &passages), Some("Night Ledger: The Quiet Years".into()));
        let singer = ["Kenna Morrow Hale recorded the album in Nashville.", "Hale toured in 2011."];
        assert_eq!(evidence_span("Morrow Hale", &singer), Some("Kenna Morrow Hale".into()));
        // Written as it is, or only in lower case: left alone.
        assert_eq!(evidence_span("Nashville", &singer), None);
        assert_eq!(evidence_span("album", &singer), None);
        assert_eq!(evidence_span("yes", &singer), None);
        // A sentence's first word is not part of the name.
        assert_eq!(evidence_span("Nashville", &["In Nashville she met him."]), None);
        // Two readings as often: no change.
        let both = ["Port Vell lies south.", "Vell Marina opened."];
        assert_eq!(evidence_span("Vell", &both), None);
        // The name the evidence writes most often wins over a longer one written once.
        let mostly = ["Arden is a town.", "Arden lies on the coast.", "Arden Castle stands above it."];
        assert_eq!(evidence_span("Arden", &mostly), None);
    }
}
