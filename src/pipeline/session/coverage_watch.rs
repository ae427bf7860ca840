//! Whether the stream still carries every outbox row (DESIGN.md §5a): the
//! proof at start-up, a re-proof every `monitor.slot_poll_interval_ms` while
//! streaming, one more at a stop, and the classification of each relation
//! the stream describes.
//!
//! pgoutput applies a publication as it was when each change was written,
//! and says nothing when it is narrowed: rows committed after an `ALTER
//! PUBLICATION` that drops the table, adds a row filter or stops publishing
//! inserts are never sent. The stream cannot show it, the catalog can. Each
//! proof reads the WAL position before the catalog; a passing proof lets the
//! acknowledged position reach that position, never beyond (the tracker's
//! ceiling), and each proof also holds the catalog rows it rests on against
//! those the earlier proofs rested on, so a narrowing undone between two
//! proofs is seen too (audit F1).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::checkpoint::AckTracker;
use crate::config::Config;
use crate::coverage::{
    self, Coverage, CoverageProblem, Known, MappedColumn, NotCovered, PublicationIdentity,
    RelationKind,
};
use crate::pg::control;
use crate::pg::{Lsn, PgConnectConfig, PgError, QualifiedTable};
use crate::pgoutput::Relation;

use crate::pipeline::PipelineError;
use crate::pipeline::delivery::Advanced;

/// SQLSTATE `cannot_connect_now`: "the database system is shutting down".
const SHUTTING_DOWN: &str = "57P03";

/// A re-proof's problems, the WAL position it proves through and the
/// catalog rows it rests on (none without a publication).
type ReproofTask =
    JoinHandle<Result<(Vec<CoverageProblem>, Lsn, Option<PublicationIdentity>), PgError>>;

/// What a proof checks, parsed once at start-up.
#[derive(Clone)]
pub(super) struct ProofTarget {
    publication: String,
    table: QualifiedTable,
    mapped: Vec<MappedColumn>,
}

impl ProofTarget {
    pub(super) fn of(config: &Config) -> Result<ProofTarget, PipelineError> {
        Ok(ProofTarget {
            publication: config.postgres.publication.clone(),
            table: coverage::configured_table(&config.outbox)?,
            mapped: config.outbox.mapped_columns()?,
        })
    }

    /// Reads the WAL position, then the catalog, and judges it: the
    /// coverage (or its problems), the position it holds for and the
    /// publication's catalog rows.
    async fn prove(
        &self,
        client: &tokio_postgres::Client,
    ) -> Result<
        (
            Result<Coverage, Vec<CoverageProblem>>,
            Lsn,
            Option<PublicationIdentity>,
        ),
        PgError,
    > {
        let through = control::wal_position(client).await?;
        let facts = coverage::gather(client, &self.table, &self.publication).await?;
        let judged = coverage::judge(&facts, &self.table, &self.publication, &self.mapped);
        Ok((judged, through, facts.publication.map(|p| p.identity)))
    }
}

/// Gathers the catalog facts (creating the publication first when configured
/// to and missing) and proves the publication covers the outbox table.
/// Returns the coverage and the WAL position the proof holds for.
pub(super) async fn prove_at_start(
    client: &tokio_postgres::Client,
    config: &Config,
    target: &ProofTarget,
) -> Result<(Coverage, Lsn), PipelineError> {
    let publication = target.publication.as_str();
    let table = &target.table;
    if config.postgres.create_publication {
        let facts = coverage::gather(client, table, publication).await?;
        if facts.publication.is_none()
            && let Some(t) = &facts.table
        {
            let partitioned = t.relkind == 'p';
            control::create_publication(client, publication, table, partitioned).await?;
            info!(publication, table = %table, partitioned, "created publication");
        }
    }
    let (judged, through, _) = target.prove(client).await?;
    let coverage = judged.map_err(|problems| PipelineError::NotCovered(NotCovered { problems }))?;
    Ok((coverage, through))
}

