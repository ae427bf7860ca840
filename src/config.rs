//! Configuration: a TOML file, overlaid by `OUTBOX_CDC__SECTION__KEY` environment
//! variables, validated once at start-up.
//!
//! Every key has a documented default (see `config/example.toml`); errors name the
//! key, the value and what is allowed. Secrets (the PostgreSQL password, Kafka
//! passwords) never appear in `Debug` output or logs.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::outbox::OutboxSettings;
use crate::setting::InvalidSetting;
use crate::sink::{KafkaSettings, TopicSettings};

/// Prefix of environment variables that override file keys:
/// `OUTBOX_CDC__POSTGRES__URL`, `OUTBOX_CDC__KAFKA__BOOTSTRAP_SERVERS`, ...
pub const ENV_PREFIX: &str = "OUTBOX_CDC__";

/// A configuration problem, always naming where it is.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {message}")]
    Syntax { path: String, message: String },
    #[error("environment variable {var} does not name a config key: {reason}")]
    EnvKey { var: String, reason: String },
    #[error(transparent)]
    Invalid(#[from] InvalidSetting),
}

/// `value` of `key` within `range`, or the error saying "low to high" and `note`.
fn within(
    key: &str,
    value: u64,
    range: RangeInclusive<u64>,
    note: &str,
) -> Result<(), ConfigError> {
    if range.contains(&value) {
        return Ok(());
    }
    let allowed = format!("{} to {}{note}", range.start(), range.end());
    Err(ConfigError::invalid(key, value, allowed))
}

impl ConfigError {
    fn invalid(key: &str, value: impl fmt::Display, allowed: impl Into<String>) -> ConfigError {
        ConfigError::Invalid(InvalidSetting::new(key, value, allowed))
    }

    /// The config key this error is about, when it is about one key.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid(e) => Some(&e.key),
            _ => None,
        }
    }
}

/// The whole configuration.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The file it was loaded from (`None`: built from text), for messages
    /// that name the exact command to run.
    #[serde(skip)]
    pub origin: Option<PathBuf>,
    pub postgres: PostgresSettings,
    #[serde(default)]
    pub outbox: OutboxSettings,
    pub kafka: KafkaSettings,
    /// `[topics]`: what happens when a record's topic does not exist.
    #[serde(default)]
    pub topics: TopicSettings,
    #[serde(default)]
    pub offsets: OffsetSettings,
    #[serde(default)]
    pub limits: LimitSettings,
    #[serde(default)]
    pub http: HttpSettings,
    #[serde(default)]
    pub retry: RetrySettings,
    #[serde(default)]
    pub monitor: MonitorSettings,
    #[serde(default)]
    pub log: LogSettings,
    /// `[repair]`: gap repair after a lost slot.
    #[serde(default)]
    pub repair: RepairSettings,
    /// `[audit]`: live detection of gaps in aggregate sequences.
    #[serde(default)]
    pub audit: AuditSettings,
    /// `[prune]`: deleting published outbox rows older than a retention.
    #[serde(default)]
    pub prune: PruneSettings,
    /// `[delivery]`: at-least-once (default) or exactly-once into Kafka.
    #[serde(default)]
    pub delivery: DeliverySettings,
    /// `[health]`: the bounds of `/health/ready`.
    #[serde(default)]
    pub health: HealthSettings,
    /// `[reconcile]`: the outbox table as a live second witness.
    #[serde(default)]
    pub reconcile: ReconcileSettings,
}

/// `[delivery]`: what a Kafka consumer can count on (DESIGN.md §14,
/// docs/guarantees.md).
///
/// `at-least-once` (default): the idempotent producer; after a crash the
/// records in flight may be published again (consumers dedupe by `event_id`).
/// `exactly-once`: a transactional producer; one Kafka transaction carries
/// whole PostgreSQL transactions plus a marker record in `offsets_topic`, and
/// the acknowledged LSN is stored only after the Kafka transaction committed,
/// so a `read_committed` consumer sees every event once across any crash.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeliverySettings {
    pub mode: DeliveryMode,
    /// Kafka's `transaction.timeout.ms` (default 60000): the broker aborts a
    /// transaction open longer than this. One PostgreSQL transaction must be
    /// published within it (at most the broker's `transaction.max.timeout.ms`,
    /// 900000 by default).
    pub transaction_timeout_ms: u64,
    /// The compacted topic of the markers (created if missing).
    pub offsets_topic: String,
    /// A Kafka transaction is committed at the first PostgreSQL commit after
    /// it holds this many events (default 5000) ...
    pub max_batch_events: usize,
    /// ... or this many bytes of records (default 4 MiB) ...
    pub max_batch_bytes: usize,
    /// ... or has been open this long (default 10 ms): the latency bound at
    /// low traffic (each commit is a round trip to the transaction
    /// coordinator; docs/performance.md has what 10, 20 and 100 cost). While
    /// the connector is behind (more of the stream received than read, and
    /// the server sent it at least this long after its commit) the bound is
    /// ten times this: a backlog drains in fewer, larger transactions.
    pub max_batch_ms: u64,
}

/// `[delivery] mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeliveryMode {
    #[default]
    AtLeastOnce,
    ExactlyOnce,
}

impl DeliveryMode {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryMode::AtLeastOnce => "at-least-once",
            DeliveryMode::ExactlyOnce => "exactly-once",
        }
    }
}

impl<'de> Deserialize<'de> for DeliveryMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.as_str() {
            "at-least-once" => Ok(DeliveryMode::AtLeastOnce),
            "exactly-once" => Ok(DeliveryMode::ExactlyOnce),
            other => Err(serde::de::Error::custom(format!(
                "delivery.mode {other:?}: allowed \"at-least-once\" or \"exactly-once\""
            ))),
        }
    }
}

impl Default for DeliverySettings {
    fn default() -> Self {
        DeliverySettings {
            mode: DeliveryMode::default(),
            transaction_timeout_ms: 60_000,
            offsets_topic: "outbox-cdc.offsets".into(),
            max_batch_events: 5000,
            max_batch_bytes: 4 * 1024 * 1024,
            max_batch_ms: 10,
        }
    }
}

impl DeliverySettings {
    pub fn transaction_timeout(&self) -> Duration {
        Duration::from_millis(self.transaction_timeout_ms)
    }

    pub fn max_batch_age(&self) -> Duration {
        Duration::from_millis(self.max_batch_ms)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        within(
            "delivery.transaction_timeout_ms",
            self.transaction_timeout_ms,
            1_000..=900_000,
            " (and at most the broker's transaction.max.timeout.ms)",
        )?;
        if self.max_batch_ms == 0 || self.max_batch_ms > self.transaction_timeout_ms / 4 {
            return Err(ConfigError::invalid(
                "delivery.max_batch_ms",
                self.max_batch_ms,
                format!(
                    "1 to a quarter of delivery.transaction_timeout_ms ({})",
                    self.transaction_timeout_ms / 4
                ),
            ));
        }
        if self.max_batch_events == 0 {
            return Err(ConfigError::invalid(
                "delivery.max_batch_events",
                self.max_batch_events,
                "at least 1",
            ));
        }
        if self.max_batch_bytes < 1024 {
            return Err(ConfigError::invalid(
                "delivery.max_batch_bytes",
                self.max_batch_bytes,
                "at least 1024",
            ));
        }
        crate::outbox::topic::validate_topic_name(&self.offsets_topic).map_err(|reason| {
            ConfigError::invalid(
                "delivery.offsets_topic",
                &self.offsets_topic,
                format!("a legal Kafka topic name ({reason})"),
            )
        })?;
        Ok(())
    }
}

