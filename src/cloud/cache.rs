//! One description of each ASG, shared by every controller of the process
//! for a short window, and the newest launch activity asked only while its
//! answer can change a decision. AWS's Describe rate limits are per account,
//! shared with every other tool in it: the controllers of one group must
//! not each describe the same ASGs a few milliseconds apart.
//!
//! - A description younger than the floor is served from memory. Our own
//!   mutation of an ASG (a desired count, a termination, a completed
//!   lifecycle action) forgets it at once, so the next look after acting is
//!   always fresh. AWS itself answers describes seconds behind, so a view a
//!   few seconds old is no staler than the controllers already plan with.
//! - An ASG below its desired count gets its newest launch activity asked
//!   (one more call) only during its launch grace: after it, the ASG counts
//!   as not launching whatever the activity says, and the last answer is
//!   kept for the status's text.

use super::{
    AsgDescription, Cloud, HookCall, HookCallKind, InstanceDescription, LAUNCH, LAUNCH_GRACE,
    TemplateKey, TemplateVersions,
};
use crate::Result;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long an ASG description is shared: AWS-observing reconciles of one
/// group, however often they requeue, describe its ASGs at most this often
/// (except right after our own mutation).
pub const DESCRIBE_FLOOR: Duration = Duration::from_secs(5);

/// How often, at most, an ASG's launch activities are asked during its
/// launch grace. AWS retries a failed launch at about this pace.
pub const ACTIVITY_FLOOR: Duration = Duration::from_secs(10);

/// For this long after an ASG is first seen behind, its description and
/// launch activities are asked every [`FAST_FLOOR`]: a launch into an AZ out
/// of capacity fails a few seconds after the loss, and the raise elsewhere
/// should follow within seconds, not at the next 10 s look. Bounded, so a
/// shortage costs a handful of calls more (docs/operations.md's budget: at most 20
/// calls a minute during an operation).
pub const FAST_WINDOW: Duration = Duration::from_secs(12);
/// The floor of both kinds of look during the [`FAST_WINDOW`]: under the
/// replenisher's 2 s look while it waits, so each of its looks is fresh.
pub const FAST_FLOOR: Duration = Duration::from_millis(1500);

/// The floor while the only waiter on an ASG waits on the cluster (a drain,
/// a replacement's Node to be Ready; see [`Cloud::quiet`]): nothing it waits
/// for is in AWS, and every mutation is made on a description asked at that
/// moment anyway. A Node Ready on an instance still Pending here asks again
/// at once; a newly behind ASG keeps its fast window. Docs/operations.md:
/// at most 20 calls a minute during an operation, where the 5 s floor alone
/// spent 12 on a refresh waiting 90 s for each node.
pub const QUIET_FLOOR: Duration = Duration::from_secs(15);

/// How old a description may be and still serve as the fresh read a
/// mutation is planned on ([`Cloud::forget_older_than`]): one asked by
/// the same reconcile moments before (or by another controller of the
/// process), after our own last mutation of the ASG. AWS answers
/// describes about this far behind anyway; asking again within it was
/// half of a refresh's calls.
pub const FRESH_ENOUGH: Duration = Duration::from_secs(2);

/// How long a quiet hint holds unless renewed: a waiter that stops looking
/// (killed, or its group deleted) does not keep the ASGs quiet.
pub const QUIET_SPELL: Duration = Duration::from_secs(30);

/// Whether an ASG first seen behind at `behind_since` is in its fast window.
fn in_fast_window(behind_since: Instant, now: Instant) -> bool {
    now.saturating_duration_since(behind_since) < FAST_WINDOW
}

/// What to do about an ASG's newest launch activity on a fresh describe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchCheck {
    /// Not behind: nothing to ask, nothing to remember.
    Forget,
    /// Behind, within its grace, and not asked within the activity floor.
    Ask,
    /// The last answer stands (asked recently, or past the grace, where it
    /// cannot change a decision).
    Keep,
}

/// What is remembered of an ASG seen behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchMemo {
    /// First seen behind (by this process).
    pub behind_since: Instant,
    /// When the activities were last asked, and the answer.
    pub asked: Option<Instant>,
    pub failure: Option<String>,
}

