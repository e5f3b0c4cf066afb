//! ASG settings that make AWS, or another controller, replace or remove
//! instances the manager manages, without its drain or its rules: the
//! `CompetingAsgSettings` condition. Read from the descriptions the
//! inventory makes anyway, and each ASG's warm pool described at most once
//! an hour (`hourly`); the manager changes none of them: each is the
//! user's to turn off, and the condition says how.

use crate::cloud::{AsgDescription, WarmPool};
use crate::crd::condition::{COMPETING_ASG_SETTINGS, ConditionStatus, set_condition};
use crate::crd::{NodeGroup, NodeGroupStatus};
use chrono::{DateTime, Utc};

/// The scaling process that rebalances a multi-zone ASG by itself.
pub const AZ_REBALANCE: &str = "AZRebalance";

/// The tag cluster-autoscaler's auto-discovery finds an ASG by.
pub const CLUSTER_AUTOSCALER_TAG: &str = "k8s.io/cluster-autoscaler/enabled";

/// Pure: one sentence per competing setting of the group's ASGs (and their
/// warm pools, by ASG): what it does to the group and what to do.
pub fn competing(
    group: &NodeGroup,
    asgs: &[AsgDescription],
    warm_pools: &[(String, WarmPool)],
) -> Vec<String> {
    let names = group.spec.asg_names();
    let mut found = vec![];
    for asg in asgs.iter().filter(|a| names.contains(&a.name)) {
        let name = &asg.name;
        if asg.capacity_rebalance {
            found.push(format!(
                "{name} has Capacity Rebalancing on: on a rebalance recommendation AWS launches a replacement and terminates the instance without a drain; turn it off (kops: spec.capacityRebalance: false) and set interruption.onRebalanceRecommendation: Replace for the same with a drain"
            ));
        }
        if let Some(seconds) = asg.max_instance_lifetime {
            let days = f64::from(seconds) / 86_400.0;
            found.push(format!(
                "{name} has a maximum instance lifetime of {days:.1} day(s): AWS replaces older instances without a drain; remove it (kops: spec.maxInstanceLifetime) and set refresh.maxNodeAge for the same with a drain"
            ));
        }
        if asg.tags.contains_key(CLUSTER_AUTOSCALER_TAG) {
            found.push(format!(
                "{name} carries {CLUSTER_AUTOSCALER_TAG}: a cluster-autoscaler with auto-discovery scales it too, and the two undo each other's counts; remove the tag, or leave the group to cluster-autoscaler"
            ));
        }
        if asg.zones.len() > 1 && !asg.is_suspended(AZ_REBALANCE) {
            found.push(format!(
                "{name} spans {} zones ({}) with AZRebalance not suspended: when its zones fall out of balance AWS launches in one and terminates in another, without a drain; suspend AZRebalance (kops: suspendProcesses: [AZRebalance]), or give each zone its own ASG as kops does",
                asg.zones.len(),
                asg.zones.join(", ")
            ));
        }
        for (_, pool) in warm_pools.iter().filter(|(a, _)| a == name) {
            found.push(format!(
                "{name} has a warm pool ({} instance(s) {}, at least {}): a scale-out takes a warm instance launched from the template of its day, so a refresh's or a drift roll's replacement may come up on the old template and drift again, and a warm instance joins with its old boot; remove it (aws autoscaling delete-warm-pool --auto-scaling-group-name {name}; kops: remove spec.warmPool from the instance group), a surplus node does the same with the current template",
                pool.instances,
                pool.state.to_lowercase(),
                pool.min_size
            ));
        }
    }
    found
}

/// Other controllers in the cluster that may compete for a group's ASGs.
#[derive(Default)]
pub struct Others<'a> {
    /// The cluster-autoscalers running.
    pub autoscalers: &'a [super::autoscalers::Autoscaler],
    /// Karpenter's NodePools.
    pub node_pools: &'a [String],
}

/// Pure: one sentence per competing setting of the group's ASGs (and
/// their warm pools) and per other controller found (`others`) that
/// competes for them: what the condition says, and `check` prints.
pub fn all_competing(
    group: &NodeGroup,
    (asgs, warm_pools): (&[AsgDescription], &[(String, WarmPool)]),
    others: Others<'_>,
) -> Vec<String> {
    let mut found = competing(group, asgs, warm_pools);
    let names = group.spec.asg_names();
    found.extend(super::autoscalers::competing(&names, others.autoscalers));
    let existing: Vec<String> = asgs.iter().map(|a| a.name.clone()).collect();
    found.extend(super::karpenter::competing(
        &names,
        &existing,
        others.node_pools,
    ));
    found
}

