//! What happens when the machinery itself fails: a publish the bus refuses, a join whose output
//! cannot be sent, a stage whose feed dies. In every case the question still ends in exactly one
//! record, or the process says it is broken; it never waits forever in silence.

mod support;

use std::sync::Arc;
use std::time::Duration;

use lacuna::config::Settings;
use lacuna::pipelines::{Pipeline, PipelineKind};
use lacuna::topics::dead_letter::DeadLetter;
use lacuna::topics::in_process::InProcessBus;
use lacuna::topics::{AnswerRecord, Bus, BusError, ErrorRecord, QuestionEvent, Topic};
use serde_json::json;
use support::fake_llm::{FakeLlm, Prompt, Reply, prompt_kind};
use support::faulty_bus::FaultyBus;
use support::methods::{methods_script, slow_second_subquestion};
use support::scripted::{HUGO_QUESTION_ID, hugo_script};

fn small(settings: &mut Settings) {
    settings.migres.retrieve_top_n = 8;
    settings.raisf.top_k = 3;
    settings.rqrag.top_k = 3;
    settings.rqrag.max_depth = 1;
    settings.rqrag.width = 2;
}

/// RA-ISF whose second sub-question answers after the join's 2 s deadline (`slow_second_subquestion`):
/// the parent goes on from a tick.
fn past_the_deadline(llm: &FakeLlm) -> Settings {
    let mut settings = support::settings(&llm.base_url);
    small(&mut settings);
    settings.join.deadline_ms = 2000;
    settings.join.tick_ms = 100;
    settings
}

/// Runs one question through `kind` on `bus`, giving up after `limit`.
async fn ask_on(
    kind: PipelineKind,
    bus: Arc<dyn Bus>,
    settings: &Settings,
    question: QuestionEvent,
    limit: Duration,
) -> Result<AnswerRecord, String> {
    let mut pipeline = Pipeline::start_on(kind, bus, settings, support::parts(settings)).await.unwrap();
    let outcome = tokio::time::timeout(limit, pipeline.ask(question)).await;
    pipeline.stop();
    match outcome {
        Ok(Ok(record)) => Ok(record),
        Ok(Err(error)) => Err(format!("the run failed: {error}")),
        Err(_) => Err(format!("no record within {limit:?}: the question was lost")),
    }
}

fn hugo() -> QuestionEvent {
    let (question, _, _) = support::question("hotpotqa", HUGO_QUESTION_ID);
    QuestionEvent::new(HUGO_QUESTION_ID, question)
}

fn refused(n: usize) -> impl Fn(&lacuna::topics::Record, usize) -> Option<BusError> {
    move |_, k| (k == n).then(|| BusError::Transport("broker unavailable (injected)".into()))
}

/// The join completes a parent when its last child's result arrives, and the `joined` record it
/// then publishes is refused once: the root must still end in one record.
#[actix::test]
async fn a_join_whose_joined_publish_fails_still_ends_its_question() {
    let llm = FakeLlm::start(methods_script).await;
    let mut settings = support::settings(&llm.base_url);
    small(&mut settings);
    let bus = Arc::new(FaultyBus::new(Arc::new(InProcessBus::new(256))).failing(Topic::Joined, refused(1)));
    let record = ask_on(PipelineKind::Rqrag, bus.clone(), &settings, hugo(), Duration::from_secs(30)).await.unwrap();
    assert_eq!(bus.failures(), 1, "the injected failure happened");
    assert!(matches!(record, AnswerRecord::Answered(_)), "{record:?}");
}

/// The same on the join's timer: a parent past its deadline goes on from a tick, whose `joined`
/// publish is refused once.
#[actix::test]
async fn a_join_tick_whose_joined_publish_fails_still_ends_its_question() {
    let llm = FakeLlm::start(slow_second_subquestion).await;
    let settings = past_the_deadline(&llm);
    let bus = Arc::new(FaultyBus::new(Arc::new(InProcessBus::new(256))).failing(Topic::Joined, refused(1)));
    let record = ask_on(PipelineKind::Raisf, bus.clone(), &settings, hugo(), Duration::from_secs(30)).await.unwrap();
    assert_eq!(bus.failures(), 1, "the injected failure happened");
    assert!(matches!(record, AnswerRecord::Answered(_)), "{record:?}");
}

