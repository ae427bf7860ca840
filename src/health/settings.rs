//! `[health]`: the bounds of readiness. Below `config`, which reads it.

use std::time::Duration;

use serde::Deserialize;

use crate::setting::InvalidSetting;

/// `[health]`: the bounds of readiness.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthSettings {
    /// Not ready while the oldest unacknowledged event was committed longer
    /// ago than this, in milliseconds. Default 60000.
    pub max_unacked_age_ms: u64,
    /// Not ready while an aggregate has missed sequence numbers for longer
    /// than this, in milliseconds. Default 60000.
    pub max_gap_open_ms: u64,
    /// How often Kafka is asked for metadata, in milliseconds; each request
    /// may take as long. Not ready when none succeeded within three
    /// intervals. Default 5000.
    pub kafka_probe_interval_ms: u64,
}

impl Default for HealthSettings {
    fn default() -> HealthSettings {
        HealthSettings {
            max_unacked_age_ms: 60_000,
            max_gap_open_ms: 60_000,
            kafka_probe_interval_ms: 5_000,
        }
    }
}

impl HealthSettings {
    pub(crate) fn validate(&self) -> Result<(), InvalidSetting> {
        for (key, value, range) in [
            (
                "health.max_unacked_age_ms",
                self.max_unacked_age_ms,
                100..=86_400_000,
            ),
            (
                "health.max_gap_open_ms",
                self.max_gap_open_ms,
                0..=86_400_000,
            ),
            (
                "health.kafka_probe_interval_ms",
                self.kafka_probe_interval_ms,
                100..=600_000,
            ),
        ] {
            if !range.contains(&value) {
                return Err(InvalidSetting::new(
                    key,
                    value,
                    format!("{} to {} (milliseconds)", range.start(), range.end()),
                ));
            }
        }
        Ok(())
    }

    pub(super) fn probe_interval(&self) -> Duration {
        Duration::from_millis(self.kafka_probe_interval_ms)
    }

    /// How old the last successful probe may be.
    pub(super) fn kafka_bound(&self) -> Duration {
        self.probe_interval() * 3
    }
}
