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
use tracing::{error, info, warn};

use crate::checkpoint::{AckTracker, CoverageBreak, CoverageRecord, OffsetStore};
use crate::config::Config;
use crate::coverage::{
    self, Coverage, CoverageProblem, EntryFacts, IdentityEntry, Known, MappedColumn, NotCovered,
    PublicationIdentity, RelationKind,
};
use crate::pg::control;
use crate::pg::{Lsn, PgConnectConfig, PgError, PgTimestamp, QualifiedTable};
use crate::pgoutput::Relation;

use crate::error::PipelineError;
use crate::error::StartRefused;
use crate::pipeline::delivery::Advanced;
use crate::pipeline::options::BreakRepair;

/// SQLSTATE `cannot_connect_now`: "the database system is shutting down".
const SHUTTING_DOWN: &str = "57P03";

/// How often a passing proof refreshes the stored time of the last passing
/// proof (a break found at a later start reaches back to it).
const PROOF_RECORD_EVERY: Duration = Duration::from_secs(60);

/// A re-proof's outcome and, when the session's SQL connection had closed,
/// the new one it was made on.
type ReproofTask = JoinHandle<Result<(Proof, Option<tokio_postgres::Client>), PgError>>;

/// What a proof checks, parsed once at start-up.
#[derive(Clone)]
pub(super) struct ProofTarget {
    publication: String,
    table: QualifiedTable,
    mapped: Vec<MappedColumn>,
}

/// One proof: the problems it found (none: it passed), the WAL position it
/// holds for, when the server read the catalog, the catalog rows it rests on
/// (none without a publication) and what became of an earlier baseline's
/// entries.
pub(super) struct Proof {
    problems: Vec<CoverageProblem>,
    through: Lsn,
    read_at: PgTimestamp,
    identity: Option<PublicationIdentity>,
    found: EntryFacts,
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
    /// coverage (or its problems) and the proof, held against `baseline`
    /// when given.
    async fn prove(
        &self,
        client: &tokio_postgres::Client,
        baseline: Option<&PublicationIdentity>,
    ) -> Result<(Result<Coverage, Vec<CoverageProblem>>, Proof), PgError> {
        let through = control::wal_position(client).await?;
        let facts = coverage::gather(client, &self.table, &self.publication).await?;
        let judged = coverage::judge(&facts, &self.table, &self.publication, &self.mapped);
        let found = match baseline {
            Some(baseline) => coverage::entry_facts(client, &facts, baseline).await?,
            None => EntryFacts::default(),
        };
        let proof = Proof {
            problems: judged.as_ref().err().cloned().unwrap_or_default(),
            through,
            read_at: facts.read_at,
            identity: facts.publication.map(|p| p.identity),
            found,
        };
        Ok((judged, proof))
    }
}

/// The proofs' durable side (issue 47): the baseline they rest on and the
/// breaks not yet repaired, stored next to the slot's offset, for the
/// database cluster the offset belongs to.
#[derive(Clone)]
pub(super) struct ProofRecord {
    store: Arc<OffsetStore>,
    slot: String,
    /// The server's system identifier: a record of another cluster is left
    /// alone (the start is refused for the offset anyway).
    system_id: String,
    /// The `--config` argument of the command a refusal names.
    config: String,
    /// `repair.occurred_at_margin_ms`: audits choose rows by `occurred_at`,
    /// which precedes the commit.
    margin_micros: i64,
}

impl ProofRecord {
    pub(super) fn of(config: &Config, store: &Arc<OffsetStore>, system_id: &str) -> ProofRecord {
        ProofRecord {
            store: Arc::clone(store),
            slot: config.postgres.slot.clone(),
            system_id: system_id.to_owned(),
            config: config.config_argument(),
            margin_micros: (config.repair.occurred_at_margin_ms as i64).saturating_mul(1000),
        }
    }

    /// The record of this slot and cluster, if one is stored.
    fn load(&self) -> Result<Option<CoverageRecord>, PipelineError> {
        let record = tokio::task::block_in_place(|| self.store.coverage(&self.slot))?;
        Ok(record.filter(|r| r.system_id == self.system_id))
    }

    /// Whether an offset is stored for the slot.
    fn has_offset(&self) -> Result<bool, PipelineError> {
        Ok(tokio::task::block_in_place(|| self.store.load(&self.slot))?.is_some())
    }

