//! A live corpus: documents added while a pipeline runs are searched, answered from and cited by the
//! next question, without a restart; a deleted document stops being cited. In process (`lacuna
//! ingest` writes the local index) and over Kafka (the `documents` topic, which every retrieve
//! replica follows into its own index; the broker that scripts/test.sh starts).

mod support;

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lacuna::actors::clients::{Document, TantivySearch, TantivyWriter};
use lacuna::bench::replica::Replica;
use lacuna::pipelines::parts::Parts;
use lacuna::pipelines::{Pipeline, PipelineKind};
use lacuna::topics::{AnswerRecord, Answered, Bus, Event, QuestionEvent};
use serde_json::json;
use support::fake_llm::{FakeLlm, Reply};
use support::scripted::made_up_reader;

const QUESTION: &str = "Which lighthouse keeper first charted the Varnholt shoals?";
const MADE_UP: &str = "varnholt-shoals";

/// A reader that answers from the made-up passage when it is shown one, and cannot otherwise.
/// [`made_up_reader`], holding its answer from the made-up passage for `HELD` while `hold` is set, and
/// saying so in `shown`: a question then stays in flight after retrieval read the passage.
fn holding_reader(hold: Arc<AtomicBool>, shown: Arc<AtomicBool>) -> impl Fn(&str) -> Reply + Send + Sync {
    move |prompt| {
        let reply = made_up_reader(prompt);
        if hold.load(Ordering::SeqCst) && prompt.contains("Quillmoor") {
            shown.store(true, Ordering::SeqCst);
            return Reply::Delayed(HELD, Box::new(reply));
        }
        reply
    }
}

/// Long enough for `lacuna ingest --delete` to start, commit and be seen by the running reader.
const HELD: Duration = Duration::from_secs(5);

/// `lacuna ingest` in its own process, as a user runs it beside a running pipeline.
fn ingest(index: &Path, args: &[&str]) {
    let output = Command::new(env!("CARGO_BIN_EXE_lacuna"))
        .env("LACUNA__SEARCH__INDEX_DIR", index)
        .arg("ingest")
        .args(args)
        .output()
        .unwrap();
    assert!(output.status.success(), "ingest failed: {}", String::from_utf8_lossy(&output.stderr));
}

