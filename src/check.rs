//! `outbox-cdc check`: preflight of the configured database and Kafka, with the
//! exact fix for each failure (DESIGN.md §7).
//!
//! Read-only: it only queries catalogs and settings, and asks Kafka for
//! metadata. Each check yields one PASS, FAIL or SKIP line (SKIP: a check it
//! depends on failed); a FAIL carries the SQL or setting that fixes it.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::Duration;

use tokio_postgres::Client;

use crate::checkpoint::OffsetStore;
use crate::config::Config;
use crate::coverage::{self, CheckItem, CoverageProblem};
use crate::outbox::settings::TableName;
use crate::outbox::{ColumnRole, MappedColumn};
use crate::parking::{ParkedTable, TableAccess};
use crate::pg::{PgConnectConfig, QualifiedTable, quote_ident};
use crate::sink;

/// How long the Kafka check waits for cluster metadata.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);

/// The result of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Pass(String),
    /// Works now, but a foreseeable event (a failover) would need an operator.
    Warn {
        problem: String,
        fix: String,
    },
    Fail {
        problem: String,
        fix: String,
    },
    Skip(String),
}

/// The items of the report. Each is printed under its name; tests name them
/// through this type, not through strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    Configuration,
    PostgresConnection,
    WalLevel,
    ReplicationSlots,
    Slot,
    Failover,
    WalSenders,
    ReplicationPrivilege,
    OutboxTable,
    SelectPrivilege,
    OutboxColumns,
    Publication,
    PublicationTables,
    PublicationPublishes,
    ParkedTable,
    Heartbeat,
    Kafka,
}

impl Item {
    /// The item's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Item::Configuration => "configuration",
            Item::PostgresConnection => "postgres connection",
            Item::WalLevel => "wal_level",
            Item::ReplicationSlots => "replication slots",
            Item::Slot => "slot",
            Item::Failover => "failover",
            Item::WalSenders => "wal senders",
            Item::ReplicationPrivilege => "replication privilege",
            Item::OutboxTable => "outbox table",
            Item::SelectPrivilege => "select privilege",
            Item::OutboxColumns => "outbox columns",
            Item::Publication => "publication",
            Item::PublicationTables => "publication tables",
            Item::PublicationPublishes => "publication publishes",
            Item::ParkedTable => "parked table",
            Item::Heartbeat => "heartbeat",
            Item::Kafka => "kafka",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    pub(crate) item: Item,
    pub(crate) outcome: Outcome,
}

fn pass(item: Item, detail: impl Into<String>) -> CheckResult {
    CheckResult {
        item,
        outcome: Outcome::Pass(detail.into()),
    }
}

fn fail(item: Item, problem: impl Into<String>, fix: impl Into<String>) -> CheckResult {
    CheckResult {
        item,
        outcome: Outcome::Fail {
            problem: problem.into(),
            fix: fix.into(),
        },
    }
}

fn warn(item: Item, problem: impl Into<String>, fix: impl Into<String>) -> CheckResult {
    CheckResult {
        item,
        outcome: Outcome::Warn {
            problem: problem.into(),
            fix: fix.into(),
        },
    }
}

fn skip(item: Item, why: impl Into<String>) -> CheckResult {
    CheckResult {
        item,
        outcome: Outcome::Skip(why.into()),
    }
}

fn query_fail(item: Item, e: &tokio_postgres::Error) -> CheckResult {
    fail(
        item,
        format!("the catalog query failed: {e}"),
        "run `outbox-cdc check` as the role in postgres.url against a PostgreSQL 13 or later server",
    )
}

/// Runs every check; the Kafka check runs while the database is examined.
pub async fn run(config: &Config) -> Vec<CheckResult> {
    let kafka = tokio::spawn(check_kafka(config.kafka.clone()));
    let mut results = check_postgres(config).await;
    results.push(match kafka.await {
        Ok(result) => result,
        Err(e) => fail(
            Item::Kafka,
            format!("the check task failed: {e}"),
            "run the check again",
        ),
    });
    results
}

/// The report printed to stdout: one line per check, a fix line under each
/// failure, and a summary.
pub fn render(results: &[CheckResult]) -> String {
    let width = results
        .iter()
        .map(|r| r.item.name().len())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for r in results {
        match &r.outcome {
            Outcome::Pass(detail) => {
                let _ = writeln!(out, "PASS  {:<width$}  {detail}", r.item.name());
            }
            Outcome::Skip(why) => {
                let _ = writeln!(out, "SKIP  {:<width$}  {why}", r.item.name());
            }
            Outcome::Fail { problem, fix } | Outcome::Warn { problem, fix } => {
                let label = match r.outcome {
                    Outcome::Fail { .. } => "FAIL",
                    _ => "WARN",
                };
                let _ = writeln!(out, "{label}  {:<width$}  {problem}", r.item.name());
                for (i, line) in fix.lines().enumerate() {
                    let label = if i == 0 { "fix:" } else { "" };
                    let _ = writeln!(out, "      {:<width$}  {label:<4} {line}", "");
                }
            }
        }
    }
    let count = |f: fn(&Outcome) -> bool| results.iter().filter(|r| f(&r.outcome)).count();
    let failed = count(|o| matches!(o, Outcome::Fail { .. }));
    let skipped = count(|o| matches!(o, Outcome::Skip(_)));
    let passed = count(|o| matches!(o, Outcome::Pass(_)));
    let warned = count(|o| matches!(o, Outcome::Warn { .. }));
    let verdict = if failed == 0 && skipped == 0 {
        "OK"
    } else {
        "FAILED"
    };
    let warnings = match warned {
        0 => String::new(),
        1 => ", 1 warning".to_owned(),
        n => format!(", {n} warnings"),
    };
    let _ = writeln!(
        out,
        "check {verdict}: {passed} passed, {failed} failed, {skipped} skipped{warnings}"
    );
    out
}

/// True when every check passed (warnings included).
pub fn all_passed(results: &[CheckResult]) -> bool {
    results
        .iter()
        .all(|r| matches!(r.outcome, Outcome::Pass(_) | Outcome::Warn { .. }))
}

async fn check_kafka(settings: sink::KafkaSettings) -> CheckResult {
    let bootstrap = settings.bootstrap_servers().unwrap_or_default().to_owned();
    match sink::check_reachable(&settings, KAFKA_TIMEOUT).await {
        Ok(info) => pass(
            Item::Kafka,
            format!(
                "{} broker(s) at {bootstrap}: {} (answered by {})",
                info.broker_count,
                info.brokers.join(", "),
                info.answered_by
            ),
        ),
        Err(e) => fail(
            Item::Kafka,
            format!("no cluster metadata from {bootstrap:?} within {KAFKA_TIMEOUT:?}: {e}"),
            "start the brokers or correct kafka.\"bootstrap.servers\"; the addresses must be reachable \
             from here and match the brokers' advertised.listeners; check security.protocol, sasl.* and \
             ssl.* in [kafka]",
        ),
    }
}

