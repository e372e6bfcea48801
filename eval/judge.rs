//! Acc†: an LLM judges whether the prediction implies the gold answer (MIGRES paper Table 15, its
//! prompt verbatim). As in the MIGRES evaluation, an exact match needs no judge, and yes/no questions
//! are scored on polarity alone (their Acc† equals EM).

use crate::actors::clients::{LlmClient, LlmError};
use crate::actors::prompts::fill;
use crate::settings::{EvalSettings, LlmSettings};

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
        // "Yes" or "No" and maybe a word more.
        settings.max_tokens = 16;
        settings.temperature = 0.0;
        Judge { llm: LlmClient::new(settings).for_stage("judge") }
    }

    /// True when the judge says the prediction implies the gold answer (the first label, as the
    /// paper shows the judge one answer).
    pub async fn implies(&self, question: &str, prediction: &str, labels: &[String]) -> Result<bool, LlmError> {
        if let Some(label) = labels.first() {
            let prompt = fill(PROMPT, &[("question", question), ("prediction", prediction), ("answer", label)]);
            let reply = match self.llm.text("", &prompt).await {
                Ok(reply) => reply.value,
                // A verdict cut at max_tokens still starts with its Yes or No.
                Err(LlmError::BadResponse(message)) if message.contains("cut off") => return Ok(false),
                Err(error) => return Err(error),
            };
            if reply.trim_start().to_lowercase().starts_with("yes") {
                return Ok(true);
            }
        }
        Ok(false)
    }
}
