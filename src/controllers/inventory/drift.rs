//! Drift: a member launched from another launch template version (or
//! another template, or launch configuration) than its ASG launches from
//! now, or a Node marked with kops's `kops.k8s.io/needs-update`. kops's
//! rolling-update calls these nodes NeedsUpdate and compares the same
//! things: each instance's template and version as AWS recorded them at its
//! launch, against its ASG's, `$Latest` and `$Default` resolved.
//!
//! The versions of templates an ASG names symbolically are asked once for
//! all of a group's templates, and kept for two resyncs (see
//! [`TemplateFacts`]): a steady group costs one DescribeLaunchTemplates
//! every other resync, whatever its node count, and only when an ASG names
//! `$Latest` or `$Default` (kops's do). Drift is found within two resyncs
//! of `kops update cluster`; a refresh, at most 20 calls a minute, stays
//! within its budget.

use crate::cloud::{AsgDescription, LaunchSource, TemplateKey, TemplateVersions};
use crate::crd::NodeGroupStatus;
use crate::crd::nodegroup::NodeStatus;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::crd::condition::{ConditionStatus, set_condition};
pub use crate::crd::labels::NEEDS_UPDATE_ANNOTATION;

/// How long a template's version numbers are kept, by default: just under
/// two of the default one-minute resyncs, so every other resync asks and
/// the syncs between (Node changes) ask nothing. See
/// [`TemplateFacts::for_resync`].
pub const TEMPLATE_FLOOR: Duration = Duration::from_secs(110);

/// What an ASG launches from now, its template version a number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Current {
    Template {
        id: Option<String>,
        name: Option<String>,
        version: i64,
        /// Resolved from `$Latest` (as asked a resync or two ago).
        latest: bool,
    },
    Configuration(String),
}

/// The template keys of these ASGs whose versions must be resolved.
pub fn symbolic_templates(asgs: &[AsgDescription]) -> BTreeSet<TemplateKey> {
    asgs.iter()
        .filter_map(|a| a.launches_from.as_ref()?.symbolic_template())
        .collect()
}

/// What `source` (an ASG's) launches from now; None when it cannot be told
/// (a symbolic version of a template not found).
pub fn current(source: &LaunchSource, templates: &[TemplateVersions]) -> Option<Current> {
    let LaunchSource::Template { id, name, version } = source else {
        let LaunchSource::Configuration(name) = source else {
            return None;
        };
        return Some(Current::Configuration(name.clone()));
    };
    let version = match version.as_deref().map(|v| (v, v.parse::<i64>())) {
        Some((_, Ok(number))) => number,
        symbolic => {
            let key = source.symbolic_template()?;
            let found = templates.iter().find(|t| t.is(&key))?;
            match symbolic.map(|(v, _)| v) {
                Some("$Latest") => found.latest,
                // `$Default`, or no version: AWS launches the default.
                _ => found.default,
            }
        }
    };
    Some(Current::Template {
        id: id.clone(),
        name: name.clone(),
        version,
        latest: version_is_latest(source),
    })
}

fn version_is_latest(source: &LaunchSource) -> bool {
    matches!(source, LaunchSource::Template { version: Some(v), .. } if v == "$Latest")
}

