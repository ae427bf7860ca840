//! The poison policy (DESIGN.md §7): what happens to a row that cannot become
//! a record, or a record the broker refuses for good.
//!
//! `fail`: the session stops with the event id, LSN and reason; nothing after
//! it is acknowledged, so a fixed row or config resumes exactly there.
//! `dead-letter`: the record goes to the dead-letter topic with the reason, and
//! its aggregate is parked in the offset store; every later event of a parked
//! aggregate follows it to the dead-letter topic, in order, until an operator
//! runs `outbox-cdc release`. Order inside the main topic is never silently
//! broken: an aggregate's events after a poison one never reach it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;

use crate::Disposition;
use crate::checkpoint::{OffsetStore, ParkedAggregate, ParkedAt, StoreError};
use crate::outbox::{MapError, OutboxEvent, OutboxSettings, PoisonPolicy};
use crate::pg::{EventPosition, Lsn, PgTimestamp};
use crate::pgoutput::{ColumnValue, Relation, TupleData};

use crate::error::PipelineError;

/// Header names added to dead-lettered records.
pub(crate) const H_DLQ_REASON: &str = "dlq_reason";
pub(crate) const H_DLQ_ORIGINAL_TOPIC: &str = "dlq_original_topic";

/// Where parked aggregates are kept: the offset store for the connector, or
/// memory for a one-shot `replay` (which must not need the store).
pub(crate) trait Parking {
    fn parked_since(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<Option<ParkedAt>, StoreError>;
    fn parked_aggregate(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<Option<ParkedAggregate>, StoreError>;
    fn park(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        reason: &str,
        at: EventPosition,
    ) -> Result<bool, StoreError>;
}

impl Parking for OffsetStore {
    fn parked_since(&self, t: &str, id: &str) -> Result<Option<ParkedAt>, StoreError> {
        OffsetStore::parked_since(self, t, id)
    }
    fn parked_aggregate(&self, t: &str, id: &str) -> Result<Option<ParkedAggregate>, StoreError> {
        OffsetStore::parked_aggregate(self, t, id)
    }
    fn park(&self, t: &str, id: &str, reason: &str, at: EventPosition) -> Result<bool, StoreError> {
        tokio::task::block_in_place(|| OffsetStore::park(self, t, id, reason, at))
    }
}

impl<P: Parking + ?Sized> Parking for Arc<P> {
    fn parked_since(&self, t: &str, id: &str) -> Result<Option<ParkedAt>, StoreError> {
        (**self).parked_since(t, id)
    }
    fn parked_aggregate(&self, t: &str, id: &str) -> Result<Option<ParkedAggregate>, StoreError> {
        (**self).parked_aggregate(t, id)
    }
    fn park(&self, t: &str, id: &str, reason: &str, at: EventPosition) -> Result<bool, StoreError> {
        (**self).park(t, id, reason, at)
    }
}

/// Aggregates parked for the length of one run, in memory: a replay parks an
/// aggregate at its poison row and dead-letters the rest of it, in order.
#[derive(Default)]
pub(crate) struct MemoryParking {
    parked: Mutex<HashMap<(String, String), ParkedAggregate>>,
}

impl Parking for MemoryParking {
    fn parked_since(&self, t: &str, id: &str) -> Result<Option<ParkedAt>, StoreError> {
        Ok(self.parked_aggregate(t, id)?.map(|p| p.parked_at()))
    }
    fn parked_aggregate(&self, t: &str, id: &str) -> Result<Option<ParkedAggregate>, StoreError> {
        let parked = self.parked.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(parked.get(&(t.to_owned(), id.to_owned())).cloned())
    }
    fn park(&self, t: &str, id: &str, reason: &str, at: EventPosition) -> Result<bool, StoreError> {
        let mut parked = self.parked.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (t.to_owned(), id.to_owned());
        if parked.contains_key(&key) {
            return Ok(false);
        }
        parked.insert(key, ParkedAggregate::parked_now(t, id, reason, at));
        Ok(true)
    }
}

/// Where one mapped (or unmappable) row goes.
pub(crate) enum Route {
    Publish(OutboxEvent),
    DeadLetter(OutboxEvent),
}

pub(crate) struct PoisonPolicyRouter {
    policy: PoisonPolicy,
    dead_letter_topic: String,
    /// Largest row JSON a dead-letter record carries; a larger one (the very
    /// reason it may be poison) is replaced by a note of its size, so the
    /// dead-letter record itself is never refused for its size.
    max_raw_bytes: usize,
}

impl PoisonPolicyRouter {
    pub(crate) fn new(settings: &OutboxSettings) -> PoisonPolicyRouter {
        PoisonPolicyRouter {
            policy: settings.on_poison,
            dead_letter_topic: settings.dead_letter_topic.clone(),
            max_raw_bytes: settings.max_record_bytes / 2,
        }
    }

    pub(crate) fn dead_letters(&self) -> bool {
        self.policy == PoisonPolicy::DeadLetter
    }

    /// Applies the policy to one mapping result. `raw` is what a dead-letter
    /// record carries when mapping failed (the row as JSON, or the message).
    pub(crate) fn route(
        &self,
        mapped: Result<OutboxEvent, MapError>,
        raw: impl FnOnce() -> Bytes,
        store: &(impl Parking + ?Sized),
        at: EventPosition,
        commit_time: PgTimestamp,
    ) -> Result<Route, PipelineError> {
        let lsn = at.change();
        match mapped {
            Ok(event) => {
                // Only events at or after the one that parked the aggregate,
                // in commit order: a replay meets its earlier events again,
                // and they are fine.
                let parked = match self.dead_letters() {
                    true => store.parked_since(&event.aggregate_type, &event.aggregate_id)?,
                    false => None,
                };
                if parked.is_some_and(|since| since.covers(at)) {
                    let parked =
                        store.parked_aggregate(&event.aggregate_type, &event.aggregate_id)?;
                    let reason = match parked {
                        // The event Kafka refused (e.g. its topic is missing):
                        // its own reason, as recorded when it parked the aggregate.
                        Some(p) if p.parked_at().is(at) => p.reason,
                        Some(p) => format!(
                            "aggregate {}/{} is parked after an earlier poison event at LSN {} ({}); \
                             release it with `outbox-cdc release`",
                            event.aggregate_type, event.aggregate_id, p.lsn, p.reason
                        ),
                        None => format!(
                            "aggregate {}/{} is parked after an earlier poison event; release it with `outbox-cdc release`",
                            event.aggregate_type, event.aggregate_id
                        ),
                    };
                    return Ok(Route::DeadLetter(self.redirect(event, &reason)));
                }
                Ok(Route::Publish(event))
            }
            Err(source) if source.disposition() != Disposition::RecordRefused => {
                Err(PipelineError::Mapping { lsn, source })
            }
            Err(source) if !self.dead_letters() => Err(PipelineError::Poison {
                event_id: source.event_id().unwrap_or("unknown").to_owned(),
                lsn,
                reason: source.to_string(),
                refusal: None,
            }),
            Err(source) => {
                let reason = source.to_string();
                if let Some((agg_type, agg_id)) = source.aggregate() {
                    store.park(agg_type, agg_id, &reason, at)?;
                }
                let mut raw = raw();
                if raw.len() > self.max_raw_bytes {
                    let note = serde_json::json!({ "omitted": "row too large for the dead-letter record", "bytes": raw.len() });
                    raw = Bytes::from(note.to_string());
                }
                Ok(Route::DeadLetter(self.unmappable(
                    &source,
                    raw,
                    lsn,
                    commit_time,
                    &reason,
                )))
            }
        }
    }

    /// The same record, sent to the dead-letter topic with the reason.
    /// A payload larger than half of `outbox.max_record_bytes` is replaced by
    /// a reference to the row (its event id and size): an event refused for
    /// its size must still fit the dead-letter topic.
    fn redirect(&self, mut event: OutboxEvent, reason: &str) -> OutboxEvent {
        if event.payload.len() > self.max_raw_bytes {
            let note = serde_json::json!({
                "omitted": "payload too large for the dead-letter record; read it from the outbox table",
                "event_id": event.event_id,
                "bytes": event.payload.len(),
            });
            event.payload = Bytes::from(note.to_string());
        }
        let original = std::mem::replace(&mut event.topic, self.dead_letter_topic.clone());
        event
            .headers
            .push((Cow::Borrowed(H_DLQ_REASON), Bytes::from(reason.to_owned())));
        event
            .headers
            .push((Cow::Borrowed(H_DLQ_ORIGINAL_TOPIC), Bytes::from(original)));
        event
    }

    /// A record for a row that could not be mapped: what is known of it.
    fn unmappable(
        &self,
        source: &MapError,
        raw: Bytes,
        lsn: Lsn,
        commit_time: PgTimestamp,
        reason: &str,
    ) -> OutboxEvent {
        let row = source.row();
        let text = |v: Option<&Option<String>>| v.and_then(|s| s.clone()).unwrap_or_default();
        let event_id = text(row.map(|r| &r.event_id));
        let aggregate_type = text(row.map(|r| &r.aggregate_type));
        let aggregate_id = text(row.map(|r| &r.aggregate_id));
        let mut headers: Vec<(Cow<'static, str>, Bytes)> = Vec::with_capacity(5);
        for (name, value) in [
            ("event_id", &event_id),
            ("aggregate_type", &aggregate_type),
            ("aggregate_id", &aggregate_id),
        ] {
            if !value.is_empty() {
                headers.push((Cow::Borrowed(name), Bytes::from(value.clone())));
            }
        }
        headers.push((Cow::Borrowed("lsn"), Bytes::from(lsn.to_string())));
        headers.push((Cow::Borrowed(H_DLQ_REASON), Bytes::from(reason.to_owned())));
        OutboxEvent {
            topic: self.dead_letter_topic.clone(),
            key: Bytes::from(if aggregate_id.is_empty() {
                event_id.clone()
            } else {
                aggregate_id.clone()
            }),
            payload: raw,
            headers,
            timestamp_ms: commit_time.unix_millis(),
            event_id: if event_id.is_empty() {
                format!("unknown@{lsn}")
            } else {
                event_id
            },
            aggregate_type,
            aggregate_id,
            aggregate_sequence: None,
            lsn,
            // The dead-letter topic has its own partitions.
            partition: None,
            trace_dropped: Default::default(),
        }
    }
}

/// A row as a JSON object of its columns' text values, for dead-letter records.
/// When the row is larger than `max_bytes`, values over 256 bytes are replaced
/// by a note of their size, so the identifying columns always survive.
pub(crate) fn row_as_json(
    relation: Option<&Relation>,
    tuple: &TupleData,
    max_bytes: usize,
) -> Bytes {
    let total: usize = tuple
        .columns
        .iter()
        .map(|v| v.bytes().map_or(0, |b| b.len()))
        .sum();
    let shrink = total > max_bytes;
    let mut object = serde_json::Map::new();
    for (i, value) in tuple.columns.iter().enumerate() {
        let name = relation
            .and_then(|r| r.columns.get(i))
            .map_or_else(|| format!("column_{i}"), |c| c.name.clone());
        let json = match value {
            ColumnValue::Null => serde_json::Value::Null,
            ColumnValue::UnchangedToast => {
                serde_json::Value::String("(unchanged TOAST value, not sent)".into())
            }
            ColumnValue::Text(b) if shrink && b.len() > 256 => {
                serde_json::Value::String(format!("(omitted: {} bytes)", b.len()))
            }
            ColumnValue::Text(b) => {
                serde_json::Value::String(String::from_utf8_lossy(b).into_owned())
            }
            ColumnValue::Binary(b) => {
                serde_json::Value::String(format!("(binary, {} bytes)", b.len()))
            }
        };
        object.insert(name, json);
    }
    Bytes::from(serde_json::Value::Object(object).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::mapper::RowRef;

    fn settings(policy: &str) -> OutboxSettings {
        let text = format!("on_poison = \"{policy}\"\ndead_letter_topic = \"dlq\"\n");
        toml::from_str(&text).unwrap()
    }

    /// A router under `policy` and a fresh offset store (in a directory that
    /// lives as long as the returned guard).
    fn open_with(policy: &str) -> (tempfile::TempDir, OffsetStore, PoisonPolicyRouter) {
        let dir = tempfile::tempdir().unwrap();
        let store = OffsetStore::open(dir.path()).unwrap();
        (dir, store, PoisonPolicyRouter::new(&settings(policy)))
    }

    fn poison() -> MapError {
        MapError::NullColumn {
            column: "payload".into(),
            at: Box::new(RowRef {
                source: "public.outbox_events".into(),
                lsn: Lsn::new(42),
                event_id: Some("e1".into()),
                aggregate_type: Some("order".into()),
                aggregate_id: Some("o1".into()),
            }),
        }
    }

    fn event(agg_id: &str) -> OutboxEvent {
        OutboxEvent {
            topic: "outbox.event.order".into(),
            key: Bytes::from(agg_id.to_owned()),
            payload: Bytes::from_static(b"{}"),
            headers: vec![(Cow::Borrowed("event_id"), Bytes::from_static(b"e2"))],
            timestamp_ms: 0,
            event_id: "e2".into(),
            aggregate_type: "order".into(),
            aggregate_id: agg_id.into(),
            aggregate_sequence: None,
            lsn: Lsn::new(50),
            partition: None,
            trace_dropped: Default::default(),
        }
    }

    /// Routes `mapped`, a change at `lsn` committed at that LSN.
    fn route_at(
        router: &PoisonPolicyRouter,
        store: &OffsetStore,
        mapped: Result<OutboxEvent, MapError>,
        raw: impl FnOnce() -> Bytes,
        lsn: u64,
    ) -> Result<Route, PipelineError> {
        router.route(
            mapped,
            raw,
            store,
            EventPosition::at(Lsn::new(lsn)),
            PgTimestamp(0),
        )
    }

    #[test]
    fn fail_policy_stops_with_event_id_and_lsn() {
        let (_dir, store, router) = open_with("fail");
        let err = route_at(&router, &store, Err(poison()), Bytes::new, 42)
            .err()
            .expect("fail policy must stop");
        assert!(
            matches!(&err, PipelineError::Poison { event_id, .. } if event_id == "e1"),
            "{err}"
        );
        assert_eq!(err.disposition(), Disposition::Stop);
    }

    #[test]
    fn a_dead_letter_record_of_a_large_event_carries_a_reference() {
        let (_dir, store, router) = open_with("dead-letter");
        store
            .park(
                "order",
                "o1",
                "Broker: Message size too large",
                EventPosition::at(Lsn::new(50)),
            )
            .unwrap();
        let mut big = event("o1");
        big.payload = Bytes::from(vec![b'x'; router.max_raw_bytes + 1]);
        let Route::DeadLetter(dlq) = route_at(&router, &store, Ok(big), Bytes::new, 50).unwrap()
        else {
            panic!("the parked event must be dead-lettered");
        };
        assert!(dlq.payload.len() < 300, "{} bytes", dlq.payload.len());
        let note: serde_json::Value = serde_json::from_slice(&dlq.payload).unwrap();
        assert_eq!(note["event_id"], "e2");
    }

    #[test]
    fn a_replay_publishes_the_parked_aggregates_events_from_before_the_poison_one() {
        let (dir, store, router) = open_with("dead-letter");
        // Parked by a broker refusal of its event at LSN 50 (session::refused).
        store
            .park("order", "o1", "refused", EventPosition::at(Lsn::new(50)))
            .unwrap();
        let at = |lsn: u64| route_at(&router, &store, Ok(event("o1")), Bytes::new, lsn).unwrap();
        // The replay from the durable LSN meets an earlier event first: it is
        // not poison and goes to its topic.
        assert!(matches!(at(40), Route::Publish(_)));
        assert!(matches!(at(50), Route::DeadLetter(_)));
        assert!(matches!(at(60), Route::DeadLetter(_)));
        // Survives a reopen (the LSN comes from disk).
        drop(store);
        let store = OffsetStore::open(dir.path()).unwrap();
        let since = store.parked_since("order", "o1").unwrap().unwrap();
        assert!(since.is(EventPosition::at(Lsn::new(50))));
    }

    #[test]
    fn dead_letter_policy_parks_the_aggregate_and_redirects_its_later_events() {
        let (_dir, store, router) = open_with("dead-letter");
        let raw = || Bytes::from_static(b"{\"payload\":null}");
        let Route::DeadLetter(dlq) = route_at(&router, &store, Err(poison()), raw, 42).unwrap()
        else {
            panic!("poison row must be dead-lettered");
        };
        assert_eq!(dlq.topic, "dlq");
        assert_eq!(dlq.key.as_ref(), b"o1");
        assert_eq!(dlq.payload.as_ref(), b"{\"payload\":null}");
        assert!(
            dlq.headers
                .iter()
                .any(|(k, v)| k == H_DLQ_REASON && v.starts_with(b"public.outbox_events"))
        );
        assert!(store.is_parked("order", "o1").unwrap());

        // A later, valid event of the parked aggregate follows it.
        let Route::DeadLetter(later) =
            route_at(&router, &store, Ok(event("o1")), Bytes::new, 50).unwrap()
        else {
            panic!("events of a parked aggregate must be dead-lettered");
        };
        assert_eq!(later.topic, "dlq");
        assert!(
            later
                .headers
                .iter()
                .any(|(k, v)| k == H_DLQ_ORIGINAL_TOPIC && v.as_ref() == b"outbox.event.order")
        );

        // Other aggregates are unaffected; a released one flows again.
        assert!(matches!(
            route_at(&router, &store, Ok(event("o2")), Bytes::new, 51).unwrap(),
            Route::Publish(_)
        ));
        store.release("order", "o1").unwrap();
        assert!(matches!(
            route_at(&router, &store, Ok(event("o1")), Bytes::new, 52).unwrap(),
            Route::Publish(_)
        ));
    }

    #[test]
    fn oversized_rows_are_summarised_in_the_dead_letter_record() {
        let dir = tempfile::tempdir().unwrap();
        let store = OffsetStore::open(dir.path()).unwrap();
        let mut s = settings("dead-letter");
        s.max_record_bytes = 100;
        let router = PoisonPolicyRouter::new(&s);
        let big = || Bytes::from(vec![b'x'; 500]);
        let Route::DeadLetter(dlq) = route_at(&router, &store, Err(poison()), big, 42).unwrap()
        else {
            panic!("poison row must be dead-lettered");
        };
        assert!(dlq.payload.len() < 100, "{:?}", dlq.payload);
        assert!(String::from_utf8_lossy(&dlq.payload).contains("\"bytes\":500"));
    }

    #[test]
    fn rows_render_as_json_objects() {
        let tuple = TupleData {
            columns: vec![
                ColumnValue::Null,
                ColumnValue::Text(Bytes::from_static(b"x")),
            ],
        };
        let json = row_as_json(None, &tuple, 1000);
        assert_eq!(json.as_ref(), br#"{"column_0":null,"column_1":"x"}"#);
        let big = TupleData {
            columns: vec![
                ColumnValue::Text(Bytes::from_static(b"a1")),
                ColumnValue::Text(Bytes::from(vec![b'x'; 5000])),
            ],
        };
        let json = row_as_json(None, &big, 1000);
        assert_eq!(
            json.as_ref(),
            br#"{"column_0":"a1","column_1":"(omitted: 5000 bytes)"}"#
        );
    }
}
