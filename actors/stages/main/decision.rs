//! The main module's decision, whichever prompt asks for it: the three replies (the paper's `flag`,
//! `flag` with the next queries, and `attempt`), each with the JSON schema derived from it, read as
//! one [`Decision`]; and the vote over several samples (self-consistency).

use schemars::JsonSchema;
use serde::Deserialize;

use crate::actors::clients::schema::Confidence;
use crate::actors::clients::{Completion, LlmClient, LlmError, Schema};
use crate::actors::prompts::{self, NamedPrompt};
use crate::actors::shared::answer::normalize_answer;
use crate::config::{DecisionPrompt, MigresSettings};

/// What the decision says, from either prompt's reply.
pub(super) struct Decision {
    /// Only the `flag` prompt asks for it.
    pub(super) answerable: Option<bool>,
    pub(super) answer: String,
    pub(super) confidence: f32,
    pub(super) explanation: String,
    pub(super) missing_information: String,
    /// The next queries, when the prompt asked for them (`queries_from_main`).
    pub(super) queries: Vec<String>,
}

// Reasoning first: the model explains before it commits. The `flag` prompt (the paper's) also names
// what is missing before it sets the flag; `attempt` answers first and says what is missing after.
// The keys go out in the order the fields are declared.

/// The `flag` prompt's reply.
#[derive(Deserialize, JsonSchema)]
struct FlagReply {
    explanation: String,
    missing_information: String,
    answerable: bool,
    answer: String,
    #[schemars(with = "Confidence")]
    confidence: f32,
}

/// The `flag` prompt's reply with the next queries (`queries_from_main`): named after what is
/// missing and before the flag, so they ask for what the explanation found missing.
#[derive(Deserialize, JsonSchema)]
struct FlagQueriesReply {
    explanation: String,
    missing_information: String,
    queries: Vec<String>,
    answerable: bool,
    answer: String,
    #[schemars(with = "Confidence")]
    confidence: f32,
}

/// The `attempt` prompt's reply.
#[derive(Deserialize, JsonSchema)]
struct AttemptReply {
    explanation: String,
    answer: String,
    #[schemars(with = "Confidence")]
    confidence: f32,
    missing_information: String,
}

impl From<FlagReply> for Decision {
    fn from(r: FlagReply) -> Self {
        let FlagReply { explanation, missing_information, answerable, answer, confidence } = r;
        Decision {
            answerable: Some(answerable),
            answer,
            confidence,
            explanation,
            missing_information,
            queries: Vec::new(),
        }
    }
}

impl From<FlagQueriesReply> for Decision {
    fn from(r: FlagQueriesReply) -> Self {
        let FlagQueriesReply { explanation, missing_information, queries, answerable, answer, confidence } = r;
        Decision { answerable: Some(answerable), answer, confidence, explanation, missing_information, queries }
    }
}

impl From<AttemptReply> for Decision {
    fn from(r: AttemptReply) -> Self {
        let AttemptReply { explanation, answer, confidence, missing_information } = r;
        Decision { answerable: None, answer, confidence, explanation, missing_information, queries: Vec::new() }
    }
}

/// Which decision reply is asked for: the prompt's own, or the flag prompt's with at most this many
/// next queries.
#[derive(Clone, Copy)]
pub(super) enum Reply {
    Prompt(DecisionPrompt),
    FlagWithQueries(usize),
}

impl Reply {
    /// The reply `settings` ask for.
    pub(super) fn of(settings: &MigresSettings) -> Reply {
        match settings.decision_prompt {
            DecisionPrompt::Flag if settings.queries_from_main => Reply::FlagWithQueries(settings.max_new_queries),
            prompt => Reply::Prompt(prompt),
        }
    }

    /// The prompt that asks for this reply, by name: what the stage sends and what provenance hashes.
    pub(super) fn prompt(self) -> NamedPrompt {
        match self {
            Reply::Prompt(DecisionPrompt::Flag) => ("main", prompts::MAIN),
            Reply::Prompt(DecisionPrompt::Attempt) => ("main_attempt", prompts::MAIN_ATTEMPT),
            Reply::FlagWithQueries(_) => ("main_queries", prompts::MAIN_QUERIES),
        }
    }
}

/// One decision call with the reply's schema.
pub(super) async fn decide_once(llm: &LlmClient, reply: Reply, text: &str) -> Result<Completion<Decision>, LlmError> {
    match reply {
        Reply::Prompt(DecisionPrompt::Flag) => {
            ask::<FlagReply>(llm, text, Schema::of::<FlagReply>("main_decision")).await
        }
        Reply::Prompt(DecisionPrompt::Attempt) => {
            ask::<AttemptReply>(llm, text, Schema::of::<AttemptReply>("main_attempt")).await
        }
        Reply::FlagWithQueries(max) => {
            let schema = Schema::of::<FlagQueriesReply>("main_decision_queries").with_max_items("queries", max);
            ask::<FlagQueriesReply>(llm, text, schema).await
        }
    }
}

