//! The chaos run: set-up, kill/restart cycles with outages, drain, verdict.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use outbox_cdc::checkpoint::OffsetStore;
use outbox_cdc::pg::Lsn;
use tokio::sync::watch;

use super::infra::Infra;
use super::procs::{
    CONNECTOR_SHUTDOWN_FAILPOINT, CONSUMER_FAILPOINTS, Death, Kind, Launcher, Plan, Proc,
    connector_failpoints, tail,
};
use super::rng::Rng;
use super::schema::{Names, work_dir};
use super::verify::{
    DbState, Delivery, KafkaReader, Tp, Verdict, Window, offsets_advanced, verify,
};
use super::workload::{self, TxRecord, Workload};
use super::{Admin, admin_client, kafka_bootstrap, unique_name};

/// Knobs, from the environment.
pub struct Options {
    /// Kill/restart cycles (process deaths), `OUTBOX_CDC_SOAK_CYCLES`, default 50.
    pub cycles: u64,
    /// `OUTBOX_CDC_CHAOS_SEED`; printed, so a failing run can be replayed.
    pub seed: u64,
    pub workload: Workload,
    /// The outbox is a hash-partitioned table published by leaf names
    /// (`OUTBOX_CDC_CHAOS_PARTITIONED=1`; tests/chaos/partitioned.rs).
    pub partitioned: bool,
    /// `OUTBOX_CDC_CHAOS_EVERY_FAILPOINT=0`: a run too short to reach every
    /// failpoint (the version matrix's 10-cycle runs of scripts/test.sh) passes
    /// with at least one fired; the Kafka outage, the PostgreSQL restart and
    /// the invariants are still required. Default 1: every failpoint must fire.
    pub every_failpoint: bool,
    /// `OUTBOX_CDC_CHAOS_MODE=exactly-once` (default `at-least-once`): the
    /// connector runs with `[delivery] mode = "exactly-once"`, its two
    /// transaction failpoints are planned and required too, the slot is never
    /// lost (`outbox-cdc repair` stays at-least-once by design), and the
    /// verdict allows no duplicate at all (tests/chaos/exactly_once.rs).
    pub exactly_once: bool,
    /// The connector's decoding runs with logical_decoding_work_mem = 64kB,
    /// so that large transactions are streamed (tests/chaos/large_transactions.rs).
    pub small_work_mem: bool,
    /// The connector skips every n-th decoded outbox insert, as an unknown
    /// cause would (`OUTBOX_CDC_SABOTAGE=drop-insert-every:n`): the live
    /// witness must publish each from the table (tests/chaos/witness.rs).
    pub drop_every: Option<u64>,
}

pub fn env_num<T: std::str::FromStr>(var: &str, default: T) -> T {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{var}={v:?} is not a valid number")),
        _ => default,
    }
}

/// `OUTBOX_CDC_CHAOS_MODE`: whether the run is exactly-once.
fn exactly_once_from_env() -> bool {
    const VAR: &str = "OUTBOX_CDC_CHAOS_MODE";
    match std::env::var(VAR) {
        Err(std::env::VarError::NotPresent) => false,
        Ok(v) => match v.trim() {
            "" | "at-least-once" => false,
            "exactly-once" => true,
            other => panic!(
                "{VAR}={other:?} is not a delivery mode: use at-least-once (the default) or exactly-once"
            ),
        },
        Err(e) => panic!("{VAR}: {e}"),
    }
}

impl Options {
    pub fn from_env() -> Options {
        Options::from_env_with_cycles(50)
    }

    /// As [`Options::from_env`], with `default_cycles` when
    /// `OUTBOX_CDC_SOAK_CYCLES` is not set.
    pub fn from_env_with_cycles(default_cycles: u64) -> Options {
        let time_seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Options {
            cycles: env_num("OUTBOX_CDC_SOAK_CYCLES", default_cycles),
            seed: env_num("OUTBOX_CDC_CHAOS_SEED", time_seed),
            workload: Workload {
                writers: env_num("OUTBOX_CDC_CHAOS_WRITERS", 2),
                tx_per_sec: env_num("OUTBOX_CDC_CHAOS_TX_PER_SEC", 25.0),
                aggregates: env_num("OUTBOX_CDC_CHAOS_AGGREGATES", 300),
                bulk_rows: 0,
            },
            partitioned: env_num("OUTBOX_CDC_CHAOS_PARTITIONED", 0u8) == 1,
            every_failpoint: env_num("OUTBOX_CDC_CHAOS_EVERY_FAILPOINT", 1u8) != 0,
            exactly_once: exactly_once_from_env(),
            small_work_mem: false,
            drop_every: None,
        }
    }

    fn delivery(&self) -> Delivery {
        if self.exactly_once {
            Delivery::ExactlyOnce
        } else {
            Delivery::AtLeastOnce
        }
    }
}

/// What happened during the run (besides the verdict).
#[derive(Default)]
struct Tally {
    cycles: u64,
    deaths: BTreeMap<String, u64>,
    failpoint_hits: BTreeMap<String, u64>,
    missed_failpoints: u64,
    kafka_outages: u32,
    pg_restarts: u32,
    /// Slots dropped behind the connector's back and repaired.
    slot_repairs: u32,
    /// Writer connections cut mid-work (pg_terminate_backend).
    writer_kills: u64,
    /// Offset store and slot after each connector death.
    offset_violations: Vec<String>,
    last_stored: Option<Lsn>,
    /// The stored offset read after each connector death, in order.
    stored_history: Vec<Lsn>,
    /// The slot's confirmed position at the first connector death.
    first_confirmed: Option<Lsn>,
    /// Partition ends around each crash/outage: the in-flight windows, in
    /// the order they began.
    windows: Vec<Window>,
    /// The last connector death's window, open until just before anything
    /// else can append to the topics (the next connector, a repair, an
    /// outage): requests the dead process had on the wire may still land.
    pending: Option<(Window, Instant)>,
    /// Connector deaths that left a streamed, uncommitted transaction in the
    /// spill directory (`<offsets>/spill/<xid>.spill`).
    deaths_with_spill: u64,
    /// The most `pg_stat_replication_slots.stream_txns` seen for the slot at
    /// a connector death (14+; the count restarts with the slot).
    streamed_txns_seen: i64,
}

/// How long after a connector's death its window stays open at least: a
/// produce request it had sent may be appended after it died (the broker
/// still reads it from the closed connection). Nothing else appends meanwhile.
const LATE_APPENDS: Duration = Duration::from_millis(500);

impl Tally {
    /// `stored`: the connector's acknowledged offset when the window began:
    /// stored at its death, or read at an outage's start. `republished`: the
    /// events a gap repair in this window published again by its own rule.
    fn add_window(
        &mut self,
        what: String,
        before: Result<BTreeMap<Tp, i64>, String>,
        after: Result<BTreeMap<Tp, i64>, String>,
        stored: Option<Lsn>,
        republished: HashSet<String>,
    ) {
        debug_assert!(self.pending.is_none(), "windows are added in order");
        match (before, after) {
            (Ok(before), Ok(after)) => self.windows.push(Window {
                what,
                before,
                after,
                stored,
                republished,
            }),
            (before, after) => eprintln!(
                "chaos: partition ends around {what} not readable ({:?}, {:?}): its duplicates count as unexplained",
                before.err(),
                after.err()
            ),
        }
    }

