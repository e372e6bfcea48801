//! The prompts' few-shot examples must not leak the evaluation data: an example about a film, a person
//! or a place that a question (or its corpus) is about teaches the model that question's answer. Every
//! name in actors/prompts/*.txt and eval/judge.txt is looked up in every questions.jsonl and corpus.jsonl.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// shared/data beside the repository (as in CI), or LACUNA_DATA; as tests/support/mod.rs finds it,
/// without compiling the rest of the support code.
fn data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LACUNA_DATA") {
        return PathBuf::from(dir);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data")
}

/// Phrases of the instructions themselves, not entities of any example.
const GENERIC: &[&str] = &[
    "Your response",
    "Passage",
    "Question",
    "Information",
    "Original Question",
    "Historical Questions",
    "Known Information",
    "Missing Information",
    "Ground-truth Answer",
    "The Information",
    "The Question",
    "The Premise",
    "The Hypothesis",
    "New queries",
];

/// Words a sentence may start with before a name ("Did Jonas Vellmar ..."): dropped from the front of a run
/// so that the name itself is what is looked up.
const SENTENCE_STARTS: &str = "A An The And But Both Did Do Does Is Was Were Has Had Who Whom Whose What When Where \
    Which Why How In On At From By Of For With Yes No Document Passage Paragraph Example";

fn prompt_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("actors/prompts"))
        .expect("actors/prompts")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "txt"))
        .collect();
    files.sort();
    files.push(root.join("eval/judge.txt"));
    files
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '\'' || c == '’' || c == '-' || c == '&'
}

fn is_capitalised(word: &str) -> bool {
    word.chars().next().is_some_and(char::is_uppercase)
}

/// The candidate entity names of a text: maximal runs of two or more Capitalised words separated by
/// single spaces (any punctuation ends a run), the text of "(Title: X)" markers, the titles of
/// "[N] X: ..." document lines, and short capitalised quoted strings ("Quillfeather").
fn candidate_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();

    for line in text.lines() {
        // Runs of Capitalised words.
        let mut run: Vec<&str> = Vec::new();
        let mut flush = |run: &mut Vec<&str>| {
            let mut words: &[&str] = run;
            while words.len() > 2 && SENTENCE_STARTS.split_whitespace().any(|start| start == words[0]) {
                words = &words[1..];
            }
            if words.len() >= 2 {
                names.insert(words.join(" "));
            }
            run.clear();
        };
        let mut rest = line;
        while !rest.is_empty() {
            let start = rest.find(is_word_char).unwrap_or(rest.len());
            let gap = &rest[..start];
            // Only a plain space may join two words of one name.
            if !(gap.is_empty() || gap == " ") {
                flush(&mut run);
            }
            rest = &rest[start..];
            let end = rest.find(|c: char| !is_word_char(c)).unwrap_or(rest.len());
            let word = rest[..end].trim_matches(|c| c == '\'' || c == '’' || c == '-');
            if !word.is_empty() && is_capitalised(word) {
                run.push(word);
            } else if end > 0 {
                flush(&mut run);
            }
            rest = &rest[end..];
        }
        flush(&mut run);

        // "[1] Title: text" document lines.
        if let Some(after) = line.strip_prefix('[')
            && let Some((index, body)) = after.split_once("] ")
            && index.chars().all(|c| c.is_ascii_digit())
            && let Some((title, _)) = body.split_once(": ")
        {
            names.insert(title.trim().to_string());
        }
    }

    // "(Title: X)" markers, up to the matching parenthesis: "(Title: Jonas Vellmar (painter))".
    for piece in text.split("(Title: ").skip(1) {
        let mut depth = 0;
        let end = piece.char_indices().find_map(|(i, c)| match c {
            '(' => {
                depth += 1;
                None
            }
            ')' if depth == 0 => Some(i),
            ')' => {
                depth -= 1;
                None
            }
            _ => None,
        });
        if let Some(end) = end {
            names.insert(piece[..end].trim().to_string());
        }
    }

    // Short quoted names: "Quillfeather", "The Glass Orchard"; not sentences, dates or numbers.
    for (i, quoted) in text.split('"').enumerate() {
        let words = quoted.split_whitespace().count();
        if i % 2 == 1
            && is_capitalised(quoted)
            && quoted.len() >= 4
            && (1..=5).contains(&words)
            && !quoted.contains(|c: char| c.is_ascii_digit() || c == '?' || c == ':' || c == '{')
        {
            names.insert(quoted.trim_end_matches(['.', ',']).to_string());
        }
    }

    names.retain(|name| !GENERIC.iter().any(|generic| generic.eq_ignore_ascii_case(name)) && !name.contains('{'));
    names
}

