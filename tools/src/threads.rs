//! Thread placement and CPU time for the benchmark programs (shared by `bench_callgrind` and
//! `map_threads`).

/// With `TOLLGATE_PIN=1`, pins the calling thread to CPU `t` (modulo the CPUs available), so that
/// two benchmark threads run on two CPUs at once instead of where the scheduler happens to put them.
pub fn pin(t: usize) {
    if std::env::var_os("TOLLGATE_PIN").is_some_and(|v| v == "1") {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let mut set = rustix::thread::CpuSet::new();
        set.set(t % cpus);
        if let Err(e) = rustix::thread::sched_setaffinity(None, &set) {
            eprintln!("TOLLGATE_PIN: {e}");
        }
    }
}

/// The calling thread's time on a CPU so far, in nanoseconds (`/proc/thread-self/schedstat`; 0 where
/// it is missing).
pub fn cpu_nanos() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
