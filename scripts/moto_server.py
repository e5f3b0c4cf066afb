"""moto in server mode, made as rude as a real Auto Scaling Group.

moto launches and terminates instances synchronously inside the API call,
enforces no min/max, records no scaling activities, ignores suspended
processes and replaces an instance terminated through EC2 at once. A real ASG
does none of that, and controllers tested against the kind version meet the
real one as a surprise. This wrapper takes capacity management away from the
API calls and gives it to a loop that runs like an ASG's own:

- Launch timing: SetDesiredCapacity (or a termination without decrement) only
  records the desired count. A launch begins `launch-lag` seconds after the
  group fell short, the new instances are `Pending` for `pending-time`
  seconds, then `InService`.
- Health checks: a member whose EC2 instance was terminated or stopped from
  outside (a spot loss) is marked Unhealthy after `health-check-delay` seconds,
  then taken out of the group and replaced (unless HealthCheck or
  ReplaceUnhealthy is suspended).
- Shortage: an ASG tagged `snm.test/no-capacity` cannot launch; each attempt
  records a Failed scaling activity with AWS's status message, and the attempt
  is retried every `capacity-retry` seconds, as real groups keep trying.
- Scaling activities: launches (InProgress, then Successful once InService),
  failures, terminations and detaches, served newest first by
  DescribeScalingActivities.
- Refusals with AWS's ValidationError text: SetDesiredCapacity outside
  [min, max]; TerminateInstanceInAutoScalingGroup or DetachInstances with
  decrement below min; UpdateAutoScalingGroup with desired outside the bounds;
  unknown groups and instances.
- UpdateAutoScalingGroup keeps CapacityRebalance and MaxInstanceLifetime,
  and DescribeAutoScalingGroups reports them (moto drops both; the manager
  reports them as settings that compete with it). Neither acts here.
- Suspended processes: Launch, Terminate, HealthCheck, ReplaceUnhealthy
  (AZRebalance is recorded; these single-AZ groups never rebalance).
- Launch template versions: each member reports the template version it was
  launched from (moto reports the template's current default for every
  member, so a new version would look applied to instances that predate it);
  `$Latest` and `$Default` are resolved at launch, as AWS does.
- Standby instances are not capacity: entering Standby without decrement
  launches a replacement.
- Spot groups: a MixedInstancesPolicy group with spot above its on-demand base
  launches instances with InstanceLifecycle=spot and an override's type.
- Scale-in by lowering desired picks its victims as AWS does (the caller has
  no say), recorded as an activity whose cause names the capacity change.
- SQS long polling waits without holding the emulator's lock, as SQS does:
  moto's own wait would stall every other request for up to 20 s.
- Terminate lifecycle hooks: a member leaving for any reason while its EC2
  instance runs, in a group with an `autoscaling:EC2_INSTANCE_TERMINATING`
  hook, waits in `Terminating:Wait` (still running) until
  CompleteLifecycleAction or its heartbeat timeout (from the notice or the
  last RecordLifecycleActionHeartbeat), then terminates. The hook's
  notification (the ASG's direct form, with a token) goes to its SQS
  NotificationTargetARN, and a TEST_NOTIFICATION when the hook is put, as
  AWS does. Calls with a stale token are refused with AWS's text. A heartbeat
  timeout below AWS's 30 s is accepted, as a time compression for tests (the
  same as the timing tags): our code only reads the timeout, never puts it.
- Prices: DescribeSpotPriceHistory answers each asked instance type in
  every zone of the region at the spot price a test set (`/_snm/price`),
  else one default for every type and zone (moto answers $0.00001), with
  its history: older prices under Linux/UNIX and under Linux/UNIX (Amazon
  VPC), per asked product description, the entry in force at the start
  time and every later one, oldest first, in pages of 5. The Price List
  API's GetProducts (moto has none) answers the on-demand price of an
  instance type and region in AWS's shape (a product, its on-demand and
  reserved terms, JSON in a string), set the same way, beside the decoys
  AWS lists too (Windows, RHEL, SQL Server, dedicated, host, a capacity
  reservation at $0, a capacity block, another usage operation), each
  returned only when it matches every filter, one document a page. A
  price set to nothing is unlisted; a twin (`twin=1`) is a second product
  matching every filter.
- Refusals, and counting at AWS's side: `/_snm/refuse` makes every request
  of an account wait, then refuses it with Throttling or ServiceUnavailable;
  `/_snm/deny` refuses one action of an account as IAM does when a policy
  lacks it (EC2's UnauthorizedOperation, Auto Scaling's AccessDenied), and
  `/_snm/allow` answers it again (the policy granted);
  `/_snm/attempts` lists an account's requests, with the SDK's attempt numbers (see `control`);
  `/_snm/actions` the action of each (what a read-only test counts mutations by).

Timings are flags (defaults below) and can be set per ASG with the tags
`snm.test/launch-lag`, `snm.test/pending-time`, `snm.test/health-check-delay`
and `snm.test/capacity-retry` (seconds). A test that pins a timing to zero must
say why; the defaults are what every test and the demo run with.

Usage: python moto_server.py --port PORT [--launch-lag S] [--pending-time S]
       [--health-check-delay S] [--capacity-retry S] [--terminating-time S]
"""
import argparse
import datetime
import io
import json
import signal
import random
import threading
import time
import uuid

from moto.autoscaling import models as asg_models
from moto.autoscaling import responses as asg_responses
from moto.autoscaling.exceptions import ValidationError
from moto.core import DEFAULT_ACCOUNT_ID
from moto.core.responses import ActionResult, EmptyResult
from moto.core.utils import utcnow
from moto.moto_server import werkzeug_app
from moto.ec2.responses import spot_instances as ec2_spot
from moto.sqs import models as sqs_models

