//! An instance group kops hands to Karpenter: with `spec.manager:
//! Karpenter` on a node instance group (and `spec.karpenter.enabled` on the
//! cluster), kops makes no Auto Scaling Group for it, only a Karpenter
//! `NodePool` (`karpenter.sh/v1`, cluster-scoped) named after the instance
//! group, whose nodes Karpenter launches, consolidates and replaces itself.
//! A NodeGroup naming that instance group's ASG (`<ig>.<cluster>`, as kops
//! names ASGs) finds none, and its nodes are Karpenter's: it competes, and
//! the group says so with what to do. Listed at most once a minute for every
//! group, as another termination handler is (`handlers`); a cluster without
//! Karpenter's CRD has no NodePool. Nothing of it is changed.

use super::handlers::Listed;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use std::sync::Arc;

/// Karpenter's NodePool, as kops writes it.
const GROUP: &str = "karpenter.sh";
const VERSION: &str = "v1";
const KIND: &str = "NodePool";

/// The NodePools' names; None while they cannot be listed (the group's
/// condition then says nothing of them).
pub async fn node_pools(
    seen: &Listed<Vec<String>>,
    client: &kube::Client,
) -> Option<Arc<Vec<String>>> {
    let what = "Karpenter NodePools (RBAC: list on karpenter.sh nodepools)";
    seen.get(list(client), what).await
}

/// Listed now, without the cache (`check`).
pub async fn list(client: &kube::Client) -> Result<Vec<String>, kube::Error> {
    let gvk = GroupVersionKind::gvk(GROUP, VERSION, KIND);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk));
    match api.list(&ListParams::default()).await {
        Ok(pools) => {
            let mut names: Vec<String> = pools.items.iter().map(|p| p.name_any()).collect();
            names.sort();
            Ok(names)
        }
        // Karpenter's CRD is not installed: no NodePool.
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(vec![]),
        Err(e) => Err(e),
    }
}

/// Pure: one sentence per group ASG named after an instance group a
/// NodePool manages (`<ig>.<cluster>` against NodePool `<ig>`), with what
/// to do. An ASG that exists is kops's own and left out (`existing`): kops
/// makes none for a Karpenter instance group.
pub fn competing(asg_names: &[String], existing: &[String], pools: &[String]) -> Vec<String> {
    let mut found = vec![];
    for asg in asg_names.iter().filter(|a| !existing.contains(a)) {
        let Some((ig, _cluster)) = asg.split_once('.') else {
            continue;
        };
        if !pools.iter().any(|p| p == ig) {
            continue;
        }
        found.push(format!(
            "Karpenter NodePool {ig} manages instance group {ig} (kops spec.manager: Karpenter): kops makes no ASG {asg} for it, and Karpenter launches, consolidates and replaces its nodes; leave {ig} to Karpenter and take {asg} out of this NodeGroup, or set spec.manager: CloudGroup on the instance group, then kops update cluster --yes, to have kops make the ASG"
        ));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kops names a node instance group's ASG `<ig>.<cluster>`
    /// (pkg/model/names.go AutoscalingGroupName) and makes none for a
    /// Karpenter one (pkg/model/awsmodel/autoscalinggroup.go: the launch
    /// template and ASG tasks only when `spec.manager` is not Karpenter);
    /// its NodePool is `karpenter.sh/v1`, named after the instance group
    /// (upup/pkg/fi/cloudup/template_functions_karpenter.go
    /// buildKarpenterNodePool). Read at kops 268927e2.
    #[test]
    fn an_asg_named_after_a_karpenter_instance_group_competes_and_says_what_to_do() {
        let names = vec![
            "nodes-a.example.com".to_string(),
            "gpu.example.com".to_string(),
        ];
        let existing = vec!["nodes-a.example.com".to_string()];
        let pools = vec!["gpu".to_string(), "other".to_string()];
        let said = competing(&names, &existing, &pools);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(said[0].starts_with("Karpenter NodePool gpu manages instance group gpu"));
        assert!(said[0].contains("no ASG gpu.example.com"), "{}", said[0]);
        assert!(said[0].contains("spec.manager: CloudGroup"), "{}", said[0]);
    }

    #[test]
    fn an_existing_asg_or_a_pool_of_another_name_is_no_competition() {
        let names = vec!["nodes-a.example.com".to_string()];
        // The ASG exists: kops's own, whatever a NodePool is called.
        let pools = vec!["nodes-a".to_string()];
        assert!(competing(&names, &names, &pools).is_empty());
        // Missing, but no NodePool of its instance group: only not found.
        assert!(competing(&names, &[], &["gpu".to_string()]).is_empty());
        // A name without a cluster part is no kops name.
        assert!(competing(&["gpu".to_string()], &[], &["gpu".to_string()]).is_empty());
    }
}
