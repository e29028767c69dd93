//! Process and machine memory, read from `/proc` (Linux). Values that cannot
//! be read are `None`, never zero.

/// Memory figures in MiB.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MemSnapshot {
    /// Resident set (`VmRSS`).
    pub rss_mib: Option<f64>,
    /// Anonymous resident memory (`RssAnon`): the expert cache lives here.
    pub rss_anon_mib: Option<f64>,
    /// File-backed resident memory (`RssFile`): mapped model pages.
    pub rss_file_mib: Option<f64>,
    /// `MemAvailable` of the machine.
    pub available_mib: Option<f64>,
}

fn kib_field(text: &str, key: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: f64 = line[key.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib / 1024.0)
}

impl MemSnapshot {
    /// Reads the current figures.
    pub fn now() -> MemSnapshot {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        MemSnapshot {
            rss_mib: kib_field(&status, "VmRSS:"),
            rss_anon_mib: kib_field(&status, "RssAnon:"),
            rss_file_mib: kib_field(&status, "RssFile:"),
            available_mib: kib_field(&meminfo, "MemAvailable:"),
        }
    }
}

/// The largest resident set this process has had so far (`VmHWM`), MiB.
pub fn peak_rss_mib() -> Option<f64> {
    kib_field(&std::fs::read_to_string("/proc/self/status").ok()?, "VmHWM:")
}

/// Major page faults of this process so far (`/proc/self/stat`): pages it
/// had to wait for storage to bring in.
pub fn major_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(") ")?.1;
    rest.split_whitespace().nth(9)?.parse().ok()
}

/// Bytes this process has caused to be read from storage so far
/// (`read_bytes` of `/proc/self/io`: page-cache misses and direct reads).
pub fn storage_read_bytes() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines().find_map(|l| l.strip_prefix("read_bytes:"))?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_fields() {
        let text = "Name:\tbmoe\nVmRSS:\t  2048 kB\nRssAnon:\t 1024 kB\n";
        assert_eq!(kib_field(text, "VmRSS:"), Some(2.0));
        assert_eq!(kib_field(text, "RssFile:"), None);
        let now = MemSnapshot::now();
        assert!(now.rss_mib.is_some_and(|r| r > 0.0));
        assert!(major_faults().is_some());
        assert!(storage_read_bytes().is_some());
    }
}
