//! `hookspool secret new <file>`: make an http destination's secret, a Standard Webhooks
//! secret (`whsec_` + base64 of 32 random bytes, `destinations::sign::new_standard_secret`),
//! written with mode 0600 to a file that must not exist yet.
//!
//! Must not: print the secret (the operator hands the file's value to the receiver), or
//! replace a file (a secret in use would silently change).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::json;

use super::{Ctx, EXIT_NOT_FOUND, Exit};
use crate::destinations::sign;

#[derive(Debug, Args)]
pub struct SecretArgs {
    #[command(subcommand)]
    pub action: SecretAction,
}

#[derive(Debug, Subcommand)]
pub enum SecretAction {
    /// Write a new Standard Webhooks secret (whsec_...) to FILE with mode 0600.
    New {
        /// Where to write it; refused when the file exists.
        file: PathBuf,
    },
}

pub fn run(ctx: &Ctx, a: SecretArgs) -> Result<(), Exit> {
    let SecretAction::New { file } = a.action;
    let secret = sign::new_standard_secret();
    super::run::write_private(&file, format!("{secret}\n").as_bytes()).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AlreadyExists => {
                "it exists and is kept as it is; choose another path, or remove it first if it is not in use"
            }
            std::io::ErrorKind::NotFound => "create its directory first (mode 0700)",
            _ => "check the path and its directory's permissions",
        };
        Exit::new(EXIT_NOT_FOUND, format!("{}: {e}; {hint}", file.display()))
    })?;
    if ctx.json {
        ctx.print_json(&json!({"written": file, "mode": "0600"}));
    } else {
        say!(
            ctx,
            "wrote a new Standard Webhooks secret to {} (mode 0600)\nreference it with secret = {{ file = \"{}\" }} and give the receiver the same whsec_ value",
            file.display(),
            file.display()
        );
    }
    Ok(())
}
