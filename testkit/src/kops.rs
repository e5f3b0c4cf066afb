//! kops-like Auto Scaling Groups in a world's moto account, and what tests
//! do to them (lose an instance, set timings, read activities).

use crate::assert_eventually;
use crate::world::World;
use aws_sdk_autoscaling::types::{
    InstancesDistribution, LaunchTemplate, LaunchTemplateOverrides, LaunchTemplateSpecification,
    MixedInstancesPolicy,
};
use std::time::Duration;

/// A kops-like set of ASGs in this world's moto account.
/// See [`World::joined_and_never_joining`].
pub struct NeverJoining {
    pub joined_asg: String,
    /// The kops instance group of the joined ASG.
    pub joined_instance_group: String,
    pub late_asg: String,
    /// The late ASG's instance, which never joins.
    pub first: String,
    /// Both ASGs.
    pub asgs: Vec<String>,
}

pub struct KopsGroup {
    /// ASG names, one per zone.
    pub asgs: Vec<String>,
    /// The kops instance-group name of each ASG (unique per test).
    pub instance_groups: Vec<String>,
    pub zones: Vec<String>,
}

pub const ZONES: [&str; 3] = ["ap-northeast-1a", "ap-northeast-1c", "ap-northeast-1d"];
/// The region every world's AWS is in.
pub const REGION: &str = "ap-northeast-1";