/// `[audit]`: the connector follows each aggregate's `aggregate_sequence` as
/// it publishes and counts (`outbox_cdc_sequence_gaps_total`) and logs every
/// number that does not follow the last one published.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditSettings {
    /// `consecutive` (default: 1, 2, 3, ... as `outbox_emit` numbers them),
    /// `increasing` (any larger number follows), or `off`.
    pub sequences: String,
    /// `warn` (default: count and log) or `stop` (stop before publishing the
    /// event, so nothing after it is acknowledged).
    pub on_gap: String,
    /// How often the last numbers are written to the offset store (default
    /// 1000 ms). The position reported to PostgreSQL waits for them (so the
    /// slot's confirmed position may trail the stored offset by this much);
    /// after a crash the server sends that stretch again and the numbers are
    /// read back from it, not published again.
    pub save_interval_ms: u64,
}

impl Default for AuditSettings {
    fn default() -> Self {
        AuditSettings {
            sequences: "consecutive".into(),
            on_gap: "warn".into(),
            save_interval_ms: 1000,
        }
    }
}

/// `[prune]`: retention of outbox rows (DESIGN.md §13). Rows older than
/// `retention` AND provably committed before the last acknowledged position
/// (`retained/prune.rs` says how: by transaction id, never by a clock) are
/// deleted, in batches of
/// `batch_rows`, every `interval` while `run` streams, or once by
/// `outbox-cdc prune`. Off by default.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PruneSettings {
    /// How long rows are kept, as a number and a unit: `7d`, `36h`, `90m`,
    /// `600s`. Default `""`: pruning is off.
    pub retention: String,
    /// Rows deleted per batch (one short transaction each). Default 10000.
    pub batch_rows: u64,
    /// How often `run` prunes, same units as `retention`. Default `5m`.
    pub interval: String,
    /// The longest the pruner waits for a lock (PostgreSQL `lock_timeout`),
    /// and so the longest an application insert can wait behind it while a
    /// partition is detached without `CONCURRENTLY` (PostgreSQL 13, or a
    /// partitioned table with a DEFAULT partition). Not granted in time: the
    /// partition is left for a later prune. Default 1000.
    pub lock_timeout_ms: u64,
}

impl Default for PruneSettings {
    fn default() -> Self {
        PruneSettings {
            retention: String::new(),
            batch_rows: 10_000,
            interval: "5m".into(),
            lock_timeout_ms: 1000,
        }
    }
}

/// `[health]`: the bounds of readiness.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthSettings {
    /// Not ready while the oldest unacknowledged event was committed longer
    /// ago than this, in milliseconds. Default 60000.
    pub max_unacked_age_ms: u64,
    /// Not ready while an aggregate has missed sequence numbers for longer
    /// than this, in milliseconds. Default 60000.
    pub max_gap_open_ms: u64,
    /// How often Kafka is asked for metadata, in milliseconds; each request
    /// may take as long. Not ready when none succeeded within three
    /// intervals. Default 5000.
    pub kafka_probe_interval_ms: u64,
}

impl Default for HealthSettings {
    fn default() -> HealthSettings {
        HealthSettings {
            max_unacked_age_ms: 60_000,
            max_gap_open_ms: 60_000,
            kafka_probe_interval_ms: 5_000,
        }
    }
}

impl HealthSettings {
    pub(crate) fn validate(&self) -> Result<(), InvalidSetting> {
        for (key, value, range) in [
            (
                "health.max_unacked_age_ms",
                self.max_unacked_age_ms,
                100..=86_400_000,
            ),
            (
                "health.max_gap_open_ms",
                self.max_gap_open_ms,
                0..=86_400_000,
            ),
            (
                "health.kafka_probe_interval_ms",
                self.kafka_probe_interval_ms,
                100..=600_000,
            ),
        ] {
            if !range.contains(&value) {
                return Err(InvalidSetting::new(
                    key,
                    value,
                    format!("{} to {} (milliseconds)", range.start(), range.end()),
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn probe_interval(&self) -> Duration {
        Duration::from_millis(self.kafka_probe_interval_ms)
    }

    /// How old the last successful probe may be.
    pub(crate) fn kafka_bound(&self) -> Duration {
        self.probe_interval() * 3
    }
}

/// `[reconcile]`: while `run` streams, the outbox table is compared with what
/// the stream delivered, and a committed row the stream skipped is published
/// from the table (`src/witness/`, docs/guarantees.md). On by default.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReconcileSettings {
    /// Default true; false turns the witness off (a stored coverage break then
    /// refuses the start until `audit --repair` clears it).
    pub enabled: bool,
    /// How often a round starts. Default 5000.
    pub interval_ms: u64,
    /// How far before the previous round rows are looked for by
    /// `occurred_at`: the longest a writing transaction may stay open (or its
    /// clock lag) and still have its rows checked. Default 300000 (5 min).
    pub settle_margin_ms: u64,
}

impl Default for ReconcileSettings {
    fn default() -> Self {
        ReconcileSettings {
            enabled: true,
            interval_ms: 5_000,
            settle_margin_ms: 300_000,
        }
    }
}

impl ReconcileSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        within(
            "reconcile.interval_ms",
            self.interval_ms,
            100..=3_600_000,
            "",
        )?;
        within(
            "reconcile.settle_margin_ms",
            self.settle_margin_ms,
            0..=86_400_000,
            "",
        )
    }

    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms)
    }
}

impl PruneSettings {
    /// The retention, or `None` when pruning is off. Valid after `Config::load`.
    pub fn retention(&self) -> Option<Duration> {
        match self.retention.trim() {
            "" => None,
            text => parse_duration(text).ok(),
        }
    }

    /// The pruning period of `run`. Valid after `Config::load`.
    pub fn interval(&self) -> Duration {
        parse_duration(&self.interval).unwrap_or(Duration::from_secs(300))
    }

    fn validate(&self) -> Result<(), ConfigError> {
        const UNITS: &str =
            "a whole number and a unit: d (days), h (hours), m (minutes) or s (seconds), e.g. 7d";
        if !self.retention.trim().is_empty() {
            match parse_duration(&self.retention) {
                Ok(d) if !d.is_zero() => {}
                _ => {
                    return Err(ConfigError::invalid(
                        "prune.retention",
                        &self.retention,
                        format!("{UNITS}; or \"\" for no pruning"),
                    ));
                }
            }
        }
        within("prune.batch_rows", self.batch_rows, 1..=1_000_000, "")?;
        within(
            "prune.lock_timeout_ms",
            self.lock_timeout_ms,
            1..=60_000,
            "",
        )?;
        match parse_duration(&self.interval) {
            Ok(d) if d >= Duration::from_secs(1) && d <= Duration::from_secs(86_400) => Ok(()),
            _ => Err(ConfigError::invalid(
                "prune.interval",
                &self.interval,
                format!("{UNITS}, from 1s to 1d"),
            )),
        }
    }
}

/// `7d`, `36h`, `90m`, `600s` (surrounding spaces allowed).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a whole number"))?;
    let secs = match unit.trim() {
        "d" => n.checked_mul(86_400),
        "h" => n.checked_mul(3_600),
        "m" => n.checked_mul(60),
        "s" => Some(n),
        other => return Err(format!("unknown unit {other:?}")),
    }
    .ok_or_else(|| format!("{text:?} is too long"))?;
    Ok(Duration::from_secs(secs))
}

/// `[repair]`: which retained outbox rows gap repair publishes again after a
/// lost slot (DESIGN.md §13). Rows committed at or after the last acknowledged
/// transaction's commit time minus a margin are published; duplicates are
/// allowed by the contract, a row left out would be lost.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RepairSettings {
    /// With `track_commit_timestamp = on`: the margin before the acknowledged
    /// commit time, for transactions whose commit timestamps and WAL order
    /// differ (concurrent commits). Milliseconds, default 10000.
    pub commit_time_margin_ms: u64,
    /// Without it, rows are chosen by `occurred_at` (the writing
    /// transaction's start): the margin covers the longest transaction.
    /// Milliseconds, default 3600000 (one hour).
    pub occurred_at_margin_ms: u64,
}

impl Default for RepairSettings {
    fn default() -> Self {
        RepairSettings {
            commit_time_margin_ms: 10_000,
            occurred_at_margin_ms: 3_600_000,
        }
    }
}

