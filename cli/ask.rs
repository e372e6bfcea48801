//! `lacuna ask "QUESTION"`: one question through the whole loop, printed for a person (or `--json`).

use clap::Args;

use crate::config::Settings;
use crate::pipelines::input::{Input, InputReader};
use crate::pipelines::parts::{Parts, check_llm};
use crate::pipelines::{Pipeline, PipelineKind};
use crate::topics::{AnswerRecord, Answered, FactSource, TraceKind};

#[derive(Args)]
pub struct AskArgs {
    question: String,
    /// Print the full answer record, trace included, as JSON.
    #[arg(long)]
    json: bool,
    /// Which method answers.
    #[arg(long, default_value = "migres")]
    pipeline: PipelineKind,
    /// Answer repeated LLM calls from the response cache (llm.cache_dir): asking the same question
    /// again with the same settings costs no LLM time.
    #[arg(long)]
    llm_cache: bool,
}

pub async fn ask(settings: &Settings, args: AskArgs) -> anyhow::Result<()> {
    let mut settings = settings.clone();
    settings.llm.cache |= args.llm_cache;
    let settings = &settings;
    let question = match InputReader::new(settings.run.max_question_chars).question("ask-1".into(), args.question) {
        Input::Question(question) => question,
        Input::Rejected(error) => anyhow::bail!("{}", error.message),
    };
    let parts = Parts::load(settings, args.pipeline)?;
    let parts = parts.with_served_model(check_llm(settings).await.map_err(anyhow::Error::msg)?);
    let mut pipeline = Pipeline::start(args.pipeline, settings, parts).await?;
    let record = pipeline.ask(question).await?;
    pipeline.stop();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&crate::topics::VersionedAnswer::from(record))?);
        return Ok(());
    }
    match record {
        AnswerRecord::Answered(answer) => print_answer(&answer),
        AnswerRecord::Error(error) => anyhow::bail!("{} failed ({}): {}", error.stage, error.error_type, error.message),
    }
    Ok(())
}

fn print_answer(a: &Answered) {
    let fanned_out = a.trace.iter().any(|s| matches!(s.kind, TraceKind::FannedOut { .. }));
    if fanned_out {
        for line in tree_lines(a) {
            println!("{line}");
        }
    } else {
        for line in iteration_lines(a) {
            println!("{line}");
        }
    }
    println!();
    println!("Answer: {}  (confidence {}/5, {:?})", a.answer, a.confidence, a.outcome);
    println!("Explanation: {}", a.explanation);
    println!("Facts:");
    for (n, fact) in a.facts.iter().enumerate() {
        let label = match fact.source {
            FactSource::Verified => format!("cites {}", fact.citations.join(", ")),
            FactSource::ModelKnowledge => "model knowledge, unverified".to_string(),
        };
        println!("  [{}] {} ({label})", n + 1, fact.text);
    }
    if !a.passages.is_empty() {
        println!("Passages:");
        for p in &a.passages {
            println!("  {} ({}): {}", p.id, p.title, p.text);
        }
    }
    if !a.candidates.is_empty() {
        println!("Candidates (one per trajectory):");
        for c in &a.candidates {
            let scored = c.logprobs.as_ref().map_or("no logprobs".to_string(), |l| format!("log p = {:.2}", l.sum));
            println!("  {} [{}]: {} ({scored}) via {}", c.node.path_text(), c.node.key(), c.answer, c.explanation);
        }
    }
    let u = &a.usage;
    let cost = if u.cost > 0.0 { format!(", cost {:.6}", u.cost) } else { String::new() };
    println!(
        "LLM calls: {}, tokens: {} prompt ({} cached) + {} completion{cost}",
        u.llm_calls, u.prompt_tokens, u.cached_tokens, u.completion_tokens
    );
    if let Some(trace_id) = a.provenance.as_ref().and_then(|p| p.trace_id.as_deref()) {
        println!("Trace: {trace_id}");
    }
}

/// For pipelines that fan out: each split with its children, and what each child answered.
pub fn tree_lines(a: &Answered) -> Vec<String> {
    let mut lines = Vec::new();
    for step in &a.trace {
        match &step.kind {
            TraceKind::FannedOut { children } => {
                lines.push(format!("{} split into:", step.stage));
                lines.extend(children.iter().map(|(key, text)| format!("  {key}: {text}")));
            }
            TraceKind::Joined { answers, missing, .. } => {
                lines.extend(answers.iter().map(|(key, answer)| format!("  {key} answered: {answer}")));
                lines.extend(missing.iter().map(|key| format!("  {key} did not return by the deadline")));
            }
            _ => {}
        }
    }
    lines
}

/// One line per iteration: its queries, what was shown, what was kept, what main decided.
pub fn iteration_lines(a: &Answered) -> Vec<String> {
    (1..=a.iterations)
        .map(|iteration| {
            let steps = a.trace.iter().filter(|s| s.iteration == iteration);
            let (mut queries, mut shown, mut kept, mut dropped, mut decision) = (Vec::new(), 0, 0, 0, String::new());
            for step in steps {
                match &step.kind {
                    TraceKind::Retrieved { query, .. } => queries.push(format!("{query:?}")),
                    TraceKind::SentencesKept { .. } => shown += 1,
                    TraceKind::KnowledgePrompted { .. } => decision.push_str("knowledge prompted; "),
                    TraceKind::FactKept { .. } => kept += 1,
                    TraceKind::FactDropped { .. } => dropped += 1,
                    TraceKind::ReadFirst { answer, went_on, .. } => decision.push_str(&match went_on.is_empty() {
                        true => format!("read once: {answer}"),
                        false => format!("read once: {answer}, went on ({}); ", went_on.join(", ")),
                    }),
                    TraceKind::OneShotOrLoop { chosen, .. } => decision.push_str(&format!("; kept: {chosen}")),
                    TraceKind::Decision { answerable, answer, forced, held_back, .. } => {
                        if !decision.is_empty() && !decision.ends_with("; ") {
                            decision.push_str("; ");
                        }
                        decision.push_str(&match (answerable, forced, held_back) {
                            (_, true, _) => format!("answered at the limit: {answer}"),
                            (true, false, _) => format!("answered: {answer}"),
                            (false, false, Some(reason)) => format!("{answer} held back ({reason})"),
                            (false, false, None) => "unanswerable".to_string(),
                        })
                    }
                    _ => {}
                }
            }
            format!(
                "iteration {iteration}: queries {}; {shown} passages passed the filter; {kept} facts kept, {dropped} dropped; {}",
                queries.join(", "),
                if decision.is_empty() { "main skipped (no new fact)".to_string() } else { decision }
            )
        })
        .collect()
}
