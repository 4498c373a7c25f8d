//! `hookspool dispatch` (and later `run`): the long-running services, on a tokio runtime with
//! SIGTERM/SIGINT as shutdown and SIGHUP as a config reload request.

use std::sync::Arc;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Notify;

use super::{Ctx, EXIT_NOT_FOUND, Exit};
use crate::dispatch::{self, DispatchOptions};

/// A multi-thread runtime; `threads` is `intake.threads` where the intake runs on it.
pub fn runtime(threads: Option<usize>) -> Result<tokio::runtime::Runtime, Exit> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        b.worker_threads(n);
    }
    b.enable_all()
        .build()
        .map_err(|e| Exit::new(EXIT_NOT_FOUND, format!("cannot start the runtime: {e}")))
}

/// Resolves on SIGTERM or SIGINT; SIGHUP notifies `reload` instead. The handlers are
/// installed when this is called, not when the future is first polled: call it (inside the
/// runtime) before announcing READY=1, so a stop or a reload that follows READY at once
/// meets a handler, never the default action (which ends the process at once).
pub fn signals(reload: Arc<Notify>) -> impl Future<Output = ()> + Send + 'static {
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    );
    async move {
        let (Ok(mut term), Ok(mut int), Ok(mut hup)) = handlers else {
            // Without signal handlers the process can still be stopped by SIGKILL; run on.
            std::future::pending::<()>().await;
            return;
        };
        loop {
            tokio::select! {
                _ = term.recv() => return,
                _ = int.recv() => return,
                // notify_one keeps the wake-up until the dispatcher (its one listener) next
                // waits: notify_waiters lost a SIGHUP that came while a tick ran, and the
                // config-class retries it should have made due waited on.
                _ = hup.recv() => reload.notify_one(),
            }
        }
    }
}

pub fn dispatch(ctx: &Ctx) -> Result<(), Exit> {
    let rt = runtime(None)?;
    let reload = Arc::new(Notify::new());
    let opts = DispatchOptions {
        inputs: ctx.inputs.clone(),
        clock: crate::clock::system(),
        wake: Arc::new(Notify::new()),
        reload: reload.clone(),
        ready: None,
        migrated: None,
    };
    // signals() inside the runtime: it installs the handlers as it is called.
    rt.block_on(async move { dispatch::run(opts, signals(reload)).await })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A SIGHUP that comes while the dispatcher is not waiting (it is in a tick) is kept
    /// for its next wait: with `notify_waiters` this wait never ended (the reload was lost).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sighup_while_nobody_waits_is_kept_for_the_next_wait() {
        let reload = Arc::new(Notify::new());
        let handlers = tokio::spawn(signals(reload.clone()));
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGHUP).expect("raise SIGHUP");
        // Nobody waits on `reload` yet; give the handler time to run.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let kept = tokio::time::timeout(Duration::from_secs(5), reload.notified()).await;
        handlers.abort();
        assert!(kept.is_ok(), "the SIGHUP was lost");
    }
}