NO_CAPACITY_TAG = "snm.test/no-capacity"
TIMING_TAGS = {
    "launch_lag": "snm.test/launch-lag",
    "pending_time": "snm.test/pending-time",
    "health_check_delay": "snm.test/health-check-delay",
    "capacity_retry": "snm.test/capacity-retry",
    "terminating_time": "snm.test/terminating-time",
}
DEFAULTS = {
    "launch_lag": 1.0,
    "pending_time": 2.0,
    "health_check_delay": 3.0,
    "capacity_retry": 10.0,
    "terminating_time": 1.0,
}
TICK = 0.2
SHORTAGE_MESSAGE = (
    "Could not launch Spot Instances. InsufficientInstanceCapacity - There is no Spot "
    "capacity available that matches your request. Launching EC2 instance failed."
)
CAPACITY_STATES = ("InService", "Pending")
LOST_EC2_STATES = ("shutting-down", "terminated", "stopping", "stopped")

# Prices (US dollars an hour) by account: spot by (type, zone), on demand
# by (type, region). A type not set takes the default below; a price set to
# None is unlisted.
SPOT_PRICES: dict = {}
ON_DEMAND_PRICES: dict = {}
# Spot price changes by account, (type, zone): [(when, price)], the oldest
# first: the history DescribeSpotPriceHistory answers from.
SPOT_HISTORY: dict = {}
# A second product matching every filter, by account, (type, region): its
# on-demand price (the Price List then lists two; a test of disagreeing
# products sets it).
ON_DEMAND_TWINS: dict = {}
# When the default prices took effect: the emulator's start.
PRICES_SINCE = utcnow()
# Entries per page of DescribeSpotPriceHistory (AWS's smallest MaxResults)
# and documents per page of GetProducts: small, so every reader's paging
# runs.
SPOT_PAGE = 5
PRODUCTS_PAGE = 1
DEFAULT_ON_DEMAND = {
    "m5.large": 0.096,
    "m5a.large": 0.086,
    "m6i.large": 0.096,
    "t3.medium": 0.0416,
    "t3a.medium": 0.0376,
}
# One spot price for every type and zone unless a test sets its own: pools
# alike in price, so no test's pool order turns on a default (a test of the
# price order sets the prices it compares). About a third of on demand.
DEFAULT_SPOT = {t: 0.0330 for t in DEFAULT_ON_DEMAND}

# One lock for the API and the groups' loop: moto's models are not thread-safe
# and the loop changes them between requests, as AWS does.
LOCK = threading.RLock()

FakeGroup = asg_models.FakeAutoScalingGroup
Backend = asg_models.AutoScalingBackend


def now() -> float:
    return time.monotonic()


def timing(group, key: str) -> float:
    for tag in group.tags:
        if tag.get("Key") == TIMING_TAGS[key]:
            try:
                return max(0.0, float(tag.get("Value", "")))
            except ValueError:
                pass
    return DEFAULTS[key]


def has_tag(group, key: str) -> bool:
    return any(tag.get("Key") == key for tag in group.tags)


def suspended(group, process: str) -> bool:
    return process in group._suspended_processes


def activities(group) -> list:
    if not hasattr(group, "_snm_activities"):
        group._snm_activities = []
    return group._snm_activities


def record(group, description: str, cause: str, status: str, message: str | None = None):
    activity = asg_models.Activity(description, cause, group, status_code=status)
    activity.status_message = message
    activity.progress = 100 if status in ("Successful", "Failed") else 30
    activities(group).append(activity)
    del activities(group)[:-100]
    return activity


def capacity(group) -> list:
    return [s for s in group.instance_states if s.lifecycle_state in CAPACITY_STATES]


# --- API: record, refuse, never launch or terminate inline -------------------


def set_desired_only(self, new_capacity):
    """The API records the count; the group's loop launches or terminates."""
    self.desired_capacity = self.min_size if new_capacity is None else new_capacity


FakeGroup.set_desired_capacity = set_desired_only


def get_group(backend, name):
    group = backend.autoscaling_groups.get(name)
    if group is None:
        raise ValidationError("AutoScalingGroup name not found - null")
    return group


_set_desired = Backend.set_desired_capacity


def set_desired_checked(self, group_name, desired_capacity):
    group = get_group(self, group_name)
    if desired_capacity is not None:
        if desired_capacity > group.max_size:
            raise ValidationError(
                f"New SetDesiredCapacity value {desired_capacity} is above max value "
                f"{group.max_size} for the AutoScalingGroup."
            )
        if desired_capacity < group.min_size:
            raise ValidationError(
                f"New SetDesiredCapacity value {desired_capacity} is below min value "
                f"{group.min_size} for the AutoScalingGroup."
            )
    return _set_desired(self, group_name, desired_capacity)


Backend.set_desired_capacity = set_desired_checked

_update_group = Backend.update_auto_scaling_group


def update_group_checked(self, name, availability_zones, desired_capacity, max_size, min_size, *args, **kwargs):
    group = get_group(self, name)
    lo = group.min_size if min_size is None else min_size
    hi = group.max_size if max_size is None else max_size
    if desired_capacity is not None and not lo <= desired_capacity <= hi:
        raise ValidationError(
            f"Desired capacity:{desired_capacity} must be between the specified "
            f"min size:{lo} and max size:{hi}"
        )
    if desired_capacity is None:
        # AWS moves desired into new bounds (moto compares with instance counts).
        desired_capacity = min(max(group.desired_capacity, lo), hi)
    return _update_group(
        self, name, availability_zones, desired_capacity, max_size, min_size, *args, **kwargs
    )


