//! A cluster-autoscaler that names a group's ASG: it sets the same desired
//! counts the replenisher sets, and each undoes the other's. The tag its
//! auto-discovery finds an ASG by is judged with the ASG's other settings
//! (`competing`); kops's own addon (`spec.clusterAutoscaler.enabled`) names
//! its ASGs instead, one `--nodes=<min>:<max>:<instance group>.<cluster>`
//! per node instance group whose `spec.autoscale` is not false, on its
//! Deployment `kube-system/cluster-autoscaler` (labels
//! `app.kubernetes.io/name` and `k8s-app`: `cluster-autoscaler`). Found by
//! those labels, listed at most once a minute for every group, as another
//! termination handler is (`handlers`); nothing of it is changed.

use super::handlers::Listed;
use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use std::sync::Arc;

/// Its name, and the value of the labels it is found by.
pub const CLUSTER_AUTOSCALER: &str = "cluster-autoscaler";
const LABELS: [&str; 2] = ["app.kubernetes.io/name", "k8s-app"];

/// A running cluster-autoscaler and the ASGs it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Autoscaler {
    /// "namespace/name" of its Deployment.
    pub deployment: String,
    pub asgs: Vec<String>,
}

/// The running autoscalers, in the whole cluster or only in namespace
/// `scope`; None while they cannot be listed (the group's condition then
/// says nothing of them).
pub async fn autoscalers(
    seen: &Listed<Vec<Autoscaler>>,
    client: &kube::Client,
    scope: Option<&str>,
) -> Option<Arc<Vec<Autoscaler>>> {
    let what = "Deployments to find a cluster-autoscaler (RBAC: list on apps deployments)";
    seen.get(list(client, scope), what).await
}

/// Listed now, without the cache (`check`).
pub async fn list(
    client: &kube::Client,
    scope: Option<&str>,
) -> Result<Vec<Autoscaler>, kube::Error> {
    let api: Api<Deployment> = super::handlers::api(client, scope);
    let mut deployments = vec![];
    for label in LABELS {
        let params = ListParams::default().labels(&format!("{label}={CLUSTER_AUTOSCALER}"));
        deployments.extend(api.list(&params).await?.items);
    }
    Ok(running(&deployments))
}

/// Pure: each Deployment that runs (not scaled to 0), once, with the ASGs
/// its containers name with `--nodes`.
pub fn running(deployments: &[Deployment]) -> Vec<Autoscaler> {
    let mut found: Vec<Autoscaler> = deployments
        .iter()
        .filter(|d| d.spec.as_ref().and_then(|s| s.replicas) != Some(0))
        .map(|d| Autoscaler {
            deployment: format!("{}/{}", d.namespace().unwrap_or_default(), d.name_any()),
            asgs: named_asgs(d),
        })
        .collect();
    found.sort_by(|a, b| a.deployment.cmp(&b.deployment));
    found.dedup();
    found
}

/// Pure: the node groups a cluster-autoscaler's containers name, from
/// `--nodes=<min>:<max>:<name>` (or `--nodes <min>:<max>:<name>`) in their
/// command and arguments (kops writes them in the command).
pub fn named_asgs(deployment: &Deployment) -> Vec<String> {
    let containers = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|p| p.containers.as_slice())
        .unwrap_or_default();
    let mut asgs = vec![];
    for c in containers {
        let words: Vec<&str> = (c.command.iter().flatten())
            .chain(c.args.iter().flatten())
            .map(String::as_str)
            .collect();
        for (i, word) in words.iter().enumerate() {
            let spec = match word.strip_prefix("--nodes=") {
                Some(spec) => Some(spec),
                None if *word == "--nodes" => words.get(i + 1).copied(),
                None => None,
            };
            if let Some(name) = spec.and_then(|s| s.splitn(3, ':').nth(2)) {
                asgs.push(name.to_string());
            }
        }
    }
    asgs.sort();
    asgs.dedup();
    asgs
}

