//! systemd integration: readiness and status notifications, the watchdog, and inherited
//! sockets. Nobody else in the crate talks to systemd. Outside systemd (no NOTIFY_SOCKET)
//! every call here is a cheap no-op.

pub mod listen;
pub mod notify;
