//! The processor runtime (spec 14.3.4, 6.6): `hookspool processor <instance>`, started by the
//! dispatcher as the instance's script destination. It turns a provider's "something
//! changed" batch into the actual changes, exactly once, surviving SIGKILL at any point.
//!
//! Owns: reading the env contract and the batch document (`contract`), the bobbin's
//! `[processor]` table (`manifest`), the state lock, staged state and the journal keyed by
//! HOOKSPOOL_BATCH_ID (`state`, `journal`), turning items into `{"enqueue": ...}` emit lines
//! (`emit`), the two kinds of processor (built-in Rust ones in `builtin`, an executable in
//! `exec`), the [`Context`] they call (`context`, `http`, `oauth`, `pace`, `mailrules`, and
//! `hooks`, a deployment's hooks program, spec 14.3.6) and
//! the provider helpers several bobbins share (`providers`).
//!
//! Must not: print anything but emit lines on stdout; log a body, a secret, a token, a
//! subject or a query string (logs carry ids and counts); call the provider again for a
//! batch whose journal exists; apply state before the journal that holds it is durable.
//!
//! Invariant: for a bobbin with state, the journal of a batch is written (tmp, fsync,
//! rename, fsync the directory) before any of its state is applied, and every journal is
//! applied before the next batch reads the state (roll-forward under the lock), so state
//! only ever moves forward and a retry of the same batch prints the same emits.

pub mod builtin;
pub mod context;
pub mod contract;
mod emit;
mod error;
mod exec;
pub mod feeds;
pub mod hooks;
pub mod http;
mod journal;
pub mod mailrules;
mod manifest;
pub mod oauth;
mod pace;
pub mod pollers;
pub mod providers;
mod runtime;
mod state;

pub use context::{Context, Secret};
pub use contract::{Batch, Contract};
pub use error::{Failure, ProcessorError};
pub use runtime::{
    EXIT_BUG, EXIT_PERMANENT, EXIT_PROCESSOR_CONFIG, EXIT_RETRY, Report, exit_code, run,
    run_contract, run_for_kit,
};
pub use state::seed as seed_state;

/// One item a processor returns: `{"event_type": ..., <payload fields>}`, optionally with
/// `key` (the batch key otherwise).
pub type Item = serde_json::Map<String, serde_json::Value>;
