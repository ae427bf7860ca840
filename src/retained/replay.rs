//! Replay on demand (`outbox-cdc replay`): publish retained outbox rows again
//! for a consumer that lost its state. It only reads the table and produces,
//! so it runs whether the connector runs or not, and never touches the offset
//! store or the slot.
//!
//! Which rows:
//! - `--since <RFC 3339 time>`: rows with `occurred_at >= since`;
//! - `--since <event_id>`: that row and everything after it: rows with
//!   `occurred_at >=` its `occurred_at`, except that its own aggregate is
//!   taken by sequence instead (sequence `>=` its sequence), so the aggregate's
//!   history resumes exactly at that event;
//! - `--until <time>`: only rows with `occurred_at < until`;
//! - `--aggregate-type`, `--aggregate-id`: only those aggregates;
//! - [`ReplayOptions::only`] (from `audit --repair`): only those event ids
//!   are sent; with the replay's own parking the others are still routed,
//!   so a poison row among them parks its aggregate as the stream would.
//!
//! Rows go out in per-aggregate sequence order, mapped like streamed inserts
//! (same topics, keys, headers; `lsn` is the server's WAL position when the
//! replay started), under the poison policy: `fail` stops at an unmappable
//! row; `dead-letter` sends it to the dead-letter topic and the rest of its
//! aggregate after it, parking in memory for this replay only. A missing
//! topic is created or refused per `[topics]`. `--topic-suffix` is appended to
//! every record's topic (the dead-letter topic too), so a replay can stay out
//! of the live topics. `--dry-run` counts per topic and sends nothing.

use std::collections::BTreeMap;
use std::hash::{Hash as _, Hasher as _};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::{StreamExt as _, pin_mut};
use tokio_postgres::Client;
use tracing::info;

use crate::config::Config;
use crate::outbox::topic::validate_topic_name;
use crate::pg::control::{query_value, server_version_num};
use crate::pg::{EventPosition, Lsn, PgConnectConfig, quote_ident};

use super::repair::committed_since;
use super::{BoundedSender, RetainedTable, micros_of, sql, tracks_commit_timestamps};
use crate::error::PipelineError;
use crate::poison::{MemoryParking, PoisonPolicyRouter, Route};

/// What to replay (the command line of `outbox-cdc replay`).
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// An RFC 3339 time, or an event id.
    pub since: String,
    pub until: Option<String>,
    pub aggregate_type: Option<String>,
    pub aggregate_id: Option<String>,
    /// Appended to every record's topic; empty for none.
    pub topic_suffix: String,
    pub dry_run: bool,
    /// Only rows with these event ids (the other filters still apply).
    pub only: Option<EventIdSet>,
    /// Where parked aggregates are read and parked (the connector's offset
    /// store, for the live witness); `None`: in memory, for this replay only.
    pub parking: Option<std::sync::Arc<crate::checkpoint::OffsetStore>>,
    /// Adds the header [`H_REPAIRED`] with this value to every record.
    pub mark_repaired: Option<&'static str>,
    /// Publishes every record in one Kafka transaction of this id (the
    /// exactly-once mode's read_committed consumers see them).
    pub transactional_id: Option<String>,
}

/// The header that marks a record published again from the table by the
/// connector (the live witness), not by the stream.
pub const H_REPAIRED: &str = "repaired_by";

/// A compact set of event ids: 127-bit fingerprints (two differently seeded
/// 64-bit hashes, the lowest bit cleared for its users' flags), 16 bytes an
/// id, sorted. A false match needs a collision of both hashes at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventIdSet(Arc<Vec<u128>>);

