//! A writer committing outbox events the way an application does, one
//! single-row INSERT per transaction, over the aggregates `<tag>0` to
//! `<tag>4` (each row numbered after the aggregate's last), until finished:
//! the rows that commit while the connector is down, repairs or prunes.

use std::sync::Arc;
use std::time::Duration;

/// What a writer committed, and the longest any of its inserts took.
pub struct Written {
    pub ids: Vec<String>,
    pub slowest: Duration,
}

/// A writer committing one event per transaction (a single-row INSERT, as an
/// application does) until finished, timing each INSERT.
pub struct Writer {
    stop: tokio::sync::watch::Sender<bool>,
    handle: tokio::task::JoinHandle<Written>,
    /// When the INSERT in flight started; `None` between inserts.
    inserting_since: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
}

impl Writer {
    /// Panics when the INSERT in flight has waited longer than `bound`.
    pub fn assert_no_insert_waits_longer_than(&self, bound: Duration) {
        let since = *self.inserting_since.lock().expect("writer state");
        if let Some(waited) = since.map(|s| s.elapsed()).filter(|w| *w > bound) {
            panic!("an application insert has been waiting for {waited:?} (bound {bound:?})");
        }
    }

    /// Waits `how_long`, checking the INSERT in flight against `bound`.
    pub async fn watch(&self, how_long: Duration, bound: Duration) {
        let until = std::time::Instant::now() + how_long;
        while std::time::Instant::now() < until {
            self.assert_no_insert_waits_longer_than(bound);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops the writer after the INSERT in flight; what it committed.
    pub async fn finish(self) -> Written {
        self.stop.send(true).expect("stop the writer");
        self.handle.await.expect("writer")
    }
}

/// Starts a writer on `public.<table>` (the fixture's outbox table), on a
/// superuser connection of its own; an INSERT that fails panics the writer.
pub fn spawn_writer(table: String, tag: &'static str) -> Writer {
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let inserting_since = Arc::new(std::sync::Mutex::new(None));
    let since = inserting_since.clone();
    let handle = tokio::spawn(async move {
        let client = super::admin_client().await;
        let mut ids = Vec::new();
        let mut slowest = Duration::ZERO;
        let mut i = 0u64;
        while !*stopped.borrow_and_update() {
            let agg = format!("{tag}{}", i % 5);
            let started = std::time::Instant::now();
            *since.lock().expect("writer state") = Some(started);
            let row = client
                .query_one(
                    &format!(
                        "INSERT INTO public.{table} (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
                         VALUES (gen_random_uuid(), 'order', $1,
                                 (SELECT coalesce(max(aggregate_sequence), 0) + 1 FROM public.{table}
                                   WHERE aggregate_type = 'order' AND aggregate_id = $1),
                                 'Written', jsonb_build_object('i', $2::int8))
                         RETURNING event_id::text"
                    ),
                    &[&agg, &(i as i64)],
                )
                .await
                .expect("writer insert");
            *since.lock().expect("writer state") = None;
            slowest = slowest.max(started.elapsed());
            ids.push(row.get(0));
            i += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Written { ids, slowest }
    });
    Writer {
        stop,
        handle,
        inserting_since,
    }
}