/// Why an instance launched from `launched` is drifted from `current`, its
/// ASG's; None when it is not, or when it cannot be told.
pub fn drift(launched: Option<&LaunchSource>, current: Option<&Current>) -> Option<String> {
    let (launched, current) = (launched?, current?);
    match (launched, current) {
        (LaunchSource::Configuration(was), Current::Configuration(now)) => {
            (was != now).then(|| format!("launch configuration {was}, its ASG launches {now}"))
        }
        (LaunchSource::Configuration(was), Current::Template { .. }) => Some(format!(
            "launch configuration {was}, its ASG launches {}",
            describe(current)
        )),
        (LaunchSource::Template { .. }, Current::Configuration(now)) => Some(format!(
            "{}, its ASG launches launch configuration {now}",
            describe_launched(launched)
        )),
        (
            LaunchSource::Template {
                id, name, version, ..
            },
            Current::Template {
                id: now_id,
                name: now_name,
                version: now_version,
                latest,
            },
        ) => {
            let same = match ((id, now_id), (name, now_name)) {
                ((Some(a), Some(b)), _) => a == b,
                (_, (Some(a), Some(b))) => a == b,
                _ => return None,
            };
            if !same {
                return Some(format!(
                    "{}, its ASG launches {}",
                    describe_launched(launched),
                    describe(current)
                ));
            }
            // An instance's version is the number it was launched from;
            // anything else cannot be compared.
            let was: i64 = version.as_deref()?.parse().ok()?;
            if *latest && was > *now_version {
                // Launched from a version newer than the latest we know of:
                // what we know is older than the instance, not the other way.
                return None;
            }
            (was != *now_version).then(|| {
                format!(
                    "launch template {} version {was}, its ASG launches version {now_version}",
                    label(id, name)
                )
            })
        }
    }
}

fn label(id: &Option<String>, name: &Option<String>) -> String {
    name.clone()
        .or_else(|| id.clone())
        .unwrap_or_else(|| "?".into())
}

fn describe(current: &Current) -> String {
    match current {
        Current::Template {
            id, name, version, ..
        } => {
            format!("launch template {} version {version}", label(id, name))
        }
        Current::Configuration(name) => format!("launch configuration {name}"),
    }
}

fn describe_launched(launched: &LaunchSource) -> String {
    match launched {
        LaunchSource::Template { id, name, version } => format!(
            "launch template {} version {}",
            label(id, name),
            version.as_deref().unwrap_or("?")
        ),
        LaunchSource::Configuration(name) => format!("launch configuration {name}"),
    }
}

/// Why each drifted instance of `asgs` is drifted, by instance id.
pub fn by_instance<'a>(
    asgs: &'a [AsgDescription],
    templates: &[TemplateVersions],
) -> BTreeMap<&'a str, String> {
    asgs.iter()
        .flat_map(|a| {
            let current = a
                .launches_from
                .as_ref()
                .and_then(|source| self::current(source, templates));
            a.instances.iter().filter_map(move |i| {
                let why = drift(i.launched_from.as_ref(), current.as_ref())?;
                Some((i.instance_id.as_str(), why))
            })
        })
        .collect()
}

/// Why a member Node is drifted: kops `marked` it, or its instance is.
pub fn of_node(
    marked: bool,
    instance_id: Option<&str>,
    by_instance: &BTreeMap<&str, String>,
) -> Option<String> {
    match marked {
        true => Some(format!("annotation {NEEDS_UPDATE_ANNOTATION}")),
        false => instance_id.and_then(|id| by_instance.get(id).cloned()),
    }
}

/// The message of the Event for nodes drifted in `next` that were not in
/// `current` (none when there are none): drift is told once, when it
/// appears, not at every sync while it lasts.
pub fn drift_appeared(current: &NodeGroupStatus, next: &NodeGroupStatus) -> Option<String> {
    let was = |name: &str| {
        current
            .nodes
            .iter()
            .any(|n| n.name == name && n.drifted.is_some())
    };
    let new: Vec<&NodeStatus> = next
        .nodes
        .iter()
        .filter(|n| n.drifted.is_some() && !was(&n.name))
        .collect();
    let first = new.first()?;
    let why = first.drifted.as_deref().unwrap_or_default();
    let total = next.drifted_nodes.unwrap_or(new.len() as i32);
    Some(match new.len() {
        1 => format!(
            "node {} is drifted ({why}); {total} drifted in all",
            first.name
        ),
        n => format!(
            "{n} nodes are drifted, e.g. {} ({why}); {total} drifted in all",
            first.name
        ),
    })
}

