//! The Event publisher: a task of its own, so that a reconcile never waits for Events (they are
//! API writes too) before it frees its slot. Each batch takes a routine slot at the write gate,
//! so that in a burst Events wait behind the writes that restart and create pods.

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;

use super::gate::{Urgency, WriteGate};
use crate::events::{EventKind, JobEvent};

/// Event batches (one per reconcile) waiting to be published.
pub(super) const EVENT_QUEUE: usize = 1024;
/// Event batches published at once.
const EVENT_PUBLISHERS: usize = 8;
/// How long a stopping operator keeps publishing the Events it has queued.
pub(super) const EVENT_DRAIN: Duration = Duration::from_secs(1);

/// One reconcile's Events, for the publisher task.
pub(super) type EventBatch = (ObjectReference, Vec<JobEvent>);

/// Publishes queued Events, a few batches at once, each batch in order.
///
/// Each batch gets a Recorder of its own. A shared one keeps every Event it published for six
/// minutes, to turn a repeat into a series: 9 MB of the operator's peak heap at 1,000 jobs
/// (heaptrack), and a repeat of one of our Events would keep the first one's note. The
/// operator publishes an Event per transition, never the same one again, so it needs no series.
pub(super) async fn publish_events(
    client: Client,
    reporter: Reporter,
    gate: Arc<WriteGate>,
    mut batches: mpsc::Receiver<EventBatch>,
) {
    let batches = stream::poll_fn(move |cx| batches.poll_recv(cx));
    batches
        .for_each_concurrent(EVENT_PUBLISHERS, |(reference, events)| {
            let recorder = Recorder::new(client.clone(), reporter.clone());
            let gate = gate.clone();
            async move {
                let _slot = gate.enter(Urgency::Routine, 1).await;
                for e in events {
                    let event = Event {
                        type_: match e.kind {
                            EventKind::Normal => EventType::Normal,
                            EventKind::Warning => EventType::Warning,
                        },
                        reason: e.reason.clone(),
                        note: Some(truncate_note(e.note)),
                        action: "Reconcile".to_owned(),
                        secondary: None,
                    };
                    if let Err(err) = gate.timed(recorder.publish(&event, &reference)).await {
                        tracing::warn!(error = %err, reason = %e.reason, "publishing an Event");
                    }
                }
            }
        })
        .await;
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
