//! CloudEvents 1.0 in binary content mode, Kafka protocol binding
//! (`[outbox.cloudevents]`, off by default).
//!
//! In binary mode the record value stays the event data (the payload, as
//! stored) and the context attributes travel as record headers named
//! `ce_<attribute>`; the data's media type goes in `content-type`. A consumer
//! built on a CloudEvents SDK reads such a record as an event, and one that
//! is not sees the same value and headers as before plus a few more.
//!
//! | header | value |
//! |---|---|
//! | `ce_specversion` | `1.0` |
//! | `ce_id` | the event id |
//! | `ce_source` | `source` (default `/outbox-cdc/<schema>.<table>`) |
//! | `ce_type` | the event type |
//! | `ce_time` | the commit time, RFC 3339 UTC |
//! | `ce_subject` | the aggregate id (`subject = true`, the default) |
//! | `content-type` | `content_type` (default `application/json`; `""` omits it) |
//!
//! The record key (the aggregate id) is unchanged: the binding leaves the key
//! to the application, and per-aggregate order depends on it.

use std::borrow::Cow;

use bytes::Bytes;
use serde::Deserialize;

use super::table_name::TableName;
use crate::pg::PgTimestamp;
use crate::setting::InvalidSetting as ConfigError;

/// Header names this module writes; extra headers may not reuse them.
pub(crate) const CLOUDEVENTS_HEADERS: [&str; 7] = [
    "ce_specversion",
    "ce_id",
    "ce_source",
    "ce_type",
    "ce_time",
    "ce_subject",
    "content-type",
];

/// The `[outbox.cloudevents]` section.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CloudEventsSettings {
    /// Add the CloudEvents headers to every record. Default false.
    pub enabled: bool,
    /// `ce_source`: a URI reference naming where events come from, such as
    /// `/orders-service` or `urn:example:orders`. Default `""`:
    /// `/outbox-cdc/<schema>.<table>` of the configured outbox table.
    pub source: String,
    /// Write `ce_subject` = the aggregate id. Default true.
    pub subject: bool,
    /// The `content-type` header (the payload's media type). Default
    /// `application/json`; `""` writes none.
    pub content_type: String,
}

impl Default for CloudEventsSettings {
    fn default() -> CloudEventsSettings {
        CloudEventsSettings {
            enabled: false,
            source: String::new(),
            subject: true,
            content_type: "application/json".to_owned(),
        }
    }
}

impl CloudEventsSettings {
    /// The headers to add, or `None` when CloudEvents are off.
    pub(crate) fn build(&self, table: &TableName) -> Result<Option<CloudEvents>, ConfigError> {
        if !self.enabled {
            return Ok(None);
        }
        let source = if self.source.is_empty() {
            format!("/outbox-cdc/{table}")
        } else {
            self.source.clone()
        };
        if source.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ConfigError::new(
                "outbox.cloudevents.source",
                &self.source,
                "a URI reference without spaces, such as /orders-service or urn:example:orders",
            ));
        }
        if self.content_type.chars().any(char::is_control) {
            return Err(ConfigError::new(
                "outbox.cloudevents.content_type",
                &self.content_type,
                "a media type such as application/json, or \"\" for none",
            ));
        }
        Ok(Some(CloudEvents {
            source: Bytes::from(source),
            subject: self.subject,
            content_type: (!self.content_type.is_empty())
                .then(|| Bytes::from(self.content_type.clone())),
        }))
    }
}

/// The prepared attributes that do not depend on the event.
#[derive(Debug, Clone)]
pub(crate) struct CloudEvents {
    source: Bytes,
    subject: bool,
    content_type: Option<Bytes>,
}

/// What one event contributes to its CloudEvents attributes.
pub(crate) struct EventAttributes<'a> {
    pub id: &'a Bytes,
    pub event_type: &'a Bytes,
    pub aggregate_id: &'a Bytes,
    pub commit_time: PgTimestamp,
}

const SPEC_VERSION: &[u8] = b"1.0";

impl CloudEvents {
    /// Appends the `ce_*` headers (and `content-type`) for one event.
    pub(crate) fn append(
        &self,
        headers: &mut Vec<(Cow<'static, str>, Bytes)>,
        event: EventAttributes<'_>,
    ) {
        headers.push((
            Cow::Borrowed("ce_specversion"),
            Bytes::from_static(SPEC_VERSION),
        ));
        headers.push((Cow::Borrowed("ce_id"), event.id.clone()));
        headers.push((Cow::Borrowed("ce_source"), self.source.clone()));
        headers.push((Cow::Borrowed("ce_type"), event.event_type.clone()));
        headers.push((
            Cow::Borrowed("ce_time"),
            Bytes::from(event.commit_time.rfc3339()),
        ));
        if self.subject {
            headers.push((Cow::Borrowed("ce_subject"), event.aggregate_id.clone()));
        }
        if let Some(ct) = &self.content_type {
            headers.push((Cow::Borrowed("content-type"), ct.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> TableName {
        TableName {
            schema: "public".into(),
            name: "outbox_events".into(),
        }
    }

    #[test]
    fn off_by_default() {
        assert!(
            CloudEventsSettings::default()
                .build(&table())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn the_default_source_names_the_table() {
        let ce = CloudEventsSettings {
            enabled: true,
            ..CloudEventsSettings::default()
        }
        .build(&table())
        .unwrap()
        .unwrap();
        assert_eq!(&ce.source[..], b"/outbox-cdc/public.outbox_events");
    }

    #[test]
    fn a_source_with_spaces_is_refused_naming_the_key() {
        let e = CloudEventsSettings {
            enabled: true,
            source: "orders service".into(),
            ..CloudEventsSettings::default()
        }
        .build(&table())
        .unwrap_err();
        assert!(e.to_string().contains("outbox.cloudevents.source"), "{e}");
    }

    #[test]
    fn appends_the_attributes_in_binary_mode() {
        let ce = CloudEventsSettings {
            enabled: true,
            source: "/orders".into(),
            subject: false,
            content_type: String::new(),
        }
        .build(&table())
        .unwrap()
        .unwrap();
        let mut headers = Vec::new();
        ce.append(
            &mut headers,
            EventAttributes {
                id: &Bytes::from_static(b"e-1"),
                event_type: &Bytes::from_static(b"OrderPlaced"),
                aggregate_id: &Bytes::from_static(b"o-1"),
                commit_time: PgTimestamp(0),
            },
        );
        let got: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (k.as_ref(), &v[..])).collect();
        assert_eq!(
            got,
            vec![
                ("ce_specversion", &b"1.0"[..]),
                ("ce_id", b"e-1"),
                ("ce_source", b"/orders"),
                ("ce_type", b"OrderPlaced"),
                ("ce_time", b"2000-01-01T00:00:00.000Z"),
            ]
        );
    }
}