/// A joined parent the bus will never take (over the broker's size limit even trimmed) ends its
/// question in an error record from the join, with the question and its trace, and the record as a
/// dead letter. Here the parent goes on from a tick, past its deadline: it must not fail again on
/// every tick, leaving the question without a record.
#[actix::test]
async fn a_joined_parent_the_bus_rejects_for_good_ends_its_question_in_an_error_record() {
    let llm = FakeLlm::start(slow_second_subquestion).await;
    let settings = past_the_deadline(&llm);
    let (error, letter) = rejected_for_good(PipelineKind::Raisf, &settings, Topic::Joined).await;
    assert_eq!(error.stage, "join");
    assert_eq!(error.question, hugo().question, "the record names its question");
    assert!(error.trace.iter().any(|step| step.stage.contains('@')), "the children's steps are in its trace");
    assert_eq!((letter.stage.as_str(), letter.original_topic), ("join", Topic::Joined));
}

/// Asks the Hugo question through `kind` on a bus that rejects every record for `topic` for good:
/// the question's error record (`publish_rejected`, naming the rejection) and the first dead letter.
async fn rejected_for_good(kind: PipelineKind, settings: &Settings, topic: Topic) -> (ErrorRecord, DeadLetter) {
    let inner: Arc<dyn Bus> = Arc::new(InProcessBus::new(256));
    let mut dead_letters = inner.subscribe(&[Topic::DeadLetters], "test").await.unwrap();
    let bus = Arc::new(
        FaultyBus::new(inner).failing(topic, |_, _| Some(BusError::Rejected("message too large (injected)".into()))),
    );
    let record = ask_on(kind, bus, settings, hugo(), Duration::from_secs(30)).await.unwrap();
    let AnswerRecord::Error(error) = record else { panic!("expected an error record, got {record:?}") };
    assert_eq!(error.error_type, "publish_rejected");
    assert!(error.message.contains("message too large"), "{}", error.message);
    let letter = tokio::time::timeout(Duration::from_secs(5), dead_letters.next()).await.unwrap().unwrap();
    (error, lacuna::topics::Event::from_payload(&letter.record.payload).unwrap())
}

fn migres_settings(llm: &FakeLlm) -> Settings {
    let mut settings = support::settings(&llm.base_url);
    small(&mut settings);
    settings.retry.backoff_ms = 10;
    settings
}

/// A broker that refuses two publishes in a row (a leader election, a full disk) delays the question;
/// it does not lose it.
#[actix::test]
async fn a_publish_refused_twice_is_retried_and_the_question_answered() {
    let llm = FakeLlm::start(hugo_script).await;
    let settings = migres_settings(&llm);
    let bus = Arc::new(
        FaultyBus::new(Arc::new(InProcessBus::new(256)))
            .failing(Topic::Queries, |_, n| (n <= 2).then(|| BusError::Transport("not the leader (injected)".into()))),
    );
    let record = ask_on(PipelineKind::Migres, bus.clone(), &settings, hugo(), Duration::from_secs(30)).await.unwrap();
    assert_eq!(bus.failures(), 2);
    assert!(matches!(record, AnswerRecord::Answered(_)), "{record:?}");
}

/// A publish the bus rejects for good (a record over the broker's size limit, an unknown topic, no
/// authorisation) ends the question in an error record naming the stage and keeps the input as a
/// dead letter.
#[actix::test]
async fn an_output_rejected_for_good_ends_its_question_in_an_error_record_and_a_dead_letter() {
    let llm = FakeLlm::start(hugo_script).await;
    let (error, letter) = rejected_for_good(PipelineKind::Migres, &migres_settings(&llm), Topic::Facts).await;
    assert_eq!(error.stage, "leaf");
    assert_eq!((letter.stage.as_str(), letter.original_topic), ("leaf", Topic::Evidence));
}

