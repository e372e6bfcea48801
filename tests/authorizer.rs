//! The pipeline on Apache Kafka with its security on: clients over SASL_SSL with SCRAM-SHA-512,
//! every request through the StandardAuthorizer, and every process a principal of its own with
//! exactly the ACLs `lacuna acls` lists for it (docs/kafka.md's table). A stage the cluster does
//! not grant a rule stays unready and names the rule, and the questions wait for it.

mod support;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use lacuna::pipelines::PipelineKind;
use support::cluster::{Cluster, OwnBroker, answer_ids, settings, write_questions};
use support::disrupted::answering_llm;
use support::fake_llm::FakeLlm;

/// One rule of each kind a stage needs, each withheld from another stage: Read on an input topic,
/// Write on an output topic, Read on its group, Read on the groups it keeps notes in (prefixed), and
/// Write on its transactional ids (prefixed). As (stage, resource, pattern, name, operation).
fn withheld(prefix: &str) -> Vec<(&'static str, &'static str, &'static str, String, &'static str)> {
    vec![
        ("retrieve", "TOPIC", "LITERAL", format!("{prefix}questions"), "READ"),
        ("sentence_filter", "TOPIC", "LITERAL", format!("{prefix}evidence"), "WRITE"),
        ("leaf", "GROUP", "LITERAL", format!("{prefix}leaf"), "READ"),
        ("verify", "GROUP", "PREFIXED", format!("{prefix}verify."), "READ"),
        ("main", "TRANSACTIONAL_ID", "PREFIXED", format!("{prefix}main."), "WRITE"),
    ]
}

/// `lacuna ARGS` on the secure node as `User:admin`, with the test's topic prefix; its stdout.
fn lacuna_as_admin(broker: &OwnBroker, prefix: &str, args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_lacuna"))
        .args(args)
        .env("LACUNA__KAFKA__BROKERS", broker.address())
        .env("LACUNA__KAFKA__TOPIC_PREFIX", prefix)
        .env("LACUNA__KAFKA__PARTITIONS", "4")
        .env("LACUNA__KAFKA__PROPERTIES", format!("{};sasl.username=admin", broker.sasl_properties()))
        .env("LACUNA__KAFKA__SECRET_PROPERTIES", "sasl.password=LACUNA_TEST_SASL_PASSWORD")
        .env("LACUNA_TEST_SASL_PASSWORD", "admin-secret")
        .output()
        .unwrap();
    assert!(output.status.success(), "lacuna {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn every_process_runs_with_exactly_its_acls_and_a_stage_lacking_one_waits_unready_naming_it() {
    let stages: Vec<&str> = PipelineKind::Migres.stages().iter().map(|s| s.name).collect();
    let users: Vec<&str> = stages.iter().copied().chain(["submit", "answers"]).collect();
    let broker = OwnBroker::start_secure(&users);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let llm = runtime.block_on(FakeLlm::start(answering_llm()));
    let mut settings = settings("authorizer", &llm.base_url);
    settings.kafka.brokers = broker.address();
    let prefix = settings.kafka.topic_prefix.clone();

    // The pipeline's topics, created by the admin; then every process's table but the withheld rules.
    lacuna_as_admin(&broker, &prefix, &["topics"]);
    let only = users.join(",");
    let table = lacuna_as_admin(&broker, &prefix, &["acls", "--only", &only]);
    let withheld = withheld(&prefix);
    let lines: Vec<String> = withheld
        .iter()
        .map(|(stage, resource, pattern, name, operation)| {
            format!("User:{stage} {resource} {pattern} {name} {operation}")
        })
        .collect();
    for line in &lines {
        assert!(table.lines().any(|l| l == line), "`lacuna acls` lists {line}:\n{table}");
    }
    let granted: Vec<&str> = table.lines().filter(|l| !lines.iter().any(|w| w == l)).collect();
    broker.acls("add", &granted.join("\n"));

    let cluster = Cluster::start_secure(&settings, &llm.base_url, broker.sasl_properties());
    let dir = support::scratch_dir("authorizer");
    let (questions, answers) = (dir.join("questions.jsonl"), dir.join("answers.jsonl"));
    let _ = std::fs::remove_file(&answers);
    let count = 20;
    let expected = write_questions(&questions, count);
    let mut sink = cluster.sink(&answers, count, 240);
    let status = cluster.command(&["submit", "--questions", questions.to_str().unwrap()]).status().unwrap();
    assert!(status.success(), "submit, as User:submit");

    // Each stage that lacks a rule says which, in its metrics (and its log), and stays unready.
    let started = Instant::now();
    for (stage, resource, pattern, name, operation) in &withheld {
        let series = format!(
            "lacuna_kafka_missing_acls{{name=\"{name}\",operation=\"{operation}\",principal=\"User:{stage}\",resource=\"{resource}\",stage=\"{stage}\"}} 1"
        );
        while !cluster.metrics(stage).is_some_and(|text| text.lines().any(|l| l == series)) {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "{stage} names {operation} on {resource} {name} ({pattern})"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        assert!(!cluster.ready(stage), "{stage} is unready while it lacks {operation} on {name}");
    }
    assert!(cluster.ready("query_gen"), "the stage that has all its rules is ready");
    assert!(answer_ids(&answers).is_empty(), "nothing is answered while the first stage cannot read");

    // Granted, every stage starts, and every question ends in its answer, once.
    broker.acls("add", &lines.join("\n"));
    let status = sink.wait().unwrap();
    assert!(status.success(), "the sink, as User:answers, had every answer");
    let written = answer_ids(&answers);
    assert_eq!(written.iter().cloned().collect::<BTreeSet<_>>(), expected, "no question lost");
    assert_eq!(written.len(), count, "one record each");
    for stage in &stages {
        assert!(cluster.ready(stage), "{stage} ready once granted");
    }
}