/// What the database checks learn and later checks use.
struct Facts {
    user: String,
    table: TableName,
}

async fn check_postgres(config: &Config) -> Vec<CheckResult> {
    const DB_CHECKS: [Item; 12] = [
        Item::WalLevel,
        Item::ReplicationSlots,
        Item::Slot,
        Item::Failover,
        Item::WalSenders,
        Item::ReplicationPrivilege,
        Item::OutboxTable,
        Item::SelectPrivilege,
        Item::OutboxColumns,
        Item::Publication,
        Item::PublicationTables,
        Item::PublicationPublishes,
    ];
    let mut results = Vec::new();
    let skip_all = |results: &mut Vec<CheckResult>, why: &str| {
        results.extend(DB_CHECKS.iter().map(|item| skip(*item, why)));
    };
    let (table, mapped) = match (config.outbox.table_name(), config.outbox.mapped_columns()) {
        (Ok(t), Ok(m)) => (t, m),
        // `Config::load` validated both already; kept for a library caller.
        (Err(e), _) | (_, Err(e)) => {
            results.push(fail(
                Item::Configuration,
                e.to_string(),
                "correct the [outbox] section",
            ));
            return results;
        }
    };
    let pg = match PgConnectConfig::parse(&config.postgres.url) {
        Ok(pg) => pg,
        Err(e) => {
            results.push(fail(
                Item::PostgresConnection,
                e.to_string(),
                "correct postgres.url",
            ));
            skip_all(&mut results, "no database connection");
            return results;
        }
    };
    let client = match pg.connect_sql().await {
        Ok(c) => c,
        Err(e) => {
            results.push(fail(
                Item::PostgresConnection,
                format!("cannot connect to {}: {e}", pg.redacted()),
                "correct postgres.url (host, port, dbname, user, sslmode); give the password in the URL \
                 or PGPASSWORD; make sure pg_hba.conf admits this host and user",
            ));
            skip_all(&mut results, "no database connection");
            return results;
        }
    };
    let user = match client
        .query_one(
            "SELECT current_user::text, current_setting('server_version')",
            &[],
        )
        .await
    {
        Ok(row) => {
            let user: String = row.get(0);
            let version: String = row.get(1);
            results.push(pass(
                Item::PostgresConnection,
                format!("{} as {user} (PostgreSQL {version})", pg.redacted()),
            ));
            user
        }
        Err(e) => {
            results.push(query_fail(Item::PostgresConnection, &e));
            skip_all(&mut results, "no database connection");
            return results;
        }
    };
    let facts = Facts { user, table };
    results.push(wal_level(&client).await);
    let (slots, slot) = replication_slots(&client, config).await;
    results.push(slots);
    results.push(slot);
    results.push(match failover_facts(&client, config).await {
        Ok(facts) => judge_failover(&facts),
        Err(e) => query_fail(Item::Failover, &e),
    });
    results.push(wal_senders(&client, &config.postgres.slot).await);
    results.push(replication_privilege(&client, &facts).await);
    // The same proof `run` makes before streaming (coverage::judge).
    let table = QualifiedTable::new(facts.table.schema.clone(), facts.table.name.clone());
    let proof = match coverage::gather(&client, &table, &config.postgres.publication).await {
        Ok(catalog) => {
            let problems = coverage::judge(&catalog, &table, &config.postgres.publication, &mapped)
                .err()
                .unwrap_or_default();
            Ok(Proof { catalog, problems })
        }
        Err(e) => Err(e.to_string()),
    };
    match &proof {
        Ok(p) if p.table_problems().is_empty() && p.catalog.table.is_some() => {
            let oid = p.catalog.table.as_ref().map_or(0, |t| t.oid);
            results.push(pass(Item::OutboxTable, p.table_detail(&facts)));
            results.push(select_privilege(&client, oid, &facts).await);
            results.push(outbox_columns(&client, oid, &facts, &mapped).await);
        }
        Ok(p) => {
            results.push(fail_with(Item::OutboxTable, &p.table_problems()));
            results.push(skip(Item::SelectPrivilege, "the outbox table is unusable"));
            results.push(skip(Item::OutboxColumns, "the outbox table is unusable"));
        }
        Err(e) => {
            results.push(fail(
                Item::OutboxTable,
                format!("the catalog query failed: {e}"),
                "run `outbox-cdc check` as the role in postgres.url",
            ));
            results.push(skip(Item::SelectPrivilege, "the catalog query failed"));
            results.push(skip(Item::OutboxColumns, "the catalog query failed"));
        }
    }
    results.extend(publication(&client, config, &facts, proof.as_ref().ok()).await);
    if let Ok(Some(table)) = ParkedTable::of(config) {
        results.push(match table.probe().await {
            Ok(access) => judge_parked_table(&table.name(), access),
            Err(e) => fail(
                Item::ParkedTable,
                e.to_string(),
                "make the primary reachable with postgres.url (or postgres.primary_url)",
            ),
        });
    }
    if let Some(interval) = config.monitor.heartbeat_interval() {
        results.push(heartbeat(&client, &config.monitor.heartbeat_prefix, interval).await);
    }
    results
}

/// With `on_poison = "dead-letter"` the connector parks in the shared table
/// (crate::parking): it must be able to read, insert and delete there, or
/// create it.
fn judge_parked_table(name: &str, access: TableAccess) -> CheckResult {
    let grant = format!("GRANT SELECT, INSERT, DELETE ON {name} TO <the role in postgres.url>");
    match access {
        TableAccess { usable: true, .. } => pass(Item::ParkedTable, format!("{name} is usable")),
        TableAccess { exists: true, .. } => fail(
            Item::ParkedTable,
            format!("{name} exists but this role may not read, insert and delete there"),
            grant,
        ),
        TableAccess {
            creatable: true, ..
        } => pass(
            Item::ParkedTable,
            format!("{name} does not exist yet; the connector creates it at start"),
        ),
        TableAccess { .. } => fail(
            Item::ParkedTable,
            format!("{name} does not exist and this role may not create it"),
            format!(
                "apply migrations/005_parked.sql as the owner (then {grant}), or set outbox.parked_table"
            ),
        ),
    }
}

async fn wal_level(client: &Client) -> CheckResult {
    match client
        .query_one("SELECT current_setting('wal_level')", &[])
        .await
    {
        Ok(row) => judge_wal_level(&row.get::<_, String>(0)),
        Err(e) => query_fail(Item::WalLevel, &e),
    }
}

