//! The operator's configuration file (`--config`): GPU prices and the spot provider table.
//!
//! Every field has a default, so an empty file (or none) gives the behaviour documented in
//! `operator/config/default.yaml`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Toleration;
use serde::{Deserialize, Serialize};
use trainyard_api::spot;

/// The path of the progress channel that reports are posted to.
pub const PROGRESS_PATH: &str = "/v1/progress";
/// The path supervisors poll ([`crate::progress::supervisors`]).
pub const SUPERVISOR_PATH: &str = "/v1/supervisor";

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading operator config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid YAML for [`OperatorConfig`].
    #[error("parsing operator config {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, naming the field.
        message: String,
    },
    /// A value is out of range.
    #[error("operator config {path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the field.
        message: String,
    },
}

/// Operator-wide settings.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct OperatorConfig {
    /// On-demand price = spot price × this, unless a price entry sets `onDemand`.
    pub on_demand_multiplier: f64,
    /// $ per GPU-hour on spot, matched against `nvidia.com/gpu.product`.
    pub prices: Vec<PriceEntry>,
    /// How spot nodes are recognised and tolerated.
    pub spot: SpotConfig,
    /// Taints that announce a node's termination.
    pub termination_taints: Vec<String>,
    /// Taints that warn of a termination to come (a rebalance recommendation): a worker there
    /// moves to a replacement created ahead, at its trainers' next checkpoint.
    pub early_warning_taints: Vec<String>,
    /// How long a node may be NotReady before its workers count as preempted.
    pub node_not_ready_timeout_seconds: u64,
    /// How long a container may wait (ImagePullBackOff, ...) before its worker counts as failed.
    pub container_waiting_timeout_seconds: u64,
    /// How long after a rank fails its verdict is held while a peer's node may have been lost
    /// ([`crate::model::lost_peer`]): a lost peer is a preemption, not a failure.
    pub lost_peer_window_seconds: u64,
    /// What the operator refuses in a TrainingJob's pod template, beyond what admission
    /// enforces (docs/security.md).
    pub template_policy: TemplatePolicy,
    /// The gang schedulers whose PodGroups the operator creates for a job whose pod template
    /// names them (`schedulerName`).
    pub gang_schedulers: GangSchedulers,
    /// The progress channel trainers report to, when the operator serves it (set from the
    /// command line, `--progress-url`, never from the config file).
    #[serde(skip)]
    pub progress_channel: Option<ProgressChannel>,
}

/// What the operator refuses in a pod template (condition `InvalidSpec`, naming the field):
/// the worker pods are created with the operator's rights, so a cluster without a policy
/// engine on tenant namespaces can refuse here what reaches the node.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct TemplatePolicy {
    /// Refuse `nodeName`, `hostNetwork`, `hostPID`, `hostIPC`, `hostPath` volumes, privileged
    /// containers and capabilities beyond Pod Security's baseline.
    pub refuse_host_access: bool,
    /// When not empty, the only `serviceAccountName`s a template may use (`default` when it
    /// names none).
    pub service_accounts: Vec<String>,
}

/// The `schedulerName`s of gang schedulers ([`crate::model::podgroup`]): a job whose pod
/// template names one gets that scheduler's PodGroup, and its pods are placed all or nothing.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct GangSchedulers {
    /// Names of Volcano schedulers (`scheduling.volcano.sh` PodGroups).
    pub volcano: Vec<String>,
    /// Names of scheduler-plugins schedulers with the coscheduling plugin
    /// (`scheduling.x-k8s.io` PodGroups).
    pub coscheduling: Vec<String>,
}

impl Default for GangSchedulers {
    fn default() -> Self {
        Self {
            volcano: vec!["volcano".to_owned()],
            coscheduling: vec!["scheduler-plugins-scheduler".to_owned()],
        }
    }
}

/// Where trainers report their progress, the audience of the token they report with, and the
/// key that seals the worker pods allowed to ([`crate::model::seal`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ProgressChannel {
    /// The URL trainers POST to (`TRAINYARD_PROGRESS_URL`).
    pub url: String,
    /// The audience of the projected service-account token mounted for it.
    pub audience: String,
    /// The key of the operator's seal on its worker pods.
    pub seal: crate::model::seal::SealKey,
}

impl ProgressChannel {
    /// Where supervisors poll (`TRAINYARD_SUPERVISOR_URL`): the progress URL's `/v1/progress`
    /// path replaced by `/v1/supervisor`, or that path appended to a URL without it.
    pub fn supervisor_url(&self) -> String {
        let base = self
            .url
            .strip_suffix(PROGRESS_PATH)
            .unwrap_or(self.url.trim_end_matches('/'));
        format!("{base}{}", SUPERVISOR_PATH)
    }
}

/// One row of the price table.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PriceEntry {
    /// '-'-separated tokens that must all be tokens of the product label (case-insensitive).
    #[serde(rename = "match")]
    pub match_: String,
    /// $ per GPU-hour on spot.
    pub spot: f64,
    /// $ per GPU-hour on demand; defaults to `spot × onDemandMultiplier`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_demand: Option<f64>,
}

