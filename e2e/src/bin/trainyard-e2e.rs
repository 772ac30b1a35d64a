//! Small cluster actions for `make demo` and manual testing.
//!
//! usage: trainyard-e2e preempt NAMESPACE POD [REASON]
use anyhow::{Result, bail};

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["preempt", ns, pod, rest @ ..] => {
            let reason = rest.first().copied().unwrap_or("TerminationByKubelet");
            let client = trainyard_e2e::client().await?;
            trainyard_e2e::preempt_pod(&client, ns, pod, reason).await?;
            println!("preempted {ns}/{pod} (DisruptionTarget/{reason}, then deleted)");
            Ok(())
        }
        _ => bail!("usage: trainyard-e2e preempt NAMESPACE POD [REASON]"),
    }
}