fn judge_wal_level(level: &str) -> CheckResult {
    if level == "logical" {
        pass(Item::WalLevel, "logical")
    } else {
        fail(
            Item::WalLevel,
            format!("wal_level is {level:?}; logical decoding needs \"logical\""),
            "ALTER SYSTEM SET wal_level = logical;  -- as a superuser, then restart PostgreSQL",
        )
    }
}

/// A row of pg_replication_slots, as far as `check` needs it.
#[derive(Debug, Clone)]
struct SlotRow {
    name: String,
    plugin: Option<String>,
    database: Option<String>,
    active: bool,
    wal_status: Option<String>,
}

/// What the slot checks read: every slot of the cluster, the limit, and
/// the database we are connected to.
#[derive(Debug, Clone)]
struct SlotFacts {
    slots: Vec<SlotRow>,
    max_replication_slots: i32,
    database: String,
}

impl SlotFacts {
    fn find(&self, slot: &str) -> Option<&SlotRow> {
        self.slots.iter().find(|s| s.name == slot)
    }
}

async fn slot_facts(client: &Client) -> Result<SlotFacts, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT slot_name::text, plugin::text, database::text, active, wal_status, \
                    current_setting('max_replication_slots')::int, current_database()::text \
             FROM (SELECT 1) AS one LEFT JOIN pg_replication_slots ON true",
            &[],
        )
        .await?;
    Ok(SlotFacts {
        max_replication_slots: rows.first().map_or(0, |r| r.get(5)),
        database: rows.first().map_or_else(String::new, |r| r.get(6)),
        slots: rows
            .iter()
            .filter_map(|r| {
                Some(SlotRow {
                    name: r.get::<_, Option<String>>(0)?,
                    plugin: r.get(1),
                    database: r.get(2),
                    active: r.get::<_, Option<bool>>(3).unwrap_or(false),
                    wal_status: r.get(4),
                })
            })
            .collect(),
    })
}

/// Capacity for our slot, then the slot itself if it exists.
async fn replication_slots(client: &Client, config: &Config) -> (CheckResult, CheckResult) {
    let slot = config.postgres.slot.as_str();
    match slot_facts(client).await {
        Ok(facts) => {
            let existing = match (facts.find(slot), stored_coverage_break(config)) {
                (Some(_), Some(refused)) => fail(
                    Item::Slot,
                    refused.to_string(),
                    "the `outbox-cdc audit ... --repair` command above, while the connector is stopped",
                ),
                (Some(row), None) => judge_slot(slot, row, &facts.database),
                (None, _) => missing_slot(config, slot),
            };
            (judge_capacity(slot, &facts), existing)
        }
        Err(e) => (
            query_fail(Item::ReplicationSlots, &e),
            skip(Item::Slot, "the slot query failed"),
        ),
    }
}

fn judge_capacity(slot: &str, facts: &SlotFacts) -> CheckResult {
    const CAPACITY: Item = Item::ReplicationSlots;
    let (used, max) = (facts.slots.len() as i32, facts.max_replication_slots);
    if facts.find(slot).is_some() {
        return pass(
            CAPACITY,
            format!("slot {slot:?} exists ({used} of {max} slots used)"),
        );
    }
    if used < max {
        return pass(
            CAPACITY,
            format!("{} of {max} free for slot {slot:?}", max - used),
        );
    }
    let idle: Vec<&str> = facts
        .slots
        .iter()
        .filter(|s| !s.active)
        .map(|s| s.name.as_str())
        .collect();
    let drop_hint = match idle.first() {
        Some(name) => format!(
            "\nor drop an unused slot (inactive now: {}): SELECT pg_drop_replication_slot('{name}');",
            idle.join(", ")
        ),
        None => String::new(),
    };
    fail(
        CAPACITY,
        format!(
            "all {max} replication slots (max_replication_slots) are in use; slot {slot:?} cannot be created"
        ),
        format!(
            "ALTER SYSTEM SET max_replication_slots = {};  -- as a superuser, then restart PostgreSQL{drop_hint}",
            max + 1
        ),
    )
}

/// Our slot exists: it must decode with pgoutput in this database and still
/// have its WAL.
fn judge_slot(slot: &str, row: &SlotRow, database: &str) -> CheckResult {
    const SLOT: Item = Item::Slot;
    let drop_sql = format!(
        "SELECT pg_drop_replication_slot('{}');",
        slot.replace('\'', "''")
    );
    let SlotRow {
        plugin,
        database: db,
        active,
        wal_status,
        ..
    } = row;
    if plugin.as_deref() != Some("pgoutput") {
        fail(
            SLOT,
            format!("slot {slot:?} uses plugin {plugin:?}, not pgoutput"),
            format!("choose another postgres.slot, or drop it: {drop_sql}"),
        )
    } else if db.as_deref() != Some(database) {
        fail(
            SLOT,
            format!("slot {slot:?} belongs to database {db:?}, not {database:?}"),
            "choose another postgres.slot, or point postgres.url at that database",
        )
    } else if wal_status.as_deref() == Some("lost") {
        fail(
            SLOT,
            format!("slot {slot:?} is lost (wal_status = lost): the WAL it needed was removed"),
            format!(
                "events committed since its confirmed position are not in the slot any more: \
                 `outbox-cdc repair --config <this file>` drops and recreates it and republishes them \
                 from the outbox table (docs/operations.md, \"Slot lost\"); without a stored offset, \
                 {drop_sql}"
            ),
        )
    } else {
        let state = if *active {
            "active (a consumer streams from it)"
        } else {
            "inactive"
        };
        pass(
            SLOT,
            format!(
                "{slot:?}: pgoutput, database {database}, {state}, wal_status {}",
                wal_status.as_deref().unwrap_or("-")
            ),
        )
    }
}

/// The coverage breaks stored for the slot (issue 47), as the refusal `run`
/// gives while they are; only an existing, unlocked store is read.
fn stored_coverage_break(config: &Config) -> Option<crate::pipeline::StartRefused> {
    let path = &config.offsets.path;
    if !path.exists() {
        return None;
    }
    let record = OffsetStore::open(path)
        .ok()?
        .coverage(&config.postgres.slot)
        .ok()??;
    let margin = (config.repair.occurred_at_margin_ms as i64).saturating_mul(1000);
    crate::pipeline::StartRefused::coverage_broken(
        &config.postgres.slot,
        config.config_argument(),
        margin,
        &record.breaks,
    )
}

