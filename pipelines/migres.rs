//! The MIGRES pipeline (paper 000):
//!
//! questions -> retrieve -> passages -> sentence_filter -> evidence -> leaf -> facts -> verify -> verified -> main -> answers
//! and main -> missing -> query_gen -> queries -> retrieve, until an answer or T iterations.

use crate::actors::runner::Stage;
use crate::actors::stages::leaf::Leaf;
use crate::actors::stages::main::Main;
use crate::actors::stages::query_gen::QueryGen;
use crate::actors::stages::sentence_filter::FilterMode;
use crate::actors::stages::verify::Verify;
use crate::config::StageSettings;
use crate::pipelines::declaration::{Replicas, StageDecl, Startable, retrieve, sentence_filter};
use crate::pipelines::parts::Part;
use crate::topics::Topic;

/// The MIGRES stages, in the order of the loop.
pub const STAGES: &[StageDecl] = &[
    // Loop queries first: questions already in flight finish before new ones start.
    retrieve(&[Topic::Queries, Topic::Questions]),
    // With `migres.read_first`, the first iteration's read can answer the question here.
    StageDecl {
        outputs: &[Topic::Evidence, Topic::Answers],
        ..sentence_filter(|s| s.sentence_filter(FilterMode::MIGRES, s.settings.migres.top_k))
    },
    StageDecl::llm::<Leaf>(&[Topic::Evidence], &[Topic::Facts], |s| Ok(Startable::new(Leaf::new(s.llm())))),
    StageDecl {
        name: Verify::NAME,
        prompts: Verify::prompts,
        inputs: &[Topic::Facts],
        outputs: &[Topic::Verified],
        // The LLM judges entailment unless nli.backend = "onnx".
        needs: &[Part::Llm, Part::Nli],
        replicas: Replicas::Scaled,
        runs: StageSettings::LLM,
        build: |s| {
            let nli = &s.settings.nli;
            Ok(Startable::new(
                Verify::new(s.nli())
                    .with_recite_uncited(nli.recite_uncited)
                    .with_calls(nli.calls)
                    .with_quote_match(nli.quote_match)
                    .with_unjudged(nli.unjudged),
            ))
        },
    },
    StageDecl::llm::<Main>(&[Topic::Verified], &[Topic::Answers, Topic::Missing], |s| {
        Ok(Startable::new(Main::new(s.llm(), s.settings.migres.clone())))
    }),
    // With no new query to write, the question goes back to main to be answered (`verified`).
    StageDecl::llm::<QueryGen>(&[Topic::Missing], &[Topic::Queries, Topic::Verified], |s| {
        Ok(Startable::new(QueryGen::new(s.llm(), s.settings.migres.clone())))
    }),
];