/// Spot node recognition.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct SpotConfig {
    /// A node is a spot node when it carries any of these labels.
    pub labels: Vec<SpotLabel>,
    /// Tolerations added to workers that may run on spot.
    pub tolerations: Vec<Toleration>,
}

/// A label that marks spot nodes of one provider.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpotLabel {
    /// Provider name, for humans.
    #[serde(default)]
    pub provider: String,
    /// Label key.
    pub key: String,
    /// Label value.
    pub value: String,
}

impl Default for OperatorConfig {
    fn default() -> Self {
        let price = |m: &str, spot: f64| PriceEntry {
            match_: m.to_owned(),
            spot,
            on_demand: None,
        };
        Self {
            on_demand_multiplier: 3.0,
            prices: vec![
                price("T4", 0.12),
                price("L4", 0.25),
                price("A10G", 0.50),
                price("A100-40GB", 1.10),
                price("A100-80GB", 1.25),
                price("H100", 2.50),
            ],
            spot: SpotConfig::default(),
            termination_taints: spot::TERMINATION_TAINTS
                .iter()
                .map(|t| (*t).to_owned())
                .collect(),
            early_warning_taints: spot::EARLY_WARNING_TAINTS
                .iter()
                .map(|t| (*t).to_owned())
                .collect(),
            node_not_ready_timeout_seconds: 60,
            container_waiting_timeout_seconds: 300,
            lost_peer_window_seconds: 60,
            template_policy: TemplatePolicy::default(),
            gang_schedulers: GangSchedulers::default(),
            progress_channel: None,
        }
    }
}

impl Default for SpotConfig {
    /// The provider table of the contract crate ([`trainyard_api::spot`]).
    fn default() -> Self {
        Self {
            labels: spot::SPOT_LABELS
                .iter()
                .map(|l| SpotLabel {
                    provider: l.provider.to_owned(),
                    key: l.key.to_owned(),
                    value: l.value.to_owned(),
                })
                .collect(),
            tolerations: spot::SPOT_TAINTS
                .iter()
                .map(|t| Toleration {
                    key: Some(t.key.to_owned()),
                    operator: Some("Equal".to_owned()),
                    value: Some(t.value.to_owned()),
                    effect: Some("NoSchedule".to_owned()),
                    toleration_seconds: None,
                })
                .collect(),
        }
    }
}

