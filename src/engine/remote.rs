//! Layers on other machines: which RPC servers hold which of a model's
//! layers. llama.cpp places the last layers (and the output head) on the
//! servers, in the order given; the first layers stay here, where bmoe
//! streams their experts as in a single-machine run.

use crate::gguf::ModelFiles;
use crate::llama::RemoteLayers;
use crate::llama::rpc::{self, RemoteDevice};

/// Share of a server's free memory the default split fills, leaving room
/// for its compute buffers and KV cache.
const MEMORY_SHARE: f64 = 0.85;

/// RPC servers and how many layers each holds.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcOptions {
    /// Servers, `HOST:PORT`, in the order they take layers.
    pub servers: Vec<String>,
    /// Layers per server; one number is a total split by the servers'
    /// free memory; empty: as many as the servers' free memory holds.
    pub layers: Vec<u32>,
}

impl RpcOptions {
    /// Reads `HOST:PORT[,HOST:PORT...]` and `N[,N...]` (either may be
    /// empty); `None` when no server is named.
    pub fn parse(servers: &str, layers: &str) -> Result<Option<RpcOptions>, String> {
        let servers: Vec<String> =
            servers.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect();
        for s in &servers {
            rpc::parse_endpoint(s)?;
        }
        let layers = layers
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|n| n.parse::<u32>().map_err(|_| format!("`{n}` is not a layer count")))
            .collect::<Result<Vec<_>, _>>()?;
        if servers.is_empty() {
            return Ok(None);
        }
        if layers.len() > 1 && layers.len() != servers.len() {
            return Err(format!(
                "{} layer counts for {} servers: give one count per server, or one total",
                layers.len(),
                servers.len()
            ));
        }
        Ok(Some(RpcOptions { servers, layers }))
    }

    /// The `rpc_layers` text to keep when the server list becomes
    /// `servers`, and a note when it changes: counts given per server
    /// belong to the old list, so for a list of another length they become
    /// their total, split by the new servers' free memory; with no server
    /// left, they go. A total, or counts that still match, stay as they are
    /// (as does text that does not parse, for the check to refuse).
    pub fn layers_for(servers: &str, layers: &str) -> (String, Option<String>) {
        let n_servers = servers.split(',').filter(|s| !s.trim().is_empty()).count();
        let counts: Result<Vec<u32>, _> =
            layers.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::parse::<u32>).collect();
        let Ok(counts) = counts else { return (layers.to_string(), None) };
        if counts.is_empty() {
            return (layers.to_string(), None);
        }
        if n_servers == 0 {
            return (String::new(), Some(format!("rpc_layers `{layers}` cleared: no RPC servers are left")));
        }
        if counts.len() == 1 || counts.len() == n_servers {
            return (layers.to_string(), None);
        }
        let total: u32 = counts.iter().sum();
        let note = format!(
            "rpc_layers `{layers}` gave one count per server of {} servers; {n_servers} now take {total} layers in \
             all, split by their free memory (rpc_layers = {total})",
            counts.len()
        );
        (total.to_string(), Some(note))
    }
}

/// Bytes of each layer's tensors (`blk.N.*`), by layer.
fn layer_sizes(files: &ModelFiles, n_layer: usize) -> Vec<u64> {
    let mut sizes = vec![0u64; n_layer];
    for t in files.tensors() {
        let layer = t.info.name.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|l| l.parse().ok());
        if let Some(il) = layer.filter(|&il: &usize| il < n_layer) {
            sizes[il] += t.info.size;
        }
    }
    sizes
}

/// `total` split in proportion to `weights` (largest remainders first).
fn split_by(total: u32, weights: &[u64]) -> Vec<u32> {
    let sum: u64 = weights.iter().sum::<u64>().max(1);
    let exact: Vec<f64> = weights.iter().map(|&w| f64::from(total) * w as f64 / sum as f64).collect();
    let mut out: Vec<u32> = exact.iter().map(|x| x.floor() as u32).collect();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())));
    for &i in order.iter().cycle().take((total - out.iter().sum::<u32>()) as usize) {
        out[i] += 1;
    }
    out
}

/// The layers each server takes when no counts are given: each holds at
/// most what [`MEMORY_SHARE`] of its `free` bytes holds of layers of
/// `largest` bytes, all together at most `max_remote`, and the total is
/// split in proportion to the free memory (a server that is full passes
/// its share to the others).
fn default_split(free: &[u64], largest: u64, max_remote: u32) -> Vec<u32> {
    let fits: Vec<u32> = free.iter().map(|&f| (f as f64 * MEMORY_SHARE / largest.max(1) as f64) as u32).collect();
    let mut out = vec![0u32; free.len()];
    let mut left = fits.iter().sum::<u32>().min(max_remote);
    while left > 0 {
        let room: Vec<u64> = (0..free.len()).map(|i| if out[i] < fits[i] { free[i] } else { 0 }).collect();
        if room.iter().all(|&w| w == 0) {
            break;
        }
        let mut placed = 0;
        for (i, n) in split_by(left, &room).into_iter().enumerate() {
            let n = n.min(fits[i] - out[i]);
            out[i] += n;
            placed += n;
        }
        if placed == 0 {
            break;
        }
        left -= placed;
    }
    out
}

