//! The job's processes as the kernel shows them: a scan of `/proc` for every process whose
//! environment names the job, with its attempt and its node. The local cluster's two nodes
//! are this machine (node 2 in namespaces of its own), so a trainer the API server no longer
//! shows, an older attempt's still running, is found here.

use std::time::Duration;

use anyhow::{Context, Result};

use super::invariants::ProcessSeen;
use super::run::Feed;

/// How often `/proc` is scanned for the job's processes.
const PROCESS_SCANS: Duration = Duration::from_millis(500);

/// Scans `/proc` for the processes of job `job` every [`PROCESS_SCANS`] and feeds the checker
/// the attempt and node of each one alive, from the kernel rather than the API server: an
/// older attempt's trainer the API no longer shows may still run.
pub(super) fn scan_processes(job: &str, feed: Feed) -> tokio::task::JoinHandle<()> {
    let job = job.to_owned();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PROCESS_SCANS);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // Each process found was alive at some moment of the scan: no sooner than its start.
            let at = feed.started.elapsed();
            let wanted = job.clone();
            match tokio::task::spawn_blocking(move || job_processes(&wanted)).await {
                Ok(Ok(alive)) => feed.tell(|c, _| c.processes(at, &alive)),
                Ok(Err(e)) => println!("chaos: scanning /proc: {e:#}"),
                Err(e) => println!("chaos: the /proc scan did not finish: {e}"),
            }
        }
    })
}

/// The processes of job `job` alive on this machine, each with its attempt and its node, found
/// by their environment (`TRAINYARD_JOB`, `TRAINYARD_ATTEMPT`): both nodes' containers are
/// processes of this host. Zombies, and processes that end while they are read, are left out.
fn job_processes(job: &str) -> Result<Vec<ProcessSeen>> {
    let host = netns(std::process::id())
        .context("reading the network namespace of this process (node 1's)")?;
    let mut alive = Vec::new();
    for entry in std::fs::read_dir("/proc")
        .context("listing /proc")?
        .flatten()
    {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let attempt = match attempt_of(&environ, job) {
            Some(attempt) => attempt,
            None if is_spare_of(&environ, job) => {
                // A spare interpreter: of the attempt it was handed, if any, by its name.
                let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
                let Some(attempt) = spare_attempt(&comm) else {
                    continue;
                };
                attempt
            }
            None => continue,
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if is_supervisor(&environ, &cmdline) {
            continue;
        }
        if !matches!(stat(pid), Some((state, _)) if state != 'Z' && state != 'X') {
            continue;
        }
        if let Some(on_node2) = on_node2(pid, &host) {
            alive.push(ProcessSeen {
                pid,
                attempt,
                on_node2,
            });
        }
    }
    Ok(alive)
}

/// `TRAINYARD_ATTEMPT` of a process whose environment (`/proc/<pid>/environ`: NUL-separated
/// `NAME=value`) has `TRAINYARD_JOB` set to `job`.
fn attempt_of(environ: &[u8], job: &str) -> Option<u32> {
    if env_var(environ, trainyard_api::env::TRAINYARD_JOB)? != job {
        return None;
    }
    env_var(environ, trainyard_api::env::TRAINYARD_ATTEMPT)?
        .parse()
        .ok()
}

/// The value of variable `name` in a process's environment (`/proc/<pid>/environ`).
fn env_var<'a>(environ: &'a [u8], name: &str) -> Option<&'a str> {
    environ
        .split(|b| *b == 0)
        .filter_map(|var| std::str::from_utf8(var).ok())
        .find_map(|var| var.strip_prefix(name)?.strip_prefix('='))
}

/// Whether a process is a spare interpreter of job `job`'s supervisor
/// (`examples/trainyard_launch.py`): `TRAINYARD_SPARE=1`, no attempt in its environment.
fn is_spare_of(environ: &[u8], job: &str) -> bool {
    env_var(environ, "TRAINYARD_SPARE") == Some("1")
        && env_var(environ, trainyard_api::env::TRAINYARD_JOB) == Some(job)
}

/// The attempt a spare interpreter runs, from its name (`/proc/<pid>/comm`: `trainyard-aN`
/// once handed attempt N; `None` before).
fn spare_attempt(comm: &str) -> Option<u32> {
    comm.trim_end().strip_prefix("trainyard-a")?.parse().ok()
}

/// Whether a process is an in-place supervisor: `trainyard_launch.py` with
/// `TRAINYARD_SUPERVISOR_URL` set. It is the container's first process and lives as long as
/// its pod, through every attempt that restarts in place, with the environment the pod
/// started with (its attempt then); it trains nothing. The trainers it starts carry their own
/// attempt's environment and are checked like any other process.
fn is_supervisor(environ: &[u8], cmdline: &[u8]) -> bool {
    let supervised = environ
        .split(|b| *b == 0)
        .any(|var| var.starts_with(b"TRAINYARD_SUPERVISOR_URL="));
    let launcher = cmdline
        .split(|b| *b == 0)
        .any(|arg| arg.ends_with(b"trainyard_launch.py"));
    supervised && launcher
}