impl OperatorConfig {
    /// Reads and checks a YAML file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_yaml(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_owned(),
                message,
            },
            ConfigError::Invalid { message, .. } => ConfigError::Invalid {
                path: path.to_owned(),
                message,
            },
            other => other,
        })
    }

    /// Parses and checks YAML text (errors carry an empty path).
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        // An empty document means "all defaults"; serde would see a null, not a map.
        if text.lines().all(|l| {
            let l = l.trim();
            l.is_empty() || l.starts_with('#')
        }) {
            return Ok(Self::default());
        }
        let config: Self = serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: e.to_string(),
        })?;
        config.check().map_err(|message| ConfigError::Invalid {
            path: PathBuf::new(),
            message,
        })?;
        Ok(config)
    }

    fn check(&self) -> Result<(), String> {
        if !(self.on_demand_multiplier.is_finite() && self.on_demand_multiplier > 0.0) {
            return Err(format!(
                "onDemandMultiplier must be a positive number, got {}",
                self.on_demand_multiplier
            ));
        }
        if let Some(i) = self
            .template_policy
            .service_accounts
            .iter()
            .position(|a| a.trim().is_empty())
        {
            return Err(format!(
                "templatePolicy.serviceAccounts[{i}] must name a ServiceAccount"
            ));
        }
        for (i, p) in self.prices.iter().enumerate() {
            if p.match_.trim().is_empty() {
                return Err(format!("prices[{i}].match must not be empty"));
            }
            let valid = |v: f64| v.is_finite() && v >= 0.0;
            if !valid(p.spot) || !p.on_demand.is_none_or(valid) {
                return Err(format!(
                    "prices[{i}] ({}): prices must be non-negative numbers",
                    p.match_
                ));
            }
        }
        for (i, l) in self.spot.labels.iter().enumerate() {
            if l.key.is_empty() {
                return Err(format!("spot.labels[{i}].key must not be empty"));
            }
        }
        Ok(())
    }

    /// The $ per GPU-hour of `product` on spot or on demand, from the most specific matching entry.
    pub fn price(&self, product: &str, spot: bool) -> Option<f64> {
        let label_tokens: Vec<String> = product.split('-').map(str::to_lowercase).collect();
        self.prices
            .iter()
            .filter_map(|entry| {
                let tokens: Vec<String> = entry.match_.split('-').map(str::to_lowercase).collect();
                tokens
                    .iter()
                    .all(|t| label_tokens.contains(t))
                    .then_some((tokens.len(), entry))
            })
            // max_by_key keeps the last of equals; earlier entries should win ties.
            .rev()
            .max_by_key(|(n, _)| *n)
            .map(|(_, entry)| {
                if spot {
                    entry.spot
                } else {
                    entry
                        .on_demand
                        .unwrap_or(entry.spot * self.on_demand_multiplier)
                }
            })
    }

    /// Whether a node with these labels is a spot node.
    pub fn is_spot(&self, labels: &BTreeMap<String, String>) -> bool {
        self.spot
            .labels
            .iter()
            .any(|l| labels.get(&l.key).is_some_and(|v| v == &l.value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_api::spot::{EKS_CAPACITY_TYPE, KARPENTER_CAPACITY_TYPE};

    #[test]
    fn default_yaml_file_equals_built_in_defaults() {
        let text = include_str!("../config/default.yaml");
        let parsed = OperatorConfig::from_yaml(text).expect("default.yaml parses");
        assert_eq!(parsed, OperatorConfig::default());
    }

    #[test]
    fn the_template_policy_is_read_and_an_empty_account_name_is_refused() {
        let config = OperatorConfig::from_yaml(
            "templatePolicy: {refuseHostAccess: true, serviceAccounts: [trainer]}\n",
        )
        .expect("parses");
        assert_eq!(
            config.template_policy,
            TemplatePolicy {
                refuse_host_access: true,
                service_accounts: vec!["trainer".to_owned()],
            }
        );
        let err = OperatorConfig::from_yaml("templatePolicy: {serviceAccounts: [\"\"]}\n")
            .expect_err("an empty name")
            .to_string();
        assert!(err.contains("templatePolicy.serviceAccounts[0]"), "{err}");
        let err = OperatorConfig::from_yaml("templatePolicy: {refuseHostPath: true}\n")
            .expect_err("an unknown field")
            .to_string();
        assert!(err.contains("refuseHostPath"), "{err}");
    }

    #[test]
    fn empty_file_gives_defaults() {
        assert_eq!(
            OperatorConfig::from_yaml("# nothing\n").expect("parses"),
            OperatorConfig::default()
        );
    }

    #[test]
    fn partial_file_keeps_other_defaults() {
        let c = OperatorConfig::from_yaml("nodeNotReadyTimeoutSeconds: 5\n").expect("parses");
        assert_eq!(c.node_not_ready_timeout_seconds, 5);
        assert_eq!(c.container_waiting_timeout_seconds, 300);
        assert_eq!(c.prices.len(), 6);
    }

    #[test]
    fn unknown_field_is_rejected_with_its_name() {
        let err = OperatorConfig::from_yaml("nodeNotReadyTimeout: 5\n").expect_err("rejected");
        assert!(err.to_string().contains("nodeNotReadyTimeout"), "{err}");
    }

    #[test]
    fn negative_price_is_rejected_naming_the_entry() {
        let err = OperatorConfig::from_yaml("prices: [{match: T4, spot: -1}]\n").expect_err("bad");
        assert!(err.to_string().contains("prices[0]"), "{err}");
    }

    #[test]
    fn price_prefers_the_entry_with_most_matching_tokens() {
        let c = OperatorConfig::default();
        assert_eq!(c.price("NVIDIA-A100-SXM4-80GB", true), Some(1.25));
        assert_eq!(c.price("NVIDIA-A100-PCIE-40GB", true), Some(1.10));
        assert_eq!(c.price("NVIDIA-H100-80GB-HBM3", true), Some(2.50));
        assert_eq!(c.price("Tesla-T4", true), Some(0.12));
        assert_eq!(c.price("nvidia-a10g", true), Some(0.50));
    }

    #[test]
    fn price_tokens_must_match_whole_label_tokens() {
        let c = OperatorConfig::default();
        // "L4" must not price an L40S, nor "A100" tokens an unknown product.
        assert_eq!(c.price("NVIDIA-L40S", true), None);
        assert_eq!(c.price("NVIDIA-L4", true), Some(0.25));
        assert_eq!(c.price("NVIDIA-A100-SXM4", true), None);
    }

    #[test]
    fn on_demand_price_uses_multiplier_unless_overridden() {
        let c = OperatorConfig::from_yaml(
            "onDemandMultiplier: 2.0\nprices: [{match: T4, spot: 0.1}, {match: H100, spot: 2.0, onDemand: 9.0}]\n",
        )
        .expect("parses");
        assert_eq!(c.price("Tesla-T4", false), Some(0.2));
        assert_eq!(c.price("NVIDIA-H100-80GB-HBM3", false), Some(9.0));
    }

    #[test]
    fn spot_nodes_are_recognised_by_any_provider_label() {
        let c = OperatorConfig::default();
        let labels = |k: &str, v: &str| BTreeMap::from([(k.to_owned(), v.to_owned())]);
        assert!(c.is_spot(&labels(KARPENTER_CAPACITY_TYPE, "spot")));
        assert!(c.is_spot(&labels(EKS_CAPACITY_TYPE, "SPOT")));
        assert!(!c.is_spot(&labels(KARPENTER_CAPACITY_TYPE, "on-demand")));
        assert!(!c.is_spot(&BTreeMap::new()));
    }
}
