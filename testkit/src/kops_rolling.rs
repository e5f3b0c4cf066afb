//! What `kops rolling-update cluster --yes` does to instance groups on AWS
//! (kops's `pkg/instancegroups`), played on the emulator, with maxSurge 1
//! (its default there) or 0 (see [`KopsSurge`]). Instance groups are rolled
//! one after another (each ASG of a [`KopsGroup`] is one instance group):
//! the cluster is validated (every Node Ready, twice, kops's
//! `ValidateSuccessDuration` apart), then every node of that instance group
//! is tainted `kops.k8s.io/scheduled-for-update`; then, one instance at a
//! time, the old instance is tagged `kops.k8s.io/detached-from-asg` and
//! detached without decrement (its ASG launches the replacement), the
//! replacement is waited for (InService, its Node Ready), the old node is
//! cordoned and its pods evicted, and its instance is terminated through
//! EC2, as kops's `deleteInstance` does. Between two instance groups no
//! node carries the taint. The step the manager must never fight (issues
//! 26 and 55).

use crate::assert_eventually;
use crate::kops::KopsGroup;
use crate::world::World;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams};
use std::collections::BTreeSet;
use std::time::Duration;

/// The taint kops puts on the nodes a rolling update will replace.
pub const SCHEDULED_FOR_UPDATE_TAINT: &str = "kops.k8s.io/scheduled-for-update";
/// The tag kops puts on an instance it detached from its ASG.
pub const DETACHED_TAG: &str = "kops.k8s.io/detached-from-asg";

const WAIT: Duration = Duration::from_secs(120);
/// kops's `ValidateSuccessDuration`: two validations this far apart must
/// pass before an instance group is rolled.
pub const KOPS_VALIDATE_GAP: Duration = Duration::from_secs(10);

/// How kops makes room for each replacement (its `maxSurge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KopsSurge {
    /// maxSurge 1, kops's default on AWS: detach the old instance without
    /// decrement, so the ASG launches the replacement first.
    Detach,
    /// maxSurge 0 (and every master group): drain and terminate the old
    /// instance first; the ASG's health check replaces it.
    TerminateFirst,
}

/// What a rolling update did: (old instance, the ASG's replacement), in order.
#[derive(Debug, Clone, Default)]
pub struct RollingUpdate {
    pub replaced: Vec<(String, String)>,
}

impl World {
    /// Plays `kops rolling-update cluster --yes` on `group` (every
    /// instance, as after `kops update cluster`, or `--force`). Returns once
    /// every old instance is terminated and its Node gone.
    pub async fn kops_rolling_update(&self, group: &KopsGroup, surge: KopsSurge) -> RollingUpdate {
        let mut update = RollingUpdate::default();
        for asg in &group.asgs {
            self.kops_validate(group).await;
            tokio::time::sleep(KOPS_VALIDATE_GAP).await;
            self.kops_validate(group).await;
            let old = self.asg_instances(asg).await;
            for id in &old {
                self.taint_for_update(id).await;
            }
            for id in &old {
                let replacement = match surge {
                    KopsSurge::Detach => self.kops_replace(asg, id).await,
                    KopsSurge::TerminateFirst => self.kops_terminate_first(asg, id).await,
                };
                update.replaced.push((id.clone(), replacement));
            }
        }
        update
    }

