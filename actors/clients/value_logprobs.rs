//! The log-probabilities of one value of a JSON reply: the tokens that wrote the string under a
//! top-level key ("answer"), not the whole reply, whose explanation comes first and dominates it.
//! A stop signal that costs no call (issue 76): how sure the model was of the words it answered.

use serde_json::Value;

use crate::topics::AnswerLogprobs;

/// Sum and count of the log-probabilities of the tokens that wrote the string value of `key` at the
/// top level of the JSON object the tokens spell (OpenAI's `logprobs.content[]`, which llama.cpp
/// also returns). None when the tokens spell no such non-empty string.
pub fn value_logprobs(logprobs: &Value, key: &str) -> Option<AnswerLogprobs> {
    let tokens = logprobs["content"].as_array()?;
    let mut text = String::new();
    let mut spans = Vec::with_capacity(tokens.len());
    for token in tokens {
        let start = text.len();
        text.push_str(token["token"].as_str().unwrap_or(""));
        spans.push((start, text.len(), token["logprob"].as_f64()));
    }
    let (start, end) = string_value(&text, key)?;
    let inside: Vec<f64> = spans
        .iter()
        .filter(|(from, to, _)| *from < end && *to > start)
        .filter_map(|(_, _, logprob)| *logprob)
        .collect();
    (!inside.is_empty()).then(|| AnswerLogprobs { sum: inside.iter().sum(), tokens: inside.len() as u32 })
}

/// The byte range of the characters of the string value under `key` in a JSON object's text,
/// quotes excluded, read as far as the text goes (a key inside a nested object or inside a string,
/// as an explanation that quotes the word, does not count).
fn string_value(text: &str, key: &str) -> Option<(usize, usize)> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let (mut string_start, mut last_string): (usize, Option<(usize, usize)>) = (0, None);
    let mut wanted_next = false;
    for (i, c) in text.char_indices() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    in_string = false;
                    if wanted_next {
                        return (string_start < i).then_some((string_start, i));
                    }
                    last_string = Some((string_start, i));
                }
                _ => {}
            }
            continue;
        }
        match c {
            '"' => (in_string, string_start) = (true, i + 1),
            '{' | '[' => depth += 1,
            '}' | ']' => depth = depth.saturating_sub(1),
            ':' if depth == 1 => wanted_next = last_string.is_some_and(|(s, e)| &text[s..e] == key),
            ',' => wanted_next = false,
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tokens(parts: &[(&str, f64)]) -> Value {
        json!({"content": parts.iter().map(|(t, p)| json!({"token": t, "logprob": p})).collect::<Vec<_>>()})
    }

    #[test]
    fn the_answer_value_alone_is_summed() {
        let reply = tokens(&[
            ("{\"explanation\": \"", -0.1),
            ("The \\\"answer\\\": is", -2.0),
            (" [1]\", \"", -0.2),
            ("answer", -0.01),
            ("\": \"", -0.02),
            ("Lind", -0.5),
            ("on", -0.25),
            ("\", \"confidence\": 4}", -0.3),
        ]);
        let got = value_logprobs(&reply, "answer").unwrap();
        assert_eq!(got.tokens, 2);
        assert!((got.sum - -0.75).abs() < 1e-9, "{got:?}");
        // A token that writes the closing quote and more counts when it writes part of the value.
        let joined = tokens(&[("{\"answer\": \"", -0.1), ("Yes\"", -0.4), ("}", -0.1)]);
        assert_eq!(value_logprobs(&joined, "answer").unwrap().tokens, 1);
    }

    #[test]
    fn no_such_value_gives_none() {
        assert!(value_logprobs(&tokens(&[("{\"answer\": \"\"}", -0.1)]), "answer").is_none());
        assert!(value_logprobs(&tokens(&[("{\"explanation\": \"x\"}", -0.1)]), "answer").is_none());
        assert!(value_logprobs(&json!({}), "answer").is_none());
        // Cut before the value ends: read as far as it goes is not a value.
        assert!(value_logprobs(&tokens(&[("{\"answer\": \"Lin", -0.1)]), "answer").is_none());
    }
}
