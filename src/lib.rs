//! hookspool: a durable, coalescing webhook intake for one host. See ARCHITECTURE.md for the
//! code map and the invariants each module keeps.

pub mod clock;
pub mod config;
pub mod failpoint;
pub mod store;
pub mod cli;