Backend.update_auto_scaling_group = update_group_checked

_update_response = asg_responses.AutoScalingResponse.update_auto_scaling_group


def update_group_response(self):
    """UpdateAutoScalingGroup sets CapacityRebalance and MaxInstanceLifetime
    too, as AWS's does (moto drops both), and DescribeAutoScalingGroups then
    reports them (a lifetime of 0 clears it)."""
    result = _update_response(self)
    group = get_group(self.autoscaling_backend, self._get_param("AutoScalingGroupName"))
    rebalance = self._get_bool_param("CapacityRebalance", None)
    if rebalance is not None:
        group.capacity_rebalance = rebalance
    lifetime = self._get_int_param("MaxInstanceLifetime")
    if lifetime is not None:
        group.max_instance_lifetime = lifetime or None
    return result


asg_responses.AutoScalingResponse.update_auto_scaling_group = update_group_response


def below_min_message(group, verb: str) -> str:
    return (
        f"Currently, desiredSize equals minSize ({group.min_size}). {verb} instance without "
        "replacement will violate group's min size constraint. Either set "
        "shouldDecrementDesiredCapacity flag to false or lower group's min size."
    )


_detach = Backend.detach_instances


def detach_checked(self, group_name, instance_ids, should_decrement):
    group = get_group(self, group_name)
    members = {s.instance.id for s in group.instance_states}
    for instance_id in instance_ids:
        if instance_id not in members:
            raise ValidationError(
                f"The instance {instance_id} is not part of Auto Scaling group {group_name}."
            )
    if should_decrement and group.desired_capacity - len(instance_ids) < group.min_size:
        raise ValidationError(below_min_message(group, "Detaching"))
    result = _detach(self, group_name, instance_ids, should_decrement)
    for instance_id in instance_ids:
        record(
            group,
            f"Detaching EC2 instance: {instance_id}",
            f"At {utcnow()} instance {instance_id} was detached in response to a user request.",
            "Successful",
        )
    return result


Backend.detach_instances = detach_checked


def terminate_checked(self, instance_id, should_decrement):
    """Terminating, then gone after terminating-time; desired drops only with
    decrement, otherwise the loop launches a replacement after its lag."""
    for group in self.autoscaling_groups.values():
        for state in group.instance_states:
            if state.instance.id != instance_id:
                continue
            if state.lifecycle_state.startswith("Terminat"):
                raise ValidationError(
                    f"The instance {instance_id} is already terminating."
                )
            if should_decrement and group.desired_capacity - 1 < group.min_size:
                raise ValidationError(below_min_message(group, "Terminating"))
            original = group.desired_capacity
            if should_decrement:
                group.desired_capacity -= 1
            begin_termination(group, state, "in response to a user request", original)
            return asg_models.TerminateInstanceActivity(state.instance, original)
    raise ValidationError(f"Instance Id not found - No managed instance found for instance id {instance_id}")


Backend.terminate_instance = terminate_checked


def no_inline_replacement(self, instance_ids):
    """EC2 terminated a member: the group notices through its health check."""


Backend.notify_terminate_instances = no_inline_replacement


def describe_scaling_activities(self):
    name = self._get_param("AutoScalingGroupName")
    max_records = int(self._get_param("MaxRecords") or 100)
    groups = self.autoscaling_backend.autoscaling_groups
    selected = [groups[name]] if name in groups else ([] if name else list(groups.values()))
    found = [a for g in selected for a in activities(g)]
    found.sort(key=lambda a: a.start_time, reverse=True)
    return ActionResult({"Activities": found[:max_records]})


asg_responses.AutoScalingResponse.describe_scaling_activities = describe_scaling_activities

_put_hook = asg_responses.AutoScalingResponse.put_lifecycle_hook


def put_lifecycle_hook(self):
    """moto's, plus the notification target (moto keeps a placeholder, or
    invents one when none is given) and the TEST_NOTIFICATION AWS sends it."""
    result = _put_hook(self)
    group_name = self._get_param("AutoScalingGroupName")
    name = self._get_param("LifecycleHookName")
    group = get_group(self.autoscaling_backend, group_name)
    hook = self.autoscaling_backend.lifecycle_hooks.get(f"{group_name}_{name}")
    target = self._get_param("NotificationTargetARN")
    if hook is not None and not target:
        # AWS names no target for a hook whose notifications go to
        # EventBridge only (kops's NTHLifecycleHook); moto invents one.
        hook.notification_target_arn = None
    if hook is not None and target:
        hook._snm_target = target
        hook.notification_target_arn = target
        notify(group, hook, {
            "AccountId": group.account_id,
            "RequestId": str(uuid.uuid4()),
            "AutoScalingGroupARN": group.arn,
            "AutoScalingGroupName": group.name,
            "Service": "AWS Auto Scaling",
            "Event": "autoscaling:TEST_NOTIFICATION",
            "Time": utcnow().strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        })
    return result


asg_responses.AutoScalingResponse.put_lifecycle_hook = put_lifecycle_hook


def waiting_action(response):
    """The member held by the action the request names, or AWS's refusal."""
    group = get_group(response.autoscaling_backend, response._get_param("AutoScalingGroupName"))
    hook = response._get_param("LifecycleHookName")
    token = response._get_param("LifecycleActionToken")
    instance_id = response._get_param("InstanceId")
    for state in group.instance_states:
        if state.lifecycle_state != "Terminating:Wait" or getattr(state, "_snm_hook", None) != hook:
            continue
        if (token and state._snm_token == token) or (not token and state.instance.id == instance_id):
            if instance_id and state.instance.id != instance_id:
                break
            return group, state
    what = f"token {token}" if token else f"instance ID {instance_id}"
    raise ValidationError(f"No active Lifecycle Action found with {what}")


