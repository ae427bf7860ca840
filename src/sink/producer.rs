//! The one Kafka producer and its delivery reports.
//!
//! Records enter librdkafka in the order [`KafkaSink::send`] is called; with
//! the idempotent producer, librdkafka keeps that order per partition across
//! retries. Delivery reports arrive on an unbounded channel, from the thread
//! that sends (served after each send) or from the producer's polling thread
//! (when nothing is sent), at most one per record that entered it. The
//! channel is bounded in practice by the pipeline: it admits at most its
//! in-flight limit of records before it waits for reports, so the channel
//! never holds more reports than that limit. Reports may arrive in any order
//! relative to each other; the ack tracker orders them.
//!
//! Before the first record to a topic, `send` makes sure the topic exists
//! (see `topics.rs`); a missing topic is a refused record, never a retry.

use std::ffi::{CStr, c_char};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rdkafka::bindings::rd_kafka_fatal_error;
use rdkafka::client::ClientContext;
use rdkafka::config::FromClientConfigAndContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, DeliveryResult, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::{RDKafka, RDKafkaErrorCode, RDKafkaRespErr};
use tokio::sync::mpsc;

use super::error::SinkError;
use super::settings::{KafkaSettings, creation_error};
use super::topics::{MissingTopicHint, TopicSettings, Topics};
use crate::outbox::OutboxEvent;

/// How long `send` waits before offering a record again when librdkafka's
/// queue is full (`queue.buffering.max.messages`/`.kbytes`): a full queue
/// means "slow down", never "fail".
const QUEUE_FULL_BACKOFF: Duration = Duration::from_millis(1);

/// How long `send` waits for room in librdkafka's queue before it gives up
/// with a retryable error, so a session stuck behind a full queue ends (and a
/// shutdown is heard) instead of waiting forever. With
/// `queue.buffering.max.messages` at least `limits.max_in_flight_events`
/// (checked when the configuration is loaded) the pipeline never fills it.
const QUEUE_FULL_LIMIT: Duration = Duration::from_secs(30);

/// A record that Kafka acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivered {
    pub partition: i32,
    pub offset: i64,
}

/// The outcome of one record, carrying the token given to [`KafkaSink::send`].
#[derive(Debug)]
pub struct DeliveryReport<T> {
    pub token: T,
    pub result: Result<Delivered, SinkError>,
    /// When librdkafka reported it (for `outbox_cdc_stage_seconds`).
    pub reported_at: std::time::Instant,
}

/// Carries the caller's token through librdkafka's opaque pointer.
///
/// It exposes its content only by value (`into_inner`), never by reference,
/// so sharing a `&Carried<T>` between threads gives access to nothing: it is
/// `Sync` whenever `T` is `Send` (the same reasoning as `std::sync::Exclusive`).
pub(super) struct Carried<T>(T);

// SAFETY: no method takes `&self`, so a shared reference cannot reach `T`.
unsafe impl<T: Send> Sync for Carried<T> {}

impl<T> Carried<T> {
    fn into_inner(self) -> T {
        self.0
    }
}

/// `None`: a record of the sink's own (a transaction marker), whose
/// outcome is the transaction's.
pub(super) type Opaque<T> = Box<Carried<Option<T>>>;

/// The caller's token out of a record librdkafka refused to take.
fn take_token<T: Send>(record: BaseRecord<'_, [u8], [u8], Opaque<T>>) -> Option<T> {
    record.delivery_opaque.into_inner()
}

/// The client handle, used only to ask librdkafka whether the producer has
/// hit a fatal error: the error event carries the underlying code (e.g.
/// `ProducerFenced`), not whether it was fatal, and records purged because of
/// a fatal error report only `PurgeQueue`.
pub(super) struct FatalProbe(*mut RDKafka);

// SAFETY: librdkafka handles may be used from any thread, and
// `rd_kafka_fatal_error` takes the handle's own lock.
unsafe impl Send for FatalProbe {}
unsafe impl Sync for FatalProbe {}