type Known = HashMap<TemplateKey, (Option<TemplateVersions>, Instant)>;

/// A Node kops's rolling update has taken out of its ASG: tainted
/// scheduled-for-update, its instance (known) active in none of the group's
/// ASGs (detaching, detached, terminating). kops detaches an old instance
/// without decrement and drains it once its replacement is up; from then on
/// the node is not a member (not counted Ready, not in `nodes[]`), though
/// its taint still says the update is running.
pub fn detached_by_kops<N: crate::k8s::node::NodeView + ?Sized>(
    node: &N,
    asgs: &[AsgDescription],
) -> bool {
    node.scheduled_for_update()
        && node.instance_id().is_some_and(|id| {
            !asgs
                .iter()
                .flat_map(|a| a.instances.iter())
                .any(|i| i.instance_id == id && i.is_active())
        })
}

/// Template version numbers asked so far, shared by every group's sync.
pub struct TemplateFacts {
    known: Mutex<Known>,
    /// Templates whose last ask failed, and why (until one succeeds).
    unreadable: Mutex<BTreeMap<TemplateKey, String>>,
    floor: Duration,
}

impl Default for TemplateFacts {
    fn default() -> Self {
        Self::for_floor(TEMPLATE_FLOOR)
    }
}

impl TemplateFacts {
    /// Kept for eleven sixths of `resync`: every other resync asks (a
    /// minute gives [`TEMPLATE_FLOOR`]).
    pub fn for_resync(resync: Duration) -> Self {
        Self::for_floor(resync * 11 / 6)
    }

    fn for_floor(floor: Duration) -> Self {
        Self {
            known: Mutex::default(),
            unreadable: Mutex::default(),
            floor,
        }
    }

