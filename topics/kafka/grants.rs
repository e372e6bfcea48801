//! Which of the ACLs a process needs the cluster's authorizer does not grant it, asked before a
//! stage starts, so that a missing ACL keeps the stage unready with the rule named, instead of a
//! crash loop or a stream that takes records and cannot send them on.
//!
//! Kafka answers DescribeTopics and DescribeGroups with the operations the asking principal may
//! perform on each (KIP-430), which tells a missing Write from a missing Read without writing or
//! reading anything. rdkafka 0.39 wraps neither, so this calls librdkafka's C API as `identity`
//! does. A transactional id has no such question: its Write shows when the producer is initialised.

use std::ffi::{CStr, CString, c_char};
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};
use rdkafka::error::RDKafkaErrorCode;

use crate::topics::bus::BusError;

/// One ALLOW rule, in the words of Kafka's ACL API (`ResourceType`, `PatternType`, `AclOperation`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    pub principal: String,
    /// `TOPIC`, `GROUP` or `TRANSACTIONAL_ID`.
    pub resource: &'static str,
    /// `LITERAL`, or `PREFIXED` for a name that is a prefix.
    pub pattern: &'static str,
    pub name: String,
    /// `READ`, `WRITE`, `CREATE` or `DESCRIBE_CONFIGS` (Read and Write imply Describe).
    pub operation: &'static str,
}

impl Acl {
    /// The line `scripts/kafka.sh acls` reads: principal, resource, pattern, name, operation.
    pub fn line(&self) -> String {
        format!("{} {} {} {} {}", self.principal, self.resource, self.pattern, self.name, self.operation)
    }

    fn code(&self) -> Option<rd::rd_kafka_AclOperation_t> {
        use rd::rd_kafka_AclOperation_t::*;
        match self.operation {
            "READ" => Some(RD_KAFKA_ACL_OPERATION_READ),
            "WRITE" => Some(RD_KAFKA_ACL_OPERATION_WRITE),
            "DESCRIBE_CONFIGS" => Some(RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS),
            _ => None,
        }
    }

    /// The name asked about: a prefixed group rule is asked of the group every stage uses under
    /// it, `<prefix><stage>.claims`.
    fn asked(&self) -> String {
        match (self.resource, self.pattern) {
            ("GROUP", "PREFIXED") => format!("{}claims", self.name),
            _ => self.name.clone(),
        }
    }
}

impl std::fmt::Display for Acl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pattern = if self.pattern == "PREFIXED" { " (prefixed)" } else { "" };
        write!(f, "{} on {} {}{pattern} for {}", self.operation, self.resource, self.name, self.principal)
    }
}

/// Of `needed`, the topic and group rules the cluster does not grant, asked in one DescribeTopics
/// and one DescribeGroups request. A topic that does not exist is missing too, as Create on it
/// (`lacuna topics` creates a pipeline's topics as a principal that may). An answer without
/// operations (a broker before Kafka 2.3) is not judged.
pub(super) fn missing<C: ClientContext>(
    client: &Client<C>,
    needed: &[Acl],
    timeout: Duration,
) -> Result<Vec<Acl>, BusError> {
    let mut missing = Vec::new();
    for resource in ["TOPIC", "GROUP"] {
        let asked: Vec<&Acl> = needed.iter().filter(|acl| acl.resource == resource && acl.code().is_some()).collect();
        if asked.is_empty() {
            continue;
        }
        let mut names: Vec<String> = asked.iter().map(|acl| acl.asked()).collect();
        names.sort();
        names.dedup();
        let answers = describe(client, resource, &names, timeout)?;
        for acl in asked {
            let granted = match answers.iter().find(|(name, _)| *name == acl.asked()).map(|(_, answer)| answer) {
                Some(Answer::Denied) => false,
                Some(Answer::Operations(operations)) => acl.code().is_none_or(|code| operations.contains(&code)),
                Some(Answer::Absent) => {
                    let create = Acl { operation: "CREATE", ..acl.clone() };
                    if !missing.contains(&create) {
                        missing.push(create);
                    }
                    true
                }
                Some(Answer::NotJudged) | None => true,
            };
            if !granted {
                missing.push(acl.clone());
            }
        }
    }
    Ok(missing)
}

enum Answer {
    /// Not even Describe: the broker says only that it is not authorized.
    Denied,
    Operations(Vec<rd::rd_kafka_AclOperation_t>),
    /// A topic that does not exist.
    Absent,
    NotJudged,
}