/// Events carry the question's whole trace, which grows with every iteration. One that would pass
/// `bus.max_event_bytes` loses its bulkiest, least useful steps first (scores of passages never
/// shown), says so in the trace, and goes on. Here the question never becomes answerable, so it runs
/// all its iterations, and a bus that refuses anything over the limit checks that nothing is.
#[actix::test]
async fn an_event_over_the_size_limit_is_trimmed_and_says_so() {
    const LIMIT: usize = 30_000;
    let queries = std::sync::atomic::AtomicUsize::new(0);
    let llm = FakeLlm::start(move |prompt| match prompt_kind(prompt) {
        Prompt::Main => Reply::Json(json!({"answerable": false, "answer": "unanswerable", "confidence": 1,
            "explanation": "not yet", "missing_information": "More about the club."})),
        Prompt::QueryGen => {
            let n = queries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Reply::Json(json!({"queries": [format!("FC Cartagena football club history part {n}")]}))
        }
        _ => hugo_script(prompt),
    })
    .await;
    let mut settings = migres_settings(&llm);
    settings.migres.retrieve_top_n = 20;
    settings.bus.max_event_bytes = LIMIT;
    let size = std::sync::Arc::new(std::sync::Mutex::new(0));
    let mut bus = FaultyBus::new(Arc::new(InProcessBus::new(256)));
    for topic in Topic::ALL {
        let size = size.clone();
        bus = bus.failing(topic, move |record, _| {
            let mut largest = size.lock().unwrap();
            *largest = record.payload.len().max(*largest);
            (record.payload.len() > LIMIT).then(|| BusError::Rejected(format!("{} bytes", record.payload.len())))
        });
    }
    let bus = Arc::new(bus);
    let record = ask_on(PipelineKind::Migres, bus.clone(), &settings, hugo(), Duration::from_secs(60)).await.unwrap();
    let AnswerRecord::Answered(answer) = record else { panic!("expected an answer, got {record:?}") };
    assert_eq!(answer.iterations, 5, "the question ran all its iterations");
    assert_eq!(bus.failures(), 0, "no record over the limit reached the bus (largest {})", size.lock().unwrap());
    let trace = serde_json::to_string(&answer.trace).unwrap();
    assert!(trace.contains("\"kind\":\"trimmed\""), "the trace says it was trimmed (largest {})", size.lock().unwrap());
    assert!(!answer.facts.is_empty() && !answer.passages.is_empty(), "what the answer rests on is kept");
}

/// A stage whose feed from the bus ends (its Kafka poller panicked or stopped) can do no more work:
/// an in-process run says so instead of waiting forever for answers that cannot come.
#[actix::test]
async fn a_run_whose_stage_feed_dies_returns_an_error_instead_of_hanging() {
    let llm = FakeLlm::start(hugo_script).await;
    let settings = migres_settings(&llm);
    let bus = Arc::new(FaultyBus::new(Arc::new(InProcessBus::new(256))).ending_feed("verify", 0));
    let outcome = ask_on(PipelineKind::Migres, bus, &settings, hugo(), Duration::from_secs(30)).await;
    let error = outcome.expect_err("no answer can come without verify");
    assert!(error.contains("the run failed") && error.contains("verify"), "{error}");
}

/// `lacuna stage` serving a stage whose feed dies turns unready and returns an error, so the
/// process exits non-zero and Kubernetes restarts it.
#[actix::test]
async fn a_stage_process_whose_feed_dies_turns_unready_and_exits_with_an_error() {
    let llm = FakeLlm::start(hugo_script).await;
    let settings = migres_settings(&llm);
    let bus: Arc<dyn Bus> = Arc::new(FaultyBus::new(Arc::new(InProcessBus::new(256))).ending_feed("leaf", 1));
    let stage = PipelineKind::Migres.stage("leaf").unwrap();
    let running = stage.start(bus.clone(), &settings, &support::parts(&settings)).await.unwrap();
    let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let serving = lacuna::cli::stage::run_until_stopped(running, ready.clone());
    bus.publish(lacuna::topics::Event::to_record(&leaf_input())).await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(20), serving).await;
    let error = outcome.expect("the process ends by itself").expect_err("with an error");
    assert!(error.to_string().contains("leaf"), "{error}");
    assert!(!ready.load(std::sync::atomic::Ordering::Relaxed), "/readyz says it is not ready");
}

fn leaf_input() -> lacuna::topics::EvidenceEvent {
    lacuna::topics::EvidenceEvent {
        schema_version: lacuna::topics::SCHEMA_VERSION,
        memory: lacuna::topics::Memory::new("q-leaf", "Who?"),
        queries: vec!["Who?".into()],
        evidence: Vec::new(),
    }
}

