//! The `bmoe` command.

use clap::Parser;

fn main() {
    let cli = bmoe::cli::Cli::parse();
    if let Err(e) = bmoe::cli::run(cli) {
        eprintln!("bmoe: error: {e:#}");
        std::process::exit(1);
    }
}
