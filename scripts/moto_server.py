"""moto in server mode, through ThreadedMotoServer so tests can adjust the
emulator's behaviour where moto does not model AWS (see test-environment.md).

Usage: python moto_server.py --port PORT
"""
import argparse
import signal
import threading

from moto.autoscaling import models as autoscaling_models
from moto.server import ThreadedMotoServer

# A spot capacity shortage, which moto cannot model: an ASG carrying this tag
# launches nothing (its desired count stays above its instance count) until
# the tag is removed. Toggle it with CreateOrUpdateTags / DeleteTags.
NO_CAPACITY_TAG = "snm.test/no-capacity"
_replace = autoscaling_models.FakeAutoScalingGroup.replace_autoscaling_group_instances


def _replace_unless_short(self, count_needed, propagated_tags):
    if any(tag.get("Key") == NO_CAPACITY_TAG for tag in self.tags):
        return None
    return _replace(self, count_needed, propagated_tags)


autoscaling_models.FakeAutoScalingGroup.replace_autoscaling_group_instances = _replace_unless_short


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()

    server = ThreadedMotoServer(ip_address=args.host, port=args.port, verbose=False)
    server.start()
    print(f"moto listening on http://{args.host}:{args.port}", flush=True)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop()


if __name__ == "__main__":
    main()