def record_lifecycle_action_heartbeat(self):
    group, state = waiting_action(self)
    hook = self.autoscaling_backend.lifecycle_hooks.get(f"{group.name}_{state._snm_hook}")
    timeout = float(hook.heartbeat_timeout) if hook is not None else 3600.0
    state._snm_hook_deadline = now() + timeout
    state._snm_heartbeats = getattr(state, "_snm_heartbeats", 0) + 1
    return EmptyResult()


def complete_lifecycle_action(self):
    result = self._get_param("LifecycleActionResult")
    if result not in ("CONTINUE", "ABANDON"):
        raise ValidationError(f"Invalid LifecycleActionResult {result}")
    _, state = waiting_action(self)
    state._snm_completed = True
    return EmptyResult()


asg_responses.AutoScalingResponse.record_lifecycle_action_heartbeat = record_lifecycle_action_heartbeat
asg_responses.AutoScalingResponse.complete_lifecycle_action = complete_lifecycle_action


# --- the group's own loop ----------------------------------------------------


TERMINATING_TRANSITION = "autoscaling:EC2_INSTANCE_TERMINATING"


def terminate_hook(group):
    backend = group.autoscaling_backend
    for hook in backend.lifecycle_hooks.values():
        if hook.auto_scaling_group_name == group.name and hook.lifecycle_transition == TERMINATING_TRANSITION:
            return hook
    return None


def notify(group, hook, body: dict):
    """Puts `body` on the hook's SQS target, if it names one in this account."""
    arn = getattr(hook, "_snm_target", None) or ""
    parts = arn.split(":")
    if len(parts) != 6 or parts[2] != "sqs":
        return
    region, account, queue = parts[3], parts[4], parts[5]
    try:
        sqs_models.sqs_backends[account][region].send_message(queue, json.dumps(body))
    except Exception as e:  # a missing queue: AWS would drop it too
        print(f"emulator: {group.name}: notification to {arn} failed: {e!r}", flush=True)


def begin_termination(group, state, why: str, original: int):
    instance = state.instance
    hook = terminate_hook(group)
    if hook is not None and instance.state not in ("terminated", "shutting-down"):
        # Held for the hook: still running, until completed or timed out.
        state.lifecycle_state = "Terminating:Wait"
        state._snm_hook = hook.name
        state._snm_token = str(uuid.uuid4())
        state._snm_hook_deadline = now() + float(hook.heartbeat_timeout)
        state._snm_why = why
        state._snm_original = original
        notify(group, hook, {
            "Origin": "AutoScalingGroup",
            "Destination": "EC2",
            "Service": "AWS Auto Scaling",
            "Time": utcnow().strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "AccountId": group.account_id,
            "RequestId": str(uuid.uuid4()),
            "AutoScalingGroupName": group.name,
            "LifecycleHookName": hook.name,
            "LifecycleActionToken": state._snm_token,
            "LifecycleTransition": TERMINATING_TRANSITION,
            "EC2InstanceId": instance.id,
        })
        return
    proceed_termination(group, state, why, original)


def proceed_termination(group, state, why: str, original: int):
    state.lifecycle_state = "Terminating"
    state._snm_gone_at = now() + timing(group, "terminating_time")
    instance = state.instance
    if instance.state not in ("terminated", "shutting-down"):
        group.ec2_backend.terminate_instances([instance.id])
    shrink = (
        f", shrinking the capacity from {original} to {group.desired_capacity}"
        if group.desired_capacity < original
        else ""
    )
    state._snm_activity = record(
        group,
        f"Terminating EC2 instance: {instance.id}",
        f"At {utcnow()} instance {instance.id} was taken out of service {why}{shrink}.",
        "InProgress",
    )


def spot_overrides(group):
    """(is spot, override instance types) for a MixedInstancesPolicy group."""
    policy = group.mixed_instances_policy or {}
    overrides = policy.get("LaunchTemplate", {}).get("Overrides", []) or []
    distribution = policy.get("InstancesDistribution", {}) or {}
    on_demand_pct = int(distribution.get("OnDemandPercentageAboveBaseCapacity", 100))
    types = [o["InstanceType"] for o in overrides if o.get("InstanceType")]
    return bool(policy) and on_demand_pct < 100, types


def launch(group, count: int):
    before = {id(s) for s in group.instance_states}
    _replace(group, count, group.get_propagated_tags())
    spot, types = spot_overrides(group)
    ready_at = now() + timing(group, "pending_time")
    launched = [s for s in group.instance_states if id(s) not in before]
    for n, state in enumerate(launched):
        state.lifecycle_state = "Pending"
        state._snm_ready_at = ready_at
        if spot:
            state.instance.lifecycle = "spot"
        if types:
            # Spread over the overrides, as a diversified spot allocation does.
            chosen = types[(len(activities(group)) + n) % len(types)]
            state.instance.instance_type = chosen
            state.instance_type = chosen
        state._snm_activity = record(
            group,
            f"Launching a new EC2 instance: {state.instance.id}",
            f"At {utcnow()} an instance was started in response to a difference between "
            f"desired and actual capacity, increasing the capacity from "
            f"{len(capacity(group)) - 1} to {group.desired_capacity}.",
            "InProgress",
        )


