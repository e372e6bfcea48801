//! A stream of questions through the six `lacuna stage` processes, a disruption once a quarter of
//! them are answered, and what reached the broker: the broker tests' and the failure matrix's
//! harness.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lacuna::config::Settings;
use lacuna::topics::Topic;
use serde_json::json;

use super::cluster::{Cluster, answer_ids, bus, settings, write_questions};
use super::fake_llm::{FakeLlm, Prompt, Reply, prompt_kind};

/// Every question answered at its first iteration, with no facts.
pub fn answering_llm() -> impl Fn(&str) -> Reply {
    |prompt| match prompt_kind(prompt) {
        Prompt::Main => Reply::Json(
            json!({"answerable": true, "answer": "x", "confidence": 3, "explanation": "e", "missing_information": ""}),
        ),
        Prompt::Leaf => Reply::Json(json!({"facts": []})),
        Prompt::Knowledge => Reply::Text("I don't know.".into()),
        _ => Reply::Status(400),
    }
}

/// [`answering_llm`], but the leaf's reply for the question `big` holds one fact of about 420 KB:
/// a record over the `facts` topic's limit once [`shrink_facts`] set it.
pub fn one_fact_too_large(big: String) -> impl Fn(&str) -> Reply + Send + Sync + 'static {
    let answering = answering_llm();
    move |prompt| match prompt_kind(prompt) {
        Prompt::Leaf if prompt.contains(&big) => {
            Reply::Json(json!({"facts": [{"fact": "A fact far too long. ".repeat(20_000), "passages": [1]}]}))
        }
        _ => answering(prompt),
    }
}

/// `facts` takes records of at most 200 KB (`max.message.bytes`).
pub fn shrink_facts(settings: &Settings) {
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        lacuna::topics::kafka::client_config(&settings.kafka).unwrap().create().unwrap();
    let topic = format!("{}facts", settings.kafka.topic_prefix);
    let config = rdkafka::admin::AlterConfig::new(rdkafka::admin::ResourceSpecifier::Topic(&topic))
        .set("max.message.bytes", "200000");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let results = runtime.block_on(admin.alter_configs(&[config], &rdkafka::admin::AdminOptions::new())).unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}