/// Sets the condition on `status` from `asgs`, their warm pools, and the
/// other controllers found (`others`).
pub fn set_competing(
    group: &NodeGroup,
    described: (&[AsgDescription], &[(String, WarmPool)]),
    others: Others<'_>,
    status: &mut NodeGroupStatus,
    now: DateTime<Utc>,
) {
    let found = all_competing(group, described, others);
    let (value, reason, message) = match found.is_empty() {
        true => (
            ConditionStatus::False,
            "None",
            "no ASG setting, cluster-autoscaler or Karpenter NodePool replaces, removes or rescales instances behind the manager".to_string(),
        ),
        false => (ConditionStatus::True, "SettingsCompete", found.join("; ")),
    };
    set_condition(
        &mut status.conditions,
        COMPETING_ASG_SETTINGS,
        value,
        reason,
        message,
        group.metadata.generation,
        now,
    );
}

/// The warm pools of the group's ASGs that exist (`asgs`, as described:
/// an ASG that does not exist has no warm pool to ask about, and the
/// inventory reports it already), described at most an hour ago (none
/// while one cannot be described: the condition then says nothing of them).
pub async fn warm_pools(
    described: &super::hourly::Hourly<Option<crate::cloud::WarmPool>>,
    cloud: &dyn crate::cloud::Cloud,
    asgs: &[String],
) -> Vec<(String, crate::cloud::WarmPool)> {
    let what = "warm pools (IAM: autoscaling:DescribeWarmPool)";
    let found = described
        .get(asgs, what, |asg| async move { cloud.warm_pool(&asg).await })
        .await
        .unwrap_or_default();
    found
        .into_iter()
        .filter_map(|(asg, pool)| Some((asg, pool.as_ref().clone()?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::group_view::tests::fresh;

    fn group() -> NodeGroup {
        let spec = serde_json::from_value(serde_json::json!(
            {"role": "Worker", "autoScalingGroups": [{"name": "a"}, {"name": "b"}], "desired": 2}
        ))
        .expect("spec");
        NodeGroup::new("workers", spec)
    }

    #[test]
    fn each_competing_setting_is_named_with_its_asg_and_what_to_do() {
        let mut a = fresh("a", &[]);
        a.capacity_rebalance = true;
        a.max_instance_lifetime = Some(7 * 86_400);
        let mut b = fresh("b", &[]);
        b.tags.insert(CLUSTER_AUTOSCALER_TAG.into(), "true".into());
        // A multi-zone ASG rebalancing by itself; suspended, it is quiet.
        b.zones = vec!["eu-west-1a".into(), "eu-west-1b".into()];
        // Another group's ASG is not this group's concern.
        let mut other = fresh("other", &[]);
        other.capacity_rebalance = true;
        let pool = WarmPool {
            min_size: 1,
            max_prepared: None,
            state: "Stopped".into(),
            instances: 2,
        };
        let pools = [("b".to_string(), pool.clone()), ("other".to_string(), pool)];
        let found = competing(&group(), &[a, b, other], &pools);
        assert_eq!(found.len(), 5, "{found:?}");
        assert!(
            found[0].starts_with("a has Capacity Rebalancing on"),
            "{}",
            found[0]
        );
        assert!(
            found[0].contains("capacityRebalance: false"),
            "{}",
            found[0]
        );
        assert!(
            found[1].contains("7.0 day(s)") && found[1].contains("maxNodeAge"),
            "{}",
            found[1]
        );
        assert!(
            found[2].starts_with("b carries k8s.io/cluster-autoscaler/enabled"),
            "{}",
            found[2]
        );
        assert!(
            found[3].starts_with(
                "b spans 2 zones (eu-west-1a, eu-west-1b) with AZRebalance not suspended"
            ),
            "{}",
            found[3]
        );
        assert!(
            found[4].starts_with("b has a warm pool (2 instance(s) stopped, at least 1)")
                && found[4].contains("delete-warm-pool --auto-scaling-group-name b"),
            "{}",
            found[4]
        );
        let mut status = NodeGroupStatus::default();
        let others = Others::default();
        set_competing(
            &group(),
            (&[], &[]),
            others,
            &mut status,
            chrono::Utc::now(),
        );
        let c = crate::crd::condition::find(&status.conditions, COMPETING_ASG_SETTINGS)
            .expect("condition");
        assert_eq!(c.status, ConditionStatus::False);
    }

    #[test]
    fn kops_s_own_tags_and_a_plain_asg_compete_with_nothing() {
        let mut a = fresh("a", &[]);
        a.tags.insert(
            "k8s.io/cluster-autoscaler/node-template/label/kops.k8s.io/instancegroup".into(),
            "nodes-a".into(),
        );
        a.suspended_processes = vec!["AZRebalance".into()];
        // Several zones with AZRebalance suspended; one zone, not suspended.
        a.zones = vec!["eu-west-1a".into(), "eu-west-1b".into()];
        let mut b = fresh("b", &[]);
        b.zones = vec!["eu-west-1a".into()];
        assert_eq!(competing(&group(), &[a, b], &[]), Vec::<String>::new());
    }
}
