//! The topology of a pipeline, read off its declaration: the topics it uses and the checks that every
//! topic has both ends. `render` draws it for `lacuna graph`.

use std::collections::BTreeSet;

use crate::pipelines::declaration::StageDecl;
use crate::topics::Topic;

/// Topics written from outside the pipeline: `lacuna submit`, `run`, `ask` and `eval` publish questions.
pub const SOURCES: [Topic; 1] = [Topic::Questions];

/// Topics read from outside the pipeline: the answer sink, `lacuna dlq`, and `lacuna serve`'s
/// progress feed (every stage may write it, best-effort, so no stage lists it).
pub const SINKS: [Topic; 3] = [Topic::Answers, Topic::DeadLetters, Topic::Progress];

/// Every topic a pipeline uses, in [`Topic::ALL`] order: what `lacuna topics` creates.
pub fn topics(stages: &[StageDecl]) -> Vec<Topic> {
    let used: BTreeSet<Topic> = stages
        .iter()
        .flat_map(|s| s.inputs.iter().chain(s.outputs))
        .chain(SOURCES.iter().chain(&SINKS))
        .copied()
        .collect();
    Topic::ALL.into_iter().filter(|t| used.contains(t)).collect()
}

/// What is wrong with a pipeline's wiring, one line per problem; empty when it is sound:
/// - every stage name is unique;
/// - every consumed topic has a producer (a stage, or a source);
/// - every produced topic has a consumer, or is a sink, or is a table its writer reads back;
/// - no topic has two consuming stages (each topic is one edge: two consumers would split its events).
pub fn problems(stages: &[StageDecl]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut names = BTreeSet::new();
    for stage in stages {
        if !names.insert(stage.name) {
            problems.push(format!("stage {} is declared twice", stage.name));
        }
    }
    let produced: BTreeSet<Topic> = stages.iter().flat_map(|s| s.outputs).copied().chain(SOURCES).collect();
    let consumed: BTreeSet<Topic> = stages.iter().flat_map(|s| s.inputs).copied().collect();
    for stage in stages {
        for topic in stage.inputs.iter().filter(|t| !produced.contains(t)) {
            problems.push(format!("{} consumes {}, which nothing produces", stage.name, topic.name()));
        }
        for topic in stage.outputs {
            if !consumed.contains(topic) && !SINKS.contains(topic) && !topic.is_table() {
                problems.push(format!("{} produces {}, which nothing consumes", stage.name, topic.name()));
            }
        }
    }
    for topic in &consumed {
        let readers: Vec<&str> = stages.iter().filter(|s| s.inputs.contains(topic)).map(|s| s.name).collect();
        if readers.len() > 1 {
            problems.push(format!("{} has several consumers: {}", topic.name(), readers.join(", ")));
        }
    }
    problems
}