    /// `kops validate cluster`, as far as the kit has it: every Node of the
    /// group's ASGs' instances Ready.
    async fn kops_validate(&self, group: &KopsGroup) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        assert_eventually("kops validates the cluster", WAIT, || async {
            for asg in &group.asgs {
                for id in self.asg_instances(asg).await {
                    let node = nodes.get_opt(&id).await.ok()??;
                    if !spot_node_manager::k8s::node::is_ready(&node) {
                        return None;
                    }
                }
            }
            Some(())
        })
        .await
    }

    /// One old instance of `asg`: detach, wait for the replacement, drain,
    /// terminate. Returns the replacement's id.
    async fn kops_replace(&self, asg: &str, id: &str) -> String {
        let before: BTreeSet<String> = self.asg_instances(asg).await.into_iter().collect();
        self.aws
            .ec2
            .create_tags()
            .resources(id)
            .tags(
                aws_sdk_ec2::types::Tag::builder()
                    .key(DETACHED_TAG)
                    .value("true")
                    .build(),
            )
            .send()
            .await
            .expect("tag the instance detached");
        self.aws
            .autoscaling
            .detach_instances()
            .auto_scaling_group_name(asg)
            .instance_ids(id)
            .should_decrement_desired_capacity(false)
            .send()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "detach {id} from {asg}: {}",
                    aws_sdk_autoscaling::error::DisplayErrorContext(&e)
                )
            });
        let replacement = self.kops_replacement(asg, &before).await;
        self.kops_drain(id).await;
        self.lose_instance(id).await;
        let nodes: Api<Node> = Api::all(self.client.clone());
        assert_eventually(&format!("the Node of {id} gone"), WAIT, || async {
            nodes.get_opt(id).await.ok()?.is_none().then_some(())
        })
        .await;
        replacement
    }

    /// One old instance of `asg` with no surge: drain, terminate through
    /// EC2, wait for the ASG to replace it. Returns the replacement's id.
    async fn kops_terminate_first(&self, asg: &str, id: &str) -> String {
        let before: BTreeSet<String> = self.asg_instances(asg).await.into_iter().collect();
        self.kops_drain(id).await;
        self.lose_instance(id).await;
        self.kops_replacement(asg, &before).await
    }

    /// The ASG's new InService instance (not in `before`) once its Node is Ready.
    async fn kops_replacement(&self, asg: &str, before: &BTreeSet<String>) -> String {
        let nodes: Api<Node> = Api::all(self.client.clone());
        assert_eventually(
            &format!("{asg} launches a replacement and its Node is Ready"),
            WAIT,
            || async {
                let members = self.asg_members(asg).await;
                let new = members
                    .iter()
                    .find(|(i, state)| !before.contains(i) && state == "InService")?;
                let node = nodes.get_opt(&new.0).await.ok()??;
                spot_node_manager::k8s::node::is_ready(&node).then(|| new.0.clone())
            },
        )
        .await
    }

    async fn taint_for_update(&self, node: &str) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let Some(current) = nodes.get_opt(node).await.expect("get node") else {
            return;
        };
        let mut taints = current.spec.and_then(|s| s.taints).unwrap_or_default();
        taints.push(k8s_openapi::api::core::v1::Taint {
            key: SCHEDULED_FOR_UPDATE_TAINT.into(),
            effect: "PreferNoSchedule".into(),
            ..Default::default()
        });
        let patch = serde_json::json!({"spec": {"taints": taints}});
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("taint the node");
    }

    /// Cordons `node` and evicts its pods (as `kubectl drain` does; kops
    /// waits for them to go, here the simulated kubelet lets them go).
    async fn kops_drain(&self, node: &str) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let cordon = serde_json::json!({"spec": {"unschedulable": true}});
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&cordon))
            .await
            .expect("cordon");
        let all: Api<Pod> = Api::all(self.client.clone());
        let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
        for pod in all.list(&on_node).await.expect("list pods").items {
            let (Some(ns), Some(name)) = (pod.metadata.namespace, pod.metadata.name) else {
                continue;
            };
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            // A refused eviction (a budget) is tried again, as kops does.
            assert_eventually(&format!("{ns}/{name} evicted"), WAIT, || async {
                match api.evict(&name, &EvictParams::default()).await {
                    Ok(_) => Some(()),
                    Err(kube::Error::Api(e)) if e.code == 404 => Some(()),
                    Err(_) => None,
                }
            })
            .await;
        }
    }
}