/// A process's state (`R`, `S`, `Z`...) and its parent, from `/proc/<pid>/stat`.
fn stat(pid: u32) -> Option<(char, u32)> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The state and parent in a `/proc/<pid>/stat` line: `pid (comm) state ppid ...`, where
/// `comm` may hold spaces and parentheses, so the fields are read after its last `)`.
fn parse_stat(line: &str) -> Option<(char, u32)> {
    let (_, rest) = line.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// The network namespace of process `pid`, as `/proc/<pid>/ns/net` names it (`net:[inode]`).
fn netns(pid: u32) -> Option<String> {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()?;
    link.to_str().map(str::to_owned)
}

/// How many ancestors of a process are looked at to tell its node (a container's processes
/// are a few levels below its shim).
const ANCESTRY: usize = 64;

/// Whether process `pid` runs on node 2, or `None` when it (or an ancestor) ends while it is
/// read; `host` is this process's network namespace, node 1's.
fn on_node2(pid: u32, host: &str) -> Option<bool> {
    let ancestry = std::iter::successors(Some(pid), |&p| stat(p).map(|(_, ppid)| ppid))
        .take_while(|&p| p != 0)
        .take(ANCESTRY)
        .map(netns);
    node2_by_netns(host, ancestry)
}

/// Tells a process's node from the network namespaces of the process and its ancestors, in
/// that order: every pod has a namespace of its own, and the first ancestor outside it (the
/// container's shim) is in its node's: `host` on node 1, node 2's own on node 2. A process in
/// `host` itself (a pod on the host network) is on node 1. `None` when a namespace could not
/// be read (the process ended) or the ancestry never left the pod.
fn node2_by_netns(host: &str, ancestry: impl IntoIterator<Item = Option<String>>) -> Option<bool> {
    let mut pod: Option<String> = None;
    for netns in ancestry {
        let netns = netns?;
        if netns == host {
            return Some(false);
        }
        match &pod {
            None => pod = Some(netns),
            Some(pod) if *pod != netns => return Some(true),
            Some(_) => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_stat_line_is_read_after_the_last_parenthesis_of_the_command() {
        assert_eq!(
            parse_stat("4242 (pt_main (x) y) S 17 4242 1 0 -1"),
            Some(('S', 17))
        );
        assert_eq!(parse_stat("7 (python3) Z 1 7"), Some(('Z', 1)));
        assert_eq!(parse_stat("7 (python3"), None);
        assert_eq!(parse_stat("7 (python3) R"), None);
    }

    #[test]
    fn only_the_launcher_with_a_supervisor_url_is_a_supervisor() {
        let url = b"TRAINYARD_JOB=c\0TRAINYARD_SUPERVISOR_URL=http://op/v1/supervisor\0";
        let launcher = b"python3\0/app/trainyard_launch.py\0torchrun\0/app/train.py\0";
        assert!(is_supervisor(url, launcher));
        // Its trainers inherit the URL but run another program.
        let torchrun = b"/usr/bin/python3\0/usr/bin/torchrun\0/app/train.py\0";
        assert!(!is_supervisor(url, torchrun));
        // The launcher of a job that restarts by recreating pods is that attempt's process.
        assert!(!is_supervisor(b"TRAINYARD_JOB=c\0", launcher));
    }

    #[test]
    fn a_process_is_the_jobs_only_with_its_exact_name_and_an_attempt() {
        let environ = |vars: &[&str]| vars.join("\0").into_bytes();
        let ours = environ(&["PATH=/bin", "TRAINYARD_JOB=chaos-1", "TRAINYARD_ATTEMPT=3"]);
        assert_eq!(attempt_of(&ours, "chaos-1"), Some(3));
        assert_eq!(attempt_of(&ours, "chaos-1-baseline"), None);
        let baseline = environ(&["TRAINYARD_JOB=chaos-1-baseline", "TRAINYARD_ATTEMPT=0"]);
        assert_eq!(attempt_of(&baseline, "chaos-1"), None);
        let lookalike = environ(&["TRAINYARD_JOB_X=chaos-1", "TRAINYARD_ATTEMPT=1"]);
        assert_eq!(attempt_of(&lookalike, "chaos-1"), None);
        let no_attempt = environ(&["TRAINYARD_JOB=chaos-1"]);
        assert_eq!(attempt_of(&no_attempt, "chaos-1"), None);
    }

    #[test]
    fn a_spare_interpreter_is_of_the_attempt_its_name_says_once_handed_one() {
        let environ = |vars: &[&str]| vars.join("\0").into_bytes();
        let spare = environ(&["TRAINYARD_JOB=chaos-1", "TRAINYARD_SPARE=1"]);
        assert!(is_spare_of(&spare, "chaos-1"));
        assert!(!is_spare_of(&spare, "chaos-1-baseline"));
        assert!(!is_spare_of(
            &environ(&["TRAINYARD_JOB=chaos-1", "TRAINYARD_ATTEMPT=0"]),
            "chaos-1"
        ));
        assert_eq!(spare_attempt("trainyard-a12\n"), Some(12));
        assert_eq!(
            spare_attempt("python3\n"),
            None,
            "not handed an attempt yet"
        );
    }

    #[test]
    fn a_process_is_on_node_2_when_its_first_ancestor_outside_its_pod_is_not_on_the_host() {
        let chain = |c: &[Option<&str>]| c.iter().map(|n| n.map(str::to_owned)).collect::<Vec<_>>();
        let (host, pod, node2) = (Some("net:[1]"), Some("net:[5]"), Some("net:[9]"));
        let node = |c: &[Option<&str>]| node2_by_netns("net:[1]", chain(c));
        // trainer, torchrun, launcher: the pod's; the shim: its node's; then init.
        assert_eq!(node(&[pod, pod, pod, host, host]), Some(false));
        assert_eq!(node(&[pod, pod, node2, node2, host]), Some(true));
        // On the host network.
        assert_eq!(node(&[host, host]), Some(false));
        // An ancestor ended while it was read, or the chain never left the pod.
        assert_eq!(node(&[pod, None, host]), None);
        assert_eq!(node(&[pod, pod]), None);
    }

    /// The processes of `job` once `done` holds for them (within 10 s), or the last found.
    fn processes_until(job: &str, done: impl Fn(&[ProcessSeen]) -> bool) -> Vec<ProcessSeen> {
        let deadline = Instant::now() + secs(10);
        loop {
            let found = job_processes(job).expect("scanning /proc");
            if done(&found) || Instant::now() > deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A unique job name for a live test's processes.
    fn mark(test: &str) -> String {
        format!(
            "trainyard-e2e-{test}-{}-{:?}",
            std::process::id(),
            Instant::now()
        )
    }

    #[test]
    fn a_process_of_the_job_in_the_hosts_namespace_is_found_on_node_1() {
        let job = mark("node1");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env("TRAINYARD_JOB", &job)
            .env("TRAINYARD_ATTEMPT", "4")
            .spawn()
            .expect("sleep");
        let found = processes_until(&job, |f| !f.is_empty());
        child.kill().expect("kill");
        child.wait().expect("wait");
        assert_eq!(
            found,
            [ProcessSeen {
                pid: child.id(),
                attempt: 4,
                on_node2: false,
            }]
        );
        // Ended (and reaped): gone.
        assert_eq!(processes_until(&job, <[_]>::is_empty), []);
    }

    /// A pod on node 2 as the local cluster lays it out: the trainer (here `sleep`) in a
    /// network namespace of its own below a parent (its shim) in another one, node 2's; the
    /// parent itself is below the host's, like a pod on node 1. Needs root (`unshare --net`).
    #[test]
    fn a_process_below_a_network_namespace_other_than_the_hosts_is_on_node_2() {
        let can = std::process::Command::new("unshare")
            .args(["--net", "true"])
            .status()
            .is_ok_and(|s| s.success());
        if !can {
            println!("unshare --net is not allowed here: node 2's processes are not tested");
            return;
        }
        let job = mark("node2");
        let mut child = std::process::Command::new("unshare")
            .args(["--net", "--fork", "--kill-child", "--"])
            .args(["unshare", "--net", "--", "sleep", "30"])
            .env("TRAINYARD_JOB", &job)
            .env("TRAINYARD_ATTEMPT", "1")
            .spawn()
            .expect("unshare");
        let found = processes_until(&job, |f| f.len() == 2 && f.iter().any(|p| p.on_node2));
        child.kill().expect("kill");
        child.wait().expect("wait");
        let on = |node2: bool| found.iter().filter(|p| p.on_node2 == node2).count();
        assert_eq!((on(false), on(true)), (1, 1), "{found:?}");
        let parent = found.iter().find(|p| !p.on_node2).map(|p| p.pid);
        assert_eq!(parent, Some(child.id()), "{found:?}");
        assert!(found.iter().all(|p| p.attempt == 1), "{found:?}");
        // --kill-child: the trainer ends with its parent; a zombie is not counted.
        assert_eq!(processes_until(&job, <[_]>::is_empty), []);
    }
}
