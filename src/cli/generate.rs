//! `hookspool generate`: the man pages and shell completions, written from the same clap
//! definitions the binary parses with, so they cannot drift from the CLI, and the
//! configuration reference (hookspool.toml(5) among the man pages, docs/configuration.md),
//! written from `config::reference`. Hidden from `--help`; the Debian and RPM builds run it
//! on the freshly built binary.

use std::path::{Path, PathBuf};

use clap::{Args, CommandFactory, ValueEnum};
use clap_complete::Shell;

use super::{Cli, EXIT_NOT_FOUND, Exit};
use crate::config::reference;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum What {
    /// hookspool.1, one hookspool-<command>.1 per command, and hookspool.toml.5 (the
    /// configuration reference).
    Man,
    /// configuration.md: the configuration reference (the repository's docs/).
    Reference,
    /// Completions for bash, zsh and fish, named as each shell looks them up.
    Completions,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// What to write.
    pub what: What,
    /// The directory to write into (created if missing).
    pub dir: PathBuf,
}

pub fn run(a: GenerateArgs) -> Result<(), Exit> {
    std::fs::create_dir_all(&a.dir).map_err(|e| io_exit(&a.dir, e))?;
    let cmd = Cli::command();
    match a.what {
        What::Man => {
            clap_mangen::generate_to(cmd, &a.dir).map_err(|e| io_exit(&a.dir, e))?;
            write(&a.dir.join("hookspool.toml.5"), &reference::man_page())
        }
        What::Reference => write(&a.dir.join("configuration.md"), &reference::markdown()),
        What::Completions => {
            // The file names bash-completion, zsh's fpath and fish look up.
            for (shell, file) in [
                (Shell::Bash, "hookspool"),
                (Shell::Zsh, "_hookspool"),
                (Shell::Fish, "hookspool.fish"),
            ] {
                let path = a.dir.join(file);
                let mut out = std::fs::File::create(&path).map_err(|e| io_exit(&path, e))?;
                clap_complete::generate(shell, &mut Cli::command(), "hookspool", &mut out);
            }
            Ok(())
        }
    }
}

fn write(path: &Path, text: &str) -> Result<(), Exit> {
    std::fs::write(path, text).map_err(|e| io_exit(path, e))
}

fn io_exit(path: &Path, e: std::io::Error) -> Exit {
    Exit::new(EXIT_NOT_FOUND, format!("{}: {e}", path.display()))
}
