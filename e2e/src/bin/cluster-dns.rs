//! The local cluster's DNS feeder: watches Services and Endpoints on the API server and keeps a
//! hosts file for dnsmasq (started with `--hostsdir`, which re-reads changed files by itself).
//! It plays the part CoreDNS's kubernetes plugin plays in a real cluster, for the names the
//! harness needs:
//!
//! - `<service>.<namespace>.svc.<domain>`: the ClusterIP, or every endpoint of a headless
//!   Service;
//! - `<hostname>.<service>.<namespace>.svc.<domain>`: a pod with `hostname`/`subdomain`
//!   (the Endpoints controller copies the hostname onto its address).
//!
//! usage: `trainyard-cluster-dns HOSTS_DIR [DOMAIN]` (KUBECONFIG selects the cluster)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

const HOSTS_FILE: &str = "cluster.hosts";

/// The hosts-file lines ("IP NAME") for the cluster's Services and Endpoints, sorted.
fn render(services: &Store<Service>, endpoints: &Store<Endpoints>, domain: &str) -> String {
    let mut lines = BTreeSet::new();
    for svc in services.state() {
        let (Some(ns), name) = (svc.namespace(), svc.name_any()) else {
            continue;
        };
        let fqdn = format!("{name}.{ns}.svc.{domain}");
        match svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) {
            Some(ip) if !ip.is_empty() && ip != "None" => {
                lines.insert(format!("{ip} {fqdn}"));
            }
            _ => {}
        }
        let key = reflector::ObjectRef::<Endpoints>::new(&name).within(&ns);
        let Some(ep) = endpoints.get(&key) else {
            continue;
        };
        let headless = svc
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ip.as_deref())
            .is_some_and(|ip| ip == "None");
        let addresses = ep
            .subsets
            .iter()
            .flatten()
            .flat_map(|s| s.addresses.iter().flatten());
        for a in addresses {
            if headless {
                lines.insert(format!("{} {fqdn}", a.ip));
            }
            if let Some(host) = a.hostname.as_deref().filter(|h| !h.is_empty()) {
                lines.insert(format!("{} {host}.{fqdn}", a.ip));
            }
        }
    }
    lines.into_iter().map(|l| l + "\n").collect()
}

/// Replaces the hosts file atomically: dnsmasq ignores names starting with a dot.
fn write_atomically(dir: &Path, content: &str) -> Result<()> {
    let tmp = dir.join(format!(".{HOSTS_FILE}.tmp"));
    std::fs::write(&tmp, content).with_context(|| format!("writing {}", tmp.display()))?;
    let target = dir.join(HOSTS_FILE);
    std::fs::rename(&tmp, &target).with_context(|| format!("renaming onto {}", target.display()))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let mut args = std::env::args_os().skip(1);
    let dir = PathBuf::from(
        args.next()
            .context("usage: trainyard-cluster-dns HOSTS_DIR [DOMAIN]")?,
    );
    let domain = args
        .next()
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_else(|| "cluster.local".to_owned());
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let client = Client::try_default()
        .await
        .context("a client for the cluster (KUBECONFIG)")?;

    let (services, svc_writer) = reflector::store();
    let (endpoints, ep_writer) = reflector::store();
    let svc_events = watcher(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(svc_writer)
    .map(|e| e.map(|_| ()).map_err(anyhow::Error::from))
    .boxed();
    let ep_events = watcher(Api::<Endpoints>::all(client), watcher::Config::default())
        .default_backoff()
        .reflect(ep_writer)
        .map(|e| e.map(|_| ()).map_err(anyhow::Error::from))
        .boxed();
    let mut changes = stream::select(svc_events, ep_events);

    let mut written: Option<String> = None;
    while let Some(change) = changes.next().await {
        if let Err(e) = change {
            eprintln!("cluster-dns: watch error (retrying): {e:#}");
            continue;
        }
        let hosts = render(&services, &endpoints, &domain);
        if written.as_deref() != Some(hosts.as_str()) {
            write_atomically(&dir, &hosts)?;
            eprintln!("cluster-dns: {} name(s)", hosts.lines().count());
            written = Some(hosts);
        }
    }
    Ok(())
}