/// An LLM outage of five minutes in the middle of a run is a pause, not an error storm: the calls
/// wait while the endpoint's circuit is open and probes check it, the stages stop taking events, and
/// every question is answered once the endpoint is back.
#[actix::test]
async fn a_five_minute_llm_outage_mid_run_ends_every_question_answered() {
    const OUTAGE: Duration = Duration::from_secs(300);
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let outage_began = std::sync::Mutex::new(None::<std::time::Instant>);
    let failed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let failures = failed.clone();
    let llm = FakeLlm::start(move |prompt| {
        // Down from the 20th call on, for five minutes.
        if calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= 20 {
            let began = *outage_began.lock().unwrap().get_or_insert_with(std::time::Instant::now);
            if began.elapsed() < OUTAGE {
                failures.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                return Reply::Status(503);
            }
        }
        hugo_script(prompt)
    })
    .await;
    let settings = migres_settings(&llm);
    let (question, _, _) = support::question("hotpotqa", HUGO_QUESTION_ID);
    let questions: Vec<QuestionEvent> =
        (0..8).map(|n| QuestionEvent::new(format!("outage-{n}"), question.clone())).collect();
    let mut pipeline = Pipeline::start_on(
        PipelineKind::Migres,
        Arc::new(InProcessBus::new(256)),
        &settings,
        support::parts(&settings),
    )
    .await
    .unwrap();
    let mut records = Vec::new();
    let run = pipeline.run(questions, |record| records.push(record));
    tokio::time::timeout(OUTAGE + Duration::from_secs(120), run).await.expect("the run ends").unwrap();
    pipeline.stop();

    assert_eq!(records.len(), 8);
    for record in &records {
        let AnswerRecord::Answered(answer) = record else { panic!("expected an answer, got {record:?}") };
        assert_eq!(answer.answer, "Murcia");
    }
    // Retries without a circuit would have sent thousands; probes at growing intervals a few dozen.
    let failed = failed.load(std::sync::atomic::Ordering::SeqCst);
    assert!((1..60).contains(&failed), "{failed} calls reached the endpoint while it was down");
}

/// A stage process started while its endpoint is down behind a gateway: the start-up check gets a
/// 503, which is an answer, so the endpoint counts as seen and the breaker applies. The question waits
/// for the endpoint instead of ending in an error record after a few fast retries.
#[actix::test]
async fn an_endpoint_that_answered_the_start_up_check_with_503_gets_the_breaker() {
    const OUTAGE: Duration = Duration::from_secs(6);
    let began = std::time::Instant::now();
    let llm = FakeLlm::start(move |prompt| {
        if began.elapsed() < OUTAGE {
            return Reply::Status(503);
        }
        hugo_script(prompt)
    })
    .await;
    let settings = migres_settings(&llm);
    lacuna::pipelines::parts::check_llm(&settings).await.expect("a 503 is an answer: the endpoint is there");
    let record =
        ask_on(PipelineKind::Migres, Arc::new(InProcessBus::new(256)), &settings, hugo(), Duration::from_secs(60))
            .await
            .unwrap();
    let AnswerRecord::Answered(answer) = record else { panic!("expected an answer after the outage, got {record:?}") };
    assert_eq!(answer.answer, "Murcia");
}

/// A question that has spent its LLM budget stops there, in an explicit `budget_exceeded` error
/// record naming the stage that found it spent, with its event kept as a dead letter for a replay
/// with a larger budget.
#[actix::test]
async fn a_question_over_its_llm_budget_ends_in_a_budget_exceeded_record() {
    let llm = FakeLlm::start(hugo_script).await;
    let mut settings = migres_settings(&llm);
    // The Hugo question needs two iterations, about six calls.
    settings.budget.max_llm_calls = 3;
    let inner: Arc<dyn Bus> = Arc::new(InProcessBus::new(256));
    let mut dead_letters = inner.subscribe(&[Topic::DeadLetters], "test").await.unwrap();
    let record = ask_on(PipelineKind::Migres, inner, &settings, hugo(), Duration::from_secs(30)).await.unwrap();
    let AnswerRecord::Error(error) = record else { panic!("expected an error record, got {record:?}") };
    assert_eq!(error.error_type, "budget_exceeded");
    assert!(error.message.contains("budget.max_llm_calls = 3"), "{}", error.message);
    let calls = error.trace.iter().filter(|s| matches!(s.kind, lacuna::topics::TraceKind::LlmCall { .. })).count();
    assert!((3..=4).contains(&calls), "stopped at the first stage that found the budget spent: {calls} calls");
    let letter = tokio::time::timeout(Duration::from_secs(5), dead_letters.next()).await.unwrap().unwrap();
    let letter: lacuna::topics::dead_letter::DeadLetter =
        lacuna::topics::Event::from_payload(&letter.into_record().payload).unwrap();
    assert_eq!(letter.error_type, "budget_exceeded");
}

