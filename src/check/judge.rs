//! Pure: what each of `check`'s observations says, as one finding each.

use crate::Error;
use crate::cloud::AsgDescription;
use crate::controllers::inventory::competing::{self, Others};
use crate::controllers::inventory::{handlers, room};
use crate::crd::NodeGroup;
use crate::crd::condition::ConditionStatus;
use kube::ResourceExt;
use serde::Serialize;
use std::collections::BTreeSet;

/// How much a finding matters: only `Fail` blocks operation (and makes
/// `check` exit non-zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    /// Said, not judged: what `check` cannot ask about.
    Note,
    Warn,
    Fail,
}

impl Level {
    pub fn label(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Note => "note",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        }
    }
}

/// One line of the answer: what was checked, and what it says (with what
/// to do, unless it is ok).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub level: Level,
    pub check: String,
    pub said: String,
}

impl Finding {
    pub fn new(level: Level, check: impl Into<String>, said: impl Into<String>) -> Finding {
        Finding {
            level,
            check: check.into(),
            said: said.into(),
        }
    }
}

/// The IAM actions of the manager's policy that `check` asks AWS about,
/// each through a read that needs it (its answer discarded).
pub const PROBED: [&str; 9] = [
    "autoscaling:DescribeAutoScalingGroups",
    "autoscaling:DescribeLifecycleHooks",
    "autoscaling:DescribeScalingActivities",
    "autoscaling:DescribeWarmPool",
    "ec2:DescribeInstances",
    "ec2:DescribeLaunchTemplates",
    "ec2:DescribeSpotPriceHistory",
    "pricing:GetProducts",
    "sqs:GetQueueAttributes",
];

/// The policy's actions `check` cannot ask about without acting: Auto
/// Scaling's calls take no DryRun (EC2's do, and the manager makes none),
/// and a message received or deleted is taken from the handler reading it.
pub const NOT_PROBED: [&str; 6] = [
    "autoscaling:CompleteLifecycleAction",
    "autoscaling:RecordLifecycleActionHeartbeat",
    "autoscaling:SetDesiredCapacity",
    "autoscaling:TerminateInstanceInAutoScalingGroup",
    "sqs:DeleteMessage",
    "sqs:ReceiveMessage",
];

/// Whether AWS's error code says IAM refused the caller: EC2's
/// `UnauthorizedOperation`, Auto Scaling's and SQS's `AccessDenied`, the
/// JSON services' `AccessDeniedException`.
fn refused_by_iam(code: &str) -> bool {
    code.contains("AccessDenied") || code.starts_with("Unauthorized")
}

/// The finding of one probe of `action`.
pub fn probe<T>(action: &str, answer: &crate::Result<T>) -> Finding {
    let check = format!("aws {action}");
    match answer {
        Ok(_) => Finding::new(Level::Ok, check, "allowed"),
        Err(Error::Aws {
            code: Some(code),
            message,
            ..
        }) if refused_by_iam(code) => Finding::new(
            Level::Fail,
            check,
            format!(
                "refused ({code}: {message}): the manager's role lacks it; grant it as manifests/iam-policy.json does (docs/kops.md, IAM), then check again"
            ),
        ),
        Err(e) => Finding::new(
            Level::Fail,
            check,
            format!(
                "could not be asked: {e}; check the region, the endpoint and the credentials the manager runs with"
            ),
        ),
    }
}

/// The actions `check` cannot ask about, named as such.
pub fn not_probed() -> Finding {
    Finding::new(
        Level::Note,
        "aws mutations",
        format!(
            "not asked, since only acting would tell (Auto Scaling takes no DryRun; a message received or deleted is taken from the handler): {}; the manager's first refusal of one is reported where it happens",
            NOT_PROBED.join(", ")
        ),
    )
}

/// The finding of a probe not made for want of something to ask about.
pub fn not_asked(action: &str, why: &str) -> Finding {
    Finding::new(
        Level::Warn,
        format!("aws {action}"),
        format!("not checked: {why}"),
    )
}