def step_group(group):
    t = now()
    # Pending -> InService; Terminating:Wait -> Terminating -> gone.
    for state in list(group.instance_states):
        if state.lifecycle_state == "Pending" and t >= getattr(state, "_snm_ready_at", 0):
            state.lifecycle_state = "InService"
            finish(state)
        elif state.lifecycle_state == "Terminating:Wait" and (
            getattr(state, "_snm_completed", False) or t >= state._snm_hook_deadline
        ):
            proceed_termination(group, state, state._snm_why, state._snm_original)
        elif state.lifecycle_state == "Terminating" and t >= getattr(state, "_snm_gone_at", 0):
            group.instance_states = [s for s in group.instance_states if s is not state]
            finish(state)

    # Health check: members whose instance EC2 ended from outside.
    for state in capacity(group):
        if state.instance.state not in LOST_EC2_STATES:
            continue
        noticed = getattr(state, "_snm_lost_at", None)
        if noticed is None:
            state._snm_lost_at = t
            continue
        if t - noticed < timing(group, "health_check_delay") or suspended(group, "HealthCheck"):
            continue
        state.health_status = "Unhealthy"
        if not suspended(group, "ReplaceUnhealthy"):
            begin_termination(
                group,
                state,
                "in response to an EC2 health check indicating it has been terminated or stopped",
                group.desired_capacity,
            )

    # Capacity towards desired.
    have = len(capacity(group))
    if have < group.desired_capacity:
        group._snm_short_since = getattr(group, "_snm_short_since", None) or t
        last_failure = getattr(group, "_snm_last_failure", None)
        waited = t - group._snm_short_since >= timing(group, "launch_lag")
        retry_due = last_failure is None or t - last_failure >= timing(group, "capacity_retry")
        if waited and retry_due and not suspended(group, "Launch"):
            if has_tag(group, NO_CAPACITY_TAG):
                group._snm_last_failure = t
                record(
                    group,
                    "Launching a new EC2 instance.  Status Reason: " + SHORTAGE_MESSAGE,
                    f"At {utcnow()} an instance was started in response to a difference "
                    f"between desired and actual capacity, increasing the capacity from "
                    f"{have} to {group.desired_capacity}.",
                    "Failed",
                    SHORTAGE_MESSAGE,
                )
            else:
                group._snm_last_failure = None
                group._snm_short_since = None
                launch(group, group.desired_capacity - have)
    else:
        group._snm_short_since = None
        group._snm_last_failure = None
        if have > group.desired_capacity and not suspended(group, "Terminate"):
            # AWS chooses: the oldest instances (the caller has no say).
            extra = have - group.desired_capacity
            victims = [s for s in capacity(group) if not s.protected_from_scale_in][:extra]
            for state in victims:
                begin_termination(
                    group,
                    state,
                    "in response to a user request, shrinking the capacity",
                    have,
                )


def finish(state):
    activity = getattr(state, "_snm_activity", None)
    if activity is not None:
        activity.status_code = "Successful"
        activity.progress = 100
        activity.end_time = utcnow()


_replace = FakeGroup.replace_autoscaling_group_instances


def launched_version(group):
    """The number `group` launches from now: its template version resolved."""
    template = group.ec2_launch_template
    if template is None:
        return None
    return template.get_version(group.launch_template_version or "$Default").number


_state_init = asg_models.InstanceState.__init__


def state_init_recording_version(self, *args, **kwargs):
    _state_init(self, *args, **kwargs)
    group = self.auto_scaling_group
    if group is not None and group.ec2_launch_template is not None:
        self._snm_launched_from = {
            "LaunchTemplateId": group.ec2_launch_template.id,
            "LaunchTemplateName": group.ec2_launch_template.name,
            "Version": str(launched_version(group)),
        }


def instance_launch_template(self):
    """The template and version the instance was launched from."""
    return getattr(self, "_snm_launched_from", None)


asg_models.InstanceState.__init__ = state_init_recording_version
asg_models.InstanceState.launch_template = property(instance_launch_template)


# An account nobody has asked anything for this long is not stepped: the
# tests of a whole run each leave a finished account behind, and stepping
# hundreds of them every tick under the one lock slows every live one.
# Nothing is lost: each step compares deadlines with the clock, so an
# account asked again catches up at its next tick. Live accounts (a test's
# simulated kubelet asks every 0.3 s) are stepped as before.
IDLE_AFTER = 120.0
LAST_ASKED: dict = {}


def backends():
    t = now()
    for account, regions in list(asg_models.autoscaling_backends.items()):
        if t - LAST_ASKED.get(account, t) > IDLE_AFTER:
            continue
        for backend in list(regions.values()):
            yield backend


def loop(stop: threading.Event):
    while not stop.wait(TICK):
        with LOCK:
            for backend in backends():
                for group in list(backend.autoscaling_groups.values()):
                    try:
                        step_group(group)
                    except Exception as e:  # keep the loop alive; say what broke
                        print(f"emulator: {group.name}: {e!r}", flush=True)


_receive = sqs_models.SQSBackend.receive_message


def receive_polling_unlocked(self, queue_name, count, wait_seconds_timeout, visibility_timeout,
                             message_attribute_names=None):
    """ReceiveMessage with WaitTimeSeconds: poll without waiting, and between
    polls let other requests (and the groups' loop) run."""
    deadline = now() + (wait_seconds_timeout or 0)
    while True:
        messages = _receive(self, queue_name, count, 0, visibility_timeout, message_attribute_names)
        if messages or now() >= deadline:
            return messages
        state = LOCK._release_save()  # held once per request, by locked_dispatch
        try:
            time.sleep(0.05)
        finally:
            LOCK._acquire_restore(state)


sqs_models.SQSBackend.receive_message = receive_polling_unlocked

_dispatch = werkzeug_app.DomainDispatcherApplication.__call__