impl EventIdSet {
    /// The fingerprint an event id is kept as.
    pub fn fingerprint(event_id: &str) -> u128 {
        let half = |seed: u32| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            seed.hash(&mut h);
            event_id.hash(&mut h);
            h.finish()
        };
        ((u128::from(half(0x9e37_79b9)) << 64) | u128::from(half(0x85eb_ca6b))) & !1
    }

    pub fn from_fingerprints(mut fingerprints: Vec<u128>) -> EventIdSet {
        fingerprints.sort_unstable();
        fingerprints.dedup();
        EventIdSet(Arc::new(fingerprints))
    }

    pub fn contains(&self, event_id: &str) -> bool {
        self.0.binary_search(&Self::fingerprint(event_id)).is_ok()
    }

    /// The ids of this set that are not in `other`.
    pub fn without(&self, other: &EventIdSet) -> EventIdSet {
        let kept = self
            .0
            .iter()
            .filter(|f| other.0.binary_search(f).is_err())
            .copied()
            .collect();
        EventIdSet(Arc::new(kept))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What a replay sent (or, dry, would send).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Records per topic (after the suffix).
    pub by_topic: BTreeMap<String, u64>,
    pub dry_run: bool,
}

impl ReplayReport {
    pub fn total(&self) -> u64 {
        self.by_topic.values().sum()
    }
}

impl std::fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verb = if self.dry_run {
            "would publish"
        } else {
            "published"
        };
        writeln!(f, "{verb} {} records", self.total())?;
        for (topic, n) in &self.by_topic {
            writeln!(f, "{n}\t{topic}")?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(
        "invalid --{flag} {value:?}: {reason}. Expected an RFC 3339 time such as 2026-12-01T10:00:00Z{}",
        if *flag == "since" { " or an event_id" } else { "" }
    )]
    BadTime {
        flag: &'static str,
        value: String,
        reason: String,
    },
    #[error(
        "--since {0:?} is neither an RFC 3339 time (such as 2026-12-01T10:00:00Z) nor the event_id of a \
         retained outbox row (pruned, or never written)"
    )]
    UnknownEventId(String),
    #[error(
        "invalid --topic-suffix {suffix:?}: topic {topic:?} would break Kafka's topic-name rules ({reason})"
    )]
    BadTopic {
        suffix: String,
        topic: String,
        reason: String,
    },
    #[error("cannot replay from {table}: {reason}")]
    Unsupported { table: String, reason: String },
    #[error(
        "replay stopped after {sent} record(s) were sent ({acknowledged} acknowledged by Kafka); a rerun \
         sends them again, which consumers deduplicating by event_id absorb: {source}"
    )]
    Stopped {
        sent: u64,
        acknowledged: u64,
        #[source]
        source: Box<ReplayError>,
    },
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
}

impl From<crate::pg::PgError> for ReplayError {
    fn from(e: crate::pg::PgError) -> Self {
        ReplayError::Pipeline(PipelineError::Pg(e))
    }
}

/// Connects with `postgres.url` and replays.
pub async fn replay(config: &Config, options: &ReplayOptions) -> Result<ReplayReport, ReplayError> {
    let client = PgConnectConfig::parse(&config.postgres.url)?
        .connect_sql()
        .await?;
    replay_with(&client, config, options).await
}