/// `[log]`: how the log on stderr is written (its level comes from `RUST_LOG`,
/// default `info`). Colour is used only when stderr is a terminal.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// `text` (default): one line per event for a person. `json`: one JSON
    /// object per line (`timestamp`, `level`, `target`, `message`, the event's
    /// fields, and `span`/`spans` with the fields of the enclosing spans) for a
    /// log collector.
    #[serde(default)]
    pub format: LogFormat,
}

/// The values of `log.format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// `[postgres]`: the source database and its replication slot.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresSettings {
    /// Connection string (URL or key=value); used for both the replication and
    /// the SQL connection. The password may instead come from `PGPASSWORD`.
    pub url: String,
    /// Logical replication slot (pgoutput). Default `outbox_cdc`.
    #[serde(default = "default_slot")]
    pub slot: String,
    /// Publication that holds the outbox table. Default `outbox_pub`.
    #[serde(default = "default_publication")]
    pub publication: String,
    /// Create the slot when it does not exist AND no offset is stored. Default true.
    #[serde(default = "default_true")]
    pub create_slot: bool,
    /// Create the publication (`FOR TABLE <outbox> WITH (publish = 'insert')`) when missing. Default false.
    #[serde(default)]
    pub create_publication: bool,
    /// Accept a slot whose confirmed position is ahead of the stored offset (an HA
    /// takeover from another instance that published those events). Default false:
    /// such a slot may have been recreated, and starting would skip events.
    #[serde(default)]
    pub allow_slot_ahead: bool,
    /// Create the slot with `failover` (PostgreSQL 17+), so that a standby with
    /// `sync_replication_slots = on` keeps a copy that survives its promotion.
    /// Refused at start on older servers. Has no effect on an existing slot. Default false.
    #[serde(default)]
    pub failover_slot: bool,
    /// The primary, when `url` is a hot standby (decoding on a standby,
    /// PostgreSQL 16+): the heartbeat writes there, and slot creation asks it
    /// for a running-transactions record (`pg_log_standby_snapshot()`).
    /// Without it the heartbeat is off on a standby. Default: none.
    #[serde(default)]
    pub primary_url: Option<String>,
    /// application_name shown in pg_stat_replication. Default `outbox-cdc`.
    #[serde(default = "default_application_name")]
    pub application_name: String,
    /// How often a standby status update is sent even when nothing changed, in
    /// milliseconds. Must stay well under the server's wal_sender_timeout. Default 10000.
    #[serde(default = "default_status_interval_ms")]
    pub status_interval_ms: u64,
    /// Whether the server sends a transaction larger than its
    /// logical_decoding_work_mem while it is still in progress (pgoutput
    /// protocol 2), instead of writing it to files on its own disk and
    /// sending nothing until it commits. The connector keeps such a
    /// transaction in a local spill ([limits] max_spill_memory_bytes in
    /// memory, the rest in files under [offsets] path) and publishes it at
    /// its commit. Default `auto`: `on` from PostgreSQL 14 when no
    /// [outbox] message_prefix is set, `off` otherwise.
    #[serde(default)]
    pub streaming: Streaming,
}

/// `[postgres] streaming`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Streaming {
    #[default]
    Auto,
    On,
    Off,
}

impl fmt::Debug for PostgresSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresSettings")
            .field("url", &redact_url(&self.url))
            .field("slot", &self.slot)
            .field("publication", &self.publication)
            .field("create_slot", &self.create_slot)
            .field("create_publication", &self.create_publication)
            .field("allow_slot_ahead", &self.allow_slot_ahead)
            .field("failover_slot", &self.failover_slot)
            .field("primary_url", &self.primary_url.as_deref().map(redact_url))
            .field("application_name", &self.application_name)
            .field("status_interval_ms", &self.status_interval_ms)
            .field("streaming", &self.streaming)
            .finish()
    }
}

/// `[offsets]`: the local sled store of acknowledged LSNs.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OffsetSettings {
    /// Directory of the sled store. Default `./outbox-cdc-offsets`.
    pub path: PathBuf,
    /// Longest time an acknowledged LSN waits before it is persisted (and then
    /// reported to PostgreSQL), in milliseconds. Batching flushes keeps fsyncs off
    /// the per-transaction path; a crash replays at most this window. Default 200.
    pub flush_interval_ms: u64,
}

impl Default for OffsetSettings {
    fn default() -> Self {
        OffsetSettings {
            path: PathBuf::from("./outbox-cdc-offsets"),
            flush_interval_ms: 200,
        }
    }
}

/// `[limits]`: bounds on work in flight to Kafka (backpressure).
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitSettings {
    /// Events sent to Kafka and not yet acknowledged. Default 10000.
    pub max_in_flight_events: usize,
    /// Bytes of those events. Default 64 MiB.
    pub max_in_flight_bytes: usize,
    /// On SIGINT/SIGTERM, how long to wait for in-flight deliveries (in
    /// exactly-once mode also for the last Kafka commit, whose outcome the
    /// next start otherwise reads from its marker), in milliseconds. The
    /// catalog's answers add at most 5 s each (a lookup under way, the
    /// final coverage proof). Default 30000.
    pub shutdown_timeout_ms: u64,
    /// Memory for streamed, not yet committed transactions ([postgres]
    /// streaming), counted as allocated over all of them however many are
    /// open; beyond it the largest buffer goes to its file under [offsets]
    /// path and is freed. Default 16 MiB.
    pub max_spill_memory_bytes: usize,
}

impl Default for LimitSettings {
    fn default() -> Self {
        LimitSettings {
            max_in_flight_events: 10_000,
            max_in_flight_bytes: 64 * 1024 * 1024,
            shutdown_timeout_ms: 30_000,
            max_spill_memory_bytes: 16 * 1024 * 1024,
        }
    }
}

/// `[http]`: metrics and health endpoints.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSettings {
    /// Listen address; empty disables the server. Default `127.0.0.1:9187`.
    pub listen: String,
    /// Connections open at once; a new one beyond it closes the oldest that
    /// has not sent its request yet. Default 256.
    pub max_connections: usize,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            listen: "127.0.0.1:9187".into(),
            max_connections: 256,
        }
    }
}

/// `[retry]`: reconnect backoff after a retryable failure.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetrySettings {
    /// First backoff, in milliseconds. Default 500.
    pub initial_backoff_ms: u64,
    /// Largest backoff, in milliseconds. Default 30000.
    pub max_backoff_ms: u64,
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            initial_backoff_ms: 500,
            max_backoff_ms: 30_000,
        }
    }
}

impl RetrySettings {
    pub fn initial_backoff(&self) -> Duration {
        Duration::from_millis(self.initial_backoff_ms)
    }
    pub fn max_backoff(&self) -> Duration {
        Duration::from_millis(self.max_backoff_ms)
    }
}

/// `[monitor]`: the slot-lag poller and the optional heartbeat.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MonitorSettings {
    /// How often `pg_replication_slots` and `pg_current_wal_lsn()` are polled for
    /// the slot gauges, in milliseconds. Default 5000.
    pub slot_poll_interval_ms: u64,
    /// Every this many milliseconds, `SELECT pg_logical_emit_message(false, <prefix>, now()::text)`
    /// writes a small WAL record into this database, so something reaches the
    /// connector and the slot advances while the outbox is quiet. Default 0: off.
    pub heartbeat_interval_ms: u64,
    /// Prefix of the heartbeat messages. Default `outbox-cdc-heartbeat`.
    pub heartbeat_prefix: String,
}

impl Default for MonitorSettings {
    fn default() -> Self {
        MonitorSettings {
            slot_poll_interval_ms: 5_000,
            heartbeat_interval_ms: 0,
            heartbeat_prefix: "outbox-cdc-heartbeat".into(),
        }
    }
}

impl MonitorSettings {
    pub fn slot_poll_interval(&self) -> Duration {
        Duration::from_millis(self.slot_poll_interval_ms)
    }
    /// `None` when the heartbeat is off.
    pub fn heartbeat_interval(&self) -> Option<Duration> {
        (self.heartbeat_interval_ms > 0).then(|| Duration::from_millis(self.heartbeat_interval_ms))
    }
}