# What tests read at AWS's side, per account (the x-moto-account-id header):
# the time of every request, and how its requests are refused, if they are.
# [time, attempt, of max] per request, the last two from the SDK's
# `amz-sdk-request: attempt=N; max=M` header: which requests are retries.
ATTEMPTS: dict = {}
# Account -> [time, action] of each of its requests, in order (`/_snm/actions`).
ACTIONS: dict = {}
REFUSED: dict = {}
# Actions an account's IAM policy lacks, per account.
DENIED: dict = {}
REFUSALS = {
    # AWS refusing a caller over its rate (the SDK retries, and slows down).
    "Throttling": ("400 Bad Request", "Sender"),
    # AWS failing on its side (the SDK retries at its usual pace).
    "ServiceUnavailable": ("503 Service Unavailable", "Receiver"),
}


def control(environ, start_response):
    """`GET /_snm/attempts?account=A`: A's requests so far, each as [time
    (epoch seconds), attempt, max attempts] (0, 0 without the SDK's header).
    `GET
    /_snm/refuse?account=A&delay=S&error=E&fraction=F&agent=G`: from now
    on every request of A (or a share F of them, drawn at random with a seed
    of A, so a run can be repeated; F=0 ends the refusals; only those whose
    user agent contains G, when given: the manager's, not the simulated
    kubelet's) waits S seconds, then is refused with error E (a key of
    REFUSALS)."""
    from urllib.parse import parse_qs

    query = {k: v[0] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
    account = query.get("account", "")
    if environ["PATH_INFO"] == "/_snm/deny":
        DENIED.setdefault(account, set()).add(query.get("action", ""))
        body = b"{}"
    elif environ["PATH_INFO"] == "/_snm/allow":
        DENIED.get(account, set()).discard(query.get("action", ""))
        body = b"{}"
    elif environ["PATH_INFO"] == "/_snm/refuse":
        error = query.get("error", "Throttling")
        if error not in REFUSALS:
            start_response("400 Bad Request", [("Content-Length", "0")])
            return [b""]
        fraction = float(query.get("fraction", "1"))
        if fraction <= 0:
            REFUSED.pop(account, None)
        else:
            REFUSED[account] = (
                float(query.get("delay", "0")),
                error,
                fraction,
                random.Random(account),
                query.get("agent", ""),
            )
        body = b"{}"
    elif environ["PATH_INFO"] == "/_snm/price":
        price = float(query["price"]) if query.get("price") else None
        if query.get("kind") == "on-demand":
            key = (query.get("type", ""), query.get("region", ""))
            table = ON_DEMAND_TWINS if query.get("twin") else ON_DEMAND_PRICES
            table.setdefault(account, {})[key] = price
        else:
            key = (query.get("type", ""), query.get("zone", ""))
            SPOT_PRICES.setdefault(account, {})[key] = price
            SPOT_HISTORY.setdefault(account, {}).setdefault(key, []).append((utcnow(), price))
        body = b"{}"
    elif environ["PATH_INFO"] == "/_snm/attempts":
        body = json.dumps(ATTEMPTS.get(account, [])).encode()
    elif environ["PATH_INFO"] == "/_snm/actions":
        body = json.dumps(ACTIONS.get(account, [])).encode()
    else:
        start_response("404 Not Found", [("Content-Length", "0")])
        return [b""]
    start_response(
        "200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    )
    return [body]


def spot_entries(account: str, instance_type: str, zone: str) -> list:
    """A type's spot price history in a zone, as AWS keeps it: (when,
    product description, price), the oldest first. The price set (or the
    default) under Linux/UNIX, from when it was set; before it, an older
    price; and an entry under Linux/UNIX (Amazon VPC) older still, at
    another price: which of the two descriptions carries a Linux price
    depends on the account's platform (Karpenter asks both), so a reader
    takes the entry that took effect last, not the first listed. The older
    entries and their prices are ours. Nothing when the price in force is
    unlisted."""
    changes = SPOT_HISTORY.get(account, {}).get((instance_type, zone))
    if not changes:
        default = DEFAULT_SPOT.get(instance_type)
        changes = [(PRICES_SINCE, default)] if default is not None else []
    if not changes or changes[-1][1] is None:
        return []
    first_at, first = changes[0]
    first = first if first is not None else changes[-1][1]
    day = datetime.timedelta(days=1)
    entries = [
        (first_at - 2 * day, "Linux/UNIX (Amazon VPC)", first * 1.5),
        (first_at - day, "Linux/UNIX", first * 1.2),
    ]
    entries += [(at, "Linux/UNIX", price) for at, price in changes if price is not None]
    return entries


def spot_price_history(self):
    """DescribeSpotPriceHistory: each asked type (every priced type when
    none is asked) in every zone of the region, per asked product
    description (all when none is asked). With a start time, the entry in
    force then and every later one, as AWS answers; without, the whole
    history. Oldest first (AWS promises no order), in pages of SPOT_PAGE
    entries (NextToken)."""
    types = self._get_param("InstanceTypes", []) or sorted(DEFAULT_SPOT)
    products = self._get_param("ProductDescriptions", [])
    start = self._get_param("StartTime")
    if isinstance(start, str):
        start = datetime.datetime.fromisoformat(start.replace("Z", "+00:00"))
    if start is not None and start.tzinfo is not None:
        start = start.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    wanted_zones = self._filters_from_querystring().get("availability-zone")
    zones = [z.name for z in self.ec2_backend.describe_availability_zones()]
    history = []
    for instance_type in types:
        for zone in zones:
            if wanted_zones and zone not in wanted_zones:
                continue
            entries = spot_entries(self.current_account, instance_type, zone)
            for product in sorted({d for _, d, _ in entries}):
                if products and product not in products:
                    continue
                own = [e for e in entries if e[1] == product]
                if start is not None:
                    before = [e for e in own if e[0] <= start]
                    own = before[-1:] + [e for e in own if e[0] > start]
                for at, _, price in own:
                    history.append((at, {
                        "InstanceType": instance_type,
                        "ProductDescription": product,
                        "SpotPrice": f"{price:.6f}",
                        "AvailabilityZone": zone,
                        "Timestamp": at.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
                    }))
    history.sort(key=lambda e: e[0])
    try:
        offset = int(self._get_param("NextToken") or 0)
    except ValueError:
        offset = 0
    page = [entry for _, entry in history[offset:offset + SPOT_PAGE]]
    result = {"SpotPriceHistory": page}
    if offset + SPOT_PAGE < len(history):
        result["NextToken"] = str(offset + SPOT_PAGE)
    return ActionResult(result)


ec2_spot.SpotInstances.describe_spot_price_history = spot_price_history


def price_list_document(attributes: dict, price: float) -> str:
    """One GetProducts document: the product, its on-demand term, and the
    reserved terms AWS lists beside it (cheaper by the hour, one with an
    upfront fee): a reader takes the on-demand term only."""
    sku = uuid.uuid4().hex[:16].upper()
    instance_type = attributes.get("instanceType", "")
    return json.dumps({
        "product": {"productFamily": "Compute Instance", "attributes": attributes, "sku": sku},
        "serviceCode": "AmazonEC2",
        "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {
            "offerTermCode": "JRTCKXETXF", "sku": sku,
            "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                "unit": "Hrs", "pricePerUnit": {"USD": f"{price:.10f}"},
                "description": f"${price} per On Demand {attributes.get('operatingSystem')} {instance_type} Instance Hour",
                "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7",
            }},
        }}, "Reserved": {f"{sku}.HU7G6KETJZ": {
            "offerTermCode": "HU7G6KETJZ", "sku": sku,
            "termAttributes": {"LeaseContractLength": "1yr", "OfferingClass": "standard",
                               "PurchaseOption": "Partial Upfront"},
            "priceDimensions": {
                f"{sku}.HU7G6KETJZ.2TG2D8R56U": {
                    "unit": "Quantity", "pricePerUnit": {"USD": f"{price * 3000:.0f}"},
                    "description": "Upfront Fee"},
                f"{sku}.HU7G6KETJZ.6YS6EN2CT7": {
                    "unit": "Hrs", "pricePerUnit": {"USD": f"{price * 0.3:.10f}"},
                    "description": f"{instance_type} reserved instance applied"},
            },
        }}},
        "version": "20261101000000",
    })


