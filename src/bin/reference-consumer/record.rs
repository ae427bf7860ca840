//! A Kafka record of the outbox topics, as the inbox needs it. Pure: no I/O.
//!
//! The relay's record: key = aggregate id, value = the payload JSON, headers
//! `event_id` (the idempotency key), `aggregate_id`, `aggregate_sequence`,
//! `lsn`, ... The demo effect reads `sku` and `qty` from the payload when they
//! are there (absent fields become NULL: the effect is still applied once). A
//! value that is not a JSON object is unusable, like a record without an
//! `event_id`: applying it would record an effect of NULLs.

use std::fmt;

/// Where a record sits in Kafka, for logs and errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Place {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]@{}", self.topic, self.partition, self.offset)
    }
}

/// What the inbox transaction needs from one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InboxRecord {
    pub place: Place,
    pub event_id: String,
    pub order_id: String,
    pub sku: Option<String>,
    pub qty: Option<i32>,
    /// The `lsn` header, only for logs.
    pub lsn: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum RecordError {
    #[error("record {place} has no event_id header: it cannot be deduplicated")]
    MissingEventId { place: Place },
    #[error("record {place} has event_id {value:?}, which is not a UUID")]
    BadEventId { place: Place, value: String },
    #[error(
        "record {place} (event {event_id}) has a value that is not a JSON object ({why}): its effect cannot be applied"
    )]
    BadPayload {
        place: Place,
        event_id: String,
        why: String,
    },
}

/// Why a record is not a live event of the outbox topics, if it is not: a
/// dead-lettered record (the relay's `dlq_reason` header; its aggregate's
/// later events are parked with it, so applying it here would break their
/// order) or a record of a replay topic (`outbox-cdc replay --topic-suffix
/// .replay`, meant for a consumer being restored). Both are in `^outbox\..*`.
pub(crate) fn side_record<'a>(
    topic: &str,
    headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
) -> Option<String> {
    if topic.ends_with(".replay") {
        return Some("a record of a replay topic".to_owned());
    }
    headers
        .into_iter()
        .find(|(name, _)| *name == "dlq_reason")
        .map(|(_, value)| {
            format!(
                "a dead-lettered record ({})",
                String::from_utf8_lossy(value.unwrap_or_default())
            )
        })
}

/// Builds the inbox view of one record from its parts.
pub(crate) fn parse<'a>(
    place: Place,
    key: Option<&[u8]>,
    payload: Option<&[u8]>,
    headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
) -> Result<InboxRecord, RecordError> {
    let mut event_id = None;
    let mut aggregate_id = None;
    let mut lsn = String::new();
    for (name, value) in headers {
        let text = || value.map(|v| String::from_utf8_lossy(v).into_owned());
        match name {
            "event_id" => event_id = text(),
            "aggregate_id" => aggregate_id = text(),
            "lsn" => lsn = text().unwrap_or_default(),
            _ => {}
        }
    }
    let Some(event_id) = event_id else {
        return Err(RecordError::MissingEventId { place });
    };
    if !is_uuid(&event_id) {
        return Err(RecordError::BadEventId {
            place,
            value: event_id,
        });
    }
    let order_id = aggregate_id
        .or_else(|| key.map(|k| String::from_utf8_lossy(k).into_owned()))
        .unwrap_or_default();
    let body = match payload.map(serde_json::from_slice::<serde_json::Value>) {
        Some(Ok(body)) if body.is_object() => body,
        other => {
            let why = match other {
                None => "no value".to_owned(),
                Some(Err(e)) => format!("not JSON: {e}"),
                Some(Ok(_)) => "JSON, but not an object".to_owned(),
            };
            return Err(RecordError::BadPayload {
                place,
                event_id,
                why,
            });
        }
    };
    let body = Some(body);
    let sku = body
        .as_ref()
        .and_then(|b| b.get("sku"))
        .and_then(|v| v.as_str())
        .map(str::to_owned);
    let qty = body
        .as_ref()
        .and_then(|b| b.get("qty"))
        .and_then(|v| v.as_i64())
        .and_then(|q| i32::try_from(q).ok());
    Ok(InboxRecord {
        place,
        event_id,
        order_id,
        sku,
        qty,
        lsn,
    })
}