/// One DescribeTopics (`TOPIC`) or DescribeConsumerGroups (`GROUP`) request for `names`, with the
/// operations the principal is authorized for.
fn describe<C: ClientContext>(
    client: &Client<C>,
    resource: &str,
    names: &[String],
    timeout: Duration,
) -> Result<Vec<(String, Answer)>, BusError> {
    let names: Vec<CString> = names
        .iter()
        .map(|name| CString::new(name.as_str()))
        .collect::<Result<_, _>>()
        .map_err(|e| BusError::Config(e.to_string()))?;
    let mut pointers: Vec<*const c_char> = names.iter().map(|name| name.as_ptr()).collect();
    let timeout_ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    let topics = resource == "TOPIC";
    // SAFETY: every pointer comes from librdkafka and is destroyed once, after its last use here;
    // the descriptions and their errors are owned by the event, read before it is destroyed; the
    // names outlive the request, which copies them.
    unsafe {
        let rk = client.native_ptr();
        let queue = rd::rd_kafka_queue_new(rk);
        let op = if topics {
            rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS
        } else {
            rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBECONSUMERGROUPS
        };
        let options = rd::rd_kafka_AdminOptions_new(rk, op);
        let mut errstr = [0 as c_char; 256];
        rd::rd_kafka_AdminOptions_set_request_timeout(options, timeout_ms, errstr.as_mut_ptr(), errstr.len());
        let error = rd::rd_kafka_AdminOptions_set_include_authorized_operations(options, 1);
        if !error.is_null() {
            rd::rd_kafka_error_destroy(error);
        }
        let mut collection = std::ptr::null_mut();
        if topics {
            collection = rd::rd_kafka_TopicCollection_of_topic_names(pointers.as_mut_ptr(), pointers.len());
            rd::rd_kafka_DescribeTopics(rk, collection, options, queue);
        } else {
            rd::rd_kafka_DescribeConsumerGroups(rk, pointers.as_mut_ptr(), pointers.len(), options, queue);
        }
        // The request's own timeout ends it first; the margin only bounds a librdkafka that never answers.
        let event = rd::rd_kafka_queue_poll(queue, timeout_ms.saturating_add(5_000));
        let answer = if event.is_null() {
            Err(BusError::Transport(format!("asking which {resource} ACLs are granted: no answer")))
        } else {
            read_answers(event, topics)
        };
        if !event.is_null() {
            rd::rd_kafka_event_destroy(event);
        }
        if !collection.is_null() {
            rd::rd_kafka_TopicCollection_destroy(collection);
        }
        rd::rd_kafka_AdminOptions_destroy(options);
        rd::rd_kafka_queue_destroy(queue);
        answer
    }
}

/// Each described name with what the principal may do with it.
///
/// # Safety
/// `event` is a live DescribeTopics (`topics`) or DescribeConsumerGroups result event.
unsafe fn read_answers(event: *mut rd::rd_kafka_event_t, topics: bool) -> Result<Vec<(String, Answer)>, BusError> {
    // SAFETY: the caller's event owns everything read here, and outlives this call.
    unsafe {
        let text = |s: *const c_char| {
            if s.is_null() { String::new() } else { CStr::from_ptr(s).to_string_lossy().into_owned() }
        };
        let code = RDKafkaErrorCode::from(rd::rd_kafka_event_error(event));
        if code != RDKafkaErrorCode::NoError {
            let why = text(rd::rd_kafka_event_error_string(event));
            return Err(BusError::Transport(format!("asking which ACLs are granted: {code}: {why}")));
        }
        let mut count = 0usize;
        let mut answers = Vec::new();
        if topics {
            let result = rd::rd_kafka_event_DescribeTopics_result(event);
            let descriptions = if result.is_null() {
                std::ptr::null_mut()
            } else {
                rd::rd_kafka_DescribeTopics_result_topics(result, &mut count)
            };
            for i in 0..if descriptions.is_null() { 0 } else { count } {
                let description = *descriptions.add(i);
                let name = text(rd::rd_kafka_TopicDescription_name(description));
                let mut operations = 0usize;
                let list = rd::rd_kafka_TopicDescription_authorized_operations(description, &mut operations);
                let error = rd::rd_kafka_TopicDescription_error(description);
                answers.push((name, answer(error, list, operations)));
            }
        } else {
            let result = rd::rd_kafka_event_DescribeConsumerGroups_result(event);
            let descriptions = if result.is_null() {
                std::ptr::null_mut()
            } else {
                rd::rd_kafka_DescribeConsumerGroups_result_groups(result, &mut count)
            };
            for i in 0..if descriptions.is_null() { 0 } else { count } {
                let description = *descriptions.add(i);
                let name = text(rd::rd_kafka_ConsumerGroupDescription_group_id(description));
                let mut operations = 0usize;
                let list = rd::rd_kafka_ConsumerGroupDescription_authorized_operations(description, &mut operations);
                let error = rd::rd_kafka_ConsumerGroupDescription_error(description);
                answers.push((name, answer(error, list, operations)));
            }
        }
        Ok(answers)
    }
}

/// One description's error and operations as an [`Answer`].
///
/// # Safety
/// `error` is null or a live error, `list` null or `count` live operations.
unsafe fn answer(error: *const rd::rd_kafka_error_t, list: *const rd::rd_kafka_AclOperation_t, count: usize) -> Answer {
    // SAFETY: as the caller promises.
    unsafe {
        let code = if error.is_null() {
            RDKafkaErrorCode::NoError
        } else {
            RDKafkaErrorCode::from(rd::rd_kafka_error_code(error))
        };
        match code {
            RDKafkaErrorCode::TopicAuthorizationFailed | RDKafkaErrorCode::GroupAuthorizationFailed => Answer::Denied,
            RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic => Answer::Absent,
            RDKafkaErrorCode::NoError if !list.is_null() && count > 0 => {
                Answer::Operations(std::slice::from_raw_parts(list, count).to_vec())
            }
            _ => Answer::NotJudged,
        }
    }
}