fn default_slot() -> String {
    "outbox_cdc".into()
}
fn default_publication() -> String {
    "outbox_pub".into()
}
fn default_true() -> bool {
    true
}
fn default_application_name() -> String {
    "outbox-cdc".into()
}
fn default_status_interval_ms() -> u64 {
    10_000
}

impl Config {
    /// Reads `path`, overlays the process environment, validates.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        // vars_os: an unrelated variable that is not UTF-8 must not stop us.
        let env = std::env::vars_os().filter_map(|(k, v)| {
            let k = k.into_string().ok()?;
            k.starts_with(ENV_PREFIX).then_some(())?;
            Some((k, v.into_string().unwrap_or_default()))
        });
        let mut config = Config::from_sources(&path.display().to_string(), &text, env)?;
        config.origin = Some(path.to_owned());
        Ok(config)
    }

    /// The `--config` argument that loads this configuration again, for
    /// commands named in messages.
    pub fn config_argument(&self) -> String {
        match &self.origin {
            Some(path) => path.display().to_string(),
            None => "<this configuration>".to_owned(),
        }
    }

    /// Parses TOML `text` (named `origin` in errors), overlays `env` (only
    /// variables starting with [`ENV_PREFIX`] are read), and validates.
    pub fn from_sources(
        origin: &str,
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut table: toml::Table =
            text.parse()
                .map_err(|e: toml::de::Error| ConfigError::Syntax {
                    path: origin.to_owned(),
                    message: e.to_string(),
                })?;
        overlay_env(&mut table, env)?;
        stringify_kafka_values(&mut table);
        let config: Config =
            Config::deserialize(toml::Value::Table(table)).map_err(|e| ConfigError::Syntax {
                path: origin.to_owned(),
                message: e.to_string(),
            })?;
        config.validate()?;
        Ok(config)
    }

    /// The producer's own limits must hold what the pipeline lets through:
    /// librdkafka's queue must take `limits.max_in_flight_events` records (the
    /// pipeline stops reading before it fills, so a full queue never blocks
    /// the session), and `message.max.bytes` must take a record of
    /// `outbox.max_record_bytes` (else a record the mapper accepts is refused
    /// by the producer).
    fn validate_producer_limits(&self) -> Result<(), ConfigError> {
        let number = |key: &str, default: usize| -> Result<usize, ConfigError> {
            match self.kafka.get(key) {
                None => Ok(default),
                Some(v) => v.trim().parse().map_err(|_| {
                    ConfigError::invalid(&format!("kafka.{key}"), v, "a whole number")
                }),
            }
        };
        // `kafka_key` (librdkafka's `default` when unset) must be at least
        // the value of our `limit_key`.
        let at_least = |kafka_key: &str, default: usize, limit_key: &str, limit: usize| {
            let value = number(kafka_key, default)?;
            if value < limit {
                return Err(ConfigError::invalid(
                    &format!("kafka.\"{kafka_key}\""),
                    value,
                    format!("at least {limit_key} ({limit}), or lower {limit_key}"),
                ));
            }
            Ok(())
        };
        at_least(
            "queue.buffering.max.messages",
            100_000,
            "limits.max_in_flight_events",
            self.limits.max_in_flight_events,
        )?;
        at_least(
            "message.max.bytes",
            1_000_000,
            "outbox.max_record_bytes",
            self.outbox.max_record_bytes,
        )
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.health.validate()?;
        if !["consecutive", "increasing", "off"].contains(&self.audit.sequences.as_str()) {
            return Err(ConfigError::invalid(
                "audit.sequences",
                &self.audit.sequences,
                "\"consecutive\", \"increasing\" or \"off\"",
            ));
        }
        if !["warn", "stop"].contains(&self.audit.on_gap.as_str()) {
            return Err(ConfigError::invalid(
                "audit.on_gap",
                &self.audit.on_gap,
                "\"warn\" or \"stop\"",
            ));
        }
        within(
            "audit.save_interval_ms",
            self.audit.save_interval_ms,
            1..=60_000,
            "",
        )?;
        let pg = &self.postgres;
        if pg.url.trim().is_empty() {
            return Err(ConfigError::invalid(
                "postgres.url",
                "",
                "a PostgreSQL URL or key=value connection string",
            ));
        }
        if let Some(primary) = &pg.primary_url
            && let Err(e) = crate::pg::PgConnectConfig::parse(primary)
        {
            return Err(ConfigError::invalid(
                "postgres.primary_url",
                redact_url(primary),
                format!("a PostgreSQL URL or key=value connection string ({e})"),
            ));
        }
        check_slot_name("postgres.slot", &pg.slot)?;
        if pg.publication.is_empty() || pg.publication.len() > 63 {
            return Err(ConfigError::invalid(
                "postgres.publication",
                &pg.publication,
                "1 to 63 characters",
            ));
        }
        within(
            "postgres.status_interval_ms",
            pg.status_interval_ms,
            100..=600_000,
            " (keep it well under the server's wal_sender_timeout)",
        )?;
        if self.offsets.path.as_os_str().is_empty() {
            return Err(ConfigError::invalid(
                "offsets.path",
                "",
                "a directory path for the sled store",
            ));
        }
        within(
            "offsets.flush_interval_ms",
            self.offsets.flush_interval_ms,
            1..=60_000,
            "",
        )?;
        if self.limits.max_in_flight_events == 0 {
            return Err(ConfigError::invalid(
                "limits.max_in_flight_events",
                0,
                "at least 1",
            ));
        }
        if self.limits.max_in_flight_bytes < 1024 {
            return Err(ConfigError::invalid(
                "limits.max_in_flight_bytes",
                self.limits.max_in_flight_bytes,
                "at least 1024",
            ));
        }
        if !self.http.listen.is_empty() && self.http.listen.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(ConfigError::invalid(
                "http.listen",
                &self.http.listen,
                "an IP:port socket address such as 127.0.0.1:9187, or \"\" to disable",
            ));
        }
        within(
            "http.max_connections",
            self.http.max_connections as u64,
            1..=65_536,
            "",
        )?;
        self.validate_producer_limits()?;
        let retry = &self.retry;
        if retry.initial_backoff_ms == 0 || retry.initial_backoff_ms > retry.max_backoff_ms {
            return Err(ConfigError::invalid(
                "retry.initial_backoff_ms",
                retry.initial_backoff_ms,
                format!(
                    "between 1 and retry.max_backoff_ms ({})",
                    retry.max_backoff_ms
                ),
            ));
        }
        self.monitor.validate(&self.outbox.message_prefix)?;
        if self.postgres.streaming == Streaming::On && !self.outbox.message_prefix.is_empty() {
            // pgoutput sends a streamed logical message with its top-level
            // xid: one written inside a savepoint that rolls back could not
            // be told apart from the others.
            return Err(ConfigError::invalid(
                "postgres.streaming",
                "on",
                "auto or off while outbox.message_prefix is set (a streamed logical message does not say which savepoint wrote it)",
            ));
        }
        if self.limits.max_spill_memory_bytes == 0 {
            return Err(ConfigError::invalid(
                "limits.max_spill_memory_bytes",
                "0",
                "at least 1 byte",
            ));
        }
        self.prune.validate()?;
        self.reconcile.validate()?;
        self.delivery.validate()?;
        self.topics.validate()?;
        self.outbox.validate()?;
        match self.kafka.validate() {
            Ok(()) => {}
            Err(crate::sink::SinkError::Config {
                key,
                value,
                allowed,
            }) => {
                return Err(ConfigError::invalid(
                    &format!("kafka.{key}"),
                    value,
                    allowed,
                ));
            }
            Err(other) => {
                return Err(ConfigError::invalid("kafka", "", other.to_string()));
            }
        }
        Ok(())
    }
}