/// [`run_prepared`] with nothing prepared.
pub fn run_disrupted_with(
    test: &str,
    count: usize,
    (script, env): (impl Fn(&str) -> Reply + Send + Sync + 'static, &[(&str, &str)]),
    disrupt: impl FnOnce(&mut Cluster),
) -> (BTreeSet<String>, Vec<String>, Settings) {
    run_prepared(test, count, (script, env), |_| {}, disrupt)
}

/// [`run_on`] the shared broker.
pub fn run_prepared(
    test: &str,
    count: usize,
    (script, env): (impl Fn(&str) -> Reply + Send + Sync + 'static, &[(&str, &str)]),
    prepare: impl FnOnce(&Settings),
    disrupt: impl FnOnce(&mut Cluster),
) -> (BTreeSet<String>, Vec<String>, Settings) {
    run_on(|_| {}, test, count, (script, env), prepare, disrupt)
}

/// Submits `count` questions to a cluster of stage processes (on the settings `configure` leaves:
/// another broker, say) whose LLM answers with `script`, every process with `env` besides, runs
/// `prepare` on the topics before any stage starts and `disrupt` once a quarter of the answers are
/// in, and returns the question ids, the ids in the answers file once the sink has them all, and
/// the settings.
pub fn run_on(
    configure: impl FnOnce(&mut Settings),
    test: &str,
    count: usize,
    (script, env): (impl Fn(&str) -> Reply + Send + Sync + 'static, &[(&str, &str)]),
    prepare: impl FnOnce(&Settings),
    disrupt: impl FnOnce(&mut Cluster),
) -> (BTreeSet<String>, Vec<String>, Settings) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let llm = runtime.block_on(FakeLlm::start(script));
    let mut settings = settings(test, &llm.base_url);
    configure(&mut settings);
    runtime.block_on(bus(&settings));
    prepare(&settings);
    let mut cluster = Cluster::start_with_env(&settings, &llm.base_url, env);
    let (expected, answers) = submit(&mut cluster, test, count, 180);
    wait_for_answers_supervised(&mut cluster, test, &answers, count / 4);
    disrupt(&mut cluster);
    let status = cluster.wait_sink();
    if !status.success() {
        cluster.print_stall();
    }
    assert!(status.success());
    (expected, answer_ids(&answers), settings)
}

/// Submits `count` questions through `cluster` with its supervised sink (`lacuna answers`) already
/// waiting, each run giving up after `idle_s` seconds without an answer: the question ids and the
/// answers file.
pub fn submit(cluster: &mut Cluster, test: &str, count: usize, idle_s: u32) -> (BTreeSet<String>, PathBuf) {
    let dir = super::scratch_dir(test);
    let (questions, answers) = (dir.join("questions.jsonl"), dir.join("answers.jsonl"));
    let _ = std::fs::remove_file(&answers);
    let expected = write_questions(&questions, count);
    cluster.start_sink(&answers, count, idle_s);
    let status = cluster.command(&["submit", "--questions", questions.to_str().unwrap()]).status().unwrap();
    assert!(status.success(), "lacuna submit");
    (expected, answers)
}

/// Waits until the answers file holds `count` answers (5 minutes at most).
pub fn wait_for_answers(answers: &Path, count: usize) {
    let started = Instant::now();
    while answer_ids(answers).len() < count {
        assert!(started.elapsed() < Duration::from_secs(300), "{count} answers within 5 minutes");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// [`wait_for_answers`], starting again, as a Deployment would, any stage or sink that exits
/// meanwhile: a static member whose session times out while its group's coordinator moves is fenced
/// by its own rejoin (librdkafka#3437) and exits, at a run's start too. A matrix run stalled so, two
/// stages gone before its disruption and nothing yet starting them again. Which stages were started
/// again is in [`Cluster::restarted`], for a test that must see none.
pub fn wait_for_answers_supervised(cluster: &mut Cluster, test: &str, answers: &Path, count: usize) {
    let started = Instant::now();
    while answer_ids(answers).len() < count {
        assert!(started.elapsed() < Duration::from_secs(300), "{count} answers within 5 minutes");
        cluster.restart_sink_if_failed();
        for name in cluster.names() {
            if cluster.restart_if_exited(&name) {
                eprintln!("{test}: {name} exited before the disruption and was started again");
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// How many records each question has on the raw topic, beyond its first.
pub fn repeats(keys: &[String]) -> usize {
    keys.len() - keys.iter().collect::<BTreeSet<_>>().len()
}

/// Per topic of the pipeline's stream (not `progress`, which is outside every transaction, nor the
/// tables, where a key is written again on purpose): its records from start to end as `isolation`
/// reads them, and how many of them repeat an earlier one, key and payload alike. The fake LLM is
/// deterministic, so work done twice publishes the same bytes twice.
pub fn topic_repeats(settings: &Settings, isolation: &str) -> BTreeMap<&'static str, (usize, usize)> {
    use rdkafka::Message;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::error::KafkaError;
    let consumer: BaseConsumer =
        super::cluster::raw_reader(settings, isolation).set("enable.partition.eof", "true").create().unwrap();
    let mut counts = BTreeMap::new();
    for topic in Topic::ALL.iter().filter(|topic| **topic != Topic::Progress && !topic.is_table()) {
        let name = format!("{}{}", settings.kafka.topic_prefix, topic.name());
        let metadata = consumer.fetch_metadata(Some(&name), Duration::from_secs(10)).unwrap();
        let partitions = metadata.topics().first().map_or(0, |topic| topic.partitions().len()) as i32;
        let mut list = rdkafka::TopicPartitionList::new();
        for partition in 0..partitions {
            list.add_partition_offset(&name, partition, rdkafka::Offset::Beginning).unwrap();
        }
        consumer.assign(&list).unwrap();
        let (mut seen, mut records, mut ended) = (BTreeMap::new(), 0, BTreeSet::new());
        let started = Instant::now();
        while ended.len() < partitions as usize {
            assert!(started.elapsed() < Duration::from_secs(60), "{name} has no end in 60 s");
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(message)) => {
                    records += 1;
                    let record =
                        (message.key().unwrap_or_default().to_vec(), message.payload().unwrap_or_default().to_vec());
                    let here = (message.partition(), message.offset(), message.timestamp().to_millis().unwrap_or(-1));
                    // Where and when each copy was written, to set beside the stages' logs.
                    if let Some(first) = seen.insert(record, here) {
                        let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
                        eprintln!(
                            "repeat on {name}: key {key}, first at partition/offset/written-ms {first:?}, again at {here:?}"
                        );
                    }
                }
                Some(Err(KafkaError::PartitionEOF(partition))) => {
                    ended.insert(partition);
                }
                _ => {}
            }
        }
        counts.insert(topic.name(), (records, records - seen.len()));
    }
    counts
}