/// A stage whose LLM calls keep failing is retried, and every attempt's calls count: the question
/// stops at its budget, not after `retry.max_attempts` tries that each spent as if it were the first.
#[actix::test]
async fn the_calls_of_failed_attempts_count_against_the_budget() {
    let llm = FakeLlm::start(|prompt| match prompt_kind(prompt) {
        Prompt::Leaf => Reply::Status(500),
        _ => hugo_script(prompt),
    })
    .await;
    let mut settings = migres_settings(&llm);
    settings.retry.max_attempts = 8;
    settings.llm.max_retries = 0;
    // The first iteration searches the question itself: the leaf's call is the first of all.
    settings.budget.max_llm_calls = 3;
    let record =
        ask_on(PipelineKind::Migres, Arc::new(InProcessBus::new(256)), &settings, hugo(), Duration::from_secs(30))
            .await
            .unwrap();
    let AnswerRecord::Error(error) = record else { panic!("expected an error record, got {record:?}") };
    assert_eq!(error.error_type, "budget_exceeded", "{}", error.message);
    assert_eq!(error.stage, "leaf");
    assert_eq!(llm.calls_of(Prompt::Leaf), 3, "three failed attempts spent the budget of three calls");
}

/// With a price for the model, every answer says what its LLM calls cost, in all and by stage.
#[actix::test]
async fn an_answer_says_what_its_llm_calls_cost_by_stage() {
    let llm = FakeLlm::start(hugo_script).await;
    let mut settings = migres_settings(&llm);
    let price = lacuna::config::Price { prompt: 1.0, completion: 2.0, cached: Some(0.5) };
    settings.llm.prices.insert(settings.llm.model.clone(), price);
    let bus = Arc::new(InProcessBus::new(256));
    let record = ask_on(PipelineKind::Migres, bus, &settings, hugo(), Duration::from_secs(30)).await.unwrap();
    let AnswerRecord::Answered(answer) = record else { panic!("expected an answer, got {record:?}") };
    // Each fake call: 60 fresh prompt tokens at 1, 40 cached at 0.5 and 10 written at 2 per million.
    let expected = f64::from(answer.usage.llm_calls) * 100.0 / 1e6;
    assert!((answer.usage.cost - expected).abs() < 1e-12, "{} != {expected}", answer.usage.cost);
    let stages: Vec<&str> = answer.usage.cost_by_stage.keys().map(String::as_str).collect();
    assert_eq!(stages, ["leaf", "main", "query_gen", "verify"]);
    let by_stage: f64 = answer.usage.cost_by_stage.values().sum();
    assert!((by_stage - answer.usage.cost).abs() < 1e-12);
}

/// Progress is best-effort: with every progress publish refused (and, in process, nobody reading the
/// topic), the question is answered all the same and the losses are counted.
#[actix::test]
async fn progress_publishes_that_all_fail_never_fail_the_question() {
    let llm = FakeLlm::start(hugo_script).await;
    let mut settings = migres_settings(&llm);
    settings.bus.progress = true;
    let dropped = || lacuna::metrics::METRICS.progress_dropped.with_label_values(&["leaf"]).get();
    let before = dropped();
    let bus = Arc::new(
        FaultyBus::new(Arc::new(InProcessBus::new(256)))
            .failing(Topic::Progress, |_, _| Some(BusError::Transport("progress refused (injected)".into()))),
    );
    let record = ask_on(PipelineKind::Migres, bus.clone(), &settings, hugo(), Duration::from_secs(30)).await.unwrap();
    let AnswerRecord::Answered(answer) = record else { panic!("expected an answer, got {record:?}") };
    assert_eq!(answer.answer, "Murcia");
    assert!(bus.failures() >= 4, "every stage's progress was refused: {}", bus.failures());
    assert!(dropped() > before, "the refused progress is counted");
}
