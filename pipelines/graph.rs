//! The topology of a pipeline, read off its declaration: the checks that every topic has both ends,
//! and `lacuna graph`'s renderings (text, Mermaid, DOT, and the chart's stage lists).

use std::collections::BTreeSet;
use std::fmt::Write;

use crate::pipelines::declaration::{Replicas, StageDecl};
use crate::pipelines::kind::PipelineKind;
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

/// One line per stage: `name: inputs -> outputs`, then the pipeline's sources and sinks.
pub fn text(kind: PipelineKind) -> String {
    let stages = kind.stages();
    let width = stages.iter().map(|s| s.name.len()).max().unwrap_or(0);
    let list = |topics: &[Topic]| topics.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ");
    let mut out = format!("{kind}\n");
    for stage in stages {
        let one = if stage.replicas == Replicas::One { "  (one replica)" } else { "" };
        let _ = writeln!(out, "  {:width$}  {} -> {}{one}", stage.name, list(stage.inputs), list(stage.outputs));
    }
    let _ = writeln!(out, "  in: {}; out: {}", list(&SOURCES), list(&SINKS));
    out
}

/// One edge of the graph: `from` and `to` are stage names, or the topic's own name for a source, a
/// sink or a table.
struct Edge {
    from: String,
    topic: Topic,
    to: String,
}

impl Edge {
    /// Whether one end is the topic itself rather than a stage.
    fn is_outside(&self) -> bool {
        self.from == self.topic.name() || self.to == self.topic.name()
    }
}

/// The edges of the graph in declaration order.
fn edges(stages: &[StageDecl]) -> Vec<Edge> {
    let readers = |topic: Topic| stages.iter().filter(move |s| s.inputs.contains(&topic)).map(|s| s.name.to_string());
    let mut edges: Vec<Edge> = SOURCES
        .iter()
        .flat_map(|&topic| readers(topic).map(move |to| Edge { from: topic.name().to_string(), topic, to }))
        .collect();
    for stage in stages {
        for &topic in stage.outputs {
            let to: Vec<String> = readers(topic).collect();
            if to.is_empty() {
                // A sink, or a table its writer reads back on start.
                edges.push(Edge { from: stage.name.to_string(), topic, to: topic.name().to_string() });
            }
            edges.extend(to.into_iter().map(|to| Edge { from: stage.name.to_string(), topic, to }));
        }
    }
    edges
}

/// The topics drawn as nodes of their own (sources, sinks, tables), in the order the edges meet them.
fn topic_nodes(edges: &[Edge]) -> Vec<Topic> {
    let mut nodes: Vec<Topic> = Vec::new();
    for edge in edges.iter().filter(|e| e.is_outside()) {
        if !nodes.contains(&edge.topic) {
            nodes.push(edge.topic);
        }
    }
    nodes
}

/// A Mermaid flowchart: stages as boxes, topics as the labels of the edges, sources and sinks as
/// rounded nodes, tables as cylinders.
pub fn mermaid(kind: PipelineKind) -> String {
    let edges = edges(kind.stages());
    let mut out = String::from("flowchart LR\n");
    for topic in topic_nodes(&edges) {
        let name = topic.name();
        let shape = if topic.is_table() { format!("[({name})]") } else { format!("([{name}])") };
        let _ = writeln!(out, "  {name}{shape}");
    }
    for edge in &edges {
        let (from, to) = (&edge.from, &edge.to);
        if edge.is_outside() {
            let _ = writeln!(out, "  {from} --> {to}");
        } else {
            let _ = writeln!(out, "  {from} -- {} --> {to}", edge.topic.name());
        }
    }
    out
}

/// The same graph in Graphviz DOT.
pub fn dot(kind: PipelineKind) -> String {
    let edges = edges(kind.stages());
    let mut out = format!("digraph \"{kind}\" {{\n  rankdir=LR;\n  node [shape=box];\n");
    for topic in topic_nodes(&edges) {
        let shape = if topic.is_table() { "cylinder" } else { "ellipse" };
        let _ = writeln!(out, "  \"{}\" [shape={shape}];", topic.name());
    }
    for edge in &edges {
        let (from, to) = (&edge.from, &edge.to);
        if edge.is_outside() {
            let _ = writeln!(out, "  \"{from}\" -> \"{to}\";");
        } else {
            let _ = writeln!(out, "  \"{from}\" -> \"{to}\" [label=\"{}\"];", edge.topic.name());
        }
    }
    out.push_str("}\n");
    out
}

/// What the Helm chart needs to know of every pipeline, as the YAML of `helm/lacuna/pipelines.yaml`:
/// its stages, those that run as one replica, and its topics. The chart test fails when the
/// committed file differs from this.
pub fn helm_values() -> String {
    let mut out = String::from(
        "# Generated by `lacuna graph --format helm > helm/lacuna/pipelines.yaml` from the pipelines'\n\
         # declarations (pipelines/*.rs); do not edit. The chart test fails when it is stale.\n",
    );
    let list = |items: Vec<&str>| format!("[{}]", items.join(", "));
    for kind in PipelineKind::ALL {
        let stages = kind.stages();
        let _ = writeln!(out, "{}:", kind.name());
        let _ = writeln!(out, "  stages: {}", list(stages.iter().map(|s| s.name).collect()));
        let singletons = stages.iter().filter(|s| s.replicas == Replicas::One).map(|s| s.name).collect();
        let _ = writeln!(out, "  singletons: {}", list(singletons));
        let _ = writeln!(out, "  topics: {}", list(topics(stages).iter().map(|t| t.name()).collect()));
    }
    out
}

/// Every pipeline's declaration as JSON, for tools (the chart test reads it).
pub fn json() -> serde_json::Value {
    let names = |topics: &[Topic]| topics.iter().map(|t| t.name()).collect::<Vec<_>>();
    let pipelines = PipelineKind::ALL.map(|kind| {
        let stages = kind.stages().iter().map(|s| {
            serde_json::json!({
                "name": s.name,
                "inputs": names(s.inputs),
                "outputs": names(s.outputs),
                "needs": s.needs.iter().map(|p| p.name()).collect::<Vec<_>>(),
                "one_replica": s.replicas == Replicas::One,
            })
        });
        (
            kind.name().to_string(),
            serde_json::json!({ "stages": stages.collect::<Vec<_>>(), "topics": names(&topics(kind.stages())) }),
        )
    });
    serde_json::Value::Object(pipelines.into_iter().collect())
}
