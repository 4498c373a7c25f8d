//! `hookspool dispatch` (and later `run`): the long-running services, on a tokio runtime with
//! SIGTERM/SIGINT as shutdown and SIGHUP as a config reload request.

use std::sync::Arc;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Notify;

use super::{Ctx, EXIT_CONFIG, EXIT_LOCKED, EXIT_NOT_FOUND, Exit};
use crate::dispatch::{self, DispatchError, DispatchOptions};
use crate::store::StoreError;

pub fn runtime() -> Result<tokio::runtime::Runtime, Exit> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Exit::new(EXIT_NOT_FOUND, format!("cannot start the runtime: {e}")))
}

/// Resolves on SIGTERM or SIGINT; SIGHUP notifies `reload` instead.
pub async fn signals(reload: Arc<Notify>) {
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        // Without signal handlers the process can still be stopped by SIGKILL; run on.
        std::future::pending::<()>().await;
        return;
    };
    loop {
        tokio::select! {
            _ = term.recv() => return,
            _ = int.recv() => return,
            _ = hup.recv() => reload.notify_waiters(),
        }
    }
}

impl From<DispatchError> for Exit {
    fn from(e: DispatchError) -> Exit {
        match e {
            DispatchError::Locked(_) => Exit::new(EXIT_LOCKED, e.to_string()),
            DispatchError::SandboxRequired { .. } => Exit::new(EXIT_CONFIG, e.to_string()),
            DispatchError::Config(c) => c.into(),
            DispatchError::Store(
                s @ (StoreError::SchemaTooNew { .. } | StoreError::Corrupt(_)),
            ) => Exit::new(EXIT_CONFIG, s.to_string()),
            other => Exit::new(EXIT_NOT_FOUND, other.to_string()),
        }
    }
}

pub fn dispatch(ctx: &Ctx) -> Result<(), Exit> {
    let rt = runtime()?;
    let reload = Arc::new(Notify::new());
    let opts = DispatchOptions {
        inputs: ctx.inputs.clone(),
        clock: crate::clock::system(),
        wake: Arc::new(Notify::new()),
        reload: reload.clone(),
    };
    rt.block_on(dispatch::run(opts, signals(reload)))?;
    Ok(())
}
