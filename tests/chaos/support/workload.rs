//! The writer: the application side of the outbox. Each transaction upserts
//! an order (the aggregate, whose row lock serialises its writers), adds 1 to
//! 3 order lines (the business changes) each with its outbox row, and commits
//! or (about 10%) rolls back. Some transactions touch only another table.
//!
//! Every writer keeps a ledger of what it meant and what it got back. A
//! COMMIT whose reply was lost (PostgreSQL restarting) is `Unknown` and is
//! resolved at the end by looking for its rows.

use std::time::Duration;

use outbox_cdc::pg::Lsn;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_postgres::Client;

use super::rng::Rng;
use super::schema::Names;

#[derive(Debug, Clone)]
pub struct Line {
    pub line_id: String,
    pub event_id: String,
    pub aggregate_sequence: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Committed,
    /// Rolled back on purpose.
    RolledBack,
    /// Failed before COMMIT was sent: nothing of it can exist.
    Failed(String),
    /// COMMIT was sent and its reply lost (or abandoned on purpose).
    Unknown(String),
}

#[derive(Debug, Clone)]
pub struct TxRecord {
    pub writer: usize,
    pub number: u64,
    pub aggregate_type: String,
    pub aggregate_id: String,
    /// Lines whose INSERTs returned before the outcome (all of them unless Failed).
    pub lines: Vec<Line>,
    pub outcome: Outcome,
    /// For a committed transaction: the WAL insert position read right after
    /// COMMIT returned, an upper bound of the commit record's end. A resend is
    /// only allowed if the transaction ended after the stored offset.
    pub ended_by: Option<Lsn>,
}

#[derive(Debug, Clone, Default)]
pub struct WriterStats {
    pub noise_txs: u64,
    pub reconnects: u64,
}

pub struct Workload {
    pub writers: usize,
    pub tx_per_sec: f64,
    pub aggregates: u64,
    /// With more than 0, one more writer whose transactions each add this
    /// many lines to one order in two statements (with a rolled-back
    /// savepoint of as many lines again in a fifth of them): transactions the
    /// server streams while in progress when its work memory is small
    /// (tests/chaos/large_transactions.rs).
    pub bulk_rows: u64,
}

pub type WriterHandle = JoinHandle<(Vec<TxRecord>, WriterStats)>;

/// The application_name of the writers' connections of run `base`.
pub fn application_name(base: &str) -> String {
    format!("chaos-writer-{base}")
}

pub fn spawn(
    workload: &Workload,
    names: &Names,
    rng: &mut Rng,
    stop: watch::Receiver<bool>,
    paused: watch::Receiver<bool>,
) -> Vec<WriterHandle> {
    let pause = Duration::from_secs_f64(workload.writers as f64 / workload.tx_per_sec.max(0.1));
    let bulk_writers = usize::from(workload.bulk_rows > 0);
    (0..workload.writers + bulk_writers)
        .map(|w| {
            let bulk = w >= workload.writers;
            let writer = Writer {
                id: w,
                rng: rng.fork(),
                outbox: names.outbox.clone(),
                orders: names.orders.clone(),
                lines: names.lines.clone(),
                noise: names.noise.clone(),
                application_name: application_name(&names.base),
                aggregates: workload.aggregates,
                pause: if bulk { BULK_PAUSE } else { pause },
                bulk_rows: if bulk { workload.bulk_rows } else { 0 },
            };
            tokio::spawn(writer.run(stop.clone(), paused.clone()))
        })
        .collect()
}

struct Writer {
    id: usize,
    rng: Rng,
    outbox: String,
    orders: String,
    lines: String,
    noise: String,
    application_name: String,
    aggregates: u64,
    pause: Duration,
    /// Lines per transaction of the bulk writer; 0 for the others.
    bulk_rows: u64,
}

/// The bulk writer's pause between its transactions.
const BULK_PAUSE: Duration = Duration::from_secs(2);
/// What a bulk transaction does before it ends: it stays open 1.5 s.
const BULK_HOLD: &str = "SELECT pg_sleep(1.5)";

/// Two aggregate types, so two topics.
pub const AGGREGATE_TYPES: [&str; 2] = ["order", "return"];

/// The aggregate type and id of aggregate `k`.
pub fn aggregate(k: u64) -> (&'static str, String) {
    let t = AGGREGATE_TYPES[usize::from(k.is_multiple_of(4))];
    (t, format!("{t}-{k}"))
}

