//! Emulated disks: the harness throttles reads from the model's block
//! device inside its cgroup, at a rate given in MB/s or by a device class,
//! and checks that the throttle holds for the kinds of read bmoe makes.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use super::cgroup::{Cgroup, ReadThrottle};

/// A class of storage device and the read speed the harness gives it.
#[derive(Debug, Clone, Copy)]
pub struct DiskClass {
    /// Its name on the command line.
    pub name: &'static str,
    /// Read speed, MB/s (10^6 bytes).
    pub mbps: u64,
    /// What it stands for.
    pub what: &'static str,
}

/// The device classes `bench --disk-class` knows: large reads' sustained
/// speed, the size of an expert slice's read.
pub const DISK_CLASSES: [DiskClass; 4] = [
    DiskClass { name: "ufs", mbps: 2000, what: "a phone's UFS 3.1 flash (about 2 GB/s sequential read)" },
    DiskClass { name: "nvme", mbps: 800, what: "a Raspberry Pi 5's NVMe on its one PCIe 2.0 lane (about 0.8 GB/s)" },
    DiskClass { name: "emmc", mbps: 300, what: "eMMC 5.1 flash on a board or a budget phone (about 0.3 GB/s)" },
    DiskClass { name: "sd", mbps: 90, what: "a UHS-I microSD card (about 90 MB/s)" },
];

/// The class named `name`.
pub fn disk_class(name: &str) -> Result<DiskClass, String> {
    DISK_CLASSES.iter().copied().find(|c| c.name == name).ok_or_else(|| {
        let names: Vec<&str> = DISK_CLASSES.iter().map(|c| c.name).collect();
        format!("--disk-class {name}: one of {}", names.join(", "))
    })
}

/// The whole disk holding `path`, as `major:minor` (a partition's reads
/// are throttled on its disk).
pub fn block_device(path: &Path) -> Result<(u32, u32), String> {
    let dev = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?.dev();
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    let sys = format!("/sys/dev/block/{major}:{minor}");
    if !Path::new(&sys).exists() {
        return Err(format!(
            "{} is on device {major}:{minor}, which is not a block device (a network or overlay file system?): \
             reads from it cannot be throttled",
            path.display()
        ));
    }
    if Path::new(&sys).join("partition").exists() {
        let parent = std::fs::read_to_string(format!("{sys}/../dev")).map_err(|e| format!("{sys}/../dev: {e}"))?;
        let (a, b) = parent.trim().split_once(':').ok_or_else(|| format!("{sys}/../dev: `{}`", parent.trim()))?;
        return Ok((a.parse().map_err(|_| format!("{sys}/../dev: {parent}"))?, b.parse().map_err(|_| parent.clone())?));
    }
    Ok((major, minor))
}

/// A throttle of `mbps` MB/s on the disk holding `model`.
pub fn throttle_for(model: &Path, mbps: u64) -> Result<ReadThrottle, String> {
    Ok(ReadThrottle { device: block_device(model)?, bytes_per_s: mbps * 1_000_000 })
}

/// Read speeds measured inside the throttled cgroup, MB/s.
#[derive(Debug, Clone, Copy)]
pub struct ThrottleCheck {
    /// Reads that bypass the page cache (bmoe's read lanes).
    pub direct_mbps: f64,
    /// Reads through the page cache (mmap's faults and `--no-odirect`).
    pub buffered_mbps: f64,
}

impl ThrottleCheck {
    /// Whether both kinds of read stayed near the limit (within 25% above).
    pub fn holds(&self, mbps: u64) -> bool {
        let ceiling = mbps as f64 * 1.25;
        self.direct_mbps <= ceiling && self.buffered_mbps <= ceiling
    }
}

/// Reads about a second's worth of `model` at the limit, with O_DIRECT and
/// then buffered, by `dd` inside `cgroup`, page cache dropped before each.
pub fn check(cgroup: &Cgroup, model: &Path, mbps: u64) -> Result<ThrottleCheck, String> {
    let size = std::fs::metadata(model).map_err(|e| format!("{}: {e}", model.display()))?.len();
    let mib = (mbps * 1_000_000 / (1 << 20)).clamp(8, 512).min(size >> 20).max(1);
    let rate = |direct: bool| -> Result<f64, String> {
        super::drop_page_cache();
        let mut dd = super::in_cgroup(cgroup, "dd".as_ref());
        dd.arg(format!("if={}", model.display())).arg("of=/dev/null").arg("bs=1M").arg(format!("count={mib}"));
        if direct {
            dd.arg("iflag=direct");
        }
        let start = Instant::now();
        let out = dd.stdout(Stdio::null()).stderr(Stdio::piped()).output().map_err(|e| format!("running dd: {e}"))?;
        let secs = start.elapsed().as_secs_f64();
        if !out.status.success() {
            return Err(format!("dd: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok((mib << 20) as f64 / 1e6 / secs)
    };
    Ok(ThrottleCheck { direct_mbps: rate(true)?, buffered_mbps: rate(false)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_resolve_by_name_and_a_file_finds_its_disk() {
        assert_eq!(disk_class("sd").unwrap().mbps, 90);
        assert!(disk_class("floppy").unwrap_err().contains("ufs, nvme, emmc, sd"));
        // This crate's own manifest lives on some block device of this machine.
        let (major, _) = block_device(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
        assert!(major > 0);
        let sys = format!(
            "/sys/dev/block/{}:{}",
            block_device(Path::new("/")).unwrap().0,
            block_device(Path::new("/")).unwrap().1
        );
        assert!(!Path::new(&sys).join("partition").exists(), "{sys} is a partition, not its disk");
    }
}
