//! Node labels with GPU facts, under GPU Feature Discovery's names, so the
//! operator (and anything written for GFD) can schedule on them.
//!
//! Labels are computed purely from the inventory and applied with
//! server-side apply under our own field manager, which also removes labels
//! we stop setting. An unreachable API server is retried in the background
//! and never stops the plugin from serving.
//!
//! A Node object that is deleted and registered again by its kubelet comes
//! back without our labels while the GPUs have not changed. A watch would
//! keep the Kubernetes client resident for the plugin's whole life (see
//! Resource use in docs/device-plugin.md), so instead every
//! `--label-check-interval` a short-lived check reads the node's metadata
//! from the API server's cache and applies again only when a label is
//! missing or different.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{GetParams, Patch, PatchParams};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use trainyard_api::Version;
use trainyard_api::gpu_labels::{
    LABEL_COMPUTE_MAJOR, LABEL_COMPUTE_MINOR, LABEL_CUDA_MAJOR, LABEL_CUDA_MINOR,
    LABEL_DRIVER_FULL, LABEL_DRIVER_MAJOR, LABEL_DRIVER_MINOR, LABEL_DRIVER_REVISION,
    LABEL_GPU_COUNT, LABEL_GPU_MEMORY, LABEL_GPU_PRODUCT,
};
use trainyard_api::version::parse_driver_version;

use crate::rm::backend::Inventory;
use crate::rm::devices::StateReceiver;

/// Field manager of our server-side applies.
pub(crate) const FIELD_MANAGER: &str = "trainyard-device-plugin";

const RETRY_START: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// Turns free text into a valid label value: at most 63 characters of
/// `[A-Za-z0-9._-]`, starting and ending alphanumeric. Spaces become dashes,
/// as GPU Feature Discovery does for product names.
pub(crate) fn label_value(raw: &str) -> String {
    let mapped: String = raw
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut value: String = mapped.chars().take(63).collect();
    while value.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        value.pop();
    }
    value
        .trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// The labels for a node with this inventory.
pub fn node_labels(inventory: &Inventory) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut set = |key: &str, value: String| {
        if !value.is_empty() {
            labels.insert(key.to_string(), value);
        }
    };
    // Every GPU the driver counts, readable or not, as GFD counts them.
    set(LABEL_GPU_COUNT, inventory.device_ids().len().to_string());
    if let Some(first) = inventory.gpus.first() {
        set(LABEL_GPU_PRODUCT, label_value(&first.name));
        set(LABEL_GPU_MEMORY, first.memory_mib.to_string());
        set(
            LABEL_COMPUTE_MAJOR,
            first.compute_capability.major.to_string(),
        );
        set(
            LABEL_COMPUTE_MINOR,
            first.compute_capability.minor.to_string(),
        );
    }
    let driver = &inventory.driver.driver_version;
    set(LABEL_DRIVER_FULL, label_value(driver));
    if let Some((major, minor, rev)) = parse_driver_version(driver) {
        set(LABEL_DRIVER_MAJOR, major.to_string());
        set(LABEL_DRIVER_MINOR, minor.to_string());
        if let Some(rev) = rev {
            set(LABEL_DRIVER_REVISION, rev.to_owned());
        }
    }
    if let Ok(cuda) = inventory.driver.cuda_version.parse::<Version>() {
        set(LABEL_CUDA_MAJOR, cuda.major.to_string());
        set(LABEL_CUDA_MINOR, cuda.minor.to_string());
    }
    labels
}

/// How a write treats labels the node already has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyMode {
    /// Apply whatever the node has: the wanted set changed, and an apply is
    /// what removes labels we stopped setting.
    Always,
    /// Apply only when a wanted label is missing or different (the periodic check).
    IfMissing,
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelOutcome {
    /// The labels were applied.
    Applied,
    /// The node already had them; nothing was written.
    AlreadyPresent,
}

impl LabelOutcome {
    /// How `apply-labels` reports the outcome on stdout.
    pub fn as_str(self) -> &'static str {
        match self {
            LabelOutcome::Applied => "applied",
            LabelOutcome::AlreadyPresent => "present",
        }
    }
}

