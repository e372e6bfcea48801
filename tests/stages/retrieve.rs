use lacuna::actors::runner::Stage;
use lacuna::actors::stages::retrieve::Retrieve;
use lacuna::config::Settings;
use lacuna::topics::{Event, PassagesEvent, QueriesEvent, QuestionEvent, SCHEMA_VERSION, TraceKind};

use crate::helpers::{memory, single};
use crate::support;

fn stage() -> Retrieve {
    Retrieve::new(lacuna::actors::clients::Search::Tantivy(support::search()), Settings::defaults().migres)
}

#[tokio::test]
async fn first_iteration_searches_with_the_question_itself() {
    let (question, _, gold) = support::question("hotpotqa", "5a8268aa55429940e5e1a8aa");
    let event = QuestionEvent::new("q1", question.clone());
    let out: PassagesEvent = single(stage().process(&event.to_record()).await.unwrap());

    assert_eq!(out.memory.iteration, 1);
    assert_eq!(out.memory.queries, vec![question.clone()]);
    assert_eq!(out.queries, vec![question]);
    assert_eq!(out.hits.len(), 50, "top n = 50 per query");
    assert!(out.hits.iter().any(|h| h.passage.id == gold[0]), "the first-hop gold passage is retrieved");
    assert!(matches!(out.memory.trace[0].kind, TraceKind::Retrieved { .. }));
}

#[tokio::test]
async fn used_up_passages_are_not_retrieved_again() {
    let query = "In which autonomous community is FC Cartagena based?".to_string();
    let mut m = memory("Hugo Rodríguez Romero plays for a team in the autonomous community of what?");
    let first: PassagesEvent = single(
        stage()
            .process(
                &QueriesEvent { schema_version: SCHEMA_VERSION, memory: m.clone(), queries: vec![query.clone()] }
                    .to_record(),
            )
            .await
            .unwrap(),
    );
    let top = first.hits[0].passage.id.clone();
    m.passage_uses.insert(top.clone(), 2);
    let second: PassagesEvent = single(
        stage()
            .process(&QueriesEvent { schema_version: SCHEMA_VERSION, memory: m, queries: vec![query] }.to_record())
            .await
            .unwrap(),
    );
    assert!(second.hits.iter().all(|h| h.passage.id != top), "a passage used twice is never shown again");
}

#[tokio::test]
async fn a_passage_found_by_two_queries_is_passed_on_once() {
    let queries =
        vec!["FC Cartagena autonomous community".to_string(), "FC Cartagena football team Murcia".to_string()];
    let event = QueriesEvent { schema_version: SCHEMA_VERSION, memory: memory("q"), queries };
    let out: PassagesEvent = single(stage().process(&event.to_record()).await.unwrap());
    let mut ids: Vec<_> = out.hits.iter().map(|h| h.passage.id.clone()).collect();
    let before = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), before);
    assert!(before > 50, "two queries bring more than one query's 50");
}

/// With the `option_unseen` check (issue 76), a question about two named things is also searched
/// with one query per thing, and each thing's own page comes near the top of its query's hits.
#[tokio::test]
async fn with_the_option_unseen_check_each_of_two_options_is_searched_on_its_own() {
    let (question, _, gold) = support::question("hotpotqa", "5a8b6ee255429950cd6afcfd");
    let mut settings = Settings::defaults().migres;
    settings.read_first_goes_on_when.push(lacuna::config::GoOnWhen::OptionUnseen);
    let looking_up_each = Retrieve::new(lacuna::actors::clients::Search::Tantivy(support::search()), settings);
    let out: PassagesEvent =
        single(looking_up_each.process(&QuestionEvent::new("q1", question.clone()).to_record()).await.unwrap());
    assert_eq!(out.queries.len(), 3, "{:?}", out.queries);
    assert_eq!(out.queries[0], question);
    assert_eq!(out.memory.queries, out.queries);
    let top = |query: &str, n: usize| -> Vec<String> {
        out.memory
            .trace
            .iter()
            .find_map(|step| match &step.kind {
                TraceKind::Retrieved { query: q, hits, .. } if q == query => {
                    Some(hits.iter().take(n).map(|(id, _)| id.clone()).collect())
                }
                _ => None,
            })
            .unwrap()
    };
    for gold_page in &gold {
        assert!(
            out.queries[1..].iter().any(|q| top(q, 3).contains(gold_page)),
            "{gold_page} not in the top three of its option's query: {:?}",
            out.queries
        );
    }
    // Off by default: the question alone.
    let plain: PassagesEvent =
        single(stage().process(&QuestionEvent::new("q1", question.clone()).to_record()).await.unwrap());
    assert_eq!(plain.queries, [question]);
}
