//! The names of readiness's reasons and of their causes: what `/health/ready`,
//! `/metrics` and `status` show. Imports nothing.

/// The reasons, in the order the JSON body lists them.
pub const REASONS: [&str; 5] = [
    STREAMING,
    KAFKA_REACHABLE,
    ACKNOWLEDGING,
    SEQUENCE_GAPS,
    RECONCILED,
];
pub const STREAMING: &str = "streaming";
pub const KAFKA_REACHABLE: &str = "kafka_reachable";
pub const ACKNOWLEDGING: &str = "acknowledging";
pub const SEQUENCE_GAPS: &str = "sequence_gaps";
pub const RECONCILED: &str = "reconciled";

/// The causes of a reason that does not hold, as [`Reason::cause`] names them.
pub mod cause {
    /// streaming: the slot is held by another process (an HA standby waits).
    pub const SLOT_IN_USE: &str = "slot_in_use";
    /// streaming: the last session ended with an error; it reconnects.
    pub const SESSION_ERROR: &str = "session_error";
    /// streaming: the first session is starting.
    pub const STARTING: &str = "starting";
    /// kafka_reachable: no recent answer to a metadata request.
    pub const KAFKA_UNREACHABLE: &str = "kafka_unreachable";
    /// acknowledging: the oldest unacknowledged event is older than the bound.
    pub const ACKNOWLEDGEMENT_OVERDUE: &str = "acknowledgement_overdue";
    /// sequence_gaps: an aggregate misses numbers for longer than the bound.
    pub const SEQUENCE_GAP_OPEN: &str = "sequence_gap_open";
    /// reconciled: the live witness found committed rows the stream skipped
    /// and has not published them yet.
    pub const ROWS_NOT_REPUBLISHED: &str = "rows_not_republished";
}