/// Replays with an open SQL connection.
pub async fn replay_with(
    client: &Client,
    config: &Config,
    options: &ReplayOptions,
) -> Result<ReplayReport, ReplayError> {
    let e = sql("reading the outbox rows to replay");
    if !options.topic_suffix.is_empty()
        && let Err(reason) = validate_topic_name(&format!("x{}", options.topic_suffix))
    {
        return Err(ReplayError::BadTopic {
            suffix: options.topic_suffix.clone(),
            topic: format!("<topic>{}", options.topic_suffix),
            reason: reason.to_string(),
        });
    }
    let retained = RetainedTable::load(client, config).await?;
    let table = retained.table.clone();
    if !retained.has_column("occurred_at") {
        return Err(ReplayError::Unsupported {
            table: table.to_string(),
            reason: "it has no occurred_at column, which --since and --until select by".into(),
        });
    }
    let names = retained.names.clone();
    let col = |name: &str| format!("o.{}", quote_ident(name));

    // Parameters are all text, cast in SQL.
    let mut params: Vec<String> = Vec::new();
    let mut param = |value: String| {
        params.push(value);
        format!("${}", params.len())
    };
    let mut filters: Vec<String> = Vec::new();
    let since_time = match check_time(client, "since", &options.since).await {
        Ok(()) => Some(options.since.clone()),
        Err(bad) if looks_like_time(&options.since) => return Err(bad),
        Err(_) => None,
    };
    match since_time {
        // The caller chose the rows by its own window (audit --repair, the
        // live witness): from `since` by occurred_at.
        Some(time) if options.only.is_some() => filters.push(format!(
            "o.occurred_at >= {}::text::timestamptz",
            param(time)
        )),
        // Every transaction that committed at or after the time (review F7):
        // occurred_at is its start, so a row from before the time may be
        // one. By a local commit timestamp where tracked; otherwise (or
        // unknown, or an origin's) every row from repair.occurred_at_margin_ms
        // before the time goes (copies, never a gap).
        Some(time) => {
            let t = param(time);
            let margin = param(format!(
                "{} milliseconds",
                config.repair.occurred_at_margin_ms
            ));
            let since = micros_of(&format!("{t}::text::timestamptz"));
            let unknown = micros_of(&format!(
                "({t}::text::timestamptz - {margin}::text::interval)"
            ));
            let by_commit = tracks_commit_timestamps(client).await?;
            let origins_known = server_version_num(client).await? >= 140_000;
            // Without commit timestamps the filter is occurred_at against
            // its first bound.
            let first = if by_commit { &since } else { &unknown };
            filters.push(committed_since(
                by_commit,
                true,
                origins_known,
                (first, &unknown),
            ));
        }
        None => {
            // An event id: find its row.
            let seq = names
                .aggregate_sequence
                .as_deref()
                .map_or("NULL".to_owned(), |s| format!("{}::int8", col(s)));
            // By the column's own type, so that its index serves, and a
            // uuid in any letter case matches (review F14).
            let is_uuid = retained.columns.iter().any(|(c, oid)| {
                c == &names.event_id && *oid == tokio_postgres::types::Type::UUID.oid()
            });
            let (matches, wanted) = match is_uuid {
                true if !is_uuid_text(&options.since) => {
                    return Err(ReplayError::UnknownEventId(options.since.clone()));
                }
                true => ("$1::text::uuid", options.since.to_ascii_lowercase()),
                false => ("$1::text", options.since.clone()),
            };
            let row = client
                .query_opt(
                    &format!(
                        "SELECT o.occurred_at::text, {}::text, {}::text, {seq} FROM {table} AS o \
                         WHERE {} = {matches}",
                        col(&names.aggregate_type),
                        col(&names.aggregate_id),
                        col(&names.event_id),
                    ),
                    &[&wanted],
                )
                .await
                .map_err(&e)?
                .ok_or_else(|| ReplayError::UnknownEventId(options.since.clone()))?;
            let occurred: String = row.try_get(0).map_err(&e)?;
            let agg_type: String = row.try_get(1).map_err(&e)?;
            let agg_id: String = row.try_get(2).map_err(&e)?;
            let sequence: Option<i64> = row.try_get(3).map_err(&e)?;
            info!(event_id = %options.since, occurred_at = %occurred, aggregate_type = %agg_type,
                aggregate_id = %agg_id, sequence = ?sequence, "replaying from the event's row");
            let time = format!("o.occurred_at >= {}::text::timestamptz", param(occurred));
            match (&names.aggregate_sequence, sequence) {
                (Some(s), Some(n)) => {
                    let own = format!(
                        "({}::text = {} AND {}::text = {})",
                        col(&names.aggregate_type),
                        param(agg_type),
                        col(&names.aggregate_id),
                        param(agg_id)
                    );
                    filters.push(format!(
                        "((NOT {own} AND {time}) OR ({own} AND {}::int8 >= {}::text::int8))",
                        col(s),
                        param(n.to_string())
                    ))
                }
                _ => filters.push(time),
            }
        }
    }
    if let Some(until) = &options.until {
        check_time(client, "until", until).await?;
        filters.push(format!(
            "o.occurred_at < {}::text::timestamptz",
            param(until.clone())
        ));
    }
    if let Some(t) = &options.aggregate_type {
        filters.push(format!(
            "{}::text = {}",
            col(&names.aggregate_type),
            param(t.clone())
        ));
    }
    if let Some(id) = &options.aggregate_id {
        filters.push(format!(
            "{}::text = {}",
            col(&names.aggregate_id),
            param(id.clone())
        ));
    }

    // The record timestamp: the commit time when known, as streamed records have.
    let time = if tracks_commit_timestamps(client).await? {
        "coalesce(pg_xact_commit_timestamp(o.xmin), o.occurred_at)"
    } else {
        "o.occurred_at"
    };
    // On a standby (the live witness reads where the connector decodes):
    // its replay position.
    let select = "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                  ELSE pg_current_wal_lsn() END - '0/0'::pg_lsn)::int8";
    let at: i64 = query_value(client, select, &[]).await.map_err(&e)?;
    let at = Lsn::new(at as u64);
    let micros = micros_of(time);
    let query = format!(
        "SELECT {}, {micros}::int8 FROM {table} AS o WHERE {} ORDER BY {}",
        retained.select_list(),
        filters.join(" AND "),
        retained.order_by(&micros_of("o.occurred_at"))
    );
    info!(table = %table, since = %options.since, until = ?options.until, aggregate_type = ?options.aggregate_type,
        aggregate_id = ?options.aggregate_id, topic_suffix = %options.topic_suffix, dry_run = options.dry_run,
        lsn = %at, "replaying retained outbox rows");

    let mut sender = match (options.dry_run, &options.transactional_id) {
        (true, _) => None,
        (false, None) => Some(BoundedSender::new(config)?),
        (false, Some(id)) => Some(BoundedSender::transactional(config, id)?),
    };
    let router = PoisonPolicyRouter::new(&config.outbox);
    let memory = MemoryParking::default();
    let parking: &(dyn crate::poison::Parking + Sync) = match &options.parking {
        Some(store) => store.as_ref(),
        None => &memory,
    };
    let rows = client.query_raw(&query, params.iter()).await.map_err(&e)?;
    pin_mut!(rows);
    let mut report = ReplayReport {
        dry_run: options.dry_run,
        ..ReplayReport::default()
    };
    let mut seen: u64 = 0;
    let mut acknowledged: u64 = 0;
    let max_raw = config.outbox.max_record_bytes / 2;
    let sending = async {
        while let Some(row) = rows.next().await {
            let row = row.map_err(&e)?;
            let (mapped, commit_time) = retained.read(&row, at)?;
            // An unmappable row has no event id to match; it is not wanted.
            let wanted = options
                .only
                .as_ref()
                .is_none_or(|only| matches!(&mapped, Ok(event) if only.contains(&event.event_id)));
            // Rows not wanted are still routed when parking is this replay's
            // own: a poison row among them parks its aggregate, so that a wanted
            // row after it goes to the dead-letter topic, not past it (review
            // F1). The offset store's parking is the connector's: only its
            // stream parks there.
            if !wanted && options.parking.is_some() {
                continue;
            }
            let raw_json = match &mapped {
                Err(_) => Some(retained.row_json(&row, max_raw)?),
                Ok(_) => None,
            };
            let raw = || raw_json.unwrap_or_default();
            let mut event =
                match router.route(mapped, raw, parking, EventPosition::at(at), commit_time)? {
                    Route::Publish(event) | Route::DeadLetter(event) => event,
                };
            if !wanted {
                continue;
            }
            if let Some(value) = options.mark_repaired {
                (event.headers).push((H_REPAIRED.into(), Bytes::from_static(value.as_bytes())));
            }
            if !options.topic_suffix.is_empty() {
                event.topic.push_str(&options.topic_suffix);
                if let Err(reason) = validate_topic_name(&event.topic) {
                    return Err(ReplayError::BadTopic {
                        suffix: options.topic_suffix.clone(),
                        topic: event.topic,
                        reason: reason.to_string(),
                    });
                }
            }
            if let Some(sender) = sender.as_mut() {
                acknowledged += sender.send(&event).await?;
            }
            *report.by_topic.entry(event.topic).or_default() += 1;
            seen += 1;
            if seen.is_multiple_of(10_000) {
                info!(rows = seen, "replay progress");
            }
        }
        if let Some(sender) = sender.as_mut() {
            acknowledged += sender.finish().await?;
        }
        Ok::<(), ReplayError>(())
    };
    match sending.await {
        Ok(()) => Ok(report),
        // What went out before the failure goes out again with a rerun.
        Err(source) if seen > 0 && !options.dry_run => Err(ReplayError::Stopped {
            sent: seen,
            acknowledged,
            source: Box::new(source),
        }),
        Err(e) => Err(e),
    }
}

