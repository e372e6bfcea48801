//! The failure paths all at once, over a real broker: a hundred questions through six `lacuna stage`
//! processes while the LLM fails 10% of its calls with HTTP 500 and answers 5% of the structured
//! ones with broken JSON, two stages are SIGKILLed and one SIGTERMed mid-stream while their metrics
//! show work in flight (each restarted),
//! and 200 poison records land on the internal topics. The LLM is deterministic apart from its
//! faults, so the records can be held against those of the same questions without faults.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lacuna::config::Settings;
use lacuna::pipelines::{Pipeline, PipelineKind};
use lacuna::topics::dead_letter::DeadLetter;
use lacuna::topics::{AnswerRecord, Bus, Event, QuestionEvent, Record, Topic, VersionedAnswer};
use support::cluster::{Cluster, answer_ids, bus, write_questions};
use support::fake_llm::{FakeLlm, Prompt, Reply, prompt_kind};
use support::scripted::two_hops;

const QUESTIONS: usize = 100;
const POISON: usize = 200;

/// `two_hops` with faults by call number: every tenth call an HTTP 500, and one structured reply in
/// twenty cut off mid-object.
fn faulty(calls: Arc<AtomicUsize>) -> impl Fn(&str) -> Reply {
    move |prompt| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        let structured = !matches!(prompt_kind(prompt), Prompt::Knowledge | Prompt::Other);
        if n.is_multiple_of(10) {
            Reply::Status(500)
        } else if n % 20 == 5 && structured {
            Reply::Text("{\"answerable\": tru".into())
        } else {
            two_hops(prompt)
        }
    }
}

/// What a record says, without what differs between any two runs (timings, token counts, trace).
fn essence(record: &AnswerRecord) -> String {
    match record {
        AnswerRecord::Answered(a) => {
            let facts: Vec<_> = a.facts.iter().map(|f| (&f.text, &f.citations)).collect();
            let passages: BTreeSet<_> = a.passages.iter().map(|p| &p.id).collect();
            format!("answer {:?} facts {facts:?} passages {passages:?} outcome {:?}", a.answer, a.outcome)
        }
        AnswerRecord::Error(e) => format!("error {}", e.error_type),
    }
}

/// 200 records no stage can read, keyed poison-N, spread over the topics MIGRES consumes.
fn poison() -> Vec<Record> {
    let topics = [
        Topic::Questions,
        Topic::Passages,
        Topic::Evidence,
        Topic::Facts,
        Topic::Verified,
        Topic::Missing,
        Topic::Queries,
    ];
    let payloads: [&[u8]; 5] = [
        b"\xff\xfe not json at all",
        b"{}",
        b"[1, 2, 3]",
        br#"{"schema_version": 99, "memory": {}}"#,
        br#"{"schema_version": 1, "memory": {"question_id": 5}}"#,
    ];
    (0..POISON)
        .map(|n| Record {
            topic: topics[n % topics.len()],
            key: format!("poison-{n}"),
            payload: payloads[n % payloads.len()].to_vec(),
            trace: Default::default(),
        })
        .collect()
}

/// The same questions in one process, without faults: what every record should say, and how many
/// LLM calls it took.
fn fault_free(settings: &Settings, questions: &[QuestionEvent]) -> (BTreeMap<String, String>, usize) {
    let mut settings = settings.clone();
    settings.migres.retrieve_top_n = 1;
    let system = actix::System::new();
    system.block_on(async move {
        let llm = FakeLlm::start(two_hops).await;
        settings.llm.base_url = llm.base_url.clone();
        let mut pipeline = Pipeline::start(PipelineKind::Migres, &settings, support::parts(&settings)).await.unwrap();
        let mut records = BTreeMap::new();
        pipeline
            .run(questions.to_vec(), |record| {
                records.insert(record.question_id().to_string(), essence(&record));
            })
            .await
            .unwrap();
        pipeline.stop();
        (records, llm.calls())
    })
}

