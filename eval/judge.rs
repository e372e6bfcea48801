//! Acc†: an LLM judges whether the prediction implies the gold answer (MIGRES paper Table 15, its
//! prompt verbatim). As in the MIGRES evaluation, an exact match needs no judge, and yes/no questions
//! are scored on polarity alone (their Acc† equals EM). The judge sees every gold label (the answer
//! and its aliases), and its verdict is read from the first yes/no word of a reply given room to
//! explain itself, so a judge that reasons before it concludes is not scored wrong.

use crate::actors::clients::{LlmClient, LlmError};
use crate::actors::prompts::fill;
use crate::config::{EvalSettings, LlmSettings};

const PROMPT: &str = include_str!("judge.txt");

#[derive(Clone)]
pub struct Judge {
    llm: LlmClient,
}

impl Judge {
    /// The judge endpoint: `eval.judge_*` where set, else the pipeline's own LLM settings.
    pub fn new(llm: &LlmSettings, eval: &EvalSettings) -> Self {
        let mut settings = llm.clone();
        if !eval.judge_base_url.is_empty() {
            settings.base_url = eval.judge_base_url.clone();
        }
        if !eval.judge_model.is_empty() {
            settings.model = eval.judge_model.clone();
        }
        if !eval.judge_api_key_env.is_empty() {
            settings.api_key_env = eval.judge_api_key_env.clone();
        }
        // Room for a judge that explains before it says Yes or No; a reply cut even so is kept as cut.
        settings.max_tokens = 256;
        settings.temperature = 0.0;
        Judge { llm: LlmClient::new(settings).for_stage("judge") }
    }

    /// True when the judge says the prediction implies the gold answer or one of its aliases.
    pub async fn implies(&self, question: &str, prediction: &str, labels: &[String]) -> Result<bool, LlmError> {
        let Some(answer) = gold_text(labels) else { return Ok(false) };
        let prompt = fill(PROMPT, &[("question", question), ("prediction", prediction), ("answer", &answer)]);
        let reply = self.llm.text("", &prompt).await?.value;
        match crate::eval::score::polarity(&reply) {
            Some(verdict) => Ok(verdict),
            None => {
                tracing::warn!(reply = %reply.chars().take(200).collect::<String>(), "the judge said neither yes nor no");
                Ok(false)
            }
        }
    }
}

/// The gold answer as the judge reads it: the answer, then its aliases ("Spurs (also given as:
/// Tottenham Hotspur)"). None without a non-empty label.
pub fn gold_text(labels: &[String]) -> Option<String> {
    let mut labels = labels.iter().map(|l| l.trim()).filter(|l| !l.is_empty());
    let first = labels.next()?;
    let aliases: Vec<&str> = labels.collect();
    Some(if aliases.is_empty() {
        first.to_string()
    } else {
        format!("{first} (also given as: {})", aliases.join("; "))
    })
}

#[cfg(test)]
mod tests {
    use super::gold_text;

    #[test]
    fn the_judge_sees_every_gold_label() {
        // MuSiQue lists aliases; the judge used to see only the first.
        let labels = ["Nightwing".to_string(), "Dick Grayson".to_string(), " ".to_string()];
        assert_eq!(gold_text(&labels).unwrap(), "Nightwing (also given as: Dick Grayson)");
        assert_eq!(gold_text(&["Spurs".to_string()]).unwrap(), "Spurs");
        assert_eq!(gold_text(&[]), None);
    }
}
