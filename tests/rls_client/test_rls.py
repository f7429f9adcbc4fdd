"""`fleetlimit rls` asked by a client nobody here wrote: Envoy's generated
protos from PyPI's xds-protos over grpcio, the header fields parsed by
http-sf (RFC 9651). Starts its own redis-server ($FLEETLIMIT_REDIS_SERVER,
as the Rust tests) and `fleetlimit rls` processes on free loopback ports.

    python3 tests/rls_client/test_rls.py PATH/TO/fleetlimit

(.ci/run installs xds-protos, grpcio and http-sf, and runs it.)
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import grpc
import http_sf
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

BIN = None
D = ratelimit_pb2.RateLimitDescriptor
OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT

LIMITS = """
[headers]
style = "both"

[fleet]
size = 2

[limits.per-key]
key = "header:x-api-key"
capacity = {n}
refill = "{n}/h"

[limits.per-ip]
key = "ip"
capacity = 3
refill = "3/h"

[limits.marketing]
key = "header:x-to-number"
capacity = 2
refill = "2/d"

[limits.per-number]
key = "header:x-to-number"
capacity = 4
refill = "4/d"

[limits.watched]
key = "header:x-api-key"
capacity = 1
refill = "1/h"

[[descriptors]]
domain = "edge"
entries = [{{ key = "generic_key", value = "api" }}, {{ key = "api_key", as = "header:x-api-key" }}]
limits = ["per-key"]

[[descriptors]]
domain = "edge"
entries = [{{ key = "remote_address", as = "ip" }}]
limits = ["per-ip"]

[[descriptors]]
domain = "messaging"
entries = [{{ key = "message_type", value = "marketing" }}, {{ key = "to_number", as = "header:x-to-number" }}]
limits = ["marketing"]

[[descriptors]]
domain = "messaging"
entries = [{{ key = "to_number", as = "header:x-to-number" }}]
limits = ["per-number"]

[[descriptors]]
domain = "shadow"
entries = [{{ key = "api_key", as = "header:x-api-key" }}]
limits = ["watched"]
mode = "shadow"

[[descriptors]]
domain = "open"
entries = [{{ key = "api_key", as = "header:x-api-key" }}]
limits = ["per-key"]
on_redis_error = "open"

[[descriptors]]
domain = "closed"
entries = [{{ key = "api_key", as = "header:x-api-key" }}]
limits = ["per-key"]
on_redis_error = "closed"

