//! What the inventory keeps of each instance between syncs. An instance's
//! launch time, lifecycle, type and zone never change, so each instance is
//! described once; a steady sync describes no instance at all, whatever the
//! node count. Only the instances the inventory reads a changing fact of
//! (the EC2 state of an instance without a Node, which tells a late joiner
//! from one already leaving) are described again, at most every
//! [`STATE_FLOOR`].

use crate::cloud::InstanceDescription;
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How old the state of an instance without a Node may be.
pub const STATE_FLOOR: Duration = crate::cloud::cache::DESCRIBE_FLOOR;

/// How long an instance no sync asked for is kept (it left every group).
const FORGET_AFTER: Duration = Duration::from_secs(600);

struct Known {
    description: InstanceDescription,
    described: Instant,
    wanted: Instant,
}

/// The instances described so far, shared by every group's sync, and the
/// version numbers of the launch templates they are compared with.
#[derive(Default)]
pub struct InstanceFacts {
    known: Mutex<HashMap<String, Known>>,
    pub templates: super::drift::TemplateFacts,
}

impl InstanceFacts {
    /// Template versions kept until the next resync.
    pub fn for_resync(resync: Duration) -> Self {
        Self {
            known: Mutex::default(),
            templates: super::drift::TemplateFacts::for_resync(resync),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Known>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Of `wanted`, the ids to describe now: those never described, and
    /// those in `stateful` described longer than [`STATE_FLOOR`] ago.
    pub fn to_describe(
        &self,
        wanted: &BTreeSet<String>,
        stateful: &BTreeSet<String>,
        now: Instant,
    ) -> Vec<String> {
        let known = self.lock();
        wanted
            .iter()
            .filter(|id| match known.get(*id) {
                None => true,
                Some(k) => {
                    stateful.contains(*id)
                        && now.saturating_duration_since(k.described) >= STATE_FLOOR
                }
            })
            .cloned()
            .collect()
    }

    /// Keeps what was just described, and answers the `wanted` instances
    /// known (those that exist). Forgets what nobody asked for a while.
    pub fn remember(
        &self,
        described: Vec<InstanceDescription>,
        described_at: Instant,
        wanted: &BTreeSet<String>,
        now: Instant,
    ) -> Vec<InstanceDescription> {
        let mut known = self.lock();
        for d in described {
            known.insert(
                d.instance_id.clone(),
                Known {
                    description: d,
                    described: described_at,
                    wanted: now,
                },
            );
        }
        known.retain(|_, k| now.saturating_duration_since(k.wanted) < FORGET_AFTER);
        wanted
            .iter()
            .filter_map(|id| {
                let k = known.get_mut(id)?;
                k.wanted = now;
                Some(k.description.clone())
            })
            .collect()
    }

    /// How many instances are kept (for tests and the memory report).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::Lifecycle;

    fn described(id: &str) -> InstanceDescription {
        InstanceDescription {
            instance_id: id.into(),
            launch_time: None,
            availability_zone: Some("zone-a".into()),
            instance_type: Some("m5.large".into()),
            lifecycle: Lifecycle::Spot,
            state: "running".into(),
            private_dns_name: None,
            tags: Default::default(),
        }
    }

    fn ids(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_instance_is_described_once_unless_its_state_is_read() {
        let facts = InstanceFacts::default();
        let t0 = Instant::now();
        let wanted = ids(&["i-1", "i-2"]);
        assert_eq!(facts.to_describe(&wanted, &ids(&[]), t0), ["i-1", "i-2"]);
        facts.remember(vec![described("i-1"), described("i-2")], t0, &wanted, t0);
        // Joined instances: never again.
        let later = t0 + Duration::from_secs(3600);
        assert!(facts.to_describe(&wanted, &ids(&[]), later).is_empty());
        // One without a Node: again once its state is older than the floor.
        let no_node = ids(&["i-2"]);
        assert!(
            facts
                .to_describe(&wanted, &no_node, t0 + Duration::from_secs(1))
                .is_empty()
        );
        assert_eq!(
            facts.to_describe(&wanted, &no_node, t0 + STATE_FLOOR),
            ["i-2"]
        );
        // A new instance joins the wanted set: only it is described.
        let more = ids(&["i-1", "i-2", "i-3"]);
        assert_eq!(facts.to_describe(&more, &ids(&[]), later), ["i-3"]);
    }

    #[test]
    fn answers_only_what_is_wanted_and_forgets_what_nobody_asks_for() {
        let facts = InstanceFacts::default();
        let t0 = Instant::now();
        let all = ids(&["i-1", "i-2"]);
        let answer = facts.remember(vec![described("i-1"), described("i-2")], t0, &all, t0);
        assert_eq!(answer.len(), 2);
        // A missing instance is simply absent from the answer.
        let answer = facts.remember(vec![], t0, &ids(&["i-1", "i-9"]), t0);
        assert_eq!(answer, vec![described("i-1")]);
        // i-2 is asked by nobody for longer than FORGET_AFTER: forgotten.
        let later = t0 + FORGET_AFTER;
        facts.remember(
            vec![],
            later,
            &ids(&["i-1"]),
            later - Duration::from_secs(1),
        );
        assert_eq!(facts.len(), 2, "within the window, kept");
        facts.remember(vec![], later, &ids(&["i-1"]), later);
        assert_eq!(facts.len(), 1);
    }
}
