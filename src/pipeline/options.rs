//! Options of one `run` that are not configuration.

use std::future::Future;
use std::pin::Pin;

use crate::checkpoint::{CoverageBreak, OffsetStore};
use crate::config::Config;

use crate::error::{PipelineError, StartRefused};

/// Repairs the stored coverage `breaks` over the window `refused` names,
/// instead of refusing the start; resolves to whether they were cleared.
/// The live witness's (`witness::repair_breaks`), handed down by
/// `relay::run`: the pipeline does not reach up to the audit.
pub type BreakRepair =
    for<'a> fn(
        &'a Config,
        &'a OffsetStore,
        &'a [CoverageBreak],
        &'a StartRefused,
    ) -> Pin<Box<dyn Future<Output = Result<bool, PipelineError>> + Send + 'a>>;

/// Options of one `run` that are not configuration (command-line flags).
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// Recreate a lost slot and repair the gap from the retained outbox rows
    /// (`--recreate-slot`).
    pub recreate_slot: bool,
    /// Let a repair go ahead although the outbox no longer holds rows from
    /// before the last acknowledged commit (`--accept-gap`).
    pub accept_gap: bool,
    /// Stop after the repair, before streaming (`outbox-cdc repair`).
    pub repair_only: bool,
    /// How a stored coverage break is repaired at start (with `[reconcile]`
    /// on); `None`: the start is refused, naming the command.
    pub break_repair: Option<BreakRepair>,
}
