//! A group at its desired count of Ready nodes with the manager running,
//! the fixture most end-to-end tests start from, and what those tests do
//! with it again and again: wait for its Refresher's status, restart its
//! manager.

use crate::refresh::{FAST, RUN, WAIT, group, ready_count};
use crate::{World, assert_eventually};
use kube::api::{Api, PostParams};
use spot_node_manager::crd::nodegroup::NodeGroupStatus;
use spot_node_manager::crd::{NodeGroup, Refresher, RefresherStatus};
use std::collections::BTreeSet;
use std::time::Duration;

/// A group at its desired count of Ready nodes, with the manager running.
/// Fields drop in this order: the simulated kubelet and the manager stop
/// before the world's namespace and nodes are deleted.
pub struct SteadyGroup {
    pub sim: super::SimGuard,
    /// The interruption queue the manager reads, when asked for.
    pub queue: Option<crate::interruption::TestQueue>,
    pub config: tempfile::NamedTempFile,
    pub manager: super::ManagerProcess,
    pub groups: Api<NodeGroup>,
    pub kops: super::KopsGroup,
    pub world: World,
}

impl SteadyGroup {
    /// Sets every ASG's MaxSize to its one node (kops's instance groups
    /// often have min = max) and waits until the manager sees it in group
    /// `name`'s status: a raise it planned on the count before would be
    /// refused by AWS, which is not what a test of a group at max is about.
    pub async fn every_asg_at_max(&self, name: &str) {
        self.world.set_max(&self.kops.asgs, 1).await;
        let count = self.kops.asgs.len();
        assert_eventually("every ASG seen at max 1", WAIT, || async {
            let status = self.groups.get(name).await.ok()?.status?;
            let asgs = &status.auto_scaling_groups;
            (asgs.len() == count && asgs.iter().all(|a| a.max == 1)).then_some(())
        })
        .await;
    }

    /// The group as it is before a test acts (see [`Baseline`]).
    pub async fn baseline(&self) -> Baseline {
        Baseline {
            before: self.world.asg_snapshot(&self.kops.asgs).await,
            original: crate::refresh::all_instances(&self.world, &self.kops.asgs).await,
        }
    }

    /// [`SteadyGroup::baseline`], with a controlled pod on every node, so
    /// every drain has something to evict (and takes two steps).
    pub async fn baseline_with_pods(&self) -> Baseline {
        let baseline = self.baseline().await;
        let names = crate::refresh::node_names(&self.world, &baseline.original).await;
        crate::refresh::pods_on(&self.world, &names).await;
        baseline
    }

    /// A sampler of Ready nodes and capacity over the group's ASGs, with
    /// `baseline` instances outside a run, once it has its first sample.
    pub async fn sample(&self, baseline: i32) -> crate::refresh::Sampler {
        crate::refresh::sample(&self.world, &self.kops.asgs, baseline).await
    }

    /// Group `name`'s status once `holds` (within [`RUN`]).
    pub async fn status_where(
        &self,
        name: &str,
        what: &str,
        holds: impl Fn(&NodeGroupStatus) -> bool,
    ) -> NodeGroupStatus {
        assert_eventually(what, RUN, || async {
            let status = self.groups.get(name).await.ok()?.status?;
            holds(&status).then_some(status)
        })
        .await
    }

    /// Waits until group `name`'s lock is given back: by a write that
    /// follows the status that ends a run, so it is waited for, not read
    /// once.
    pub async fn lock_released(&self, name: &str) {
        self.status_where(name, "the group's lock released", |s| s.operation.is_none())
            .await;
    }

    /// The interruption queue (built with `interruption_queue()`).
    pub fn queue(&self) -> &crate::interruption::TestQueue {
        self.queue
            .as_ref()
            .expect("built with interruption_queue()")
    }
}

/// A group before a test acts: each ASG's (name, desired count,
/// instances), and every instance in service.
pub struct Baseline {
    pub before: Vec<(String, i32, Vec<String>)>,
    pub original: BTreeSet<String>,
}

