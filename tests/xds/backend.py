"""A demo gRPC backend for the xDS test: `shoal.demo.Echo/Who` answers with its instance id.

    python3 backend.py --instance g-1 --gen-dir DIR

Binds 127.0.0.1 on a free port, prints `PORT <n>` on stdout once serving, and serves until
SIGTERM or stdin closes. DIR holds the modules grpc_tools.protoc generated from echo.proto.
"""
import argparse
import signal
import sys
import threading
from concurrent import futures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--instance", required=True)
    ap.add_argument("--gen-dir", required=True)
    args = ap.parse_args()
    sys.path.insert(0, args.gen_dir)
    import grpc
    import echo_pb2
    import echo_pb2_grpc

    class Echo(echo_pb2_grpc.EchoServicer):
        def Who(self, request, context):
            return echo_pb2.WhoReply(instance=args.instance)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    echo_pb2_grpc.add_EchoServicer_to_server(Echo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"PORT {port}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    done.wait()
    server.stop(grace=0.5).wait()


if __name__ == "__main__":
    main()