    /// Changes the stored record with `change` (a new one when none is
    /// stored); a record of another cluster is not touched.
    fn update(&self, change: impl FnOnce(&mut CoverageRecord)) -> Result<(), PipelineError> {
        tokio::task::block_in_place(|| {
            let stored = self.store.coverage(&self.slot)?;
            if stored
                .as_ref()
                .is_some_and(|r| r.system_id != self.system_id)
            {
                return Ok(());
            }
            let mut record = stored.unwrap_or_default();
            record.v = 1;
            record.system_id.clone_from(&self.system_id);
            change(&mut record);
            self.store.save_coverage(&self.slot, &record)
        })?;
        Ok(())
    }

    /// Stores `identity` as the baseline, proven at `at`.
    fn save_baseline(
        &self,
        identity: &PublicationIdentity,
        at: PgTimestamp,
    ) -> Result<(), PipelineError> {
        self.update(|record| {
            record.proven_at_micros = at.0;
            record.publication = identity.publication;
            record.root = identity.root;
            record.leaves_as_root = identity.leaves_as_root;
            record.entries = identity
                .entries
                .iter()
                .map(|e| (e.kind, e.oid, e.xmin, e.target))
                .collect();
            record.storage = identity.storage.iter().map(|(o, n)| (*o, *n)).collect();
        })
    }

    /// Stores a break, keeping the baseline: one that starts where the last
    /// stored one starts extends it.
    fn add_break(&self, found: CoverageBreak) -> Result<(), PipelineError> {
        self.update(|record| match record.breaks.last_mut() {
            Some(last) if last.since_micros == found.since_micros => {
                last.until_micros = last.until_micros.max(found.until_micros);
                if !last.what.contains(&found.what) {
                    last.what = format!("{}; {}", last.what, found.what);
                }
            }
            _ => record.breaks.push(found),
        })
    }

    /// The refusal a start gives while breaks are stored.
    fn refusal(&self, breaks: &[CoverageBreak]) -> Option<StartRefused> {
        StartRefused::coverage_broken(&self.slot, self.config.clone(), self.margin_micros, breaks)
    }
}

