//! The `bmoe` command.

use bmoe::interrupt;
use clap::Parser;

fn main() {
    let cli = bmoe::cli::Cli::parse();
    if let Err(e) = bmoe::cli::run(cli) {
        if e.downcast_ref::<interrupt::Interrupted>().is_some() {
            eprintln!("bmoe: interrupted");
            std::process::exit(interrupt::EXIT_STATUS);
        }
        eprintln!("bmoe: error: {e:#}");
        std::process::exit(1);
    }
}
