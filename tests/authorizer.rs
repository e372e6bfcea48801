//! The pipeline on Apache Kafka with its security on: clients over SASL_SSL with SCRAM-SHA-512,
//! every request through the StandardAuthorizer, and every process a principal of its own with
//! exactly the ACLs `lacuna acls` lists for it (docs/kafka.md's table). A stage the cluster does
//! not grant a rule stays unready and names the rule, and the questions wait for it.

mod support;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use lacuna::pipelines::PipelineKind;
use support::cluster::{Cluster, OwnBroker, answer_ids, as_principal, get, raw_answer_keys, settings};
use support::disrupted::{answering_llm, submit, wait_for_answers};
use support::fake_llm::{FakeLlm, Prompt, Reply, prompt_kind};

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

/// `lacuna ARGS` on the secure node as `User:user` (password `<user>-secret`), with the test's
/// topic prefix and the settings in `env`, not yet run.
fn lacuna_as(broker: &OwnBroker, prefix: &str, user: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lacuna"));
    command
        .args(args)
        .env("LACUNA__KAFKA__BROKERS", broker.address())
        .env("LACUNA__KAFKA__TOPIC_PREFIX", prefix)
        .env("LACUNA__KAFKA__PARTITIONS", "4")
        .envs(env.iter().copied());
    as_principal(&mut command, &broker.sasl_properties(), user);
    command
}

/// `lacuna ARGS` on the secure node as `User:admin`, with the test's topic prefix; its stdout.
fn lacuna_as_admin(broker: &OwnBroker, prefix: &str, args: &[&str]) -> String {
    admin_with(broker, prefix, args, &[])
}