/// How to build a [`SteadyGroup`]: one Ready node per zone in each of the
/// three zones, the simulated kubelet fast, the manager with no extra flags,
/// unless told otherwise.
pub struct SteadyGroupBuilder {
    test: String,
    kops_role: &'static str,
    name: &'static str,
    role: &'static str,
    zones: Vec<&'static str>,
    per_asg: i32,
    delays: (Duration, Duration),
    args: Vec<String>,
    queue: bool,
    queue_stack: bool,
    queue_endpoint: Option<String>,
    config: String,
    resync: String,
    binary: Option<std::path::PathBuf>,
    split: bool,
    /// Set in the emulator before the manager starts: spot prices (type,
    /// zone), on-demand prices (type), AWS actions denied.
    spot_prices: Vec<(String, String, f64)>,
    on_demand_prices: Vec<(String, f64)>,
    /// A second on-demand product per type (`World::set_on_demand_twin`).
    on_demand_twins: Vec<(String, f64)>,
    denied: Vec<String>,
    etcd_volumes: bool,
    own_pod: Option<String>,
}

impl SteadyGroup {
    /// NodeGroup `workers` (role Worker) over kops "nodes" ASGs.
    pub fn workers(test: &str) -> SteadyGroupBuilder {
        SteadyGroupBuilder::new(test, "nodes", "workers", "Worker")
    }

    /// NodeGroup `masters` (role Master) over kops "master" ASGs.
    pub fn masters(test: &str) -> SteadyGroupBuilder {
        SteadyGroupBuilder::new(test, "master", "masters", "Master")
    }
}

impl SteadyGroupBuilder {
    fn new(
        test: &str,
        kops_role: &'static str,
        name: &'static str,
        role: &'static str,
    ) -> SteadyGroupBuilder {
        SteadyGroupBuilder {
            test: test.to_string(),
            kops_role,
            name,
            role,
            zones: crate::ZONES.to_vec(),
            per_asg: 1,
            delays: (FAST, FAST),
            args: vec![],
            queue: false,
            queue_stack: false,
            queue_endpoint: None,
            config: String::new(),
            resync: "2s".into(),
            binary: None,
            split: false,
            spot_prices: vec![],
            on_demand_prices: vec![],
            on_demand_twins: vec![],
            denied: vec![],
            etcd_volumes: true,
            own_pod: None,
        }
    }

    /// Masters tied to an etcd volume per place, as kops runs them (the
    /// default), or not (`SimConfig::etcd_volumes`): then a master beside
    /// its place's member serves too, as on a control plane not kops's.
    pub fn etcd_volumes(mut self, on: bool) -> Self {
        self.etcd_volumes = on;
        self
    }

    /// The manager runs as if in pod `name` of the world's namespace
    /// (`POD_NAME`, `POD_NAMESPACE`): a drain of the node that pod is
    /// bound to treats it as the manager's own.
    pub fn own_pod(mut self, name: &str) -> Self {
        self.own_pod = Some(name.to_string());
        self
    }

    /// One NodeGroup per ASG, named `<name>-<i>` (kops's one master
    /// instance group per zone), instead of one over them all.
    pub fn one_group_per_asg(mut self) -> Self {
        self.split = true;
        self
    }

