//! hookspool: a durable, coalescing webhook intake for one host. See ARCHITECTURE.md for the
//! code map and the invariants each module keeps.

pub mod admin;
pub mod bobbins;
pub mod cli;
pub mod clock;
pub mod config;
pub mod destinations;
pub mod dispatch;
pub mod egress;
pub mod failpoint;
pub mod intake;
pub mod kit;
pub mod limits;
pub mod observe;
pub mod ops;
pub mod processor;
pub mod sandbox;
pub mod secret;
pub mod sources;
pub mod store;
pub mod sys;
pub mod telemetry;
pub mod vocab;
pub mod wake;