/// The slot does not exist: fine before the first start, a lost slot when an
/// offset is stored (the start would be refused), a refused start when the
/// connector may not create it.
fn missing_slot(config: &Config, slot: &str) -> CheckResult {
    const SLOT: Item = Item::Slot;
    let path = &config.offsets.path;
    // Only an existing, unlocked store is read: sled creates missing
    // directories, and a running connector holds the lock.
    let stored = if path.exists() {
        OffsetStore::open(path)
            .ok()
            .and_then(|store| store.load(slot).ok().flatten())
    } else {
        None
    };
    if let Some(offset) = stored {
        return fail(
            SLOT,
            format!(
                "slot {slot:?} does not exist, but {} holds offset {} for it: the slot was lost, and changes \
                 committed after {} may never be published; `run` refuses to start",
                path.display(),
                offset.lsn,
                offset.lsn
            ),
            "outbox-cdc repair --config <this file>  -- recreates the slot and republishes the retained \
             outbox rows committed since (docs/operations.md, \"Slot lost\")",
        );
    }
    if config.postgres.create_slot {
        pass(
            SLOT,
            format!("{slot:?} does not exist yet; `run` creates it (postgres.create_slot)"),
        )
    } else {
        fail(
            SLOT,
            format!("slot {slot:?} does not exist and postgres.create_slot = false"),
            format!(
                "SELECT pg_create_logical_replication_slot('{}', 'pgoutput');\nor set postgres.create_slot = true",
                slot.replace('\'', "''")
            ),
        )
    }
}

/// What decides whether the slot survives a PostgreSQL failover.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FailoverFacts {
    slot: String,
    server_version: i32,
    in_recovery: bool,
    /// Physical slots on this server: standbys that stream with one.
    physical_slots: Vec<String>,
    /// 17+: the slot's `failover` flag (None: no such slot, or before 17).
    slot_failover: Option<bool>,
    /// 17+ on a standby: the slot's `synced` flag.
    slot_synced: Option<bool>,
    /// 17+: `synchronized_standby_slots` (empty before 17).
    synchronized_standby_slots: String,
    /// `postgres.failover_slot`.
    failover_slot: bool,
}

async fn failover_facts(
    client: &Client,
    config: &Config,
) -> Result<FailoverFacts, tokio_postgres::Error> {
    let slot = config.postgres.slot.clone();
    let row = client
        .query_one(
            "SELECT current_setting('server_version_num')::int, pg_is_in_recovery(), \
                    ARRAY(SELECT slot_name::text FROM pg_replication_slots WHERE slot_type = 'physical' \
                          ORDER BY 1)",
            &[],
        )
        .await?;
    let mut facts = FailoverFacts {
        slot,
        server_version: row.get(0),
        in_recovery: row.get(1),
        physical_slots: row.get(2),
        slot_failover: None,
        slot_synced: None,
        synchronized_standby_slots: String::new(),
        failover_slot: config.postgres.failover_slot,
    };
    if facts.server_version >= 170000 {
        let row = client
            .query_one(
                "SELECT (SELECT failover FROM pg_replication_slots WHERE slot_name = $1), \
                        (SELECT synced FROM pg_replication_slots WHERE slot_name = $1), \
                        current_setting('synchronized_standby_slots')",
                &[&facts.slot],
            )
            .await?;
        facts.slot_failover = row.get(0);
        facts.slot_synced = row.get(1);
        facts.synchronized_standby_slots = row.get(2);
    }
    Ok(facts)
}

/// Whether a failover of this server would keep the slot (PostgreSQL 17+
/// failover slots), or would need a gap repair.
fn judge_failover(f: &FailoverFacts) -> CheckResult {
    const NAME: Item = Item::Failover;
    let slot = &f.slot;
    if f.in_recovery {
        return match f.slot_synced {
            Some(true) => pass(
                NAME,
                format!("connected to a standby with slot {slot:?} synced from the primary"),
            ),
            _ => warn(
                NAME,
                format!(
                    "connected to a standby without a synced slot {slot:?}: if it is promoted, the slot is lost"
                ),
                "point postgres.url at the primary (several hosts with target_session_attrs=read-write follow a \
                 failover); see docs/operations.md, \"PostgreSQL failover\"",
            ),
        };
    }
    if f.physical_slots.is_empty() {
        return pass(
            NAME,
            "no standby streams from a physical slot here: nothing to fail over to",
        );
    }
    let standbys = f.physical_slots.join(", ");
    if f.server_version < 170000 {
        return warn(
            NAME,
            format!(
                "standbys stream from here (physical slots {standbys}), and before PostgreSQL 17 slots are not \
                 copied to them: after a failover the connector stops with the slot-lost refusal"
            ),
            "after a failover run `outbox-cdc repair` against the new primary (docs/operations.md, \
             \"Failover runbook per major\"); keep track_commit_timestamp = on and the outbox's retention longer \
             than a failover takes",
        );
    }
    match f.slot_failover {
        None if !f.failover_slot => warn(
            NAME,
            format!(
                "standbys stream from here ({standbys}) but postgres.failover_slot is false: the slot the connector \
                 creates would not be synced to them, and a failover would lose it"
            ),
            "set postgres.failover_slot = true before the first start",
        ),
        Some(false) => warn(
            NAME,
            format!(
                "slot {slot:?} was created without failover: it is not synced to the standbys ({standbys}), and a \
                 failover would lose it"
            ),
            format!(
                "stop the connector and, on a replication connection (psql \"dbname=... replication=database\"), \
                 run ALTER_REPLICATION_SLOT {slot} (FAILOVER true); set postgres.failover_slot = true"
            ),
        ),
        _ if f.synchronized_standby_slots.trim().is_empty() => warn(
            NAME,
            format!(
                "slot {slot:?} fails over, but synchronized_standby_slots is empty: the connector may be sent \
                 changes a standby has not received, and a promotion would then move the slot back past them"
            ),
            format!(
                "ALTER SYSTEM SET synchronized_standby_slots = '{}'; SELECT pg_reload_conf();  -- as a superuser",
                f.physical_slots.join(",")
            ),
        ),
        _ => pass(
            NAME,
            format!(
                "slot {slot:?} fails over; standbys ({}) must sync it (sync_replication_slots = on, checked on the \
                 standby: pg_replication_slots.synced)",
                f.synchronized_standby_slots
            ),
        ),
    }
}

/// max_wal_senders, the senders running, and whether one of them streams our slot.
#[derive(Debug, Clone, Copy)]
struct WalSenderFacts {
    max: i32,
    used: i32,
    ours_active: bool,
}

async fn wal_senders(client: &Client, slot: &str) -> CheckResult {
    match client
        .query_one(
            "SELECT current_setting('max_wal_senders')::int, \
                    (SELECT count(*) FROM pg_stat_get_wal_senders())::int, \
                    EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active)",
            &[&slot],
        )
        .await
    {
        Ok(row) => judge_wal_senders(
            slot,
            WalSenderFacts {
                max: row.get(0),
                used: row.get(1),
                ours_active: row.get(2),
            },
        ),
        Err(e) => query_fail(Item::WalSenders, &e),
    }
}

