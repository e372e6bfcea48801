//! A scripted LLM that plays QPaug, RA-ISF and RQ-RAG for the HotpotQA Hugo question, by reading the
//! passages it is shown, so each pipeline has to find both hops through the real index.

use serde_json::json;

use super::fake_llm::{Prompt, Reply, last_field, prompt_kind, tail};
use super::scripted::SECOND_HOP_QUERY;

/// RA-ISF's decomposition of the Hugo question.
pub const SUB1: &str = "Which team does Hugo Rodríguez Romero play for?";
pub const SUB2: &str = SECOND_HOP_QUERY;
/// What the model "knows" about Hugo in QPaug's passage generation: the hop retrieval misses.
pub const OWN_PASSAGE: &str = "Hugo Rodríguez Romero plays for FC Cartagena, a club of the Region of Murcia.";

/// The documents part of a reader or trajectory-answer prompt.
fn documents(prompt: &str) -> &str {
    let own = prompt.rsplit_once("Now answer this one.").map_or(prompt, |(_, t)| t);
    own.rsplit_once("Question: ").map_or(own, |(d, _)| d)
}

pub fn methods_script(prompt: &str) -> Reply {
    let question = last_field(prompt, "Question: ");
    match prompt_kind(prompt) {
        Prompt::Augment => Reply::Text(format!("{SUB1}\n{SUB2}")),
        Prompt::GeneratePassage if question.starts_with("Hugo") => Reply::Text(format!("{OWN_PASSAGE} [DONE]")),
        Prompt::GeneratePassage => Reply::Text("[NONE]".into()),
        Prompt::Reader => {
            let docs = documents(prompt);
            let answer = if question == SUB1 && docs.contains("FC Cartagena") {
                "FC Cartagena"
            } else if docs.contains("Murcia") {
                "Murcia"
            } else {
                "unknown"
            };
            Reply::Json(json!({"answer": answer, "confidence": 4, "explanation": "read"}))
        }
        Prompt::SelfKnowledge => Reply::Json(json!({"known": false})),
        Prompt::Relevance => {
            let paragraph = last_field(tail(prompt), "Paragraph: ");
            let relevant = (question == SUB1 && paragraph.contains("plays for FC Cartagena"))
                || (question == SUB2 && paragraph.contains("autonomous community of Murcia"));
            Reply::Json(json!({"relevant": relevant}))
        }
        Prompt::Decompose if question.contains("Hugo") && !question.starts_with("Which team") => {
            Reply::Json(json!({"sub_questions": [SUB1, SUB2]}))
        }
        Prompt::Decompose => Reply::Json(json!({"sub_questions": [question]})),
        Prompt::Refine if prompt.contains("Rewrite the query") => Reply::Json(json!({"queries": [SUB2]})),
        Prompt::Refine => Reply::Json(json!({"queries": ["Hugo Rodríguez Romero Spanish footballer"]})),
        Prompt::TrajectoryAnswer if documents(prompt).contains("autonomous community of Murcia") => {
            Reply::Scored("Murcia".into(), -0.1)
        }
        Prompt::TrajectoryAnswer => Reply::Scored("Spain".into(), -2.0),
        _ => Reply::Status(400),
    }
}

/// The script, except that the second sub-question's first call takes six seconds: longer than a
/// short join deadline waits.
pub fn slow_second_subquestion(prompt: &str) -> Reply {
    second_subquestion_after(std::time::Duration::from_secs(6))(prompt)
}

/// The script, with the second sub-question's first call answered after `delay`.
pub fn second_subquestion_after(delay: std::time::Duration) -> impl Fn(&str) -> Reply + Send + Sync + 'static {
    move |prompt| match prompt_kind(prompt) {
        Prompt::SelfKnowledge if last_field(prompt, "The problem is: ") == SUB2 => {
            Reply::Delayed(delay, Box::new(Reply::Json(json!({"known": false}))))
        }
        _ => methods_script(prompt),
    }
}
