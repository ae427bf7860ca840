//! The tests that need the primary and standby of `scripts/env.sh up
//! --standby`: decoding from the standby (PostgreSQL 16+) and failover
//! (17+). Each stops or restarts one of the pair, so each needs a fresh pair:
//! this binary is not among `cargo test`'s default targets (`test = false` in
//! Cargo.toml), and scripts/test.sh runs one module per fresh pair and major
//! (`cargo test --test standby failover::`). Each test holds `common::alone`.

#[path = "../common/mod.rs"]
mod common;

mod failover;
mod failover_unsynced;
mod standby_decoding;
