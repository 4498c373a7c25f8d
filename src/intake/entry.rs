//! The `hookspool intake` process around [`super::serve`]: takes the sockets systemd passed
//! (before any thread exists), starts the tokio runtime, turns SIGTERM/SIGINT
//! into the shutdown future, and wakes the dispatcher through `<home>/dispatch.sock`.
//!
//! Must not: hold any intake logic (`hookspool run` calls `serve` directly, next to the
//! dispatcher) or install logging (main does, through `observe::logging`, for every
//! command).

use std::sync::Arc;

use super::{IntakeError, IntakeOptions, serve};
use crate::config::{self, PathInputs};
use crate::sys::listen;
use crate::wake::DatagramWaker;

/// Run `hookspool intake` to completion.
pub fn run_blocking(inputs: PathInputs) -> Result<(), IntakeError> {
    crate::store::pg::name_sessions("intake");
    // Before the runtime: sd-notify reads LISTEN_FDS/LISTEN_FDNAMES from the environment.
    let inherited = listen::take_inherited()?;
    install_panic_hook();
    let (c, _) = config::load(&inputs, false).map_err(IntakeError::Config)?;
    let waker = Arc::new(DatagramWaker::new(&c.home));
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = c.intake.threads {
        // intake.threads: the workers that verify and classify requests.
        builder.worker_threads(n);
    }
    let rt = builder
        .enable_all()
        .thread_name("hookspool-intake")
        .build()
        .map_err(|error| IntakeError::Io {
            context: "starting the runtime",
            error,
        })?;
    rt.block_on(async move {
        let mut opts = IntakeOptions::new(inputs, waker, terminated());
        opts.inherited = inherited;
        serve(opts).await
    })
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed when this is called (inside
/// the runtime, before `serve` announces READY=1), not when the future is first polled: a
/// SIGTERM right after READY=1 then stops the intake as a drain, never by the default
/// action.
pub fn terminated() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        match handlers {
            (Ok(mut t), Ok(mut i)) => {
                tokio::select! {
                    _ = t.recv() => {}
                    _ = i.recv() => {}
                }
            }
            _ => {
                // Without handlers the default actions still stop the process.
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Panics are logged with their location only: a source's panic message could quote the
/// request (spec 10: no bodies in logs). `hookspool run` should install the same hook.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let location = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let thread = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_string();
        tracing::error!(
            component = "intake",
            reason = "panic",
            location = %location,
            thread = %thread,
            "panic (message withheld: it may quote request data)"
        );
    }));
}