    /// One ASG per zone.
    pub fn zones(mut self, zones: &[&'static str]) -> Self {
        self.zones = zones.to_vec();
        self
    }

    pub fn per_asg(mut self, per_asg: i32) -> Self {
        self.per_asg = per_asg;
        self
    }

    /// The simulated kubelet's register and Ready delays.
    pub fn delays(mut self, register: Duration, ready: Duration) -> Self {
        self.delays = (register, ready);
        self
    }

    /// Extra flags for the manager.
    pub fn manager_args(mut self, args: &[&str]) -> Self {
        self.args = args.iter().map(|a| a.to_string()).collect();
        self
    }

    /// The queue we ship (the CloudFormation stack of
    /// `manifests/aws/interruption-queue.yaml`, deployed into the world's
    /// account), read by the manager.
    pub fn interruption_queue_stack(mut self) -> Self {
        self.queue = true;
        self.queue_stack = true;
        self
    }

    /// The interruption queue on an SQS endpoint of its own (a
    /// [`crate::interruption::SeparateSqs`]); the manager is pointed at it
    /// with `AWS_ENDPOINT_URL_SQS`.
    pub fn interruption_queue_on(mut self, endpoint: &str) -> Self {
        self.queue = true;
        self.queue_endpoint = Some(endpoint.to_string());
        self
    }

    /// An SQS queue in the world's account, read by the manager.
    pub fn interruption_queue(mut self) -> Self {
        self.queue = true;
        self
    }

    /// The inventory's resync interval (tests: 2s, so nothing waits on the
    /// default minute; the API budget benchmark: the default).
    pub fn resync(mut self, interval: &str) -> Self {
        self.resync = interval.to_string();
        self
    }

    /// Runs this manager binary instead of this tree's (the upgrade test's
    /// earlier release).
    pub fn manager_binary(mut self, binary: &std::path::Path) -> Self {
        self.binary = Some(binary.to_path_buf());
        self
    }

    /// The emulator's spot price of `instance_type` in `zone`, set before
    /// the manager starts (it reads prices at most once an hour).
    pub fn spot_price(mut self, instance_type: &str, zone: &str, price: f64) -> Self {
        self.spot_prices
            .push((instance_type.to_string(), zone.to_string(), price));
        self
    }

    /// The Price List's on-demand price of `instance_type`, set before the
    /// manager starts.
    pub fn on_demand_price(mut self, instance_type: &str, price: f64) -> Self {
        self.on_demand_prices
            .push((instance_type.to_string(), price));
        self
    }

    /// A second on-demand product of `instance_type` at `price`, listed
    /// after the first, set before the manager starts.
    pub fn on_demand_twin(mut self, instance_type: &str, price: f64) -> Self {
        self.on_demand_twins
            .push((instance_type.to_string(), price));
        self
    }

    /// AWS `action` refused to the world's account (as IAM refuses an
    /// action its policy lacks) before the manager starts.
    pub fn deny(mut self, action: &str) -> Self {
        self.denied.push(action.to_string());
        self
    }

    /// More of the manager's config file (YAML, after `resyncInterval`).
    pub fn manager_config(mut self, yaml: &str) -> Self {
        self.config.push_str(yaml);
        self
    }

    /// Creates the ASGs, the NodeGroup over them, a simulated kubelet and
    /// the manager, and waits until all nodes are Ready.
    pub async fn start(self) -> SteadyGroup {
        let world = World::new(&self.test).await;
        for (instance_type, zone, price) in &self.spot_prices {
            world
                .set_spot_price(instance_type, zone, Some(*price))
                .await;
        }
        for (instance_type, price) in &self.on_demand_prices {
            world.set_on_demand_price(instance_type, Some(*price)).await;
        }
        for (instance_type, price) in &self.on_demand_twins {
            world.set_on_demand_twin(instance_type, Some(*price)).await;
        }
        for action in &self.denied {
            world.deny_aws_action(action).await;
        }
        let kops = world
            .kops_group(self.kops_role, &self.zones, self.per_asg, &[])
            .await;
        let sim = world.start_sim_configured(crate::sim::SimConfig {
            register_delay: self.delays.0,
            ready_delay: self.delays.1,
            etcd_volumes: self.etcd_volumes,
            ..Default::default()
        });
        let groups: Api<NodeGroup> = world.api();
        let desired = self.per_asg * self.zones.len() as i32;
        let mut names = vec![];
        match self.split {
            false => names.push((self.name.to_string(), kops.asgs.clone(), desired)),
            true => {
                for (i, asg) in kops.asgs.iter().enumerate() {
                    names.push((
                        format!("{}-{i}", self.name),
                        vec![asg.clone()],
                        self.per_asg,
                    ));
                }
            }
        }
        for (name, asgs, desired) in &names {
            groups
                .create(
                    &PostParams::default(),
                    &group(name, self.role, asgs, *desired),
                )
                .await
                .expect("create group");
        }
        let queue = match self.queue {
            true if self.queue_stack => Some(world.queue_stack("example.com").await),
            true if let Some(endpoint) = &self.queue_endpoint => {
                Some(world.queue_on(endpoint, "interruptions").await)
            }
            true => Some(world.queue("interruptions").await),
            false => None,
        };
        let mut args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        if let Some(q) = &queue {
            args.extend(["--interruption-queue-url", q.url.as_str()]);
        }
        let binary = self.binary.clone().unwrap_or_else(crate::manager_binary);
        let mut env: Vec<(&str, &str)> = vec![];
        if let Some(e) = &self.queue_endpoint {
            env.push(("AWS_ENDPOINT_URL_SQS", e));
        }
        if let Some(pod) = &self.own_pod {
            env.extend([
                ("POD_NAME", pod.as_str()),
                ("POD_NAMESPACE", &world.namespace),
            ]);
        }
        let (manager, config) = world.start_manager_binary(
            &binary,
            &format!("resyncInterval: {}\n{}", self.resync, self.config),
            &args,
            &env,
        );
        assert_eventually(&format!("{desired} Ready"), RUN, || async {
            let mut ready = 0;
            for (name, _, _) in &names {
                ready += ready_count(&groups, name).await?;
            }
            (ready == desired).then_some(())
        })
        .await;
        SteadyGroup {
            world,
            kops,
            groups,
            manager,
            config,
            sim,
            queue,
        }
    }
}

/// The usual case: NodeGroup `workers`, one Ready worker in each of three ASGs.
pub async fn three_workers(test: &str) -> SteadyGroup {
    SteadyGroup::workers(test).start().await
}

/// Waits up to `within` until Refresher `name`'s status gives `answer` an
/// answer, and returns it.
pub async fn refresher_until<T>(
    world: &World,
    name: &str,
    what: &str,
    within: Duration,
    answer: impl Fn(RefresherStatus) -> Option<T>,
) -> T {
    let refreshers: Api<Refresher> = world.api();
    assert_eventually(what, within, || async {
        answer(refreshers.get(name).await.ok()?.status?)
    })
    .await
}

/// Kills `manager` (kill -9) and starts another in its place (leader
/// election off, resync 2 s), as a crash and a restart would; its config
/// file is returned, to keep while it runs.
pub async fn restart_manager(
    world: &World,
    manager: &mut crate::ManagerProcess,
) -> tempfile::NamedTempFile {
    manager.kill();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (restarted, config) = world.start_manager(&[]);
    *manager = restarted;
    config
}

/// Refresher `name`'s status now (it must have one).
pub async fn refresher_status(world: &World, name: &str) -> RefresherStatus {
    world.status_of::<Refresher>(name).await
}

/// Kills the manager (kill -9) once the run is in each of `phases` in turn
/// (and `also` holds), restarting it each time; the config files to keep.
pub async fn kill_at_phases(
    world: &World,
    manager: &mut crate::ManagerProcess,
    phases: &[spot_node_manager::crd::refresher::RefreshPhase],
    also: impl Fn(&RefresherStatus) -> bool,
) -> Vec<tempfile::NamedTempFile> {
    let mut configs = vec![];
    for &phase in phases {
        let what = format!("phase {phase:?}");
        let seen = refresher_until(world, "workers", &what, RUN, |s| {
            (s.phase == phase && s.run_start.is_some() && also(&s)).then_some(s.replaced)
        })
        .await;
        eprintln!("killing the manager in {phase:?} after {seen} replacement(s)");
        configs.push(restart_manager(world, manager).await);
    }
    configs
}

/// Refresher `name`'s status once `holds` (within [`RUN`]).
pub async fn refresher_where(
    world: &World,
    name: &str,
    what: &str,
    holds: impl Fn(&RefresherStatus) -> bool,
) -> RefresherStatus {
    refresher_until(world, name, what, RUN, |s| holds(&s).then_some(s)).await
}

/// Refresher `name`'s status once its message says `text` (within [`WAIT`]).
pub async fn refresher_saying(world: &World, name: &str, text: &str) -> RefresherStatus {
    let what = format!("the Refresher to say {text:?}");
    refresher_until(world, name, &what, WAIT, |s| {
        let says = s.message.as_deref().is_some_and(|m| m.contains(text));
        says.then_some(s)
    })
    .await
}