/// Pure: whether a fresh describe of `asg` asks its launch activities.
pub fn launch_check(asg: &AsgDescription, memo: Option<&LaunchMemo>, now: Instant) -> LaunchCheck {
    let behind = (asg.active_instances() as i32) < asg.desired;
    // Launch suspended: not launching whatever the activity says.
    if !behind || asg.is_suspended(LAUNCH) {
        return LaunchCheck::Forget;
    }
    let Some(memo) = memo else {
        return LaunchCheck::Ask;
    };
    let within_grace = now.saturating_duration_since(memo.behind_since) < LAUNCH_GRACE;
    let floor = match in_fast_window(memo.behind_since, now) {
        true => FAST_FLOOR,
        false => ACTIVITY_FLOOR,
    };
    let asked_lately = memo
        .asked
        .is_some_and(|at| now.saturating_duration_since(at) < floor);
    if within_grace && !asked_lately {
        LaunchCheck::Ask
    } else {
        LaunchCheck::Keep
    }
}

struct Entry {
    described: Instant,
    /// None: no such ASG (remembered too, for the same window).
    asg: Option<AsgDescription>,
}

#[derive(Default)]
struct State {
    asgs: HashMap<String, Entry>,
    launches: HashMap<String, LaunchMemo>,
    /// Bumped by every forgetting: a describe that was in flight across a
    /// mutation must not store what it saw before it.
    generation: u64,
    /// ASGs whose only waiter waits on the cluster, until when.
    quiet: HashMap<String, Instant>,
    /// Instances whose description was asked again because their Node was
    /// Ready while it said Pending: once each, oldest forgotten first.
    rechecked: std::collections::VecDeque<String>,
}

/// Instances remembered as rechecked (a few days of launches at most).
const RECHECKED_KEPT: usize = 4096;

/// A [`Cloud`] that shares ASG descriptions for `floor` and asks launch
/// activities by [`launch_check`]; everything else passes through.
pub struct CachedCloud {
    inner: Arc<dyn Cloud>,
    floor: Duration,
    state: Mutex<State>,
    /// One describe at a time: a second caller waits and is served what the
    /// first one fetched, instead of asking the same thing in parallel.
    describing: tokio::sync::Mutex<()>,
}

