//! The Kafka ACLs each process of a pipeline needs, read off its declaration and the settings: what
//! `lacuna acls` prints for an authorizer, what docs/kafka.md's table says in words, and what a
//! stage checks its own grants against before it starts.

use crate::config::{DeliveryGuarantee, Settings};
use crate::pipelines::parts::Part;
use crate::pipelines::{PipelineKind, graph};
use crate::topics::Topic;
pub use crate::topics::kafka::Acl;

/// Who runs what: the processes of a pipeline that need ACLs of their own. `serve`, `ingest` and
/// `indexer` over Kafka (`--transport kafka`; the indexer always).
pub const CLIENTS: [&str; 7] = ["submit", "answers", "dlq-replay", "topics", "serve", "ingest", "indexer"];

/// The ACLs `principal` needs to run `name` of `kind`'s pipeline: one of its stages, or one of
/// [`CLIENTS`]. None for a name that is neither.
pub fn needed(settings: &Settings, kind: PipelineKind, name: &str, principal: &str) -> Option<Vec<Acl>> {
    let prefix = kind.kafka_settings(&settings.kafka).topic_prefix;
    let stages = kind.stages();
    let used = graph::topics(stages);
    let acl = |resource, pattern, name: String, operation| Acl {
        principal: principal.to_string(),
        resource,
        pattern,
        name,
        operation,
    };
    let topic = |topic: Topic, operation| acl("TOPIC", "LITERAL", format!("{prefix}{}", topic.name()), operation);
    let group = |group: &str| acl("GROUP", "LITERAL", format!("{prefix}{group}"), "READ");
    // The corpus's topics are every pipeline's: they have the plain prefix. Its readers follow it
    // outside any group, but librdkafka still finds the coordinator of the group they name.
    let plain = &settings.kafka.topic_prefix;
    let documents = |operation| acl("TOPIC", "LITERAL", format!("{plain}documents"), operation);
    let dead_documents = |operation| acl("TOPIC", "LITERAL", format!("{plain}documents-dead-letters"), operation);
    // A follower of the corpus (a retrieve replica, the Meilisearch indexer) also reads the topic's
    // `delete.retention.ms`, to know whether it was away long enough to miss a deletion, and
    // writes what is not a document to the dead letters.
    let follower = || {
        let reader = acl("GROUP", "LITERAL", format!("{plain}documents-reader"), "READ");
        [documents("READ"), documents("DESCRIBE_CONFIGS"), dead_documents("WRITE"), reader]
    };
    // A consumer's group, and the groups it never joins whose offsets keep its notes,
    // `<group>.claims` (record starts) and, with `kafka.instance_id`, `<group>.<instance>.producer`;
    // under exactly-once, its transactional ids.
    let consumer = |name: &str| {
        let mut acls = vec![group(name), acl("GROUP", "PREFIXED", format!("{prefix}{name}."), "READ")];
        if settings.bus.delivery == DeliveryGuarantee::ExactlyOnce {
            acls.push(acl("TRANSACTIONAL_ID", "PREFIXED", format!("{prefix}{name}."), "WRITE"));
        }
        acls
    };
    let mut acls = Vec::new();
    match name {
        "submit" => {
            // A line that is not a question ends in an error record on `answers`.
            acls.extend([topic(Topic::Questions, "WRITE"), topic(Topic::Answers, "WRITE")]);
        }
        "answers" => {
            acls.push(topic(Topic::Answers, "READ"));
            acls.extend(consumer("answers-sink"));
        }
        "dlq-replay" => {
            acls.push(topic(Topic::DeadLetters, "READ"));
            acls.extend(consumer("dlq-replay"));
            let inputs = stages.iter().flat_map(|s| s.inputs.iter().copied());
            let mut inputs: Vec<Topic> = inputs.collect();
            inputs.sort();
            inputs.dedup();
            acls.extend(inputs.into_iter().map(|t| topic(t, "WRITE")));
        }
        "topics" => {
            acls.extend(used.iter().map(|t| topic(*t, "CREATE")));
            if settings.search.follow_documents {
                acls.extend([documents("CREATE"), dead_documents("CREATE")]);
            }
        }
        "serve" => {
            // Its replicas follow answers and progress outside any group, under groups named
            // `serve-<replica>` and `serve-<replica>-progress`.
            acls.extend([topic(Topic::Questions, "WRITE"), topic(Topic::Answers, "READ")]);
            acls.extend([topic(Topic::Progress, "READ"), acl("GROUP", "PREFIXED", format!("{prefix}serve-"), "READ")]);
            if !settings.serve.documents_token_env.is_empty() {
                acls.push(documents("WRITE"));
            }
        }
        "ingest" => acls.push(documents("WRITE")),
        "indexer" => acls.extend(follower()),
        stage => {
            let decl = stages.iter().find(|s| s.name == stage)?;
            acls.extend(decl.inputs.iter().map(|t| topic(*t, "READ")));
            // Every stage can end a question with an error record and send its event to the dead
            // letters; a sub-question's error record goes to `joins`.
            let mut outputs: Vec<Topic> = decl.outputs.to_vec();
            outputs.extend([Topic::Answers, Topic::DeadLetters]);
            if used.contains(&Topic::Joins) {
                outputs.push(Topic::Joins);
            }
            if settings.bus.progress {
                outputs.push(Topic::Progress);
            }
            outputs.sort();
            outputs.dedup();
            acls.extend(outputs.into_iter().map(|t| topic(t, "WRITE")));
            if decl.outputs.contains(&Topic::JoinState) {
                acls.extend([topic(Topic::JoinState, "READ"), group("table-reader")]);
            }
            acls.extend(consumer(stage));
            if settings.search.follow_documents && decl.needs(Part::Search) {
                acls.extend(follower());
            }
        }
    }
    Some(acls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(settings: &Settings, name: &str) -> Vec<String> {
        needed(settings, PipelineKind::Migres, name, &format!("User:{name}")).unwrap().iter().map(Acl::line).collect()
    }

    #[test]
    fn a_stage_reads_its_inputs_writes_its_outputs_and_owns_its_groups_and_transactional_ids() {
        let settings = Settings::defaults();
        assert!(settings.bus.delivery == DeliveryGuarantee::ExactlyOnce, "the default delivers exactly once");
        assert_eq!(
            lines(&settings, "leaf"),
            [
                "User:leaf TOPIC LITERAL lacuna.evidence READ",
                "User:leaf TOPIC LITERAL lacuna.facts WRITE",
                "User:leaf TOPIC LITERAL lacuna.answers WRITE",
                "User:leaf TOPIC LITERAL lacuna.dead_letters WRITE",
                "User:leaf GROUP LITERAL lacuna.leaf READ",
                "User:leaf GROUP PREFIXED lacuna.leaf. READ",
                "User:leaf TRANSACTIONAL_ID PREFIXED lacuna.leaf. WRITE",
            ]
        );
    }

    #[test]
    fn at_least_once_needs_no_transactional_id_and_progress_needs_its_topic() {
        let mut settings = Settings::defaults();
        settings.bus.delivery = DeliveryGuarantee::AtLeastOnce;
        settings.bus.progress = true;
        let leaf = lines(&settings, "leaf");
        assert!(!leaf.iter().any(|line| line.contains("TRANSACTIONAL_ID")), "{leaf:?}");
        assert!(leaf.contains(&"User:leaf TOPIC LITERAL lacuna.progress WRITE".to_string()), "{leaf:?}");
    }

    #[test]
    fn another_pipelines_join_reads_its_table_and_names_are_prefixed_with_the_pipeline() {
        let settings = Settings::defaults();
        let join = needed(&settings, PipelineKind::Rqrag, "join", "User:j").unwrap();
        let join: Vec<String> = join.iter().map(Acl::line).collect();
        assert!(join.contains(&"User:j TOPIC LITERAL lacuna.rqrag.join_state READ".to_string()), "{join:?}");
        assert!(join.contains(&"User:j GROUP LITERAL lacuna.rqrag.table-reader READ".to_string()), "{join:?}");
        assert!(needed(&settings, PipelineKind::Migres, "no-such-stage", "User:x").is_none());
    }

    /// `lacuna serve`, `lacuna ingest` and `lacuna indexer` over Kafka run as principals of their
    /// own too; a follower of the corpus names the group its reader gives librdkafka, and `lacuna
    /// topics` creates the corpus's topics where the corpus is followed.
    #[test]
    fn serve_ingest_and_the_indexer_have_rules_of_their_own_and_the_corpus_followers_name_their_group() {
        let mut settings = Settings::defaults();
        settings.search.follow_documents = true;
        assert_eq!(
            lines(&settings, "serve"),
            [
                "User:serve TOPIC LITERAL lacuna.questions WRITE",
                "User:serve TOPIC LITERAL lacuna.answers READ",
                "User:serve TOPIC LITERAL lacuna.progress READ",
                "User:serve GROUP PREFIXED lacuna.serve- READ",
            ]
        );
        assert_eq!(lines(&settings, "ingest"), ["User:ingest TOPIC LITERAL lacuna.documents WRITE"]);
        let follower = |name: &str| {
            [
                format!("User:{name} TOPIC LITERAL lacuna.documents READ"),
                format!("User:{name} TOPIC LITERAL lacuna.documents DESCRIBE_CONFIGS"),
                format!("User:{name} TOPIC LITERAL lacuna.documents-dead-letters WRITE"),
                format!("User:{name} GROUP LITERAL lacuna.documents-reader READ"),
            ]
        };
        assert_eq!(lines(&settings, "indexer"), follower("indexer"));
        let retrieve = lines(&settings, "retrieve");
        assert!(follower("retrieve").iter().all(|rule| retrieve.contains(rule)), "{retrieve:?}");
        let topics = lines(&settings, "topics");
        assert!(topics.contains(&"User:topics TOPIC LITERAL lacuna.documents CREATE".to_string()), "{topics:?}");
        // With its documents routes on, serve publishes to the corpus.
        settings.serve.documents_token_env = "LACUNA_DOCUMENTS_TOKEN".into();
        assert!(lines(&settings, "serve").contains(&"User:serve TOPIC LITERAL lacuna.documents WRITE".to_string()));
    }
}