def price_list_products(environ, account: str, start_response):
    """The Price List API's GetProducts (JSON 1.1), as AWS answers it: the
    products of the filtered instance type and region, each a product and
    its terms (JSON in a string), only those whose attributes match every
    TERM_MATCH filter. Beside the on-demand Linux product it lists the
    decoys AWS lists too, each of its own attributes: Windows, RHEL, SQL
    Server pre-installed, dedicated tenancy and hosts, a capacity
    reservation's SKU at $0, a capacity block's, another usage operation
    under Linux; a filter left out lets them through. A twin set for the
    type (ON_DEMAND_TWINS) is listed after the Linux product. In pages of
    PRODUCTS_PAGE documents (NextToken)."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    request = json.loads(environ["wsgi.input"].read(length) or b"{}")
    terms = {f.get("Field"): f.get("Value") for f in request.get("Filters", [])}
    instance_type, region = terms.get("instanceType", ""), terms.get("regionCode", "")
    table = ON_DEMAND_PRICES.get(account, {})
    price = table.get((instance_type, region), DEFAULT_ON_DEMAND.get(instance_type))
    documents = []
    if price is not None and request.get("ServiceCode") == "AmazonEC2":
        linux = {"instanceType": instance_type, "regionCode": region,
                 "operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
                 "capacitystatus": "Used", "marketoption": "OnDemand",
                 "operation": "RunInstances"}
        # capacitystatus takes Used, AllocatedCapacityReservation and
        # UnusedCapacityReservation (awsdocs/aws-cur-user-guide,
        # doc_source/product-columns.md, product/capacitystatus, at b6ae7626).
        # The other decoys differ from the Linux product in one filtered
        # attribute each; their values only need to differ (the capacity
        # block's marketoption name is ours: the manager asks for OnDemand).
        products = [
            (linux, price),
            ({**linux, "operatingSystem": "Windows"}, price * 2),
            ({**linux, "operatingSystem": "RHEL"}, price * 1.3),
            ({**linux, "preInstalledSw": "SQL Std"}, price * 4),
            ({**linux, "tenancy": "Dedicated"}, price * 1.1),
            ({**linux, "capacitystatus": "AllocatedCapacityReservation"}, 0.0),
            ({**linux, "marketoption": "CapacityBlock"}, price * 0.9),
            ({**linux, "tenancy": "Host"}, price * 1.2),
            # Linux/UNIX's usage operation is RunInstances; Red Hat BYOL
            # Linux's is RunInstances:00g0 (awsdocs/amazon-ec2-user-guide,
            # doc_source/billing-info-fields.md, at 0f17a814). That AWS
            # lists it under operatingSystem Linux is our decoy's, not a
            # fact checked here.
            ({**linux, "operation": "RunInstances:00g0"}, price * 0.8),
        ]
        twin = ON_DEMAND_TWINS.get(account, {}).get((instance_type, region))
        if twin is not None:
            products.insert(1, ({**linux, "usagetype": "BoxUsage-twin"}, twin))
        for attributes, dollars in products:
            if all(attributes.get(f, v) == v for f, v in terms.items()):
                documents.append(price_list_document(attributes, dollars))
    try:
        offset = int(request.get("NextToken") or 0)
    except ValueError:
        offset = 0
    size = min(PRODUCTS_PAGE, int(request.get("MaxResults") or PRODUCTS_PAGE))
    answer = {"FormatVersion": "aws_v1", "PriceList": documents[offset:offset + size]}
    if offset + size < len(documents):
        answer["NextToken"] = str(offset + size)
    body = json.dumps(answer).encode()
    start_response("200 OK", [("Content-Type", "application/x-amz-json-1.1"),
                              ("Content-Length", str(len(body)))])
    return [body]


def refuse(error: str, start_response):
    status, kind = REFUSALS[error]
    body = (
        f"<ErrorResponse><Error><Type>{kind}</Type><Code>{error}</Code>"
        f"<Message>{error} (emulated)</Message></Error><RequestId>snm</RequestId></ErrorResponse>"
    ).encode()
    start_response(status, [("Content-Type", "text/xml"), ("Content-Length", str(len(body)))])
    return [body]


def denied(action: str, start_response):
    """IAM's refusal of an action the caller's policy lacks, in the form
    of its service: EC2's UnauthorizedOperation (its `Response/Errors`
    document), Auto Scaling's AccessDenied."""
    if action in JSON_ACTIONS:
        body = json.dumps({"__type": "AccessDeniedException",
                           "message": f"User is not authorized to perform: pricing:{action}"}).encode()
        start_response("400 Bad Request", [("Content-Type", "application/x-amz-json-1.1"),
                                           ("x-amzn-ErrorType", "AccessDeniedException"),
                                           ("Content-Length", str(len(body)))])
        return [body]
    if action in EC2_ACTIONS:
        body = (
            "<Response><Errors><Error><Code>UnauthorizedOperation</Code>"
            f"<Message>You are not authorized to perform this operation. ({action})</Message>"
            "</Error></Errors><RequestID>snm</RequestID></Response>"
        ).encode()
    else:
        body = (
            "<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code>"
            f"<Message>User is not authorized to perform: {action}</Message></Error>"
            "<RequestId>snm</RequestId></ErrorResponse>"
        ).encode()
    start_response("403 Forbidden", [("Content-Type", "text/xml"), ("Content-Length", str(len(body)))])
    return [body]


