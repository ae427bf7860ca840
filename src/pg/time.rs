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

    /// RFC 3339 in UTC with milliseconds, e.g. `2026-12-01T01:02:03.456Z`.
    pub fn rfc3339(self) -> String {
        let unix_ms = self.unix_millis();
        let secs = unix_ms.div_euclid(1000);
        let ms = unix_ms.rem_euclid(1000);
        let rem = secs.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
        format!(
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
            rem / 3600,
            rem % 3600 / 60,
            rem % 60
        )
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
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
    fn times_print_as_rfc3339() {
        // 2000-01-01T00:00:00Z is PostgreSQL's epoch.
        assert_eq!(PgTimestamp(0).rfc3339(), "2000-01-01T00:00:00.000Z");
        // 2026-12-01T01:02:03.456Z
        let unix_ms: i64 = 1_796_086_923_456;
        let micros = (unix_ms - 946_684_800_000) * 1000;
        assert_eq!(PgTimestamp(micros).rfc3339(), "2026-12-01T01:02:03.456Z");
    }

    #[test]
    fn now_is_after_2020() {
        assert!(PgTimestamp::now().unix_millis() > 1_577_836_800_000);
    }
}
