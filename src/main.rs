//! The hookspool binary: parse the command line, run the command, map the result to an exit
//! code (0 ok, 1 not found / nothing to do, 2 config or schema error, 3 lock held).

use clap::Parser;

fn main() {
    let cli = hookspool::cli::Cli::parse();
    hookspool::observe::logging::init(cli.command.component());
    match hookspool::cli::run(cli) {
        Ok(()) => {}
        Err(e) => {
            eprintln!("hookspool: {}", e.message);
            std::process::exit(e.code);
        }
    }
}
