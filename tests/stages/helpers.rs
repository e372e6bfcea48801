//! Building and reading events in stage tests.

use lacuna::topics::{Event, Memory, Record};

pub fn memory(question: &str) -> Memory {
    let mut memory = Memory::new("q1", question);
    memory.queries.push(question.to_string());
    memory
}

/// The single output of a stage, decoded as `E` (panics if the topic differs).
pub fn single<E: Event>(outputs: Vec<Record>) -> E {
    assert_eq!(outputs.len(), 1, "expected one output record");
    assert_eq!(outputs[0].topic, E::TOPIC, "output went to the wrong topic");
    E::from_payload(&outputs[0].payload).expect("output decodes")
}