/// The text form of a uuid: 8-4-4-4-12 hex digits, either case.
fn is_uuid_text(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// Whether `text` is meant as a time (so a parse failure is a bad time, not
/// an event id): it starts like `YYYY-MM-DD`.
fn looks_like_time(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() >= 10
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[5..7].iter().all(u8::is_ascii_digit)
        && b[7] == b'-'
        && b[8..10].iter().all(u8::is_ascii_digit)
}

/// RFC 3339: `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` (`t`, `z` and a space for
/// `T` allowed, as RFC 3339 notes), checked here for shape and by PostgreSQL
/// for values (month 13 and the like).
async fn check_time(client: &Client, flag: &'static str, text: &str) -> Result<(), ReplayError> {
    let bad = |reason: &str| ReplayError::BadTime {
        flag,
        value: text.to_owned(),
        reason: reason.to_owned(),
    };
    if !is_rfc3339_shape(text) {
        return Err(bad(
            "not of the form YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM|+HH|-HH)",
        ));
    }
    client
        .query_one("SELECT $1::text::timestamptz", &[&text])
        .await
        .map_err(|e| {
            bad(&e
                .as_db_error()
                .map_or_else(|| e.to_string(), |d| d.message().to_owned()))
        })?;
    Ok(())
}

fn is_rfc3339_shape(text: &str) -> bool {
    let b = text.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|s| s.iter().all(u8::is_ascii_digit));
    if b.len() < 20
        || !digits(0..4)
        || b[4] != b'-'
        || !digits(5..7)
        || b[7] != b'-'
        || !digits(8..10)
        || !matches!(b[10], b'T' | b't' | b' ')
        || !digits(11..13)
        || b[13] != b':'
        || !digits(14..16)
        || b[16] != b':'
        || !digits(17..19)
    {
        return false;
    }
    let mut i = 19;
    if b[i] == b'.' {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return false;
        }
    }
    match &b[i..] {
        [b'Z' | b'z'] => true,
        [b'+' | b'-', h1, h2, b':', m1, m2] => [h1, h2, m1, m2].iter().all(|c| c.is_ascii_digit()),
        // PostgreSQL's own text form (`2026-12-05 07:46:47.177317+00`), as
        // `audit` prints its window (review F16).
        [b'+' | b'-', h1, h2] => h1.is_ascii_digit() && h2.is_ascii_digit(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_shapes() {
        for ok in [
            "2026-12-01T10:00:00Z",
            "2026-12-01t10:00:00z",
            "2026-12-01 10:00:00+01:00",
            "2026-12-01T10:00:00.123456-05:30",
            "2026-12-05 07:46:47.177317+00",
        ] {
            assert!(is_rfc3339_shape(ok), "{ok}");
        }
        for bad in [
            "2026-12-01",
            "2026-12-01T10:00:00",
            "2026-12-01T10:00Z",
            "2026-12-01T10:00:00.Z",
            "2026-12-01T10:00:00+0100",
            "yesterday",
            "",
        ] {
            assert!(!is_rfc3339_shape(bad), "{bad}");
        }
    }

    #[test]
    fn uuid_texts() {
        assert!(is_uuid_text("05944465-069C-4a1e-9b7f-3d2f8f1a2b3c"));
        assert!(!is_uuid_text("05944465069C4a1e9b7f3d2f8f1a2b3c"));
        assert!(!is_uuid_text("05944465-069C-4a1e-9b7f-3d2f8f1a2b3g"));
        assert!(!is_uuid_text("order-42"));
    }

    #[test]
    fn times_and_event_ids_are_told_apart() {
        assert!(looks_like_time("2026-12-01T10:00"));
        assert!(looks_like_time("2026-13-01T10:00:00Z"));
        assert!(!looks_like_time("0b4b1c9e-5a43-4c1e-9b7f-3d2f8f1a2b3c"));
        assert!(!looks_like_time("order-42"));
    }
}