    /// Closes the pending death window (see `pending`): its end is read now,
    /// at least [`LATE_APPENDS`] after the death.
    async fn close_pending(&mut self, reader: &KafkaReader) {
        let Some((mut window, died)) = self.pending.take() else {
            return;
        };
        if let Some(rest) = LATE_APPENDS.checked_sub(died.elapsed()) {
            tokio::time::sleep(rest).await;
        }
        match reader.watermarks(Duration::from_secs(5)) {
            Ok(after) => {
                window.after = after;
                self.windows.push(window);
            }
            Err(e) => eprintln!(
                "chaos: partition ends after {} not readable ({e}): its duplicates count as unexplained",
                window.what
            ),
        }
    }
}

/// One plan per start; the first starts of each kind walk through every
/// failpoint (`points`: the slot's) and stop mode once; after that a
/// failpoint of this kind that has not fired yet (its process died another
/// way first: the connector's shutdown point too) is planned again, with a
/// small hit count, and otherwise plans are drawn at random.
///
/// Modes, in walking order: the connector's failpoints, then SIGTERM in
/// shutdown, kill -9, SIGTERM; the consumer's failpoints, then kill -9, SIGTERM.
fn next_plan(
    kind: Kind,
    points: &[&'static str],
    start: u32,
    fired: &BTreeMap<String, u64>,
    rng: &mut Rng,
) -> Plan {
    let n_points = points.len() as u64;
    let modes = match kind {
        Kind::Connector => n_points + 3,
        Kind::Consumer => n_points + 2,
    };
    if u64::from(start) > modes {
        if let Some(point) = points
            .iter()
            .find(|p| !fired.contains_key(&format!("{}:{p}", kind.name())))
        {
            return Plan::Failpoint {
                point,
                n: rng.range(1, 3),
            };
        }
        if kind == Kind::Connector
            && !fired.contains_key(&format!("connector:{CONNECTOR_SHUTDOWN_FAILPOINT}"))
        {
            return Plan::TermInShutdown {
                after: rng.millis(300, 3000),
            };
        }
    }
    let mode = if u64::from(start) <= modes {
        u64::from(start) - 1
    } else {
        // Failpoints twice as likely as the other modes.
        let m = rng.range(0, modes + n_points - 1);
        if m >= modes {
            rng.range(0, n_points - 1)
        } else {
            m
        }
    };
    let after = |rng: &mut Rng| rng.millis(300, 3000);
    if mode < n_points {
        let point = points[mode as usize];
        let n = match (kind, point) {
            (Kind::Consumer, _) => rng.range(1, 25),
            (Kind::Connector, "after-persist-before-status-update") => rng.range(1, 6),
            // Once per Kafka transaction, a few each second while writers run.
            (Kind::Connector, "before-kafka-commit" | "after-kafka-commit-before-persist") => {
                rng.range(1, 20)
            }
            (Kind::Connector, _) => rng.range(1, 40),
        };
        return Plan::Failpoint { point, n };
    }
    match (kind, mode - n_points) {
        (Kind::Connector, 0) => Plan::TermInShutdown { after: after(rng) },
        (Kind::Connector, 1) | (Kind::Consumer, 0) => Plan::Kill { after: after(rng) },
        _ => Plan::Term { after: after(rng) },
    }
}

struct Slot {
    kind: Kind,
    /// The failpoints planned for this kind in this run.
    points: Vec<&'static str>,
    proc: Option<Proc>,
    starts: u32,
    respawn_at: Instant,
}

pub async fn run(opts: Options) {
    // Same feature set as the binary under test (cargo builds both at once).
    if !cfg!(feature = "failpoints") {
        panic!(
            "the chaos test needs the connector built with its crash points, and this build has none: \
             run it as `cargo test --features failpoints --test chaos` (scripts/soak.sh does)"
        );
    }
    // The run stops Kafka and restarts PostgreSQL: no other run of this
    // binary may share the servers meanwhile.
    let _alone = crate::common::alone().await;
    super::verify::self_check();
    if opts.exactly_once {
        super::verify::reader_self_check(&kafka_bootstrap()).await;
    }
    let infra = Infra::from_env();
    let names = Names::new(unique_name("chaos"), opts.partitioned);
    let dir = work_dir(&names.base);
    eprintln!(
        "chaos: seed={} mode={} cycles={} writers={} tx_per_sec={} aggregates={} partitioned={} bulk_rows={} small_work_mem={} files in {}",
        opts.seed,
        mode_name(opts.exactly_once),
        opts.cycles,
        opts.workload.writers,
        opts.workload.tx_per_sec,
        opts.workload.aggregates,
        opts.partitioned,
        opts.workload.bulk_rows,
        opts.small_work_mem,
        dir.display()
    );
    let admin = admin_client().await;
    admin
        .batch_execute(&names.create_sql())
        .await
        .unwrap_or_else(|e| panic!("creating the chaos tables of {}: {e}", names.base));
    // Where `outbox-cdc audit` starts its window at the end of the run.
    let audit_since: String = admin
        .query_one("SELECT (now() - interval '1 second')::text", &[])
        .await
        .expect("read the server clock")
        .get(0);
    let offsets = dir.join("offsets");
    let config_path = dir.join("connector.toml");
    std::fs::write(
        &config_path,
        names.connector_config(&offsets, opts.exactly_once, opts.small_work_mem),
    )
    .expect("write connector config");
    let launcher = Launcher {
        connector_config: config_path,
        consumer_args: names.consumer_args(),
        dir: dir.clone(),
        sabotage: opts.drop_every.map(|n| format!("drop-insert-every:{n}")),
    };
    let mut rng = Rng::new(opts.seed);
    let mut reader = KafkaReader::new(&kafka_bootstrap(), &names.topic_prefix);

    let result = chaos(
        &opts,
        &names,
        &launcher,
        &infra,
        &offsets,
        &mut rng,
        &mut reader,
    )
    .await;
    let (ledger, mut tally) = match result {
        Ok(x) => x,
        Err(e) => fail(
            opts.seed,
            &launcher,
            &dir,
            &format!("chaos phase failed: {e}"),
        ),
    };

    // Verdict.
    if let Err(e) = reader.catch_up(Duration::from_secs(60)) {
        fail(
            opts.seed,
            &launcher,
            &dir,
            &format!("final read of the topics: {e}"),
        );
    }
    if opts.drop_every.is_some() {
        let skipped = skipped_inserts(&launcher.log_path(Kind::Connector));
        for r in reader.records.iter_mut() {
            r.skipped = skipped.contains(&r.event_id);
        }
    }
    let admin = admin_client().await;
    let db = DbState::read(&admin, &names).await;
    let mut verdict = verify(
        &ledger,
        &db,
        &reader.records,
        &tally.windows,
        opts.delivery(),
    );
    verdict.malformed = reader.malformed.clone();
    let confirmed_at_end: Option<Lsn> = admin
        .query_opt(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&names.slot],
        )
        .await
        .ok()
        .flatten()
        .and_then(|row| row.get::<_, Option<String>>(0))
        .and_then(|s| s.parse().ok());
    if let Err(e) = offsets_advanced(
        &tally.stored_history,
        tally.first_confirmed,
        confirmed_at_end,
    ) {
        tally.offset_violations.push(e);
    }
    verdict.progress.append(&mut tally.offset_violations);
    // The audit command, from the outside, must agree with the ledger.
    let config = outbox_cdc::config::Config::load(&launcher.connector_config)
        .expect("the run's connector config");
    let options = outbox_cdc::audit::AuditOptions {
        since: audit_since,
        until: None,
        aggregate_type: None,
        max_examples: 20,
        progress: false,
    };
    match outbox_cdc::audit::run(&config, &options).await {
        Ok(a) => {
            eprintln!(
                "chaos: audit rows={} records={} missing={} pending={} phantoms={} duplicates={} order_violations={}",
                a.rows,
                a.records,
                a.missing,
                a.pending,
                a.phantoms,
                a.duplicates,
                a.order_violations
            );
            // The connector has caught up: a row without a record is lost
            // whether the audit could prove the slot passed it (missing) or
            // not (pending: the slot's proof may lag the end of the run).
            // The audit reads read_committed too: under exactly-once delivery
            // it must see no duplicate either.
            let agrees = a.rows as usize == verdict.events
                && (a.missing + a.pending) as usize == verdict.lost.len()
                && a.phantoms as usize == verdict.phantoms.len()
                && (a.order_violations == 0)
                    == (verdict.order_violations.is_empty() && verdict.repaired_late.is_empty())
                && (!opts.exactly_once || a.duplicates == 0);
            if !agrees {
                verdict.progress.push(format!(
                    "outbox-cdc audit disagrees with the ledger (events {}, lost {}, phantoms {}, order violations {}, duplicates {} under {}):\n{}",
                    verdict.events,
                    verdict.lost.len(),
                    verdict.phantoms.len(),
                    verdict.order_violations.len(),
                    verdict.duplicates,
                    mode_name(opts.exactly_once),
                    a.to_text()
                ));
            }
        }
        Err(e) => verdict
            .progress
            .push(format!("outbox-cdc audit failed: {e}")),
    }
    let redeliveries = count_lines(&launcher.log_path(Kind::Consumer), "duplicate delivery");
    report(&opts, &tally, &verdict, redeliveries);
    println!("{}", verdict.soak_line(tally.cycles));
    if !verdict.is_clean() {
        fail(
            opts.seed,
            &launcher,
            &dir,
            &format!("invariants violated:\n{}", verdict.details()),
        );
    }
    let coverage = coverage_gaps(
        &tally,
        &connector_failpoints(opts.exactly_once),
        opts.every_failpoint,
    );
    if !coverage.is_empty() {
        fail(
            opts.seed,
            &launcher,
            &dir,
            &format!("the run did not exercise: {}", coverage.join(", ")),
        );
    }
    assert!(verdict.events > 0, "no events were written");
    if let Some(n) = opts.drop_every {
        // Every skipped row was published (no loss above), none twice
        // outside a crash window: at least one must have come from the
        // witness, or the sabotage never fired.
        if verdict.repaired == 0 {
            fail(
                opts.seed,
                &launcher,
                &dir,
                &format!(
                    "the connector skipped every {n}th insert, yet no event was published by the live witness"
                ),
            );
        }
    }
    if opts.small_work_mem {
        streaming_exercised(&admin, &tally)
            .await
            .unwrap_or_else(|e| fail(opts.seed, &launcher, &dir, &e));
    }

    // Clean up only after a pass: a failure leaves everything for inspection.
    cleanup(&admin, &names).await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run with a small decoding work memory proves something about streaming
/// only if, from PostgreSQL 14 on, transactions were streamed and some
/// connector deaths found one of them in the spill.
async fn streaming_exercised(admin: &tokio_postgres::Client, tally: &Tally) -> Result<(), String> {
    let version: i32 = admin
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .map_err(|e| format!("reading server_version_num: {e}"))?
        .get(0);
    eprintln!(
        "chaos: streamed transactions seen on the slot={} connector deaths with a spill file={}",
        tally.streamed_txns_seen, tally.deaths_with_spill
    );
    if version < 140000 {
        return Ok(());
    }
    if tally.streamed_txns_seen == 0 || tally.deaths_with_spill == 0 {
        return Err(format!(
            "the run did not exercise streaming: the slot streamed {} transactions and {} connector \
             deaths found a spill file (both must be above 0 on PostgreSQL {version})",
            tally.streamed_txns_seen, tally.deaths_with_spill
        ));
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn chaos(
    opts: &Options,
    names: &Names,
    launcher: &Launcher,
    infra: &Infra,
    offsets: &Path,
    rng: &mut Rng,
    reader: &mut KafkaReader,
) -> Result<(Vec<TxRecord>, Tally), String> {
    let mut tally = Tally::default();
    let mut admin = Admin::default();

    // The slot must exist before anything is written: it only sees later changes.
    let mut connector = Slot {
        kind: Kind::Connector,
        points: connector_failpoints(opts.exactly_once),
        proc: Some(launcher.spawn(Kind::Connector, Plan::Steady, 0)),
        starts: 0,
        respawn_at: Instant::now(),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let row = admin
            .get()
            .await
            .query_opt(
                "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                &[&names.slot],
            )
            .await
            .map_err(|e| format!("read slot: {e}"))?;
        if row.is_some_and(|r| r.get::<_, bool>(0)) {
            break;
        }
        if let Some(p) = connector.proc.as_mut() {
            p.poll()?;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the connector did not create and use slot {} within 60 s",
                names.slot
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    names.create_topics().await;
    let mut consumer = Slot {
        kind: Kind::Consumer,
        points: CONSUMER_FAILPOINTS.to_vec(),
        proc: Some(launcher.spawn(Kind::Consumer, Plan::Steady, 0)),
        starts: 0,
        respawn_at: Instant::now(),
    };
    // The first processes end at a random moment, like any other (one that
    // has already ended keeps its plan: the next poll says how it ended).
    for slot in [&mut connector, &mut consumer] {
        if let Some(p) = slot.proc.as_mut() {
            let after = p.started.elapsed() + rng.millis(300, 2000);
            let _ = p.replan(Plan::Kill { after });
        }
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    let (pause_tx, pause_rx) = watch::channel(false);
    let writers = workload::spawn(&opts.workload, names, rng, stop_rx, pause_rx);

    let outages = 1 + opts.cycles / 500;
    let kafka_at: Vec<u64> = (0..outages)
        .map(|i| (opts.cycles * (3 * i + 1)) / (3 * outages))
        .collect();
    // PostgreSQL restarts in pairs: one under load, one with the writers
    // paused and the connector caught up (a caught-up walsender ends the
    // stream cleanly at shutdown instead of being cut).
    let pg_at: Vec<u64> = (0..outages)
        .flat_map(|i| {
            [
                (opts.cycles * (6 * i + 4)) / (6 * outages),
                (opts.cycles * (6 * i + 5)) / (6 * outages),
            ]
        })
        .collect();
    let budget = Duration::from_secs(600 + opts.cycles * 10);
    let t0 = Instant::now();
    let writer_app = workload::application_name(&names.base);
    let mut next_writer_kill = rng.range(2, 6);
    // Once per run, half-way: the slot is lost while writers commit, and
    // `outbox-cdc repair` republishes the gap from the outbox table. Not in
    // an exactly-once run: the repair is at-least-once by design (it may
    // duplicate), which that run's verdict does not allow.
    let slot_loss = !opts.exactly_once;
    let mut slot_lost_at = opts.cycles / 2;
    // A run that must fire every failpoint goes on past its cycles until they
    // have, up to three times as many: the cycles count both processes'
    // deaths, and the consumer dies far more often (while the connector
    // kept for the idle PostgreSQL restart catches up and lives through it,
    // the consumer dies some 10-30 times). coverage_gaps names what is left.
    let required = required_failpoints(&connector.points);
    let unwalked = |tally: &Tally| {
        opts.every_failpoint
            && tally.cycles < 3 * opts.cycles
            && required
                .iter()
                .any(|p| !tally.failpoint_hits.contains_key(p))
    };
    while tally.cycles < opts.cycles
        || unwalked(&tally)
        || (tally.kafka_outages as usize) < kafka_at.len()
        || (tally.pg_restarts as usize) < pg_at.len()
        || (slot_loss && tally.slot_repairs == 0)
    {
        if t0.elapsed() > budget {
            return Err(format!(
                "{} cycles not done within {budget:?} (done {})",
                opts.cycles, tally.cycles
            ));
        }
        for slot in [&mut connector, &mut consumer] {
            step(
                slot, launcher, offsets, names, &mut admin, rng, reader, &mut tally,
            )
            .await?;
        }
        if tally.cycles >= next_writer_kill {
            next_writer_kill = tally.cycles + rng.range(2, 6);
            // The application's own crash: its open transactions roll back, a
            // COMMIT in flight has an outcome it does not learn.
            if let Ok(rows) = admin
                .get()
                .await
                .query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
                    &[&writer_app],
                )
                .await
            {
                tally.writer_kills += rows.len() as u64;
            }
        }
        if let Some(&at) = kafka_at.get(tally.kafka_outages as usize)
            && tally.cycles >= at
        {
            tally.close_pending(reader).await;
            // The bound first, then the partitions' ends (see stored_now).
            let (stored, source) = stored_now(&mut connector, offsets, names, &tally).await;
            let before = reader.watermarks(Duration::from_secs(5));
            let took = infra.kafka_outage(Duration::from_secs(2)).await?;
            tally.kafka_outages += 1;
            eprintln!(
                "chaos: cycle {}: Kafka stopped and started ({took:?}); acknowledged before: {stored} ({source})",
                tally.cycles
            );
            tally.add_window(
                format!(
                    "the Kafka outage at cycle {} (acknowledged {stored} before it)",
                    tally.cycles
                ),
                before,
                reader.watermarks(Duration::from_secs(30)),
                Some(stored),
                HashSet::new(),
            );
        }
        if slot_loss && tally.slot_repairs == 0 && tally.cycles >= slot_lost_at {
            if let Some(mut p) = connector.proc.take() {
                p.abandon();
                after_connector_death(offsets, names, &mut admin, reader, &mut tally).await;
            }
            if !repair_can_prove(offsets, names, &mut admin).await {
                // The stored offset's last commit is older than every outbox
                // row (it acknowledged only transactions without one, e.g. the
                // noise table's empty transactions before PostgreSQL 15): the
                // repair would rightly refuse (rows might have been deleted).
                // Lose the slot at a later cycle instead.
                eprintln!(
                    "chaos: cycle {}: slot loss postponed: no acknowledged commit yet at or after the oldest outbox row",
                    tally.cycles
                );
                connector.respawn_at = Instant::now();
                slot_lost_at = tally.cycles + 1;
            } else {
                // The offset stored for the lost slot: what the repair starts from.
                let lost = OffsetStore::open(offsets)
                    .and_then(|s| s.load(&names.slot))
                    .map_err(|e| format!("read the offset store before the repair: {e}"))?
                    .ok_or("no offset stored before the repair")?;
                drop_slot(names, &mut admin).await?;
                // Writers go on: their rows are in the gap only the table holds.
                tokio::time::sleep(Duration::from_millis(700)).await;
                tally.close_pending(reader).await;
                let before = reader.watermarks(Duration::from_secs(5));
                let t = Instant::now();
                let repair = launcher.clone();
                tokio::task::spawn_blocking(move || repair.repair())
                    .await
                    .map_err(|e| format!("repair task: {e}"))??;
                tally.slot_repairs += 1;
                // Repaired rows repeat what was acknowledged within the
                // repair's margin (its rule, DESIGN.md §13): the contract's
                // wider duplicate window. Any other duplicate across it is
                // bounded by the stored offset, like a crash's.
                let republished = republished_by_repair(&lost, names, &mut admin).await?;
                eprintln!(
                    "chaos: cycle {}: slot dropped, gap repaired ({:?}); stored {}, {} rows within the repair's rule",
                    tally.cycles,
                    t.elapsed(),
                    lost.lsn,
                    republished.len()
                );
                tally.add_window(
                    format!(
                        "the slot repair at cycle {} (stored {}, {} rows within its rule)",
                        tally.cycles,
                        lost.lsn,
                        republished.len()
                    ),
                    before,
                    reader.watermarks(Duration::from_secs(5)),
                    Some(lost.lsn),
                    republished,
                );
                connector.respawn_at = Instant::now();
            }
        }
        if let Some(&at) = pg_at.get(tally.pg_restarts as usize)
            && tally.cycles >= at
        {
            let idle = tally.pg_restarts % 2 == 1;
            if idle {
                let _ = pause_tx.send(true);
                // A live connector with no crash point armed, so that
                // it is there, idle, when the server shuts down: the
                // running one if the harness may still change its plan,
                // else a new one.
                let kept = connector.proc.as_mut().is_some_and(keep_for_idle);
                if !kept {
                    retire_connector(
                        &mut connector,
                        offsets,
                        names,
                        &mut admin,
                        reader,
                        &mut tally,
                    )
                    .await?;
                    tally.close_pending(reader).await;
                    connector.starts += 1;
                    let plan = Plan::Kill { after: IDLE_LIFE };
                    connector.proc = Some(launcher.spawn(Kind::Connector, plan, connector.starts));
                }
                let Some(live) = connector.proc.as_mut() else {
                    unreachable!("kept or started above")
                };
                // With nothing new to publish, a live connector must
                // confirm everything written so far: it acknowledges the
                // idle keepalives' wal_end (DESIGN.md §5). Not doing so is
                // the WAL-pinning failure, a verdict violation.
                match wait_caught_up(names, &mut admin, live).await {
                    Ok(took) => eprintln!(
                        "chaos: cycle {}: writers paused, connector caught up in {took:?}",
                        tally.cycles
                    ),
                    Err(e) => {
                        eprintln!("chaos: cycle {}: {e}", tally.cycles);
                        tally
                            .offset_violations
                            .push(format!("cycle {}: {e}", tally.cycles));
                    }
                }
            }
            tally.close_pending(reader).await;
            // The bound first, then the partitions' ends (see stored_now).
            let (stored, source) = stored_now(&mut connector, offsets, names, &tally).await;
            let before = reader.watermarks(Duration::from_secs(5));
            let took = infra.pg_restart().await?;
            tally.pg_restarts += 1;
            let how = if idle { "while idle" } else { "under load" };
            eprintln!(
                "chaos: cycle {}: PostgreSQL restarted {how} ({took:?}); acknowledged before: {stored} ({source})",
                tally.cycles,
            );
            let _ = pause_tx.send(false);
            // The connector reconnects after a backoff; its resends come later still.
            tokio::time::sleep(Duration::from_secs(3)).await;
            tally.add_window(
                format!(
                    "the PostgreSQL restart {how} at cycle {} (acknowledged {stored} before it)",
                    tally.cycles
                ),
                before,
                reader.watermarks(Duration::from_secs(5)),
                Some(stored),
                HashSet::new(),
            );
            if idle {
                // Its part is done: it ends at a random moment, like any
                // other, instead of living out IDLE_LIFE, during which
                // no connector crash point could be reached (a short run
                // then ran out of cycles before covering them). Unless
                // it has ended: poll says how.
                if let Some(p) = connector.proc.as_mut() {
                    let after = p.started.elapsed() + rng.millis(300, 3000);
                    let _ = p.replan(Plan::Kill { after });
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    // Drain: stop writing, run both undisturbed until everything committed is
    // published and applied, then stop them gracefully.
    let _ = stop_tx.send(true);
    let mut ledger = Vec::new();
    for w in writers {
        let (records, _stats) = w.await.map_err(|e| format!("writer task: {e}"))?;
        ledger.extend(records);
    }
    for slot in [&mut connector, &mut consumer] {
        if let Some(mut p) = slot.proc.take() {
            p.abandon();
            // A crash at the end is a window too: its duplicates are in flight.
            if slot.kind == Kind::Connector {
                after_connector_death(offsets, names, &mut admin, reader, &mut tally).await;
            }
        }
        if slot.kind == Kind::Connector {
            tally.close_pending(reader).await;
        }
        slot.starts += 1;
        slot.proc = Some(launcher.spawn(slot.kind, Plan::Steady, slot.starts));
    }
    drain(
        names,
        &mut admin,
        reader,
        &mut [&mut connector, &mut consumer],
    )
    .await?;
    for slot in [&mut connector, &mut consumer] {
        if let Some(p) = slot.proc.as_mut() {
            p.stop().await?;
        }
    }
    Ok((ledger, tally))
}

#[allow(clippy::too_many_arguments)]
async fn step(
    slot: &mut Slot,
    launcher: &Launcher,
    offsets: &Path,
    names: &Names,
    admin: &mut Admin,
    rng: &mut Rng,
    reader: &KafkaReader,
    tally: &mut Tally,
) -> Result<(), String> {
    let Some(p) = slot.proc.as_mut() else {
        if Instant::now() >= slot.respawn_at {
            if slot.kind == Kind::Connector {
                tally.close_pending(reader).await;
            }
            slot.starts += 1;
            let plan = next_plan(
                slot.kind,
                &slot.points,
                slot.starts,
                &tally.failpoint_hits,
                rng,
            );
            slot.proc = Some(launcher.spawn(slot.kind, plan, slot.starts));
        }
        return Ok(());
    };
    let Some(death) = p.poll()? else {
        return Ok(());
    };
    let (plan, lived, incarnation) = (p.plan(), p.started.elapsed(), p.incarnation);
    slot.proc = None;
    record_death(
        slot.kind,
        incarnation,
        plan,
        lived,
        death,
        offsets,
        names,
        admin,
        reader,
        tally,
    )
    .await;
    // A short, random pause: sometimes a backlog builds, sometimes none.
    slot.respawn_at = Instant::now() + rng.millis(0, 400);
    Ok(())
}

/// Counts a death that the plan expected and, for the connector, reads its
/// stored offset and opens its window.
#[allow(clippy::too_many_arguments)]
async fn record_death(
    kind: Kind,
    incarnation: u32,
    plan: Plan,
    lived: Duration,
    death: Death,
    offsets: &Path,
    names: &Names,
    admin: &mut Admin,
    reader: &KafkaReader,
    tally: &mut Tally,
) {
    tally.cycles += 1;
    let label = match death {
        Death::Failpoint(point) => {
            *tally
                .failpoint_hits
                .entry(format!("{}:{point}", kind.name()))
                .or_default() += 1;
            format!("failpoint {point}")
        }
        Death::Killed {
            failpoint_missed: true,
        } => {
            tally.missed_failpoints += 1;
            format!("kill -9 ({plan} not reached)")
        }
        Death::Killed { .. } => "kill -9".to_owned(),
        Death::Clean => "clean stop".to_owned(),
    };
    *tally
        .deaths
        .entry(format!("{}: {label}", kind.name()))
        .or_default() += 1;
    let mut line = format!(
        "cycle {}: {} #{incarnation} ({plan}) ended by {label} after {} ms",
        tally.cycles,
        kind.name(),
        lived.as_millis()
    );
    if kind == Kind::Connector
        && let Some(lsn) = after_connector_death(offsets, names, admin, reader, tally).await
    {
        let _ = write!(line, "; stored offset {lsn}");
    }
    eprintln!("chaos: {line}");
}

/// How long the connector the idle PostgreSQL restart relies on lives on.
const IDLE_LIFE: Duration = Duration::from_secs(30);

/// Whether the idle PostgreSQL restart can keep `p` as its live, idle
/// connector: only one with no crash point armed (its plan is a kill or a
/// stop at a random moment) that the harness has not acted on yet and that
/// still runs. It is then re-planned to live [`IDLE_LIFE`] more. A connector
/// already sent its planned SIGTERM is stopping: it must not be waited on,
/// and must still be judged by the plan it was stopped under.
fn keep_for_idle(p: &mut Proc) -> bool {
    matches!(p.plan(), Plan::Kill { .. } | Plan::Term { .. })
        && p.replan(Plan::Kill {
            after: p.started.elapsed() + IDLE_LIFE,
        })
        .is_ok()
}

/// Ends the connector the idle PostgreSQL restart does not keep. One the
/// harness already sent SIGTERM, or that has ended, is let finish and judged
/// by its own plan: an ordinary death of the run. One with a crash point
/// still armed is killed (as before: its plan did not run, not a cycle).
async fn retire_connector(
    connector: &mut Slot,
    offsets: &Path,
    names: &Names,
    admin: &mut Admin,
    reader: &KafkaReader,
    tally: &mut Tally,
) -> Result<(), String> {
    let Some(mut p) = connector.proc.take() else {
        return Ok(());
    };
    if !p.signalled() && !p.ended()? {
        p.abandon();
        after_connector_death(offsets, names, admin, reader, tally).await;
        return Ok(());
    }
    // Bounded: poll kills it and fails after STOP_TIMEOUT.
    let death = loop {
        if let Some(death) = p.poll()? {
            break death;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (plan, lived) = (p.plan(), p.started.elapsed());
    record_death(
        Kind::Connector,
        p.incarnation,
        plan,
        lived,
        death,
        offsets,
        names,
        admin,
        reader,
        tally,
    )
    .await;
    Ok(())
}

/// The connector's acknowledged offset now, as the bound of a window that
/// begins now (an outage): every session that resumes after it starts at or
/// after this offset (the store only moves forward), and a copy appended
/// after the window's start ends (read after this) by a session already
/// running had not been acknowledged when this was read. From the running
/// connector's `/metrics` (it holds the offset store; `outbox_cdc_acked_lsn`
/// is only set from a flushed store write), from the store when no connector
/// runs, and else the offset stored at its last death (a lower bound).
async fn stored_now(
    connector: &mut Slot,
    offsets: &Path,
    names: &Names,
    tally: &Tally,
) -> (Lsn, String) {
    let fallback = tally.last_stored.unwrap_or(Lsn::ZERO);
    let ended = connector
        .proc
        .as_mut()
        .is_none_or(|p| p.ended().unwrap_or(true));
    match connector.proc.as_mut().filter(|_| !ended) {
        Some(p) => {
            // A connector started a moment ago serves /metrics, and stores
            // its start, within a second or two.
            let deadline = Instant::now() + Duration::from_secs(3);
            let why = loop {
                let why = match p.metrics {
                    Some(addr) => match acked_from_metrics(addr).await {
                        Ok(Some(lsn)) => {
                            return (lsn, format!("/metrics of connector #{}", p.incarnation));
                        }
                        Ok(None) => "not known yet".to_owned(),
                        Err(e) => e,
                    },
                    None => break "no /metrics".to_owned(),
                };
                if Instant::now() > deadline || p.ended().unwrap_or(true) {
                    break why;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            (
                fallback,
                format!(
                    "stored at the connector's last death; #{}'s /metrics: {why}",
                    p.incarnation
                ),
            )
        }
        // No process holds the store (the next one starts after this).
        None => match OffsetStore::open(offsets).and_then(|s| s.load(&names.slot)) {
            Ok(stored) => (
                stored.map_or(Lsn::ZERO, |s| s.lsn),
                "the offset store, no connector running".to_owned(),
            ),
            Err(e) => (
                fallback,
                format!("stored at the connector's last death; the store: {e}"),
            ),
        },
    }
}

/// `outbox_cdc_acked_lsn` from the connector's `/metrics`; `None` while it
/// is 0 (before its first session stored anything).
async fn acked_from_metrics(addr: SocketAddr) -> Result<Option<Lsn>, String> {
    let body = outbox_cdc::http::get(addr, "/metrics", Duration::from_secs(2))
        .await
        .map_err(|e| e.to_string())?;
    let value = body
        .lines()
        .find_map(|l| {
            l.strip_prefix(outbox_cdc::metrics::ACKED_LSN)?
                .strip_prefix(' ')
        })
        .ok_or_else(|| format!("no {} in {addr}/metrics", outbox_cdc::metrics::ACKED_LSN))?;
    let n: u64 = value
        .trim()
        .parse()
        .map_err(|e| format!("{} {value:?}: {e}", outbox_cdc::metrics::ACKED_LSN))?;
    Ok((n != 0).then(|| Lsn::new(n)))
}

/// The events the gap repair of the lost slot (stored offset `lost`)
/// publishes again by its rule (src/retained/repair.rs): committed at or
/// after the acknowledged commit time minus the margin, by the commit
/// timestamp when tracked, else by `occurred_at`.
async fn republished_by_repair(
    lost: &outbox_cdc::checkpoint::StoredOffset,
    names: &Names,
    admin: &mut Admin,
) -> Result<HashSet<String>, String> {
    let Some(acked) = lost.acked_commit_time else {
        return Err(format!(
            "the offset stored for the lost slot ({}) has no commit time",
            lost.lsn
        ));
    };
    let client = admin.get().await;
    let track: String = client
        .query_one("SELECT current_setting('track_commit_timestamp')", &[])
        .await
        .map_err(|e| format!("read track_commit_timestamp: {e}"))?
        .get(0);
    let repair = super::schema::REPAIR;
    let (time, margin_ms) = if track == "on" {
        (
            "coalesce(pg_xact_commit_timestamp(xmin), occurred_at)",
            repair.commit_time_margin_ms,
        )
    } else {
        ("occurred_at", repair.occurred_at_margin_ms)
    };
    let since = (acked.0 - (margin_ms as i64) * 1000) as f64;
    let rows = client
        .query(
            &format!(
                "SELECT event_id::text FROM public.{} \
                 WHERE ((extract(epoch FROM {time}) - 946684800) * 1e6)::float8 >= $1::float8",
                names.outbox
            ),
            &[&since],
        )
        .await
        .map_err(|e| format!("read the rows within the repair's rule: {e}"))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// After the connector died: its stored offset only moves forward, the slot
/// was never confirmed beyond it, and the partitions' ends mark the edge of
/// the in-flight window.
async fn after_connector_death(
    offsets: &Path,
    names: &Names,
    admin: &mut Admin,
    reader: &KafkaReader,
    tally: &mut Tally,
) -> Option<Lsn> {
    // An earlier death's window closes before this one opens.
    tally.close_pending(reader).await;
    let died = Instant::now();
    note_streaming(offsets, names, admin, tally).await;
    // Requests the dead process had on the wire may still be appended: the
    // window stays open until the next connector starts (close_pending).
    tokio::time::sleep(Duration::from_millis(50)).await;
    let now = reader.watermarks(Duration::from_secs(3));
    let read = OffsetStore::open(offsets).and_then(|s| s.load(&names.slot));
    let window_stored = match &read {
        // Nothing stored yet: nothing was acknowledged.
        Ok(s) => Some(s.as_ref().map_or(Lsn::ZERO, |s| s.lsn)),
        Err(_) => None,
    };
    match now {
        Ok(ends) => {
            tally.pending = Some((
                Window {
                    what: format!(
                        "the connector's death at cycle {} (stored {})",
                        tally.cycles,
                        window_stored.map_or_else(|| "unreadable".to_owned(), |s| s.to_string())
                    ),
                    before: ends.clone(),
                    after: ends,
                    stored: window_stored,
                    republished: HashSet::new(),
                },
                died,
            ));
        }
        Err(e) => eprintln!(
            "chaos: partition ends at a connector's death not readable ({e}): its duplicates count as unexplained"
        ),
    }
    let stored = match read {
        Ok(s) => s.map(|s| s.lsn),
        Err(e) => {
            tally
                .offset_violations
                .push(format!("cannot read the offset store after a crash: {e}"));
            return None;
        }
    };
    let Some(stored) = stored else {
        // Before its first persist (killed while starting) nothing is stored;
        // once something was, it can never disappear.
        if let Some(prev) = tally.last_stored {
            tally
                .offset_violations
                .push(format!("the stored offset {prev} disappeared"));
        }
        return None;
    };
    if let Some(prev) = tally.last_stored
        && stored < prev
    {
        tally
            .offset_violations
            .push(format!("stored offset went back from {prev} to {stored}"));
    }
    tally.last_stored = Some(stored);
    tally.stored_history.push(stored);
    if let Ok(Some(row)) = admin
        .get()
        .await
        .query_opt(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&names.slot],
        )
        .await
    {
        let confirmed: Option<Lsn> = row.get::<_, Option<String>>(0).and_then(|s| s.parse().ok());
        if tally.first_confirmed.is_none() {
            tally.first_confirmed = confirmed;
        }
        if let Some(confirmed) = confirmed.filter(|c| *c > stored) {
            tally.offset_violations.push(format!(
                "slot confirmed up to {confirmed}, beyond the durably stored offset {stored}"
            ));
        }
    }
    Some(stored)
}

/// Whether `outbox-cdc repair` can prove the gap covered (the condition of
/// `src/retained/repair.rs`): nothing acknowledged since the slot was made, or
/// the table still holds a row from at or before the acknowledged commit.
async fn repair_can_prove(offsets: &Path, names: &Names, admin: &mut Admin) -> bool {
    let stored = match OffsetStore::open(offsets).and_then(|s| s.load(&names.slot)) {
        Ok(Some(stored)) => stored,
        _ => return false,
    };
    if stored.commit_time_is_slot_creation {
        return true;
    }
    let Some(acked) = stored.acked_commit_time else {
        return false;
    };
    let oldest: Option<f64> = admin
        .get()
        .await
        .query_one(
            &format!(
                "SELECT ((extract(epoch FROM min(occurred_at)) - 946684800) * 1e6)::float8 FROM public.{}",
                names.outbox
            ),
            &[],
        )
        .await
        .ok()
        .and_then(|row| row.get(0));
    oldest.is_some_and(|o| o <= acked.0 as f64)
}

/// Drops the run's slot once no walsender holds it (the connector was killed;
/// the server notices the closed connection within moments).
async fn drop_slot(names: &Names, admin: &mut Admin) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let dropped = admin
            .get()
            .await
            .execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE slot_name = $1 AND NOT active",
                &[&names.slot],
            )
            .await;
        if let Ok(1) = dropped {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "could not drop slot {} within 30 s: {dropped:?}",
                names.slot
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How long a live connector may take to confirm the WAL written before the
/// writers paused: generous, for a loaded two-core machine and a connector
/// that was just (re)started and first replays its backlog.
const CATCH_UP_BOUND: Duration = Duration::from_secs(60);

/// Waits (bounded by [`CATCH_UP_BOUND`]) until the slot is confirmed up to
/// where WAL was once the writers stopped (the consumer's own writes are not
/// published, so the connector then has nothing in flight). Returns how long
/// it took, or what was seen; gives up at once if `connector`, the one
/// expected to catch up, ends (the next poll says how).
async fn wait_caught_up(
    names: &Names,
    admin: &mut Admin,
    connector: &mut Proc,
) -> Result<Duration, String> {
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let target = admin
        .get()
        .await
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .map(|r| r.get::<_, String>(0))
        .map_err(|e| format!("reading pg_current_wal_lsn() with the writers paused: {e}"))?;
    let deadline = t0 + CATCH_UP_BOUND;
    let mut seen = String::from("nothing read");
    while Instant::now() < deadline {
        if connector.ended()? {
            return Err(format!(
                "connector #{} ({}) ended while the harness waited for it to catch up ({seen})",
                connector.incarnation,
                connector.plan()
            ));
        }
        let row = admin
            .get()
            .await
            .query_opt(
                "SELECT confirmed_flush_lsn::text, active, confirmed_flush_lsn >= $2::text::pg_lsn
                   FROM pg_replication_slots WHERE slot_name = $1",
                &[&names.slot, &target],
            )
            .await;
        match row {
            Ok(Some(row)) => {
                let confirmed: Option<String> = row.get(0);
                let active: bool = row.get(1);
                if row.get::<_, Option<bool>>(2) == Some(true) {
                    let took = t0.elapsed();
                    // One more flush interval and status update for the last keepalive.
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    return Ok(took);
                }
                seen = format!(
                    "slot confirmed up to {}, active: {active}",
                    confirmed.as_deref().unwrap_or("nothing")
                );
            }
            Ok(None) => seen = format!("slot {} does not exist", names.slot),
            Err(e) => seen = format!("reading the slot: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!(
        "with the writers paused, the connector did not confirm the WAL written before the pause \
         ({target}) within {CATCH_UP_BOUND:?}: {seen}"
    ))
}

/// What a connector's death found of pgoutput streaming: spill files of
/// transactions still open, and how many transactions the slot streamed.
async fn note_streaming(offsets: &Path, names: &Names, admin: &mut Admin, tally: &mut Tally) {
    let spilled = std::fs::read_dir(offsets.join("spill"))
        .map(|dir| {
            dir.filter_map(Result::ok)
                .any(|f| f.path().extension().is_some_and(|e| e == "spill"))
        })
        .unwrap_or(false);
    tally.deaths_with_spill += u64::from(spilled);
    // to_jsonb: PostgreSQL 13 has the view without its stream_* columns.
    if let Ok(Some(row)) = admin
        .get()
        .await
        .query_opt(
            "SELECT (to_jsonb(s)->>'stream_txns')::bigint FROM pg_stat_replication_slots s \
             WHERE slot_name = $1",
            &[&names.slot],
        )
        .await
        && let Some(n) = row.get::<_, Option<i64>>(0)
    {
        tally.streamed_txns_seen = tally.streamed_txns_seen.max(n);
    }
}

/// Waits until every committed outbox row is in Kafka and has its effect,
/// or until nothing has moved for two minutes.
async fn drain(
    names: &Names,
    admin: &mut Admin,
    reader: &mut KafkaReader,
    slots: &mut [&mut Slot],
) -> Result<(), String> {
    const STALL: Duration = Duration::from_secs(120);
    let mut progress = (0, 0, Instant::now());
    let committed_sql = format!("SELECT count(*) FROM public.{}", names.outbox);
    let applied_sql = format!(
        "SELECT count(DISTINCT event_id) FROM public.{}",
        names.effects
    );
    loop {
        for slot in slots.iter_mut() {
            if let Some(p) = slot.proc.as_mut() {
                p.poll()?;
            }
        }
        let _ = reader.catch_up(Duration::from_secs(30));
        let published = reader.distinct_event_ids().len() as i64;
        let client = admin.get().await;
        let (committed, applied) = match (
            client.query_one(&committed_sql, &[]).await,
            client.query_one(&applied_sql, &[]).await,
        ) {
            (Ok(c), Ok(a)) => (c.get::<_, i64>(0), a.get::<_, i64>(0)),
            _ => (i64::MAX, 0),
        };
        if published >= committed && applied >= committed {
            return Ok(());
        }
        if (published, applied) != (progress.0, progress.1) {
            progress = (published, applied, Instant::now());
        }
        if progress.2.elapsed() > STALL {
            // Not an error here: the verdict names what is missing.
            eprintln!(
                "chaos: drain stalled for {STALL:?}: {published} of {committed} published, {applied} applied"
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every failpoint a run plans, as `kind:point` (the keys of
/// `Tally::failpoint_hits`).
fn required_failpoints(connector_points: &[&'static str]) -> Vec<String> {
    connector_points
        .iter()
        .chain([&CONNECTOR_SHUTDOWN_FAILPOINT])
        .map(|p| format!("connector:{p}"))
        .chain(CONSUMER_FAILPOINTS.iter().map(|p| format!("consumer:{p}")))
        .collect()
}

fn coverage_gaps(
    tally: &Tally,
    connector_points: &[&'static str],
    every_failpoint: bool,
) -> Vec<String> {
    let mut gaps = Vec::new();
    let mut unfired = Vec::new();
    for p in required_failpoints(connector_points) {
        if !tally.failpoint_hits.contains_key(&p) {
            unfired.push(if p.starts_with("connector:") {
                format!("{p} (never fired: was the connector built with --features failpoints?)")
            } else {
                format!("{p} (never fired)")
            });
        }
    }
    if every_failpoint {
        gaps.append(&mut unfired);
    } else if tally.failpoint_hits.is_empty() {
        gaps.push("any failpoint (none fired)".into());
    } else if !unfired.is_empty() {
        eprintln!(
            "chaos: not exercised, allowed by OUTBOX_CDC_CHAOS_EVERY_FAILPOINT=0: {}",
            unfired.join(", ")
        );
    }
    if tally.kafka_outages == 0 {
        gaps.push("a Kafka outage".into());
    }
    if tally.pg_restarts == 0 {
        gaps.push("a PostgreSQL restart".into());
    }
    gaps
}

fn mode_name(exactly_once: bool) -> &'static str {
    if exactly_once {
        "exactly-once"
    } else {
        "at-least-once"
    }
}

/// The event ids of the inserts the connector's sabotage skipped, from its
/// log (`sabotage drop-insert-every: ... event_id=...`).
fn skipped_inserts(log: &Path) -> std::collections::HashSet<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains("sabotage drop-insert-every"))
        .filter_map(|l| l.split("event_id=").nth(1))
        .filter_map(|rest| {
            rest.trim_start_matches('"')
                .split(|c: char| c == '"' || c.is_whitespace())
                .next()
                .map(str::to_owned)
        })
        .filter(|id| !id.is_empty())
        .collect()
}

fn report(opts: &Options, tally: &Tally, v: &Verdict, redeliveries: usize) {
    if let Some(n) = opts.drop_every {
        eprintln!(
            "chaos: every {n}th insert skipped by the stream; events published by the live witness: {}; skipped events published after a later event of their aggregate: {}",
            v.repaired,
            v.repaired_late.len()
        );
    }
    eprintln!(
        "chaos: seed={} mode={} cycles={} missed_failpoints={}",
        opts.seed,
        mode_name(opts.exactly_once),
        tally.cycles,
        tally.missed_failpoints
    );
    for (what, n) in &tally.deaths {
        eprintln!("chaos:   {what}: {n}");
    }
    eprintln!(
        "chaos: transactions committed={} rolled_back={} failed={} commit_reply_lost={} (resolved: {} committed, {} not)",
        v.committed_txs + v.unknown_committed,
        v.rolled_back_txs,
        v.failed_txs,
        v.unknown_committed + v.unknown_rolled_back,
        v.unknown_committed,
        v.unknown_rolled_back
    );
    eprintln!(
        "chaos: events={} records={} duplicates={} unexplained_duplicates={} unbounded_duplicates={} consumer_redeliveries={} kafka_outages={} pg_restarts={} slot_repairs={} writer_connections_cut={}",
        v.events,
        v.records,
        v.duplicates,
        v.unexplained_duplicates.len(),
        v.unbounded_duplicates,
        redeliveries,
        tally.kafka_outages,
        tally.pg_restarts,
        tally.slot_repairs,
        tally.writer_kills
    );
}

fn count_lines(path: &Path, needle: &str) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.lines().filter(|l| l.contains(needle)).count())
        .unwrap_or(0)
}

async fn cleanup(admin: &tokio_postgres::Client, names: &Names) {
    let _ = admin
        .execute("SELECT pg_drop_replication_slot($1)", &[&names.slot])
        .await;
    let _ = admin.batch_execute(&names.drop_sql()).await;
    names.delete_topics().await;
}

fn fail(seed: u64, launcher: &Launcher, dir: &Path, why: &str) -> ! {
    let logs: String = [Kind::Connector, Kind::Consumer]
        .iter()
        .map(|k| {
            let path = launcher.log_path(*k);
            format!(
                "--- last lines of {} ---\n{}\n",
                path.display(),
                tail(&path, 40)
            )
        })
        .collect();
    panic!(
        "{why}\n{logs}(files kept in {}; replay the same plan with OUTBOX_CDC_CHAOS_SEED={seed})",
        dir.display()
    );
}

/// The planning state machine without any server: stand-ins for the
/// connector (a shell that exits 0 on SIGTERM, as the connector does).
#[cfg(test)]
mod tests {
    use std::io::{BufRead as _, BufReader};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use super::super::procs::{Death, Kind, Plan, Proc};
    use super::{IDLE_LIFE, keep_for_idle};

    /// Started under `plan`, once its SIGTERM trap is set (a SIGTERM before
    /// that would kill the shell instead of ending it cleanly).
    fn stand_in(plan: Plan) -> Proc {
        let mut child = Command::new("sh")
            .args([
                "-c",
                "trap 'exit 0' TERM; echo ready; while :; do sleep 0.05; done",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start sh");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .expect("read the stand-in's first line");
        assert_eq!(line.trim(), "ready");
        Proc::from_child(Kind::Connector, child, plan, 20)
    }

    /// Polls until the process ended; how it was judged.
    fn death_of(p: &mut Proc) -> Result<Death, String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(death) = p.poll()? {
                return Ok(death);
            }
            assert!(Instant::now() < deadline, "the stand-in did not end");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Seed 1796243724635906462: connector #20, planned "SIGTERM after 923
    /// ms", had been sent its SIGTERM (and stopped cleanly) when the idle
    /// PostgreSQL restart re-planned it as "kill -9 after 30990 ms", waited
    /// 60 s for it to catch up and then judged its clean exit by the new
    /// plan: "ended unexpectedly: exit status: 0 after SIGTERM".
    #[test]
    fn the_idle_restart_keeps_no_connector_it_already_sent_sigterm() {
        let planned = Plan::Term {
            after: Duration::ZERO,
        };
        let mut p = stand_in(planned);
        assert_eq!(p.poll(), Ok(None), "the planned SIGTERM goes out");
        assert!(p.signalled());
        let kept = keep_for_idle(&mut p);
        let plan = p.plan();
        assert_eq!(
            death_of(&mut p),
            Ok(Death::Clean),
            "it stops as planned and is judged by that plan (kept as the idle connector: {kept}, as {plan})"
        );
        assert!(
            !kept,
            "a connector already sent SIGTERM was kept, as {plan}"
        );
        assert_eq!(plan, planned, "its plan was changed after SIGTERM");
    }

    /// A connector that has ended (not yet seen by poll) is not kept either:
    /// nothing would catch up.
    #[test]
    fn the_idle_restart_keeps_no_connector_that_has_ended() {
        let mut child = Command::new("sh")
            .args(["-c", "exit 3"])
            .stdin(Stdio::null())
            .spawn()
            .expect("start sh");
        // Wait until it is a zombie: ended, not yet reaped.
        let stat = format!("/proc/{}/stat", child.id());
        let deadline = Instant::now() + Duration::from_secs(20);
        while !std::fs::read_to_string(&stat)
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
            .unwrap_or(false)
        {
            assert!(Instant::now() < deadline, "sh did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.stdout.take();
        let planned = Plan::Kill {
            after: Duration::from_secs(60),
        };
        let mut p = Proc::from_child(Kind::Connector, child, planned, 21);
        assert!(!keep_for_idle(&mut p), "an ended connector was kept");
        assert_eq!(p.plan(), planned);
        let judged = death_of(&mut p);
        assert!(
            judged
                .as_ref()
                .is_err_and(|e| e.contains("ended unexpectedly: exit status: 3")),
            "{judged:?}"
        );
    }

    /// A quiet connector (a kill or a stop at a random moment, not acted on
    /// yet) is kept and lives on; one with a crash point armed is not.
    #[test]
    fn the_idle_restart_keeps_a_quiet_connector_and_no_armed_one() {
        let mut p = stand_in(Plan::Term {
            after: Duration::from_secs(60),
        });
        assert!(keep_for_idle(&mut p));
        assert!(
            matches!(p.plan(), Plan::Kill { after } if after >= IDLE_LIFE),
            "{}",
            p.plan()
        );
        assert_eq!(p.poll(), Ok(None), "not due yet");
        assert!(!p.signalled());
        for armed in [
            Plan::Failpoint {
                point: "after-receive",
                n: 3,
            },
            Plan::TermInShutdown {
                after: Duration::from_secs(60),
            },
            Plan::Steady,
        ] {
            let mut p = stand_in(armed);
            assert!(!keep_for_idle(&mut p), "kept under {armed}");
            assert_eq!(p.plan(), armed);
        }
    }
}
