//! `tasq`: the operator's console of a tasq durable queue. See `tasq --help`.

#![forbid(unsafe_code)]

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::args::Cli::parse();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match cli::run::run(args, &mut out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("tasq: {failure}");
            ExitCode::from(failure.code())
        }
    }
}
