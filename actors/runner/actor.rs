//! The actix actor a stage runs in: a feeder takes deliveries from the bus while an in-flight slot is
//! free, the actor handles them (one question's events in order), a timer ticks stages that ask for
//! it, and the stage's health says whether it still runs.

use std::rc::Rc;
use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot, watch};

use super::dedupe::Window;
use super::delivery::{Handling, handle_delivery};
use super::health::{Health, StageState};
use super::key_order::KeyOrder;
use super::{RunnerSettings, Stage, StageCounters, Wiring};
use crate::topics::bus::atomically;
use crate::topics::{Bus, BusError, Delivery};

/// Held by the stage's feeder for as long as it runs: a feeder that ends without saying why (a
/// panic on the stage's thread, its arbiter stopped under it) fails the stage.
struct FeederGuard(Health);

impl Drop for FeederGuard {
    fn drop(&mut self) {
        self.0.fail("its feeder ended unexpectedly (a panic on the stage's thread?)".into());
    }
}

pub struct StageActor<S: Stage> {
    stage: Rc<S>,
    bus: Arc<dyn Bus>,
    runner: RunnerSettings,
    finished: Rc<Option<Window>>,
    /// Events of one question wait for its earlier ones.
    key_order: KeyOrder,
    counters: Arc<StageCounters>,
    wiring: Wiring,
    health: Health,
}

impl<S: Stage> Actor for StageActor<S> {
    type Context = Context<Self>;
}

/// A delivery plus the in-flight slot it occupies until it is fully handled.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Process {
    pub delivery: Delivery,
    pub slot: OwnedSemaphorePermit,
}

impl<S: Stage> Handler<Process> for StageActor<S> {
    // A ResponseFuture is spawned, so several events are processed at once (the slot bounds how
    // many), those of one key one after the other.
    type Result = ResponseFuture<()>;

    fn handle(&mut self, message: Process, _ctx: &mut Self::Context) -> Self::Result {
        let (stage, bus, counters) = (self.stage.clone(), self.bus.clone(), self.counters.clone());
        let (runner, wiring, health) = (self.runner.clone(), self.wiring, self.health.clone());
        let finished = self.finished.clone();
        // Taken here, in arrival order, not in the future below, which may first run later.
        let mut turn = self.key_order.take(&message.delivery.record.key);
        Box::pin(async move {
            turn.wait().await;
            let context = Handling {
                bus: &*bus,
                runner: &runner,
                counters: &counters,
                wiring,
                health: &health,
                finished: &finished,
            };
            handle_delivery(&*stage, &context, message.delivery).await;
            drop(turn);
            drop(message.slot);
        })
    }
}

/// The timer of a stage with [`Stage::tick_every`].
#[derive(Message)]
#[rtype(result = "()")]
struct Tick;

impl<S: Stage> Handler<Tick> for StageActor<S> {
    // Atomic: two ticks never overlap, and events wait while a tick decides.
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, _: Tick, _ctx: &mut Self::Context) -> Self::Result {
        let (stage, bus) = (self.stage.clone(), self.bus.clone());
        // What a tick publishes (the join's parents that go on, and their state deleted) is one
        // transaction's, whole, on an exactly-once bus.
        AtomicResponse::new(Box::pin(async move { atomically(&*bus, stage.tick()).await }.into_actor(self)))
    }
}

/// A stage running on its own arbiter (thread), fed from the bus.
pub struct RunningStage {
    pub name: &'static str,
    pub counters: Arc<StageCounters>,
    arbiter: Arbiter,
    stop_feeding: Arc<Notify>,
    drained: Option<oneshot::Receiver<()>>,
    health: Health,
}

impl RunningStage {
    /// Stops at once; events in flight are abandoned (a durable bus redelivers them).
    pub fn stop(&self) {
        self.health.stop();
        self.arbiter.stop();
    }

    /// Graceful shutdown: takes no new event, waits for those in flight to finish and be
    /// acknowledged, commits the bus position, then stops.
    pub async fn drain(mut self) {
        self.health.stop();
        self.stop_feeding.notify_one();
        if let Some(drained) = self.drained.take() {
            let _ = drained.await;
        }
        self.arbiter.stop();
    }

    /// Resolves with the reason once the stage has failed; never while it runs or after a stop.
    pub async fn failed(&self) -> String {
        let mut state = self.health.state.subscribe();
        // The sender lives in `self`, so the watch cannot close while this waits.
        if let Ok(state) = state.wait_for(|s| matches!(s, StageState::Failed(_))).await
            && let StageState::Failed(reason) = &*state
        {
            return reason.clone();
        }
        std::future::pending().await
    }
}