impl World {
    /// Sets each of `asgs`' MaxSize to `max` (kops's control-plane groups
    /// have min = max = 1; so do many worker groups).
    pub async fn set_max(&self, asgs: &[String], max: i32) {
        for asg in asgs {
            self.aws
                .autoscaling
                .update_auto_scaling_group()
                .auto_scaling_group_name(asg)
                .max_size(max)
                .send()
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "set {asg}'s max to {max}: {}",
                        aws_sdk_autoscaling::error::DisplayErrorContext(&e)
                    )
                });
        }
    }

    /// A prefix unique to this world, for names shared cluster-wide (Nodes
    /// and kops instance-group labels live outside the test's namespace).
    pub fn prefix(&self) -> String {
        format!("w{}", self.account)
    }

    /// The emulator's default subnet in `zone` (one per zone, as in a
    /// default VPC).
    pub async fn default_subnet(&self, zone: &str) -> String {
        let subnets = self
            .aws
            .ec2
            .describe_subnets()
            .filters(
                aws_sdk_ec2::types::Filter::builder()
                    .name("default-for-az")
                    .values("true")
                    .build(),
            )
            .send()
            .await
            .expect("describe subnets");
        subnets
            .subnets()
            .iter()
            .find(|s| s.availability_zone() == Some(zone))
            .and_then(|s| s.subnet_id())
            .unwrap_or_else(|| panic!("no default subnet in {zone}"))
            .to_string()
    }

    /// Creates one ASG per zone for `role` ("nodes" or "master"; named as
    /// kops 1.26 and later name them), each with
    /// `per_asg` instances, a launch template and a spot MixedInstancesPolicy,
    /// tagged like kops does, sitting at its min as kops groups do (min =
    /// desired, max 20, or twice min when that is more). `extra_tags` go on every ASG. Returns once the
    /// emulator has launched them all (InService).
    pub async fn kops_group(
        &self,
        role: &str,
        zones: &[&str],
        per_asg: i32,
        extra_tags: &[(&str, &str)],
    ) -> KopsGroup {
        use aws_sdk_autoscaling::types::Tag;
        let prefix = self.prefix();
        let mut group = KopsGroup {
            asgs: vec![],
            instance_groups: vec![],
            zones: zones.iter().map(|z| z.to_string()).collect(),
        };
        for zone in zones {
            // kops's names (1.26 and later): `control-plane-<zone>` groups
            // whose ASGs are `<group>.masters.<cluster>`, `<group>.<cluster>`
            // for the others.
            let (instance_group, name) = match role {
                "master" => {
                    let group = format!("{prefix}-control-plane-{zone}");
                    let name = format!("{group}.masters.example.com");
                    (group, name)
                }
                _ => {
                    let group = format!("{prefix}-{role}-{zone}");
                    let name = format!("{group}.example.com");
                    (group, name)
                }
            };
            // kops: one launch template per instance group, named as its ASG.
            let template = name.clone();
            self.aws
                .ec2
                .create_launch_template()
                .launch_template_name(&template)
                .launch_template_data(
                    aws_sdk_ec2::types::RequestLaunchTemplateData::builder()
                        .image_id("ami-12c6146b")
                        .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
                        .build(),
                )
                .send()
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "create launch template {template}: {}",
                        aws_sdk_ec2::error::DisplayErrorContext(&e)
                    )
                });
            let role_tag = if role == "master" {
                "k8s.io/role/master"
            } else {
                "k8s.io/role/node"
            };
            let mut tags = vec![
                ("KubernetesCluster", "example.com".to_string()),
                ("kops.k8s.io/instancegroup", instance_group.clone()),
                (role_tag, "1".to_string()),
            ];
            tags.extend(extra_tags.iter().map(|(k, v)| (*k, v.to_string())));
            let create = self
                .aws
                .autoscaling
                .create_auto_scaling_group()
                .auto_scaling_group_name(&name)
                .min_size(per_asg)
                // Room above min for a shortage's headroom and a refresh's
                // surplus, however large the group (benchmarks go to 100).
                .max_size(20.max(per_asg * 2))
                .desired_capacity(per_asg)
                .vpc_zone_identifier(self.default_subnet(zone).await);
            // An on-demand kops instance group (role `ondemand...`) names its
            // launch template alone: its instances run on demand. The others
            // are kops's spot groups (a MixedInstancesPolicy).
            let create = match role.starts_with("ondemand") {
                true => create.launch_template(
                    LaunchTemplateSpecification::builder()
                        .launch_template_name(&template)
                        .version("$Latest")
                        .build(),
                ),
                false => create.mixed_instances_policy(kops_policy(&template, "$Latest")),
            };
            create
                .set_tags(Some(
                    tags.iter()
                        .map(|(k, v)| {
                            Tag::builder()
                                .key(*k)
                                .value(v)
                                .resource_id(&name)
                                .resource_type("auto-scaling-group")
                                .propagate_at_launch(true)
                                .build()
                        })
                        .collect(),
                ))
                .send()
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "create ASG {name}: {}",
                        aws_sdk_autoscaling::error::DisplayErrorContext(&e)
                    )
                });
            group.asgs.push(name);
            group.instance_groups.push(instance_group);
        }
        for asg in &group.asgs {
            self.wait_in_service(asg, per_asg as usize).await;
        }
        group
    }

    /// What `kops update cluster --yes` does to a group after a change (a
    /// new image, Kubernetes version, instance type or user data): a new
    /// version of each instance group's launch template, which the ASGs
    /// (at `$Latest`, as kops sets them) launch from now on. Running
    /// instances stay on the version they were launched from. Returns the
    /// new version numbers.
    pub async fn kops_update_cluster(&self, group: &KopsGroup) -> Vec<i64> {
        let mut versions = vec![];
        for template in &group.asgs {
            let out = self
                .aws
                .ec2
                .create_launch_template_version()
                .launch_template_name(template)
                .source_version("$Latest")
                .launch_template_data(
                    aws_sdk_ec2::types::RequestLaunchTemplateData::builder()
                        .image_id("ami-0f7e8d2b")
                        .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
                        .build(),
                )
                .send()
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "new version of {template}: {}",
                        aws_sdk_ec2::error::DisplayErrorContext(&e)
                    )
                });
            let number = out
                .launch_template_version()
                .and_then(|v| v.version_number())
                .unwrap_or_else(|| panic!("no version number for {template}"));
            versions.push(number);
        }
        versions
    }

    /// A rollback: every ASG of `group` launches `version` of its template
    /// from now on (pinned, as `aws autoscaling update-auto-scaling-group`
    /// does), so the instances launched from it are current again.
    pub async fn pin_template_version(&self, group: &KopsGroup, version: i64) {
        for asg in &group.asgs {
            self.aws
                .autoscaling
                .update_auto_scaling_group()
                .auto_scaling_group_name(asg)
                .mixed_instances_policy(kops_policy(asg, &version.to_string()))
                .send()
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "pin {asg} to version {version}: {}",
                        aws_sdk_autoscaling::error::DisplayErrorContext(&e)
                    )
                });
        }
    }

    /// Two kops ASGs at their min (as kops groups are): `nodes`, one
    /// instance that joins, and `late`, one instance that never joins (a
    /// removal there cannot decrement, so the ASG launches a fresh instance,
    /// which never joins either).
    pub async fn joined_and_never_joining(&self) -> NeverJoining {
        let joined = self.kops_group("nodes", &ZONES[..1], 1, &[]).await;
        let late = self
            .kops_group(
                "late",
                &ZONES[1..2],
                1,
                &[(crate::sim::NEVER_JOIN_TAG, "true")],
            )
            .await;
        let late_asg = late.asgs[0].clone();
        let first = self.asg_instances(&late_asg).await.remove(0);
        let mut asgs = joined.asgs.clone();
        asgs.extend(late.asgs.clone());
        NeverJoining {
            joined_asg: joined.asgs[0].clone(),
            joined_instance_group: joined.instance_groups[0].clone(),
            late_asg,
            first,
            asgs,
        }
    }

    /// Waits until `asg` has exactly `count` instances, all InService, and
    /// returns their ids (the emulator launches after a lag, Pending first).
    pub async fn wait_in_service(&self, asg: &str, count: usize) -> Vec<String> {
        assert_eventually(
            &format!("{count} InService instance(s) in {asg}"),
            Duration::from_secs(60),
            || async {
                let out = self
                    .aws
                    .autoscaling
                    .describe_auto_scaling_groups()
                    .auto_scaling_group_names(asg)
                    .send()
                    .await
                    .ok()?;
                let g = out.auto_scaling_groups().first()?.clone();
                let states: Vec<(String, String)> = g
                    .instances()
                    .iter()
                    .map(|i| {
                        (
                            i.instance_id().unwrap_or_default().to_string(),
                            i.lifecycle_state()
                                .map(|s| s.as_str().to_string())
                                .unwrap_or_default(),
                        )
                    })
                    .collect();
                (states.len() == count && states.iter().all(|(_, s)| s == "InService"))
                    .then(|| states.into_iter().map(|(id, _)| id).collect())
            },
        )
        .await
    }

    /// Sets an ASG's min size (and nothing else).
    pub async fn set_min(&self, asg: &str, min: i32) {
        self.aws
            .autoscaling
            .update_auto_scaling_group()
            .auto_scaling_group_name(asg)
            .min_size(min)
            .send()
            .await
            .expect("set min size");
    }

    /// Suspends (`on` false) or resumes (`on` true) an ASG's scaling
    /// `process` (Launch, Terminate, AZRebalance, …).
    pub async fn scaling_process(&self, asg: &str, process: &str, on: bool) {
        let api = &self.aws.autoscaling;
        // The two calls differ in name only.
        macro_rules! call {
            ($op:ident) => {
                api.$op()
                    .auto_scaling_group_name(asg)
                    .scaling_processes(process)
                    .send()
                    .await
                    .err()
                    .map(|e| format!("{e:?}"))
            };
        }
        let failed = match on {
            true => call!(resume_processes),
            false => call!(suspend_processes),
        };
        if let Some(e) = failed {
            panic!("{process} of {asg} (resume: {on}): {e}");
        }
    }

    /// Sets one of the emulator's timings for an ASG, in seconds (tags
    /// `snm.test/launch-lag`, `pending-time`, `health-check-delay`,
    /// `capacity-retry`, `terminating-time`; see scripts/moto_server.py).
    pub async fn set_timing(&self, asg: &str, timing: &str, seconds: f64) {
        self.tag_asg(asg, &format!("snm.test/{timing}"), &seconds.to_string())
            .await;
    }

    /// Terminates an instance through EC2, as a spot interruption does: its
    /// ASG notices through its health check and replaces it.
    pub async fn lose_instance(&self, instance_id: &str) {
        self.aws
            .ec2
            .terminate_instances()
            .instance_ids(instance_id)
            .send()
            .await
            .expect("terminate instance through EC2");
    }

    /// [`World::lose_instance`], then waits until the simulated kubelet has
    /// deleted its Node (named for the instance).
    pub async fn lose_instance_and_its_node(&self, instance_id: &str) {
        self.lose_instance(instance_id).await;
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> =
            kube::Api::all(self.client.clone());
        assert_eventually(
            "the lost node is gone",
            Duration::from_secs(120),
            || async {
                nodes
                    .get_opt(instance_id)
                    .await
                    .ok()?
                    .is_none()
                    .then_some(())
            },
        )
        .await;
    }

    /// The ASG's scaling activities, newest first: (status, description).
    pub async fn activities(&self, asg: &str) -> Vec<(String, String)> {
        self.aws
            .autoscaling
            .describe_scaling_activities()
            .auto_scaling_group_name(asg)
            .send()
            .await
            .expect("describe scaling activities")
            .activities()
            .iter()
            .map(|a| {
                (
                    a.status_code()
                        .map(|c| c.as_str().to_string())
                        .unwrap_or_default(),
                    a.description().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    /// How many instances AWS began terminating in `asgs`.
    pub async fn terminations_in(&self, asgs: &[String]) -> usize {
        self.terminations(asgs, "").await
    }

    /// How many times AWS began terminating `instance` in any of `asgs`
    /// (its "Terminating EC2 instance" scaling activities).
    pub async fn terminations(&self, asgs: &[String], instance: &str) -> usize {
        let mut n = 0;
        for asg in asgs {
            n += self
                .activities(asg)
                .await
                .iter()
                .filter(|(_, d)| d.starts_with("Terminating EC2 instance") && d.contains(instance))
                .count();
        }
        n
    }

    /// When AWS first began terminating `instance` in any of `asgs` (the
    /// start of its "Terminating EC2 instance" scaling activity).
    pub async fn termination_started(
        &self,
        asgs: &[String],
        instance: &str,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        let mut first = None;
        for asg in asgs {
            let out = self
                .aws
                .autoscaling
                .describe_scaling_activities()
                .auto_scaling_group_name(asg)
                .send()
                .await
                .expect("describe scaling activities");
            for a in out.activities() {
                let description = a.description().unwrap_or_default();
                if !(description.starts_with("Terminating EC2 instance")
                    && description.contains(instance))
                {
                    continue;
                }
                let Some(t) = a.start_time() else { continue };
                let Some(t) = chrono::DateTime::from_timestamp(t.secs(), t.subsec_nanos()) else {
                    continue;
                };
                first = Some(first.map_or(t, |f: chrono::DateTime<chrono::Utc>| f.min(t)));
            }
        }
        first
    }

    /// Tags an ASG (the simulations read such tags: spot shortage, nodes
    /// that never join or are not Ready).
    pub async fn tag_asg(&self, asg: &str, key: &str, value: &str) {
        self.aws
            .autoscaling
            .create_or_update_tags()
            .tags(asg_tag(asg, key, value))
            .send()
            .await
            .expect("tag ASG");
    }

    pub async fn untag_asg(&self, asg: &str, key: &str, value: &str) {
        self.aws
            .autoscaling
            .delete_tags()
            .tags(asg_tag(asg, key, value))
            .send()
            .await
            .expect("untag ASG");
    }

    /// An ASG's members as moto reports them: (instance id, lifecycle state).
    pub async fn asg_members(&self, asg: &str) -> Vec<(String, String)> {
        self.aws
            .autoscaling
            .describe_auto_scaling_groups()
            .auto_scaling_group_names(asg)
            .send()
            .await
            .expect("describe ASG")
            .auto_scaling_groups()
            .first()
            .map(|g| {
                g.instances()
                    .iter()
                    .filter_map(|i| {
                        let state = i.lifecycle_state().map(|s| s.as_str().to_string());
                        Some((i.instance_id()?.to_string(), state.unwrap_or_default()))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Instance ids in an ASG, as moto reports them.
    pub async fn asg_instances(&self, asg: &str) -> Vec<String> {
        self.asg_members(asg)
            .await
            .into_iter()
            .map(|(id, _)| id)
            .collect()
    }

    /// (desired, instance ids) of every ASG, to check nothing was mutated.
    pub async fn asg_snapshot(&self, asgs: &[String]) -> Vec<(String, i32, Vec<String>)> {
        let out = self
            .aws
            .autoscaling
            .describe_auto_scaling_groups()
            .set_auto_scaling_group_names(Some(asgs.to_vec()))
            .send()
            .await
            .expect("describe ASGs");
        let mut snapshot: Vec<_> = out
            .auto_scaling_groups()
            .iter()
            .map(|g| {
                let mut ids: Vec<String> = g
                    .instances()
                    .iter()
                    .filter_map(|i| i.instance_id().map(str::to_string))
                    .collect();
                ids.sort();
                (
                    g.auto_scaling_group_name().unwrap_or_default().to_string(),
                    g.desired_capacity().unwrap_or(0),
                    ids,
                )
            })
            .collect();
        snapshot.sort();
        snapshot
    }
}

fn asg_tag(asg: &str, key: &str, value: &str) -> aws_sdk_autoscaling::types::Tag {
    aws_sdk_autoscaling::types::Tag::builder()
        .key(key)
        .value(value)
        .resource_id(asg)
        .resource_type("auto-scaling-group")
        .propagate_at_launch(false)
        .build()
}

/// Counting and refusing at AWS's side (the emulator's `/_snm/` paths).
impl World {
    /// The emulator's port (its endpoint is plain HTTP on loopback).
    fn emulator_port(&self) -> u16 {
        crate::control_plane()
            .moto_endpoint
            .rsplit(':')
            .next()
            .and_then(|p| p.trim_end_matches('/').parse().ok())
            .expect("emulator port")
    }

    /// The times (epoch seconds) of every AWS request this world's account
    /// made, as the emulator received them.
    pub async fn aws_request_times(&self) -> Vec<f64> {
        self.aws_attempts()
            .await
            .into_iter()
            .map(|(t, _, _)| t)
            .collect()
    }

    /// Every AWS request of this world's account so far: (time, the SDK's
    /// attempt number, its maximum attempts), 0 when the SDK did not say.
    pub async fn aws_attempts(&self) -> Vec<(f64, u32, u32)> {
        let path = format!("/_snm/attempts?account={}", self.account);
        let (status, body) = crate::http_get(self.emulator_port(), &path)
            .await
            .expect("the emulator answers");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).expect("a list of [time, attempt, max]")
    }

    /// (time in epoch seconds, action) of every AWS request of this world's
    /// account so far, in order (e.g. `DescribeAutoScalingGroups`).
    pub async fn aws_actions(&self) -> Vec<(f64, String)> {
        let path = format!("/_snm/actions?account={}", self.account);
        let (status, body) = crate::http_get(self.emulator_port(), &path)
            .await
            .expect("the emulator answers");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).expect("a list of [time, action]")
    }

    /// The AWS requests of this world's account so far that could change
    /// something: every action but a Describe, List, Get or Receive.
    pub async fn aws_mutations(&self) -> Vec<String> {
        let reads = ["Describe", "List", "Get", "Receive"];
        self.aws_actions()
            .await
            .into_iter()
            .map(|(_, a)| a)
            .filter(|a| !reads.iter().any(|r| a.starts_with(r)))
            .collect()
    }

    /// From now on every AWS request of this world's account waits `delay`,
    /// then is refused with `error` (`Throttling`, or `ServiceUnavailable`:
    /// both retried by the SDK, the first also slowing its request rate).
    pub async fn refuse_aws(&self, error: &str, delay: std::time::Duration) {
        let path = format!(
            "/_snm/refuse?account={}&delay={}&error={error}",
            self.account,
            delay.as_secs_f64()
        );
        let answered = crate::http_get(self.emulator_port(), &path).await;
        assert!(matches!(answered, Some((200, _))), "{answered:?}");
    }

    /// From now on a share `fraction` of the manager's AWS requests in this
    /// world (drawn at random, seeded by the account; told by the app name
    /// in their user agent, so the simulated kubelet's go through, as a
    /// real kubelet's do not reach the Auto Scaling API) is refused with
    /// `error`; 0 ends it.
    pub async fn refuse_aws_share(&self, error: &str, fraction: f64) {
        let path = format!(
            "/_snm/refuse?account={}&error={error}&fraction={fraction}&agent=spot-node-manager",
            self.account
        );
        let answered = crate::http_get(self.emulator_port(), &path).await;
        assert!(matches!(answered, Some((200, _))), "{answered:?}");
    }

    /// From now on the emulator refuses `action` (e.g.
    /// `DescribeLaunchTemplates`) to this world's account, as IAM does for a
    /// policy that lacks it.
    pub async fn deny_aws_action(&self, action: &str) {
        let path = format!("/_snm/deny?account={}&action={action}", self.account);
        let answered = crate::http_get(self.emulator_port(), &path).await;
        assert!(matches!(answered, Some((200, _))), "{answered:?}");
    }

    /// From now on the emulator answers `action` again (a policy granted
    /// what it lacked).
    pub async fn allow_aws_action(&self, action: &str) {
        let path = format!("/_snm/allow?account={}&action={action}", self.account);
        let answered = crate::http_get(self.emulator_port(), &path).await;
        assert!(matches!(answered, Some((200, _))), "{answered:?}");
    }

    /// Sets the emulator's spot price of `instance_type` in `zone` for this
    /// world's account (dollars an hour; None: unlisted).
    pub async fn set_spot_price(&self, instance_type: &str, zone: &str, price: Option<f64>) {
        let price = price.map(|p| p.to_string()).unwrap_or_default();
        let path = format!(
            "/_snm/price?account={}&kind=spot&type={instance_type}&zone={zone}&price={price}",
            self.account
        );
        let answered = crate::http_get(self.emulator_port(), &path).await;
        assert!(matches!(answered, Some((200, _))), "{answered:?}");
    }

    /// Sets the Price List's on-demand price of `instance_type` in the
    /// world's region for this world's account (None: unlisted).
    pub async fn set_on_demand_price(&self, instance_type: &str, price: Option<f64>) {
        self.put_on_demand(instance_type, price, "").await
    }

    /// Lists a second on-demand product of `instance_type` in the world's
    /// region, matching every filter the Linux one does, at `price` (None:
    /// not listed): the Price List's products then agree or disagree.
    pub async fn set_on_demand_twin(&self, instance_type: &str, price: Option<f64>) {
        self.put_on_demand(instance_type, price, "&twin=1").await
    }

    async fn put_on_demand(&self, instance_type: &str, price: Option<f64>, twin: &str) {
        let price = price.map(|p| p.to_string()).unwrap_or_default();
        let path = format!(
            "/_snm/price?account={}&kind=on-demand&type={instance_type}&region={}&price={price}{twin}",
            self.account,
            crate::REGION
        );
        let answered = crate::http_get(self.emulator_port(), &path).await;
        assert!(matches!(answered, Some((200, _))), "{answered:?}");
    }
}

/// kops's spot MixedInstancesPolicy: `template` at `version`, two instance
/// types, no on-demand.
/// The instance types a kops spot group's ASG (`template`, named as its
/// ASG) spreads over. kops gives masters and nodes machine types of their
/// own (kubernetes/kops upup/pkg/fi/cloudup/populate_instancegroup_spec.go
/// at 04695e7c: defaultMasterMachineTypeAWS and defaultNodeMachineTypeAWS
/// differ), so a cluster's groups ask for prices of different types. The
/// types themselves are ours: ones the emulator prices by default.
pub fn kops_types(template: &str) -> [&'static str; 2] {
    match template.contains(".masters.") {
        true => ["t3.medium", "t3a.medium"],
        false => ["m5.large", "m5a.large"],
    }
}

fn kops_policy(template: &str, version: &str) -> MixedInstancesPolicy {
    let overrides = kops_types(template)
        .into_iter()
        .map(|t| LaunchTemplateOverrides::builder().instance_type(t).build())
        .collect();
    MixedInstancesPolicy::builder()
        .launch_template(
            LaunchTemplate::builder()
                .launch_template_specification(
                    LaunchTemplateSpecification::builder()
                        .launch_template_name(template)
                        .version(version)
                        .build(),
                )
                .set_overrides(Some(overrides))
                .build(),
        )
        .instances_distribution(
            InstancesDistribution::builder()
                .on_demand_percentage_above_base_capacity(0)
                .spot_allocation_strategy("price-capacity-optimized")
                .build(),
        )
        .build()
}

/// A copy of a kops Node `template` (as a real cluster serves it) for
/// `instance_id` of `instance_group`, named `name`, labelled `label`:
/// its identity, cordon, taints and interruption record cleared.
pub fn node_copy(
    template: &k8s_openapi::api::core::v1::Node,
    instance_group: &str,
    label: (&str, &str),
    name: &str,
    instance_id: &str,
) -> k8s_openapi::api::core::v1::Node {
    let mut node = template.clone();
    node.metadata.name = Some(name.into());
    node.metadata.resource_version = None;
    node.metadata.uid = None;
    node.metadata.managed_fields = None;
    if let Some(labels) = node.metadata.labels.as_mut() {
        labels.insert(
            spot_node_manager::crd::labels::INSTANCE_GROUP_LABEL.into(),
            instance_group.into(),
        );
        labels.insert(label.0.into(), label.1.into());
    }
    if let Some(annotations) = node.metadata.annotations.as_mut() {
        annotations.remove(spot_node_manager::crd::labels::INTERRUPTION_ANNOTATION);
    }
    if let Some(spec) = node.spec.as_mut() {
        spec.provider_id = Some(format!("aws:///ap-northeast-1a/{instance_id}"));
        spec.unschedulable = None;
        spec.taints = None;
    }
    node
}
