"""moto in server mode, through ThreadedMotoServer so tests can adjust the
emulator's behaviour where moto does not model AWS (see test-environment.md).

Usage: python moto_server.py --port PORT
"""
import argparse
import signal
import threading

from moto.server import ThreadedMotoServer


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