/// Connects to the servers and decides which layers each holds. At most
/// `max_remote` of the `n_layer` layers go remote (the first ones stay:
/// a streamed session needs a layer of its own to stream).
pub fn place(
    options: &RpcOptions,
    files: &ModelFiles,
    n_layer: usize,
    max_remote: usize,
) -> Result<RemoteLayers, String> {
    let mut devices: Vec<RemoteDevice> = Vec::with_capacity(options.servers.len());
    for server in &options.servers {
        let offered = rpc::connect(server)?;
        // A server offering several devices lends its first (a bmoe
        // rpc-server offers one: its CPU).
        devices
            .push(offered.into_iter().next().ok_or_else(|| format!("the RPC server at {server} offers no devices"))?);
    }
    let sizes = layer_sizes(files, n_layer);
    let layers = match options.layers.as_slice() {
        [] => {
            // As many layers as the servers' memory holds (85% of each
            // one's free memory, counting the largest layer), split between
            // them by their free memory.
            let largest = sizes.iter().copied().max().unwrap_or(0).max(1);
            let free: Vec<u64> = devices.iter().map(|d| d.free_bytes).collect();
            default_split(&free, largest, max_remote as u32)
        }
        [total] if devices.len() > 1 => split_by(*total, &devices.iter().map(|d| d.free_bytes).collect::<Vec<_>>()),
        counts => counts.to_vec(),
    };
    let total: usize = layers.iter().map(|&n| n as usize).sum();
    if total > max_remote {
        return Err(format!(
            "{total} layers on RPC servers, but at most {max_remote} of the model's {n_layer} can go there{}",
            if max_remote < n_layer { " (a streamed session keeps at least its first layer here)" } else { "" }
        ));
    }
    let placed = RemoteLayers { devices, layers, n_layer: n_layer as u32 };
    // The output head (final norm and vocabulary projection) goes with the last layer.
    let head: u64 = files.tensors().filter(|t| t.info.name.starts_with("output")).map(|t| t.info.size).sum();
    for (device, range) in placed.devices.iter().zip(placed.ranges()) {
        let mut bytes: u64 = sizes[range.start as usize..range.end as usize].iter().sum();
        if !range.is_empty() && range.end as usize == n_layer {
            bytes += head;
        }
        if bytes > device.free_bytes {
            return Err(format!(
                "layers {}-{} ({:.0} MiB with the output head where it goes) do not fit on the RPC server at {} ({:.0} \
                 MiB free); give it fewer with --rpc-layers",
                range.start,
                range.end.saturating_sub(1),
                bytes as f64 / 1048576.0,
                device.endpoint,
                device.free_bytes as f64 / 1048576.0
            ));
        }
    }
    Ok(placed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_refuse_with_reasons() {
        assert_eq!(RpcOptions::parse("", "").unwrap(), None);
        let o = RpcOptions::parse("a:1, b:2", "3,4").unwrap().unwrap();
        assert_eq!(o.servers, ["a:1", "b:2"]);
        assert_eq!(o.layers, [3, 4]);
        assert_eq!(RpcOptions::parse("a:1,b:2", "8").unwrap().unwrap().layers, [8]);
        assert!(RpcOptions::parse("a:1,b:2", "1,2,3").unwrap_err().contains("one count per server"));
        assert!(RpcOptions::parse("a", "").unwrap_err().contains("HOST:PORT"));
        assert!(RpcOptions::parse("a:1", "x").unwrap_err().contains("`x`"));
    }

    #[test]
    fn counts_of_another_server_list_become_their_total() {
        // A server gone: `:set rpc A` after `--rpc A,B --rpc-layers 1,1`.
        let (layers, note) = RpcOptions::layers_for("a:1", "1,1");
        assert_eq!(layers, "2");
        assert!(note.unwrap().contains("2 layers in all"));
        assert!(RpcOptions::parse("a:1", &layers).unwrap().is_some());
        assert_eq!(RpcOptions::layers_for("a:1,b:2,c:3", "4,4").0, "8");
        // Still matching, a total, nothing, or text the check refuses: kept.
        for (servers, layers) in [("a:1,c:3", "1,2"), ("a:1", "6"), ("a:1,b:2,c:3", "6"), ("a:1", ""), ("a:1", "x,1")] {
            assert_eq!(RpcOptions::layers_for(servers, layers), (layers.to_string(), None), "{servers} {layers}");
        }
        // No server left: the counts go with them.
        let (layers, note) = RpcOptions::layers_for("", "1,1");
        assert_eq!(layers, "");
        assert!(note.is_some());
        assert_eq!(RpcOptions::layers_for(" ", "3"), (String::new(), RpcOptions::layers_for("", "3").1));
    }

    #[test]
    fn without_counts_the_servers_share_the_layers_by_free_memory() {
        const GIB: u64 = 1 << 30;
        // Two servers with room for everything: split by their free memory,
        // not all on the first.
        assert_eq!(default_split(&[10 * GIB, 10 * GIB], GIB, 15), [8, 7]);
        assert_eq!(default_split(&[16 * GIB, 8 * GIB], GIB, 3), [2, 1]);
        assert_eq!(default_split(&[8 * GIB, 24 * GIB], GIB, 8), [2, 6]);
        // A full server passes its share on: 2 GiB holds one layer at 85%.
        assert_eq!(default_split(&[2 * GIB, 100 * GIB], GIB, 40), [1, 39]);
        // Memory, not the cap, bounds the total.
        assert_eq!(default_split(&[2 * GIB, 3 * GIB], GIB, 40), [1, 2]);
        assert_eq!(default_split(&[GIB / 2, 100 * GIB], GIB, 3), [0, 3]);
        assert_eq!(default_split(&[0, 0], GIB, 3), [0, 0]);
        assert_eq!(default_split(&[5 * GIB], GIB, 3), [3]);
    }

    #[test]
    fn a_total_splits_by_memory_with_nothing_lost() {
        assert_eq!(split_by(8, &[1, 1]), [4, 4]);
        assert_eq!(split_by(7, &[1, 1]).iter().sum::<u32>(), 7);
        assert_eq!(split_by(9, &[2, 1]), [6, 3]);
        assert_eq!(split_by(3, &[0, 5]), [0, 3]);
    }
}
