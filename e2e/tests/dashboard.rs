//! The chart's Grafana dashboard against a real Prometheus that scrapes what the chart's
//! ServiceMonitors select.
//!
//! `e2e/cluster/prometheus.sh start` runs Debian's Prometheus on the host with a scrape
//! configuration generated from the rendered ServiceMonitors (their selector labels and port
//! name become keep rules). `make e2e` starts it with the cluster and runs these tests after
//! the Helm scenarios, so that the jobs, preemptions and restarts those made are in its data.
//! Every `expr` of every panel (rows' nested panels included, so panels added later are
//! covered without a change here) is evaluated as Grafana would over the dashboard's default
//! time range: template variables substituted (constants by their value, "All" by its
//! regex), `$__rate_interval` from the step and the scrape interval. A query that Prometheus
//! rejects, or whose result has no finite sample at any step, fails the test, naming the
//! panel. Against a running cluster:
//! `cargo test -p trainyard-e2e --test dashboard -- --ignored`.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use trainyard_e2e::{node_name, node2_name, repo_root};

/// Where `e2e/cluster/prometheus.sh` serves (`TRAINYARD_PROMETHEUS_PORT`, default 19090).
fn prometheus_url() -> String {
    let port = std::env::var("TRAINYARD_PROMETHEUS_PORT").unwrap_or_else(|_| "19090".into());
    format!("http://127.0.0.1:{port}")
}

/// The scrape pools prometheus_config.py generates for the chart's two ServiceMonitors
/// (prometheus-operator's `serviceMonitor/<namespace>/<name>/<endpoint>`).
const OPERATOR_POOL: &str = "serviceMonitor/trainyard-system/trainyard-operator/0";
const PLUGIN_POOL: &str = "serviceMonitor/trainyard-system/trainyard-device-plugin/0";

/// Most points a range query asks for (Grafana asks for about a panel's width in pixels).
const MAX_POINTS: i64 = 1000;

/// One query of the dashboard: the panel it draws, its target's refId and its expression.
#[derive(Debug, Clone, PartialEq)]
struct PanelQuery {
    panel: String,
    ref_id: String,
    expr: String,
}

/// Every target expression of every panel, rows' collapsed panels included.
fn panel_queries(dashboard: &Value) -> Vec<PanelQuery> {
    fn walk(panels: &[Value], out: &mut Vec<PanelQuery>) {
        for p in panels {
            let title = p["title"].as_str().unwrap_or("(untitled)");
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = t["expr"].as_str() {
                    out.push(PanelQuery {
                        panel: title.to_owned(),
                        ref_id: t["refId"].as_str().unwrap_or("?").to_owned(),
                        expr: expr.to_owned(),
                    });
                }
            }
            walk(p["panels"].as_array().map_or(&[], Vec::as_slice), out);
        }
    }
    let mut out = Vec::new();
    walk(
        dashboard["panels"].as_array().map_or(&[], Vec::as_slice),
        &mut out,
    );
    out
}

/// The value each template variable takes: a constant, custom or text box its current value
/// (or its query), a variable with "All" its `allValue` (else `.*`, which matches what the
/// regex of every value would), any other query variable its current value or `.*`.
/// Data source variables name no part of an expression and take none.
fn template_values(dashboard: &Value) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let name = v["name"]
            .as_str()
            .context("a template variable without a name")?;
        let current = match &v["current"]["value"] {
            Value::String(s) if s != "$__all" => Some(s.clone()),
            Value::Array(a) if !a.is_empty() && a.iter().all(|x| x != "$__all") => Some(format!(
                "({})",
                a.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join("|")
            )),
            _ => None,
        };
        let all = v["includeAll"].as_bool() == Some(true) && current.is_none();
        let value = match v["type"].as_str().unwrap_or("") {
            "datasource" | "adhoc" => continue,
            "constant" | "custom" | "textbox" | "interval" => current
                .or_else(|| v["query"].as_str().map(str::to_owned))
                .with_context(|| format!("variable {name} has no value"))?,
            "query" if all => v["allValue"].as_str().unwrap_or(".*").to_owned(),
            "query" => current.unwrap_or_else(|| ".*".into()),
            other => bail!("variable {name} has a type this test does not know: {other:?}"),
        };
        out.insert(name.to_owned(), value);
    }
    Ok(out)
}

/// Grafana's interval variables for a range query with `step` over `range` seconds, where
/// targets are scraped every `scrape` seconds: `$__rate_interval` is
/// max(`$__interval` + scrape interval, 4 × scrape interval).
fn interval_values(step: i64, scrape: i64, range: i64) -> BTreeMap<String, String> {
    let rate = (step + scrape).max(4 * scrape);
    BTreeMap::from([
        ("__interval".into(), format!("{step}s")),
        ("__interval_ms".into(), (step * 1000).to_string()),
        ("__rate_interval".into(), format!("{rate}s")),
        ("__range".into(), format!("{range}s")),
        ("__range_s".into(), range.to_string()),
        ("__range_ms".into(), (range * 1000).to_string()),
    ])
}