/// What the group's ASGs say: each one it names found (Karpenter's
/// instance groups named as such), room above its count for what launches
/// ahead (workers), and nothing competing for them.
pub fn group(group: &NodeGroup, described: &[AsgDescription], others: Others<'_>) -> Vec<Finding> {
    let check = check_of(group);
    let found: BTreeSet<&str> = described.iter().map(|a| a.name.as_str()).collect();
    let names = group.spec.asg_names();
    let missing: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| !found.contains(n))
        .collect();
    let competing = competing::all_competing(group, (described, &[]), others);
    let mut out = vec![];
    if !missing.is_empty() {
        let region = group
            .spec
            .region
            .as_deref()
            .unwrap_or("the manager's region");
        out.push(Finding::new(
            Level::Fail,
            check.clone(),
            format!(
                "ASG(s) not found in {region}: {}; the group cannot launch or replace there: name the ASGs kops made (<instance group>.<cluster>: kops get ig, aws autoscaling describe-auto-scaling-groups), or set spec.region",
                missing.join(", ")
            ),
        ));
    }
    if let Some((ConditionStatus::True, _, message)) = room::room(group, described) {
        out.push(Finding::new(Level::Warn, check.clone(), message));
    }
    out.extend(
        competing
            .into_iter()
            .map(|c| Finding::new(Level::Warn, check.clone(), c)),
    );
    if out.is_empty() {
        // Masters are replaced in place, never ahead: no room to judge.
        let room = match group.spec.role {
            crate::crd::Role::Worker => "room above the count, ",
            crate::crd::Role::Master => "",
        };
        out.push(Finding::new(
            Level::Ok,
            check,
            format!(
                "{} ASG(s) found, {room}nothing competing for them",
                names.len()
            ),
        ));
    }
    out
}

/// Each namespace's masters, where their count lets no master go without
/// stopping the API (one or two, `ControlPlane::outage`): said, with what
/// the manager then refuses and the setting that allows it. Not a
/// failure: a choice the user makes knowingly.
pub fn masters(groups: &[NodeGroup]) -> Vec<Finding> {
    use crate::controllers::authority::ControlPlane;
    use crate::crd::Role;
    // Per namespace: the masters expected, and whether every group allows.
    let mut by_namespace: std::collections::BTreeMap<String, (i32, bool)> = Default::default();
    for g in groups.iter().filter(|g| g.spec.role == Role::Master) {
        let entry = by_namespace.entry(g.namespace().unwrap_or_default());
        let (expected, allowed) = entry.or_insert((0, true));
        *expected += g.spec.desired;
        *allowed &= g.spec.disruption.allow_control_plane_outage;
    }
    let mut out = vec![];
    for (ns, (expected, allowed)) in by_namespace {
        let refused = ControlPlane {
            expected,
            ..Default::default()
        };
        let Some(why) = refused.outage() else {
            continue;
        };
        let said = match allowed {
            false => format!("no master is refreshed, rolled or repaired by the manager: {why}"),
            true => format!(
                "{expected} master(s), allowControlPlaneOutage set: the Kubernetes API is down while the manager replaces one"
            ),
        };
        out.push(Finding::new(Level::Note, format!("masters {ns}"), said));
    }
    out
}

/// A group whose ASGs could not be described (the IAM line says why when
/// IAM refused).
pub fn undescribed(group: &NodeGroup, e: &Error) -> Finding {
    Finding::new(
        Level::Fail,
        check_of(group),
        format!("its ASGs cannot be described: {e}"),
    )
}

fn check_of(group: &NodeGroup) -> String {
    format!(
        "group {}/{}",
        group.namespace().unwrap_or_default(),
        group.name_any()
    )
}

/// What another termination handler running says (`handlers::running`).
pub fn handlers(found: &[String]) -> Finding {
    let check = "cluster termination handler";
    match found.is_empty() {
        true => Finding::new(Level::Ok, check, format!("no {} runs", handlers::NTH)),
        // It does not stop the manager: it drains twice, without the rules.
        false => Finding::new(Level::Warn, check, handlers::condition(found, &[]).2),
    }
}

/// What the masters' control-plane pods say: `masters` the cluster's
/// master Nodes, `with_pods` those of them that run one of kops's
/// control-plane pods.
pub fn control_plane(masters: &BTreeSet<String>, with_pods: &BTreeSet<String>) -> Finding {
    let check = "cluster control plane";
    let without: Vec<&str> = masters
        .iter()
        .filter(|m| !with_pods.contains(*m))
        .map(String::as_str)
        .collect();
    let pods = "kube-system pods labelled k8s-app kube-apiserver or etcd-manager-main";
    if masters.is_empty() {
        return Finding::new(
            Level::Ok,
            check,
            "no Node labelled node-role.kubernetes.io/control-plane or master: no Master group to count",
        );
    }
    if without.is_empty() {
        return Finding::new(
            Level::Ok,
            check,
            format!(
                "every master ({}) runs kops's control-plane pods",
                masters.len()
            ),
        );
    }
    if without.len() == masters.len() {
        return Finding::new(
            Level::Warn,
            check,
            format!(
                "no master shows kops's control-plane pods ({pods}): the masters' rule counts a master as up by Node Ready plus masterSettleTime, not by its etcd; on a kops cluster, check that the control plane runs kops's static pods"
            ),
        );
    }
    Finding::new(
        Level::Warn,
        check,
        format!(
            "master(s) {} show none of kops's control-plane pods ({pods}) while the others do: they count as down, so no master operation goes on until they run them",
            without.join(", ")
        ),
    )
}

