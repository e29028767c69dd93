//! `bmoe rpc-server`: lends this machine's CPU to a bmoe (or llama.cpp)
//! client over llama.cpp's RPC protocol, so the client can hold some of a
//! model's layers here (`--rpc HOST:PORT` on the client).

use std::path::PathBuf;

use anyhow::{Result, anyhow};
use clap::Args;

use crate::llama::rpc;

/// Flags of `bmoe rpc-server`.
#[derive(Debug, Args)]
pub struct RpcServerArgs {
    /// Address to listen on. The protocol has no authentication: anyone who can reach the port
    /// can run computations and read or write this server's memory buffers, so bind to a
    /// private network's address only, never to a public one.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 50052)]
    pub port: u16,
    /// Compute threads [default: one per core].
    #[arg(short, long)]
    pub threads: Option<usize>,
    /// Keep large tensors a client uploads in this directory, by hash, so a client that opens
    /// the same model again sends only the hashes.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
}

/// Serves until the process is stopped (Ctrl-C).
pub fn rpc_server(args: RpcServerArgs) -> Result<()> {
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if threads == 0 {
        return Err(anyhow!("--threads must be at least 1"));
    }
    let cpu = rpc::local_backend().map_err(|e| anyhow!(e))?;
    let mib = |b: u64| b as f64 / 1048576.0;
    eprintln!(
        "bmoe rpc-server: serving {} ({:.0} MiB, {:.0} MiB free) with {threads} thread(s) on {}:{}",
        cpu.description,
        mib(cpu.total_bytes),
        mib(cpu.free_bytes),
        args.host,
        args.port
    );
    if let Some(dir) = &args.cache_dir {
        eprintln!("bmoe rpc-server: tensor cache in {}", dir.display());
    }
    let local = matches!(args.host.as_str(), "127.0.0.1" | "localhost" | "::1");
    if local {
        eprintln!(
            "bmoe rpc-server: listening on this machine only; to serve other machines, pass --host with this \
             machine's address on a private network"
        );
    } else {
        eprintln!(
            "bmoe rpc-server: warning: the RPC protocol has no authentication or encryption; anyone who can reach \
             {}:{} can use this machine's memory and CPU. Serve only on a network you trust.",
            args.host, args.port
        );
    }
    eprintln!("bmoe rpc-server: clients connect with `--rpc {}:{}`; one client at a time", args.host, args.port);
    rpc::serve(&args.host, args.port, threads, args.cache_dir.as_deref()).map_err(|e| anyhow!(e))
}