impl MonitorSettings {
    fn validate(&self, message_prefix: &str) -> Result<(), ConfigError> {
        within(
            "monitor.slot_poll_interval_ms",
            self.slot_poll_interval_ms,
            100..=3_600_000,
            "",
        )?;
        if self.heartbeat_interval_ms != 0
            && !(100..=3_600_000).contains(&self.heartbeat_interval_ms)
        {
            return Err(ConfigError::invalid(
                "monitor.heartbeat_interval_ms",
                self.heartbeat_interval_ms,
                "0 (off) or 100 to 3600000",
            ));
        }
        // A heartbeat that shared the event prefix would read as a (malformed) event.
        if self.heartbeat_prefix.is_empty() || self.heartbeat_prefix == message_prefix {
            return Err(ConfigError::invalid(
                "monitor.heartbeat_prefix",
                &self.heartbeat_prefix,
                "a non-empty prefix different from outbox.message_prefix",
            ));
        }
        Ok(())
    }
}

/// PostgreSQL slot names: lower-case letters, digits and underscores, at most 63.
fn check_slot_name(key: &str, name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::invalid(
            key,
            name,
            "1 to 63 characters of a-z, 0-9 and _ (PostgreSQL's rule for slot names)",
        ))
    }
}

/// `OUTBOX_CDC__POSTGRES__URL=...` sets `[postgres] url`. In `[kafka]`, single
/// underscores stand for dots: `OUTBOX_CDC__KAFKA__BOOTSTRAP_SERVERS` sets
/// `"bootstrap.servers"`. Topic configs take the same rule one level down:
/// `OUTBOX_CDC__TOPICS__CONFIG__RETENTION_MS` sets `[topics.config] "retention.ms"`.
/// A value replaces the file's; the keys in [`NUMBER_KEYS`] and [`BOOL_KEYS`]
/// are typed, every other value stays the variable's text.
fn overlay_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<(), ConfigError> {
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in env {
        if let Some(rest) = k.strip_prefix(ENV_PREFIX) {
            vars.insert(rest.to_owned(), v);
        }
    }
    for (rest, value) in vars {
        let var = format!("{ENV_PREFIX}{rest}");
        let (section, key) = rest.split_once("__").ok_or_else(|| ConfigError::EnvKey {
            var: var.clone(),
            reason: "expected OUTBOX_CDC__<SECTION>__<KEY>".into(),
        })?;
        let section = section.to_ascii_lowercase();
        if section == "topics"
            && let Some(name) = key
                .split_once("__")
                .filter(|(sub, name)| sub.eq_ignore_ascii_case("config") && !name.is_empty())
                .map(|(_, name)| name.to_ascii_lowercase().replace('_', "."))
        {
            set_topic_config(table, &var, name, value)?;
            continue;
        }
        // One sub-table level outside [kafka]: OUTBOX_CDC__OUTBOX__CLOUDEVENTS__ENABLED
        // sets [outbox.cloudevents] enabled.
        let (sub, key) = match key.split_once("__") {
            Some((sub, key)) if section != "kafka" => (Some(sub.to_ascii_lowercase()), key),
            _ => (None, key),
        };
        if section.is_empty() || key.is_empty() || key.contains("__") || sub.as_deref() == Some("")
        {
            return Err(ConfigError::EnvKey {
                var,
                reason:
                    "expected OUTBOX_CDC__<SECTION>__<KEY> or OUTBOX_CDC__<SECTION>__<TABLE>__<KEY>"
                        .into(),
            });
        }
        let key = if section == "kafka" {
            key.to_ascii_lowercase().replace('_', ".")
        } else {
            key.to_ascii_lowercase()
        };
        let mut path = vec![section.clone()];
        path.extend(sub);
        let mut section_table = &mut *table;
        for (depth, name) in path.iter().enumerate() {
            let entry = section_table
                .entry(name.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            let Some(inner) = entry.as_table_mut() else {
                return Err(ConfigError::EnvKey {
                    var,
                    reason: format!(
                        "[{}] is not a table in the config file",
                        path[..=depth].join(".")
                    ),
                });
            };
            section_table = inner;
        }
        let qualified = format!("{}.{key}", path.join("."));
        let typed = if section == "kafka" {
            // librdkafka takes strings; "0123" must stay "0123".
            toml::Value::String(value)
        } else {
            typed_env_value(&var, &qualified, value)?
        };
        section_table.insert(key, typed);
    }
    Ok(())
}

/// `[topics.config] name = value` from an environment variable.
fn set_topic_config(
    table: &mut toml::Table,
    var: &str,
    name: String,
    value: String,
) -> Result<(), ConfigError> {
    let not_a_table = |what: &str| ConfigError::EnvKey {
        var: var.to_owned(),
        reason: format!("{what} is not a table in the config file"),
    };
    let topics = table
        .entry("topics")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .ok_or_else(|| not_a_table("[topics]"))?;
    let config = topics
        .entry("config")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .ok_or_else(|| not_a_table("[topics.config]"))?;
    config.insert(name, toml::Value::String(value));
    Ok(())
}

/// Keys whose values are not strings; every other key takes the variable's text as is.
const NUMBER_KEYS: &[&str] = &[
    "delivery.transaction_timeout_ms",
    "delivery.max_batch_events",
    "delivery.max_batch_bytes",
    "delivery.max_batch_ms",
    "repair.commit_time_margin_ms",
    "repair.occurred_at_margin_ms",
    "postgres.status_interval_ms",
    "outbox.max_record_bytes",
    "offsets.flush_interval_ms",
    "audit.save_interval_ms",
    "limits.max_in_flight_events",
    "limits.max_in_flight_bytes",
    "limits.shutdown_timeout_ms",
    "limits.max_spill_memory_bytes",
    "retry.initial_backoff_ms",
    "retry.max_backoff_ms",
    "monitor.slot_poll_interval_ms",
    "monitor.heartbeat_interval_ms",
    "topics.partitions",
    "topics.replication_factor",
    "prune.batch_rows",
    "prune.lock_timeout_ms",
    "reconcile.interval_ms",
    "reconcile.settle_margin_ms",
    "http.max_connections",
    "health.max_unacked_age_ms",
    "health.max_gap_open_ms",
    "health.kafka_probe_interval_ms",
];
const BOOL_KEYS: &[&str] = &[
    "postgres.create_slot",
    "postgres.create_publication",
    "postgres.allow_slot_ahead",
    "postgres.failover_slot",
    "outbox.allow_split_aggregates",
    "outbox.cloudevents.enabled",
    "outbox.cloudevents.subject",
    "topics.create",
    "reconcile.enabled",
];

fn typed_env_value(var: &str, key: &str, value: String) -> Result<toml::Value, ConfigError> {
    let refused =
        |allowed: &str| ConfigError::invalid(key, format!("{value} (from {var})"), allowed);
    if NUMBER_KEYS.contains(&key) {
        let number = value.trim().parse::<i64>();
        return number
            .map(toml::Value::Integer)
            .map_err(|_| refused("a whole number"));
    }
    if BOOL_KEYS.contains(&key) {
        let flag = value.trim().parse::<bool>();
        return flag
            .map(toml::Value::Boolean)
            .map_err(|_| refused("true or false"));
    }
    if LIST_KEYS.contains(&key) {
        return Ok(toml::Value::Array(
            value
                .split(',')
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(|v| toml::Value::String(v.to_owned()))
                .collect(),
        ));
    }
    Ok(toml::Value::String(value))
}

/// Keys whose values are lists of strings; from the environment, comma-separated.
const LIST_KEYS: &[&str] = &[
    "outbox.extra_headers",
    "outbox.additional_placement",
    "outbox.headers",
];

/// librdkafka takes every property as a string; accept `linger.ms = 5` in TOML too.
/// (`[topics.config]` values are kept as strings by their own deserializer.)
fn stringify_kafka_values(table: &mut toml::Table) {
    if let Some(toml::Value::Table(kafka)) = table.get_mut("kafka") {
        for (_, value) in kafka.iter_mut() {
            let text = match &*value {
                toml::Value::String(_) => continue,
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                other => other.to_string(),
            };
            *value = toml::Value::String(text);
        }
    }
}

/// The connection string with every password replaced by `***`, for logs,
/// `Debug` and errors. It errs on hiding too much: whatever libpq or
/// tokio-postgres (which read a few URLs differently) could take as a
/// password is hidden, and a key=value string that stops parsing is shown
/// only up to that point.
pub fn redact_url(url: &str) -> String {
    // A URL exactly when libpq takes it for one (a key=value value may hold
    // `://`); anything else that is no key=value string is not shown.
    for scheme in ["postgres", "postgresql"] {
        if let Some(rest) = url.strip_prefix(scheme).and_then(|r| r.strip_prefix("://")) {
            return format!("{scheme}://{}", redact_url_params(&redact_userinfo(rest)));
        }
    }
    redact_key_values(url)
}

/// `user:password@host`: libpq ends the user info at the first `@` before
/// any `/`, tokio-postgres at the first `@` anywhere. The password shown as
/// `***` runs from the first `:` to the last `@` before the first `/` (an
/// unencoded `@` in the password), else to the first `@`.
fn redact_userinfo(rest: &str) -> String {
    let slash = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..slash].rfind('@').or_else(|| rest.find('@')) else {
        return rest.to_owned();
    };
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{user}:***{}", &rest[at..]),
        None => rest.to_owned(),
    }
}