/// [`lacuna_as_admin`] with the settings in `env`.
fn admin_with(broker: &OwnBroker, prefix: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let output = lacuna_as(broker, prefix, "admin", args, env).output().unwrap();
    assert!(output.status.success(), "lacuna {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

/// One secure node with a user per process, the fake LLM answering with `script`, the pipeline's
/// topics made by the admin, and the table `lacuna acls` prints for every process.
struct Secure {
    broker: OwnBroker,
    llm: FakeLlm,
    settings: lacuna::config::Settings,
    stages: Vec<&'static str>,
    table: String,
    _runtime: tokio::runtime::Runtime,
}

impl Secure {
    fn start(test: &str, script: impl Fn(&str) -> Reply + Send + Sync + 'static) -> Secure {
        let stages: Vec<&str> = PipelineKind::Migres.stages().iter().map(|s| s.name).collect();
        let users: Vec<&str> = stages.iter().copied().chain(["submit", "answers"]).collect();
        let broker = OwnBroker::start_secure(&users);
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let llm = runtime.block_on(FakeLlm::start(script));
        let mut settings = settings(test, &llm.base_url);
        settings.kafka.brokers = broker.address();
        let prefix = settings.kafka.topic_prefix.clone();
        lacuna_as_admin(&broker, &prefix, &["topics"]);
        let table = lacuna_as_admin(&broker, &prefix, &["acls", "--only", &users.join(",")]);
        Secure { broker, llm, settings, stages, table, _runtime: runtime }
    }

    /// The answers topic's keys, read `read_committed` as the admin.
    fn raw_answer_keys(&self) -> Vec<String> {
        let mut settings = self.settings.clone();
        settings.kafka.properties = self.broker.sasl_properties().split(';').map(String::from).collect();
        settings.kafka.properties.extend(["sasl.username=admin".into(), "sasl.password=admin-secret".into()]);
        raw_answer_keys(&settings, "read_committed")
    }
}

/// One test at a time: each starts a node and eight processes on two cores.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[test]
fn every_process_runs_with_exactly_its_acls_and_a_stage_lacking_one_waits_unready_naming_it() {
    let _serial = serial();
    let secure = Secure::start("authorizer", answering_llm());
    let (broker, settings, table, stages) = (&secure.broker, &secure.settings, &secure.table, &secure.stages);
    let prefix = settings.kafka.topic_prefix.clone();
    // Every process's table but the withheld rules.
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

    let mut cluster = Cluster::start_secure(settings, &secure.llm.base_url, broker.sasl_properties());
    let count = 20;
    let (expected, answers) = submit(&mut cluster, "authorizer", count, 240);

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
    // The stage that has all its rules becomes ready (in its own time: CI once asked while its
    // transactional id's coordinator was still loading).
    cluster.wait_ready("query_gen", Duration::from_secs(60));
    assert!(answer_ids(&answers).is_empty(), "nothing is answered while the first stage cannot read");

    // Granted, every stage starts, and every question ends in its answer, once.
    broker.acls("add", &lines.join("\n"));
    let status = cluster.wait_sink();
    assert!(status.success(), "the sink, as User:answers, had every answer");
    let written = answer_ids(&answers);
    assert_eq!(written.iter().cloned().collect::<BTreeSet<_>>(), expected, "no question lost");
    assert_eq!(written.len(), count, "one record each");
    for stage in stages {
        cluster.wait_ready(stage, Duration::from_secs(30));
    }
}

/// Issue 74's denied topic: the leaf loses Write on `facts` while it works, and gets it back. Each
/// question the leaf could not send on ends in one `publish_rejected` error record (the broker
/// refuses, a retry in the same transaction cannot help), the rest in their answers; none is lost
/// and no answer record repeats.
#[test]
fn a_topic_denied_while_a_stage_works_ends_each_question_once_and_loses_none() {
    let _serial = serial();
    // The leaf is the slow stage, so it has work in flight when its Write goes.
    let script = answering_llm();
    let secure = Secure::start("denied-topic", move |prompt| match prompt_kind(prompt) {
        Prompt::Leaf => Reply::Delayed(Duration::from_millis(1500), Box::new(script(prompt))),
        _ => script(prompt),
    });
    let (broker, settings) = (&secure.broker, &secure.settings);
    broker.acls("add", &secure.table);
    let mut cluster = Cluster::start_secure(settings, &secure.llm.base_url, broker.sasl_properties());
    let count = 40;
    let (expected, answers) = submit(&mut cluster, "denied-topic", count, 180);
    wait_for_answers(&answers, count / 4);
    let denied = format!("User:leaf TOPIC LITERAL {}facts WRITE", settings.kafka.topic_prefix);
    broker.acls("remove", &denied);
    std::thread::sleep(Duration::from_secs(6));
    broker.acls("add", &denied);

    let status = cluster.wait_sink();
    assert!(status.success(), "every question ended");
    let written = answer_ids(&answers);
    assert_eq!(written.iter().cloned().collect::<BTreeSet<_>>(), expected, "no question lost");
    let keys = secure.raw_answer_keys();
    assert_eq!(keys.len(), count, "one committed record a question on the answers topic: {keys:?}");
    let records = std::fs::read_to_string(&answers).unwrap();
    let rejected = records.lines().filter(|line| line.contains("publish_rejected")).count();
    eprintln!("denied topic: {rejected} of {count} questions ended in publish_rejected");
    assert!(rejected > 0, "the leaf published while it was denied");
}

/// The corpus's writer and `lacuna serve` over Kafka, each its own principal with exactly the
/// rules `lacuna acls` lists for it, on the topics `lacuna topics` made (the corpus followed):
/// `lacuna ingest` publishes its documents, and serve becomes ready. Neither may create topics,
/// and Kafka refuses CreateTopics to such a principal whether the topic exists or not.
#[test]
fn ingest_and_serve_run_with_exactly_their_acls() {
    let _serial = serial();
    let broker = OwnBroker::start_secure(&["ingest", "serve"]);
    let (prefix, follow) = ("corpus-acls.", [("LACUNA__SEARCH__FOLLOW_DOCUMENTS", "true")]);
    admin_with(&broker, prefix, &["topics"], &follow);
    broker.acls("add", &admin_with(&broker, prefix, &["acls", "--only", "ingest,serve"], &follow));

    let documents = std::env::temp_dir().join(format!("lacuna-corpus-acls-{}.jsonl", std::process::id()));
    let lines =
        ["{\"id\":\"a\",\"title\":\"A\",\"text\":\"One.\"}", "{\"id\":\"b\",\"title\":\"B\",\"text\":\"Two.\"}"];
    std::fs::write(&documents, lines.join("\n") + "\n").unwrap();
    let args = ["ingest", "--transport", "kafka", documents.to_str().unwrap()];
    let output = lacuna_as(&broker, prefix, "ingest", &args, &follow).output().unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success() && said.contains("published 2 documents"), "ingest, as User:ingest: {said}");

    let [port] = support::free_ports();
    let listen = format!("127.0.0.1:{port}");
    let args = ["serve", "--transport", "kafka", "--listen", &listen];
    let mut serve = lacuna_as(&broker, prefix, "serve", &args, &follow).spawn().unwrap();
    let started = Instant::now();
    while !get(port, "/readyz").is_some_and(|reply| reply.starts_with("HTTP/1.1 200")) {
        let exited = serve.try_wait().unwrap();
        if exited.is_some() || started.elapsed() > Duration::from_secs(90) {
            let _ = serve.kill();
            panic!("serve, as User:serve, never became ready (exited: {exited:?}); its log is the test's");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    serve.kill().unwrap();
    serve.wait().unwrap();
}