/// Substitutes `$name`, `${name}`, `${name:format}` and `[[name]]` as Grafana does. A name
/// that is no variable is an error, except all-digit ones (`$1` in `label_replace`).
fn substitute(expr: &str, vars: &BTreeMap<String, String>) -> Result<String, String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let (mut out, mut rest) = (String::new(), expr);
    while let Some(at) = rest.find(['$', '[']) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let (name, len) = if let Some(t) = tail.strip_prefix("${") {
            let end = t
                .find('}')
                .ok_or_else(|| format!("unclosed ${{ in {expr}"))?;
            (t[..end].split(':').next().unwrap_or(""), end + 3)
        } else if let Some(t) = tail.strip_prefix("[[") {
            let end = t
                .find("]]")
                .ok_or_else(|| format!("unclosed [[ in {expr}"))?;
            (t[..end].split(':').next().unwrap_or(""), end + 4)
        } else if let Some(t) = tail.strip_prefix('$') {
            let end = t.find(|c| !is_name(c)).unwrap_or(t.len());
            (&t[..end], end + 1)
        } else {
            ("", 0)
        };
        if name.is_empty() || name.chars().all(|c| c.is_ascii_digit()) {
            let keep = len.max(1);
            out.push_str(&tail[..keep]);
            rest = &tail[keep..];
            continue;
        }
        let value = vars
            .get(name)
            .ok_or_else(|| format!("the dashboard defines no variable ${name}"))?;
        out.push_str(value);
        rest = &tail[len..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Whether a query result holds at least one finite sample (NaN, as `histogram_quantile`
/// gives over no observations, draws nothing).
fn has_data(data: &Value) -> bool {
    let finite = |p: &Value| {
        p[1].as_str()
            .and_then(|s| s.parse::<f64>().ok())
            .is_some_and(f64::is_finite)
    };
    data["result"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|series| {
            series["values"]
                .as_array()
                .into_iter()
                .flatten()
                .any(finite)
                || finite(&series["value"])
        })
}

/// A Prometheus or Grafana duration (`10s`, `1m`, `6h`, `7d`) in seconds.
fn duration_secs(s: &str) -> Result<i64> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: i64 = n.parse().with_context(|| format!("duration {s:?}"))?;
    Ok(n * match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => bail!("duration {s:?}: unit {unit:?}"),
    })
}

