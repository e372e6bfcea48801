//! The pipelines' declarations are their graphs: every topic a stage reads has a producer, every
//! topic a stage writes has a consumer (or is a sink), every declared stage has its settings, and
//! the diagrams in the docs are what `lacuna graph` prints today.

use lacuna::config::{Settings, StageSettings};
use lacuna::pipelines::declaration::{Replicas, StageDecl, Startable};
use lacuna::pipelines::{PipelineKind, graph};
use lacuna::topics::Topic;

#[test]
fn every_topic_of_every_pipeline_has_both_ends() {
    for kind in PipelineKind::ALL {
        let problems = graph::problems(kind.stages());
        assert!(problems.is_empty(), "{kind}: {problems:#?}");
    }
}

fn never_built(_: &lacuna::pipelines::declaration::StageStart<'_>) -> Result<Startable, lacuna::pipelines::StartError> {
    unreachable!("the topology check builds nothing")
}

const fn decl(name: &'static str, inputs: &'static [Topic], outputs: &'static [Topic]) -> StageDecl {
    StageDecl {
        name,
        inputs,
        outputs,
        needs: &[],
        replicas: Replicas::Scaled,
        runs: StageSettings::LLM,
        build: never_built,
    }
}

#[test]
fn a_miswired_pipeline_is_reported() {
    let stages = [
        decl("first", &[Topic::Questions], &[Topic::Passages]),
        // Nothing writes facts, and nothing reads what this stage writes to `missing`.
        decl("second", &[Topic::Passages, Topic::Facts], &[Topic::Answers, Topic::Missing]),
        decl("third", &[Topic::Passages], &[Topic::Answers]),
    ];
    let problems = graph::problems(&stages);
    assert!(problems.contains(&"second consumes facts, which nothing produces".to_string()), "{problems:?}");
    assert!(problems.contains(&"second produces missing, which nothing consumes".to_string()), "{problems:?}");
    assert!(problems.contains(&"passages has several consumers: second, third".to_string()), "{problems:?}");
    assert_eq!(problems.len(), 3, "{problems:?}");
}

/// A stage runs on the settings its declaration gives, so adding one needs no TOML; a
/// `[stages.NAME]` section changes only the keys it sets, and one for a stage no pipeline has is a
/// typo, refused.
#[test]
fn a_stage_runs_on_its_declared_settings_unless_a_section_overrides_them() {
    let settings = Settings::defaults();
    settings.check_stage_names(PipelineKind::all_stage_names()).unwrap();
    assert!(settings.stages.is_empty(), "config/default.toml needs no [stages.*] section");
    let leaf = PipelineKind::Migres.stage("leaf").unwrap();
    assert_eq!(leaf.settings(&settings), StageSettings { max_in_flight: 8, llm_concurrency: 2 });
    let filter = PipelineKind::Migres.stage("sentence_filter").unwrap();
    assert_eq!(filter.settings(&settings).max_in_flight, 16, "sentence_filter declares its own");

    let overridden = Settings::load_with(None, &["[stages.leaf]\nllm_concurrency = 6".to_string()]).unwrap();
    assert_eq!(leaf.settings(&overridden), StageSettings { max_in_flight: 8, llm_concurrency: 6 });

    let typo = Settings::load_with(None, &["[stages.leef]\nmax_in_flight = 4".to_string()]).unwrap();
    let error = typo.check_stage_names(PipelineKind::all_stage_names()).unwrap_err();
    assert!(error.contains("[stages.leef]: no pipeline has a stage"), "{error}");
}

#[test]
fn unknown_stage_names_are_refused_with_the_list() {
    let error = PipelineKind::Vanilla.stage("leaf").err().expect("vanilla has no leaf").to_string();
    assert_eq!(error, "vanilla has no stage \"leaf\"; its stages are retrieve, sentence_filter, reader");
}

#[test]
fn the_documented_diagrams_are_what_lacuna_graph_prints() {
    let root = env!("CARGO_MANIFEST_DIR");
    let docs = std::fs::read_to_string(format!("{root}/docs/pipelines.md")).unwrap();
    for kind in PipelineKind::ALL {
        let diagram = format!("```mermaid\n{}```", graph::mermaid(kind));
        assert!(
            docs.contains(&diagram),
            "docs/pipelines.md lacks the current graph of {kind}: paste `lacuna graph --pipeline {kind} --format mermaid`"
        );
    }
}

#[test]
fn the_readme_and_the_pipelines_page_show_what_lacuna_graph_prints() {
    let root = env!("CARGO_MANIFEST_DIR");
    let docs = std::fs::read_to_string(format!("{root}/docs/pipelines.md")).unwrap();
    let all: String = PipelineKind::ALL.iter().map(|k| graph::text(*k)).collect();
    assert!(docs.contains(&format!("$ lacuna graph\n{all}```")), "docs/pipelines.md's `lacuna graph` output is stale");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let migres = format!("```mermaid\n{}```", graph::mermaid(PipelineKind::Migres));
    assert!(readme.contains(&migres), "the README's MIGRES diagram is stale");
}

#[test]
fn a_pipeline_creates_only_the_topics_it_uses() {
    let names = |kind: PipelineKind| graph::topics(kind.stages()).iter().map(|t| t.name()).collect::<Vec<_>>();
    assert_eq!(
        names(PipelineKind::Vanilla),
        ["questions", "passages", "evidence", "answers", "dead_letters", "progress"]
    );
    assert!(names(PipelineKind::Raisf).contains(&"join_state"));
    assert!(!names(PipelineKind::Migres).contains(&"joins"));
}

/// Each layer uses only those below it (topics < actors < pipelines < eval < cli): no import circles.
#[test]
fn layers_import_only_downward() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let layers = ["topics", "actors", "pipelines", "eval", "cli"];
    let mut offences = Vec::new();
    for (level, layer) in layers.iter().enumerate() {
        let mut files = vec![root.join(layer)];
        while let Some(path) = files.pop() {
            if path.is_dir() {
                files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let source = std::fs::read_to_string(&path).unwrap();
            for above in &layers[level + 1..] {
                if source.contains(&format!("crate::{above}")) {
                    offences.push(format!("{} uses crate::{above}", path.strip_prefix(root).unwrap().display()));
                }
            }
        }
    }
    assert!(offences.is_empty(), "{offences:#?}");
}
