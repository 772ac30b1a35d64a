//! Names of the environment variables the operator sets on the trainer container: the
//! trainer's contract, documented (with the values) in docs/env-contract.md.

/// The checkpoint volume's mount path, shared by all workers and attempts.
pub const CHECKPOINT_DIR: &str = "CHECKPOINT_DIR";
/// Where the trainer writes its checkpoint.
pub const CHECKPOINT_PATH: &str = "CHECKPOINT_PATH";
/// The checkpoint to resume from; set on every attempt after the first, and on the first
/// when the checkpoint claim was there before the job.
pub const RESUME_FROM: &str = "RESUME_FROM";
/// The longest `checkpointFile` a report may name (a file name on Linux file systems).
pub const MAX_CHECKPOINT_FILE_BYTES: usize = 255;

/// Whether `name` may be a report's `checkpointFile`, which the operator names in
/// [`RESUME_FROM`] as `<CHECKPOINT_DIR>/<name>`: a plain file name in the checkpoint
/// directory (no `/`, not `.` or `..`, not hidden, no control characters), at most
/// [`MAX_CHECKPOINT_FILE_BYTES`] bytes. Status is input too, so the operator checks it again
/// before it sets the variable.
pub fn is_checkpoint_file_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_CHECKPOINT_FILE_BYTES
        && !name.starts_with('.')
        && !name.contains('/')
        && !name.chars().any(char::is_control)
}

