//! systemd integration: readiness and status notifications, the watchdog, and inherited
//! sockets. Nobody else in the crate talks to systemd. Outside systemd (no NOTIFY_SOCKET)
//! every call here is a cheap no-op. `watch` is the one other piece of the host both services
//! share: the config file watcher (inotify, with an mtime fallback); `fs` the one atomic file
//! write.

pub mod fs;
pub mod listen;
pub mod notify;
pub mod watch;
