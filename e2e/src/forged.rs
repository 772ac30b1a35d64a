//! A worker forged by a namespace user: a copy of a real worker pod (its labels, the job's
//! ownerReference, the operator's seal annotation, the progress token volume) under another
//! name, that speaks for the copied rank on the progress channel. The copied-worker scenario
//! creates one as a namespace user with `create pods` and nothing else; the chaos run's
//! `ForgedWorker` fault keeps one posting while other faults go on. Whatever it posts must be
//! refused (403) and move nothing in the job's status.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use trainyard_api::crd::{LABEL_ATTEMPT, LABEL_RANK};
use trainyard_api::env::{
    TRAINYARD_JOB, TRAINYARD_PROGRESS_TOKEN_FILE, TRAINYARD_PROGRESS_URL, TRAINYARD_SUPERVISOR_URL,
};

/// The step a forged report claims: no job of the harness trains that far.
pub const FORGED_STEP: u64 = 999_999;
/// The checkpoint file a forged report claims to have saved: it exists nowhere.
pub const FORGED_FILE: &str = "forged-nonexistent.pt";
/// The harness's own mark on the pods it forges, so that its checkers leave them out of the
/// job's pods. The operator does not read it: it tells its pods from its own records.
pub const FORGED_LABEL: &str = "e2e.trainyard.dev/forged";

/// What the forged pod runs: every second, rank `FORGED_RANK`'s progress report at attempt
/// `FORGED_ATTEMPT` and again at attempt u32::MAX (step `FORGED_STEP`, [`FORGED_STEP`];
/// checkpoint `FORGED_FILE`, [`FORGED_FILE`]), and, when the copied worker had a supervisor, its poll saying the attempt
/// exited with code 1. Each round prints one line of HTTP statuses:
/// `report=403 huge=403 poll=403` (`error` for no answer).
const SCRIPT: &str = r#"
import json, os, time, urllib.error, urllib.request
job, rank = os.environ["TRAINYARD_JOB"], int(os.environ["FORGED_RANK"])
attempt = int(os.environ["FORGED_ATTEMPT"])
def post(url, body):
    token = open(os.environ["TRAINYARD_PROGRESS_TOKEN_FILE"]).read().strip()
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Authorization": "Bearer " + token,
                                  "Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return str(r.status)
    except urllib.error.HTTPError as e:
        return str(e.code)
    except Exception:
        return "error"
step = int(os.environ["FORGED_STEP"])
report = {"job": job, "rank": rank, "attempt": attempt, "step": step,
          "checkpointStep": step, "checkpointFile": os.environ["FORGED_FILE"]}
supervisor = os.environ.get("TRAINYARD_SUPERVISOR_URL", "")
while True:
    said = ["report=" + post(os.environ["TRAINYARD_PROGRESS_URL"], report),
            "huge=" + post(os.environ["TRAINYARD_PROGRESS_URL"], dict(report, attempt=4294967295))]
    if supervisor:
        said.append("poll=" + post(supervisor, {"job": job, "rank": rank, "attempt": attempt,
                                                "state": "exited", "exitCode": 1,
                                                "exitedSecondsAgo": 0}))
    print(" ".join(said), flush=True)
    time.sleep(1)
"#;

/// A copy of `worker` as a namespace user would make it: every label (the attempt label set
/// to `attempt_label`) and annotation, the owner reference and the volumes, under `name`, on
/// no particular node, asking for no GPU, running [`SCRIPT`] for the worker's rank and
/// attempt. Its environment keeps only what the channel needs (so that the harness's `/proc`
/// scans do not take it for a process of the job's attempt).
pub fn forged_copy(worker: &Pod, name: &str, attempt_label: u32) -> Result<Value> {
    let label = |key: &str| -> Result<String> {
        worker
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(key))
            .cloned()
            .with_context(|| format!("the worker has no {key} label"))
    };
    let (rank, attempt) = (label(LABEL_RANK)?, label(LABEL_ATTEMPT)?);
    let mut pod = serde_json::to_value(worker)?;
    let meta = pod["metadata"].as_object_mut().context("metadata")?;
    meta.retain(|k, _| ["labels", "annotations", "ownerReferences"].contains(&k.as_str()));
    pod["metadata"]["name"] = json!(name);
    pod["metadata"]["labels"][LABEL_ATTEMPT] = json!(attempt_label.to_string());
    pod["metadata"]["labels"][FORGED_LABEL] = json!("true");
    pod.as_object_mut().context("pod")?.remove("status");
    let spec = pod["spec"].as_object_mut().context("spec")?;
    for field in ["nodeName", "hostname", "subdomain"] {
        spec.remove(field);
    }
    let container = &mut pod["spec"]["containers"][0];
    let kept = [
        TRAINYARD_JOB,
        TRAINYARD_PROGRESS_URL,
        TRAINYARD_PROGRESS_TOKEN_FILE,
        TRAINYARD_SUPERVISOR_URL,
    ];
    let mut env: Vec<Value> = container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["name"].as_str().is_some_and(|n| kept.contains(&n)))
        .cloned()
        .collect();
    env.push(json!({"name": "FORGED_RANK", "value": rank}));
    env.push(json!({"name": "FORGED_ATTEMPT", "value": attempt}));
    env.push(json!({"name": "FORGED_STEP", "value": FORGED_STEP.to_string()}));
    env.push(json!({"name": "FORGED_FILE", "value": FORGED_FILE}));
    container["env"] = json!(env);
    container["command"] = json!(["python3", "-c", SCRIPT]);
    container["resources"] = json!({});
    Ok(pod)
}

