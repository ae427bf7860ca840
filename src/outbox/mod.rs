//! Outbox mapping and routing: pure functions from decoded rows to [`OutboxEvent`]s.

pub mod event;

pub use event::OutboxEvent;