/// Asks until `wanted` holds of the answer (the running reader follows commits within a second or
/// so), at most 10 s; returns the last answer.
async fn ask_until(pipeline: &mut Pipeline, tag: &str, wanted: impl Fn(&Answered) -> bool) -> Answered {
    for attempt in 0..50 {
        let record = pipeline.ask(QuestionEvent::new(format!("{tag}-{attempt}"), QUESTION.to_string())).await.unwrap();
        let AnswerRecord::Answered(answer) = record else { panic!("expected an answer, got {record:?}") };
        if wanted(&answer) {
            return *answer;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{tag}: the running pipeline never saw the change");
}

/// A document no corpus holds: only it says who charted the shoals.
fn made_up_document() -> serde_json::Value {
    json!({"id": MADE_UP, "title": "Varnholt shoals",
        "text": "The Varnholt shoals were first charted in 1871 by the lighthouse keeper Ada Quillmoor."})
}

fn cites_made_up(answer: &Answered) -> bool {
    answer.passages.iter().any(|p| p.id == MADE_UP)
}

/// Also: a question in flight while its cited passage is deleted still ends in one record, which
/// names the generation it read and keeps the passage's text for the audit.
#[actix::test]
async fn a_document_ingested_while_a_pipeline_runs_answers_the_next_question_and_a_delete_takes_it_back() {
    let dir = support::scratch_dir("live-corpus");
    // Real passages around the made-up one, so that BM25 and the re-ranker have competition.
    let corpus = dir.join("corpus.jsonl");
    let real = std::fs::read_to_string(support::data_dir().join("hotpotqa/corpus.jsonl")).unwrap();
    std::fs::write(&corpus, real.lines().take(300).collect::<Vec<_>>().join("\n")).unwrap();
    let index = dir.join("index");
    let _ = std::fs::remove_dir_all(&index);
    TantivySearch::build(&index, &corpus).unwrap();

    let (hold, shown) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let llm = FakeLlm::start(holding_reader(hold.clone(), shown.clone())).await;
    let mut settings = support::settings(&llm.base_url);
    settings.search.index_dir = index.clone();
    let parts = Parts::load(&settings, PipelineKind::Vanilla).unwrap();
    let mut pipeline = Pipeline::start(PipelineKind::Vanilla, &settings, parts).await.unwrap();

    let before = ask_until(&mut pipeline, "before", |_| true).await;
    assert!(!cites_made_up(&before) && before.answer == "unknown", "the corpus never held it: {:?}", before.answer);

    let documents = dir.join("documents.jsonl");
    let mut file = std::fs::File::create(&documents).unwrap();
    let made_up = json!({"id": MADE_UP, "title": "Varnholt shoals",
        "text": "The Varnholt shoals were first charted in 1871 by the lighthouse keeper Ada Quillmoor.",
        "metadata": {"url": "https://example.org/varnholt"}});
    writeln!(file, "{made_up}").unwrap();
    ingest(&index, &[documents.to_str().unwrap()]);

    let after = ask_until(&mut pipeline, "after", cites_made_up).await;
    assert_eq!(after.answer, "Ada Quillmoor");
    let generation = |answer: &Answered| answer.provenance.as_ref().unwrap().index_generation.clone();
    assert_ne!(generation(&after), generation(&before), "the record names the generation it read");

    // In flight: retrieval has read the passage and the reader holds its answer while the
    // document is deleted.
    hold.store(true, Ordering::SeqCst);
    let bus = pipeline.bus();
    bus.publish(QuestionEvent::new("in-flight", QUESTION).to_record()).await.unwrap();
    while !shown.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deleting = index.clone();
    tokio::task::spawn_blocking(move || ingest(&deleting, &["--delete", MADE_UP])).await.unwrap();
    let AnswerRecord::Answered(in_flight) = pipeline.next_record().await.unwrap() else { panic!("expected an answer") };
    assert_eq!((in_flight.question_id.as_str(), in_flight.answer.as_str()), ("in-flight", "Ada Quillmoor"));
    assert_eq!(generation(&in_flight), generation(&after), "it names the generation it read, not the one after");
    let cited = in_flight.passages.iter().find(|p| p.id == MADE_UP).expect("it cites the passage it read");
    assert!(cited.text.contains("Ada Quillmoor"), "the record keeps the deleted passage's text: {cited:?}");
    hold.store(false, Ordering::SeqCst);

    // The next record is the next question's: the one in flight ended in exactly one.
    bus.publish(QuestionEvent::new("deleted", QUESTION).to_record()).await.unwrap();
    let AnswerRecord::Answered(deleted) = pipeline.next_record().await.unwrap() else { panic!("expected an answer") };
    assert_eq!(deleted.question_id, "deleted", "a second record for the question in flight came first");
    assert!(!cites_made_up(&deleted) && deleted.answer == "unknown", "the delete was committed before it asked");
    assert_ne!(generation(&deleted), generation(&after));
    pipeline.stop();
}

/// Ingesting a document again replaces all of its passages: a shorter version leaves none of the
/// longer one's behind. Bad lines are named and skipped; the good ones still go in.
#[actix::test]
async fn a_document_ingested_again_keeps_no_passage_of_its_older_version() {
    let dir = support::scratch_dir("live-corpus-replace");
    let index = dir.join("index");
    let _ = std::fs::remove_dir_all(&index);
    let write = |name: &str, lines: &[String]| {
        let path = dir.join(name);
        std::fs::write(&path, lines.join("\n")).unwrap();
        path
    };
    let sentence = "The keeper logged the weather at dawn and again at dusk every day of the year.";
    let long = json!({"id": "log", "title": "Keeper's log", "text": vec![sentence; 30].join(" ")}).to_string();
    let first = write("long.jsonl", &[long]);
    ingest(&index, &[first.to_str().unwrap()]);
    let search = TantivySearch::open(&index).unwrap();
    let ids = |search: &TantivySearch| {
        let mut ids: Vec<String> =
            search.search("keeper weather dawn", 50).unwrap().into_iter().map(|(p, _)| p.id).collect();
        ids.sort();
        ids
    };
    // 16 words a sentence: 6 whole sentences (96 words) a passage of at most 100.
    assert_eq!(ids(&search), ["log#1", "log#2", "log#3", "log#4", "log#5"]);

    let short = json!({"id": "log", "title": "Keeper's log", "text": sentence}).to_string();
    let output = Command::new(env!("CARGO_BIN_EXE_lacuna"))
        .env("LACUNA__SEARCH__INDEX_DIR", &index)
        .args([
            "ingest",
            write("short.jsonl", &[short, "{not json".into(), json!({"id": "empty", "text": " "}).to_string()])
                .to_str()
                .unwrap(),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "two lines were skipped: {stderr}");
    assert!(stderr.contains("line 2: ") && stderr.contains("line 3: document \"empty\" has no text"), "{stderr}");
    let search = TantivySearch::open(&index).unwrap();
    assert_eq!(ids(&search), ["log"], "the good line went in, and replaced all five passages");
}

fn kafka_env(settings: &lacuna::config::Settings) -> Vec<(&'static str, String)> {
    vec![
        ("LACUNA__KAFKA__BROKERS", settings.kafka.brokers.clone()),
        ("LACUNA__KAFKA__TOPIC_PREFIX", settings.kafka.topic_prefix.clone()),
        ("LACUNA__KAFKA__PARTITIONS", settings.kafka.partitions.to_string()),
    ]
}

/// `lacuna ingest --transport kafka`, as a user runs it.
fn publish(settings: &lacuna::config::Settings, args: &[&str]) {
    let output = Command::new(env!("CARGO_BIN_EXE_lacuna"))
        .envs(kafka_env(settings))
        .args(["ingest", "--transport", "kafka"])
        .args(args)
        .output()
        .unwrap();
    assert!(output.status.success(), "ingest failed: {}", String::from_utf8_lossy(&output.stderr));
}

fn free_port() -> u16 {
    lacuna::bench::replica::free_port().unwrap()
}

/// A retrieve replica (`lacuna stage retrieve` of VANILLA) following the documents topic into `index`,
/// committing every 200 ms, one passage per document so that counting passages counts documents.
fn replica(settings: &lacuna::config::Settings, index: &Path, port: u16) -> Replica {
    let mut settings = settings.clone();
    settings.search.commit_interval_ms = 200;
    settings.search.passage_words = 0;
    Replica::start(Path::new(env!("CARGO_BIN_EXE_lacuna")), &settings, index, port).unwrap()
}

fn wait_ready(replica: &mut Replica) {
    replica.wait_ready(Duration::from_secs(60)).unwrap();
}

/// Waits until `holds` is true of the index at `dir` (a replica's, read beside it), at most 20 s.
fn until_index(dir: &Path, what: &str, holds: impl Fn(&TantivySearch) -> bool) {
    let started = std::time::Instant::now();
    loop {
        if TantivySearch::open(dir).is_ok_and(|search| holds(&search)) {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{}: {what} within 20 s", dir.display());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Over Kafka: two retrieve replicas, each with an index folder of its own that starts missing,
/// build it from the documents topic; a made-up document published while they run becomes
/// searchable on both and is cited by the next answer; its deletion takes it back from both. A
/// replica killed with SIGKILL while a batch is being published comes back, catches up, and holds
/// every live document of the topic.
#[actix::test]
async fn over_kafka_every_retrieve_replica_follows_the_documents_topic_and_survives_a_kill() {
    use lacuna::pipelines::PipelineKind;
    use lacuna::topics::Topic;
    let dir = support::scratch_dir("live-corpus-kafka");
    let llm = FakeLlm::start(made_up_reader).await;
    let settings = support::cluster::settings("documents", &llm.base_url);
    let base = dir.join("base.jsonl");
    let real = std::fs::read_to_string(support::data_dir().join("hotpotqa/corpus.jsonl")).unwrap();
    std::fs::write(&base, real.lines().take(300).collect::<Vec<_>>().join("\n")).unwrap();
    publish(&settings, &[base.to_str().unwrap()]);

    let indexes: Vec<_> = (0..2).map(|n| dir.join(format!("replica-{n}"))).collect();
    for index in &indexes {
        let _ = std::fs::remove_dir_all(index);
    }
    let mut replicas: Vec<Replica> = indexes.iter().map(|index| replica(&settings, index, free_port())).collect();
    replicas.iter_mut().for_each(wait_ready);
    for index in &indexes {
        assert_eq!(TantivySearch::open(index).unwrap().num_passages(), 300, "ready means caught up");
    }

    // The rest of VANILLA in this process, on the pipeline's topics.
    let vanilla = PipelineKind::Vanilla;
    let bus = std::sync::Arc::new(
        lacuna::topics::kafka::KafkaBus::new(vanilla.kafka_settings(&settings.kafka), &settings.bus).unwrap(),
    );
    bus.ensure_topics(&Topic::ALL).await.unwrap();
    let mut parts_settings = settings.clone();
    parts_settings.search.index_dir = support::hotpot_index();
    let parts = Parts::load(&parts_settings, vanilla).unwrap();
    let mut stages = Vec::new();
    for name in ["sentence_filter", "reader"] {
        stages.push(vanilla.stage(name).unwrap().start(bus.clone(), &settings, &parts).await.unwrap());
    }
    let mut answers = bus.subscribe(&[Topic::Answers], "inspect").await.unwrap();
    let mut ask = async |id: &str| -> Answered {
        bus.publish(QuestionEvent::new(id.to_string(), QUESTION.to_string()).to_record()).await.unwrap();
        loop {
            let delivery = tokio::time::timeout(Duration::from_secs(60), answers.next()).await.unwrap().unwrap();
            let record: lacuna::topics::VersionedAnswer = serde_json::from_slice(&delivery.record.payload).unwrap();
            delivery.ack();
            if record.record.question_id() != id {
                continue;
            }
            let AnswerRecord::Answered(answer) = record.record else { panic!("expected an answer: {record:?}") };
            return *answer;
        }
    };
    let before = ask("before").await;
    assert!(!cites_made_up(&before) && before.answer == "unknown", "{:?}", before.answer);

    let documents = dir.join("documents.jsonl");
    let made_up = made_up_document();
    std::fs::write(&documents, made_up.to_string()).unwrap();
    publish(&settings, &[documents.to_str().unwrap()]);
    for index in &indexes {
        until_index(index, "the made-up passage", |s| s.passage(MADE_UP).unwrap().is_some());
    }
    // The replicas' readers follow their commits within about a second.
    let mut after = ask("after-0").await;
    for attempt in 1..20 {
        if cites_made_up(&after) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        after = ask(&format!("after-{attempt}")).await;
    }
    assert_eq!(after.answer, "Ada Quillmoor");
    assert!(cites_made_up(&after), "the record cites the published passage");
    // The generation names how much of the changelog the replica's index held.
    let read = &after.provenance.as_ref().unwrap().index_generation;
    assert!(read.iter().all(|g| g.contains(":applied=")), "{read:?}");

    publish(&settings, &["--delete", MADE_UP]);
    for index in &indexes {
        until_index(index, "the deletion", |s| s.passage(MADE_UP).unwrap().is_none());
    }
    let mut deleted = ask("deleted-0").await;
    for attempt in 1..20 {
        if !cites_made_up(&deleted) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        deleted = ask(&format!("deleted-{attempt}")).await;
    }
    assert!(!cites_made_up(&deleted) && deleted.answer == "unknown", "{:?}", deleted.answer);
    for stage in stages {
        stage.drain().await;
    }

    // 10,000 more documents; replica 0 is killed while it applies them, then started again.
    let batch = dir.join("batch.jsonl");
    let lines: Vec<String> = (0..10_000)
        .map(|n| json!({"id": format!("batch-{n}"), "title": format!("Batch {n}"), "text": format!("Record {n} of the batch.")}).to_string())
        .collect();
    std::fs::write(&batch, lines.join("\n")).unwrap();
    let publishing = {
        let (settings, batch) = (settings.clone(), batch.clone());
        std::thread::spawn(move || publish(&settings, &[batch.to_str().unwrap()]))
    };
    until_index(&indexes[0], "some of the batch", |s| s.num_passages() > 300);
    let at_kill = TantivySearch::open(&indexes[0]).unwrap().num_passages();
    let port = replicas[0].port;
    replicas[0].kill();
    publishing.join().unwrap();
    replicas[0] = replica(&settings, &indexes[0], port);
    wait_ready(&mut replicas[0]);
    // The topic's live keys: 300 base documents and the batch (the made-up one was deleted), each
    // one passage.
    assert!(at_kill < 10_300, "the kill came after replica 0 had applied the whole batch ({at_kill} passages)");
    for index in &indexes {
        until_index(index, "all 10,300 live documents", |s| s.num_passages() == 10_300);
    }
    assert!(TantivySearch::open(&indexes[0]).unwrap().passage("batch-9999").unwrap().is_some());

    // `lacuna verify-index` finds each a copy of the topic; a replica that missed changes is not one.
    for index in &indexes {
        let (copy, out) = verify_index(&settings, index);
        assert!(copy && out.contains("10300 live documents") && out.contains("exactly the topic's"), "{out}");
    }
    replicas[1].stop();
    let late = dir.join("late.jsonl");
    std::fs::write(
        &late,
        json!({"id": "late", "title": "Late", "text": "Published while replica 1 was down."}).to_string(),
    )
    .unwrap();
    publish(&settings, &[late.to_str().unwrap(), "--delete", "batch-0"]);
    until_index(&indexes[0], "the late change", |s| {
        s.passage("late").unwrap().is_some() && s.passage("batch-0").unwrap().is_none()
    });
    let (copy, out) = verify_index(&settings, &indexes[1]);
    assert!(!copy, "{out}");
    assert!(out.contains("missing (live on the topic, not in the index): 1 late"), "{out}");
    assert!(out.contains("extra (deleted on the topic, or never on it): 1 batch-0"), "{out}");
    assert!(verify_index(&settings, &indexes[0]).0, "replica 0 caught up");
}

/// `lacuna verify-index` on `index`, as an operator runs it: whether it found a copy, and what it said.
fn verify_index(settings: &lacuna::config::Settings, index: &Path) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_lacuna"))
        .envs(kafka_env(settings))
        .env("LACUNA__SEARCH__PASSAGE_WORDS", "0")
        .args(["verify-index", "--index-dir", index.to_str().unwrap()])
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), said)
}

/// A replica away longer than the documents topic keeps tombstones (`delete.retention.ms`) may have
/// missed deletions that compaction has since removed, though its offsets are still within the log:
/// only the time tells. It rebuilds its index from the topic (issue 57, item 2). Here the topic keeps
/// tombstones for 1 s, and a document the replica holds but the topic does not stands for one whose
/// tombstone it missed.
#[actix::test]
async fn a_replica_away_longer_than_the_topic_keeps_tombstones_rebuilds_its_index() {
    let dir = support::scratch_dir("live-corpus-tombstones");
    let settings = support::cluster::settings("documents-tombstones", "http://127.0.0.1:9/v1");
    create_documents_topic(&settings, "delete.retention.ms", "1000").await;
    let base = dir.join("base.jsonl");
    let lines: Vec<String> = (0..5)
        .map(|n| json!({"id": format!("kept-{n}"), "title": "Kept", "text": format!("Document {n}.")}).to_string())
        .collect();
    std::fs::write(&base, lines.join("\n")).unwrap();
    publish(&settings, &[base.to_str().unwrap()]);
    let index = dir.join("replica");
    let _ = std::fs::remove_dir_all(&index);
    let mut first = replica(&settings, &index, free_port());
    wait_ready(&mut first);
    first.stop();
    // The missed deletion: a document in the index, under the offsets the replica stored, that the
    // topic no longer holds.
    {
        let mut writer = TantivyWriter::open(&index).unwrap();
        let payload = writer.payload().unwrap().expect("the replica stored its offsets");
        let ghost: Document =
            serde_json::from_value(json!({"id": "ghost", "title": "Ghost", "text": "Deleted long ago."})).unwrap();
        writer.upsert(&ghost, 0).unwrap();
        writer.commit_with(&payload).unwrap();
    }
    // Records came while it was away (the tombstone among them, before compaction removed it).
    std::thread::sleep(Duration::from_millis(1_500));
    let late = dir.join("late.jsonl");
    std::fs::write(&late, json!({"id": "late", "title": "Late", "text": "Published while it was away."}).to_string())
        .unwrap();
    publish(&settings, &[late.to_str().unwrap()]);
    let mut second = replica(&settings, &index, free_port());
    wait_ready(&mut second);
    let search = TantivySearch::open(&index).unwrap();
    assert!(search.passage("ghost").unwrap().is_none(), "rebuilt from the topic, the deletion it missed is applied");
    assert!(search.passage("late").unwrap().is_some());
    assert_eq!(search.num_passages(), 6, "and it holds the topic's documents");
    second.stop();
}

/// The documents topic, created before any replica creates it, compacted, with one config of the test's.
async fn create_documents_topic(settings: &lacuna::config::Settings, key: &str, value: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> =
        rdkafka::ClientConfig::new().set("bootstrap.servers", &settings.kafka.brokers).create().unwrap();
    let name = format!("{}documents", settings.kafka.topic_prefix);
    let topic = NewTopic::new(&name, settings.kafka.partitions, TopicReplication::Fixed(1))
        .set("cleanup.policy", "compact")
        .set(key, value);
    let created = admin.create_topics(&[topic], &AdminOptions::new()).await.unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");
}

/// `lacuna run` with `search.follow_documents` builds its local index from the documents topic before
/// its first question, so it answers from a document that only the topic holds.
#[actix::test]
async fn lacuna_run_following_the_documents_topic_answers_from_a_document_only_the_topic_holds() {
    let dir = support::scratch_dir("live-corpus-run");
    let llm = FakeLlm::start(made_up_reader).await;
    let settings = support::cluster::settings("documents-run", &llm.base_url);
    let documents = dir.join("documents.jsonl");
    let made_up = made_up_document();
    std::fs::write(&documents, made_up.to_string()).unwrap();
    publish(&settings, &[documents.to_str().unwrap()]);
    let questions = dir.join("questions.jsonl");
    std::fs::write(&questions, json!({"id": "shoals", "question": QUESTION}).to_string()).unwrap();
    let (index, out) = (dir.join("index"), dir.join("answers.jsonl"));
    let _ = std::fs::remove_dir_all(&index);

    let output = Command::new(env!("CARGO_BIN_EXE_lacuna"))
        .envs(kafka_env(&settings))
        .env("LACUNA__LLM__BASE_URL", &llm.base_url)
        .env("LACUNA__SEARCH__FOLLOW_DOCUMENTS", "true")
        .env("LACUNA__SEARCH__INDEX_DIR", &index)
        .args(["run", "--pipeline", "vanilla", "--questions", questions.to_str().unwrap()])
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(output.status.success(), "run failed: {}", String::from_utf8_lossy(&output.stderr));
    let records: Vec<lacuna::topics::VersionedAnswer> =
        std::fs::read_to_string(&out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records.len(), 1);
    let AnswerRecord::Answered(answer) = &records[0].record else { panic!("expected an answer: {records:?}") };
    assert_eq!(answer.answer, "Ada Quillmoor");
    assert!(cites_made_up(answer), "the record cites the passage that only the topic held");
}

/// A broker that crashes and comes back under an index that follows the documents topic: the index
/// keeps serving what it has, reconnects, and applies what is published afterwards, without failing
/// its replica.
#[actix::test]
async fn an_index_following_the_documents_topic_rides_out_a_broker_restart() {
    use lacuna::actors::clients::search::materialiser::{Following, Materialiser};
    let broker = std::sync::Arc::new(support::cluster::OwnBroker::start());
    let mut settings = support::cluster::settings("documents-restart", "http://127.0.0.1:9/v1");
    settings.kafka.brokers = broker.address();
    settings.kafka.message_timeout_ms = 5000;
    settings.search.index_dir = support::scratch_dir("live-corpus-restart").join("index");
    settings.search.commit_interval_ms = 200;
    let _ = std::fs::remove_dir_all(&settings.search.index_dir);
    let bus = Arc::new(lacuna::topics::kafka::KafkaBus::new(settings.kafka.clone(), &settings.bus).unwrap());
    bus.ensure_documents_topic().await.unwrap();
    let document = |id: &str| json!({"id": id, "title": id, "text": format!("The {id} record.")}).to_string();
    bus.publish_document("before", Some(document("before").as_bytes())).await.unwrap();
    let mut materialiser = Materialiser::start(&bus, &settings.search).unwrap();
    materialiser.caught_up().await.unwrap();

    let restarting = broker.clone();
    tokio::task::spawn_blocking(move || restarting.run(&["restart", "--crash"])).await.unwrap();
    let started = std::time::Instant::now();
    while let Err(error) = bus.publish_document("after", Some(document("after").as_bytes())).await {
        assert!(started.elapsed() < Duration::from_secs(90), "no publish went through after the restart: {error}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let index = settings.search.index_dir.clone();
    tokio::task::spawn_blocking(move || {
        until_index(&index, "the document published after the restart", |s| s.passage("after").unwrap().is_some())
    })
    .await
    .unwrap();
    assert_eq!(*materialiser.state.borrow(), Following::CaughtUp, "the index went on following");
    assert!(TantivySearch::open(&settings.search.index_dir).unwrap().passage("before").unwrap().is_some());
}

/// A record on the documents topic that is not a document is skipped by every replica, and each
/// writes its dead letter under the same key (where the record sits), so the compacted dead letters'
/// topic keeps it once; the good document beside it goes in.
#[actix::test]
async fn a_record_that_is_not_a_document_goes_to_the_dead_letters_under_one_key() {
    use lacuna::actors::clients::search::materialiser::Materialiser;
    use lacuna::topics::kafka::{KafkaBus, RejectedDocument};
    let dir = support::scratch_dir("live-corpus-dead-letters");
    let settings = support::cluster::settings("documents-dead-letters", "http://127.0.0.1:9/v1");
    let bus = Arc::new(KafkaBus::new(settings.kafka.clone(), &settings.bus).unwrap());
    bus.ensure_documents_topic().await.unwrap();
    bus.publish_document("bad", Some(b"{not json")).await.unwrap();
    bus.publish_document(MADE_UP, Some(made_up_document().to_string().as_bytes())).await.unwrap();
    let mut replicas = Vec::new();
    for n in 0..2 {
        let mut search = settings.search.clone();
        search.index_dir = dir.join(format!("replica-{n}"));
        let _ = std::fs::remove_dir_all(&search.index_dir);
        let mut materialiser = Materialiser::start(&bus, &search).unwrap();
        materialiser.caught_up().await.unwrap();
        assert!(TantivySearch::open(&search.index_dir).unwrap().passage(MADE_UP).unwrap().is_some());
        replicas.push(materialiser);
    }

    let reader = bus.reader_of(&bus.documents_dead_letters_topic()).unwrap();
    let letters = tokio::task::spawn_blocking(move || {
        let from: std::collections::HashMap<i32, i64> =
            reader.spans().unwrap().iter().map(|s| (s.partition, s.low)).collect();
        reader.start(&from).unwrap();
        let (mut letters, started) = (Vec::new(), std::time::Instant::now());
        while letters.len() < 2 && started.elapsed() < Duration::from_secs(30) {
            if let Some(change) = reader.poll(Duration::from_millis(100)).unwrap() {
                let letter: RejectedDocument = serde_json::from_slice(&change.document.unwrap()).unwrap();
                letters.push((change.key, letter));
            }
        }
        letters
    })
    .await
    .unwrap();
    assert_eq!(letters.len(), 2, "one dead letter from each replica: {letters:?}");
    assert_eq!(letters[0], letters[1], "the same letter under the same key, so compaction keeps one");
    let (key, letter) = &letters[0];
    assert_eq!(*key, letter.dead_letter_key());
    assert_eq!((letter.key.as_str(), letter.payload.as_str()), ("bad", "{not json"));
    assert!(letter.error.contains("at line 1 column"), "it says why, as the JSON parser did: {}", letter.error);
}

/// A replica that cannot read how long the documents topic keeps tombstones (DescribeConfigs
/// refused: the ACLs grant only reads) cannot tell whether it was away long enough to miss a
/// deletion. It used to assume Kafka's default, a day, and resume: with a topic that keeps them
/// less, a deleted document stayed searchable for good. It refuses to resume from its stored
/// offsets instead, and says which setting gives the retention (issue 75, item 4). librdkafka's
/// mock cluster refuses DescribeConfigs here.
#[actix::test]
async fn a_replica_that_cannot_read_the_tombstone_retention_refuses_to_resume() {
    use lacuna::actors::clients::search::materialiser::Materialiser;
    use lacuna::topics::kafka::KafkaBus;
    use rdkafka::mocking::MockCluster;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
    let cluster = MockCluster::new(1).unwrap();
    let mut settings = support::settings("http://127.0.0.1:9/v1");
    settings.kafka.brokers = cluster.bootstrap_servers();
    settings.kafka.topic_prefix = "retention-".into();
    settings.kafka.partitions = 1;
    settings.kafka.replication_factor = 1;
    settings.search.index_dir = support::scratch_dir("live-corpus-retention").join("index");
    settings.search.commit_interval_ms = 200;
    let _ = std::fs::remove_dir_all(&settings.search.index_dir);
    let bus = Arc::new(KafkaBus::new(settings.kafka.clone(), &settings.bus).unwrap());
    cluster.create_topic(&bus.documents_topic(), 1, 1).unwrap();
    bus.publish_document(MADE_UP, Some(made_up_document().to_string().as_bytes())).await.unwrap();
    let mut first = Materialiser::start(&bus, &settings.search).unwrap();
    first.caught_up().await.unwrap();
    drop(first);
    // Its thread stores its offsets and lets go of the index.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(TantivySearch::open(&settings.search.index_dir).unwrap().passage(MADE_UP).unwrap().is_some());

    let refused = RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED;
    cluster.request_errors(RDKafkaApiKey::DescribeConfigs, &[refused; 64]);
    let mut second = Materialiser::start(&bus, &settings.search).unwrap();
    let said = second.caught_up().await.expect_err("it refuses to resume");
    assert!(said.contains("delete.retention.ms") && said.contains("kafka.documents_delete_retention_ms"), "{said}");
    drop(second);

    // As the message says: the setting gives the retention, and the index resumes where it was.
    settings.kafka.documents_delete_retention_ms = 24 * 3600 * 1000;
    let bus = Arc::new(KafkaBus::new(settings.kafka.clone(), &settings.bus).unwrap());
    let mut third = Materialiser::start(&bus, &settings.search).unwrap();
    third.caught_up().await.unwrap();
    assert!(TantivySearch::open(&settings.search.index_dir).unwrap().passage(MADE_UP).unwrap().is_some());
}