/// The answers a forged pod's log shows: (accepted, refused, other), each HTTP answer of each
/// round counted once.
pub fn answers(log: &str) -> (usize, usize, usize) {
    let mut counts = (0, 0, 0);
    let said = log
        .lines()
        .flat_map(str::split_whitespace)
        .filter_map(|w| w.split_once('=').map(|(_, code)| code));
    for code in said {
        match code {
            "200" => counts.0 += 1,
            "403" => counts.1 += 1,
            _ => counts.2 += 1,
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker() -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": "j-worker-1", "uid": "u", "resourceVersion": "9",
                "labels": {LABEL_RANK: "1", LABEL_ATTEMPT: "3", "trainyard.dev/job": "j"},
                "annotations": {"trainyard.dev/seal": "s"},
                "ownerReferences": [{"apiVersion": "trainyard.dev/v1alpha1", "kind": "TrainingJob",
                                     "name": "j", "uid": "job-uid", "controller": true}],
            },
            "spec": {"nodeName": "n1", "hostname": "j-worker-1", "subdomain": "j",
                     "containers": [{"name": "trainer", "image": "i",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}},
                                     "env": [{"name": TRAINYARD_JOB, "value": "j"},
                                             {"name": "TRAINYARD_ATTEMPT", "value": "3"},
                                             {"name": TRAINYARD_PROGRESS_URL, "value": "u"}]}]},
            "status": {"phase": "Running"},
        }))
        .unwrap()
    }

    #[test]
    fn a_forged_copy_keeps_the_workers_identity_and_claims_its_rank_without_its_attempt_env() {
        let pod = forged_copy(&worker(), "j-forged", u32::MAX).unwrap();
        assert_eq!(pod["metadata"]["name"], "j-forged");
        assert_eq!(pod["metadata"]["labels"][LABEL_ATTEMPT], "4294967295");
        assert_eq!(pod["metadata"]["labels"][FORGED_LABEL], "true");
        assert_eq!(pod["metadata"]["annotations"]["trainyard.dev/seal"], "s");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], "job-uid");
        assert!(pod["metadata"]["uid"].is_null() && pod["status"].is_null());
        assert!(pod["spec"]["nodeName"].is_null() && pod["spec"]["hostname"].is_null());
        let c = &pod["spec"]["containers"][0];
        assert_eq!(c["resources"], json!({}));
        let names: Vec<&str> = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v["name"].as_str())
            .collect();
        assert_eq!(
            names,
            [
                TRAINYARD_JOB,
                TRAINYARD_PROGRESS_URL,
                "FORGED_RANK",
                "FORGED_ATTEMPT",
                "FORGED_STEP",
                "FORGED_FILE"
            ]
        );
        let values: Vec<&str> = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .skip(2)
            .filter_map(|v| v["value"].as_str())
            .collect();
        assert_eq!(values, ["1", "3", "999999", "forged-nonexistent.pt"]);
        // Read from its environment: the script itself is not templated.
        assert_eq!(c["command"][2].as_str(), Some(SCRIPT));
    }

    #[test]
    fn the_answers_are_counted_from_the_forged_pods_log() {
        let log = "report=403 huge=403 poll=403\nreport=200 huge=error\n";
        assert_eq!(answers(log), (1, 3, 1));
        assert_eq!(answers(""), (0, 0, 0));
    }
}