fn judge_wal_senders(slot: &str, f: WalSenderFacts) -> CheckResult {
    const NAME: Item = Item::WalSenders;
    let WalSenderFacts {
        max,
        used,
        ours_active,
    } = f;
    if ours_active {
        pass(
            NAME,
            format!("{used} of {max} in use, one of them streams slot {slot:?}"),
        )
    } else if used < max {
        pass(NAME, format!("{} of {max} free", max - used))
    } else {
        fail(
            NAME,
            format!(
                "all {max} WAL senders (max_wal_senders) are in use; the replication connection would be refused"
            ),
            format!(
                "ALTER SYSTEM SET max_wal_senders = {};  -- as a superuser, then restart PostgreSQL",
                max + 1
            ),
        )
    }
}

async fn replication_privilege(client: &Client, facts: &Facts) -> CheckResult {
    const NAME: Item = Item::ReplicationPrivilege;
    match client
        .query_one(
            "SELECT rolreplication, rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
    {
        Ok(row) => {
            let (replication, superuser): (bool, bool) = (row.get(0), row.get(1));
            if superuser {
                pass(NAME, format!("{} is a superuser", facts.user))
            } else if replication {
                pass(NAME, format!("{} has REPLICATION", facts.user))
            } else {
                fail(
                    NAME,
                    format!(
                        "role {} lacks the REPLICATION attribute, so it cannot stream from a slot",
                        facts.user
                    ),
                    format!(
                        "ALTER ROLE {} WITH REPLICATION;  -- as a superuser",
                        quote_ident(&facts.user)
                    ),
                )
            }
        }
        Err(e) => query_fail(NAME, &e),
    }
}

async fn select_privilege(client: &Client, oid: u32, facts: &Facts) -> CheckResult {
    const NAME: Item = Item::SelectPrivilege;
    match client
        .query_one("SELECT has_table_privilege($1::oid, 'SELECT')", &[&oid])
        .await
    {
        Ok(row) if row.get::<_, bool>(0) => pass(
            NAME,
            format!("{} may SELECT from {}", facts.user, facts.table),
        ),
        Ok(_) => fail(
            NAME,
            format!("role {} has no SELECT on {}", facts.user, facts.table),
            format!(
                "GRANT SELECT ON {} TO {};",
                facts.table.quoted(),
                quote_ident(&facts.user)
            ),
        ),
        Err(e) => query_fail(NAME, &e),
    }
}

async fn outbox_columns(
    client: &Client,
    oid: u32,
    facts: &Facts,
    mapped: &[MappedColumn],
) -> CheckResult {
    let rows = match client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), \
                    CASE WHEN t.typtype = 'd' THEN bt.typname ELSE t.typname END::text \
             FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
             LEFT JOIN pg_type bt ON bt.oid = t.typbasetype \
             WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped",
            &[&oid],
        )
        .await
    {
        Ok(rows) => rows,
        Err(e) => return query_fail(Item::OutboxColumns, &e),
    };
    let present: Vec<ColumnFact> = rows
        .iter()
        .map(|r| ColumnFact {
            name: r.get(0),
            shown: r.get(1),
            base: r.get(2),
        })
        .collect();
    judge_columns(&present, facts, mapped)
}

/// A column of the outbox table: its name, its type as `format_type` shows
/// it, and the base type's name (a domain's underlying type).
#[derive(Debug, Clone)]
struct ColumnFact {
    name: String,
    shown: String,
    base: String,
}

/// Every mapped column must exist with a type its role accepts.
fn judge_columns(present: &[ColumnFact], facts: &Facts, mapped: &[MappedColumn]) -> CheckResult {
    const NAME: Item = Item::OutboxColumns;
    let table = facts.table.quoted();
    let mut found = Vec::new();
    let mut problems = Vec::new();
    let mut fixes = Vec::new();
    let mut judged: Vec<&str> = Vec::new();
    for MappedColumn { key, column, role } in mapped {
        // A column also read as a header or placement is checked once, for
        // its standard role.
        if *role == ColumnRole::Any && judged.contains(&column.as_str()) {
            continue;
        }
        judged.push(column);
        let role = *role;
        match present.iter().find(|c| &c.name == column) {
            None => {
                problems.push(format!("column {column:?} ({key}) is missing"));
                fixes.push(format!(
                    "ALTER TABLE {table} ADD COLUMN {} {};  -- or set {key} to an existing column",
                    quote_ident(column),
                    role.fix_type()
                ));
            }
            Some(c) if !role.accepts(&c.base) => {
                problems.push(format!(
                    "column {column:?} ({key}) is {}, expected {}",
                    c.shown,
                    role.allowed()
                ));
                let to = role.fix_type();
                fixes.push(format!(
                    "ALTER TABLE {table} ALTER COLUMN {col} TYPE {to} USING {col}::{to};  -- or set {key} to a column of {}",
                    role.allowed(),
                    col = quote_ident(column),
                ));
            }
            Some(c) => found.push(format!("{column} {}", c.shown)),
        }
    }
    if problems.is_empty() {
        pass(NAME, found.join(", "))
    } else {
        fail(NAME, problems.join("; "), fixes.join("\n"))
    }
}

// The publication's three items, in publication() and judge_publication().
const EXISTS: Item = Item::Publication;
const TABLES: Item = Item::PublicationTables;
const PUBLISHES: Item = Item::PublicationPublishes;

/// Existence, tables (exactly the outbox table, all mapped columns, no row
/// filter) and operations (inserts only) of the publication.
async fn publication(
    client: &Client,
    config: &Config,
    facts: &Facts,
    proof: Option<&Proof>,
) -> Vec<CheckResult> {
    let name = &config.postgres.publication;
    let partitioned = proof
        .and_then(|p| p.catalog.table.as_ref())
        .is_some_and(|t| t.relkind == 'p');
    let create_sql = crate::pg::control::create_publication_sql(
        name,
        &QualifiedTable::new(facts.table.schema.clone(), facts.table.name.clone()),
        partitioned,
    );
    let row = match client
        .query_opt(
            "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = $1",
            &[name],
        )
        .await
    {
        Ok(row) => row,
        Err(e) => {
            return vec![
                query_fail(EXISTS, &e),
                skip(TABLES, "the publication query failed"),
                skip(PUBLISHES, "the publication query failed"),
            ];
        }
    };
    let Some(row) = row else {
        let missing = if config.postgres.create_publication {
            can_create_publication(client, facts, &create_sql).await
        } else {
            fail(
                EXISTS,
                format!("publication {name:?} does not exist (postgres.publication)"),
                format!(
                    "{create_sql}  -- as the table's owner\nor set postgres.create_publication = true"
                ),
            )
        };
        let why = "the publication does not exist yet";
        return vec![missing, skip(TABLES, why), skip(PUBLISHES, why)];
    };
    let row = PublicationFacts {
        all_tables: row.get(0),
        insert: row.get(1),
        update: row.get(2),
        delete: row.get(3),
        truncate: row.get(4),
    };
    judge_publication(name, &row, &create_sql, facts, proof)
}

