//! The hookspool binary: parse the command line, run the command, and exit with the code
//! `cli::exit` maps the result to (0 ok, 1 not found / nothing to do, 2 usage, config or
//! schema error, 3 lock held or address in use).

use clap::Parser;

use hookspool::cli::{Cli, Exit};

/// The process's allocator (issue 36): the dispatcher's profile had glibc's malloc and free
/// at about 17 % of its samples (many small, short-lived blocks: rows, candidates, requests).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // clap prints its own usage text, help or version.
            let _ = e.print();
            std::process::exit(Exit::from_clap(&e));
        }
    };
    hookspool::observe::logging::init(cli.command.component());
    if let Err(e) = hookspool::cli::run(cli) {
        eprintln!("hookspool: {}", e.message);
        std::process::exit(e.code);
    }
}
