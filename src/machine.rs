//! What the machine gives the process, read once at start: the open-files limit (raised to its
//! hard limit, since every client connection is a file descriptor) and the memory, from which
//! the defaults of `server.max_connections` and `ingest.max_queued_bytes` are derived.

/// Raises the soft open-files limit to the hard limit and returns the limit in force (`None`
/// where it cannot be read).
pub fn raise_open_files() -> Option<u64> {
    rlimit::increase_nofile_limit(u64::MAX).ok()
}

/// The default connection limit for `open_files` descriptors: all of them but a reserve (up to
/// 1024, a quarter of a small limit) for the store, log files, outgoing connections and the
/// runtime.
pub fn default_max_connections(open_files: u64) -> usize {
    let reserve = (open_files / 4).min(1024);
    open_files.saturating_sub(reserve).max(16) as usize
}

/// The memory the process may use: the cgroup's limit when there is one, else the machine's.
pub fn memory_bytes() -> Option<u64> {
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    });
    match (cgroup, total) {
        (Some(c), Some(t)) => Some(c.min(t)),
        (c, t) => c.or(t),
    }
}

/// The default memory budget for queued input: 1/16 of `memory`, between 64 MiB and 1 GiB
/// (256 MiB when the memory is unknown).
pub fn default_queued_bytes(memory: Option<u64>) -> usize {
    const MIB: u64 = 1 << 20;
    memory.map_or(256 * MIB, |m| (m / 16).clamp(64 * MIB, 1024 * MIB)) as usize
}

/// Lowers the calling thread's CPU priority (nice +10 for this thread only, on Linux) so that
/// background work (checkpoint writing) yields the cores to the shards,
/// the publisher and the HTTP workers when the machine is busy, and still runs at full speed
/// when it is not. Best effort: a failure is ignored (the work runs at normal priority).
pub fn lower_thread_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: `gettid` has no preconditions; `setpriority` on our own thread id only changes
    // this thread's nice value.
    unsafe {
        let tid = libc::gettid();
        let _ = libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_scale_with_the_machine_and_stay_in_their_bounds() {
        assert_eq!(default_max_connections(20_000), 18_976);
        assert_eq!(default_max_connections(1024), 768);
        assert_eq!(default_max_connections(10), 16);
        assert_eq!(default_queued_bytes(Some(24 << 30)), 1 << 30);
        assert_eq!(default_queued_bytes(Some(512 << 20)), 64 << 20);
        assert_eq!(default_queued_bytes(Some(4 << 30)), 256 << 20);
        assert_eq!(default_queued_bytes(None), 256 << 20);
    }
}
