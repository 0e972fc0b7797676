//! Pure parsers of the kernel files telemetry reads: `/proc/PID/stat`,
//! `/proc/PID/status` and the cgroup files with CPU and memory use. Each takes
//! text the caller read with a bound ([`MAX_FILE_BYTES`]) and answers `None`
//! for anything it does not understand, never a panic.

/// The most bytes read from one kernel file (they are a few hundred).
pub(crate) const MAX_FILE_BYTES: u64 = 64 << 10;

/// What telemetry needs of `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStat {
    /// The process group.
    pub pgrp: u32,
    /// CPU time in clock ticks: its own (user + system) and that of the
    /// children it waited for, so a child's time is not lost when it exits.
    pub ticks: u64,
}

/// Parses `/proc/PID/stat`. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted from the last `)`.
pub(crate) fn parse_stat(text: &str) -> Option<ProcStat> {
    let (_, rest) = text.rsplit_once(')')?;
    // After the name: state (3), ppid (4), pgrp (5), ..., utime (14),
    // stime (15), cutime (16), cstime (17).
    let fields: Vec<&str> = rest.split_whitespace().take(15).collect();
    let field = |number: usize| fields.get(number - 3).copied();
    let pgrp = field(5)?.parse().ok()?;
    let mut ticks: u64 = 0;
    for number in 14..=17 {
        // cutime and cstime are signed in the kernel's format; never negative in practice.
        let value: i64 = field(number)?.parse().ok()?;
        ticks = ticks.saturating_add(u64::try_from(value).unwrap_or(0));
    }
    Some(ProcStat { pgrp, ticks })
}

/// `VmRSS` of `/proc/PID/status`, in bytes (absent for kernel threads and zombies).
pub(crate) fn parse_vm_rss(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix("VmRSS:")?;
        let mut parts = rest.split_whitespace();
        let kib: u64 = parts.next()?.parse().ok()?;
        (parts.next() == Some("kB")).then(|| kib.saturating_mul(1024))
    })
}

/// A single number (`cpuacct.usage`, `memory.current`, `memory.usage_in_bytes`).
pub(crate) fn parse_number(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// The value of `key` in a flat keyed file (`cpu.stat`, `memory.stat`: `key value` lines).
pub(crate) fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        (parts.next()? == key).then(|| parts.next()?.parse().ok())?
    })
}

/// The process ids listed in a `cgroup.procs` file.
pub(crate) fn parse_pids(text: &str) -> Vec<u32> {
    text.lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect()
}

/// A cgroup's working set: its memory use less the page cache the kernel may
/// drop at once (inactive file pages), as `docker stats` and the kubelet count it.
pub(crate) fn working_set(usage: u64, stat: &str, v2: bool) -> u64 {
    let key = if v2 {
        "inactive_file"
    } else {
        "total_inactive_file"
    };
    usage.saturating_sub(keyed(stat, key).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/proc/PID/stat` of a shell on Linux 6.1, with a name holding `) (`.
    const STAT: &str = "4242 (sh) (x) S 4200 4242 4200 34816 4242 4194304 1195 8452 0 3 57 19 203 88 20 0 1 0 8818 2670592 221 18446744073709551615 1 1 0 0 0 0 65536 4 65538 0 0 0 17 1 0 0 0 0 0\n";

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        assert_eq!(
            parse_stat(STAT),
            Some(ProcStat {
                pgrp: 4242,
                ticks: 57 + 19 + 203 + 88,
            })
        );
        assert_eq!(parse_stat("4242 (sh) S 1"), None);
        assert_eq!(parse_stat(""), None);
        assert_eq!(parse_stat("garbage ) x y z"), None);
    }

    #[test]
    fn rss_from_status() {
        let status = "Name:\tpython3\nUmask:\t0022\nState:\tR (running)\nVmPeak:\t  221444 kB\nVmRSS:\t  204872 kB\nRssAnon:\t  198000 kB\n";
        assert_eq!(parse_vm_rss(status), Some(204_872 * 1024));
        assert_eq!(
            parse_vm_rss("Name:\tkthreadd\nState:\tS (sleeping)\n"),
            None
        );
        assert_eq!(parse_vm_rss("VmRSS:\t12 MB\n"), None);
    }

    #[test]
    fn cgroup_files() {
        // cgroup v2 `cpu.stat` and v1 `cpuacct.usage`.
        let cpu_stat = "usage_usec 1843920\nuser_usec 1200000\nsystem_usec 643920\nnr_periods 0\n";
        assert_eq!(keyed(cpu_stat, "usage_usec"), Some(1_843_920));
        assert_eq!(keyed(cpu_stat, "usage"), None);
        assert_eq!(parse_number("98765432100\n"), Some(98_765_432_100));
        assert_eq!(parse_number("max\n"), None);
        // v1 `memory.stat` and v2 `memory.stat` as the kernel writes them.
        let v1 = "cache 4096\nrss 209715200\ntotal_cache 4096\ntotal_rss 209715200\ntotal_inactive_file 8192\n";
        assert_eq!(working_set(209_735_680, v1, false), 209_727_488);
        let v2 = "anon 209715200\nfile 1048576\ninactive_file 1048576\nactive_file 0\n";
        assert_eq!(working_set(210_763_776, v2, true), 209_715_200);
        assert_eq!(working_set(5, "inactive_file 10\n", true), 0);
        assert_eq!(parse_pids("12\n13\nx\n\n14\n"), vec![12, 13, 14]);
    }

    #[test]
    fn this_process_parses() {
        let pid = std::process::id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let parsed = parse_stat(&stat).expect("our own stat parses");
        assert!(parsed.pgrp > 0);
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        assert!(parse_vm_rss(&status).unwrap() > 1 << 20);
    }
}
