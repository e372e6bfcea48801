//! Entailment check for the verify stage: does a cited passage entail a fact?
//! Default: the LLM as a judge (no NLI model is obtainable offline). Production: any ONNX
//! sequence-classification NLI model, with the index of its entailment label configured.

use std::sync::Arc;

use super::call_stats::CallStats;
use super::llm::{LlmClient, LlmError};
use super::onnx::{ModelError, PairClassifier};
use super::schema::Schema;
use crate::actors::prompts;
use crate::config::{EntailmentPrompt, NliSettings, OnnxSettings};
use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum NliError {
    #[error(transparent)]
    Llm(#[from] LlmError),
    #[error(transparent)]
    Model(#[from] ModelError),
}

#[derive(Clone, Debug)]
pub struct Verdict {
    pub entailed: bool,
    /// Set when an LLM call made the judgement, so the question's usage counts it.
    pub llm_call: Option<CallStats>,
}

#[derive(Clone)]
pub enum Nli {
    /// The LLM with one of the two entailment prompts (`nli.entailment_prompt`).
    LlmJudge(LlmClient, EntailmentPrompt),
    Onnx(OnnxNli),
}

impl Nli {
    pub async fn judge(&self, premise: &str, hypothesis: &str) -> Result<Verdict, NliError> {
        match self {
            Nli::LlmJudge(llm, prompt) => judge_with_llm(llm, *prompt, premise, hypothesis).await,
            Nli::Onnx(model) => Ok(Verdict { entailed: model.entails(premise, hypothesis).await?, llm_call: None }),
        }
    }
}

#[derive(Deserialize, JsonSchema)]
struct JudgeAnswer {
    entailed: bool,
}

async fn judge_with_llm(
    llm: &LlmClient,
    prompt: EntailmentPrompt,
    premise: &str,
    hypothesis: &str,
) -> Result<Verdict, NliError> {
    let schema = Schema::of::<JudgeAnswer>("entailment");
    let template = match prompt {
        EntailmentPrompt::Strict => prompts::ENTAILMENT,
        EntailmentPrompt::Lenient => prompts::ENTAILMENT_LENIENT,
    };
    let user = prompts::fill(template, &[("premise", premise), ("hypothesis", hypothesis)]);
    let answer = llm.structured::<JudgeAnswer>(prompts::SYSTEM, &user, &schema).await?;
    Ok(Verdict { entailed: answer.value.entailed, llm_call: Some(answer.stats) })
}

#[derive(Clone)]
pub struct OnnxNli {
    model: Arc<PairClassifier>,
    entailment_label: usize,
}

impl OnnxNli {
    pub fn load(settings: &NliSettings, onnx: &OnnxSettings) -> Result<Self, ModelError> {
        let model = PairClassifier::load("nli", &settings.model, onnx)?;
        Ok(OnnxNli { model: Arc::new(model), entailment_label: settings.entailment_label })
    }

    /// Entailed when the entailment label has the highest logit (premise first, as NLI models expect).
    pub async fn entails(&self, premise: &str, hypothesis: &str) -> Result<bool, ModelError> {
        let rows = self.model.classify(vec![(premise.to_string(), hypothesis.to_string())]).await?;
        let row = rows.into_iter().next().unwrap_or_default();
        let Some(best) = argmax(&row) else {
            return Err(ModelError::Inference("NLI model returned no logits".into()));
        };
        if self.entailment_label >= row.len() {
            return Err(ModelError::Inference(format!(
                "entailment_label {} but the model has {} labels",
                self.entailment_label,
                row.len()
            )));
        }
        Ok(best == self.entailment_label)
    }
}

fn argmax(row: &[f32]) -> Option<usize> {
    row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i)
}