    fn unreadable_keys(&self) -> std::sync::MutexGuard<'_, BTreeMap<TemplateKey, String>> {
        self.unreadable.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why some of `wanted` could not be read at their last ask, if so:
    /// drift is unknown until a later ask succeeds.
    pub fn unreadable(&self, wanted: &BTreeSet<TemplateKey>) -> Option<String> {
        let failed = self.unreadable_keys();
        wanted.iter().find_map(|k| failed.get(k).cloned())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Of `wanted`, those not asked within the floor: all of them
    /// when any is due, so one call asks for the group's whole set.
    pub fn to_ask(&self, wanted: &BTreeSet<TemplateKey>, now: Instant) -> Vec<TemplateKey> {
        let known = self.lock();
        let due = wanted.iter().any(|k| match known.get(k) {
            None => true,
            Some((_, asked)) => now.saturating_duration_since(*asked) >= self.floor,
        });
        match due {
            true => wanted.iter().cloned().collect(),
            false => vec![],
        }
    }

    /// `asked` could not be read (`why`): asked again only after the floor
    /// (a refused call is not repeated at every sync), what was known kept,
    /// each unreadable until an ask succeeds. Answers what is known of
    /// `wanted`.
    pub fn failed(
        &self,
        asked: &[TemplateKey],
        why: &str,
        asked_at: Instant,
        wanted: &BTreeSet<TemplateKey>,
    ) -> Vec<TemplateVersions> {
        let mut failed = self.unreadable_keys();
        for key in asked {
            failed.insert(key.clone(), why.to_string());
        }
        drop(failed);
        let mut known = self.lock();
        for key in asked {
            let kept = known.get(key).and_then(|(t, _)| t.clone());
            known.insert(key.clone(), (kept, asked_at));
        }
        wanted
            .iter()
            .filter_map(|k| known.get(k).and_then(|(t, _)| t.clone()))
            .collect()
    }

    /// Keeps the answer to `asked` (a template absent from it is remembered
    /// as not found), and answers what is known of `wanted`.
    pub fn remember(
        &self,
        asked: &[TemplateKey],
        answer: Vec<TemplateVersions>,
        asked_at: Instant,
        wanted: &BTreeSet<TemplateKey>,
    ) -> Vec<TemplateVersions> {
        let mut failed = self.unreadable_keys();
        for key in asked {
            failed.remove(key);
        }
        drop(failed);
        let mut known = self.lock();
        for key in asked {
            let found = answer.iter().find(|t| t.is(key)).cloned();
            known.insert(key.clone(), (found, asked_at));
        }
        wanted
            .iter()
            .filter_map(|k| known.get(k).and_then(|(t, _)| t.clone()))
            .collect()
    }
}

/// The DriftKnown condition: False while the launch templates the ASGs
/// name cannot be read (`unknown` says why).
pub fn set_drift_known(
    status: &mut NodeGroupStatus,
    unknown: Option<&str>,
    generation: Option<i64>,
    now: chrono::DateTime<chrono::Utc>,
) {
    let (state, reason, message) = match unknown {
        None => (
            ConditionStatus::True,
            "Known",
            "the launch templates the ASGs name are read".to_string(),
        ),
        Some(why) => (
            ConditionStatus::False,
            "LaunchTemplatesUnreadable",
            format!(
                "{why}; the drift of nodes whose ASG names a template's $Latest or $Default version is unknown, and each node's stays as last seen (does the manager's IAM policy allow ec2:DescribeLaunchTemplates?)"
            ),
        ),
    };
    set_condition(
        &mut status.conditions,
        crate::crd::condition::DRIFT_KNOWN,
        state,
        reason,
        message,
        generation,
        now,
    );
}

/// While drift cannot be told (`unknown` says why), a member keeps what
/// the previous status said of it: unknown is neither drifted nor not.
pub fn keep_drifted(
    mut member: NodeStatus,
    unknown: Option<&str>,
    previous: &[NodeStatus],
) -> NodeStatus {
    if unknown.is_some() && member.drifted.is_none() {
        member.drifted = previous
            .iter()
            .find(|p| p.name == member.name)
            .and_then(|p| p.drifted.clone());
    }
    member
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(name: &str, version: Option<&str>) -> LaunchSource {
        LaunchSource::Template {
            id: Some(format!("lt-{name}")),
            name: Some(name.into()),
            version: version.map(str::to_string),
        }
    }

    fn versions(name: &str, latest: i64, default: i64) -> TemplateVersions {
        TemplateVersions {
            id: format!("lt-{name}"),
            name: name.into(),
            latest,
            default,
        }
    }

    #[test]
    fn latest_and_default_resolve_through_the_templates_versions() {
        let known = [versions("nodes", 4, 2)];
        let at = |v: Option<&str>| current(&template("nodes", v), &known);
        let number = |n, latest| {
            Some(Current::Template {
                id: Some("lt-nodes".into()),
                name: Some("nodes".into()),
                version: n,
                latest,
            })
        };
        assert_eq!(at(Some("$Latest")), number(4, true));
        assert_eq!(at(Some("$Default")), number(2, false));
        assert_eq!(
            at(None),
            number(2, false),
            "no version launches the default"
        );
        assert_eq!(at(Some("3")), number(3, false), "a number needs no lookup");
        assert_eq!(
            current(&template("gone", Some("$Latest")), &known),
            None,
            "a template not found cannot be told"
        );
        assert_eq!(
            current(&LaunchSource::Configuration("lc-2".into()), &[]),
            Some(Current::Configuration("lc-2".into()))
        );
    }

    #[test]
    fn an_instance_is_drifted_when_launched_from_another_version_template_or_configuration() {
        let now = current(
            &template("nodes", Some("$Latest")),
            &[versions("nodes", 4, 4)],
        );
        let was = |v: &str| drift(Some(&template("nodes", Some(v))), now.as_ref());
        assert_eq!(was("4"), None);
        assert_eq!(
            was("3").as_deref(),
            Some("launch template nodes version 3, its ASG launches version 4")
        );
        // A rollback: the ASG pinned back to 3; the instances of 4 drift.
        let pinned = current(&template("nodes", Some("3")), &[]);
        assert!(drift(Some(&template("nodes", Some("4"))), pinned.as_ref()).is_some());
        // Another template altogether.
        let other = drift(Some(&template("old", Some("9"))), now.as_ref());
        assert_eq!(
            other.as_deref(),
            Some("launch template old version 9, its ASG launches launch template nodes version 4")
        );
        // Launch configurations, and a move from one to a template.
        let lc = |n: &str| LaunchSource::Configuration(n.into());
        let lc_now = current(&lc("lc-2"), &[]);
        assert_eq!(drift(Some(&lc("lc-2")), lc_now.as_ref()), None);
        assert!(drift(Some(&lc("lc-1")), lc_now.as_ref()).is_some());
        assert!(drift(Some(&lc("lc-2")), now.as_ref()).is_some());
        assert!(drift(Some(&template("nodes", Some("4"))), lc_now.as_ref()).is_some());
    }

    #[test]
    fn what_cannot_be_told_is_not_drift() {
        let now = current(
            &template("nodes", Some("$Latest")),
            &[versions("nodes", 4, 4)],
        );
        // Nothing recorded of the instance, or of its ASG.
        assert_eq!(drift(None, now.as_ref()), None);
        assert_eq!(drift(Some(&template("nodes", Some("1"))), None), None);
        // An instance version that is not a number.
        assert_eq!(
            drift(Some(&template("nodes", Some("$Latest"))), now.as_ref()),
            None
        );
        // Launched from a version newer than the `$Latest` last asked (a
        // replacement launched after `kops update cluster`, before the next
        // ask): the answer is stale, the instance is not drifted.
        assert_eq!(
            drift(Some(&template("nodes", Some("5"))), now.as_ref()),
            None
        );
        // With `$Default`, a newer instance is drift (the default was set back).
        let default = current(
            &template("nodes", Some("$Default")),
            &[versions("nodes", 5, 4)],
        );
        assert!(drift(Some(&template("nodes", Some("5"))), default.as_ref()).is_some());
        // Templates without a comparable identity.
        let anonymous = LaunchSource::Template {
            id: None,
            name: None,
            version: Some("1".into()),
        };
        assert_eq!(drift(Some(&anonymous), now.as_ref()), None);
    }

    #[test]
    fn drift_is_told_once_when_it_appears() {
        let node = |name: &str, drifted: Option<&str>| {
            let mut n: NodeStatus = serde_json::from_value(
                serde_json::json!({"name": name, "ready": true, "unschedulable": false}),
            )
            .expect("node status");
            n.drifted = drifted.map(str::to_string);
            n
        };
        let status = |nodes: Vec<NodeStatus>| NodeGroupStatus {
            drifted_nodes: Some(nodes.iter().filter(|n| n.drifted.is_some()).count() as i32),
            nodes,
            ..Default::default()
        };
        let clean = status(vec![node("a", None), node("b", None)]);
        let why = "launch template t version 1, its ASG launches version 2";
        let one = status(vec![node("a", Some(why)), node("b", None)]);
        let both = status(vec![node("a", Some(why)), node("b", Some(why))]);
        assert_eq!(drift_appeared(&clean, &clean), None);
        assert_eq!(
            drift_appeared(&clean, &one).as_deref(),
            Some(
                "node a is drifted (launch template t version 1, its ASG launches version 2); 1 drifted in all"
            )
        );
        assert_eq!(drift_appeared(&one, &one), None, "not again while it lasts");
        let more = drift_appeared(&one, &both).expect("b appears");
        assert!(more.starts_with("node b is drifted"), "{more}");
        assert!(more.ends_with("2 drifted in all"), "{more}");
        assert!(
            drift_appeared(&clean, &both)
                .expect("both")
                .starts_with("2 nodes are drifted, e.g. a")
        );
        // A drifted node replaced by a fresh one: nothing to tell.
        assert_eq!(drift_appeared(&one, &clean), None);
    }

    #[test]
    fn templates_are_asked_together_once_per_floor_and_a_missing_one_is_remembered() {
        let facts = TemplateFacts::default();
        let t0 = Instant::now();
        let wanted: BTreeSet<TemplateKey> =
            [TemplateKey::Name("a".into()), TemplateKey::Name("b".into())].into();
        let asked = facts.to_ask(&wanted, t0);
        assert_eq!(asked.len(), 2, "one call for the group's templates");
        let known = facts.remember(&asked, vec![versions("a", 2, 1)], t0, &wanted);
        assert_eq!(known, vec![versions("a", 2, 1)], "b was not found");
        assert!(facts.to_ask(&wanted, t0 + TEMPLATE_FLOOR / 2).is_empty());
        assert_eq!(facts.to_ask(&wanted, t0 + TEMPLATE_FLOOR).len(), 2);
        // A template not seen before is asked at once, with the others.
        let more: BTreeSet<TemplateKey> = wanted
            .iter()
            .cloned()
            .chain([TemplateKey::Name("c".into())])
            .collect();
        assert_eq!(facts.to_ask(&more, t0 + Duration::from_secs(1)).len(), 3);
        // Under a 2 s resync (the tests'), asked every other resync.
        let fast = TemplateFacts::for_resync(Duration::from_secs(2));
        fast.remember(&asked, vec![], t0, &wanted);
        assert!(fast.to_ask(&wanted, t0 + Duration::from_secs(2)).is_empty());
        assert_eq!(fast.to_ask(&wanted, t0 + Duration::from_secs(4)).len(), 2);
    }

    #[test]
    fn an_unreadable_template_keeps_what_was_known_is_asked_after_its_floor_and_says_why() {
        let facts = TemplateFacts::default();
        let t0 = Instant::now();
        let wanted: BTreeSet<TemplateKey> =
            [TemplateKey::Name("a".into()), TemplateKey::Name("b".into())].into();
        let asked = facts.to_ask(&wanted, t0);
        facts.remember(&asked, vec![versions("a", 2, 1)], t0, &wanted);
        assert_eq!(facts.unreadable(&wanted), None);
        // The IAM policy loses the action.
        let later = t0 + TEMPLATE_FLOOR;
        let asked = facts.to_ask(&wanted, later);
        let known = facts.failed(&asked, "UnauthorizedOperation", later, &wanted);
        assert_eq!(known, vec![versions("a", 2, 1)], "what was known is kept");
        assert_eq!(
            facts.unreadable(&wanted).as_deref(),
            Some("UnauthorizedOperation")
        );
        // Not asked again at every sync, and still unknown meanwhile.
        assert!(facts.to_ask(&wanted, later + TEMPLATE_FLOOR / 2).is_empty());
        assert!(facts.unreadable(&wanted).is_some());
        // Readable again: known.
        let again = later + TEMPLATE_FLOOR;
        let asked = facts.to_ask(&wanted, again);
        assert_eq!(asked.len(), 2);
        facts.remember(&asked, vec![versions("a", 3, 1)], again, &wanted);
        assert_eq!(facts.unreadable(&wanted), None);
    }

    #[test]
    fn while_drift_is_unknown_a_node_keeps_its_last_drift() {
        let node = |drifted: Option<&str>| {
            let mut n: NodeStatus = serde_json::from_value(
                serde_json::json!({"name": "a", "ready": true, "unschedulable": false}),
            )
            .expect("node status");
            n.drifted = drifted.map(str::to_string);
            n
        };
        let previous = [node(Some(
            "launch template t version 1, its ASG launches version 2",
        ))];
        assert_eq!(
            keep_drifted(node(None), Some("denied"), &previous),
            previous[0]
        );
        assert_eq!(
            keep_drifted(node(None), None, &previous),
            node(None),
            "known: not drifted"
        );
    }
}