/// Opens `stage`, subscribes it to its wiring's inputs and starts it. At most `max_in_flight` events
/// are taken from the bus before earlier ones finish: the slot is acquired *before* the next record
/// is read, so a busy stage stops consuming and its input topic fills up, slowing its producers.
pub async fn spawn_stage<S: Stage>(
    stage: S,
    bus: Arc<dyn Bus>,
    wiring: Wiring,
    runner: RunnerSettings,
) -> Result<RunningStage, BusError> {
    stage.open(&bus).await?;
    let mut subscription = bus.subscribe(wiring.inputs, S::NAME).await?;
    let tick_every = stage.tick_every();
    let counters = Arc::new(StageCounters::default());
    let health = Health { name: S::NAME, state: Arc::new(watch::channel(StageState::Running).0) };
    let arbiter = Arbiter::new();
    let (max_in_flight, max_attempts) = (runner.max_in_flight, runner.retry.max_attempts);
    let (actor_bus, actor_counters, actor_health) = (bus.clone(), counters.clone(), health.clone());
    let addr = StageActor::start_in_arbiter(&arbiter.handle(), move |ctx: &mut Context<StageActor<S>>| {
        // The feeder holds a slot per event it sends, so the mailbox never holds more than
        // max_in_flight of them: that is the one bound (actix's default, 16, would be a second). Set
        // here, as the actor is made: the feeder can send before the actor's `started` has run.
        ctx.set_mailbox_capacity(max_in_flight);
        StageActor {
            stage: Rc::new(stage),
            bus: actor_bus,
            finished: Rc::new(Window::new(runner.dedupe_window)),
            key_order: KeyOrder::default(),
            runner,
            counters: actor_counters,
            wiring,
            health: actor_health,
        }
    });
    if let Some(every) = tick_every {
        let addr = addr.clone();
        arbiter.spawn(async move {
            let mut interval = tokio::time::interval(every);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                if addr.send(Tick).await.is_err() {
                    break;
                }
            }
        });
    }
    let slots = Arc::new(Semaphore::new(max_in_flight));
    let stop_feeding = Arc::new(Notify::new());
    let (drained_tx, drained) = oneshot::channel();
    let (stop, guard) = (stop_feeding.clone(), FeederGuard(health.clone()));
    let mut failures = health.state.subscribe();
    arbiter.spawn(async move {
        let health = &guard.0;
        loop {
            let slot = tokio::select! {
                _ = stop.notified() => break,
                _ = failures.wait_for(|s| matches!(s, StageState::Failed(_))) => break,
                slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            };
            let delivery = tokio::select! {
                _ = stop.notified() => break,
                _ = failures.wait_for(|s| matches!(s, StageState::Failed(_))) => break,
                delivery = subscription.next() => match delivery {
                    Some(delivery) => delivery,
                    None => {
                        health.fail("its feed from the bus ended (the consumer stopped or its poller died)".into());
                        break;
                    }
                },
            };
            // A record whose partition moved away while it waited is its new owner's to process.
            let Some(mut delivery) = delivery.claim_off_thread().await else { continue };
            // One ended unstarted (it crashed processes max_attempts times already) is not started.
            let starts = delivery.redeliveries < max_attempts;
            let mut slot = slot;
            if starts && delivery.redeliveries > 0 {
                // A record a crash was blamed on starts alone, once the records in flight are
                // done: should it crash this process too, no other shares the blame.
                tokio::select! {
                    _ = failures.wait_for(|s| matches!(s, StageState::Failed(_))) => {
                        delivery.nack("its stage failed while the record waited to start alone");
                        break;
                    }
                    rest = slots.clone().acquire_many_owned(max_in_flight as u32 - 1) => {
                        slot.merge(rest.expect("the semaphore is never closed"));
                    }
                }
            }
            if starts {
                delivery.start_off_thread().await;
            }
            // Handed over, not awaited: `send` would resolve only once the event was handled, and
            // the stage would take one event at a time whatever its max_in_flight. The slots bound
            // the mailbox, so it always has room.
            if let Err(error) = addr.try_send(Process { delivery, slot }) {
                let reason = match error {
                    SendError::Full(_) => "its mailbox was full despite the in-flight bound",
                    SendError::Closed(_) => "its actor stopped",
                };
                health.fail(reason.into());
                break;
            }
        }
        // Every slot back means every event taken has finished and been acknowledged.
        let _all = slots.acquire_many(max_in_flight as u32).await;
        if let Err(error) = subscription.commit().await {
            tracing::error!(stage = S::NAME, %error, "final commit failed");
        }
        // Ended as asked, or already failed with its reason: the guard has nothing to add.
        health.stop();
        let _ = drained_tx.send(());
    });
    Ok(RunningStage { name: S::NAME, counters, arbiter, stop_feeding, drained: Some(drained), health })
}
