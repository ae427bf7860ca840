//! `outbox-cdc` command line: run the relay, or inspect its state.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use tokio::sync::watch;
use tracing::{error, info};

use outbox_cdc::config::Config;
use outbox_cdc::metrics::Metrics;
use outbox_cdc::{http, pipeline, status};

#[derive(Parser)]
#[command(name = "outbox-cdc", version, about = "Transactional outbox relay: PostgreSQL logical replication (pgoutput) to Kafka")]
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
        /// The slot was lost and an offset is stored: recreate the slot at the
        /// current WAL position and forget the offset (changes in between are NOT published).
        #[arg(long)]
        recreate_slot: bool,
    },
    /// Show the stored offset and the slot's position and lag.
    Status {
        #[arg(long, short)]
        config: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Parse and validate the configuration file, then exit.
    ValidateConfig {
        #[arg(long, short)]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run { config, recreate_slot } => {
            let config = Arc::new(load(&config)?);
            let metrics = Arc::new(Metrics::default());
            let (stop_tx, stop_rx) = watch::channel(false);
            tokio::spawn(async move {
                wait_for_signal().await;
                info!("signal received: stopping");
                let _ = stop_tx.send(true);
            });
            let _http = http::serve(&config.http.listen, metrics.clone())
                .await
                .with_context(|| format!("cannot listen on http.listen = {}", config.http.listen))?;
            pipeline::run(config, pipeline::RunOptions { recreate_slot }, metrics, stop_rx).await?;
            Ok(())
        }
        Command::Status { config, json } => {
            let config = load(&config)?;
            let report = status::collect(&config).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.to_table());
            }
            Ok(())
        }
        Command::ValidateConfig { config } => {
            let cfg = load(&config)?;
            println!("{}: ok (slot {}, table {})", config.display(), cfg.postgres.slot, cfg.outbox.table);
            Ok(())
        }
    }
}

fn load(path: &std::path::Path) -> anyhow::Result<Config> {
    Ok(Config::load(path)?)
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        // Without signal handlers the process still stops on SIGKILL; nothing else to do.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