/// Pure: one sentence per group ASG a running autoscaler names: what it
/// does and what to do.
pub fn competing(asg_names: &[String], autoscalers: &[Autoscaler]) -> Vec<String> {
    let mut found = vec![];
    for a in autoscalers {
        let named: Vec<&str> = (a.asgs.iter())
            .filter(|asg| asg_names.contains(asg))
            .map(String::as_str)
            .collect();
        if named.is_empty() {
            continue;
        }
        found.push(format!(
            "{CLUSTER_AUTOSCALER} (Deployment {}) scales {} (--nodes): it sets the desired counts the replenisher sets, and the two undo each other's; leave these ASGs to one of them (kops: spec.autoscale: false on their instance groups, then kops update cluster --yes; or spec.clusterAutoscaler.enabled: false)",
            a.deployment,
            named.join(", ")
        ));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kops's addon as kops writes it: the flags in the container's
    /// command, one `--nodes` per node instance group, `<ig>.<cluster>`
    /// (kops's upup/models/cloudup/resources/addons/
    /// cluster-autoscaler.addons.k8s.io/k8s-1.15.yaml.template and
    /// upup/pkg/fi/cloudup/template_functions.go
    /// GetClusterAutoscalerNodeGroups, read at 268927e2).
    fn kops_addon(replicas: Option<i32>, nodes: &[&str]) -> Deployment {
        let mut command = vec![
            "./cluster-autoscaler".to_string(),
            "--cloud-provider=aws".to_string(),
        ];
        command.extend(nodes.iter().map(|n| format!("--nodes={n}")));
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cluster-autoscaler", "namespace": "kube-system",
                         "labels": {"app.kubernetes.io/name": "cluster-autoscaler",
                                    "k8s-app": "cluster-autoscaler"}},
            "spec": {"replicas": replicas, "selector": {},
                     "template": {"spec": {"containers": [
                         {"name": "cluster-autoscaler", "command": command}]}}},
        }))
        .expect("deployment")
    }

    #[test]
    fn kops_addons_nodes_flags_name_the_asgs_it_scales() {
        let d = kops_addon(Some(1), &["2:6:nodes-a.example.com", "0:3:gpu.example.com"]);
        assert_eq!(
            running(&[d.clone(), d]),
            vec![Autoscaler {
                deployment: "kube-system/cluster-autoscaler".into(),
                asgs: vec!["gpu.example.com".into(), "nodes-a.example.com".into()],
            }],
            "found by both labels: once"
        );
        // Scaled to 0: it scales nothing.
        assert!(running(&[kops_addon(Some(0), &["2:6:nodes-a.example.com"])]).is_empty());
    }

    #[test]
    fn the_flag_as_two_words_in_the_arguments_names_its_asg_too() {
        let mut d = kops_addon(None, &[]);
        if let Some(c) = d
            .spec
            .as_mut()
            .and_then(|s| s.template.spec.as_mut())
            .and_then(|p| p.containers.first_mut())
        {
            c.args = Some(vec!["--nodes".into(), "1:4:nodes-c.example.com".into()]);
        }
        assert_eq!(named_asgs(&d), vec!["nodes-c.example.com".to_string()]);
    }

    #[test]
    fn an_autoscaler_naming_the_groups_asgs_competes_and_says_what_to_do() {
        let names = vec![
            "nodes-a.example.com".to_string(),
            "nodes-b.example.com".into(),
        ];
        let found = running(&[kops_addon(
            Some(1),
            &["2:6:nodes-a.example.com", "0:3:gpu.example.com"],
        )]);
        let said = competing(&names, &found);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].contains("kube-system/cluster-autoscaler"),
            "{}",
            said[0]
        );
        assert!(
            said[0].contains("scales nodes-a.example.com (--nodes)"),
            "{}",
            said[0]
        );
        assert!(!said[0].contains("gpu"), "another group's ASG: {}", said[0]);
        assert!(said[0].contains("spec.autoscale: false"), "{}", said[0]);
        // Naming none of the group's ASGs: nothing to say.
        assert!(competing(&["other".to_string()], &found).is_empty());
    }
}
