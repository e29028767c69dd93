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
             {} can use this machine's memory and CPU. Serve only on a network you trust.",
            if unspecified(&args.host) {
                format!("port {} of this machine", args.port)
            } else {
                format!("{}:{}", args.host, args.port)
            }
        );
    }
    eprintln!(
        "bmoe rpc-server: {}; one client at a time",
        connect_hint(&args.host, args.port, &rpc::local_addresses())
    );
    rpc::serve(&args.host, args.port, threads, args.cache_dir.as_deref()).map_err(|e| anyhow!(e))
}

/// True for a host that means every address of this machine.
fn unspecified(host: &str) -> bool {
    host.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_unspecified())
}

/// What a client passes to reach a server listening on `host:port`: that
/// address, or for `0.0.0.0` (`::`) this machine's own addresses, `local`
/// (IPv4 ones only for `0.0.0.0`), as the wildcard is no address a client
/// can connect to.
fn connect_hint(host: &str, port: u16, local: &[std::net::IpAddr]) -> String {
    let endpoint =
        |ip: &dyn std::fmt::Display, v6: bool| if v6 { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") };
    if !unspecified(host) {
        return format!("clients connect with `--rpc {}`", endpoint(&host, host.contains(':')));
    }
    let v4_only = host == "0.0.0.0";
    let usable: Vec<String> =
        local.iter().filter(|ip| !v4_only || ip.is_ipv4()).map(|ip| endpoint(ip, ip.is_ipv6())).collect();
    match usable.as_slice() {
        [] => format!(
            "clients connect with `--rpc ADDRESS:{port}`, ADDRESS being this machine's address on their network (it \
             shows no address but loopback: 127.0.0.1:{port} from this machine)"
        ),
        [one] => format!("clients connect with `--rpc {one}` (this machine's address)"),
        [first, rest @ ..] => {
            format!("clients connect with `--rpc {first}`, or another of this machine's addresses: {}", rest.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_host_is_told_as_this_machines_addresses() {
        let local: Vec<std::net::IpAddr> = vec!["192.168.1.20".parse().unwrap(), "fd00::5".parse().unwrap()];
        assert_eq!(connect_hint("192.168.1.20", 50052, &local), "clients connect with `--rpc 192.168.1.20:50052`");
        assert_eq!(connect_hint("::1", 7, &local), "clients connect with `--rpc [::1]:7`");
        let v4 = connect_hint("0.0.0.0", 50052, &local);
        assert_eq!(v4, "clients connect with `--rpc 192.168.1.20:50052` (this machine's address)");
        let any = connect_hint("::", 50052, &local);
        assert!(any.contains("`--rpc 192.168.1.20:50052`") && any.contains("[fd00::5]:50052"), "{any}");
        let none = connect_hint("0.0.0.0", 9, &[]);
        assert!(!none.contains("0.0.0.0") && none.contains("ADDRESS:9"), "{none}");
        assert!(unspecified("[::]") && unspecified("0.0.0.0") && !unspecified("localhost"));
    }
}
