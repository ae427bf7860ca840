//! Options of one `run` that are not configuration.

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
}
