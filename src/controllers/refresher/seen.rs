//! What a Refresher's plan is given, observed once: by the reconcile that
//! acts on it, and by the preview (`status.next`, `spot-node-manager
//! preview`), which must see what the run would see.

use crate::Result;
use crate::cloud::{AsgDescription, AsgInstance};
use crate::context::Context;
use crate::controllers::group_view::{AsgView, group_nodes};
use crate::controllers::observe::{DescribedAsgs, ObservedGroup};
use crate::controllers::refresher::plan::{self as refresh_plan, Input, Member, SlotState};
use crate::controllers::window::{WindowState, window_state};
use crate::crd::next::NextDisruption;
use crate::crd::nodegroup::{ResolvedDisruption, ResolvedRefresh};
use crate::crd::{NodeGroup, Refresher, RefresherStatus};
use crate::k8s::disruption_slot::Slots;
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, BTreeSet};

/// When to ask which nodes are protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    /// Only while a run is in progress (the nodes it drains, and the
    /// surplus it removes at the end).
    RunOnly,
    /// Now, with the budgets that hold each node (a preview of a run to
    /// come: what it would meet).
    AllMembers,
}

/// How far ahead of a run's start its preview in status says which nodes
/// are protected: asking costs two lists (Nodes, Pods) per reconcile, so an
/// idle Refresher whose run is far off does not.
pub const PROTECTION_HORIZON: chrono::Duration = chrono::Duration::minutes(10);

impl Protection {
    /// What a reconcile asks: a run in progress, its own nodes; a run due
    /// (the reconcile `looked` at AWS: due, drifted, or set aside) or due
    /// within [`PROTECTION_HORIZON`], every member, for its preview.
    pub fn for_status(
        status: Option<&RefresherStatus>,
        looked: bool,
        now: DateTime<Utc>,
    ) -> Protection {
        let running = status.is_some_and(|s| s.run_start.is_some());
        let soon = status
            .and_then(|s| s.next_run)
            .is_some_and(|t| t - now <= PROTECTION_HORIZON);
        match !running && (looked || soon) {
            true => Protection::AllMembers,
            false => Protection::RunOnly,
        }
    }
}

/// Everything but the group's ASG description, which a plan may take fresh.
pub struct Seen {
    pub settings: std::result::Result<ResolvedRefresh, String>,
    /// See `plan::Input::invalid_pause`.
    pub invalid_pause: std::time::Duration,
    pub current: RefresherStatus,
    pub schedule_key: String,
    pub control_plane_ready: BTreeSet<String>,
    pub slot: SlotState,
    pub window: WindowState,
    pub disruption: ResolvedDisruption,
    pub protected: BTreeMap<String, String>,
    /// Nodes a PodDisruptionBudget would hold now (asked with every member,
    /// for the preview only: a run's drain learns it from the Eviction API).
    pub held_by_budgets: BTreeMap<String, String>,
    pub unsettled: BTreeMap<String, String>,
    pub drift_replace: bool,
    pub suspended: bool,
    pub dry_run: bool,
    pub now: DateTime<Utc>,
}

impl Seen {
    pub async fn observe(
        ctx: &Context,
        rf: &Refresher,
        group: &NodeGroup,
        slots: &Slots<'_>,
        protection: Protection,
        now: DateTime<Utc>,
    ) -> Result<Seen> {
        let current = rf.status.clone().unwrap_or_default();
        // Invalid: the group is invalid too, and no run steps, so the
        // defaults are never acted on.
        let disruption = group.spec.resolved_disruption().unwrap_or_default();
        let control_plane_ready = control_plane_ready(ctx, rf, group, &current).await?;
        let slot = slots.observe().await?;
        let protections = protected_nodes(ctx, group, &current, protection).await?;
        Ok(Seen {
            settings: settings_of(rf, group),
            invalid_pause: rf
                .spec
                .resolve()
                .map_or(crate::crd::nodegroup::DEFAULT_PAUSE_TIMEOUT, |s| {
                    s.pause_timeout
                }),
            schedule_key: rf.spec.schedule_key(),
            control_plane_ready,
            slot,
            window: crate::controllers::window::group_window(group, now),
            protected: protections.protected,
            held_by_budgets: protections.held_by_budgets,
            unsettled: unsettled_workloads(ctx, &current).await?,
            disruption,
            current,
            drift_replace: rf.spec.drift_replace,
            suspended: rf.spec.suspend,
            dry_run: ctx.settings.dry_run,
            now,
        })
    }