/// How long a replica may serve unscraped before check warns: ten of the
/// ServiceMonitor's 30 s intervals (manifests/monitoring/servicemonitor.yaml).
pub const UNSCRAPED: chrono::Duration = chrono::Duration::minutes(5);

/// Whether Prometheus scrapes the manager at `address`, by its answer
/// (`/scrapes`; Err: none came, check runs outside the manager's pod).
pub fn scrape(
    address: &str,
    answer: std::result::Result<crate::admin::Scrapes, String>,
    now: chrono::DateTime<chrono::Utc>,
) -> Finding {
    let check = "scrape";
    let blocked = "a NetworkPolicy admitting another namespace than Prometheus's (the overlay's value 5), a ServiceMonitor selecting nothing (its release label), or no Prometheus Operator; otherwise it shows only as SpotNodeManagerNoLeader";
    let scrapes = match answer {
        Ok(s) => s,
        Err(why) => {
            return Finding::new(
                Level::Note,
                check,
                format!(
                    "not asked: no manager answers at {address} ({why}); run check in the manager's pod to see whether Prometheus scrapes it"
                ),
            );
        }
    };
    let ago = |t: chrono::DateTime<chrono::Utc>| (now - t).num_seconds().max(0);
    match scrapes.last_scrape {
        Some(s) if now - s.at <= UNSCRAPED => Finding::new(
            Level::Ok,
            check,
            format!(
                "Prometheus scraped /metrics {}s ago, from {}",
                ago(s.at),
                s.from
            ),
        ),
        Some(s) => Finding::new(
            Level::Warn,
            check,
            format!(
                "Prometheus last scraped /metrics {} min ago (from {}): {blocked}",
                ago(s.at) / 60,
                s.from
            ),
        ),
        None if now - scrapes.serving_since > UNSCRAPED => Finding::new(
            Level::Warn,
            check,
            format!(
                "no Prometheus scrape of /metrics in the {} min this replica has served: {blocked}",
                ago(scrapes.serving_since) / 60
            ),
        ),
        None => Finding::new(
            Level::Note,
            check,
            format!(
                "this replica has served for {}s and was not scraped yet (every 30s once Prometheus reaches it): run check again in a few minutes",
                ago(scrapes.serving_since)
            ),
        ),
    }
}

/// What the interruption queue says: `policy` its access policy as read
/// (Err: it could not be read), None when no queue is set.
pub fn queue(url: Option<&str>, policy: Option<&crate::Result<Option<String>>>) -> Finding {
    let check = "interruption queue";
    let (Some(url), Some(policy)) = (url, policy) else {
        return Finding::new(
            Level::Warn,
            check,
            "off (no interruption.queueUrl): a spot instance's two-minute warning is not acted on, its node is not drained first; create the queue (manifests/aws/interruption-queue.yaml) and set interruption.queueUrl",
        );
    };
    match policy {
        Err(e) => Finding::new(
            Level::Fail,
            check,
            format!(
                "{url} cannot be read: {e}; create it (manifests/aws/interruption-queue.yaml) or correct interruption.queueUrl, and grant sqs:GetQueueAttributes, sqs:ReceiveMessage and sqs:DeleteMessage on it"
            ),
        ),
        Ok(p) if !crate::cloud::sqs::lets_eventbridge_send(p.as_deref()) => Finding::new(
            Level::Fail,
            check,
            format!(
                "{url}: its access policy lets no EventBridge rule send to it (an Allow of sqs:SendMessage to events.amazonaws.com), so no spot warning arrives; deploy the queue with manifests/aws/interruption-queue.yaml, which sets it"
            ),
        ),
        Ok(_) => Finding::new(
            Level::Ok,
            check,
            format!("{url} readable, EventBridge may send to it"),
        ),
    }
}

/// Whether the findings let the manager operate (no `Fail`).
pub fn passes(findings: &[Finding]) -> bool {
    findings.iter().all(|f| f.level != Level::Fail)
}

/// One line per finding: `ok`, `warn` or `FAIL`, what, and what it says.
pub fn text(findings: &[Finding]) -> String {
    findings
        .iter()
        .map(|f| format!("{:<4}  {}: {}\n", f.level.label(), f.check, f.said))
        .collect()
}

#[cfg(test)]
mod tests;
