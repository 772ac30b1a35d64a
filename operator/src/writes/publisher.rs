//! The Event publisher: a task of its own, so that a reconcile never waits for Events (they are
//! API writes too). A few batches go out at once (`EVENT_PUBLISHERS`): in a burst, Events
//! take a small share of the writes in flight, beside the reconciles' own.

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;

use crate::model::events::{EventKind, JobEvent, StartsAttempt, attempt_event_name};
use crate::state::write_memory::WriteMemory;

/// The action of every Event the operator publishes.
const ACTION: &str = "Reconcile";

/// Event batches (one per reconcile) waiting to be published.
pub(crate) const EVENT_QUEUE: usize = 1024;
/// Event batches published at once.
const EVENT_PUBLISHERS: usize = 8;
/// How long a stopping operator keeps publishing the Events it has queued.
pub(crate) const EVENT_DRAIN: Duration = Duration::from_secs(1);

/// One reconcile's Events, for the publisher task.
pub(crate) type EventBatch = (ObjectReference, Vec<JobEvent>);

/// Publishes queued Events, a few batches at once, each batch in order.
///
/// Each batch gets a Recorder of its own. A shared one keeps every Event it published for six
/// minutes, to turn a repeat into a series: 9 MB of the operator's peak heap at 1,000 jobs
/// (heaptrack), and a repeat of one of our Events would keep the first one's note. The
/// operator publishes an Event per transition, never the same one again, so it needs no series.
/// An Event that starts an attempt is created under its own name instead
/// ([`publish_attempt_start`]); when that fails, `memory` forgets it was told, so that a later
/// round tells it again.
pub(crate) async fn publish_events(
    client: Client,
    reporter: Reporter,
    memory: Arc<WriteMemory>,
    mut batches: mpsc::Receiver<EventBatch>,
) {
    let batches = stream::poll_fn(move |cx| batches.poll_recv(cx));
    batches
        .for_each_concurrent(EVENT_PUBLISHERS, |(reference, events)| {
            let recorder = Recorder::new(client.clone(), reporter.clone());
            let (client, reporter, memory) = (client.clone(), &reporter, memory.clone());
            async move {
                for e in events {
                    let (reason, starts_attempt) = (e.reason.clone(), e.starts_attempt);
                    let published = match starts_attempt {
                        Some(a) => {
                            let event = attempt_start_event(e, a, &reference, reporter);
                            publish_attempt_start(&client, event).await
                        }
                        None => recorder.publish(&recorded(e), &reference).await,
                    };
                    if let Err(err) = published {
                        tracing::warn!(error = %err, %reason, "publishing an Event");
                        if let (Some(uid), Some(a)) = (reference.uid.as_deref(), starts_attempt) {
                            memory.untell(uid, a.attempt);
                        }
                    }
                }
            }
        })
        .await;
}

/// The Event to record for `e`.
fn recorded(e: JobEvent) -> Event {
    Event {
        type_: match e.kind {
            EventKind::Normal => EventType::Normal,
            EventKind::Warning => EventType::Warning,
        },
        reason: e.reason,
        note: Some(truncate_note(e.note)),
        action: ACTION.to_owned(),
        secondary: None,
    }
}

/// The Event that starts an attempt, named after the job and the attempt and dated when
/// the attempt was decided.
fn attempt_start_event(
    e: JobEvent,
    starts_attempt: StartsAttempt,
    reference: &ObjectReference,
    reporter: &Reporter,
) -> K8sEvent {
    let name = attempt_event_name(
        reference.name.as_deref().unwrap_or_default(),
        reference.uid.as_deref().unwrap_or_default(),
        starts_attempt.attempt,
    );
    K8sEvent {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: reference.namespace.clone(),
            ..ObjectMeta::default()
        },
        action: Some(ACTION.to_owned()),
        reason: Some(e.reason),
        note: Some(truncate_note(e.note)),
        type_: Some(
            match e.kind {
                EventKind::Normal => "Normal",
                EventKind::Warning => "Warning",
            }
            .to_owned(),
        ),
        event_time: Some(MicroTime(starts_attempt.at)),
        regarding: Some(reference.clone()),
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(
            reporter
                .instance
                .clone()
                .unwrap_or_else(|| reporter.controller.clone()),
        ),
        ..K8sEvent::default()
    }
}

/// Creates the Event that starts an attempt; one that exists already (published by this replica's
/// predecessor, or by this replica before) is the same Event, told.
async fn publish_attempt_start(client: &Client, event: K8sEvent) -> Result<(), kube::Error> {
    let ns = event.metadata.namespace.clone().unwrap_or_default();
    let events: Api<K8sEvent> = Api::namespaced(client.clone(), &ns);
    match events.create(&PostParams::default(), &event).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Event notes are limited to 1 kB by the API server.
fn truncate_note(mut note: String) -> String {
    if note.len() > 1000 {
        let mut cut = 1000;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_that_starts_an_attempt_is_named_after_it_and_dated_when_it_was_decided() {
        let at = jiff::Timestamp::from_second(1_800_000_000).expect("time");
        let reference = ObjectReference {
            kind: Some("TrainingJob".to_owned()),
            name: Some("train".to_owned()),
            namespace: Some("ml".to_owned()),
            uid: Some("u-1".to_owned()),
            ..ObjectReference::default()
        };
        let reporter = Reporter {
            controller: "trainyard-operator".to_owned(),
            instance: Some("replica-b".to_owned()),
        };
        let told = JobEvent::warning("Preempted", "x".repeat(2000)).starting_attempt(3, at);
        let starts = told.starts_attempt.expect("starts an attempt");
        let event = attempt_start_event(told, starts, &reference, &reporter);
        assert_eq!(event.metadata.name.as_deref(), Some("train.u-1.attempt-3"));
        assert_eq!(event.metadata.namespace.as_deref(), Some("ml"));
        assert_eq!(event.event_time, Some(MicroTime(at)));
        assert_eq!(event.regarding, Some(reference));
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert_eq!(event.reason.as_deref(), Some("Preempted"));
        assert_eq!(event.note.map(|n| n.len()), Some(1000));
        assert_eq!(event.reporting_instance.as_deref(), Some("replica-b"));
    }
}