/// Whether a wanted label is missing from `current` or has another value there.
pub(crate) fn labels_missing(
    current: &BTreeMap<String, String>,
    wanted: &BTreeMap<String, String>,
) -> bool {
    wanted.iter().any(|(k, v)| current.get(k) != Some(v))
}

/// The write the label loop does next, if any: `applied` is what it last
/// applied, `check_due` whether the periodic check interval has passed.
pub(crate) fn next_write(
    applied: Option<&BTreeMap<String, String>>,
    wanted: &BTreeMap<String, String>,
    check_due: bool,
) -> Option<ApplyMode> {
    if applied != Some(wanted) {
        Some(ApplyMode::Always)
    } else if check_due {
        Some(ApplyMode::IfMissing)
    } else {
        None
    }
}

/// Errors applying labels.
#[derive(Debug, thiserror::Error)]
pub enum LabelError {
    /// No kubeconfig or in-cluster configuration.
    #[error("cannot create a Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// The label writer process could not be run.
    #[error("cannot run the label writer {exe}: {source}")]
    Spawn {
        /// The executable.
        exe: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The label writer process failed; its last words.
    #[error("{0}")]
    Writer(String),
    /// The node does not exist (deleted, not yet registered again); an
    /// apply would create a Node object of our own, so none is made.
    #[error("node {0} does not exist (yet); not labelling it")]
    NodeNotFound(String),
    /// The node could not be read.
    #[error("cannot read node {node}: {source}")]
    Read {
        /// The node.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The apply failed.
    #[error("cannot label node {node}: {source}")]
    Apply {
        /// The node.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// Reads the node's labels and applies `labels` unless `mode` says the
/// node already has them.
async fn write(
    client: &Client,
    node: &str,
    labels: &BTreeMap<String, String>,
    mode: ApplyMode,
) -> Result<LabelOutcome, LabelError> {
    let nodes: Api<Node> = Api::all(client.clone());
    // The periodic check may read the API server's cache: a stale answer
    // costs one no-op apply at most.
    let params = match mode {
        ApplyMode::Always => GetParams::default(),
        ApplyMode::IfMissing => GetParams::any(),
    };
    let current = nodes
        .get_metadata_opt_with(node, &params)
        .await
        .map_err(|source| LabelError::Read {
            node: node.to_string(),
            source,
        })?
        .ok_or_else(|| LabelError::NodeNotFound(node.to_string()))?;
    if mode == ApplyMode::IfMissing
        && !labels_missing(&current.metadata.labels.unwrap_or_default(), labels)
    {
        return Ok(LabelOutcome::AlreadyPresent);
    }
    apply(&nodes, node, labels).await?;
    Ok(LabelOutcome::Applied)
}

async fn apply(
    nodes: &Api<Node>,
    node: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), LabelError> {
    let patch = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": node, "labels": labels },
    });
    nodes
        .patch(
            node,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(|source| LabelError::Apply {
            node: node.to_string(),
            source,
        })?;
    Ok(())
}

/// How labels reach the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelWriter {
    /// A Kubernetes client inside this process.
    InProcess,
    /// `<exe> apply-labels --node-name <node>` with the labels as JSON on stdin.
    Subprocess(PathBuf),
}

/// Writes `labels` to `node` once, with a client from the environment
/// (kubeconfig or in-cluster). The body of `apply-labels`.
pub async fn apply_once(
    node: &str,
    labels: &BTreeMap<String, String>,
    mode: ApplyMode,
) -> Result<LabelOutcome, LabelError> {
    let client = Client::try_default().await.map_err(LabelError::Client)?;
    write(&client, node, labels, mode).await
}

const WRITER_TIMEOUT: Duration = Duration::from_secs(60);

async fn apply_in_child(
    exe: &Path,
    node: &str,
    labels: &BTreeMap<String, String>,
    mode: ApplyMode,
) -> Result<LabelOutcome, LabelError> {
    use tokio::io::AsyncWriteExt;
    let spawn_error = |source| LabelError::Spawn {
        exe: exe.to_path_buf(),
        source,
    };
    let mut command = tokio::process::Command::new(exe);
    command.arg("apply-labels").arg("--node-name").arg(node);
    if mode == ApplyMode::IfMissing {
        command.arg("--if-missing");
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(spawn_error)?;
    if let Some(mut stdin) = child.stdin.take() {
        let json = serde_json::to_vec(labels).unwrap_or_default();
        stdin.write_all(&json).await.map_err(spawn_error)?;
    }
    let output = tokio::time::timeout(WRITER_TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| {
            LabelError::Writer(format!(
                "label writer did not finish within {WRITER_TIMEOUT:?}"
            ))
        })?
        .map_err(spawn_error)?;
    if output.status.success() {
        let said = String::from_utf8_lossy(&output.stdout);
        return Ok(if said.trim() == LabelOutcome::AlreadyPresent.as_str() {
            LabelOutcome::AlreadyPresent
        } else {
            LabelOutcome::Applied
        });
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    Err(LabelError::Writer(
        last.strip_prefix("error: ").unwrap_or(last).to_string(),
    ))
}

/// Keeps `node`'s labels equal to the current inventory until `shutdown`,
/// and checks every `check_interval` that the node still has them.
pub(crate) async fn run(
    node: String,
    writer: LabelWriter,
    mut state: StateReceiver,
    check_interval: Duration,
    shutdown: CancellationToken,
) {
    let mut client: Option<Client> = None;
    let mut applied: Option<BTreeMap<String, String>> = None;
    let mut check_due = false;
    let mut delay = RETRY_START;
    let mut failing = false;
    loop {
        let wanted = node_labels(&state.borrow_and_update().inventory);
        if let Some(mode) = next_write(applied.as_ref(), &wanted, check_due) {
            let result = match (&writer, &client) {
                (LabelWriter::Subprocess(exe), _) => {
                    apply_in_child(exe, &node, &wanted, mode).await
                }
                (LabelWriter::InProcess, Some(c)) => write(c, &node, &wanted, mode).await,
                (LabelWriter::InProcess, None) => match Client::try_default().await {
                    Ok(c) => {
                        let r = write(&c, &node, &wanted, mode).await;
                        client = Some(c);
                        r
                    }
                    Err(e) => Err(LabelError::Client(e)),
                },
            };
            match result {
                Ok(outcome) => {
                    match (mode, outcome) {
                        (ApplyMode::Always, _) => {
                            tracing::info!(%node, labels = wanted.len(), "node labels applied");
                        }
                        (ApplyMode::IfMissing, LabelOutcome::Applied) => {
                            tracing::info!(%node, labels = wanted.len(), "node labels were missing (Node object recreated, or labels removed); applied again");
                        }
                        (ApplyMode::IfMissing, LabelOutcome::AlreadyPresent) => {}
                    }
                    applied = Some(wanted);
                    check_due = false;
                    delay = RETRY_START;
                    failing = false;
                }
                Err(e) => {
                    // Log the first failure loudly and the retries quietly.
                    if failing {
                        tracing::debug!(error = %e, retry_in = ?delay, "node labels still not applied");
                    } else {
                        tracing::warn!(error = %e, retry_in = ?delay, "cannot apply node labels; the plugin keeps serving and retries");
                        failing = true;
                    }
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(RETRY_MAX);
                    continue;
                }
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = state.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(check_interval) => check_due = true,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::rm::backend::{ComputeCapability, DriverInfo, GpuInfo};

    fn inventory(driver: &str, cuda: &str, gpus: usize) -> Inventory {
        Inventory {
            driver: DriverInfo {
                driver_version: driver.into(),
                cuda_version: cuda.into(),
            },
            gpus: (0..gpus)
                .map(|i| GpuInfo {
                    uuid: format!("GPU-{i}"),
                    index: i as u32,
                    minor_number: i as u32,
                    name: "NVIDIA A100-SXM4-80GB".into(),
                    memory_mib: 81920,
                    pci_bus_id: None,
                    numa_node: None,
                    compute_capability: ComputeCapability { major: 8, minor: 0 },
                    nvlinks: BTreeMap::new(),
                })
                .collect(),
            faults: vec![],
        }
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_missing_or_changed_label_is_missing_and_foreign_labels_do_not_matter() {
        let wanted = map(&[(LABEL_GPU_COUNT, "8"), (LABEL_GPU_MEMORY, "81920")]);
        let mut node = map(&[("kubernetes.io/hostname", "n1")]);
        assert!(
            labels_missing(&node, &wanted),
            "recreated node: none of ours"
        );
        node.extend(wanted.clone());
        assert!(!labels_missing(&node, &wanted));
        node.insert(LABEL_GPU_COUNT.into(), "4".into());
        assert!(labels_missing(&node, &wanted), "changed by someone else");
        node.insert(LABEL_GPU_COUNT.into(), "8".into());
        node.remove(LABEL_GPU_MEMORY);
        assert!(labels_missing(&node, &wanted), "one removed");
    }

    #[test]
    fn the_loop_applies_on_change_and_checks_only_when_the_interval_is_due() {
        let a = map(&[(LABEL_GPU_COUNT, "8")]);
        let b = map(&[(LABEL_GPU_COUNT, "7")]);
        // (case, applied, wanted, check_due, expected)
        let cases = [
            ("first time", None, &a, false, Some(ApplyMode::Always)),
            (
                "first time, check due",
                None,
                &a,
                true,
                Some(ApplyMode::Always),
            ),
            (
                "inventory changed",
                Some(&a),
                &b,
                false,
                Some(ApplyMode::Always),
            ),
            ("unchanged, not due", Some(&a), &a, false, None),
            (
                "unchanged, check due",
                Some(&a),
                &a,
                true,
                Some(ApplyMode::IfMissing),
            ),
        ];
        for (case, applied, wanted, due, expected) in cases {
            assert_eq!(next_write(applied, wanted, due), expected, "{case}");
        }
    }

    #[test]
    fn labels_use_gpu_feature_discovery_names() {
        let labels = node_labels(&inventory("550.54.15", "12.4", 8));
        let expected: BTreeMap<String, String> = [
            (LABEL_GPU_COUNT, "8"),
            (LABEL_GPU_PRODUCT, "NVIDIA-A100-SXM4-80GB"),
            (LABEL_GPU_MEMORY, "81920"),
            (LABEL_COMPUTE_MAJOR, "8"),
            (LABEL_COMPUTE_MINOR, "0"),
            (LABEL_DRIVER_FULL, "550.54.15"),
            (LABEL_DRIVER_MAJOR, "550"),
            (LABEL_DRIVER_MINOR, "54"),
            (LABEL_DRIVER_REVISION, "15"),
            (LABEL_CUDA_MAJOR, "12"),
            (LABEL_CUDA_MINOR, "4"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(labels, expected);
    }

    #[test]
    fn the_revision_keeps_its_leading_zero_as_gpu_feature_discovery_writes_it() {
        // Driver 580.159.04, as NVML reported it on an H100 and an H200.
        let labels = node_labels(&inventory("580.159.04", "13.0", 1));
        assert_eq!(labels[LABEL_DRIVER_FULL], "580.159.04");
        assert_eq!(labels[LABEL_DRIVER_MINOR], "159");
        assert_eq!(labels[LABEL_DRIVER_REVISION], "04");
    }

    #[test]
    fn driver_versions_without_revision_omit_the_revision_label() {
        let labels = node_labels(&inventory("535.104", "12.2", 1));
        assert_eq!(labels[LABEL_DRIVER_MINOR], "104");
        assert!(!labels.contains_key(LABEL_DRIVER_REVISION));
        assert_eq!(labels[LABEL_CUDA_MINOR], "2");
    }

    #[test]
    fn a_node_without_gpus_only_gets_count_and_driver_labels() {
        let labels = node_labels(&inventory("550.54.15", "12.4", 0));
        assert_eq!(labels[LABEL_GPU_COUNT], "0");
        assert!(!labels.contains_key(LABEL_GPU_PRODUCT));
    }

    #[test]
    fn label_values_are_sanitized() {
        assert_eq!(
            label_value("NVIDIA A100-SXM4-80GB"),
            "NVIDIA-A100-SXM4-80GB"
        );
        assert_eq!(
            label_value("NVIDIA GeForce RTX 4090 (rev 2)"),
            "NVIDIA-GeForce-RTX-4090--rev-2"
        );
        assert_eq!(label_value(" -x- "), "x");
        assert_eq!(label_value(&"a".repeat(80)).len(), 63);
    }
}