[[descriptors]]
domain = "local"
entries = [{{ key = "api_key", as = "header:x-api-key" }}]
limits = ["per-key"]
on_redis_error = "local"
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    def __init__(self, workdir):
        self.port = free_port()
        self.proc = subprocess.Popen(
            [os.environ.get("FLEETLIMIT_REDIS_SERVER", "redis-server"), "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Rls:
    """`fleetlimit rls` on a free port (said on its stdout)."""

    def __init__(self, config):
        self.log = config + ".%d.log" % time.monotonic_ns()
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(
                [BIN, "rls", "--config", config, "--listen", "127.0.0.1:0"],
                stdout=subprocess.PIPE, stderr=err, text=True)
        line = self.proc.stdout.readline()
        self.proc.stdout.close()
        assert "listening on" in line, line + self.stderr()
        self.addr = line.strip().rsplit(" ", 1)[1]
        self.channel = grpc.insecure_channel(self.addr)
        self.stub = rls_pb2_grpc.RateLimitServiceStub(self.channel)

    def ask(self, domain, *descriptors, hits=0):
        req = rls_pb2.RateLimitRequest(domain=domain, hits_addend=hits)
        for entries in descriptors:
            req.descriptors.append(D(entries=[D.Entry(key=k, value=v) for k, v in entries]))
        return self.stub.ShouldRateLimit(req, timeout=5)

    def raw(self, method, body):
        call = self.channel.unary_unary(method, request_serializer=None,
                                        response_deserializer=None)
        return call(body, timeout=5)

    def stderr(self):
        with open(self.log) as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.channel.close()


def headers(fields):
    return {h.key: h.value for h in fields}


class RateLimitService(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="fleetlimit-rls-")
        cls.redis = Redis(cls.dir)

    @classmethod
    def tearDownClass(cls):
        cls.redis.stop()

    def config(self, prefix, n=5):
        path = os.path.join(self.dir, prefix + ".toml")
        with open(path, "w") as f:
            f.write('[redis]\nurl = "redis://127.0.0.1:%d"\nkey_prefix = "%s"\n'
                    'deadline = "500ms"\n' % (self.redis.port, prefix))
            f.write(LIMITS.format(n=n))
        return path

    def start(self, path):
        rls = Rls(path)
        self.addCleanup(rls.stop)
        return rls

    def test_limits_per_descriptor_are_exact_over_two_instances(self):
        path = self.config("two", n=5)
        a, b = self.start(path), self.start(path)
        key = [("generic_key", "api"), ("api_key", "k1")]
        ip = [("remote_address", "192.0.2.7")]
        codes = []
        for i in range(6):
            r = (a if i % 2 == 0 else b).ask("edge", key, ip)
            codes.append([s.code for s in r.statuses])
        # per-key: 5 OK then OVER_LIMIT; per-ip (3): 3 OK then OVER_LIMIT.
        self.assertEqual([c[0] for c in codes], [OK] * 5 + [OVER])
        self.assertEqual([c[1] for c in codes], [OK] * 3 + [OVER] * 3)
        r = a.ask("edge", key)
        self.assertEqual(r.overall_code, OVER)
        s = r.statuses[0]
        self.assertEqual((s.current_limit.requests_per_unit, s.current_limit.unit),
                         (5, rls_pb2.RateLimitResponse.RateLimit.HOUR))
        self.assertEqual(s.current_limit.name, "per-key")
        self.assertEqual(s.limit_remaining, 0)
        self.assertGreaterEqual(s.duration_until_reset.seconds, 1)

    def test_hits_addend_is_the_cost(self):
        rls = self.start(self.config("hits", n=5))
        key = [("generic_key", "api"), ("api_key", "k")]
        r = rls.ask("edge", key, hits=3)
        self.assertEqual(r.overall_code, OK)
        # 2 units left: no request of 3 fits, one of 2 does.
        self.assertEqual(r.statuses[0].limit_remaining, 0)
        self.assertEqual(rls.ask("edge", key, hits=3).overall_code, OVER)
        self.assertEqual(rls.ask("edge", key, hits=2).overall_code, OK)
        self.assertEqual(rls.ask("edge", key).overall_code, OVER)

    def test_a_nested_descriptor_picks_its_own_rule(self):
        rls = self.start(self.config("nested"))
        nested = [("message_type", "marketing"), ("to_number", "+15550100")]
        alone = [("to_number", "+15550100")]
        got = [rls.ask("messaging", nested).overall_code for _ in range(3)]
        self.assertEqual(got, [OK, OK, OVER])
        self.assertEqual(rls.ask("messaging", nested).statuses[0].current_limit.name, "marketing")
        got = [rls.ask("messaging", alone).overall_code for _ in range(5)]
        self.assertEqual(got, [OK] * 4 + [OVER])
        # Another message type matches no nested rule, and nothing else: OK.
        other = [("message_type", "alert"), ("to_number", "+15550100")]
        r = rls.ask("messaging", other)
        self.assertEqual(r.overall_code, OK)
        self.assertFalse(r.statuses[0].HasField("current_limit"))

    def test_shadow_mode_counts_and_never_refuses(self):
        rls = self.start(self.config("shadow"))
        rs = [rls.ask("shadow", [("api_key", "k")]) for _ in range(3)]
        self.assertEqual([r.overall_code for r in rs], [OK] * 3)
        self.assertEqual(rs[-1].statuses[0].limit_remaining, 0)

    def test_headers_to_add_are_the_layers_structured_fields(self):
        rls = self.start(self.config("headers", n=5))
        key = [("generic_key", "api"), ("api_key", "h")]
        r = rls.ask("edge", key)
        h = headers(r.response_headers_to_add)
        self.assertEqual(h, headers(r.request_headers_to_add))
        self.assertEqual(http_sf.parse(h["ratelimit-policy"].encode(), tltype="list"),
                         [("per-key", {"q": 5, "w": 3600})])
        [(name, params)] = http_sf.parse(h["ratelimit"].encode(), tltype="list")
        self.assertEqual((name, params["r"]), ("per-key", 4))
        self.assertEqual((h["x-ratelimit-limit"], h["x-ratelimit-remaining"]), ("5", "4"))
        for _ in range(4):
            rls.ask("edge", key)
        r = rls.ask("edge", key)
        self.assertEqual(r.overall_code, OVER)
        h = headers(r.response_headers_to_add)
        self.assertGreaterEqual(int(h["retry-after"]), 1)
        [(_, params)] = http_sf.parse(h["ratelimit"].encode(), tltype="list")
        self.assertEqual(params["r"], 0)

    def test_health_is_serving(self):
        rls = self.start(self.config("health"))
        # grpc.health.v1.HealthCheckResponse { status: SERVING (1) }
        for service in (b"", b"envoy.service.ratelimit.v3.RateLimitService"):
            body = (b"\x0a" + bytes([len(service)]) + service) if service else b""
            self.assertEqual(rls.raw("/grpc.health.v1.Health/Check", body), b"\x08\x01")

    def test_sighup_reloads_and_a_bad_file_changes_nothing(self):
        path = self.config("reload", n=5)
        rls = self.start(path)
        key = [("generic_key", "api"), ("api_key", "r")]
        limit = lambda: rls.ask("edge", key).statuses[0].current_limit.requests_per_unit
        self.assertEqual(limit(), 5)
        with open(path) as f:
            text = f.read()
        with open(path + ".new", "w") as f:
            f.write(text.replace("capacity = 5\nrefill = \"5/h\"", "capacity = 7\nrefill = \"7/h\""))
        os.replace(path + ".new", path)
        rls.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while limit() != 7 and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertEqual(limit(), 7)
        with open(path, "w") as f:
            f.write(text.replace("capacity = 5", "capacity = \"five\""))
        rls.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "refused" not in rls.stderr() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertIn("reload of %s refused" % path, rls.stderr())
        self.assertEqual(limit(), 7)

    def test_sigterm_stops_gracefully(self):
        rls = self.start(self.config("term"))
        rls.proc.send_signal(signal.SIGTERM)
        self.assertEqual(rls.proc.wait(timeout=10), 0)

    def test_bad_input_is_invalid_argument(self):
        rls = self.start(self.config("bad", n=3))
        key = [("generic_key", "api"), ("api_key", "good")]

        def invalid(call):
            with self.assertRaises(grpc.RpcError) as e:
                call()
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT,
                             e.exception.details())
            return e.exception.details()

        invalid(lambda: rls.ask("", key))
        invalid(lambda: rls.ask("edge"))
        invalid(lambda: rls.ask("edge", [("generic_key", "api"), ("api_key", "x" * 10240)]))
        invalid(lambda: rls.ask("edge", [("k%d" % i, "v") for i in range(1000)]))
        invalid(lambda: rls.ask("edge", [("remote_address", "not-an-ip")]))
        # A non-UTF-8 byte in a value: written by hand, as no protobuf
        # library sends one in a string field.
        entry = b"\x0a\x07api_key" + b"\x12\x02\xff\xfe"
        generic = b"\x0a\x0bgeneric_key\x12\x03api"
        desc = b"\x0a" + bytes([len(generic)]) + generic + b"\x0a" + bytes([len(entry)]) + entry
        body = b"\x0a\x04edge" + b"\x12" + bytes([len(desc)]) + desc
        details = invalid(lambda: rls.raw(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", body))
        self.assertIn("UTF-8", details)
        # None of it charged the good caller.
        self.assertEqual(rls.ask("edge", key).statuses[0].limit_remaining, 2)

    def test_with_redis_stopped_each_policy_answers(self):
        redis = Redis(self.dir)
        self.addCleanup(redis.stop)
        path = os.path.join(self.dir, "down.toml")
        with open(path, "w") as f:
            f.write('[redis]\nurl = "redis://127.0.0.1:%d"\nkey_prefix = "down"\n'
                    'deadline = "500ms"\n' % redis.port)
            f.write(LIMITS.format(n=4))
        rls = self.start(path)
        key = [("api_key", "k")]
        self.assertEqual(rls.ask("closed", key).overall_code, OK)
        redis.stop()
        self.assertEqual([rls.ask("open", key).overall_code for _ in range(6)], [OK] * 6)
        with self.assertRaises(grpc.RpcError) as e:
            rls.ask("closed", key)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
        # `local`: this instance's share, 4 / [fleet] size 2.
        got = [rls.ask("local", key).overall_code for _ in range(3)]
        self.assertEqual(got, [OK, OK, OVER])


if __name__ == "__main__":
    BIN = os.path.abspath(sys.argv.pop(1)) if len(sys.argv) > 1 else "fleetlimit"
    unittest.main(verbosity=2)