#[test]
fn chaos_loses_nothing_and_changes_no_answer() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let llm = runtime.block_on(FakeLlm::start(faulty(calls.clone())));
    let settings = support::cluster::settings("chaos", &llm.base_url);
    let bus = runtime.block_on(bus(&settings));
    let mut dead_letters = runtime.block_on(bus.subscribe(&[Topic::DeadLetters], "t-dead")).unwrap();
    let mut cluster = Cluster::start(&settings, &llm.base_url);
    let dir = support::scratch_dir("chaos");
    let (questions_file, answers) = (dir.join("questions.jsonl"), dir.join("answers.jsonl"));
    let _ = std::fs::remove_file(&answers);
    let expected = write_questions(&questions_file, QUESTIONS);
    let total = QUESTIONS + POISON;
    let mut sink = cluster.sink(&answers, total, 180);
    assert!(cluster.command(&["submit", "--questions", questions_file.to_str().unwrap()]).status().unwrap().success());
    runtime.block_on(async {
        for record in poison() {
            bus.publish(record).await.unwrap();
        }
    });

    // Mid-stream, once a quarter and a half of the questions (not the poison records, which alone
    // could pass those marks) are answered, each stage at a moment its metrics show an event in
    // flight: the signal interrupts work. `verify` goes right after `leaf`, at half: the stages read
    // their partitions in turn, so the questions move in step, and at three quarters the rest have
    // often passed their last `verify` (no work left there to interrupt).
    let started = Instant::now();
    let wait_for = |fraction: usize| {
        let questions_in = || answer_ids(&answers).iter().filter(|id| !id.starts_with("poison-")).count();
        while questions_in() < QUESTIONS * fraction / 4 {
            assert!(started.elapsed() < Duration::from_secs(600), "{}/4 of the questions within 10 minutes", fraction);
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let at_work = Duration::from_secs(60);
    wait_for(1);
    cluster.signal_at_work("sentence_filter", "-KILL", at_work).wait().unwrap();
    cluster.spawn("sentence_filter");
    wait_for(2);
    cluster.signal_at_work("leaf", "-KILL", at_work).wait().unwrap();
    cluster.spawn("leaf");
    let status = cluster.signal_at_work("verify", "-TERM", at_work).wait().unwrap();
    assert!(status.success(), "a drained stage exits cleanly: {status}");
    cluster.spawn("verify");
    assert!(sink.wait().unwrap().success(), "the sink got a record for every question and poison record");

    let records: Vec<AnswerRecord> = std::fs::read_to_string(&answers)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<VersionedAnswer>(line).unwrap().record)
        .collect();
    let ids: Vec<&str> = records.iter().map(|r| r.question_id()).collect();
    assert_eq!(ids.len(), ids.iter().collect::<BTreeSet<_>>().len(), "exactly one record per question");
    let questions: BTreeMap<&str, &AnswerRecord> =
        records.iter().filter(|r| !r.question_id().starts_with("poison-")).map(|r| (r.question_id(), r)).collect();
    assert_eq!(questions.keys().map(|id| id.to_string()).collect::<BTreeSet<_>>(), expected, "no question lost");
    let answered = questions.values().filter(|r| matches!(r, AnswerRecord::Answered(_))).count();
    assert!(answered * 100 >= QUESTIONS * 98, "{answered} of {QUESTIONS} answered");
    for record in records.iter().filter(|r| r.question_id().starts_with("poison-")) {
        let AnswerRecord::Error(error) = record else { panic!("a poison record answered: {record:?}") };
        assert_eq!(error.error_type, "bad_event");
    }

    // Every poison record is a dead letter (some twice, when a killed stage redid its work).
    let poisoned: BTreeSet<String> = runtime.block_on(async {
        let mut keys = BTreeSet::new();
        while keys.len() < POISON {
            let next = tokio::time::timeout(Duration::from_secs(30), dead_letters.next()).await;
            let record = next.expect("every poison record in the dead letters").expect("open").into_record();
            let letter = DeadLetter::from_payload(&record.payload).unwrap();
            if letter.key.starts_with("poison-") {
                assert_eq!(letter.error_type, "bad_event");
                keys.insert(letter.key);
            }
        }
        keys
    });
    assert_eq!(poisoned.len(), POISON);
    drop(cluster);

    // With the faults gone the same questions say the same; what differs must say why.
    let question_events: Vec<QuestionEvent> = support::cluster::questions(QUESTIONS);
    let (reference, reference_calls) = fault_free(&settings, &question_events);
    let mut same = 0;
    for (id, record) in &questions {
        if essence(record) == reference[*id] {
            same += 1;
        } else {
            // Only what the injected faults can cause: a step that went on without a reply
            // (degraded), or an error the faults themselves make (HTTP 500, broken JSON).
            let explained = match record {
                AnswerRecord::Answered(a) => !a.degraded.is_empty(),
                AnswerRecord::Error(e) => ["llm_http_status", "llm_bad_response"].contains(&e.error_type.as_str()),
            };
            assert!(
                explained,
                "{id} differs from the fault-free run without saying why:\n{}\n{}",
                essence(record),
                reference[*id]
            );
        }
    }
    assert!(same * 100 >= QUESTIONS * 98, "{same} of {QUESTIONS} records equal the fault-free run's");
    eprintln!(
        "chaos: {} LLM calls (fault-free: {reference_calls}), {answered} answered, {same} equal to the fault-free run",
        calls.load(Ordering::SeqCst)
    );
}