    /// The plan's input on `described` (and its active instances, `members`).
    pub fn input<'a>(
        &'a self,
        observed: &'a ObservedGroup,
        described: &'a DescribedAsgs,
        members: &'a [Member],
    ) -> Input<'a> {
        Input {
            group: observed.facts(described, self.suspended, self.now),
            dry_run: self.dry_run,
            settings: &self.settings,
            invalid_pause: self.invalid_pause,
            schedule_key: &self.schedule_key,
            drift_replace: self.drift_replace,
            members,
            control_plane_ready: &self.control_plane_ready,
            rules: crate::controllers::book::Book::new(
                self.window.clone(),
                &self.protected,
                self.slot.clone(),
            ),
            do_not_disrupt_timeout: self.disruption.do_not_disrupt_timeout,
            on_window_close: self.disruption.on_window_close,
            unsettled: &self.unsettled,
            status: &self.current,
        }
    }

    /// The next disruption, previewed by the plan on `described`, or (idle
    /// and not due: the reconcile described nothing) on the inventory's
    /// view of the ASGs, so an idle preview costs no AWS call.
    pub fn next(
        &self,
        observed: &ObservedGroup,
        described: Option<&DescribedAsgs>,
    ) -> Option<NextDisruption> {
        let inventoried;
        let described = match described {
            Some(d) => d,
            None => {
                inventoried = as_inventoried(observed, self.now);
                &inventoried
            }
        };
        let members = Member::all_of(&described.fresh);
        let input = self.input(observed, described, &members);
        let mut next = refresh_plan::preview(&input, &|t| window_state(&self.disruption, t))?;
        for node in &mut next.nodes {
            crate::k8s::budgets::mark(node, self.held_by_budgets.get(&node.node));
        }
        // The next node held by a budget holds the run there: say so.
        let first = next
            .nodes
            .first()
            .and_then(|n| self.held_by_budgets.get(&n.node));
        if let (None, Some(held)) = (&next.blocked_by, first) {
            next.summary = format!("{}; blocked: {held}", next.summary);
        }
        Some(next)
    }
}

/// The group's ASGs as its inventory last described them (at most a
/// `resyncInterval` ago): its nodes in service, its never-joined instances
/// Pending. What a preview of an idle Refresher plans on.
pub fn as_inventoried(observed: &ObservedGroup, now: DateTime<Utc>) -> DescribedAsgs {
    let status = &observed.group_status;
    let instance = |id: &str, state: &str| AsgInstance {
        instance_id: id.to_string(),
        availability_zone: None,
        instance_type: None,
        lifecycle_state: state.to_string(),
        health_status: "Healthy".into(),
        launched_from: None,
    };
    let fresh: Vec<AsgDescription> = status
        .auto_scaling_groups
        .iter()
        .map(|a| AsgDescription {
            name: a.name.clone(),
            desired: a.desired,
            min: a.min,
            max: a.max,
            instances: status
                .nodes
                .iter()
                .filter(|n| n.auto_scaling_group.as_deref() == Some(a.name.as_str()))
                .filter_map(|n| n.instance_id.as_deref())
                .map(|id| instance(id, "InService"))
                .chain(
                    status
                        .not_joined
                        .iter()
                        .filter(|i| i.auto_scaling_group == a.name)
                        .map(|i| instance(&i.instance_id, "Pending")),
                )
                .collect(),
            launches_from: None,
            tags: Default::default(),
            recent_failure: None,
            suspended_processes: a.suspended_processes.clone(),
            capacity_rebalance: false,
            max_instance_lifetime: None,
            zones: vec![],
        })
        .collect();
    let asgs = fresh
        .iter()
        .map(|a| AsgView {
            fallback: observed.group.spec.is_fallback(&a.name),
            ..AsgView::from(a)
        })
        .collect();
    let nodes = group_nodes(&status.nodes, &fresh, now);
    DescribedAsgs { fresh, asgs, nodes }
}