impl Writer {
    async fn run(
        mut self,
        stop: watch::Receiver<bool>,
        paused: watch::Receiver<bool>,
    ) -> (Vec<TxRecord>, WriterStats) {
        let mut ledger = Vec::new();
        let mut stats = WriterStats::default();
        let mut client: Option<Client> = None;
        let mut number = 0u64;
        while !*stop.borrow() {
            if *paused.borrow() {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            let c = match client.take().filter(|c| !c.is_closed()) {
                Some(c) => c,
                None => match super::try_admin_client_named(&self.application_name).await {
                    Ok(c) => {
                        stats.reconnects += 1;
                        c
                    }
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                },
            };
            let mut c = c;
            number += 1;
            if self.rng.chance(0.08) {
                // Touches only a table outside the outbox: no event may come of it.
                let note = format!("w{} tx{number}", self.id);
                let _ = c
                    .execute(
                        &format!("INSERT INTO public.{} (note) VALUES ($1)", self.noise),
                        &[&note],
                    )
                    .await;
                stats.noise_txs += 1;
                client = Some(c);
            } else {
                let record = match self.bulk_rows {
                    0 => self.order_tx(&mut c, number).await,
                    rows => self.bulk_tx(&mut c, number, rows).await,
                };
                // After an abandoned COMMIT the connection is dropped, as a
                // crashed application's would be.
                if !matches!(record.outcome, Outcome::Unknown(_)) {
                    client = Some(c);
                }
                ledger.push(record);
            }
            let jitter = self.rng.range(50, 150) as f64 / 100.0;
            tokio::time::sleep(self.pause.mul_f64(jitter)).await;
        }
        (ledger, stats)
    }

    async fn order_tx(&mut self, client: &mut Client, number: u64) -> TxRecord {
        let k = self.rng.range(1, self.aggregates);
        let (aggregate_type, aggregate_id) = aggregate(k);
        let n_lines = self.rng.range(1, 3);
        let rollback = self.rng.chance(0.10);
        let planned: Vec<(String, String, i32)> = (0..n_lines)
            .map(|i| {
                (
                    format!("w{}-t{number}-l{i}", self.id),
                    format!("sku-{}", self.rng.range(1, 50)),
                    self.rng.range(1, 9) as i32,
                )
            })
            .collect();
        let (tx, mut record) = match self.open_order(client, number, k).await {
            Ok(opened) => opened,
            Err(failed) => return failed,
        };
        let insert_line = format!(
            "INSERT INTO public.{} (line_id, order_id, sku, qty) VALUES ($1, $2, $3, $4)",
            self.lines
        );
        let insert_event = format!(
            "INSERT INTO public.{ob} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
             VALUES (gen_random_uuid(), $1, $2,
                     (SELECT coalesce(max(aggregate_sequence), 0) + 1 FROM public.{ob}
                       WHERE aggregate_type = $1 AND aggregate_id = $2),
                     'OrderLineAdded',
                     jsonb_build_object('line_id', $3::text, 'order_id', $2::text, 'sku', $4::text, 'qty', $5::int))
             RETURNING event_id::text, aggregate_sequence",
            ob = self.outbox
        );
        for (line_id, sku, qty) in &planned {
            // Application think time: a restart may catch the transaction open.
            tokio::time::sleep(self.rng.millis(0, 4)).await;
            if let Err(e) = tx
                .execute(&insert_line, &[line_id, &aggregate_id, sku, qty])
                .await
            {
                record.outcome = Outcome::Failed(e.to_string());
                return record;
            }
            match tx
                .query_one(
                    &insert_event,
                    &[&aggregate_type, &aggregate_id, line_id, sku, qty],
                )
                .await
            {
                Ok(row) => record.lines.push(Line {
                    line_id: line_id.clone(),
                    event_id: row.get(0),
                    aggregate_sequence: row.get(1),
                }),
                Err(e) => {
                    record.outcome = Outcome::Failed(e.to_string());
                    return record;
                }
            }
        }
        let outcome = self.end(tx, rollback).await;
        Self::ended(client, record, outcome).await
    }

    /// Rolls back or commits `tx` (a few COMMIT replies abandoned).
    async fn end(&mut self, tx: tokio_postgres::Transaction<'_>, rollback: bool) -> Outcome {
        if rollback {
            // Whether or not the reply arrives, nothing of it was committed.
            let _ = tx.rollback().await;
            Outcome::RolledBack
        } else if self.rng.chance(0.02) {
            // The application dies right after sending COMMIT: it cannot know
            // the outcome and must find out by looking (resolved at the end).
            match tokio::time::timeout(Duration::from_micros(1), tx.commit()).await {
                Ok(Ok(())) => Outcome::Committed,
                Ok(Err(e)) => Outcome::Unknown(e.to_string()),
                Err(_) => Outcome::Unknown("COMMIT sent, reply abandoned".into()),
            }
        } else {
            match tx.commit().await {
                Ok(()) => Outcome::Committed,
                Err(e) => Outcome::Unknown(e.to_string()),
            }
        }
    }

    /// `record` ended with `outcome`; a committed one learns its `ended_by`.
    async fn ended(client: &Client, mut record: TxRecord, outcome: Outcome) -> TxRecord {
        record.outcome = outcome;
        if matches!(record.outcome, Outcome::Committed) {
            record.ended_by = client
                .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
                .await
                .ok()
                .and_then(|row| row.get::<_, String>(0).parse().ok());
        }
        record
    }

    /// The ledger entry of transaction `number` on aggregate `k`, with the
    /// transaction opened and the order row upserted; `Err`: the entry,
    /// failed. The upsert locks the order row until the end of the
    /// transaction: the next writer of this aggregate waits, then sees this
    /// one's sequence.
    async fn open_order<'c>(
        &self,
        client: &'c mut Client,
        number: u64,
        k: u64,
    ) -> Result<(tokio_postgres::Transaction<'c>, TxRecord), TxRecord> {
        let (aggregate_type, aggregate_id) = aggregate(k);
        let mut record = TxRecord {
            writer: self.id,
            number,
            aggregate_type: aggregate_type.to_owned(),
            aggregate_id: aggregate_id.clone(),
            lines: Vec::new(),
            outcome: Outcome::Failed(String::new()),
            ended_by: None,
        };
        let upsert = format!(
            "INSERT INTO public.{o} (order_id, customer) VALUES ($1, $2)
             ON CONFLICT (order_id) DO UPDATE SET changes = {o}.changes + 1",
            o = self.orders
        );
        let opened = async {
            let tx = client.transaction().await?;
            tx.execute(&upsert, &[&aggregate_id, &format!("customer-{k}")])
                .await?;
            Ok::<_, tokio_postgres::Error>(tx)
        };
        match opened.await {
            Ok(tx) => Ok((tx, record)),
            Err(e) => {
                record.outcome = Outcome::Failed(e.to_string());
                Err(record)
            }
        }
    }

