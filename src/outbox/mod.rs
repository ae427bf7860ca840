//! Outbox mapping and routing: pure functions from decoded rows to [`OutboxEvent`]s.
//!
//! - [`settings`]: the `[outbox]` configuration section and its validation.
//! - `topic`: Kafka topic-name rules and the routing template.

pub mod event;
pub mod settings;
pub(crate) mod topic;

pub use event::OutboxEvent;
pub use settings::{ConfigError, Layout, OutboxSettings, PoisonPolicy};