/// The textual UUID form PostgreSQL prints: 8-4-4-4-12 hex digits.
fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_lettered_and_replayed_records_are_side_records() {
        let reason: &[u8] = b"too large";
        assert!(
            side_record(
                "outbox.dlq",
                [("event_id", None), ("dlq_reason", Some(reason))]
            )
            .is_some_and(|why| why.contains("dead-lettered") && why.contains("too large"))
        );
        assert!(side_record("outbox.event.order.replay", []).is_some());
        assert_eq!(
            side_record("outbox.event.order", [("event_id", None)]),
            None
        );
    }

    const ID: &str = "0b7f5c9e-3d1a-4c8e-9f00-1234567890ab";

    fn place() -> Place {
        Place {
            topic: "t.order".into(),
            partition: 1,
            offset: 7,
        }
    }

    #[test]
    fn reads_event_id_aggregate_and_payload_fields() {
        let r = parse(
            place(),
            Some(b"key-1"),
            Some(br#"{"sku": "sku-9", "qty": 3, "other": true}"#),
            [
                ("event_id", Some(ID.as_bytes())),
                ("aggregate_id", Some(b"order-1".as_slice())),
                ("lsn", Some(b"0/16B3748".as_slice())),
            ],
        )
        .unwrap();
        assert_eq!(r.event_id, ID);
        assert_eq!(r.order_id, "order-1");
        assert_eq!(r.sku.as_deref(), Some("sku-9"));
        assert_eq!(r.qty, Some(3));
        assert_eq!(r.lsn, "0/16B3748");
    }

    /// Review F11: a value that is not a JSON object was applied as an
    /// effect of NULLs.
    #[test]
    fn a_value_that_is_not_a_json_object_is_unusable() {
        for (value, why) in [
            (Some(b"not json".as_slice()), "not JSON"),
            (Some(b"[1, 2]".as_slice()), "not an object"),
            (None, "no value"),
        ] {
            let e = parse(
                place(),
                Some(b"key-1"),
                value,
                [("event_id", Some(ID.as_bytes()))],
            )
            .unwrap_err();
            assert!(
                matches!(&e, RecordError::BadPayload { why: w, event_id, .. } if w.contains(why) && event_id == ID),
                "{value:?}: {e}"
            );
        }
    }

    #[test]
    fn falls_back_to_the_key_and_tolerates_other_payloads() {
        let r = parse(
            place(),
            Some(b"key-1"),
            Some(br#"{"note": "no sku, no qty"}"#),
            [("event_id", Some(ID.as_bytes()))],
        )
        .unwrap();
        assert_eq!(r.order_id, "key-1");
        assert_eq!((r.sku, r.qty), (None, None));
        let r = parse(
            place(),
            None,
            Some(br#"{"qty": 99999999999}"#),
            [("event_id", Some(ID.as_bytes()))],
        )
        .unwrap();
        assert_eq!((r.order_id.as_str(), r.qty), ("", None));
    }

    #[test]
    fn refuses_records_without_a_usable_event_id() {
        assert_eq!(
            parse(place(), None, None, []),
            Err(RecordError::MissingEventId { place: place() })
        );
        let e = parse(place(), None, None, [("event_id", Some(b"42".as_slice()))]).unwrap_err();
        assert!(matches!(e, RecordError::BadEventId { .. }));
        assert!(e.to_string().contains("t.order[1]@7"), "{e}");
        let e = parse(place(), None, None, [("event_id", None)]).unwrap_err();
        assert!(matches!(e, RecordError::MissingEventId { .. }));
    }

    #[test]
    fn uuid_shape() {
        assert!(is_uuid(ID));
        assert!(is_uuid(&ID.to_uppercase()));
        assert!(!is_uuid("0b7f5c9e3d1a4c8e9f001234567890ab"));
        assert!(!is_uuid("0b7f5c9e-3d1a-4c8e-9f00-1234567890ag"));
    }
}
