//! recall's integration tests, one module per area, in one binary: each
//! test binary links candle, axum and SQLite, so one binary instead of one
//! per file saves most of the build's link time and disk.
//!
//! Run one area with a filter: `cargo test --test it -- eval::`.

mod common;

mod bad_input;
mod bge_m3_parity;
mod chunking;
mod cli;
mod eval;
mod hermes_plugin;
mod index_guard;
mod index_hermes;
mod minilm;
mod model_management;
mod pack_cache;
mod providers;
mod q8_outliers;
mod search;
mod serve;
mod vector_search;
mod watch;