/// The problems, one after the other, for a break's description.
fn joined(problems: &[CoverageProblem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn baseline_of(record: &CoverageRecord) -> PublicationIdentity {
    PublicationIdentity {
        publication: record.publication,
        leaves_as_root: record.leaves_as_root,
        entries: record
            .entries
            .iter()
            .map(|&(kind, oid, xmin, target)| IdentityEntry {
                kind,
                oid,
                xmin,
                target,
            })
            .collect(),
        storage: record.storage.iter().copied().collect(),
        root: record.root,
    }
}

/// What the start-up proof hands to the session's watch.
pub(super) struct StartProof {
    pub(super) coverage: Coverage,
    pub(super) target: ProofTarget,
    pub(super) record: ProofRecord,
    /// The server's clock when it read the catalog.
    pub(super) at: PgTimestamp,
}

/// `postgres.create_publication`: the publication, created for the table
/// (through its root when partitioned) when it does not exist.
async fn create_publication_if_missing(
    client: &tokio_postgres::Client,
    target: &ProofTarget,
) -> Result<(), PipelineError> {
    let (publication, table) = (target.publication.as_str(), &target.table);
    let facts = coverage::gather(client, table, publication).await?;
    if facts.publication.is_none()
        && let Some(t) = &facts.table
    {
        let partitioned = t.relkind == 'p';
        control::create_publication(client, publication, table, partitioned).await?;
        info!(publication, table = %table, partitioned, "created publication");
    }
    Ok(())
}

/// A stored coverage break refuses the start, naming the command, unless
/// the live witness repairs its window now (it is on, and no row stays
/// missing).
async fn refuse_unrepaired_breaks(
    config: &Config,
    record: &ProofRecord,
    break_repair: Option<BreakRepair>,
) -> Result<(), PipelineError> {
    let breaks = record.load()?.map(|r| r.breaks).unwrap_or_default();
    let Some(refused) = record.refusal(&breaks) else {
        return Ok(());
    };
    let repaired = match break_repair.filter(|_| config.reconcile.enabled) {
        Some(repair) => repair(config, &record.store, &breaks, &refused).await?,
        None => false,
    };
    match repaired {
        true => Ok(()),
        false => Err(refused.into()),
    }
}

/// Gathers the catalog facts (creating the publication first when configured
/// to and missing) and proves the publication covers the outbox table, also
/// against what the last session's proofs rested on: a change made while the
/// connector was stopped is a coverage break, stored, and every start refuses
/// while one is stored. Returns the proof and the WAL position it holds for.
pub(super) async fn prove_at_start(
    client: &tokio_postgres::Client,
    config: &Config,
    target: ProofTarget,
    record: ProofRecord,
    break_repair: Option<BreakRepair>,
) -> Result<(StartProof, Lsn), PipelineError> {
    let publication = target.publication.as_str();
    if config.postgres.create_publication {
        create_publication_if_missing(client, &target).await?;
    }
    let stored = record.load()?;
    let baseline = stored
        .as_ref()
        .map(|s| (baseline_of(s), s.proven_at_micros));
    let (judged, proof) = target
        .prove(client, baseline.as_ref().map(|(b, _)| b))
        .await?;
    let coverage = match judged {
        Ok(coverage) => coverage,
        Err(problems) => {
            // Not covered now: if it was at the last proof, rows committed
            // since may be lost already; the break outlives the fix.
            if let Some((_, proven_at)) = &baseline
                && problems.iter().any(CoverageProblem::hides_rows)
            {
                record.add_break(CoverageBreak {
                    since_micros: *proven_at,
                    until_micros: proof.read_at.0.max(*proven_at),
                    what: format!("seen at start-up: {}", joined(&problems)),
                })?;
            }
            return Err(PipelineError::NotCovered(NotCovered { problems }));
        }
    };
    let Some(now) = proof.identity.as_ref() else {
        return Err(PipelineError::Internal {
            what: "a passing coverage proof without a publication".to_owned(),
        });
    };
    match baseline {
        Some((baseline, proven_at)) => {
            let mut held = coverage.clone().resting_on(baseline);
            if let Err(problem) = held.reconfirm(publication, now, &proof.found) {
                error!(problem = %problem, since = %PgTimestamp(proven_at).rfc3339(),
                    "the publication changed while the connector was stopped: recorded as a coverage break");
                record.add_break(CoverageBreak {
                    since_micros: proven_at,
                    until_micros: proof.read_at.0.max(proven_at),
                    what: format!("seen at start-up: {problem}"),
                })?;
            }
        }
        // An offset but no baseline: the first start of a version that
        // stores one (a first start has neither).
        None if record.has_offset()? => warn!(slot = %config.postgres.slot,
            "no coverage baseline is stored for this slot yet (the first start of a version that stores one): \
             a publication change made while the connector was stopped cannot be seen this once"),
        None => {}
    }
    // It passes now: the baseline from here on.
    record.save_baseline(now, proof.read_at)?;
    refuse_unrepaired_breaks(config, &record, break_repair).await?;
    Ok((
        StartProof {
            coverage,
            target,
            record,
            at: proof.read_at,
        },
        proof.through,
    ))
}

/// How long the catalog may take to answer a lookup of an unknown relation
/// or the final proof at a stop.
const CATALOG_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) struct CoverageWatch {
    /// What start-up proved the stream carries; decides every Relation.
    coverage: Coverage,
    target: ProofTarget,
    /// The session's SQL connection: relation lookups and re-proofs. `None`
    /// only in unit tests of the session, whose coverage is what they give.
    catalog: Option<Arc<tokio_postgres::Client>>,
    /// Where a closed catalog connection is replaced (or asked why it closed).
    pg: PgConnectConfig,
    interval: Duration,
    /// The running re-proof, and when the last one started.
    reproof: Option<ReproofTask>,
    reproof_started: Instant,
    /// The server was a standby when the session started: its shutdown never
    /// lifts the proof ceiling.
    on_standby: bool,
    /// The live witness checks what is delivered against the table: a final
    /// proof that cannot be made leaves the window since the last proof to
    /// it instead of to the next start (which would send it again).
    witness_checks: bool,
    /// Where the baseline and breaks are kept; `None` in unit tests.
    record: Option<ProofRecord>,
    /// The server's clock at the last passing proof: where a break found
    /// now begins.
    passed_at: PgTimestamp,
    /// When the baseline was last stored, and what it was.
    recorded: Instant,
    stored_identity: Option<PublicationIdentity>,
}

impl CoverageWatch {
    pub(super) fn new(
        config: &Config,
        proof: StartProof,
        catalog: tokio_postgres::Client,
        pg: PgConnectConfig,
        on_standby: bool,
        witness_checks: bool,
    ) -> CoverageWatch {
        let stored_identity = Some(proof.coverage.identity().clone());
        CoverageWatch {
            coverage: proof.coverage,
            target: proof.target,
            catalog: Some(Arc::new(catalog)),
            pg,
            interval: config.monitor.slot_poll_interval(),
            reproof: None,
            reproof_started: Instant::now(),
            on_standby,
            witness_checks,
            record: Some(proof.record),
            passed_at: proof.at,
            recorded: Instant::now(),
            stored_identity,
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
            witness_checks: false,
            record: None,
            passed_at: PgTimestamp::now(),
            recorded: Instant::now(),
            stored_identity: None,
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
                // Bounded: the lookup runs inside the stream's receive, so a
                // stalled connection (a network partition) would also stop
                // the idle detection and the stop signal. A timeout ends the
                // session as a retry; the next one looks up on a new
                // connection.
                let lookup = coverage::lookup(catalog, relation.oid, self.coverage.root_oid());
                let now = tokio::time::timeout(CATALOG_TIMEOUT, lookup)
                    .await
                    .map_err(|_| PgError::Timeout {
                        addr: self.pg.redacted(),
                        during: "looking up a relation the stream describes in the catalog",
                        after: CATALOG_TIMEOUT,
                    })??;
                Ok(self.coverage.resolve(relation, lsn, now.as_ref())?)
            }
        }
    }

    /// Holds a finished proof against the baseline. A problem, or a change
    /// since the last proof, is a coverage break: stored (with the catalog
    /// as it is now as the new baseline, so only the break makes later starts
    /// refuse) and returned as the problems. `Ok(())`: it passed.
    fn hold(&mut self, proof: &Proof) -> Result<(), Vec<CoverageProblem>> {
        let mut problems = proof.problems.clone();
        // Passes now, but changed since the last proof (a change undone):
        // now is the baseline from here on, the break records the window.
        let passes_now = problems.is_empty();
        if passes_now
            && let Some(identity) = &proof.identity
            && let Err(problem) =
                self.coverage
                    .reconfirm(&self.target.publication, identity, &proof.found)
        {
            problems.push(problem);
        }
        if problems.is_empty() {
            self.passed_at = proof.read_at;
            if let (Some(record), Some(identity)) = (&self.record, &proof.identity)
                && (self.recorded.elapsed() >= PROOF_RECORD_EVERY
                    || Some(identity) != self.stored_identity.as_ref())
            {
                match record.save_baseline(identity, proof.read_at) {
                    Ok(()) => {
                        self.recorded = Instant::now();
                        self.stored_identity = Some(identity.clone());
                    }
                    Err(e) => {
                        warn!(error = %e, "storing the coverage proof's baseline failed; trying again at the next proof")
                    }
                }
            }
            return Ok(());
        }
        if !problems.iter().any(CoverageProblem::hides_rows) {
            return Err(problems);
        }
        let what = NotCovered {
            problems: problems.clone(),
        };
        let Some(record) = &self.record else {
            return Err(problems);
        };
        let found = CoverageBreak {
            since_micros: self.passed_at.0,
            until_micros: proof.read_at.0.max(self.passed_at.0),
            what: joined(&problems),
        };
        // Not covered now: the last passing baseline stays, so the start
        // that finds it fixed records the time in between too.
        let stored = record
            .add_break(found)
            .and_then(|()| match (&proof.identity, passes_now) {
                (Some(identity), true) => record.save_baseline(identity, proof.read_at),
                _ => Ok(()),
            });
        match stored {
            Ok(()) => {
                error!(problems = %what, since = %self.passed_at.rfc3339(), until = %proof.read_at.rfc3339(),
                "coverage break: outbox rows committed in this window may never have been sent; recorded in the \
                 offset store, every start refuses until they are published again")
            }
            Err(e) => error!(problems = %what, error = %e,
                "coverage break: outbox rows committed since the last proof may never have been sent, and \
                 storing the break failed: publish them with `outbox-cdc audit --repair` before restarting"),
        }
        Err(problems)
    }

    /// Takes the result of a finished re-proof (a problem stops the session;
    /// a pass raises the tracker's ceiling) and starts the next one when due.
    pub(super) fn poll(&mut self, tracker: &mut AckTracker) -> Result<Advanced, PipelineError> {
        let Some(catalog) = self.catalog.clone() else {
            return Ok(Advanced(false));
        };
        // Sabotage for the live witness's tests (`failpoints` builds only):
        // no re-proof, and acknowledgement no longer waits for one, as if
        // the proofs missed whatever happens.
        if crate::failpoint::sabotaged("coverage-checks-off") {
            return Ok(Advanced(tracker.lift_ceiling().is_some()));
        }
        let mut advanced = false;
        if let Some(running) = self.reproof.as_mut() {
            let Some(done) = futures_util::FutureExt::now_or_never(running) else {
                return Ok(Advanced(false));
            };
            self.reproof = None;
            advanced = self.reproved(done, tracker)?;
        }
        // A closed catalog connection is replaced at once (a server shutdown
        // closes it first, then waits for us to confirm its WAL).
        let since = self.reproof_started.elapsed();
        if since < self.interval && !(catalog.is_closed() && since >= Duration::from_millis(500)) {
            return Ok(Advanced(advanced));
        }
        self.start_reproof(catalog);
        Ok(Advanced(advanced))
    }

    /// A re-proof finished: the proof ceiling moves (or the coverage is
    /// lost); whether acknowledgement advanced.
    fn reproved(
        &mut self,
        done: Result<
            Result<(Proof, Option<tokio_postgres::Client>), PgError>,
            tokio::task::JoinError,
        >,
        tracker: &mut AckTracker,
    ) -> Result<bool, PipelineError> {
        match done {
            Ok(Ok((proof, reconnected))) => {
                if let Some(client) = reconnected {
                    // The session's SQL connection had closed (C6): the
                    // new one takes its place for lookups and proofs.
                    info!("the session's SQL connection closed; continuing on a new one");
                    self.catalog = Some(Arc::new(client));
                }
                if let Err(problems) = self.hold(&proof) {
                    return Err(PipelineError::CoverageLost(NotCovered { problems }));
                }
                Ok(tracker.prove_through(proof.through).is_some())
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
                Ok(tracker.lift_ceiling().is_some())
            }
            Ok(Err(e @ PgError::WrongServerKind { .. })) => {
                // Fenced (made read-only) or demoted while we streamed:
                // leave it; the reconnect passes it over.
                warn!(error = %e, "the server no longer fits target_session_attrs; reconnecting");
                Err(PipelineError::Pg(e))
            }
            Ok(Err(e)) => {
                warn!(error = %e, "re-proving the publication's coverage failed; trying again later");
                Ok(false)
            }
            Err(e) => {
                warn!(error = %e, "the coverage re-proof task failed; trying again later");
                Ok(false)
            }
        }
    }

    /// Starts the next re-proof on its own task (on a new connection when
    /// the session's closed), checking first that the server still fits
    /// `target_session_attrs`.
    fn start_reproof(&mut self, catalog: Arc<tokio_postgres::Client>) {
        self.reproof_started = Instant::now();
        let target = self.target.clone();
        let pg = self.pg.clone();
        let attrs = pg.session_attrs();
        let baseline = self.coverage.identity().clone();
        self.reproof = Some(tokio::spawn(async move {
            // Closed under us: a new connection (its refusal says why, e.g.
            // 57P03 while the server shuts down).
            let reconnected = match catalog.is_closed() {
                true => Some(pg.connect_sql().await?),
                false => None,
            };
            let client = reconnected.as_ref().unwrap_or(&catalog);
            if attrs.needs_check() {
                let kind = control::server_kind(client).await?;
                if !attrs.accepts(Some(kind)) {
                    return Err(PgError::WrongServerKind {
                        addr: "the connected server".into(),
                        wanted: attrs.name(),
                        got: kind.describe(),
                    });
                }
            }
            let (_, proof) = target.prove(client, Some(&baseline)).await?;
            Ok((proof, reconnected))
        }));
    }

    /// At a stop: one more proof, so that what was delivered since the last
    /// one is acknowledged (bounded). A change it sees is a coverage break,
    /// stored like one seen while streaming; a proof that cannot be made
    /// leaves it to the next start, which re-sends what was delivered since
    /// the last proof.
    pub(super) async fn final_proof(&mut self, tracker: &mut AckTracker) {
        let Some(catalog) = self.catalog.clone() else {
            return;
        };
        let baseline = self.coverage.identity().clone();
        let proof = self.target.prove(&catalog, Some(&baseline));
        match tokio::time::timeout(CATALOG_TIMEOUT, proof).await {
            Ok(Ok((_, proof))) => {
                if self.hold(&proof).is_ok() {
                    tracker.prove_through(proof.through);
                }
            }
            Ok(Err(e)) => self.no_final_proof(tracker, &format!("failed: {e}")),
            Err(_) => self.no_final_proof(tracker, "timed out"),
        }
    }

    /// The final proof could not be made (the server went away, a failover):
    /// with the live witness checking, what was delivered since the last
    /// proof is acknowledged and the witness finds, from the table, any row
    /// the stream skipped in that window (a change of the publication meant
    /// is also seen by the next start against the stored identity); without
    /// it, the next start sends that window again.
    fn no_final_proof(&self, tracker: &mut AckTracker, why: &str) {
        if self.witness_checks {
            let through = tracker.lift_ceiling();
            warn!(through = ?through, "the final coverage proof {why}; the live witness checks what was delivered \
                since the last one against the table, so it is acknowledged, not sent again");
        } else {
            warn!(
                "the final coverage proof {why}; the next start re-sends what was delivered since the last one"
            );
        }
    }
}