/// The job's name.
pub const TRAINYARD_JOB: &str = "TRAINYARD_JOB";
/// The 0-based attempt.
pub const TRAINYARD_ATTEMPT: &str = "TRAINYARD_ATTEMPT";
/// With `spec.elastic`: the job's full number of processes, `workers × max(gpusPerWorker, 1)`
/// ([`WORLD_SIZE`] is this attempt's, smaller after a shrink).
pub const TRAINYARD_FULL_WORLD_SIZE: &str = "TRAINYARD_FULL_WORLD_SIZE";
/// The attempt's checkpoint fencing token, `<created>:<attempt>:<uid>` (the job's
/// creationTimestamp in unix seconds, the attempt, the job's uid): tokens are ordered by
/// `(created, attempt)`; a trainer publishes a checkpoint only while the fence file in the
/// checkpoint directory holds its own token (docs/env-contract.md).
pub const TRAINYARD_FENCE_TOKEN: &str = "TRAINYARD_FENCE_TOKEN";
/// Why this attempt exists: [`REASON_NONE`], [`REASON_EXISTING_CLAIM`] or a `RestartReason`.
pub const TRAINYARD_RESTART_REASON: &str = "TRAINYARD_RESTART_REASON";
/// [`TRAINYARD_RESTART_REASON`] of a job's first attempt on a claim it created.
pub const REASON_NONE: &str = "none";
/// [`TRAINYARD_RESTART_REASON`] of a job's first attempt on a checkpoint claim that was there
/// before the job (kept by `retainOnDelete` from an earlier job of the same name, or an
/// `existingClaim`): [`RESUME_FROM`] is set.
pub const REASON_EXISTING_CLAIM: &str = "ExistingClaim";
/// Address of worker 0, the torch.distributed rendezvous.
pub const MASTER_ADDR: &str = "MASTER_ADDR";
/// Port of the rendezvous.
pub const MASTER_PORT: &str = "MASTER_PORT";
/// Number of workers.
pub const NNODES: &str = "NNODES";
/// This worker's rank.
pub const NODE_RANK: &str = "NODE_RANK";
/// Processes per worker.
pub const NPROC_PER_NODE: &str = "NPROC_PER_NODE";
/// Processes in the whole job.
pub const WORLD_SIZE: &str = "WORLD_SIZE";
/// torchrun's name for [`NNODES`].
pub const PET_NNODES: &str = "PET_NNODES";
/// torchrun's name for [`NODE_RANK`].
pub const PET_NODE_RANK: &str = "PET_NODE_RANK";
/// torchrun's name for [`NPROC_PER_NODE`].
pub const PET_NPROC_PER_NODE: &str = "PET_NPROC_PER_NODE";
/// torchrun's name for [`MASTER_ADDR`].
pub const PET_MASTER_ADDR: &str = "PET_MASTER_ADDR";
/// torchrun's name for [`MASTER_PORT`].
pub const PET_MASTER_PORT: &str = "PET_MASTER_PORT";
/// torchrun's rendezvous id, one per attempt (`<job uid>-<attempt>`): its static rendezvous
/// keeps its keys under it, so an agent of an older attempt never meets a newer one.
pub const PET_RDZV_ID: &str = "PET_RDZV_ID";
/// Where the trainer reports its progress (POST, JSON); set only when the operator serves
/// the progress channel. docs/env-contract.md has the protocol.
pub const TRAINYARD_PROGRESS_URL: &str = "TRAINYARD_PROGRESS_URL";
/// The file holding the token a progress report carries (`Authorization: Bearer`): the
/// pod's service-account token for the operator's audience, rotated by the kubelet.
pub const TRAINYARD_PROGRESS_TOKEN_FILE: &str = "TRAINYARD_PROGRESS_TOKEN_FILE";
/// Where the container's supervisor asks which attempt to run (`spec.restartPolicy.inPlace`).
pub const TRAINYARD_SUPERVISOR_URL: &str = "TRAINYARD_SUPERVISOR_URL";
/// How long the supervisor gives the old attempt after SIGTERM: the pod's grace period.
pub const TRAINYARD_STOP_GRACE_SECONDS: &str = "TRAINYARD_STOP_GRACE_SECONDS";
/// `1` on a replacement created ahead of a termination notice (a standby): its supervisor
/// runs nothing until the operator's start order, as if the attempt before its own had
/// stopped there.
pub const TRAINYARD_STANDBY: &str = "TRAINYARD_STANDBY";
/// PyTorch's CUDA allocator settings (a default the template may override).
pub const PYTORCH_CUDA_ALLOC_CONF: &str = "PYTORCH_CUDA_ALLOC_CONF";
/// NCCL's async error handling (a default the template may override).
pub const TORCH_NCCL_ASYNC_ERROR_HANDLING: &str = "TORCH_NCCL_ASYNC_ERROR_HANDLING";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_documented_in_the_env_contract() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/env-contract.md"),
        )
        .expect("docs/env-contract.md");
        let names = [
            CHECKPOINT_DIR,
            CHECKPOINT_PATH,
            RESUME_FROM,
            TRAINYARD_JOB,
            TRAINYARD_ATTEMPT,
            TRAINYARD_FENCE_TOKEN,
            TRAINYARD_RESTART_REASON,
            MASTER_ADDR,
            MASTER_PORT,
            NNODES,
            NODE_RANK,
            NPROC_PER_NODE,
            WORLD_SIZE,
            PET_NNODES,
            PET_NODE_RANK,
            PET_NPROC_PER_NODE,
            PET_MASTER_ADDR,
            PET_MASTER_PORT,
            PET_RDZV_ID,
            PYTORCH_CUDA_ALLOC_CONF,
            TORCH_NCCL_ASYNC_ERROR_HANDLING,
            TRAINYARD_PROGRESS_URL,
            TRAINYARD_PROGRESS_TOKEN_FILE,
            TRAINYARD_FULL_WORLD_SIZE,
        ];
        for name in names {
            assert!(
                doc.contains(&format!("`{name}`")),
                "{name} is not in docs/env-contract.md"
            );
        }
    }

    #[test]
    fn a_checkpoint_file_is_a_plain_name_inside_the_checkpoint_directory() {
        for good in ["step-000000120-a3.pt", "latest.pt", "ckpt 7.pt"] {
            assert!(is_checkpoint_file_name(good), "{good}");
        }
        let long = "a".repeat(MAX_CHECKPOINT_FILE_BYTES + 1);
        for bad in [
            "",
            ".",
            "..",
            "../x.pt",
            "a/b.pt",
            "/etc/passwd",
            ".hidden",
            "a\nb",
            &long,
        ] {
            assert!(!is_checkpoint_file_name(bad), "{bad:?}");
        }
    }
}