/// An existing publication as pg_publication describes it.
#[derive(Debug, Clone, Copy)]
struct PublicationFacts {
    all_tables: bool,
    insert: bool,
    update: bool,
    delete: bool,
    truncate: bool,
}

/// The publication exists: it must name the outbox table (not all tables)
/// and publish inserts only.
fn judge_publication(
    name: &str,
    f: &PublicationFacts,
    create_sql: &str,
    facts: &Facts,
    proof: Option<&Proof>,
) -> Vec<CheckResult> {
    let quoted = quote_ident(name);
    let mut results = vec![pass(EXISTS, format!("{name:?} exists"))];

    results.push(if f.all_tables {
        fail(
            TABLES,
            format!("publication {name:?} is FOR ALL TABLES: every table's changes are decoded and sent to the connector"),
            format!("DROP PUBLICATION {quoted};\n{create_sql}"),
        )
    } else {
        publication_tables(name, facts, proof)
    });

    let extra: Vec<&str> = [
        (f.update, "update"),
        (f.delete, "delete"),
        (f.truncate, "truncate"),
    ]
    .into_iter()
    .filter_map(|(on, op)| on.then_some(op))
    .collect();
    let set_insert = format!("ALTER PUBLICATION {quoted} SET (publish = 'insert');");
    results.push(if !f.insert {
        fail(
            PUBLISHES,
            format!("publication {name:?} does not publish inserts, so no outbox row would reach the connector"),
            set_insert,
        )
    } else if !extra.is_empty() {
        fail(
            PUBLISHES,
            format!(
                "publication {name:?} also publishes {}: retention deletes and any update of the outbox are decoded \
                 and sent for nothing, and UPDATE/DELETE on a table without a replica identity fail while it \
                 publishes them",
                extra.join(", ")
            ),
            set_insert,
        )
    } else {
        pass(PUBLISHES, "insert only")
    });
    results
}

/// With `create_publication = true`, `run` creates a missing publication: that
/// needs CREATE on the database and ownership of the table.
async fn can_create_publication(client: &Client, facts: &Facts, create_sql: &str) -> CheckResult {
    const NAME: Item = Item::Publication;
    let row = client
        .query_one(
            "SELECT has_database_privilege(current_database(), 'CREATE'), \
                    COALESCE((SELECT pg_has_role(c.relowner, 'USAGE') FROM pg_class c \
                              JOIN pg_namespace n ON n.oid = c.relnamespace \
                              WHERE n.nspname = $1 AND c.relname = $2), false)",
            &[&facts.table.schema, &facts.table.name],
        )
        .await;
    match row {
        Ok(row) if row.get::<_, bool>(0) && row.get::<_, bool>(1) => pass(
            NAME,
            "missing; `run` creates it (postgres.create_publication = true)",
        ),
        Ok(_) => fail(
            NAME,
            format!(
                "the publication is missing and role {} cannot create it (it needs CREATE on the database and \
                 ownership of {})",
                facts.user, facts.table
            ),
            format!("{create_sql}  -- as the table's owner"),
        ),
        Err(e) => query_fail(NAME, &e),
    }
}

/// The coverage proof's verdict on the publication's tables, then: nothing
/// else in it (other tables' changes are decoded and sent for nothing).
fn publication_tables(name: &str, facts: &Facts, proof: Option<&Proof>) -> CheckResult {
    const NAME: Item = Item::PublicationTables;
    let Some(proof) = proof else {
        return skip(NAME, "the catalog query failed");
    };
    let Some(table) = &proof.catalog.table else {
        return skip(NAME, "the outbox table is missing");
    };
    let mut members: BTreeSet<u32> = table.partitions.iter().map(|m| m.oid).collect();
    members.insert(table.oid);
    let others: Vec<String> = proof
        .catalog
        .publication
        .iter()
        .flat_map(|p| p.published.iter())
        .filter(|(oid, _)| !members.contains(oid))
        .map(|(_, t)| t.to_string())
        .collect();
    let quoted = quote_ident(name);
    let drop_others = format!(
        "ALTER PUBLICATION {quoted} DROP TABLE {};",
        others.join(", ")
    );
    let problems: Vec<&CoverageProblem> = proof
        .problems
        .iter()
        .filter(|p| p.check_item() == CheckItem::Tables)
        .collect();
    if !problems.is_empty() {
        let mut result = fail_with(NAME, &problems);
        if let Outcome::Fail { fix, .. } = &mut result.outcome
            && !others.is_empty()
        {
            fix.push('\n');
            fix.push_str(&drop_others);
        }
        return result;
    }
    let Some(publication) = &proof.catalog.publication else {
        return skip(NAME, "the publication does not exist yet");
    };
    if !others.is_empty() {
        return fail(
            NAME,
            format!(
                "publication {name:?} also holds {}: their changes are decoded and sent to the connector for nothing",
                others.join(", ")
            ),
            drop_others,
        );
    }
    let leaves = table.partitions.iter().filter(|m| m.is_leaf).count();
    if table.relkind != 'p' {
        pass(NAME, format!("exactly {}", facts.table))
    } else if publication.identity.leaves_as_root {
        pass(
            NAME,
            format!(
                "exactly {} (partitioned, {leaves} leaf partition(s), published via the root)",
                facts.table
            ),
        )
    } else {
        pass(
            NAME,
            format!(
                "exactly {} (partitioned: its {leaves} leaf partition(s) are published under their own names and \
                 resolved to it)",
                facts.table
            ),
        )
    }
}

/// What the coverage proof found, for the table and publication items.
struct Proof {
    catalog: coverage::CatalogFacts,
    problems: Vec<CoverageProblem>,
}

impl Proof {
    fn table_problems(&self) -> Vec<&CoverageProblem> {
        self.problems
            .iter()
            .filter(|p| p.check_item() == CheckItem::Table)
            .collect()
    }

    fn table_detail(&self, facts: &Facts) -> String {
        match &self.catalog.table {
            Some(t) if t.relkind == 'p' => format!(
                "{} exists (partitioned, {} partition(s))",
                facts.table,
                t.partitions.iter().filter(|m| m.is_leaf).count()
            ),
            _ => format!("{} exists", facts.table),
        }
    }
}

/// One FAIL line for one or more problems of the proof.
fn fail_with(item: Item, problems: &[&CoverageProblem]) -> CheckResult {
    let what: Vec<String> = problems.iter().map(ToString::to_string).collect();
    let fixes: Vec<String> = problems.iter().map(|p| p.fix()).collect();
    fail(item, what.join("; "), fixes.join("\n"))
}

