//! Outbox mapping and routing: pure functions from decoded rows to [`OutboxEvent`]s.
//!
//! - [`settings`]: the `[outbox]` configuration section and its validation;
//!   `table_name`: the table's catalog name it resolves.
//! - [`columns`]: the columns the mapping reads, with their keys and roles.
//! - `topic`: Kafka topic-name rules and the routing template.
//! - [`cloudevents`]: CloudEvents headers (binary content mode), optional.
//! - `placement`: Debezium's record shapes (placements, payload as a JSON string, regex routing).
//! - [`trace`]: W3C trace context from the row into the record's headers.
//! - [`mapper`]: rows of the outbox table and logical messages to events.

pub mod cloudevents;
pub mod columns;
pub mod event;
pub mod mapper;
pub(crate) mod placement;
pub mod settings;
mod table_name;
pub(crate) mod topic;
pub mod trace;

pub use cloudevents::CloudEventsSettings;
pub use columns::{ColumnRole, MappedColumn};
pub use event::OutboxEvent;
pub use mapper::MapError;
pub(crate) use mapper::{BoundRelation, ChangeContext, OutboxMapper};
pub use placement::{PayloadFormat, RouteSettings};
pub use settings::{ConfigError, Layout, OutboxSettings, PoisonPolicy, TraceColumn};
pub use trace::TraceDropped;
