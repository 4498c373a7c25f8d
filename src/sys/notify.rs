//! sd_notify messages (READY=1, RELOADING=1, STOPPING=1, WATCHDOG=1, STATUS=) through the
//! sd-notify crate. Watchdog pings are a health proof, not a timer: callers send them only
//! when their own loop (the intake's writer, the dispatcher's tick) has just completed.

use std::time::Duration;

use sd_notify::NotifyState;

/// Whether we run under a service manager that wants notifications.
pub fn enabled() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some()
}

fn send(states: &[NotifyState<'_>]) {
    if !enabled() {
        return;
    }
    // A failed notification cannot be reported anywhere better than the log; systemd's own
    // timeouts (TimeoutStartSec, WatchdogSec) turn a lost READY or WATCHDOG into a restart.
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(reason = %e, "sd_notify failed");
    }
}

pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

/// RELOADING=1 with MONOTONIC_USEC, as systemd requires for a reload notification.
pub fn reloading() {
    if !enabled() {
        return;
    }
    match NotifyState::monotonic_usec_now() {
        Ok(m) => send(&[NotifyState::Reloading, m]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

/// EXTEND_TIMEOUT_USEC: `d` more before systemd's start timeout fires. A dispatcher whose
/// start waits for space on a full disk sends it with each retry, so the wait is weather,
/// not a failed start.
pub fn extend_timeout(d: Duration) {
    let usec = u32::try_from(d.as_micros()).unwrap_or(u32::MAX);
    send(&[NotifyState::ExtendTimeoutUsec(usec)]);
}

pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

pub fn watchdog() {
    send(&[NotifyState::Watchdog]);
}

/// The watchdog interval systemd asked for (WATCHDOG_USEC for this process), if any.
pub fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled()
}