# EC2 actions `/_snm/deny` answers in EC2's error form.
EC2_ACTIONS = {"DescribeLaunchTemplates", "DescribeInstances", "DescribeSpotPriceHistory"}
# Actions of JSON-protocol services (the Price List API) `/_snm/deny` answers.
JSON_ACTIONS = {"GetProducts"}


def query_action(environ) -> str:
    """The query protocol's Action, from the query string or the form body
    (the body is read and put back for moto)."""
    from urllib.parse import parse_qs

    action = parse_qs(environ.get("QUERY_STRING", "")).get("Action", [""])[0]
    if action:
        return action
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    body = environ["wsgi.input"].read(length) if length else b""
    environ["wsgi.input"] = io.BytesIO(body)
    return parse_qs(body.decode("utf-8", "replace")).get("Action", [""])[0]


def sdk_attempt(environ) -> tuple:
    """(attempt, max attempts) from `amz-sdk-request: attempt=2; max=3`."""
    fields = dict(
        part.strip().split("=", 1)
        for part in environ.get("HTTP_AMZ_SDK_REQUEST", "").split(";")
        if "=" in part
    )
    try:
        return int(fields.get("attempt", 0)), int(fields.get("max", 0))
    except ValueError:
        return 0, 0


def locked_dispatch(self, environ, start_response):
    if environ.get("PATH_INFO", "").startswith("/_snm/"):
        return control(environ, start_response)
    account = environ.get("HTTP_X_MOTO_ACCOUNT_ID")
    LAST_ASKED[account or DEFAULT_ACCOUNT_ID] = now()
    if account:
        ATTEMPTS.setdefault(account, []).append([time.time(), *sdk_attempt(environ)])
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        action = query_action(environ) or target.split(".")[-1]
        ACTIONS.setdefault(account, []).append([time.time(), action])
        if account in REFUSED:
            delay, error, fraction, draw, agent = REFUSED[account]
            agents = environ.get("HTTP_USER_AGENT", "") + environ.get("HTTP_X_AMZ_USER_AGENT", "")
            if agent in agents and (fraction >= 1 or draw.random() < fraction):
                time.sleep(delay)  # without the lock: others go on
                return refuse(error, start_response)
        if account in DENIED:
            action = query_action(environ) or target.split(".")[-1]
            if action in DENIED[account]:
                return denied(action, start_response)
    if environ.get("HTTP_X_AMZ_TARGET", "").startswith("AWSPriceListService."):
        return price_list_products(environ, account or DEFAULT_ACCOUNT_ID, start_response)
    with LOCK:
        return _dispatch(self, environ, start_response)


werkzeug_app.DomainDispatcherApplication.__call__ = locked_dispatch


def main() -> None:
    from moto.server import ThreadedMotoServer

    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    for key, default in DEFAULTS.items():
        parser.add_argument("--" + key.replace("_", "-"), type=float, default=default)
    args = parser.parse_args()
    for key in DEFAULTS:
        DEFAULTS[key] = getattr(args, key)

    server = ThreadedMotoServer(ip_address=args.host, port=args.port, verbose=False)
    server.start()
    stop = threading.Event()
    threading.Thread(target=loop, args=(stop,), daemon=True).start()
    print(f"moto listening on http://{args.host}:{args.port} with {DEFAULTS}", flush=True)

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop()


if __name__ == "__main__":
    main()