pub(super) struct CoverageWatch {
    /// What start-up proved the stream carries; decides every Relation.
    coverage: Coverage,
    target: ProofTarget,
    /// The session's SQL connection: relation lookups and re-proofs. `None`
    /// only in unit tests of the session, whose coverage is what they give.
    catalog: Option<Arc<tokio_postgres::Client>>,
    /// Where a closed catalog connection is asked again why it closed.
    pg: PgConnectConfig,
    interval: Duration,
    /// The running re-proof, and when the last one started.
    reproof: Option<ReproofTask>,
    reproof_started: Instant,
    /// The server was a standby when the session started: its shutdown never
    /// lifts the proof ceiling.
    on_standby: bool,
}

impl CoverageWatch {
    pub(super) fn new(
        config: &Config,
        coverage: Coverage,
        target: ProofTarget,
        catalog: tokio_postgres::Client,
        pg: PgConnectConfig,
        on_standby: bool,
    ) -> CoverageWatch {
        CoverageWatch {
            coverage,
            target,
            catalog: Some(Arc::new(catalog)),
            pg,
            interval: config.monitor.slot_poll_interval(),
            reproof: None,
            reproof_started: Instant::now(),
            on_standby,
        }
    }

    /// A watch without a catalog: its coverage is `coverage`, for good.
    #[cfg(test)]
    pub(super) fn without_catalog(config: &Config, coverage: Coverage) -> CoverageWatch {
        CoverageWatch {
            coverage,
            target: ProofTarget::of(config).expect("a valid outbox configuration"),
            catalog: None,
            pg: PgConnectConfig::parse(&config.postgres.url).expect("a valid postgres.url"),
            interval: config.monitor.slot_poll_interval(),
            reproof: None,
            reproof_started: Instant::now(),
            on_standby: false,
        }
    }

    /// What a relation the stream describes is: the outbox (the root or a
    /// partition) or another table. Start-up knowledge decides where it is
    /// certain, the catalog otherwise; a relation neither accounts for stops.
    pub(super) async fn kind_of(
        &mut self,
        relation: &Relation,
        lsn: Lsn,
    ) -> Result<RelationKind, PipelineError> {
        match self.coverage.classify(relation) {
            Known::Is(kind) => Ok(kind),
            Known::LookUp => {
                let Some(catalog) = self.catalog.as_ref() else {
                    return Err(PipelineError::Internal {
                        what: format!("no catalog to look up relation OID {}", relation.oid),
                    });
                };
                let now = coverage::lookup(catalog, relation.oid, self.coverage.root_oid()).await?;
                Ok(self.coverage.resolve(relation, lsn, now.as_ref())?)
            }
        }
    }