async fn heartbeat(client: &Client, prefix: &str, interval: Duration) -> CheckResult {
    const NAME: Item = Item::Heartbeat;
    match client
        .query_one(
            "SELECT has_function_privilege('pg_logical_emit_message(boolean, text, text)', 'EXECUTE')",
            &[],
        )
        .await
    {
        Ok(row) if row.get::<_, bool>(0) => pass(
            NAME,
            format!("every {} ms with prefix {prefix:?}", interval.as_millis()),
        ),
        Ok(_) => fail(
            NAME,
            "the role may not execute pg_logical_emit_message",
            "GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) TO <the role in postgres.url>;\n\
             or set monitor.heartbeat_interval_ms = 0",
        ),
        Err(e) => query_fail(NAME, &e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_roles_accept_usable_types_only() {
        assert!(
            ColumnRole::Id.accepts("uuid")
                && ColumnRole::Id.accepts("int8")
                && ColumnRole::Id.accepts("text")
        );
        assert!(!ColumnRole::Id.accepts("jsonb"));
        assert!(ColumnRole::Name.accepts("varchar") && !ColumnRole::Name.accepts("uuid"));
        assert!(ColumnRole::Payload.accepts("jsonb") && ColumnRole::Payload.accepts("json"));
        assert!(ColumnRole::Payload.accepts("text") && !ColumnRole::Payload.accepts("bytea"));
        assert!(ColumnRole::Integer.accepts("int4") && !ColumnRole::Integer.accepts("numeric"));
        assert!(!ColumnRole::Integer.accepts("text"));
    }

    fn slot_row(name: &str, active: bool) -> SlotRow {
        SlotRow {
            name: name.into(),
            plugin: Some("pgoutput".into()),
            database: Some("app".into()),
            active,
            wal_status: Some("reserved".into()),
        }
    }

    fn problem_and_fix(result: &CheckResult) -> (String, String) {
        match &result.outcome {
            Outcome::Fail { problem, fix } => (problem.clone(), fix.clone()),
            other => panic!("{:?} should fail, got {other:?}", result.item),
        }
    }

    #[test]
    fn the_parked_table_must_be_usable_or_creatable() {
        let at = |exists, usable, creatable| {
            judge_parked_table(
                "public.outbox_cdc_parked",
                TableAccess {
                    exists,
                    usable,
                    creatable,
                },
            )
        };
        assert!(matches!(at(true, true, false).outcome, Outcome::Pass(_)));
        assert!(matches!(at(false, false, true).outcome, Outcome::Pass(_)));
        let (problem, fix) = problem_and_fix(&at(true, false, true));
        assert!(
            problem.contains("may not read, insert and delete"),
            "{problem}"
        );
        assert!(
            fix.starts_with("GRANT SELECT, INSERT, DELETE ON public.outbox_cdc_parked"),
            "{fix}"
        );
        let (_, fix) = problem_and_fix(&at(false, false, false));
        assert!(fix.contains("migrations/005_parked.sql"), "{fix}");
    }

    /// wal_level needs a restart to change, so a live server cannot show
    /// this failure in the tests: the judge alone can.
    #[test]
    fn wal_level_other_than_logical_fails_with_the_setting_to_change() {
        assert_eq!(
            judge_wal_level("logical").outcome,
            Outcome::Pass("logical".into())
        );
        let (problem, fix) = problem_and_fix(&judge_wal_level("replica"));
        assert!(problem.contains("\"replica\""), "{problem}");
        assert!(
            fix.starts_with("ALTER SYSTEM SET wal_level = logical"),
            "{fix}"
        );
    }

    /// Every slot taken (max_replication_slots needs a restart, too): the fix
    /// raises the limit by one and names the inactive slots to drop instead.
    #[test]
    fn full_slot_capacity_fails_naming_the_limit_and_the_idle_slots() {
        let mut facts = SlotFacts {
            slots: vec![slot_row("busy", true), slot_row("old", false)],
            max_replication_slots: 2,
            database: "app".into(),
        };
        let (problem, fix) = problem_and_fix(&judge_capacity("ours", &facts));
        assert!(problem.contains("all 2 replication slots"), "{problem}");
        assert!(fix.contains("max_replication_slots = 3"), "{fix}");
        assert!(fix.contains("inactive now: old)"), "{fix}");
        assert!(fix.contains("pg_drop_replication_slot('old')"), "{fix}");
        assert!(
            matches!(judge_capacity("old", &facts).outcome, Outcome::Pass(_)),
            "an existing slot needs no free place"
        );
        facts.max_replication_slots = 3;
        assert_eq!(
            judge_capacity("ours", &facts).outcome,
            Outcome::Pass("1 of 3 free for slot \"ours\"".into())
        );
    }

    /// max_wal_senders needs a restart as well.
    #[test]
    fn no_free_wal_sender_fails_unless_ours_is_one_of_them() {
        let full = WalSenderFacts {
            max: 4,
            used: 4,
            ours_active: false,
        };
        let (problem, fix) = problem_and_fix(&judge_wal_senders("s", full));
        assert!(problem.contains("all 4 WAL senders"), "{problem}");
        assert!(fix.contains("max_wal_senders = 5"), "{fix}");
        let streaming = WalSenderFacts {
            ours_active: true,
            ..full
        };
        assert!(matches!(
            judge_wal_senders("s", streaming).outcome,
            Outcome::Pass(_)
        ));
    }

    fn default_facts() -> Facts {
        let outbox = crate::outbox::OutboxSettings::default();
        Facts {
            user: "relay".into(),
            table: outbox.table_name().expect("default table"),
        }
    }

    #[test]
    fn a_publication_must_publish_inserts_only_and_not_all_tables() {
        let facts = default_facts();
        let insert_only = PublicationFacts {
            all_tables: false,
            insert: true,
            update: false,
            delete: false,
            truncate: false,
        };
        let judged = |f: PublicationFacts| judge_publication("p", &f, "CREATE ...;", &facts, None);
        let ok = judged(insert_only);
        assert_eq!(ok[2].outcome, Outcome::Pass("insert only".into()));
        let deletes_too = PublicationFacts {
            delete: true,
            truncate: true,
            ..insert_only
        };
        let (problem, fix) = problem_and_fix(&judged(deletes_too)[2]);
        assert!(
            problem.contains("also publishes delete, truncate"),
            "{problem}"
        );
        assert_eq!(fix, "ALTER PUBLICATION \"p\" SET (publish = 'insert');");
        let no_inserts = PublicationFacts {
            insert: false,
            ..insert_only
        };
        let (problem, _) = problem_and_fix(&judged(no_inserts)[2]);
        assert!(problem.contains("does not publish inserts"), "{problem}");
        let all_tables = PublicationFacts {
            all_tables: true,
            ..insert_only
        };
        let (problem, fix) = problem_and_fix(&judged(all_tables)[1]);
        assert!(problem.contains("FOR ALL TABLES"), "{problem}");
        assert!(fix.starts_with("DROP PUBLICATION \"p\";\nCREATE"), "{fix}");
    }

    #[test]
    fn mapped_columns_must_exist_with_a_type_their_role_accepts() {
        let facts = default_facts();
        let mapped = crate::outbox::OutboxSettings::default()
            .mapped_columns()
            .unwrap();
        let all: Vec<ColumnFact> = mapped
            .iter()
            .map(|MappedColumn { column, role, .. }| ColumnFact {
                name: column.clone(),
                shown: role.fix_type().to_owned(),
                // pg_type's name of what format_type shows as bigint
                base: match role.fix_type() {
                    "bigint" => "int8".to_owned(),
                    other => other.to_owned(),
                },
            })
            .collect();
        assert!(
            matches!(
                judge_columns(&all, &facts, &mapped).outcome,
                Outcome::Pass(_)
            ),
            "{:?}",
            judge_columns(&all, &facts, &mapped)
        );
        let mut broken = all.clone();
        let missing = broken.remove(0);
        broken[0].shown = "bytea".into();
        broken[0].base = "bytea".into();
        let (problem, fix) = problem_and_fix(&judge_columns(&broken, &facts, &mapped));
        assert!(
            problem.contains(&format!("column {:?}", missing.name))
                && problem.contains("is missing"),
            "{problem}"
        );
        assert!(problem.contains("is bytea, expected"), "{problem}");
        assert!(
            fix.contains("ADD COLUMN") && fix.contains("ALTER COLUMN"),
            "{fix}"
        );
    }

    #[test]
    fn an_existing_slot_must_be_pgoutput_in_this_database_and_not_lost() {
        let good = slot_row("s", false);
        assert!(matches!(
            judge_slot("s", &good, "app").outcome,
            Outcome::Pass(_)
        ));
        let wrong_plugin = SlotRow {
            plugin: Some("wal2json".into()),
            ..good.clone()
        };
        let (problem, fix) = problem_and_fix(&judge_slot("s", &wrong_plugin, "app"));
        assert!(problem.contains("wal2json"), "{problem}");
        assert!(fix.contains("pg_drop_replication_slot('s')"), "{fix}");
        let (problem, _) = problem_and_fix(&judge_slot("s", &good, "other"));
        assert!(problem.contains("belongs to database"), "{problem}");
        let lost = SlotRow {
            wal_status: Some("lost".into()),
            ..good
        };
        let (problem, fix) = problem_and_fix(&judge_slot("s", &lost, "app"));
        assert!(problem.contains("is lost"), "{problem}");
        assert!(fix.contains("outbox-cdc repair"), "{fix}");
    }

    #[test]
    fn report_has_a_line_per_check_and_the_fix_under_each_failure() {
        let results = vec![
            pass(Item::WalLevel, "logical"),
            fail(
                Item::Publication,
                "publication \"p\" does not exist",
                "CREATE PUBLICATION ...;\nor set x",
            ),
            skip(
                Item::PublicationTables,
                "the publication does not exist yet",
            ),
        ];
        let text = render(&results);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("PASS  wal_level"), "{text}");
        assert!(lines[1].starts_with("FAIL  publication "), "{text}");
        assert!(
            lines[2].trim_start().starts_with("fix: CREATE PUBLICATION"),
            "{text}"
        );
        assert!(lines[3].trim_start().starts_with("or set x"), "{text}");
        assert!(lines[4].starts_with("SKIP  publication tables"), "{text}");
        assert_eq!(lines[5], "check FAILED: 1 passed, 1 failed, 1 skipped");
        assert!(!all_passed(&results));
        assert!(all_passed(&results[..1]));
    }
}

#[cfg(test)]
mod failover_tests {
    use super::*;

    fn facts() -> FailoverFacts {
        FailoverFacts {
            slot: "outbox_cdc".into(),
            server_version: 170004,
            in_recovery: false,
            physical_slots: vec!["standby1".into()],
            slot_failover: Some(true),
            slot_synced: Some(false),
            synchronized_standby_slots: "standby1".into(),
            failover_slot: true,
        }
    }

    /// Whether `facts` judge as a failover warning naming `needle`.
    fn warns(facts: FailoverFacts, needle: &str) -> bool {
        let judged = judge_failover(&facts);
        matches!(&judged.outcome, Outcome::Warn { problem, fix } if problem.contains(needle) || fix.contains(needle))
    }

    #[test]
    fn a_failover_slot_with_synchronized_standbys_passes() {
        assert!(matches!(judge_failover(&facts()).outcome, Outcome::Pass(_)));
        let alone = FailoverFacts {
            physical_slots: vec![],
            server_version: 150000,
            slot_failover: None,
            ..facts()
        };
        assert!(matches!(judge_failover(&alone).outcome, Outcome::Pass(_)));
    }

    #[test]
    fn what_a_failover_would_lose_is_a_warning_with_its_fix() {
        let old = FailoverFacts {
            server_version: 160000,
            slot_failover: None,
            synchronized_standby_slots: String::new(),
            ..facts()
        };
        assert!(warns(old, "outbox-cdc repair"));
        let not_flagged = FailoverFacts {
            slot_failover: Some(false),
            ..facts()
        };
        assert!(warns(
            not_flagged,
            "ALTER_REPLICATION_SLOT outbox_cdc (FAILOVER true)"
        ));
        let not_configured = FailoverFacts {
            slot_failover: None,
            failover_slot: false,
            ..facts()
        };
        assert!(warns(not_configured, "postgres.failover_slot = true"));
        let unsynchronized = FailoverFacts {
            synchronized_standby_slots: String::new(),
            ..facts()
        };
        assert!(warns(
            unsynchronized,
            "synchronized_standby_slots = 'standby1'"
        ));
        let on_standby = FailoverFacts {
            in_recovery: true,
            ..facts()
        };
        assert!(warns(on_standby, "slot is lost"));
        let synced = FailoverFacts {
            in_recovery: true,
            slot_synced: Some(true),
            ..facts()
        };
        assert!(matches!(judge_failover(&synced).outcome, Outcome::Pass(_)));
    }

    #[test]
    fn warnings_do_not_fail_the_check_but_are_counted() {
        let results = vec![
            pass(Item::Slot, "fine"),
            warn(Item::Failover, "would lose the slot", "fix it"),
        ];
        assert!(all_passed(&results));
        let text = render(&results);
        assert!(
            text.contains("WARN  failover  would lose the slot"),
            "{text}"
        );
        assert!(
            text.contains("check OK: 1 passed, 0 failed, 0 skipped, 1 warning"),
            "{text}"
        );
    }
}
