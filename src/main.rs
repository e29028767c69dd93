//! The `bmoe` command.

use bmoe::interrupt;
use clap::Parser;

fn main() {
    // llama.cpp's `-hf REPO` spelling, as `--hf REPO`.
    let args = std::env::args_os().map(|a| if a == "-hf" { "--hf".into() } else { a });
    let cli = bmoe::cli::Cli::parse_from(args);
    if let Err(e) = bmoe::cli::run(cli) {
        if e.downcast_ref::<interrupt::Interrupted>().is_some() {
            // What was kept and how to go on, where the command says.
            eprintln!("bmoe: {e:#}");
            std::process::exit(interrupt::EXIT_STATUS);
        }
        eprintln!("bmoe: error: {e:#}");
        std::process::exit(1);
    }
}