impl FatalProbe {
    /// The fatal error raised on this client, if any.
    ///
    /// Only called from the context's callbacks. librdkafka runs those only
    /// inside `poll`/`flush` on the producer, which borrow the live client;
    /// the client is destroyed after its polling thread has stopped and its
    /// final flush in `Drop` has returned, so the handle is valid here.
    fn fatal_error(&self) -> Option<(RDKafkaErrorCode, String)> {
        let mut buf = [0 as c_char; 512];
        // SAFETY: see above for the handle; `buf` is writable for `buf.len()`
        // bytes and librdkafka NUL-terminates what it writes into it.
        let code = unsafe { rd_kafka_fatal_error(self.0, buf.as_mut_ptr(), buf.len()) };
        if code == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
            return None;
        }
        // SAFETY: `buf` was zeroed and librdkafka writes a NUL-terminated string.
        let reason = unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Some((code.into(), reason))
    }
}

/// Receives librdkafka's callbacks, on the polling thread or the sending one.
pub(super) struct SinkContext<T> {
    reports: mpsc::UnboundedSender<DeliveryReport<T>>,
    /// Set once, right after the client is created (before any record).
    probe: OnceLock<FatalProbe>,
    /// Names the fix when a report says the topic is unknown.
    missing: MissingTopicHint,
}

impl<T> SinkContext<T> {
    fn fatal_error(&self) -> Option<(RDKafkaErrorCode, String)> {
        self.probe.get().and_then(FatalProbe::fatal_error)
    }
}

impl<T: Send + 'static> ClientContext for SinkContext<T> {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        super::client_log::log(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        match self.fatal_error() {
            Some((code, fatal_reason)) => tracing::error!(
                code = ?code,
                reason = %fatal_reason,
                "fatal Kafka producer error: the producer must be recreated"
            ),
            None => {
                tracing::warn!(code = ?error.rdkafka_error_code(), %reason, "Kafka client error")
            }
        }
    }
}

impl<T: Send + 'static> ProducerContext for SinkContext<T> {
    type DeliveryOpaque = Opaque<T>;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: Opaque<T>) {
        let Some(token) = opaque.into_inner() else {
            // A marker: a failure fails its transaction's commit.
            if let Err((err, _)) = result {
                tracing::warn!(error = %err, "a transaction marker was not delivered");
            }
            return;
        };
        let result = match result {
            Ok(msg) => Ok(Delivered {
                partition: msg.partition(),
                offset: msg.offset(),
            }),
            Err((err, msg)) => Err(self.delivery_error(err, msg)),
        };
        // A closed channel means the pipeline is gone; the record stays
        // unacknowledged and is produced again after a restart.
        let _ = self.reports.send(DeliveryReport {
            token,
            result,
            reported_at: std::time::Instant::now(),
        });
    }
}

impl<T> SinkContext<T> {
    fn delivery_error(&self, err: &KafkaError, msg: &BorrowedMessage<'_>) -> SinkError {
        let code = err.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail);
        let topic = msg.topic().to_owned();
        let event_id = event_id_of(msg);
        match self.fatal_error() {
            Some((_, reason)) => SinkError::Fatal {
                code,
                reason,
                topic: Some(topic),
                event_id,
            },
            None if is_unknown_topic(code) => {
                self.missing.unknown_while_producing(&topic, code, event_id)
            }
            None => SinkError::Delivery {
                code,
                topic,
                event_id,
            },
        }
    }
}

/// Kafka (or librdkafka's metadata) says the topic does not exist. A
/// record's partition that vanished (`UnknownPartition`, librdkafka's local
/// code) means the same: Kafka never removes partitions of a live topic.
fn is_unknown_topic(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::UnknownTopicOrPartition
            | RDKafkaErrorCode::UnknownTopic
            | RDKafkaErrorCode::UnknownPartition
    )
}

/// The `event_id` header of a failed record (read only on the failure path).
fn event_id_of(msg: &BorrowedMessage<'_>) -> Option<String> {
    let headers = msg.headers()?;
    headers
        .iter()
        .find(|h| h.key == "event_id")
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The relay's Kafka producer: one idempotent librdkafka producer with a
/// polling thread that turns delivery callbacks into [`DeliveryReport`]s.
///
/// `T` is an opaque token (the pipeline passes checkpoint tokens) returned
/// with each record's report.
///
/// Dropping the sink purges records still in flight (their reports, if the
/// receiver is alive, carry `PurgeQueue`/`PurgeInflight`); call
/// [`flush`](KafkaSink::flush) first for a clean shutdown.
pub struct KafkaSink<T: Send + 'static> {
    pub(super) producer: ThreadedProducer<SinkContext<T>>,
    pub(super) topics: Topics,
    queue_full_waits: AtomicU64,
}

