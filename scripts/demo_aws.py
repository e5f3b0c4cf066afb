"""Creates a kops-like layout in moto: for cluster example.com in
ap-northeast-1, one master ASG and one node ASG per AZ, each with a launch
template and a spot MixedInstancesPolicy, tagged as kops tags them.

Also creates the interruption queue (--queue-url-file: where to write its URL),
and with --interrupt ASG does what AWS does when it reclaims a spot instance of
that ASG: puts the EventBridge warning on the queue (prints the instance id).

Usage: python demo_aws.py --endpoint http://127.0.0.1:PORT [--account 123456789012]
           [--queue-url-file PATH] [--interrupt ASG]
"""
import argparse
import datetime
import json

import boto3

CLUSTER = "example.com"
REGION = "ap-northeast-1"
ZONES = ["ap-northeast-1a", "ap-northeast-1c", "ap-northeast-1d"]
QUEUE = "example-com-interruptions"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--account")
    parser.add_argument("--nodes-per-asg", type=int, default=1)
    parser.add_argument("--queue-url-file")
    parser.add_argument("--interrupt", metavar="ASG")
    parser.add_argument("--kops-update", metavar="TEMPLATE")
    args = parser.parse_args()

    session = boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION
    )
    ec2 = session.client("ec2", endpoint_url=args.endpoint)
    asg = session.client("autoscaling", endpoint_url=args.endpoint)
    sqs = session.client("sqs", endpoint_url=args.endpoint)
    if args.interrupt:
        interrupt(asg, sqs, args.interrupt)
        return
    if args.kops_update:
        kops_update(ec2, args.kops_update)
        return
    if args.account:
        for client in (ec2, asg):
            client.meta.events.register(
                "before-send.*.*",
                lambda request, **_: request.headers.__setitem__("x-moto-account-id", args.account),
            )

    subnets = {
        s["AvailabilityZone"]: s["SubnetId"]
        for s in ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
    }
    roles = {
        "master": {"types": ["t3.medium", "t3a.medium"], "size": 1, "max": 1},
        "nodes": {"types": ["m5.large", "m5a.large", "m6i.large"], "size": args.nodes_per_asg, "max": 3},
    }
    for role, spec in roles.items():
        template = f"{role}.{CLUSTER}"
        ec2.create_launch_template(
            LaunchTemplateName=template,
            LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": spec["types"][0]},
        )
        for zone in ZONES:
            if role == "master":
                # kops 1.26 and later: control-plane-<zone>.
                name = f"control-plane-{zone}.masters.{CLUSTER}"
                instance_group = f"control-plane-{zone}"
                role_tag = "k8s.io/role/master"
            else:
                name = f"nodes-{zone}.{CLUSTER}"
                instance_group = f"nodes-{zone}"
                role_tag = "k8s.io/role/node"
            asg.create_auto_scaling_group(
                AutoScalingGroupName=name,
                # kops: an instance group sits at its min (minSize = maxSize
                # for masters; workers leave room for surplus and shortages).
                MinSize=spec["size"],
                MaxSize=spec["max"],
                DesiredCapacity=spec["size"],
                VPCZoneIdentifier=subnets[zone],
                MixedInstancesPolicy={
                    "LaunchTemplate": {
                        "LaunchTemplateSpecification": {"LaunchTemplateName": template, "Version": "$Latest"},
                        "Overrides": [{"InstanceType": t} for t in spec["types"]],
                    },
                    "InstancesDistribution": {
                        "OnDemandBaseCapacity": 0,
                        "OnDemandPercentageAboveBaseCapacity": 0,
                        "SpotAllocationStrategy": "price-capacity-optimized",
                    },
                },
                Tags=[
                    {"Key": k, "Value": v, "PropagateAtLaunch": True}
                    for k, v in [
                        ("KubernetesCluster", CLUSTER),
                        ("kops.k8s.io/instancegroup", instance_group),
                        (role_tag, "1"),
                        ("Name", name),
                    ]
                ],
            )
            print(f"created ASG {name} ({spec['size']} instance(s))")
    # The policy our stack gives it (manifests/aws/interruption-queue.yaml):
    # EventBridge rules may send to it. moto's CloudFormation does not apply
    # an AWS::SQS::QueuePolicy, so the demo sets it as AWS would.
    policy = {
        "Version": "2012-10-17",
        "Statement": [{
            "Sid": "EventBridgeRulesSend",
            "Effect": "Allow",
            "Principal": {"Service": "events.amazonaws.com"},
            "Action": "sqs:SendMessage",
            "Resource": "*",
        }],
    }
    queue = sqs.create_queue(
        QueueName=QUEUE,
        Attributes={"VisibilityTimeout": "10", "Policy": json.dumps(policy)},
    )["QueueUrl"]
    print(f"created SQS queue {queue}")
    if args.queue_url_file:
        with open(args.queue_url_file, "w") as f:
            f.write(queue)


def kops_update(ec2, template: str) -> None:
    """What `kops update cluster --yes` does after a change (here a new
    image): a new version of the instance group's launch template, which its
    ASGs (at $Latest) launch from now on. Prints the new version number."""
    version = ec2.create_launch_template_version(
        LaunchTemplateName=template,
        SourceVersion="$Latest",
        LaunchTemplateData={"ImageId": "ami-0f7e8d2b"},
    )["LaunchTemplateVersion"]["VersionNumber"]
    print(version)


def interrupt(asg, sqs, name: str) -> None:
    """The spot interruption warning for the ASG's first InService instance."""
    group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]
    instance = next(i["InstanceId"] for i in group["Instances"] if i["LifecycleState"] == "InService")
    warning = {
        "version": "0",
        "id": f"demo-{instance}",
        "detail-type": "EC2 Spot Instance Interruption Warning",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": REGION,
        "resources": [f"arn:aws:ec2:{REGION}:123456789012:instance/{instance}"],
        "detail": {"instance-id": instance, "instance-action": "terminate"},
    }
    url = sqs.get_queue_url(QueueName=QUEUE)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps(warning))
    print(instance)


if __name__ == "__main__":
    main()