/// Every `password=` parameter after a `?` or `&`, its key percent-decoded
/// and in any case (both parsers decode the key; either refuses another
/// case, in an error that shows this text): the value, up to the next `&`,
/// becomes `***`.
fn redact_url_params(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(['?', '&']) {
        out.push_str(&rest[..=i]);
        rest = &rest[i + 1..];
        let key_end = rest.find(['=', '?', '&']).unwrap_or(rest.len());
        if rest[key_end..].starts_with('=') && is_password_key(&lenient_decode(&rest[..key_end])) {
            let value_end = rest.find('&').unwrap_or(rest.len());
            out.push_str(&rest[..=key_end]);
            out.push_str("***");
            rest = &rest[value_end..];
        }
    }
    out.push_str(rest);
    out
}

/// libpq's key=value form: spaces around `=` allowed, values bare or
/// single-quoted, `\` escaping the next character in both.
fn redact_key_values(s: &str) -> String {
    let mut shown = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            shown.push("[the rest does not parse and is not shown]".to_owned());
            break;
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut raw = String::new();
        let quoted = chars.next_if_eq(&'\'').is_some();
        let mut terminated = !quoted;
        if quoted {
            raw.push('\'');
        }
        while let Some(c) = chars.next_if(|c| quoted || !c.is_whitespace()) {
            raw.push(c);
            if c == '\\' {
                raw.extend(chars.next());
            } else if quoted && c == '\'' {
                terminated = true;
                break;
            }
        }
        if is_password_key(&key) {
            shown.push(format!("{key}=***"));
        } else if terminated {
            shown.push(format!("{key}={raw}"));
        } else {
            shown.push("[the rest does not parse and is not shown]".to_owned());
        }
        if !terminated {
            break;
        }
    }
    shown.join(" ")
}

fn is_password_key(key: &str) -> bool {
    key.eq_ignore_ascii_case("password")
}

