//! Events of one key (one question, or one fanned-out tree at the join) are handled in the order
//! they arrived, as Kafka delivers a partition's; events of different keys run side by side. A
//! stage works on several events at once, and without this a join could see a child's result before
//! the registration that announced it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use tokio::sync::oneshot;

/// Per key, the number of the last event taken and the signal that it finished.
type LastTaken = HashMap<String, (u64, oneshot::Receiver<()>)>;

/// Per key, the last event taken: the next one with that key waits for it to finish.
#[derive(Clone, Default)]
pub struct KeyOrder {
    last: Rc<RefCell<LastTaken>>,
    taken: Rc<RefCell<u64>>,
}

/// An event's place in its key's line: wait for the one before, then hold the line until dropped.
pub struct Turn {
    order: KeyOrder,
    key: String,
    number: u64,
    previous: Option<oneshot::Receiver<()>>,
    _done: oneshot::Sender<()>,
}

impl KeyOrder {
    /// Takes the next place in `key`'s line. Called in arrival order (the actor's handler), so the
    /// places follow the order of delivery.
    pub fn take(&self, key: &str) -> Turn {
        let number = {
            let mut taken = self.taken.borrow_mut();
            *taken += 1;
            *taken
        };
        let (done, after_me) = oneshot::channel();
        let previous = self.last.borrow_mut().insert(key.to_string(), (number, after_me)).map(|(_, before)| before);
        Turn { order: self.clone(), key: key.to_string(), number, previous, _done: done }
    }
}

impl Turn {
    /// Returns once every earlier event with this key has finished.
    pub async fn wait(&mut self) {
        if let Some(previous) = self.previous.take() {
            // Finished or dropped, the earlier event no longer holds the line either way.
            let _ = previous.await;
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        // The last in its line leaves no entry behind: the map holds only keys with work in flight.
        let mut last = self.order.last.borrow_mut();
        if last.get(&self.key).is_some_and(|(number, _)| *number == self.number) {
            last.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn events_of_one_key_run_in_order_and_others_alongside() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let order = KeyOrder::default();
                let log = Rc::new(RefCell::new(Vec::new()));
                let mut tasks = Vec::new();
                for (name, key, pause) in [("a1", "a", 50), ("b1", "b", 10), ("a2", "a", 0)] {
                    let mut turn = order.take(key);
                    let log = log.clone();
                    tasks.push(tokio::task::spawn_local(async move {
                        turn.wait().await;
                        tokio::time::sleep(Duration::from_millis(pause)).await;
                        log.borrow_mut().push(name);
                    }));
                }
                for task in tasks {
                    task.await.unwrap();
                }
                assert_eq!(*log.borrow(), ["b1", "a1", "a2"]);
                assert!(order.last.borrow().is_empty(), "no entry left once the lines are empty");
            })
            .await;
    }
}