/// A decision call whose reply is parsed as `R`, under `schema` (the one `R` derives).
async fn ask<R>(llm: &LlmClient, text: &str, schema: Schema) -> Result<Completion<Decision>, LlmError>
where
    R: JsonSchema + serde::de::DeserializeOwned + Into<Decision>,
{
    let reply = llm.structured::<R>(prompts::SYSTEM, text, &schema).await?;
    Ok(Completion { value: reply.value.into(), stats: reply.stats })
}

/// The model says the question is answerable: the flag where the prompt asks for one, and an
/// answer that answers (not "unanswerable", the MIGRES code's test: the flag alone is not trusted;
/// nor "None" or "unknown").
pub(super) fn says_answerable(d: &Decision) -> bool {
    d.answerable.unwrap_or(true) && !is_non_answer(&d.answer)
}

/// Self-consistency: answerable when most samples say so, with the answer most of them give
/// (compared normalised, the earliest on a tie; that sample stands for them); otherwise the first
/// sample that says what is missing.
pub(super) fn vote(mut samples: Vec<Decision>) -> Decision {
    let answerable: Vec<usize> = (0..samples.len()).filter(|&i| says_answerable(&samples[i])).collect();
    let chosen = if answerable.len() * 2 > samples.len() {
        let key = |i: usize| normalize_answer(&samples[i].answer);
        let count = |i: usize| answerable.iter().filter(|&&j| key(j) == key(i)).count();
        let mut best = answerable[0];
        for &i in &answerable[1..] {
            if count(i) > count(best) {
                best = i;
            }
        }
        best
    } else {
        (0..samples.len()).find(|&i| !says_answerable(&samples[i])).unwrap_or(0)
    };
    samples.swap_remove(chosen)
}

/// An answer that answers nothing: empty, "None", "unknown", "not enough information", ...
pub(super) fn is_non_answer(answer: &str) -> bool {
    let normalized = normalize_answer(answer);
    normalized.is_empty()
        || matches!(normalized.as_str(), "none" | "unknown" | "na" | "no answer" | "not available" | "not applicable")
        || [
            "unanswerable",
            "not enough information",
            "insufficient information",
            "cannot be determined",
            "not mentioned",
            "not provided",
            "no information",
        ]
        .iter()
        .any(|marker| normalized.contains(marker))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The requests, and so the LLM cache's keys, are those of the schemas once written by hand:
    /// the keys in the prompts' order, every one required, confidence one of five integers.
    #[test]
    fn each_decision_prompt_gets_its_own_schema_in_its_own_key_order() {
        let flag = Schema::of::<FlagReply>("main_decision").schema.to_string();
        let confidence = r#""confidence":{"type":"integer","enum":[1,2,3,4,5]}"#;
        let expected = format!(
            r#"{{"type":"object","properties":{{"explanation":{{"type":"string"}},"missing_information":{{"type":"string"}},"answerable":{{"type":"boolean"}},"answer":{{"type":"string"}},{confidence}}},"required":["explanation","missing_information","answerable","answer","confidence"],"additionalProperties":false}}"#
        );
        assert_eq!(flag, expected);
        let attempt = Schema::of::<AttemptReply>("main_attempt").schema.to_string();
        let expected = format!(
            r#"{{"type":"object","properties":{{"explanation":{{"type":"string"}},"answer":{{"type":"string"}},{confidence},"missing_information":{{"type":"string"}}}},"required":["explanation","answer","confidence","missing_information"],"additionalProperties":false}}"#
        );
        assert_eq!(attempt, expected);
    }
    fn sample(answerable: bool, answer: &str) -> Decision {
        Decision {
            answerable: Some(answerable),
            answer: answer.into(),
            confidence: 4.0,
            explanation: String::new(),
            missing_information: if answerable { String::new() } else { format!("not {answer}") },
            queries: Vec::new(),
        }
    }

    #[test]
    fn the_vote_takes_the_majority_answer_or_what_is_missing() {
        let votes =
            vec![sample(true, "Lindon"), sample(true, "the Lindon"), sample(true, "Vessary"), sample(false, "x")];
        assert_eq!(vote(votes).answer, "Lindon", "answers are compared normalised");
        let votes = vec![sample(true, "Lindon"), sample(false, "a"), sample(false, "b")];
        let missing = vote(votes);
        assert_eq!(missing.answerable, Some(false));
        assert_eq!(missing.missing_information, "not a");
        let tie = vec![sample(true, "Vessary"), sample(true, "Lindon")];
        assert_eq!(vote(tie).answer, "Vessary", "the earliest answer on a tie");
    }

    #[test]
    fn an_attempt_answers_unless_it_is_a_non_answer() {
        let attempt = |answer: &str| Decision { answerable: None, ..sample(true, answer) };
        assert!(says_answerable(&attempt("Lindon")));
        assert!(!says_answerable(&attempt("unanswerable")));
        assert!(!says_answerable(&attempt("Unknown")));
        assert!(!says_answerable(&sample(false, "Lindon")), "a flag, where asked for, still counts");
    }

    #[test]
    fn non_answers_are_recognised() {
        for answer in ["None", "unknown", "", "Unanswerable", "There is not enough information."] {
            assert!(is_non_answer(answer), "{answer}");
        }
        for answer in ["No", "Lindon", "1923", "None of the Above (film)"] {
            assert!(!is_non_answer(answer), "{answer}");
        }
    }
}