/// `%XX` decoded where it is valid, everything else kept.
fn lenient_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
        [postgres]
        url = "postgres://outbox:secret@127.0.0.1:54329/app"
        [kafka]
        "bootstrap.servers" = "127.0.0.1:19092"
    "#;

    fn parse(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_sources(
            "test.toml",
            text,
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
    }

    fn invalid_key(err: ConfigError) -> String {
        err.key()
            .unwrap_or_else(|| panic!("expected an Invalid error naming a key, got: {err}"))
            .to_owned()
    }

    /// Each `(key, value)`: the key's variable (`postgres.slot`:
    /// `OUTBOX_CDC__POSTGRES__SLOT`) set to the value is refused, naming the
    /// key.
    fn assert_refused_naming_key(cases: &[(&str, &str)]) {
        for (key, value) in cases {
            let var = format!(
                "OUTBOX_CDC__{}",
                key.to_ascii_uppercase().replace('.', "__")
            );
            let err = parse(MINIMAL, &[(&var, value)]).unwrap_err();
            assert_eq!(invalid_key(err), *key, "{var}={value}");
        }
    }

    #[test]
    fn producer_limits_must_hold_what_the_pipeline_lets_through() {
        let base =
            "[postgres]\nurl = \"postgres://u@h/d\"\n[kafka]\n\"bootstrap.servers\" = \"k:9092\"\n";
        let load = |extra: &str| {
            Config::from_sources(
                "t.toml",
                &format!("{base}{extra}"),
                Vec::<(String, String)>::new(),
            )
        };
        let err = load("\"queue.buffering.max.messages\" = \"500\"\n").unwrap_err();
        assert!(
            err.to_string().contains("queue.buffering.max.messages")
                && err.to_string().contains("limits.max_in_flight_events"),
            "{err}"
        );
        let err = load("\"message.max.bytes\" = \"1000\"\n").unwrap_err();
        assert!(
            err.to_string().contains("message.max.bytes")
                && err.to_string().contains("outbox.max_record_bytes"),
            "{err}"
        );
        assert!(load("\"queue.buffering.max.messages\" = \"10000\"\n").is_ok());
    }

    #[test]
    fn delivery_defaults_to_at_least_once_and_takes_exactly_once_from_file_or_environment() {
        let c = parse(MINIMAL, &[]).unwrap();
        assert_eq!(c.delivery.mode, DeliveryMode::AtLeastOnce);
        assert_eq!(c.delivery.offsets_topic, "outbox-cdc.offsets");
        assert_eq!(
            (c.delivery.max_batch_ms, c.delivery.max_batch_events),
            (10, 5000)
        );
        assert_eq!(c.delivery.transaction_timeout_ms, 60_000);
        let text = format!("{MINIMAL}\n[delivery]\nmode = \"exactly-once\"\n");
        assert_eq!(
            parse(&text, &[]).unwrap().delivery.mode,
            DeliveryMode::ExactlyOnce
        );
        let env = [
            ("OUTBOX_CDC__DELIVERY__MODE", "exactly-once"),
            ("OUTBOX_CDC__DELIVERY__MAX_BATCH_MS", "100"),
        ];
        let c = parse(MINIMAL, &env).unwrap();
        assert_eq!(c.delivery.mode, DeliveryMode::ExactlyOnce);
        assert_eq!(c.delivery.max_batch_ms, 100);
        let bad_mode = parse(&text.replace("exactly-once", "exactly_once"), &[]).unwrap_err();
        assert!(bad_mode.to_string().contains("at-least-once"), "{bad_mode}");
        assert_refused_naming_key(&[
            ("delivery.transaction_timeout_ms", "999"),
            ("delivery.max_batch_ms", "15001"),
            ("delivery.max_batch_events", "0"),
            ("delivery.offsets_topic", "a/b"),
        ]);
    }

    #[test]
    fn minimal_config_gets_documented_defaults() {
        let c = parse(MINIMAL, &[]).unwrap();
        assert_eq!(c.postgres.slot, "outbox_cdc");
        assert_eq!(c.postgres.publication, "outbox_pub");
        assert!(c.postgres.create_slot);
        assert!(!c.postgres.create_publication);
        assert_eq!(c.limits.max_in_flight_events, 10_000);
        assert_eq!(c.limits.max_in_flight_bytes, 64 * 1024 * 1024);
        assert_eq!(c.http.listen, "127.0.0.1:9187");
        assert_eq!(c.offsets.flush_interval_ms, 200);
    }

    #[test]
    fn prune_is_off_by_default_and_takes_durations_with_units() {
        let c = parse(MINIMAL, &[]).unwrap();
        assert_eq!(c.prune.retention(), None);
        assert_eq!(c.prune.batch_rows, 10_000);
        assert_eq!(c.prune.interval(), Duration::from_secs(300));
        assert_eq!(c.prune.lock_timeout_ms, 1000);
        for (text, secs) in [
            ("7d", 604_800),
            ("36h", 129_600),
            ("90m", 5_400),
            ("600s", 600),
        ] {
            let c = parse(MINIMAL, &[("OUTBOX_CDC__PRUNE__RETENTION", text)]).unwrap();
            assert_eq!(
                c.prune.retention(),
                Some(Duration::from_secs(secs)),
                "{text}"
            );
        }
        let c = parse(MINIMAL, &[("OUTBOX_CDC__PRUNE__RETENTION", "")]).unwrap();
        assert_eq!(c.prune.retention(), None);
        assert_refused_naming_key(&[
            ("prune.retention", "7"),
            ("prune.retention", "7w"),
            ("prune.retention", "0d"),
            ("prune.retention", "-1d"),
            ("prune.batch_rows", "0"),
            ("prune.lock_timeout_ms", "0"),
            ("prune.interval", "0s"),
            ("prune.interval", "2d"),
        ]);
    }

    #[test]
    fn log_format_from_file_and_environment() {
        assert_eq!(parse(MINIMAL, &[]).unwrap().log.format, LogFormat::Text);
        let json = format!("{MINIMAL}\n[log]\nformat = \"json\"\n");
        assert_eq!(parse(&json, &[]).unwrap().log.format, LogFormat::Json);
        let c = parse(MINIMAL, &[("OUTBOX_CDC__LOG__FORMAT", "json")]).unwrap();
        assert_eq!(c.log.format, LogFormat::Json);
        let e = parse(MINIMAL, &[("OUTBOX_CDC__LOG__FORMAT", "xml")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("format") && e.contains("xml") && e.contains("`json`"),
            "{e}"
        );
    }

    #[test]
    fn example_configs_in_the_repo_parse() {
        for file in ["config/example.toml", "config/docker.toml"] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
            let text = std::fs::read_to_string(&path).unwrap();
            let c = Config::from_sources(file, &text, std::iter::empty());
            assert!(
                c.is_ok(),
                "{file}: {}",
                c.err().map(|e| e.to_string()).unwrap_or_default()
            );
        }
    }

    #[test]
    fn environment_overrides_file_values() {
        let text = MINIMAL.replace("[kafka]", "publication = \"p\"\n[kafka]");
        let c = parse(
            &text,
            &[
                ("OUTBOX_CDC__POSTGRES__SLOT", "other_slot"),
                ("OUTBOX_CDC__LIMITS__MAX_IN_FLIGHT_EVENTS", "7"),
                ("OUTBOX_CDC__KAFKA__LINGER_MS", "5"),
                ("OUTBOX_CDC__POSTGRES__PUBLICATION", "123"),
                ("UNRELATED", "x"),
            ],
        )
        .unwrap();
        assert_eq!(c.postgres.slot, "other_slot");
        assert_eq!(c.limits.max_in_flight_events, 7);
        assert_eq!(
            c.postgres.publication, "123",
            "a key the file holds as a string stays a string"
        );
        let dbg = format!("{:?}", c.kafka);
        assert!(
            dbg.contains("linger.ms"),
            "kafka key mapped with dots: {dbg}"
        );
    }

    #[test]
    fn env_typing_table_matches_the_example_config() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/example.toml");
        let table: toml::Table = std::fs::read_to_string(path).unwrap().parse().unwrap();
        // Every typed key, sub-tables such as [outbox.cloudevents] included.
        fn walk(prefix: &str, values: &toml::Table, non_string: &mut Vec<String>) {
            for (key, value) in values {
                let qualified = format!("{prefix}.{key}");
                match value {
                    toml::Value::Integer(_) => assert!(
                        NUMBER_KEYS.contains(&qualified.as_str()),
                        "{qualified} missing from NUMBER_KEYS"
                    ),
                    toml::Value::Boolean(_) => assert!(
                        BOOL_KEYS.contains(&qualified.as_str()),
                        "{qualified} missing from BOOL_KEYS"
                    ),
                    toml::Value::Array(_) => assert!(
                        LIST_KEYS.contains(&qualified.as_str()),
                        "{qualified} missing from LIST_KEYS"
                    ),
                    toml::Value::Table(inner) => {
                        walk(&qualified, inner, non_string);
                        continue;
                    }
                    _ => continue,
                }
                non_string.push(qualified);
            }
        }
        let mut non_string = Vec::new();
        for (section, values) in &table {
            if section == "kafka" {
                continue;
            }
            walk(section, values.as_table().unwrap(), &mut non_string);
        }
        for key in NUMBER_KEYS.iter().chain(BOOL_KEYS).chain(LIST_KEYS) {
            assert!(
                non_string.contains(&key.to_string()),
                "{key} is not in config/example.toml"
            );
        }
    }

    #[test]
    fn env_reaches_one_sub_table_level() {
        let c = parse(
            MINIMAL,
            &[
                ("OUTBOX_CDC__OUTBOX__CLOUDEVENTS__ENABLED", "true"),
                ("OUTBOX_CDC__OUTBOX__CLOUDEVENTS__SOURCE", "/orders"),
                ("OUTBOX_CDC__OUTBOX__COLUMNS__PAYLOAD", "body"),
            ],
        )
        .unwrap();
        assert!(c.outbox.cloudevents.enabled);
        let lists = parse(
            MINIMAL,
            &[(
                "OUTBOX_CDC__OUTBOX__ADDITIONAL_PLACEMENT",
                "type:header:eventType, v:envelope",
            )],
        )
        .unwrap();
        assert_eq!(
            lists.outbox.additional_placement,
            vec!["type:header:eventType", "v:envelope"]
        );

        assert_eq!(c.outbox.cloudevents.source, "/orders");
        assert_eq!(c.outbox.columns.payload.as_deref(), Some("body"));
        for bad in [
            "OUTBOX_CDC__OUTBOX__CLOUDEVENTS__A__B",
            "OUTBOX_CDC__OUTBOX____ENABLED",
        ] {
            let e = parse(MINIMAL, &[(bad, "x")]).unwrap_err();
            assert!(matches!(e, ConfigError::EnvKey { .. }), "{bad}: {e}");
        }
        // A sub-key of a key that is not a table is an error naming the key.
        let e = parse(MINIMAL, &[("OUTBOX_CDC__OUTBOX__TABLE__X", "y")]).unwrap_err();
        assert!(e.to_string().contains("outbox.table"), "{e}");
    }

    #[test]
    fn env_values_keep_their_text_unless_the_key_is_numeric() {
        let c = parse(
            MINIMAL,
            &[
                ("OUTBOX_CDC__OUTBOX__DEAD_LETTER_TOPIC", "2024"),
                ("OUTBOX_CDC__KAFKA__SASL_PASSWORD", "0123"),
                ("OUTBOX_CDC__POSTGRES__CREATE_SLOT", "false"),
            ],
        )
        .unwrap();
        assert_eq!(c.outbox.dead_letter_topic, "2024");
        assert_eq!(c.kafka.get("sasl.password"), Some("0123"));
        assert!(!c.postgres.create_slot);
        let err = parse(
            MINIMAL,
            &[("OUTBOX_CDC__LIMITS__MAX_IN_FLIGHT_EVENTS", "many")],
        )
        .unwrap_err();
        assert_eq!(invalid_key(err), "limits.max_in_flight_events");
    }

    #[test]
    fn malformed_env_names_are_refused_with_the_variable() {
        let err = parse(MINIMAL, &[("OUTBOX_CDC__POSTGRES", "x")]).unwrap_err();
        assert!(
            matches!(&err, ConfigError::EnvKey { var, .. } if var == "OUTBOX_CDC__POSTGRES"),
            "{err}"
        );
    }

    #[test]
    fn unknown_keys_are_refused_naming_the_key() {
        let err = parse(&format!("{MINIMAL}\n[limits]\nmax_in_flight = 3\n"), &[]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("max_in_flight"), "{text}");
        assert!(matches!(err, ConfigError::Syntax { .. }));
    }

    #[test]
    fn bad_values_name_key_value_and_what_is_allowed() {
        assert_refused_naming_key(&[
            ("postgres.slot", "Bad-Slot"),
            ("limits.max_in_flight_events", "0"),
            ("limits.max_in_flight_bytes", "10"),
            ("http.listen", "localhost"),
            ("postgres.status_interval_ms", "5"),
            ("offsets.flush_interval_ms", "0"),
            ("audit.save_interval_ms", "0"),
            ("retry.initial_backoff_ms", "999999"),
            ("kafka.acks", "1"),
            ("outbox.topic", "bad topic {nope}"),
        ]);
        let err = parse(MINIMAL, &[("OUTBOX_CDC__POSTGRES__SLOT", "Bad-Slot")]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("Bad-Slot") && text.contains("a-z"), "{text}");
    }

    #[test]
    fn monitor_section_defaults_and_bounds() {
        let c = parse(MINIMAL, &[]).unwrap();
        assert_eq!(c.monitor.slot_poll_interval_ms, 5_000);
        assert_eq!(c.monitor.heartbeat_interval(), None);
        assert_eq!(c.monitor.heartbeat_prefix, "outbox-cdc-heartbeat");
        let on = parse(
            MINIMAL,
            &[("OUTBOX_CDC__MONITOR__HEARTBEAT_INTERVAL_MS", "1000")],
        )
        .unwrap();
        assert_eq!(
            on.monitor.heartbeat_interval(),
            Some(Duration::from_secs(1))
        );
        let cases: &[(&str, &str)] = &[
            ("OUTBOX_CDC__MONITOR__SLOT_POLL_INTERVAL_MS", "0"),
            ("OUTBOX_CDC__MONITOR__HEARTBEAT_INTERVAL_MS", "5"),
            ("OUTBOX_CDC__MONITOR__HEARTBEAT_PREFIX", ""),
        ];
        for (var, value) in cases {
            let err = parse(MINIMAL, &[(var, value)]).unwrap_err();
            assert!(invalid_key(err).starts_with("monitor."), "{var}={value}");
        }
        let same = MINIMAL.replace("[kafka]", "[outbox]\nmessage_prefix = \"hb\"\n[kafka]");
        let err = parse(&same, &[("OUTBOX_CDC__MONITOR__HEARTBEAT_PREFIX", "hb")]).unwrap_err();
        assert_eq!(invalid_key(err), "monitor.heartbeat_prefix");
    }

    #[test]
    fn topics_section_defaults_file_values_and_env_overrides() {
        let c = parse(MINIMAL, &[]).unwrap();
        assert!(!c.topics.create, "creating topics is opt-in");
        assert_eq!(c.topics.partitions, crate::sink::DEFAULT_PARTITIONS);
        assert_eq!(c.topics.partitions, 3);
        assert_eq!(c.topics.replication_factor, -1);
        assert!(c.topics.config.is_empty());

        let text = format!(
            "{MINIMAL}\n[topics]\ncreate = true\npartitions = 12\nreplication_factor = 3\n\
             [topics.config]\n\"retention.ms\" = 604800000\n\"cleanup.policy\" = \"delete\"\n"
        );
        let c = parse(&text, &[]).unwrap();
        assert!(c.topics.create);
        assert_eq!((c.topics.partitions, c.topics.replication_factor), (12, 3));
        assert_eq!(
            c.topics.config.get("retention.ms").map(String::as_str),
            Some("604800000"),
            "numbers are kept as the strings CreateTopics takes"
        );
        assert_eq!(
            c.topics.config.get("cleanup.policy").map(String::as_str),
            Some("delete")
        );

        let c = parse(
            &text,
            &[
                ("OUTBOX_CDC__TOPICS__CREATE", "false"),
                ("OUTBOX_CDC__TOPICS__PARTITIONS", "6"),
                ("OUTBOX_CDC__TOPICS__REPLICATION_FACTOR", "-1"),
                ("OUTBOX_CDC__TOPICS__CONFIG__RETENTION_MS", "1000"),
                ("OUTBOX_CDC__TOPICS__CONFIG__MIN_INSYNC_REPLICAS", "2"),
            ],
        )
        .unwrap();
        assert!(!c.topics.create);
        assert_eq!((c.topics.partitions, c.topics.replication_factor), (6, -1));
        assert_eq!(
            c.topics.config.get("retention.ms").map(String::as_str),
            Some("1000")
        );
        assert_eq!(
            c.topics
                .config
                .get("min.insync.replicas")
                .map(String::as_str),
            Some("2")
        );
        assert_eq!(
            c.topics.config.get("cleanup.policy").map(String::as_str),
            Some("delete"),
            "file values the environment does not name stay"
        );
        // No [topics] in the file: the environment alone creates the section.
        let c = parse(MINIMAL, &[("OUTBOX_CDC__TOPICS__CREATE", "true")]).unwrap();
        assert!(c.topics.create);
    }

    #[test]
    fn bad_topics_values_name_the_key() {
        assert_refused_naming_key(&[
            ("topics.partitions", "0"),
            ("topics.partitions", "-1"),
            ("topics.partitions", "three"),
            ("topics.replication_factor", "0"),
            ("topics.replication_factor", "-2"),
            ("topics.replication_factor", "40000"),
            ("topics.create", "yes"),
        ]);
        let err = parse(
            MINIMAL,
            &[("OUTBOX_CDC__TOPICS__CONFIG__RETENTION_MS", " ")],
        )
        .unwrap_err();
        assert_eq!(invalid_key(err), "topics.config.retention.ms");
        let err = parse(MINIMAL, &[("OUTBOX_CDC__TOPICS__PARTITIONS", "0")]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("at least 1"), "{text}");
        let err = parse(&format!("{MINIMAL}\n[topics]\npartition = 3\n"), &[]).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Syntax { message, .. } if message.contains("partition")),
            "{err}"
        );
    }

    #[test]
    fn missing_required_sections_are_named() {
        let err = parse("[postgres]\nurl = \"postgres://x@h/db\"\n", &[]).unwrap_err();
        assert!(err.to_string().contains("kafka"), "{err}");
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("postgres://outbox:secret@127.0.0.1:54329/app"),
            "postgres://outbox:***@127.0.0.1:54329/app"
        );
        assert_eq!(
            redact_url("host=h user=u password=secret"),
            "host=h user=u password=***"
        );
        let c = parse(MINIMAL, &[]).unwrap();
        assert!(!format!("{c:?}").contains("secret"));
    }

    /// A2: every form libpq takes a password in, URL or key=value, and
    /// strings that do not parse (shown in the primary_url error).
    #[test]
    fn redact_url_hides_every_password_form() {
        for url in [
            "postgres://u@h/db?password=hunter2",
            "postgres://u@h/db?sslmode=require&password=hunter2&application_name=x",
            "postgres://u@h/db?pass%77ord=hunter2",
            "postgres://u@h/db?PASSWORD=hunter2",
            "postgresql://u:hunter2%40ss@h/db",
            "postgres://u:hunter2@h1,h2:5433/db",
            "postgres://u:hunter2@[::1]:5432/db",
            "postgres://u:p@hunter2@h/db",
            "postgres://u:p?hunter2@h/db",
            "postgres://h/db?password=hunter2@x",
            "postgres://u@h/db?password=a?hunter2",
            "host=h user=u password = hunter2",
            "host=h user=u password= hunter2",
            "host=h password='a hunter2'",
            r"host=h password='a \' hunter2'",
            r"host=h password=a\ hunter2",
            "host=h PASSWORD=hunter2",
            "host=h\tpassword=hunter2",
            "host=h password='hunter2",
            "host=h password",
            "host=h password=hunter2 application_name='a://b@c'",
            "mysql://u:hunter2@h/db",
        ] {
            let shown = redact_url(url);
            assert!(!shown.contains("hunter2"), "{url} -> {shown}");
        }
        assert_eq!(
            redact_url("postgres://u@h/db?sslmode=require&password=x&application_name=a"),
            "postgres://u@h/db?sslmode=require&password=***&application_name=a"
        );
        assert_eq!(
            redact_url("host=h password = 'a b' user=u"),
            "host=h password=*** user=u"
        );
    }
}
