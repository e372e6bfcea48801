//! Documents as users add them to a live corpus, and the rule that splits one into passages.
//!
//! A document is `{"id", "title", "text", "metadata"}`. Its passages are about `search.passage_words`
//! words each, as the method papers' 100-word passages: sentences are kept whole while they fit, and
//! a sentence longer than a passage is cut between words. A document that fits in one passage is that
//! passage, with the document's id; a longer one gives `ID#1`, `ID#2`, ... Every passage carries the
//! document's title and metadata. Ingesting a document again replaces all of its passages: the index
//! deletes the document's passages by its id before adding the new ones, so no passage of an older,
//! longer version remains.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::topics::Passage;

/// The longest document id, in characters.
pub const MAX_ID_CHARS: usize = 200;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Document {
    /// The document's id; its passages' ids start with it. No `#` (it numbers passages), no `/`, `?`
    /// or `%` (it is a URL's last segment), no white space, control, invisible or bidirectional
    /// characters.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^#?%/\\s\\u0000-\\u001f\\u007f-\\u009f\\u00ad\\u200b-\\u200f\\u202a-\\u202e\\u2060-\\u2069\\ufeff]+$"
    )]
    pub id: String,
    #[serde(default)]
    pub title: String,
    /// Not blank; with the title and metadata at most `search.max_document_bytes` bytes.
    #[schema(pattern = "\\S")]
    pub text: String,
    /// Anything to keep with the document, such as its source URL.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// Why a document cannot be taken, in words a user can act on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DocumentError {
    #[error("the document id is empty")]
    EmptyId,
    #[error("the document id {0:?} is longer than 200 characters")]
    LongId(String),
    #[error(
        "the document id {0:?} holds '#', '/', '?', '%', white space, or a control, invisible or bidirectional character ('#' numbers its passages; the id is a URL segment)"
    )]
    BadId(String),
    #[error("document {0:?} has no text")]
    EmptyText(String),
    #[error("document {id:?} is {bytes} bytes, over search.max_document_bytes = {max}: split it into documents")]
    TooLarge { id: String, bytes: usize, max: usize },
}

impl Document {
    /// Checks the id, the text and the size (`max_bytes`: title, text and metadata together).
    pub fn check(&self, max_bytes: usize) -> Result<(), DocumentError> {
        check_id(&self.id)?;
        if self.text.trim().is_empty() {
            return Err(DocumentError::EmptyText(self.id.clone()));
        }
        let bytes =
            self.title.len() + self.text.len() + self.metadata.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        if bytes > max_bytes {
            return Err(DocumentError::TooLarge { id: self.id.clone(), bytes, max: max_bytes });
        }
        Ok(())
    }

    /// The document's passages by the rule above, each of at most `words` words (0: one passage).
    pub fn passages(&self, words: usize) -> Vec<Passage> {
        let chunks = chunks(&self.text, words);
        let single = chunks.len() == 1;
        let id = |n: usize| if single { self.id.clone() } else { format!("{}#{}", self.id, n + 1) };
        chunks.into_iter().enumerate().map(|(n, text)| Passage { id: id(n), title: self.title.clone(), text }).collect()
    }
}

/// Where a passage falls in its document, by the numbering of [`Document::passages`]: `ID#2` before
/// `ID#10`, an unsplit `ID` first. For reading a document's passages back in order.
pub fn passage_number(passage_id: &str) -> usize {
    passage_id.rsplit_once('#').and_then(|(_, n)| n.parse::<usize>().ok()).unwrap_or(0)
}

/// A document id is what deletes name: non-empty, short, without '#' (it numbers its passages),
/// '/', '?' or '%' (it is the last segment of /v1/documents/{id}), white space, control characters,
/// or invisible and bidirectional ones (two ids that look the same must be the same).
pub fn check_id(id: &str) -> Result<(), DocumentError> {
    if id.trim().is_empty() {
        return Err(DocumentError::EmptyId);
    }
    if id.chars().count() > MAX_ID_CHARS {
        return Err(DocumentError::LongId(id.chars().take(40).collect::<String>() + "..."));
    }
    let invisible = |c: char| matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}');
    if id.chars().any(|c| matches!(c, '#' | '/' | '?' | '%') || c.is_whitespace() || c.is_control() || invisible(c)) {
        return Err(DocumentError::BadId(id.to_string()));
    }
    Ok(())
}