/// What [`KafkaSink::new`] and [`KafkaSink::with_topics`] return.
pub type NewSink<T> = (KafkaSink<T>, mpsc::UnboundedReceiver<DeliveryReport<T>>);

impl<T: Send + 'static> KafkaSink<T> {
    /// Creates the producer with the default `[topics]` settings (a missing
    /// topic is refused, never created). Reports for every record that enters
    /// it arrive on the returned receiver.
    pub fn new(settings: &KafkaSettings) -> Result<NewSink<T>, SinkError> {
        KafkaSink::with_topics(settings, &TopicSettings::default())
    }

    /// Creates the producer; `topics` says what to do with a missing topic.
    pub fn with_topics(
        settings: &KafkaSettings,
        topics: &TopicSettings,
    ) -> Result<NewSink<T>, SinkError> {
        KafkaSink::create(settings, topics, None)
    }

    /// `transactional`: the transactional id and `transaction.timeout.ms`
    /// of an exactly-once producer (see `transactional.rs`).
    pub(super) fn create(
        settings: &KafkaSettings,
        topics: &TopicSettings,
        transactional: Option<(&str, Duration)>,
    ) -> Result<NewSink<T>, SinkError> {
        let mut config = settings.client_config()?;
        if let Some((id, timeout)) = transactional {
            // librdkafka requires message.timeout.ms <= transaction.timeout.ms:
            // a record that cannot be delivered fails its transaction, which
            // is aborted and replayed whole (DESIGN.md §14).
            let timeout = timeout.as_millis().to_string();
            config
                .set("transactional.id", id)
                .set("transaction.timeout.ms", &timeout)
                .set("message.timeout.ms", &timeout);
        }
        let topics = Topics::new(settings, topics)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let context = SinkContext {
            reports: tx,
            probe: OnceLock::new(),
            missing: topics.hint().clone(),
        };
        let producer: ThreadedProducer<SinkContext<T>> =
            ThreadedProducer::from_config_and_context(&config, context).map_err(creation_error)?;
        let client = producer.client();
        let _ = client.context().probe.set(FatalProbe(client.native_ptr()));
        Ok((
            KafkaSink {
                producer,
                topics,
                queue_full_waits: AtomicU64::new(0),
            },
            rx,
        ))
    }

    /// Hands one record to the producer. `Ok` means it is queued and its
    /// report (with `token`) will arrive on the channel; `Err` means it never
    /// entered the producer (no report will come; the token is dropped).
    ///
    /// Records enter the producer in the order of `send` calls: call it from
    /// one task and await each call before the next. When librdkafka's queue
    /// is full this waits and offers the record again.
    ///
    /// The first record to a topic waits for the topic check (and creation,
    /// when configured); a missing topic is [`SinkError::TopicMissing`].
    pub async fn send(&self, event: &OutboxEvent, token: T) -> Result<(), SinkError> {
        self.send_or_return(event, token).await.map_err(|(e, _)| e)
    }

    /// [`send`](Self::send), giving the token back when the record was not
    /// handed to librdkafka (the caller still owns what it carried; always
    /// `Some` for a token given here).
    pub async fn send_or_return(
        &self,
        event: &OutboxEvent,
        token: T,
    ) -> Result<(), (SinkError, Option<T>)> {
        if !self.topics.is_known(&event.topic)
            && let Err(e) = self.topics.ensure(&event.topic, &event.event_id).await
        {
            return Err((e, Some(token)));
        }
        self.send_record(event, Some(token)).await
    }

    /// Hands one record to librdkafka (waiting while its queue is full);
    /// `token` (`None` for a transaction marker) comes back when it did not
    /// enter.
    pub(super) async fn send_record(
        &self,
        event: &OutboxEvent,
        token: Option<T>,
    ) -> Result<(), (SinkError, Option<T>)> {
        let mut headers = OwnedHeaders::new_with_capacity(event.headers.len());
        for (key, value) in &event.headers {
            headers = headers.insert(Header {
                key: key.as_ref(),
                value: Some(value.as_ref()),
            });
        }
        let opaque: Opaque<T> = Box::new(Carried(token));
        let mut record = BaseRecord::with_opaque_to(&event.topic, opaque)
            .key(event.key.as_ref())
            .payload(event.payload.as_ref())
            .timestamp(event.timestamp_ms)
            .headers(headers);
        if let Some(partition) = event.partition {
            record = record.partition(partition);
        }
        let mut full_since: Option<std::time::Instant> = None;
        loop {
            match self.producer.send(record) {
                Ok(()) => {
                    // Serve delivery reports waiting here, on the sending
                    // thread, besides the polling thread: librdkafka then
                    // frees each delivered record (its headers: one
                    // allocation each) on the thread that allocated it,
                    // instead of both threads contending for one malloc
                    // arena (30 % of the producer's CPU measured with
                    // examples/produce_floor.rs). Reports may now reach the
                    // channel from either thread, so in either order; the
                    // ack tracker does not depend on their order.
                    self.producer.poll(Duration::ZERO);
                    return Ok(());
                }
                Err((err @ KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    let since = *full_since.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() >= QUEUE_FULL_LIMIT {
                        return Err((self.produce_error(&err, event), take_token(back)));
                    }
                    record = back;
                    self.queue_full_waits.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(QUEUE_FULL_BACKOFF).await;
                }
                Err((err, back)) => {
                    return Err((self.produce_error(&err, event), take_token(back)));
                }
            }
        }
    }

    fn produce_error(&self, err: &KafkaError, event: &OutboxEvent) -> SinkError {
        let code = err.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail);
        if code == RDKafkaErrorCode::Fatal
            && let Some(fatal) = self.fatal_error()
        {
            return match fatal {
                SinkError::Fatal { code, reason, .. } => SinkError::Fatal {
                    code,
                    reason,
                    topic: Some(event.topic.clone()),
                    event_id: Some(event.event_id.clone()),
                },
                other => other,
            };
        }
        if is_unknown_topic(code) {
            return self.topics.hint().unknown_while_producing(
                &event.topic,
                code,
                Some(event.event_id.clone()),
            );
        }
        SinkError::from_produce(err, &event.topic, &event.event_id)
    }

    /// Waits until every record in the producer is acknowledged or failed
    /// (their reports are then on the channel), or until `timeout`.
    ///
    /// This blocks the calling thread: from async code call it through
    /// `tokio::task::spawn_blocking` (e.g. with the sink in an `Arc`).
    pub fn flush(&self, timeout: Duration) -> Result<(), SinkError> {
        match self.producer.flush(timeout) {
            Ok(()) => Ok(()),
            Err(err) => {
                if let Some(fatal) = self.fatal_error() {
                    return Err(fatal);
                }
                Err(SinkError::Flush {
                    code: err
                        .rdkafka_error_code()
                        .unwrap_or(RDKafkaErrorCode::OperationTimedOut),
                    in_flight: self.in_flight(),
                })
            }
        }
    }

    /// Records handed to librdkafka and not yet released by it. A record is
    /// released just after its report is sent, so right after the last report
    /// this may still count it for a moment; `flush` waits for zero.
    pub fn in_flight(&self) -> i32 {
        self.producer.in_flight_count()
    }

    /// The fatal error that broke this producer, if any (it must then be recreated).
    pub fn fatal_error(&self) -> Option<SinkError> {
        self.producer
            .client()
            .fatal_error()
            .map(|(code, reason)| SinkError::Fatal {
                code,
                reason,
                topic: None,
                event_id: None,
            })
    }

    /// How many times `send` waited because librdkafka's queue was full.
    pub fn queue_full_waits(&self) -> u64 {
        self.queue_full_waits.load(Ordering::Relaxed)
    }

    #[cfg(test)]
    pub(super) fn producer(&self) -> &ThreadedProducer<SinkContext<T>> {
        &self.producer
    }
}