/// GET `path` of the Prometheus HTTP API (through curl) and its `data`, or its error.
fn prometheus(path: &str, params: &[(&str, String)]) -> Result<Value> {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-G", "--max-time", "60"])
        .arg(format!("{}{path}", prometheus_url()));
    for (k, v) in params {
        cmd.arg("--data-urlencode").arg(format!("{k}={v}"));
    }
    let out = cmd.output().context("running curl")?;
    ensure!(
        out.status.success(),
        "GET {path} from {}: {} (is e2e/cluster/prometheus.sh started?)",
        prometheus_url(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let body: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("GET {path}: {}", String::from_utf8_lossy(&out.stdout)))?;
    if body["status"] != "success" {
        bail!(
            "{}: {}",
            body["errorType"].as_str().unwrap_or("error"),
            body["error"].as_str().unwrap_or("?")
        );
    }
    Ok(body["data"].clone())
}

/// The active targets of the chart's scrape pools, and a line per target for messages.
fn chart_targets() -> Result<(Vec<Value>, String)> {
    let data = prometheus("/api/v1/targets", &[("state", "active".into())])?;
    let targets: Vec<Value> = data["activeTargets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| [OPERATOR_POOL, PLUGIN_POOL].contains(&t["scrapePool"].as_str().unwrap_or("")))
        .cloned()
        .collect();
    let listing = targets
        .iter()
        .map(|t| {
            format!(
                "  {} {} on {} ({}) {}",
                t["scrapePool"],
                t["labels"]["instance"],
                t["discoveredLabels"]["__meta_kubernetes_pod_node_name"],
                t["health"],
                t["lastError"]
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    let listing = if listing.is_empty() {
        "  nothing".to_owned()
    } else {
        listing
    };
    Ok((targets, listing))
}

/// Whether the targets cover an up operator and an up device plugin on each of `nodes`.
fn covers(targets: &[Value], nodes: &[String]) -> bool {
    let up = |pool: &str, node: Option<&str>| {
        targets.iter().any(|t| {
            t["scrapePool"] == pool
                && t["health"] == "up"
                && node
                    .is_none_or(|n| t["discoveredLabels"]["__meta_kubernetes_pod_node_name"] == n)
        })
    };
    up(OPERATOR_POOL, None) && nodes.iter().all(|n| up(PLUGIN_POOL, Some(n)))
}

#[test]
#[ignore = "needs the local cluster (make test)"]
fn dashboard_prometheus_scrapes_the_operator_and_both_nodes_device_plugins() -> Result<()> {
    let nodes = [node_name(), node2_name()];
    let mut last = String::new();
    for _ in 0..60 {
        let (targets, listing) = chart_targets()?;
        if covers(&targets, &nodes) {
            return Ok(());
        }
        last = listing;
        std::thread::sleep(Duration::from_secs(1));
    }
    bail!(
        "after 60 s Prometheus has no up target for the operator ({OPERATOR_POOL}) or for the \
         device plugin ({PLUGIN_POOL}) on each of {nodes:?}; the chart's ServiceMonitors select:\n{last}"
    )
}

/// The range a user opening the dashboard now sees: its default time range (`time.from`,
/// `now-<duration>`, to now), as (start, end, step) in Unix seconds.
fn evaluation_range(dashboard: &Value) -> Result<(i64, i64, i64)> {
    let from = dashboard["time"]["from"].as_str().unwrap_or("");
    let span = from
        .strip_prefix("now-")
        .with_context(|| format!("the dashboard's time.from {from:?} is not now-<duration>"))
        .and_then(duration_secs)?;
    ensure!(
        dashboard["time"]["to"] == "now",
        "the dashboard's time.to is not now"
    );
    let end = jiff::Timestamp::now().as_second();
    Ok((end - span, end, (span / MAX_POINTS).max(15)))
}

/// The longest scrape interval of the chart's targets, in seconds.
fn scrape_interval() -> Result<i64> {
    let (targets, listing) = chart_targets()?;
    ensure!(
        !targets.is_empty(),
        "Prometheus has no target of the chart's ServiceMonitors"
    );
    targets
        .iter()
        .map(|t| duration_secs(t["scrapeInterval"].as_str().unwrap_or("")))
        .try_fold(0, |max, s| s.map(|s| s.max(max)))
        .with_context(|| format!("scrape intervals of\n{listing}"))
}

/// Evaluates one panel query over the range: `None` when it returns data, else why not.
fn check_query(
    q: &PanelQuery,
    vars: &BTreeMap<String, String>,
    range: (i64, i64, i64),
) -> Option<String> {
    let what = format!("panel {:?} (query {})", q.panel, q.ref_id);
    let expr = match substitute(&q.expr, vars) {
        Ok(e) => e,
        Err(e) => return Some(format!("{what}: {e}")),
    };
    let (start, end, step) = range;
    let params = [
        ("query", expr.clone()),
        ("start", start.to_string()),
        ("end", end.to_string()),
        ("step", step.to_string()),
    ];
    match prometheus("/api/v1/query_range", &params) {
        Err(e) => Some(format!("{what}: invalid: {e:#}\n    {expr}")),
        Ok(data) if !has_data(&data) => Some(format!("{what}: no data\n    {expr}")),
        Ok(_) => None,
    }
}

/// The `label_values(EXPR, LABEL)` query of each query variable, as the panel-like
/// `count by (LABEL) (EXPR)`: a variable whose list would be empty fails like a panel.
fn variable_queries(dashboard: &Value) -> Result<Vec<PanelQuery>> {
    let mut out = Vec::new();
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if v["type"] != "query" {
            continue;
        }
        let name = v["name"].as_str().unwrap_or("?");
        let q = v["query"]["query"]
            .as_str()
            .or(v["query"].as_str())
            .unwrap_or("");
        let args = q
            .strip_prefix("label_values(")
            .and_then(|a| a.strip_suffix(')'))
            .and_then(|a| a.rsplit_once(','))
            .with_context(|| {
                format!(
                    "variable {name}: only label_values(EXPR, LABEL) is evaluated here, not {q:?}"
                )
            })?;
        out.push(PanelQuery {
            panel: format!("variable ${name}"),
            ref_id: "query".into(),
            expr: format!("count by ({}) ({})", args.1.trim(), args.0.trim()),
        });
    }
    Ok(out)
}

#[test]
#[ignore = "needs the local cluster (make test)"]
fn dashboard_every_panel_query_returns_data_from_the_chart_scrape_targets() -> Result<()> {
    let path = repo_root().join("charts/trainyard/dashboards/trainyard.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)
        .with_context(|| format!("parsing {}", path.display()))?;
    let queries = panel_queries(&dashboard);
    ensure!(
        !queries.is_empty(),
        "{} has no panel queries",
        path.display()
    );
    let range = evaluation_range(&dashboard)?;
    let mut vars = template_values(&dashboard)?;
    vars.extend(interval_values(
        range.2,
        scrape_interval()?,
        range.1 - range.0,
    ));
    let all: Vec<PanelQuery> = variable_queries(&dashboard)?
        .into_iter()
        .chain(queries)
        .collect();
    let failures: Vec<String> = all
        .iter()
        .filter_map(|q| check_query(q, &vars, range))
        .collect();
    eprintln!(
        "dashboard: {} queries over {} s (step {} s, $__rate_interval {}): {} failed",
        all.len(),
        range.1 - range.0,
        range.2,
        vars["__rate_interval"],
        failures.len()
    );
    ensure!(
        failures.is_empty(),
        "{} of {} dashboard queries are invalid or return no data:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
    Ok(())
}

// ---- pure parts: no cluster ----

fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn substitute_replaces_every_grafana_variable_syntax() {
    let v = vars(&[
        ("m", "metric_total"),
        ("node", ".*"),
        ("__rate_interval", "60s"),
    ]);
    assert_eq!(
        substitute(
            r#"rate(${m}{node=~"$node"}[$__rate_interval]) + [[m]] + ${m:raw}"#,
            &v
        ),
        Ok(r#"rate(metric_total{node=~".*"}[60s]) + metric_total + metric_total"#.to_owned())
    );
}

#[test]
fn substitute_names_an_undefined_variable_and_keeps_label_replace_groups() {
    let v = vars(&[("m", "x")]);
    assert_eq!(
        substitute(r#"sum(${m}{namespace=~"$namespace"})"#, &v),
        Err("the dashboard defines no variable $namespace".to_owned())
    );
    assert_eq!(
        substitute(r#"label_replace($m, "a", "$1", "b", "(.*)$")"#, &v),
        Ok(r#"label_replace(x, "a", "$1", "b", "(.*)$")"#.to_owned())
    );
}

#[test]
fn rate_interval_is_four_scrapes_or_a_step_and_a_scrape() {
    assert_eq!(interval_values(15, 10, 600)["__rate_interval"], "40s");
    assert_eq!(interval_values(60, 10, 60_000)["__rate_interval"], "70s");
}

#[test]
fn panel_queries_include_collapsed_rows_and_template_values_resolve_all_and_constants() -> Result<()>
{
    let dashboard = serde_json::json!({
        "panels": [
            {"title": "A", "targets": [{"refId": "A", "expr": "up"}]},
            {"title": "Row", "type": "row", "panels": [
                {"title": "Nested", "targets": [{"refId": "B", "expr": "${m}"}]}]}
        ],
        "templating": {"list": [
            {"name": "m", "type": "constant", "query": "x_total"},
            {"name": "node", "type": "query", "includeAll": true, "allValue": ".*",
             "current": {"value": ["$__all"]}},
            {"name": "gpu", "type": "query", "includeAll": true, "current": {}},
            {"name": "ds", "type": "datasource"}
        ]}
    });
    let titles: Vec<String> = panel_queries(&dashboard)
        .into_iter()
        .map(|q| q.panel)
        .collect();
    assert_eq!(titles, ["A", "Nested"]);
    assert_eq!(
        template_values(&dashboard)?,
        vars(&[("m", "x_total"), ("node", ".*"), ("gpu", ".*")])
    );
    Ok(())
}

#[test]
fn has_data_needs_a_finite_sample() {
    let nan = serde_json::json!({"result": [{"metric": {}, "values": [[1, "NaN"], [2, "NaN"]]}]});
    let one = serde_json::json!({"result": [{"metric": {}, "values": [[1, "NaN"], [2, "0"]]}]});
    assert!(!has_data(&nan));
    assert!(has_data(&one));
    assert!(!has_data(&serde_json::json!({"result": []})));
}

#[test]
fn durations_parse_in_seconds() -> Result<()> {
    assert_eq!(duration_secs("10s")?, 10);
    assert_eq!(duration_secs("2m")?, 120);
    assert!(duration_secs("10").is_err());
    Ok(())
}

#[test]
fn the_evaluation_range_is_the_dashboards_default_time_range() -> Result<()> {
    let (start, end, step) =
        evaluation_range(&serde_json::json!({"time": {"from": "now-6h", "to": "now"}}))?;
    assert_eq!((end - start, step), (21_600, 21));
    assert!(
        evaluation_range(&serde_json::json!({"time": {"from": "2024-01-01", "to": "now"}}))
            .is_err()
    );
    Ok(())
}
