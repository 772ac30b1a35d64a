//! The faults of a noisy cluster that act on a node's plumbing rather than on the job: etcd's
//! disk made slow, the trainer image taken away from the container runtime, a device
//! plugin's metrics port flooded. Each is a real change on this machine (a blkio cgroup, a
//! containerd image name, TCP connections), undone by [`Restore::undo`].

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::jobs::RELEASE_NS;
use crate::state_dir;

/// What undoing a fault of this module needs.
#[derive(Clone, Debug)]
pub enum Restore {
    /// etcd (`pid`) was moved into the throttled cgroup `cgroup`; `root` is its hierarchy's
    /// root, where it goes back.
    Throttled {
        pid: String,
        cgroup: PathBuf,
        root: PathBuf,
    },
    /// `image` was renamed `hidden` in the containerd of each of `sockets`.
    Hidden {
        image: String,
        hidden: String,
        sockets: Vec<PathBuf>,
    },
    /// The operator's Deployment runs with a skewed clock: its pods are rolled back to the
    /// true clock.
    Skewed { deployment: String },
}

impl Restore {
    /// Puts back what the fault changed.
    pub async fn undo(&self, client: &Client) -> Result<()> {
        match self {
            Restore::Skewed { deployment } => {
                let deployments = Api::<Deployment>::namespaced(client.clone(), RELEASE_NS);
                let patch = skew_patch(None);
                deployments
                    .patch(
                        deployment,
                        &PatchParams::default(),
                        &Patch::Strategic(&patch),
                    )
                    .await
                    .with_context(|| format!("taking the skewed clock off {deployment}"))?;
                // Not waited for: the rollout back goes on while the schedule does (waiting
                // held every other undo behind it, 83 s under a slow etcd disk), and the next
                // fault on the operator waits for a leader by itself.
                Ok(())
            }
            restore => {
                let restore = restore.clone();
                tokio::task::spawn_blocking(move || restore.undo_here())
                    .await
                    .context("undoing a fault panicked")?
            }
        }
    }

    /// Undoes what this machine undoes by itself (no API call), in a blocking task.
    fn undo_here(&self) -> Result<()> {
        match self {
            Restore::Throttled { pid, cgroup, root } => {
                // A process that exited meanwhile has left the cgroup by itself.
                let moved = std::fs::write(root.join("cgroup.procs"), format!("{pid}\n"));
                if let Err(e) = moved
                    && Path::new("/proc").join(pid).exists()
                {
                    return Err(e)
                        .with_context(|| format!("moving etcd ({pid}) out of the throttle"));
                }
                std::fs::remove_dir(cgroup)
                    .with_context(|| format!("removing the cgroup {}", cgroup.display()))
            }
            Restore::Hidden {
                image,
                hidden,
                sockets,
            } => {
                for socket in sockets {
                    rename_image(socket, hidden, image)?;
                }
                Ok(())
            }
            // Undone through the API server ([`Restore::undo`]).
            Restore::Skewed { .. } => Ok(()),
        }
    }
}

/// The name of the cgroup that slows etcd's disk.
const THROTTLE_CGROUP: &str = "trainyard-e2e-slow-etcd";

/// Throttles etcd's writes to its disk to `iops` operations a second: etcd (by the harness's
/// PID file) goes into a blkio cgroup (cgroup v1's `blkio.throttle.write_iops_device`, or
/// v2's `io.max`) limited on the disk that holds the harness's state, etcd's data among it.
/// Every commit's fsync waits its turn, as on a slow or shared disk.
pub fn slow_etcd_disk(iops: u32) -> Result<(String, Restore)> {
    let pid_file = state_dir().join("pids/etcd.pid");
    let pid = std::fs::read_to_string(&pid_file)
        .with_context(|| format!("reading {}", pid_file.display()))?
        .trim()
        .to_owned();
    let device = disk_of(&state_dir())?;
    let (root, limit_file, limit) = if Path::new("/sys/fs/cgroup/blkio").is_dir() {
        (
            PathBuf::from("/sys/fs/cgroup/blkio"),
            "blkio.throttle.write_iops_device",
            format!("{device} {iops}\n"),
        )
    } else if std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .is_ok_and(|c| c.split_whitespace().any(|c| c == "io"))
    {
        (
            PathBuf::from("/sys/fs/cgroup"),
            "io.max",
            format!("{device} wiops={iops}\n"),
        )
    } else {
        bail!("no blkio (cgroup v1) or io (cgroup v2) controller to throttle a disk with");
    };
    let cgroup = root.join(THROTTLE_CGROUP);
    if !cgroup.is_dir() {
        std::fs::create_dir(&cgroup).with_context(|| format!("creating {}", cgroup.display()))?;
    }
    let limit_path = cgroup.join(limit_file);
    std::fs::write(&limit_path, &limit)
        .with_context(|| format!("writing {} to {}", limit.trim(), limit_path.display()))?;
    std::fs::write(cgroup.join("cgroup.procs"), format!("{pid}\n"))
        .with_context(|| format!("moving etcd ({pid}) into {}", cgroup.display()))?;
    Ok((
        format!("etcd ({pid}) writes to disk {device} throttled to {iops} a second"),
        Restore::Throttled { pid, cgroup, root },
    ))
}

