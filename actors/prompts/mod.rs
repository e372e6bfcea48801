//! The MIGRES prompts (paper Appendix D-G, adapted for small local models: see each file). Fixed
//! instructions and examples come first and the question's text last, so an OpenAI-compatible server
//! with prefix caching reads the long shared part only once.

pub const SYSTEM: &str = "";
pub const MAIN: &str = include_str!("main.txt");
pub const MAIN_ATTEMPT: &str = include_str!("main_attempt.txt");
/// The `flag` prompt that also writes the next queries (`migres.queries_from_main`).
pub const MAIN_QUERIES: &str = include_str!("main_queries.txt");
pub const FINAL_ANSWER: &str = include_str!("final_answer.txt");
/// Two-option comparisons: copy each option's date or number; the code compares (`two_options`).
pub const COMPARE_OPTIONS: &str = include_str!("compare_options.txt");
pub const QUERY_GEN: &str = include_str!("query_gen.txt");
pub const LEAF: &str = include_str!("leaf.txt");
pub const KNOWLEDGE: &str = include_str!("knowledge.txt");
pub const ENTAILMENT: &str = include_str!("entailment.txt");
/// The entailment judge for facts written as the leaf prompt asks ("combining the question"): words
/// that only name the subject as the question did need not be in the passage.
pub const ENTAILMENT_LENIENT: &str = include_str!("entailment_lenient.txt");
/// The per-leaf judge (`nli.calls = "per_leaf"`): every fact of a leaf call at once, each with the
/// passage words that state it, which the code then looks for in that passage.
pub const ENTAILMENT_QUOTES: &str = include_str!("entailment_quotes.txt");
/// The baselines' single answer call over the top-k passages (paper Table 3, VANILLA and VANILLA-s).
pub const READER: &str = include_str!("reader.txt");
/// QPaug (paper 002): the question's step-by-step augmentation and the self-generated passage.
pub const AUGMENT: &str = include_str!("augment.txt");
pub const GENERATE_PASSAGE: &str = include_str!("generate_passage.txt");
/// RA-ISF's three modules (paper 003, Appendix D).
pub const SELF_KNOWLEDGE: &str = include_str!("self_knowledge.txt");
pub const RELEVANCE: &str = include_str!("relevance.txt");
pub const DECOMPOSE: &str = include_str!("decompose.txt");
/// RQ-RAG (paper 004): refining the query, and the trajectory's free-text answer (scored by logprobs).
pub const REFINE: &str = include_str!("refine.txt");
pub const TRAJECTORY_ANSWER: &str = include_str!("trajectory_answer.txt");

/// A template and its name (its file's name without `.txt`): what a stage declares it can ask with
/// ([`crate::actors::runner::Stage::prompts`]), and what an answer's provenance hashes.
pub type NamedPrompt = (&'static str, &'static str);

/// Replaces each `{name}` with its value. Plain replacement, not a template engine: the prompts contain
/// literal JSON braces. Values are inserted in one pass so a value containing `{x}` is not expanded.
pub fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len() + values.iter().map(|(_, v)| v.len()).sum::<usize>());
    // The files end with a newline; the prompt ends at "Your response:".
    let mut rest = template.trim_end();
    'scan: while let Some(open) = rest.find('{') {
        for (name, value) in values {
            let placeholder = format!("{{{name}}}");
            if rest[open..].starts_with(&placeholder) {
                out.push_str(&rest[..open]);
                out.push_str(value);
                rest = &rest[open + placeholder.len()..];
                continue 'scan;
            }
        }
        out.push_str(&rest[..=open]);
        rest = &rest[open + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::fill;

    #[test]
    fn fill_replaces_placeholders_and_keeps_json_braces() {
        let filled = fill(r#"{"a": 1} Q: {question} F: {facts}"#, &[("question", "who {facts}?"), ("facts", "None")]);
        assert_eq!(filled, r#"{"a": 1} Q: who {facts}? F: None"#);
    }
}
