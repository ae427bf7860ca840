//! PostgreSQL's wire timestamps: signed microseconds since 2000-01-01 00:00:00 UTC.

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds from the Unix epoch to PostgreSQL's epoch (2000-01-01).
const PG_EPOCH_UNIX_SECS: i64 = 946_684_800;

/// A timestamp as PostgreSQL sends it in replication messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PgTimestamp(pub i64);

impl PgTimestamp {
    pub fn now() -> PgTimestamp {
        let since_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        PgTimestamp(since_unix - PG_EPOCH_UNIX_SECS * 1_000_000)
    }

    /// Milliseconds since the Unix epoch (Kafka record timestamps use these).
    pub fn unix_millis(self) -> i64 {
        self.0.div_euclid(1000) + PG_EPOCH_UNIX_SECS * 1000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_pg_epoch_to_unix_millis() {
        assert_eq!(PgTimestamp(0).unix_millis(), 946_684_800_000);
        assert_eq!(PgTimestamp(1_500).unix_millis(), 946_684_800_001);
        assert_eq!(PgTimestamp(-1).unix_millis(), 946_684_799_999);
    }

    #[test]
    fn now_is_after_2020() {
        assert!(PgTimestamp::now().unix_millis() > 1_577_836_800_000);
    }
}