/// The `major:minor` of the whole disk that holds `path` (a throttle takes disks, not
/// partitions).
fn disk_of(path: &Path) -> Result<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if sys.join("partition").exists() {
        let parent = sys
            .canonicalize()
            .with_context(|| format!("resolving {}", sys.display()))?
            .parent()
            .map(|p| p.join("dev"))
            .context("a partition without a disk")?;
        let dev = std::fs::read_to_string(&parent)
            .with_context(|| format!("reading {}", parent.display()))?;
        return Ok(dev.trim().to_owned());
    }
    if !sys.exists() {
        bail!(
            "{} is not on a block device ({major}:{minor}): nothing to throttle",
            path.display()
        );
    }
    Ok(format!("{major}:{minor}"))
}

/// The image the chaos job's trainers run, as containerd names it.
const TRAINER_IMAGE: &str = "docker.io/trainyard/torch-trainer:dev";

/// Takes the trainer image's name away in both nodes' containerd (the content stays under
/// another name): a pod created meanwhile cannot start its trainer (`ErrImageNeverPull`), as
/// when a registry is down or the image was garbage-collected.
pub fn hide_trainer_image() -> Result<(String, Restore)> {
    let hidden = format!("{TRAINER_IMAGE}-hidden-by-chaos");
    let sockets: Vec<PathBuf> = [false, true]
        .into_iter()
        .map(super::faults::containerd_socket)
        .filter(|s| s.exists())
        .collect();
    // Node 1's containerd always runs; node 2's is down while node 2 is lost (make chaos at
    // eb1aa11, seed 10: its socket file stays behind, and the fault failed the run). A node
    // whose containerd does not answer is left as it is: it starts no pod meanwhile.
    let mut done: Vec<PathBuf> = Vec::new();
    let mut skipped = Vec::new();
    for (i, socket) in sockets.iter().enumerate() {
        match rename_image(socket, TRAINER_IMAGE, &hidden) {
            Ok(()) => done.push(socket.clone()),
            Err(e) if i > 0 => skipped.push(format!("{e:#}")),
            Err(e) => return Err(e),
        }
    }
    let mut what = format!("image {TRAINER_IMAGE} hidden on {} node(s)", done.len());
    if !skipped.is_empty() {
        what.push_str(&format!(" (node 2 left as it is: {})", skipped.join("; ")));
    }
    Ok((
        what,
        Restore::Hidden {
            image: TRAINER_IMAGE.to_owned(),
            hidden,
            sockets: done,
        },
    ))
}

