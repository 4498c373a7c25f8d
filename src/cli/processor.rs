//! `hookspool processor <instance>`: the processor runtime (spec 14.3.4), started by the
//! dispatcher as a bobbin instance's script destination. Reads the batch document on stdin
//! and the env contract, prints only emit lines on stdout, and exits 0 (ok), 65 (Permanent),
//! 78 (Config: the operator must act on a credential or grant) or 75 (Retryable: the
//! dispatcher retries it uncounted, as the transport class); the
//! reason, a short fixed phrase, goes to stderr.
//!
//! Writes to the process's stdout directly rather than through `Ctx`: the emits must have
//! reached the pipe (flushed) before the `processor.after_emits` failpoint, and nothing
//! else may ever be written there.

use std::io::Read;

use super::{Ctx, Exit};
use crate::processor::{self, Failure, ProcessorError};

/// The document on stdin may be this large (a batch is bounded by its max_bytes).
const STDIN_BYTES_MAX: u64 = 256 * 1024 * 1024;

#[derive(Debug, clap::Args)]
pub struct ProcessorArgs {
    /// The bobbin instance (HOOKSPOOL_BOBBIN_INSTANCE names the same one).
    pub instance: String,
}

impl From<ProcessorError> for Exit {
    fn from(e: ProcessorError) -> Exit {
        let hint = e
            .retry_after_s
            .map(|s| format!(" (retry after {s:.0} s)"))
            .unwrap_or_default();
        let code = processor::exit_code(&e);
        match e.failure {
            Failure::Bug => Exit::new(code, format!("processor bug: {}", e.reason)),
            _ => Exit::new(code, format!("processor: {}{hint}", e.reason)),
        }
    }
}

pub fn run(_ctx: &Ctx, a: ProcessorArgs) -> Result<(), Exit> {
    let mut stdin = Vec::new();
    std::io::stdin()
        .take(STDIN_BYTES_MAX + 1)
        .read_to_end(&mut stdin)
        .map_err(|_| Exit::from(ProcessorError::retryable("stdin could not be read")))?;
    if stdin.len() as u64 > STDIN_BYTES_MAX {
        return Err(ProcessorError::permanent("the batch document exceeds 256 MiB").into());
    }
    let mut out = std::io::stdout().lock();
    processor::run(&a.instance, &stdin, &mut out).map_err(|e| {
        tracing::warn!(source = %a.instance, reason = %e.reason, "processor failed");
        Exit::from(e)
    })
}