/// Drifted nodes to roll: the group's status says so (and which).
pub fn drift_pending(rf: &Refresher, group: &NodeGroup) -> bool {
    rf.spec.drift_replace
        && group
            .status
            .as_ref()
            .and_then(|s| s.drifted_nodes)
            .is_some_and(|n| n > 0)
}

/// The group's nodes that are protected from voluntary disruption, with
/// why (see [`Protection`] for when it is asked).
async fn protected_nodes(
    ctx: &Context,
    group: &NodeGroup,
    current: &RefresherStatus,
    protection: Protection,
) -> Result<crate::k8s::protection::Protections> {
    if protection == Protection::RunOnly && current.run_start.is_none() {
        return Ok(Default::default());
    }
    // A run asks of every member, not only the nodes it has left: the
    // surplus it removes at the end may be any member of a raised ASG (the
    // newest, often a replacement), chosen in the reconcile that enters
    // that phase. The lists cost the same whatever the names.
    let names: BTreeSet<String> = group
        .status
        .iter()
        .flat_map(|s| &s.nodes)
        .filter(|n| n.instance_id.is_some())
        .map(|n| n.name.clone())
        .collect();
    let evict_unmanaged = group.spec.disruption.evict_unmanaged_pods;
    let with_budgets = protection == Protection::AllMembers;
    crate::k8s::protection::observe(ctx, &names, evict_unmanaged, with_budgets).await
}

/// Waiting for the batch's replacements: of the workloads its drains moved, those
/// whose pods are not all back (Pending or not Ready), with why.
async fn unsettled_workloads(
    ctx: &Context,
    current: &RefresherStatus,
) -> Result<BTreeMap<String, String>> {
    let moved: BTreeSet<String> = current
        .batch()
        .flat_map(|t| t.workloads.iter().cloned())
        .collect();
    if current.phase != crate::crd::refresher::RefreshPhase::WaitingForReplacement
        || moved.is_empty()
    {
        return Ok(BTreeMap::new());
    }
    let moved: Vec<String> = moved.into_iter().collect();
    crate::k8s::workloads::observe_unsettled(ctx, &moved).await
}

/// Masters between replacements: which nodes' control planes are up
/// (counted by Node where no master of the cluster shows control-plane
/// pods).
async fn control_plane_ready(
    ctx: &Context,
    rf: &Refresher,
    group: &NodeGroup,
    current: &RefresherStatus,
) -> Result<BTreeSet<String>> {
    use kube::ResourceExt;
    if group.spec.role == crate::crd::Role::Master
        && current.phase == crate::crd::refresher::RefreshPhase::WaitingForReplacement
    {
        let namespace = rf.namespace().unwrap_or_default();
        let (serving, _) = crate::controllers::authority::observe::serving(ctx, &namespace).await?;
        return Ok(serving.into_keys().collect());
    }
    Ok(Default::default())
}

/// The run's settings, or why there are none: another group naming one of
/// its ASGs pauses any run, as an invalid spec does.
fn settings_of(rf: &Refresher, group: &NodeGroup) -> std::result::Result<ResolvedRefresh, String> {
    match group.invalid_outside_spec() {
        Some(why) => Err(why),
        None => rf
            .spec
            .resolve()
            .map_err(|p| format!("the Refresher's spec is invalid: {p}")),
    }
}