    /// Takes the result of a finished re-proof (a problem stops the session;
    /// a pass raises the tracker's ceiling) and starts the next one when due.
    pub(super) fn poll(&mut self, tracker: &mut AckTracker) -> Result<Advanced, PipelineError> {
        let Some(catalog) = self.catalog.clone() else {
            return Ok(Advanced(false));
        };
        let mut advanced = false;
        if let Some(running) = self.reproof.as_mut() {
            let Some(done) = futures_util::FutureExt::now_or_never(running) else {
                return Ok(Advanced(false));
            };
            self.reproof = None;
            match done {
                Ok(Ok((problems, _, _))) if !problems.is_empty() => {
                    return Err(PipelineError::CoverageLost(NotCovered { problems }));
                }
                Ok(Ok((_, through, identity))) => {
                    // Also what the catalog looked like in between: a
                    // narrowing undone since leaves its trace here.
                    if let Some(identity) = identity {
                        self.coverage
                            .reconfirm(&self.target.publication, &identity)
                            .map_err(|problem| {
                                PipelineError::CoverageLost(NotCovered {
                                    problems: vec![problem],
                                })
                            })?;
                    }
                    advanced = tracker.prove_through(through).is_some();
                }
                // On a standby the ceiling stays: a PG16 run lost rows when the
                // position a shutting-down standby's walsender reported was
                // acknowledged (CI, tests/standby/standby_decoding.rs); its restart
                // then waits up to wal_sender_timeout instead.
                Ok(Err(e)) if e.sqlstate() == Some(SHUTTING_DOWN) && !self.on_standby => {
                    // No transaction can commit any more, and the server's
                    // walsender waits (up to wal_sender_timeout) for us to
                    // confirm everything it sent before it lets the shutdown
                    // finish: acknowledge the rest without a proof.
                    info!(
                        "the server is shutting down: acknowledging what it sends without a coverage proof"
                    );
                    advanced = tracker.lift_ceiling().is_some();
                }
                Ok(Err(e @ PgError::WrongServerKind { .. })) => {
                    // Fenced (made read-only) or demoted while we streamed:
                    // leave it; the reconnect passes it over.
                    warn!(error = %e, "the server no longer fits target_session_attrs; reconnecting");
                    return Err(PipelineError::Pg(e));
                }
                Ok(Err(e)) => {
                    warn!(error = %e, "re-proving the publication's coverage failed; trying again later")
                }
                Err(e) => {
                    warn!(error = %e, "the coverage re-proof task failed; trying again later")
                }
            }
        }
        // A closed catalog connection is asked about at once (a server
        // shutdown closes it first, then waits for us to confirm its WAL).
        let since = self.reproof_started.elapsed();
        if since < self.interval && !(catalog.is_closed() && since >= Duration::from_millis(500)) {
            return Ok(Advanced(advanced));
        }
        self.reproof_started = Instant::now();
        let client = catalog;
        let target = self.target.clone();
        let pg = self.pg.clone();
        let attrs = pg.session_attrs();
        self.reproof = Some(tokio::spawn(async move {
            if client.is_closed() {
                // Closed under us: a new connection says why (57P03 while the
                // server shuts down).
                pg.connect_sql().await?;
                return Err(PgError::Closed {
                    addr: pg.redacted(),
                    during: "re-proving coverage (the session's SQL connection closed)",
                });
            }
            if attrs.needs_check() {
                let kind = control::server_kind(&client).await?;
                if !attrs.accepts(Some(kind)) {
                    return Err(PgError::WrongServerKind {
                        addr: "the connected server".into(),
                        wanted: attrs.name(),
                        got: kind.describe(),
                    });
                }
            }
            let (judged, through, identity) = target.prove(&client).await?;
            Ok((judged.err().unwrap_or_default(), through, identity))
        }));
        Ok(Advanced(advanced))
    }

    /// At a stop: one more proof, so that what was delivered since the last
    /// one is acknowledged (bounded; on failure the next start re-sends it,
    /// or refuses to start if the publication was narrowed).
    pub(super) async fn final_proof(&mut self, tracker: &mut AckTracker) {
        let Some(catalog) = self.catalog.as_ref() else {
            return;
        };
        let proof = self.target.prove(catalog);
        match tokio::time::timeout(Duration::from_secs(5), proof).await {
            Ok(Ok((Ok(_), through, identity))) => {
                // A narrowing undone since the last proof is seen here too.
                let changed = identity.and_then(|identity| {
                    self.coverage
                        .reconfirm(&self.target.publication, &identity)
                        .err()
                });
                match changed {
                    None => {
                        tracker.prove_through(through);
                    }
                    Some(problem) => warn!(problem = %problem,
                        "the publication changed since the last proof: what was delivered since then is not acknowledged"),
                }
            }
            Ok(Ok((Err(problems), _, _))) => warn!(
                problems = %NotCovered { problems },
                "the publication no longer carries the outbox: what was delivered since the last proof is not \
                 acknowledged"
            ),
            Ok(Err(e)) => {
                warn!(error = %e, "the final coverage proof failed; the next start re-sends what was delivered since the last one")
            }
            Err(_) => warn!(
                "the final coverage proof timed out; the next start re-sends what was delivered since the last one"
            ),
        }
    }
}
