//! CPU accounting: the server's threads and `redis-server`, from
//! `/proc/…/schedstat`.

use std::time::Duration;

/// CPU time (ns) used so far by the server's threads and `redis-server`,
/// from `/proc/…/schedstat` (`None` where that is not readable). The
/// generator's own thread measures itself (`Tally::cpu_ns` in generator.rs).
#[derive(Clone, Copy, Debug)]
pub struct CpuTimes {
    pub server: Option<u64>,
    pub redis: Option<u64>,
}

/// CPU use over the recorded seconds: µs per answered request, and the
/// share of one core each part kept busy.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuUse {
    pub server_us_per_req: Option<f64>,
    pub redis_us_per_req: Option<f64>,
    pub server_busy: Option<f64>,
    pub generator_busy: Option<f64>,
    pub redis_busy: Option<f64>,
}

/// Where the server runs.
pub enum ServerThreads {
    /// This process's `load-server*` threads and fleetlimit's own.
    InProcess,
    /// Every thread of these processes (the fleet's children).
    Processes(Vec<u32>),
}

impl CpuTimes {
    pub fn take(server: &ServerThreads, redis_pid: u32) -> Self {
        let server = match server {
            // fleetlimit's own threads (its Redis I/O thread, a batch
            // window's) are the server's work too.
            ServerThreads::InProcess => threads_cpu_ns("self", |comm| {
                comm.starts_with("load-server") || comm.starts_with("fleetlimit-")
            }),
            ServerThreads::Processes(pids) => pids
                .iter()
                .map(|pid| threads_cpu_ns(&pid.to_string(), |_| true))
                .sum::<Option<u64>>(),
        };
        Self {
            server,
            redis: threads_cpu_ns(&redis_pid.to_string(), |_| true),
        }
    }

    pub fn since(
        &self,
        before: &Self,
        secs: Duration,
        requests: u64,
        generator: Option<u64>,
    ) -> CpuUse {
        let delta = |a: Option<u64>, b: Option<u64>| Some(a?.saturating_sub(b?) as f64);
        let per_req = |d: Option<f64>| {
            d.filter(|_| requests > 0)
                .map(|d| d / 1e3 / requests as f64)
        };
        let busy = |d: Option<f64>| d.map(|d| d / 1e9 / secs.as_secs_f64());
        let server = delta(self.server, before.server);
        let generator = generator.map(|g| g as f64);
        let redis = delta(self.redis, before.redis);
        CpuUse {
            server_us_per_req: per_req(server),
            redis_us_per_req: per_req(redis),
            server_busy: busy(server),
            generator_busy: busy(generator),
            redis_busy: busy(redis),
        }
    }
}

impl CpuUse {
    /// "server / generator / Redis" busy, in % of one core.
    pub fn busy(&self) -> String {
        let pct =
            |v: Option<f64>| v.map_or_else(|| "?".to_owned(), |v| format!("{:.0}", v * 100.0));
        format!(
            "{} / {} / {}",
            pct(self.server_busy),
            pct(self.generator_busy),
            pct(self.redis_busy)
        )
    }
}

/// The calling thread's CPU time, ns.
pub fn thread_self_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The CPU time (ns, first field of `schedstat`) of the threads of process
/// `pid` ("self" for this one) whose name passes `pick`; `None` if none
/// was found or `/proc` cannot be read.
pub fn threads_cpu_ns(pid: &str, pick: impl Fn(&str) -> bool) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = None;
    for task in tasks.flatten() {
        let dir = task.path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        if !pick(comm.trim_end()) {
            continue;
        }
        let ns = std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
        if let Some(ns) = ns {
            total = Some(total.unwrap_or(0) + ns);
        }
    }
    total
}