/// The lower-cased text of every questions.jsonl and corpus.jsonl under the data directory, by path.
fn evaluation_texts() -> Vec<(PathBuf, String)> {
    let dir = data_dir();
    let mut texts = Vec::new();
    let mut folders: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the evaluation data at {} (set LACUNA_DATA): {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_dir())
        .collect();
    folders.sort();
    for folder in folders {
        for file in ["questions.jsonl", "corpus.jsonl"] {
            let path = folder.join(file);
            if let Ok(text) = std::fs::read_to_string(&path) {
                // The JSON escapes of non-ASCII letters would hide "Rodríguez": compare decoded text.
                let decoded: String = text
                    .lines()
                    .filter(|line| !line.trim().is_empty())
                    .map(|line| {
                        let value: serde_json::Value = serde_json::from_str(line)
                            .unwrap_or_else(|e| panic!("{}: not JSON lines: {e}", path.display()));
                        let mut strings = Vec::new();
                        collect_strings(&value, &mut strings);
                        strings.join("\n")
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
                texts.push((path, decoded.to_lowercase()));
            }
        }
    }
    assert!(
        texts.iter().filter(|(path, _)| path.ends_with("questions.jsonl")).count() > 0,
        "no questions.jsonl under {} (set LACUNA_DATA)",
        dir.display()
    );
    texts
}

fn collect_strings(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_strings(v, out)),
        serde_json::Value::Object(fields) => fields.values().for_each(|v| collect_strings(v, out)),
        _ => {}
    }
}

#[test]
fn candidate_names_are_runs_titles_and_quoted_names() {
    let names = candidate_names(
        "Passage 0: (Title: Quillfeather (film)) Did Jonas Vellmar direct \"The Glass Orchard\", a film of Vienna?\n[1] Orla Brisk: Orla Brisk is a writer.\nYour response: {\"answer\": \"No\"}",
    );
    let expected: BTreeSet<String> =
        ["Quillfeather (film)", "Jonas Vellmar", "The Glass Orchard", "Glass Orchard", "Orla Brisk"]
            .into_iter()
            .map(String::from)
            .collect();
    assert_eq!(names, expected);
}

#[test]
fn no_prompt_example_names_an_entity_from_the_evaluation_data() {
    let texts = evaluation_texts();
    let mut offenders = Vec::new();
    let mut checked = 0;
    for file in prompt_files() {
        let prompt = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for name in candidate_names(&prompt) {
            checked += 1;
            let needle = name.to_lowercase();
            let found: Vec<String> = texts
                .iter()
                .filter(|(_, text)| text.contains(&needle))
                .map(|(path, _)| {
                    let folder = path.parent().and_then(Path::file_name).unwrap_or_default().to_string_lossy();
                    format!("{folder}/{}", path.file_name().unwrap().to_string_lossy())
                })
                .collect();
            if !found.is_empty() {
                let short = file.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap_or(&file).display().to_string();
                offenders.push(format!("{short}: \"{name}\" occurs in {}", found.join(", ")));
            }
        }
    }
    assert!(checked > 0, "no candidate names found in the prompts: is the extraction broken?");
    assert!(
        offenders.is_empty(),
        "{} prompt example name(s) occur in the evaluation data (test leakage); invent other ones:\n{}",
        offenders.len(),
        offenders.join("\n")
    );
}