/// Renames `from` to `to` in the containerd at `socket` (tag, then untag).
fn rename_image(socket: &Path, from: &str, to: &str) -> Result<()> {
    let ctr = |args: &[&str]| {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(socket)
            .args(["-n", "k8s.io", "images"])
            .args(args)
            .output()
            .context("running ctr")?;
        if !out.status.success() {
            bail!(
                "ctr images {} at {}: {}",
                args.join(" "),
                socket.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    };
    ctr(&["tag", "--force", from, to])?;
    ctr(&["rm", from])
}

/// The metrics endpoint (pod IP and port) of the device plugin on `node`, if it runs.
pub async fn plugin_metrics(client: &Client, node: &str) -> Result<Option<std::net::SocketAddr>> {
    let Some(pod) = device_plugin_pod(client, node).await? else {
        return Ok(None);
    };
    let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
    let port = crate::named_port(&pod, "metrics");
    let (Some(ip), Some(port)) = (ip, port) else {
        return Ok(None);
    };
    let port = u16::try_from(port).with_context(|| format!("{}'s metrics port", pod.name_any()))?;
    let ip = ip
        .parse()
        .with_context(|| format!("{}'s pod IP {ip}", pod.name_any()))?;
    Ok(Some(std::net::SocketAddr::new(ip, port)))
}

/// The device plugin's pod on `node`, if it has one.
pub async fn device_plugin_pod(client: &Client, node: &str) -> Result<Option<Pod>> {
    let pods = Api::<Pod>::namespaced(client.clone(), RELEASE_NS);
    let lp = ListParams::default()
        .labels("app.kubernetes.io/component=device-plugin")
        .fields(&format!("spec.nodeName={node}"));
    Ok(pods.list(&lp).await?.items.into_iter().next())
}

/// Where the host keeps libfaketime (Debian's `libfaketime`).
const FAKETIME_DIR: &str = "/usr/lib/x86_64-linux-gnu/faketime";

/// Rolls the operator's Deployment onto a clock `offset_s` seconds off the true one
/// (libfaketime preloaded from the host, as a node whose clock drifted would run it) and
/// waits until every replica runs on it. The Go binaries of the cluster read the clock past
/// libc (the vDSO), so libfaketime cannot skew a kubelet: the operator is the component whose
/// clock this fault can move.
pub async fn skew_operator_clock(client: &Client, offset_s: i64) -> Result<(String, Restore)> {
    if !Path::new(FAKETIME_DIR).join("libfaketime.so.1").exists() {
        bail!("{FAKETIME_DIR}/libfaketime.so.1 is missing (install Debian's libfaketime)");
    }
    let deployments = Api::<Deployment>::namespaced(client.clone(), RELEASE_NS);
    let deployment = deployments
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|d| d.name_any())
        .find(|n| n.contains("operator"))
        .context("no operator Deployment")?;
    let patch = skew_patch(Some(offset_s));
    deployments
        .patch(
            &deployment,
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
        .with_context(|| format!("putting a skewed clock on {deployment}"))?;
    let restore = Restore::Skewed {
        deployment: deployment.clone(),
    };
    let measured = match rolled_out(&deployments, &deployment).await {
        Ok(()) => clock_offset(client).await,
        Err(e) => Err(e),
    };
    let measured = match measured {
        // libfaketime took: the replica's clock is off by what was asked, within a second.
        Ok(m) if (m - offset_s as f64).abs() <= 1.0 => m,
        Ok(m) => {
            restore.undo(client).await?;
            bail!("the operator's clock is {m:+.1} s off after the rollout, not {offset_s:+} s");
        }
        Err(e) => {
            restore.undo(client).await?;
            return Err(e);
        }
    };
    Ok((
        format!(
            "operator ({deployment}) rolled onto a clock {offset_s:+} s off (its log reads \
             {measured:+.1} s against the container runtime's)"
        ),
        restore,
    ))
}

/// How far a running operator replica's clock is off the machine's: its newest log line's
/// own timestamp (the operator's clock) against the one the container runtime gave it.
async fn clock_offset(client: &Client) -> Result<f64> {
    let pods = Api::<Pod>::namespaced(client.clone(), RELEASE_NS);
    let lp = ListParams::default().labels("app.kubernetes.io/component=operator");
    let running = pods.list(&lp).await?.items.into_iter().find(|p| {
        p.metadata.deletion_timestamp.is_none()
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    });
    let pod = running.context("no running operator replica")?;
    let params = kube::api::LogParams {
        timestamps: true,
        tail_lines: Some(1),
        ..Default::default()
    };
    let name = pod.name_any();
    let line = crate::wait_for(
        &format!("a log line of {name}"),
        Duration::from_secs(30),
        || {
            let (pods, name, params) = (&pods, &name, &params);
            async move {
                let line = pods.logs(name, params).await?;
                Ok((!line.trim().is_empty()).then_some(line))
            }
        },
    )
    .await?;
    offset_in(&line).with_context(|| format!("reading the clocks of the log line {line:?}"))
}

/// The operator's timestamp minus the runtime's in a log line read with timestamps:
/// `<runtime time> <operator time> <level> ...`.
fn offset_in(line: &str) -> Result<f64> {
    let mut words = line.split_whitespace();
    let mut time = |which: &str| -> Result<jiff::Timestamp> {
        let word = words
            .next()
            .with_context(|| format!("no {which} timestamp"))?;
        word.parse()
            .with_context(|| format!("the {which} timestamp {word:?}"))
    };
    let runtime = time("runtime's")?;
    let operator = time("operator's")?;
    Ok(operator.duration_since(runtime).as_secs_f64())
}

/// The strategic-merge patch that puts the operator container on a clock `offset_s` off, or
/// (None) takes that off again.
fn skew_patch(offset_s: Option<i64>) -> Value {
    let (env, mount, volume) = match offset_s {
        Some(offset) => (
            json!([
                {"name": "LD_PRELOAD", "value": format!("{FAKETIME_DIR}/libfaketime.so.1")},
                {"name": "FAKETIME", "value": format!("{offset:+}s")},
            ]),
            json!([{"name": "chaos-faketime", "mountPath": FAKETIME_DIR, "readOnly": true}]),
            json!([{"name": "chaos-faketime",
                    "hostPath": {"path": FAKETIME_DIR, "type": "Directory"}}]),
        ),
        None => (
            json!([
                {"name": "LD_PRELOAD", "$patch": "delete"},
                {"name": "FAKETIME", "$patch": "delete"},
            ]),
            json!([{"mountPath": FAKETIME_DIR, "$patch": "delete"}]),
            json!([{"name": "chaos-faketime", "$patch": "delete"}]),
        ),
    };
    json!({"spec": {"template": {"spec": {
        "containers": [{"name": "operator", "env": env, "volumeMounts": mount}],
        "volumes": volume,
    }}}})
}

/// Waits (up to 3 minutes) until every replica of `name` runs its newest template and is
/// available.
async fn rolled_out(deployments: &Api<Deployment>, name: &str) -> Result<()> {
    crate::wait_for(
        &format!("{name} to roll out"),
        Duration::from_secs(180),
        || async move {
            let d = deployments.get(name).await?;
            let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let generation = d.metadata.generation.unwrap_or(0);
            let Some(st) = d.status else { return Ok(None) };
            let done = st.observed_generation.unwrap_or(0) >= generation
                && st.updated_replicas.unwrap_or(0) == want
                && st.available_replicas.unwrap_or(0) == want
                && st.replicas.unwrap_or(0) == want;
            Ok(done.then_some(()))
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The skew goes on as libfaketime's two variables and a read-only mount of the host's
    /// library, and comes off by name (strategic merge keys: env and volumes by name, mounts
    /// by path).
    #[test]
    fn the_skew_patch_goes_on_and_comes_off_by_its_keys() {
        let on = skew_patch(Some(-4));
        let container = &on["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["name"], "operator");
        assert_eq!(
            container["env"][1],
            json!({"name": "FAKETIME", "value": "-4s"})
        );
        assert_eq!(container["volumeMounts"][0]["readOnly"], true);
        let off = skew_patch(None);
        let container = &off["spec"]["template"]["spec"]["containers"][0];
        for entry in container["env"].as_array().expect("env") {
            assert_eq!(entry["$patch"], "delete", "{entry}");
        }
        assert_eq!(container["volumeMounts"][0]["mountPath"], FAKETIME_DIR);
        assert_eq!(
            off["spec"]["template"]["spec"]["volumes"][0],
            json!({"name": "chaos-faketime", "$patch": "delete"})
        );
    }

    /// The skew is read from a log line as the API server returns it with timestamps.
    #[test]
    fn the_clock_offset_is_the_operators_time_minus_the_runtimes() {
        let line = "2026-11-28T04:33:10.250000000Z 2026-11-28T04:33:13.250000Z  INFO x: y\n";
        let offset = offset_in(line).expect("two timestamps");
        assert!((offset - 3.0).abs() < 1e-6, "{offset}");
        let err = offset_in("2026-11-28T04:33:10Z oops").expect_err("no second timestamp");
        assert!(format!("{err:#}").contains("operator's"), "{err:#}");
    }

    /// A path that is not on a block device is named in the error.
    #[test]
    fn a_path_off_any_disk_is_named() {
        let err = disk_of(Path::new("/proc/self")).expect_err("procfs is on no disk");
        assert!(format!("{err:#}").contains("/proc/self"), "{err:#}");
    }
}
