//! The built-in pollers (spec 14.4), one file each: `poll(batch, ctx)` with the same Batch
//! and Context a processor gets, returning items; the runtime journals, applies and emits
//! exactly as for a processor. A poller runs once per tick batch the dispatcher's clock
//! enqueued.
//!
//! Must not: sleep or loop on time (the clock is the dispatcher's; a rate rule is
//! `ctx.pace`), read the environment or files, or talk HTTP except through the context.

pub mod feed;
pub mod tasks;