/// `text` in runs of whole sentences of at most `words` words; a longer sentence is cut between
/// words. White space inside a passage is kept as written, between passages dropped.
fn chunks(text: &str, words: usize) -> Vec<String> {
    let text = text.trim();
    if words == 0 || text.split_whitespace().count() <= words {
        return vec![text.to_string()];
    }
    let mut passages: Vec<String> = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    for sentence in sentences(text) {
        let sentence_words: Vec<&str> = sentence.split_whitespace().collect();
        if !current.is_empty() && current.len() + sentence_words.len() > words {
            passages.push(current.join(" "));
            current.clear();
        }
        for word in sentence_words {
            if current.len() == words {
                passages.push(current.join(" "));
                current.clear();
            }
            current.push(word);
        }
    }
    if !current.is_empty() {
        passages.push(current.join(" "));
    }
    passages
}

/// Sentences end at '.', '!' or '?' followed by white space.
fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    for (i, &(at, c)) in chars.iter().enumerate() {
        let next_is_space = chars.get(i + 1).is_some_and(|(_, n)| n.is_whitespace());
        if matches!(c, '.' | '!' | '?') && next_is_space {
            let end = at + c.len_utf8();
            out.push(&text[start..end]);
            start = end;
        }
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out.into_iter().map(str::trim).filter(|s| !s.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn document(text: &str) -> Document {
        Document { id: "doc".into(), title: "T".into(), text: text.into(), metadata: BTreeMap::new() }
    }

    #[test]
    fn a_short_document_is_one_passage_with_its_own_id() {
        let passages = document("One sentence. Two sentences.").passages(100);
        assert_eq!(
            passages,
            vec![Passage { id: "doc".into(), title: "T".into(), text: "One sentence. Two sentences.".into() }]
        );
    }

    #[test]
    fn a_long_document_splits_between_sentences_and_numbers_its_passages() {
        let sentence = |n: usize| format!("{} end.", vec!["word"; n - 1].join(" "));
        let text = [sentence(40), sentence(40), sentence(40)].join(" ");
        let passages = document(&text).passages(100);
        assert_eq!(passages.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), ["doc#1", "doc#2"]);
        assert_eq!(passages[0].text, [sentence(40), sentence(40)].join(" "), "whole sentences while they fit");
        assert_eq!(passages[1].text, sentence(40));
        assert!(passages.iter().all(|p| p.title == "T"));
    }

    #[test]
    fn a_sentence_longer_than_a_passage_is_cut_between_words() {
        let text = vec!["word"; 250].join(" ");
        let passages = document(&text).passages(100);
        let words: Vec<usize> = passages.iter().map(|p| p.text.split_whitespace().count()).collect();
        assert_eq!(words, [100, 100, 50]);
    }

    #[test]
    fn bad_documents_get_errors_that_say_what_to_fix() {
        assert_eq!(document("  ").check(1000), Err(DocumentError::EmptyText("doc".into())));
        let mut no_id = document("text");
        no_id.id = " ".into();
        assert_eq!(no_id.check(1000), Err(DocumentError::EmptyId));
        let mut numbered = document("text");
        numbered.id = "a#1".into();
        assert!(matches!(numbered.check(1000), Err(DocumentError::BadId(_))));
        let mut spaced = document("text");
        spaced.id = "kb article".into();
        assert!(matches!(spaced.check(1000), Err(DocumentError::BadId(_))), "an id travels in URLs");
        // A path, query or escape character would make GET /v1/documents/{id} name another resource,
        // and an invisible or bidirectional character two ids that look alike (issue 57, item 9).
        for id in ["kb/article", "what?", "50%25", "a\u{200b}b", "a\u{202e}b", "\u{feff}a"] {
            let mut odd = document("text");
            odd.id = id.into();
            assert!(matches!(odd.check(1000), Err(DocumentError::BadId(_))), "{id:?}");
        }
        let big = document(&"x".repeat(2000));
        assert!(big.check(1000).unwrap_err().to_string().contains("over search.max_document_bytes = 1000"));
        assert_eq!(document("fine").check(1000), Ok(()));
    }
}