impl CachedCloud {
    pub fn new(inner: Arc<dyn Cloud>, floor: Duration) -> Self {
        Self {
            inner,
            floor,
            state: Mutex::new(State::default()),
            describing: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets the named ASGs' descriptions (all of them when `asgs` is
    /// empty): what we just changed is described again on the next look.
    fn forget_names(&self, asgs: &[&str]) {
        let mut state = self.lock();
        state.generation += 1;
        if asgs.is_empty() {
            state.asgs.clear();
            state.quiet.clear();
        } else {
            for name in asgs {
                state.asgs.remove(*name);
                state.quiet.remove(*name);
            }
        }
    }

    /// The ASGs a cached description lists `instance_id` in.
    fn asgs_holding(&self, instance_id: &str) -> Vec<String> {
        self.lock()
            .asgs
            .iter()
            .filter(|(_, e)| {
                e.asg
                    .as_ref()
                    .is_some_and(|a| a.instances.iter().any(|i| i.instance_id == instance_id))
            })
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Fills `recent_failure` of fresh descriptions, asking AWS only where
    /// [`launch_check`] says so.
    async fn judge_launches(&self, fresh: &mut [AsgDescription]) -> Result<()> {
        for asg in fresh.iter_mut() {
            let now = Instant::now();
            let memo = self.lock().launches.get(&asg.name).cloned();
            match launch_check(asg, memo.as_ref(), now) {
                LaunchCheck::Forget => {
                    self.lock().launches.remove(&asg.name);
                    asg.recent_failure = None;
                }
                LaunchCheck::Keep => {
                    asg.recent_failure = memo.and_then(|m| m.failure);
                }
                LaunchCheck::Ask => {
                    let failure = self.inner.launch_failure(&asg.name).await?;
                    let behind_since = memo.map_or(now, |m| m.behind_since);
                    self.lock().launches.insert(
                        asg.name.clone(),
                        LaunchMemo {
                            behind_since,
                            asked: Some(now),
                            failure: failure.clone(),
                        },
                    );
                    asg.recent_failure = failure;
                }
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Cloud for CachedCloud {
    async fn describe_groups(&self, names: &[String]) -> Result<Vec<AsgDescription>> {
        let _one_at_a_time = self.describing.lock().await;
        let (stale, generation) = {
            let state = self.lock();
            let now = Instant::now();
            let any_stale = names.iter().any(|n| {
                // Newly behind: looked at more often for a few seconds.
                let quiet = state.quiet.get(n).is_some_and(|until| *until > now);
                let floor = match state.launches.get(n) {
                    Some(m) if in_fast_window(m.behind_since, now) => self.floor.min(FAST_FLOOR),
                    _ if quiet && !self.floor.is_zero() => self.floor.max(QUIET_FLOOR),
                    _ => self.floor,
                };
                state
                    .asgs
                    .get(n)
                    .is_none_or(|e| now.saturating_duration_since(e.described) >= floor)
            });
            // One call describes them all: all are described again together,
            // so their ages stay aligned (a call per ASG otherwise, after a
            // termination forgets one of them).
            let stale = if any_stale { names.to_vec() } else { vec![] };
            (stale, state.generation)
        };
        let mut fetched: HashMap<String, AsgDescription> = HashMap::new();
        if !stale.is_empty() {
            let described_at = Instant::now();
            let mut fresh = self.inner.describe_groups(&stale).await?;
            self.judge_launches(&mut fresh).await?;
            fetched = fresh.into_iter().map(|a| (a.name.clone(), a)).collect();
            let mut state = self.lock();
            if state.generation == generation {
                for name in &stale {
                    state.asgs.insert(
                        name.clone(),
                        Entry {
                            described: described_at,
                            asg: fetched.get(name).cloned(),
                        },
                    );
                }
            }
        }
        let state = self.lock();
        Ok(names
            .iter()
            .filter_map(|n| match fetched.get(n) {
                Some(a) => Some(a.clone()),
                None => state.asgs.get(n).and_then(|e| e.asg.clone()),
            })
            .collect())
    }

    fn forget(&self, asgs: &[String]) {
        let names: Vec<&str> = asgs.iter().map(String::as_str).collect();
        if !names.is_empty() {
            self.forget_names(&names);
        }
    }

    fn forget_older_than(&self, asgs: &[String], age: Duration) {
        let now = Instant::now();
        let stale = {
            let state = self.lock();
            asgs.iter().any(|n| {
                state
                    .asgs
                    .get(n)
                    .is_none_or(|e| now.saturating_duration_since(e.described) >= age)
            })
        };
        // All or none: they are described together.
        if stale {
            self.forget(asgs);
        }
    }

    fn quiet(&self, asgs: &[String], quiet: bool) {
        let mut state = self.lock();
        let until = Instant::now() + QUIET_SPELL;
        for name in asgs {
            match quiet {
                true => state.quiet.insert(name.clone(), until),
                false => state.quiet.remove(name),
            };
        }
    }

    /// Once per instance, so an instance held Pending for long (a launch
    /// lifecycle hook) costs one describe more, not one per look.
    fn recheck_pending(&self, instances: &[String]) -> bool {
        let mut state = self.lock();
        let new: Vec<String> = instances
            .iter()
            .filter(|i| !state.rechecked.contains(i))
            .cloned()
            .collect();
        for id in &new {
            if state.rechecked.len() >= RECHECKED_KEPT {
                state.rechecked.pop_front();
            }
            state.rechecked.push_back(id.clone());
        }
        !new.is_empty()
    }

    async fn launch_failure(&self, asg: &str) -> Result<Option<String>> {
        self.inner.launch_failure(asg).await
    }

    async fn describe_instances(&self, ids: &[String]) -> Result<Vec<InstanceDescription>> {
        self.inner.describe_instances(ids).await
    }

    async fn template_versions(&self, keys: &[TemplateKey]) -> Result<Vec<TemplateVersions>> {
        self.inner.template_versions(keys).await
    }

    async fn set_desired_capacity(&self, asg: &str, desired: i32) -> Result<()> {
        let result = self.inner.set_desired_capacity(asg, desired).await;
        // Forgotten whatever the result: a timed-out call may have landed.
        self.forget_names(&[asg]);
        if result.is_ok() {
            // A raise's launch cannot have failed yet: its activities are
            // first asked a fast floor later (when AWS has usually listed
            // the instance Pending, and there is nothing to ask), not by
            // the look that follows at once. An ASG already behind keeps
            // what it knows.
            let now = Instant::now();
            self.lock()
                .launches
                .entry(asg.to_string())
                .or_insert(LaunchMemo {
                    behind_since: now,
                    asked: Some(now),
                    failure: None,
                });
        }
        result
    }

    async fn terminate_in_group(&self, instance_id: &str, decrement: bool) -> Result<()> {
        let holding = self.asgs_holding(instance_id);
        let result = self.inner.terminate_in_group(instance_id, decrement).await;
        let holding: Vec<&str> = holding.iter().map(String::as_str).collect();
        // Not in any cached ASG: forget them all rather than guess.
        self.forget_names(&holding);
        result
    }

    async fn terminate_hooks(&self, asg: &str) -> Result<Vec<super::LifecycleHook>> {
        self.inner.terminate_hooks(asg).await
    }

    async fn warm_pool(&self, asg: &str) -> Result<Option<super::WarmPool>> {
        self.inner.warm_pool(asg).await
    }

    async fn spot_prices(&self, types: &[String]) -> Result<Vec<super::prices::SpotPrice>> {
        self.inner.spot_prices(types).await
    }

    async fn on_demand_price(&self, instance_type: &str) -> Result<Option<f64>> {
        self.inner.on_demand_price(instance_type).await
    }

    fn price_list(&self) -> super::prices::PriceList {
        self.inner.price_list()
    }

    async fn lifecycle_action(&self, call: &HookCall<'_>, step: HookCallKind) -> Result<bool> {
        let result = self.inner.lifecycle_action(call, step).await;
        if step == HookCallKind::Continue {
            // The instance leaves its ASG now.
            self.forget_names(&[call.asg]);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::fake::FakeCloud;
    use chrono::Utc;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    fn cached(fake: &FakeCloud, floor: Duration) -> CachedCloud {
        CachedCloud::new(Arc::new(fake.clone()), floor)
    }

    /// What a controller sees describing `asgs`.
    async fn look(cloud: &CachedCloud, asgs: &[&str]) -> Vec<AsgDescription> {
        cloud.describe_groups(&names(asgs)).await.expect("describe")
    }

    #[tokio::test]
    async fn controllers_share_one_description_within_the_floor() {
        let fake = FakeCloud::new();
        fake.add_group("a", "zone-a", 1, 10, Utc::now());
        fake.add_group("b", "zone-b", 1, 10, Utc::now());
        let cloud = cached(&fake, Duration::from_secs(60));
        let first = look(&cloud, &["a", "b", "missing"]).await;
        let again = look(&cloud, &["b", "a", "missing"]).await;
        assert_eq!(
            fake.calls("describe_groups"),
            1,
            "the second look is served from memory"
        );
        assert_eq!(again.len(), 2);
        assert_eq!(again[0], first[1], "in the order asked");
        // A name not cached yet: one call, for every name asked.
        look(&cloud, &["a", "c"]).await;
        assert_eq!(fake.calls("describe_groups"), 2);
        look(&cloud, &["c"]).await;
        assert_eq!(fake.calls("describe_groups"), 2, "remembered as missing");
    }

    #[tokio::test]
    async fn a_quiet_asg_is_described_at_the_quiet_floor_until_a_mutation_or_the_hint_ends() {
        let fake = FakeCloud::new();
        fake.add_group("a", "zone-a", 1, 10, Utc::now());
        fake.add_group("b", "zone-b", 1, 10, Utc::now());
        let floor = Duration::from_millis(50);
        let cloud = cached(&fake, floor);
        let a = names(&["a"]);
        look(&cloud, &["a"]).await;
        look(&cloud, &["b"]).await;
        cloud.quiet(&a, true);
        tokio::time::sleep(floor * 2).await;
        look(&cloud, &["a"]).await;
        assert_eq!(
            fake.calls("describe_groups"),
            2,
            "quiet: past the floor, shared"
        );
        look(&cloud, &["b"]).await;
        assert_eq!(
            fake.calls("describe_groups"),
            3,
            "not quiet: past the floor, asked"
        );
        // Our own mutation ends it: the look after acting is fresh, and so
        // are the next ones past the floor.
        cloud.set_desired_capacity("a", 2).await.expect("raise");
        look(&cloud, &["a"]).await;
        assert_eq!(fake.calls("describe_groups"), 4);
        tokio::time::sleep(floor * 2).await;
        look(&cloud, &["a"]).await;
        assert_eq!(fake.calls("describe_groups"), 5);
        // The hint taken back: the usual floor again.
        cloud.quiet(&a, true);
        cloud.quiet(&a, false);
        tokio::time::sleep(floor * 2).await;
        look(&cloud, &["a"]).await;
        assert_eq!(fake.calls("describe_groups"), 6);
    }

    #[tokio::test]
    async fn a_zero_floor_describes_every_time() {
        let fake = FakeCloud::new();
        fake.add_group("a", "zone-a", 1, 10, Utc::now());
        let cloud = cached(&fake, Duration::ZERO);
        for _ in 0..3 {
            look(&cloud, &["a"]).await;
        }
        assert_eq!(fake.calls("describe_groups"), 3);
    }

    #[tokio::test]
    async fn our_own_mutation_makes_the_next_look_fresh() {
        let fake = FakeCloud::new();
        let ids = fake.add_group("a", "zone-a", 2, 10, Utc::now());
        fake.add_group("b", "zone-b", 1, 10, Utc::now());
        let cloud = cached(&fake, Duration::from_secs(60));
        look(&cloud, &["a", "b"]).await;

        cloud.set_desired_capacity("a", 3).await.expect("raise");
        let seen = look(&cloud, &["a", "b"]).await;
        assert_eq!(seen[0].desired, 3, "the raise is seen at once");
        assert_eq!(fake.calls("describe_groups"), 2);

        cloud
            .terminate_in_group(&ids[0], true)
            .await
            .expect("terminate");
        let seen = look(&cloud, &["a", "b"]).await;
        assert!(seen[0].instances.iter().all(|i| i.instance_id != ids[0]));
        assert_eq!(
            fake.calls("describe_groups"),
            3,
            "one call again after the termination forgot the holding ASG"
        );

        // A failed mutation may still have landed: forgotten all the same.
        fake.fail_next("set_desired_capacity", "timed out");
        assert!(cloud.set_desired_capacity("b", 2).await.is_err());
        look(&cloud, &["a", "b"]).await;
        assert_eq!(fake.calls("describe_groups"), 4);
    }

    #[tokio::test]
    async fn forgetting_makes_the_next_look_ask_aws() {
        // A change made outside (here: desired) is not in a shared
        // description; a plan about to act forgets it first.
        let fake = FakeCloud::new();
        fake.add_group("a", "zone-a", 1, 10, Utc::now());
        let cloud = cached(&fake, Duration::from_secs(60));
        let a = names(&["a"]);
        look(&cloud, &["a"]).await;
        fake.set_desired_without_launch("a", 3);
        let shared = look(&cloud, &["a"]).await;
        assert_eq!(shared[0].desired, 1, "shared: the outside change unseen");
        cloud.forget(&a);
        let fresh = look(&cloud, &["a"]).await;
        assert_eq!(fresh[0].desired, 3);
        assert_eq!(fake.calls("describe_groups"), 2);
        // Forgetting nothing forgets nothing.
        cloud.forget(&[]);
        look(&cloud, &["a"]).await;
        assert_eq!(fake.calls("describe_groups"), 2);
    }

    /// ASG "a" at `desired` with `active` instances in service.
    fn behind(desired: i32, active: usize) -> AsgDescription {
        let ids: Vec<String> = (0..active).map(|i| format!("i-{i}")).collect();
        let members: Vec<(&str, &str)> = ids.iter().map(|id| (id.as_str(), "InService")).collect();
        AsgDescription {
            desired,
            ..crate::controllers::group_view::tests::fresh("a", &members)
        }
    }

    #[test]
    fn launch_activities_are_asked_only_while_they_can_change_a_decision() {
        let t0 = Instant::now();
        let memo = |asked_ago: u64| LaunchMemo {
            behind_since: t0,
            asked: Some(t0 + Duration::from_secs(asked_ago)),
            failure: Some("no capacity".into()),
        };
        // At its count: nothing to ask.
        assert_eq!(launch_check(&behind(2, 2), None, t0), LaunchCheck::Forget);
        // Launch suspended: not launching, whatever the activity says.
        let mut suspended = behind(2, 1);
        suspended.suspended_processes = vec![LAUNCH.into()];
        assert_eq!(launch_check(&suspended, None, t0), LaunchCheck::Forget);
        // Newly behind: ask.
        assert_eq!(launch_check(&behind(2, 1), None, t0), LaunchCheck::Ask);
        // In its first seconds behind: again once the fast floor has passed.
        let at = |s: u64| t0 + Duration::from_secs(s);
        let ms = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(
            launch_check(&behind(2, 1), Some(&memo(0)), ms(1000)),
            LaunchCheck::Keep
        );
        assert_eq!(
            launch_check(&behind(2, 1), Some(&memo(0)), ms(1600)),
            LaunchCheck::Ask
        );
        // Within the grace, past the fast window: once the activity floor
        // has passed.
        assert_eq!(
            launch_check(&behind(2, 1), Some(&memo(12)), at(17)),
            LaunchCheck::Keep
        );
        assert_eq!(
            launch_check(&behind(2, 1), Some(&memo(12)), at(22)),
            LaunchCheck::Ask
        );
        // Past the grace: never again while it stays behind.
        assert_eq!(
            launch_check(&behind(2, 1), Some(&memo(50)), at(60)),
            LaunchCheck::Keep
        );
        assert_eq!(
            launch_check(&behind(2, 1), Some(&memo(50)), at(3600)),
            LaunchCheck::Keep
        );
    }

    #[tokio::test]
    async fn a_newly_behind_asg_is_described_again_after_the_fast_floor_only_in_its_window() {
        let fake = FakeCloud::new();
        fake.add_group("a", "zone-a", 1, 10, Utc::now());
        fake.set_desired_without_launch("a", 2);
        let cloud = cached(&fake, DESCRIBE_FLOOR);
        look(&cloud, &["a"]).await;
        assert_eq!(fake.calls("describe_groups"), 1);
        let age = |cloud: &CachedCloud, described_ago: Duration, behind_for: Duration| {
            let now = Instant::now();
            let mut state = cloud.lock();
            if let Some(e) = state.asgs.get_mut("a") {
                e.described = now
                    .checked_sub(described_ago)
                    .expect("a clock that has run");
            }
            if let Some(m) = state.launches.get_mut("a") {
                m.behind_since = now.checked_sub(behind_for).expect("a clock that has run");
            }
        };
        // Described 1.6 s ago, behind for 3 s: in its fast window, fresh.
        age(&cloud, Duration::from_millis(1600), Duration::from_secs(3));
        look(&cloud, &["a"]).await;
        assert_eq!(fake.calls("describe_groups"), 2);
        // Described 1.6 s ago, behind for 13 s: the usual floor holds.
        age(&cloud, Duration::from_millis(1600), Duration::from_secs(13));
        look(&cloud, &["a"]).await;
        assert_eq!(fake.calls("describe_groups"), 2);
        // Not behind: the usual floor, whatever the memo said.
        let fake = FakeCloud::new();
        fake.add_group("a", "zone-a", 1, 10, Utc::now());
        let cloud = cached(&fake, DESCRIBE_FLOOR);
        look(&cloud, &["a"]).await;
        age(&cloud, Duration::from_millis(1600), Duration::ZERO);
        look(&cloud, &["a"]).await;
        assert_eq!(fake.calls("describe_groups"), 1);
    }

    #[tokio::test]
    async fn a_description_asked_moments_ago_serves_as_the_fresh_read() {
        let fake = FakeCloud::new();
        fake.add_group("a", "zone-a", 1, 10, Utc::now());
        fake.add_group("b", "zone-b", 1, 10, Utc::now());
        let cloud = cached(&fake, QUIET_FLOOR);
        let both = names(&["a", "b"]);
        look(&cloud, &["a", "b"]).await;
        cloud.forget_older_than(&both, FRESH_ENOUGH);
        look(&cloud, &["a", "b"]).await;
        assert_eq!(fake.calls("describe_groups"), 1, "asked moments ago");
        // One of them older: both asked again, together.
        let old = Instant::now()
            .checked_sub(FRESH_ENOUGH)
            .expect("a clock that has run");
        if let Some(e) = cloud.lock().asgs.get_mut("b") {
            e.described = old;
        }
        cloud.forget_older_than(&both, FRESH_ENOUGH);
        look(&cloud, &["a", "b"]).await;
        assert_eq!(fake.calls("describe_groups"), 2);
        // Our own mutation: never served from before it.
        cloud.set_desired_capacity("a", 2).await.expect("raise");
        cloud.forget_older_than(&both, FRESH_ENOUGH);
        let seen = look(&cloud, &["a", "b"]).await;
        assert_eq!(seen[0].desired, 2);
        assert_eq!(fake.calls("describe_groups"), 3);
    }

    #[tokio::test]
    async fn our_own_raise_is_not_asked_about_by_the_look_right_after_it() {
        let fake = FakeCloud::new();
        fake.add_group("a", "zone-a", 1, 10, Utc::now());
        let cloud = cached(&fake, Duration::ZERO);
        cloud.set_desired_capacity("a", 2).await.expect("raise");
        // AWS has not listed the new instance yet.
        fake.set_desired_without_launch("a", 3);
        look(&cloud, &["a"]).await;
        assert_eq!(
            fake.calls("launch_failure"),
            0,
            "nothing can have failed yet"
        );
        // A fast floor later, still behind: asked.
        if let Some(m) = cloud.lock().launches.get_mut("a") {
            m.asked = Instant::now().checked_sub(FAST_FLOOR);
        }
        look(&cloud, &["a"]).await;
        assert_eq!(fake.calls("launch_failure"), 1);
        // An ASG already behind with a failure keeps it across our raise.
        fake.set_recent_failure("a", Some("InsufficientInstanceCapacity"));
        if let Some(m) = cloud.lock().launches.get_mut("a") {
            m.asked = Instant::now().checked_sub(FAST_FLOOR);
        }
        look(&cloud, &["a"]).await;
        cloud.set_desired_capacity("a", 4).await.expect("raise");
        fake.set_desired_without_launch("a", 5);
        let seen = look(&cloud, &["a"]).await;
        assert_eq!(
            seen[0].recent_failure.as_deref(),
            Some("InsufficientInstanceCapacity")
        );
    }

    #[tokio::test]
    async fn a_failure_is_asked_during_the_grace_and_kept_after_it() {
        let fake = FakeCloud::new();
        fake.add_group("a", "zone-a", 1, 10, Utc::now());
        fake.set_desired_without_launch("a", 2);
        fake.set_recent_failure("a", Some("InsufficientInstanceCapacity"));
        let cloud = cached(&fake, Duration::ZERO);
        let seen = look(&cloud, &["a"]).await;
        assert_eq!(
            seen[0].recent_failure.as_deref(),
            Some("InsufficientInstanceCapacity")
        );
        assert_eq!(fake.calls("launch_failure"), 1);
        // Within the activity floor: the answer is reused.
        let seen = look(&cloud, &["a"]).await;
        assert_eq!(
            seen[0].recent_failure.as_deref(),
            Some("InsufficientInstanceCapacity")
        );
        assert_eq!(fake.calls("launch_failure"), 1);
        // Past the grace: kept, never asked again.
        let long_ago = Instant::now()
            .checked_sub(LAUNCH_GRACE)
            .expect("a clock that has run for a minute");
        cloud.lock().launches.insert(
            "a".into(),
            LaunchMemo {
                behind_since: long_ago,
                asked: Some(long_ago),
                failure: Some("InsufficientInstanceCapacity".into()),
            },
        );
        let seen = look(&cloud, &["a"]).await;
        assert_eq!(
            seen[0].recent_failure.as_deref(),
            Some("InsufficientInstanceCapacity")
        );
        assert_eq!(fake.calls("launch_failure"), 1);
        // Back at its count: forgotten.
        fake.set_desired_without_launch("a", 1);
        let seen = look(&cloud, &["a"]).await;
        assert_eq!(seen[0].recent_failure, None);
        assert!(cloud.lock().launches.is_empty());
    }
}