    /// One large transaction: the order upserted, then `rows` lines with
    /// their outbox rows added in one statement each, twice; in a fifth of
    /// them `rows` more inside a savepoint that is rolled back in between.
    async fn bulk_tx(&mut self, client: &mut Client, number: u64, rows: u64) -> TxRecord {
        let k = self.rng.range(1, self.aggregates);
        let (aggregate_type, aggregate_id) = aggregate(k);
        let rollback = self.rng.chance(0.10);
        let savepoint = self.rng.chance(0.20);
        let (tx, mut record) = match self.open_order(client, number, k).await {
            Ok(opened) => opened,
            Err(failed) => return failed,
        };
        // Lines `from..to` and their outbox rows, numbered after the
        // aggregate's last row, in line order.
        let lines = format!(
            "INSERT INTO public.{l} (line_id, order_id, sku, qty)
             SELECT $1 || i, $2, 'sku-' || (i % 50), 1 + i % 9 FROM generate_series($3::int, $4::int) AS i",
            l = self.lines
        );
        let events = format!(
            "INSERT INTO public.{ob} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
             SELECT gen_random_uuid(), $5, $2, last.n + i - $3 + 1, 'OrderLineAdded',
                    jsonb_build_object('line_id', $1 || i, 'order_id', $2::text, 'sku', 'sku-' || (i % 50), 'qty', 1 + i % 9)
             FROM generate_series($3::int, $4::int) AS i,
                  (SELECT coalesce(max(aggregate_sequence), 0) AS n FROM public.{ob}
                    WHERE aggregate_type = $5 AND aggregate_id = $2) AS last
             ORDER BY i
             RETURNING event_id::text, aggregate_sequence, payload->>'line_id'",
            ob = self.outbox
        );
        let prefix = format!("w{}-t{number}-l", self.id);
        let rows = rows as i32;
        let steps: Vec<(i32, bool)> = match savepoint {
            true => vec![(0, true), (rows, false), (2 * rows, true)],
            false => vec![(0, true), (2 * rows, true)],
        };
        for (from, kept) in steps {
            let to = from + rows - 1;
            let run = async {
                if !kept {
                    tx.batch_execute("SAVEPOINT bulk").await?;
                }
                tx.execute(&lines, &[&prefix, &aggregate_id, &from, &to])
                    .await?;
                let added = tx
                    .query(
                        &events,
                        &[&prefix, &aggregate_id, &from, &to, &aggregate_type],
                    )
                    .await?;
                if !kept {
                    tx.batch_execute("ROLLBACK TO SAVEPOINT bulk").await?;
                }
                Ok::<_, tokio_postgres::Error>(added)
            };
            match run.await {
                Ok(added) if kept => {
                    let mut added: Vec<Line> = added
                        .iter()
                        .map(|row| Line {
                            event_id: row.get(0),
                            aggregate_sequence: row.get(1),
                            line_id: row.get(2),
                        })
                        .collect();
                    added.sort_by_key(|l| l.aggregate_sequence);
                    record.lines.extend(added);
                }
                Ok(_) => {}
                Err(e) => {
                    record.outcome = Outcome::Failed(e.to_string());
                    return record;
                }
            }
        }
        // Open a while longer, its streamed part in the connector's spill:
        // a connector death now finds a spill file (large_transactions.rs
        // requires some).
        if let Err(e) = tx.batch_execute(BULK_HOLD).await {
            record.outcome = Outcome::Failed(e.to_string());
            return record;
        }
        let outcome = self.end(tx, rollback).await;
        Self::ended(client, record, outcome).await
    }
}
