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
            // From the far end: as many layers as each server's memory holds.
            let largest = sizes.iter().copied().max().unwrap_or(0).max(1);
            let fits: Vec<u32> =
                devices.iter().map(|d| (d.free_bytes as f64 * MEMORY_SHARE / largest as f64) as u32).collect();
            let total = fits.iter().sum::<u32>().min(max_remote as u32);
            let mut left = total;
            fits.iter()
                .map(|&f| {
                    let n = f.min(left);
                    left -= n;
                    n
                })
                .collect()
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
    fn a_total_splits_by_memory_with_nothing_lost() {
        assert_eq!(split_by(8, &[1, 1]), [4, 4]);
        assert_eq!(split_by(7, &[1, 1]).iter().sum::<u32>(), 7);
        assert_eq!(split_by(9, &[2, 1]), [6, 3]);
        assert_eq!(split_by(3, &[0, 5]), [0, 3]);
    }
}
