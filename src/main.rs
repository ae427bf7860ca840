//! `outbox-cdc` command line: run the relay, or inspect its state.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use tracing::{Instrument, error};

use outbox_cdc::checkpoint::OffsetStore;
use outbox_cdc::config::{Config, LogFormat};
use outbox_cdc::metrics::Metrics;
use outbox_cdc::{check, pipeline, relay, status};

#[derive(Parser)]
#[command(
    name = "outbox-cdc",
    version,
    about = "Transactional outbox relay: PostgreSQL logical replication (pgoutput) to Kafka"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Stream outbox inserts to Kafka until SIGINT/SIGTERM.
    Run {
        /// TOML configuration file (keys can be overridden with OUTBOX_CDC__SECTION__KEY).
        #[arg(long, short)]
        config: PathBuf,
        /// The slot was lost and an offset is stored: recreate the slot, publish
        /// the retained outbox rows committed since the last acknowledged
        /// transaction (gap repair), then stream.
        #[arg(long)]
        recreate_slot: bool,
        /// Repair even though the outbox no longer holds rows from before the
        /// last acknowledged commit (rows deleted in between are not repaired).
        #[arg(long)]
        accept_gap: bool,
    },
    /// Gap repair after a lost slot, then exit: recreate the slot with an
    /// exported snapshot, publish the retained outbox rows committed since the
    /// last acknowledged transaction, store the new position. Also finishes an
    /// interrupted repair. `run` then streams from there.
    Repair {
        #[arg(long, short)]
        config: PathBuf,
        /// See `run --accept-gap`.
        #[arg(long)]
        accept_gap: bool,
    },
    /// Show the stored offset, the running connector (if any) and the slot's
    /// position and lag. Works while the connector runs and while it is stopped.
    /// Exits 1 when the database cannot be asked.
    Status {
        #[arg(long, short)]
        config: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Preflight the database and Kafka for this configuration; prints PASS/FAIL
    /// per check with the fix for each failure. Exits 1 unless every check passes.
    Check {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Release a parked aggregate (on_poison = "dead-letter"): its later events go
    /// to their topic again. Stop the connector first (it holds the offset store).
    Release {
        #[arg(long, short)]
        config: PathBuf,
        aggregate_type: String,
        aggregate_id: String,
    },
    /// List the parked aggregates. Stop the connector first (it holds the offset store).
    Parked {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Compare the retained outbox rows of a time window with Kafka: rows
    /// missing from Kafka, rows on the dead-letter topic (dead-lettered, not
    /// missing), records with no row (phantoms), duplicates, and per-key
    /// order. Exits 1 on missing rows or order violations.
    Audit {
        #[arg(long, short)]
        config: PathBuf,
        #[command(flatten)]
        window: RowWindow,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Publish the missing rows again (like `replay`, in per-aggregate
        /// sequence order), then audit the window again. Exits 0 when nothing
        /// is missing after it and no key was out of order before it. Rows of
        /// an aggregate parked behind a dead-lettered event are not published
        /// (they are listed as skipped, with why).
        #[arg(long)]
        repair: bool,
    },
    /// Publish retained outbox rows again, in per-aggregate sequence order, for
    /// a consumer that lost its state. Reads the table and produces; needs
    /// neither the offset store nor the slot, so the connector may run.
    Replay {
        #[arg(long, short)]
        config: PathBuf,
        #[command(flatten)]
        window: RowWindow,
        /// Only this aggregate id.
        #[arg(long)]
        aggregate_id: Option<String>,
        /// Appended to every record's topic, e.g. `.replay`.
        #[arg(long, default_value = "")]
        topic_suffix: String,
        /// Count what would be sent, per topic; send nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete outbox rows older than [prune] retention that are certainly
    /// published (committed before the stored acknowledged position), once.
    /// Stop the connector first (it holds the offset store); a running
    /// connector prunes by itself every [prune] interval.
    Prune {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Parse and validate the configuration file, then exit.
    ValidateConfig {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Write the outbox-cdc configuration equivalent to a Debezium PostgreSQL
    /// connector with the Outbox Event Router, and list (on stderr, and as
    /// comments in the file) each Debezium setting that has no equivalent.
    ImportDebezium {
        /// The connector's config: Kafka Connect JSON or a .properties file.
        input: PathBuf,
        /// Where to write the TOML; default standard output. An existing file
        /// is not overwritten.
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
}

/// The retained rows `audit` and `replay` read, by their occurred_at.
#[derive(clap::Args)]
struct RowWindow {
    /// Rows with occurred_at at or after this time (RFC 3339, such as
    /// 2026-12-01T10:00:00Z). `replay` also takes an event_id: its row and
    /// every later one (occurred_at at or after its occurred_at, and for its
    /// own aggregate, sequence at or after its sequence).
    #[arg(long)]
    since: String,
    /// Rows with occurred_at before this time (exclusive; default: now).
    #[arg(long)]
    until: Option<String>,
    /// Only this aggregate type.
    #[arg(long)]
    aggregate_type: Option<String>,
}

impl Command {
    /// The subcommand's name and its `--config` file.
    fn describe(&self) -> (&'static str, &Path) {
        match self {
            Command::Run { config, .. } => ("run", config),
            Command::Repair { config, .. } => ("repair", config),
            Command::Audit { config, .. } => ("audit", config),
            Command::Status { config, .. } => ("status", config),
            Command::Check { config } => ("check", config),
            Command::Release { config, .. } => ("release", config),
            Command::Parked { config } => ("parked", config),
            Command::Replay { config, .. } => ("replay", config),
            Command::Prune { config } => ("prune", config),
            Command::ValidateConfig { config } => ("validate-config", config),
            Command::ImportDebezium { input, .. } => ("import-debezium", input),
        }
    }
}

/// Logs go to stderr, coloured only when stderr is a terminal (a file or a
/// pipe gets no escape sequences), as text or as one JSON object per line
/// per `log.format`. The format is read from the configuration before the
/// command runs; a configuration that does not load gets text, and the
/// command then reports why it does not load.
fn init_logging(config: Option<&Path>) {
    let format = config
        .and_then(|c| Config::load(c).ok())
        .map(|c| c.log.format)
        .unwrap_or_default();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(true)
            .init(),
    }
}

/// glibc gives every thread that allocates an arena of its own, up to eight
/// per core, and memory freed inside an arena stays resident. The session
/// runs on whichever runtime thread picks it up (a `block_in_place` hands
/// its worker to another thread), so its buffers came from a dozen arenas:
/// a 1,000,000-row transaction peaked at 57-134 MiB of RSS, against 38-55
/// MiB with two arenas (docs/performance.md, "Malloc arenas", which also
/// gives the CPU pairs still to be measured again on a quiet machine).
/// Must run before any thread starts. An operator's `MALLOC_ARENA_MAX` is
/// left in force.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn limit_malloc_arenas() {
    const ARENAS: libc::c_int = 2;
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets a parameter of the allocator; no other
        // thread exists yet to allocate concurrently.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, ARENAS) };
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn limit_malloc_arenas() {}

/// The offset store for `parked` and `release` (review F12, F13): never
/// created (a mistyped `offsets.path` would otherwise read as "nothing
/// parked"), and a store a connector holds is named as such.
fn existing_store(config: &Config, command: &str) -> anyhow::Result<OffsetStore> {
    let path = &config.offsets.path;
    if !path.exists() {
        anyhow::bail!(
            "no offset store at {} (offsets.path): no connector with this configuration has run here; \
             check offsets.path (nothing was created)",
            path.display()
        );
    }
    match OffsetStore::open(path) {
        Err(outbox_cdc::checkpoint::StoreError::Locked { .. }) => anyhow::bail!(
            "offset store {}: a running connector holds it; `{command}` works on a stopped \
             connector's store: stop the connector that uses offsets.path {}, run `{command}` again, \
             then start it",
            path.display(),
            path.display()
        ),
        other => Ok(other?),
    }
}

/// `release` with parking shared between instances: the shared table's row
/// goes (a running connector drops its copy within the refresh interval),
/// and so does this host's copy when no connector holds the store (a store
/// that never shared its parks would copy it back into the table).
async fn release_shared(
    config: &Config,
    table: &outbox_cdc::parking::ParkedTable,
    aggregate_type: &str,
    aggregate_id: &str,
) -> anyhow::Result<bool> {
    let in_table = table.release(aggregate_type, aggregate_id).await?;
    // Never created here; a store a connector holds is left to its refresh.
    let here = match config.offsets.path.exists() {
        true => match OffsetStore::open(&config.offsets.path) {
            Ok(store) => store.release(aggregate_type, aggregate_id)?,
            Err(_) => false,
        },
        false => false,
    };
    if in_table || here {
        println!(
            "released {aggregate_type}/{aggregate_id} (table {}): its next events go to their topic; \
             a running connector takes it up within {} s",
            table.name(),
            outbox_cdc::parking::REFRESH_INTERVAL.as_secs()
        );
        Ok(true)
    } else {
        println!(
            "{aggregate_type}/{aggregate_id} was not parked (table {})",
            table.name()
        );
        Ok(false)
    }
}

/// After an audit repair that left nothing missing: the coverage breaks the
/// audited window covers are repaired, so `run` may start again (they are
/// stored in the offset store, which a running connector holds).
/// Says what it cleared on stderr (stdout may be `--json`).
fn clear_coverage_breaks(config: &outbox_cdc::config::Config, (since, until): (i64, i64)) {
    let slot = &config.postgres.slot;
    if !config.offsets.path.exists() {
        return;
    }
    // The start's refusal widens each break by the margin on both sides:
    // rows are chosen by occurred_at, which precedes the commit and may come
    // from another clock.
    let margin = (config.repair.occurred_at_margin_ms as i64).saturating_mul(1000);
    let cleared =
        outbox_cdc::checkpoint::OffsetStore::open(&config.offsets.path).and_then(|store| {
            store.clear_coverage_breaks(
                slot,
                since.saturating_add(margin),
                until.saturating_sub(margin),
            )
        });
    match cleared {
        Ok(cleared) => {
            for b in cleared {
                eprintln!(
                    "coverage break of slot {slot:?} from {} to {} repaired and cleared ({})",
                    outbox_cdc::pg::PgTimestamp(b.since_micros).rfc3339(),
                    outbox_cdc::pg::PgTimestamp(b.until_micros).rfc3339(),
                    b.what
                );
            }
        }
        Err(e) => eprintln!(
            "coverage breaks in this window were not cleared: {e} (a stored break keeps `run` from starting; run \
             this audit again while no connector holds offsets.path)"
        ),
    }
}

fn main() -> ExitCode {
    limit_malloc_arenas();
    let cli = Cli::parse();
    let (name, config) = cli.command.describe();
    // import-debezium's file is a Debezium config (perhaps a pipe read once),
    // not ours: its logs are text.
    let ours = !matches!(cli.command, Command::ImportDebezium { .. });
    init_logging(ours.then_some(config));
    // Every log line of the command carries its name and configuration file.
    let span = tracing::info_span!("outbox_cdc", command = %name, config = %config.display());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // On a worker thread, not the main thread: the pipeline then shares the
    // runtime's threads with the feedback writer and librdkafka's wake-ups
    // instead of handing off to them (measured: -18 to -24% CPU per event).
    let outcome = runtime.block_on(async {
        tokio::spawn(dispatch(cli.command).instrument(span))
            .await
            .unwrap_or_else(|e| Err(anyhow::anyhow!("the command task failed: {e}")))
    });
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            let text = render(&e);
            // The pipeline logged its own stop ("stopping: this failure needs
            // an operator"); anything else is logged here, once.
            let logged = matches!(
                e.downcast_ref::<relay::RelayError>(),
                Some(relay::RelayError::Pipeline(_))
            );
            if !logged {
                error!("{text}");
            }
            eprintln!("error: {text}");
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each said once. Most of our errors quote their
/// source in their own text (`"Kafka: {0}"` over a `#[from]` source), so a
/// cause whose text the message already holds is not repeated.
fn render(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if part.is_empty() || text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

/// Runs one command; `Ok(false)` means "done, but exit non-zero".
async fn dispatch(command: Command) -> anyhow::Result<bool> {
    match command {
        Command::Run {
            config,
            recreate_slot,
            accept_gap,
        } => {
            let options = pipeline::RunOptions {
                recreate_slot,
                accept_gap,
                ..Default::default()
            };
            relay::run_until_signal(Arc::new(load(&config)?), options).await?;
            Ok(true)
        }
        Command::Repair { config, accept_gap } => {
            let options = pipeline::RunOptions {
                recreate_slot: true,
                accept_gap,
                repair_only: true,
                ..Default::default()
            };
            relay::run_until_signal(Arc::new(load(&config)?), options).await?;
            Ok(true)
        }
        Command::Status { config, json } => {
            let config = load(&config)?;
            let report = status::collect(&config).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.to_table());
            }
            Ok(report.database_error.is_none())
        }
        Command::Check { config } => {
            let config = load(&config)?;
            let results = check::run(&config).await;
            print!("{}", check::render(&results));
            Ok(check::all_passed(&results))
        }
        Command::Release {
            config,
            aggregate_type,
            aggregate_id,
        } => {
            let config = load(&config)?;
            if let Some(table) = outbox_cdc::parking::ParkedTable::of(&config)? {
                return release_shared(&config, &table, &aggregate_type, &aggregate_id).await;
            }
            let store = existing_store(&config, "release")?;
            if store.release(&aggregate_type, &aggregate_id)? {
                println!(
                    "released {aggregate_type}/{aggregate_id}: its next events go to their topic"
                );
                Ok(true)
            } else {
                println!("{aggregate_type}/{aggregate_id} was not parked");
                Ok(false)
            }
        }
        Command::Parked { config } => {
            let config = load(&config)?;
            let parked = match outbox_cdc::parking::ParkedTable::of(&config)? {
                Some(table) => table.list().await?,
                None => existing_store(&config, "parked")?.parked()?,
            };
            for p in parked {
                println!(
                    "{}\t{}\tLSN {}\t{}",
                    p.aggregate_type, p.aggregate_id, p.lsn, p.reason
                );
            }
            Ok(true)
        }
        Command::Audit {
            config,
            window,
            json,
            repair,
        } => {
            let config = load(&config)?;
            let RowWindow {
                since,
                until,
                aggregate_type,
            } = window;
            let options = outbox_cdc::audit::AuditOptions {
                since,
                until,
                aggregate_type,
                max_examples: 100,
                progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            };
            let report = outbox_cdc::audit::run(&config, &options).await?;
            if !repair {
                if json {
                    println!("{}", serde_json::to_string_pretty(&report)?);
                } else {
                    print!("{}", report.to_text());
                }
                return Ok(report.passed());
            }
            let outcome = outbox_cdc::audit::repair(&config, &options, &report).await?;
            if json {
                let all = serde_json::json!({
                    "found": report,
                    "republished": outcome.replayed.total(),
                    "republished_by_topic": outcome.replayed.by_topic,
                    "skipped": outcome.skipped,
                    "skipped_rows": outcome.skipped_rows,
                    "after": outcome.after,
                });
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else {
                print!("{}", report.to_text());
                print!("repair: {}", outcome.replayed);
                if outcome.skipped > 0 {
                    println!(
                        "repair: skipped {} missing rows of parked aggregates:",
                        outcome.skipped
                    );
                }
                for h in &outcome.skipped_rows {
                    println!(
                        "  skipped {}/{} {}: {}",
                        h.aggregate_type, h.aggregate_id, h.event_id, h.reason
                    );
                }
                print!("after the repair:\n{}", outcome.after.to_text());
            }
            // Coverage breaks are about missing rows: cleared once none is
            // missing, for every aggregate type of the window.
            if outcome.after.missing == 0 && options.aggregate_type.is_none() {
                clear_coverage_breaks(&config, report.window_micros());
            }
            Ok(outcome.after.missing == 0 && report.order_violations == 0)
        }
        Command::Replay {
            config,
            window,
            aggregate_id,
            topic_suffix,
            dry_run,
        } => {
            let config = load(&config)?;
            let options = pipeline::ReplayOptions {
                since: window.since,
                until: window.until,
                aggregate_type: window.aggregate_type,
                aggregate_id,
                topic_suffix,
                dry_run,
                ..pipeline::ReplayOptions::default()
            };
            let report = pipeline::replay(&config, &options).await?;
            print!("{report}");
            Ok(true)
        }
        Command::Prune { config } => {
            let config = load(&config)?;
            let report = pipeline::prune_stored(&config, &Metrics::default()).await?;
            println!("{report}");
            Ok(true)
        }
        Command::ValidateConfig { config } => {
            let cfg = load(&config)?;
            println!(
                "{}: ok (slot {}, table {})",
                config.display(),
                cfg.postgres.slot,
                cfg.outbox.table
            );
            Ok(true)
        }
        Command::ImportDebezium { input, output } => import_debezium(&input, output.as_deref()),
    }
}

fn load(path: &std::path::Path) -> anyhow::Result<Config> {
    Ok(Config::load(path)?)
}

/// `import-debezium`: the TOML to `output` (or stdout), the notes to stderr.
fn import_debezium(input: &Path, output: Option<&Path>) -> anyhow::Result<bool> {
    let text = std::fs::read_to_string(input)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", input.display()))?;
    let parsed = outbox_cdc::debezium::parse_connector(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", input.display()))?;
    let imported = outbox_cdc::debezium::import(&parsed)
        .map_err(|e| anyhow::anyhow!("{}: {e}", input.display()))?;
    // What is written must load: a failure here is a bug of the import.
    Config::from_sources("imported", &imported.toml, Vec::<(String, String)>::new())
        .map_err(|e| anyhow::anyhow!("the imported configuration does not load: {e}"))?;
    match output {
        Some(path) => {
            use std::io::Write as _;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))?;
            file.write_all(imported.toml.as_bytes())
                .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
            eprintln!("wrote {}", path.display());
        }
        None => print!("{}", imported.toml),
    }
    if imported.notes.is_empty() {
        eprintln!("every setting has an equivalent");
    } else {
        eprintln!(
            "{} Debezium setting(s) carried over differently, or without an equivalent:",
            imported.notes.len()
        );
        for n in &imported.notes {
            eprintln!("  {}: {}", n.key, n.why);
        }
    }
    if !imported.withheld.is_empty() {
        eprintln!(
            "{} secret(s) not written to the file; give each in the environment:",
            imported.withheld.len()
        );
        for w in &imported.withheld {
            eprintln!("  {}: {}", w.key, w.instead);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 28: the CI log showed one Kafka failure three times on one line
    /// (the error, its source quoted, the source again).
    #[test]
    fn an_error_and_its_quoted_sources_are_rendered_once() {
        let sink = outbox_cdc::sink::SinkError::OffsetsTopicUnavailable {
            topic: "outbox-cdc.offsets".into(),
            reason: "reading it: Message consumption error: BrokerTransportFailure".into(),
        };
        let e = anyhow::Error::from(relay::RelayError::Pipeline(pipeline::PipelineError::Sink(
            sink.clone(),
        )));
        assert!(e.chain().count() >= 2, "the source is chained");
        let text = render(&e);
        assert_eq!(text.matches(&sink.to_string()).count(), 1, "{text}");
        assert!(text.starts_with("Kafka: offsets topic"), "{text}");
        // A context that does not quote its cause still shows it.
        let io = std::io::Error::other("permission denied");
        let e = anyhow::Error::from(io).context("cannot read config.toml");
        assert_eq!(render(&e), "cannot read config.toml: permission denied");
    }
}
