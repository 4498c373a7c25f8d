//! Defaults and bounds that modules on different floors share, each said once with its
//! unit last. A value only one module reads lives in that module, beside its reader.
//!
//! Must not: import anything of the crate (it is the bottom floor).

/// A script's time limit when its destination, or a processor's or poll's manifest, leaves
/// `timeout_s` out (spec 14.2, 14.3.2): a processor is a script the dispatcher runs.
pub const SCRIPT_TIMEOUT_S_DEFAULT: u64 = 300;
