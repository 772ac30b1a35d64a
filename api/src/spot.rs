//! How each provider marks its spot nodes (labels) and keeps other pods off them (taints), and
//! the taints that announce a node's termination: the defaults of the operator's
//! configuration (operator/config/default.yaml, docs/install.md).

/// GKE's spot label and taint key.
pub const GKE_SPOT: &str = "cloud.google.com/gke-spot";
/// GKE's label of (legacy) preemptible nodes.
pub const GKE_PREEMPTIBLE: &str = "cloud.google.com/gke-preemptible";
/// EKS managed node groups' capacity type label.
pub const EKS_CAPACITY_TYPE: &str = "eks.amazonaws.com/capacityType";
/// Karpenter's capacity type label (`spot` or `on-demand`).
pub const KARPENTER_CAPACITY_TYPE: &str = "karpenter.sh/capacity-type";
/// AKS's scale set priority label and taint key.
pub const AKS_SCALESET_PRIORITY: &str = "kubernetes.azure.com/scalesetpriority";
/// Karpenter's taint on a node it is about to remove.
pub const KARPENTER_DISRUPTED: &str = "karpenter.sh/disrupted";

/// A label (key = value) by which one provider marks its spot nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpotLabel {
    /// Provider name, for humans.
    pub provider: &'static str,
    /// Label key.
    pub key: &'static str,
    /// Label value on spot nodes.
    pub value: &'static str,
}

/// A `NoSchedule` taint (key = value) one provider puts on its spot nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpotTaint {
    /// Provider name, for humans.
    pub provider: &'static str,
    /// Taint key.
    pub key: &'static str,
    /// Taint value.
    pub value: &'static str,
}

/// The spot labels of the providers trainyard knows, in the order the default config lists them.
pub const SPOT_LABELS: &[SpotLabel] = &[
    SpotLabel {
        provider: "GKE",
        key: GKE_SPOT,
        value: "true",
    },
    SpotLabel {
        provider: "GKE",
        key: GKE_PREEMPTIBLE,
        value: "true",
    },
    SpotLabel {
        provider: "EKS",
        key: EKS_CAPACITY_TYPE,
        value: "SPOT",
    },
    SpotLabel {
        provider: "Karpenter",
        key: KARPENTER_CAPACITY_TYPE,
        value: "spot",
    },
    SpotLabel {
        provider: "AKS",
        key: AKS_SCALESET_PRIORITY,
        value: "spot",
    },
];

/// The spot taints workers that may run on spot tolerate, in the order the default config lists them.
pub const SPOT_TAINTS: &[SpotTaint] = &[
    SpotTaint {
        provider: "AKS",
        key: AKS_SCALESET_PRIORITY,
        value: "spot",
    },
    SpotTaint {
        provider: "GKE",
        key: GKE_SPOT,
        value: "true",
    },
];

/// Taints that warn of a termination to come, earlier than a notice: AWS's rebalance
/// recommendation (typically 10 to 20 minutes before the 2-minute interruption notice), as the
/// AWS Node Termination Handler taints a node with it. A worker there is moved ahead of time,
/// at its trainers' next checkpoint, when a replacement can wait elsewhere.
pub const EARLY_WARNING_TAINTS: &[&str] =
    &["aws-node-termination-handler/rebalance-recommendation"];

/// Taints that announce a node's termination: a worker that ends on such a node was preempted.
pub const TERMINATION_TAINTS: &[&str] = &[
    KARPENTER_DISRUPTED,
    "cloud.google.com/impending-node-termination",
    "aws-node-termination-handler/spot-itn",
    "ToBeDeletedByClusterAutoscaler",
];
