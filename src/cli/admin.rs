//! `hookspool admin`: the management API (issue 31: `/api/v1` reads, and actions with the
//! CSRF header, audited as `admin-token`) on a loopback address, with the token from a file
//! (mode 0600; `hookspool secret new` makes one). Runs until SIGTERM/SIGINT.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use tokio::sync::Notify;

use super::{Ctx, EXIT_CONFIG, Exit};
use crate::admin::{self, Admin};

/// The admin API's default address (the intake's is 8650).
pub const ADMIN_LISTEN_DEFAULT: &str = "127.0.0.1:8651";

#[derive(Debug, Args)]
pub struct AdminArgs {
    /// A loopback address to listen on (127.0.0.1:<port> or [::1]:<port>; 0 picks a port,
    /// printed at start).
    #[arg(long, default_value = ADMIN_LISTEN_DEFAULT)]
    pub listen: SocketAddr,
    /// The file holding the token every request must send as `Authorization: Bearer
    /// <token>` (mode 0600).
    #[arg(long, value_name = "FILE")]
    pub token_file: PathBuf,
}

pub fn run(ctx: &Ctx, a: AdminArgs) -> Result<(), Exit> {
    let c = ctx.config()?;
    let token = read_token(&a.token_file)?;
    // Read-only, and never the one to create a spool.
    let probe = ctx.store(&c)?;
    drop(probe);
    let rt = super::service::runtime(Some(1))?;
    rt.block_on(async {
        let listener = admin::bind(a.listen).map_err(|e| Exit::new(EXIT_CONFIG, e.to_string()))?;
        let local = listener
            .local_addr()
            .map_err(|e| Exit::new(EXIT_CONFIG, e.to_string()))?;
        let state = Admin::open(c, token, crate::clock::system())
            .map_err(|e| Exit::new(EXIT_CONFIG, e.to_string()))?;
        tracing::info!(
            component = "admin",
            status = "serving",
            "admin API on http://{local}/api/v1 (token from {})",
            a.token_file.display()
        );
        admin::serve(
            Arc::new(state),
            listener,
            super::service::signals(Arc::new(Notify::new())),
        )
        .await;
        Ok(())
    })
}

/// The token: the file's text without surrounding white space; never logged.
fn read_token(path: &std::path::Path) -> Result<String, Exit> {
    use std::os::unix::fs::PermissionsExt;
    let text = std::fs::read_to_string(path).map_err(|e| {
        Exit::new(
            EXIT_CONFIG,
            format!(
                "{}: cannot read the admin token ({e}); write one (e.g. hookspool secret new {}) and pass --token-file",
                path.display(),
                path.display()
            ),
        )
    })?;
    if let Ok(m) = std::fs::metadata(path)
        && m.permissions().mode() & 0o077 != 0
    {
        eprintln!(
            "warning: {} has mode {:04o}: group or others can read the admin token; run chmod 600 {}",
            path.display(),
            m.permissions().mode() & 0o777,
            path.display()
        );
    }
    let token = text.trim().to_string();
    if token.len() < 16 {
        return Err(Exit::new(
            EXIT_CONFIG,
            format!(
                "{}: the admin token is shorter than 16 characters; write a long random one (hookspool secret new {})",
                path.display(),
                path.display()
            ),
        ));
    }
    Ok(token)
}
