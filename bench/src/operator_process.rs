//! The operator under test as a child process: started from its release (or debug) binary,
//! measured through /proc (peak RSS, CPU seconds) and its own /metrics, stopped by PID.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::error::{Error, Result};

/// Memory and CPU of a process, read from /proc.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessUsage {
    /// Peak resident set size (VmHWM), MiB.
    pub peak_rss_mib: f64,
    /// Current resident set size (VmRSS), MiB.
    pub rss_mib: f64,
    /// User plus system CPU time, seconds.
    pub cpu_seconds: f64,
}

impl ProcessUsage {
    /// Reads `/proc/<pid>/status` and `/proc/<pid>/stat`.
    pub fn read(pid: u32, clock_ticks: f64) -> Result<Self> {
        let status_path = format!("/proc/{pid}/status");
        let status = std::fs::read_to_string(&status_path)
            .map_err(Error::io(format!("reading {status_path}")))?;
        let kib = |key: &str| -> f64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let stat_path = format!("/proc/{pid}/stat");
        let stat = std::fs::read_to_string(&stat_path)
            .map_err(Error::io(format!("reading {stat_path}")))?;
        let cpu_seconds = parse_stat_cpu_ticks(&stat)
            .map(|t| t as f64 / clock_ticks)
            .ok_or_else(|| Error::Operator(format!("cannot parse {stat_path}: {stat:?}")))?;
        Ok(ProcessUsage {
            peak_rss_mib: kib("VmHWM:") / 1024.0,
            rss_mib: kib("VmRSS:") / 1024.0,
            cpu_seconds,
        })
    }
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line, in clock ticks. The command
/// name (field 2) may contain spaces and parentheses, so fields are counted after its last ')'.
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state): utime is field 14, i.e. index 11 here.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on every Linux this runs on).
pub fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// The running operator.
pub struct OperatorProcess {
    child: Child,
    pid: u32,
    metrics_addr: SocketAddr,
    log: PathBuf,
    clock_ticks: f64,
}

impl OperatorProcess {
    /// Starts `binary run` for one namespace with the given kubeconfig; its output goes to
    /// `log`. With `leader_elect`, it takes a Lease of its own in that namespace (a production
    /// set-up, and the only one that reconciles while `--leader-elect=false` stops the
    /// controller at once); without, it runs `--leader-elect=false`. `identity` names it in
    /// the Events it writes; `max_concurrent_reconciles`, its bound on reconciles in flight (its default if None).
    pub async fn start(
        binary: &Path,
        namespace: &str,
        kubeconfig: &Path,
        log: &Path,
        leader_elect: bool,
        identity: &str,
        max_concurrent_reconciles: Option<u16>,
    ) -> Result<Self> {
        if !binary.is_file() {
            return Err(Error::Operator(format!(
                "{} does not exist; build it with `cargo build --release -p trainyard-operator` (or without --release for tests)",
                binary.display()
            )));
        }
        let metrics_addr = free_port()?;
        let out =
            std::fs::File::create(log).map_err(Error::io(format!("creating {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(Error::io(format!("opening {} twice", log.display())))?;
        let mut cmd = Command::new(binary);
        cmd.args(["run", "--namespace", namespace, "--identity", identity]);
        if leader_elect {
            cmd.args([
                "--leader-elect=true",
                "--lease-name",
                "trainyard-bench-operator",
            ])
            .args([
                "--lease-namespace",
                namespace,
                "--identity",
                "trainyard-bench",
            ]);
        } else {
            cmd.arg("--leader-elect=false");
        }
        if let Some(ceiling) = max_concurrent_reconciles {
            cmd.arg("--max-concurrent-reconciles")
                .arg(ceiling.to_string());
        }
        let child = cmd
            .arg("--metrics-addr")
            .arg(metrics_addr.to_string())
            .env("KUBECONFIG", kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("TRAINYARD_BENCH_OPERATOR_LOG").unwrap_or_else(|_| "info".to_owned()),
            )
            .env_remove("TRAINYARD_NAMESPACE")
            .env_remove("TRAINYARD_CONFIG")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(Error::io(format!("starting {}", binary.display())))?;
        let pid = child
            .id()
            .ok_or_else(|| Error::Operator("the operator exited at once".to_owned()))?;
        Ok(OperatorProcess {
            child,
            pid,
            metrics_addr,
            log: log.to_owned(),
            clock_ticks: clock_ticks(),
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Where its log goes.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Waits until /readyz answers 200.
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(Error::Operator(format!(
                    "exited with {status} before it was ready; see {}",
                    self.log.display()
                )));
            }
            if let Ok((200, _)) = http_get(self.metrics_addr, "/readyz").await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Operator(format!(
                    "not ready after {timeout:?}; see {}",
                    self.log.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Fails if the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(Some(status)) => Err(Error::Operator(format!(
                "exited with {status}; see {}",
                self.log.display()
            ))),
            _ => Ok(()),
        }
    }

    /// Its memory and CPU so far.
    pub fn usage(&self) -> Result<ProcessUsage> {
        ProcessUsage::read(self.pid, self.clock_ticks)
    }

    /// The text of its /metrics.
    pub async fn metrics(&self) -> Result<String> {
        match http_get(self.metrics_addr, "/metrics").await? {
            (200, body) => Ok(body),
            (code, body) => Err(Error::Operator(format!("/metrics answered {code}: {body}"))),
        }
    }

    /// Stops it with SIGTERM (SIGKILL after 10 s) and returns its usage just before.
    pub async fn stop(mut self) -> Result<ProcessUsage> {
        let usage = self.usage();
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        match tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await {
            Ok(_) => {}
            Err(_) => {
                tracing::warn!(
                    pid = self.pid,
                    "the operator ignored SIGTERM for 10 s; killing it"
                );
                let _ = self.child.kill().await;
            }
        }
        usage
    }
}

fn free_port() -> Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(Error::io("finding a free port"))?;
    l.local_addr().map_err(Error::io("finding a free port"))
}

/// A minimal HTTP/1.1 GET (the operator's endpoints are plain text on loopback).
async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(Error::io(format!("connecting to {addr}")))?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(Error::io(format!("GET {path} on {addr}")))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .await
        .map_err(Error::io(format!("GET {path} on {addr}")))?;
    let text = String::from_utf8_lossy(&raw);
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

/// The value of one unlabelled sample (or the sum over labels) in Prometheus text.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let base = key.split('{').next().unwrap_or(key);
        if base == name
            && let Ok(v) = value.trim().parse::<f64>()
        {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_read_after_a_command_name_with_spaces() {
        let stat = "1234 (tokio (worker) x) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 8 0 123 456 789";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(325));
    }

    #[test]
    fn metric_values_sum_over_labels() {
        let text =
            "# HELP x y\nfoo_total{reason=\"a\"} 2\nfoo_total{reason=\"b\"} 3\nfoo_sum 1.5\n";
        assert_eq!(metric_value(text, "foo_total"), Some(5.0));
        assert_eq!(metric_value(text, "foo_sum"), Some(1.5));
        assert_eq!(metric_value(text, "bar"), None);
    }
}
