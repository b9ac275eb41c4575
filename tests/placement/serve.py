"""A real OpenStack Placement for tests/placement.rs (scripts/placement-venv builds its venv).

    serve.py CONFIG_DIR [--tls CERT KEY] [--cap-max-version 1.17]

Creates the schema, binds an ephemeral loopback port, writes it to CONFIG_DIR/port, then
serves (one request at a time, as wsgiref does) until killed. Placement's own log lines go to
stdout and stderr.

Every request is also written, before Placement answers it, as one JSON line to
CONFIG_DIR/requests.log: method, path, query and the headers a client chooses
(OpenStack-API-Version, User-Agent, X-Openstack-Request-Id), so the test can see what the
daemon asked. --tls serves https with the given certificate. --cap-max-version rewrites the
max_version of Placement's version document (GET /) to the one given, as an older Placement
(Queens: 1.17) would answer; every other answer is Placement's own.
"""
import json
import os
import ssl
import subprocess
import sys
from wsgiref.simple_server import WSGIRequestHandler, make_server

conf_dir = sys.argv[1]
args = sys.argv[2:]
tls = None
cap = None
while args:
    if args[0] == "--tls":
        tls = (args[1], args[2])
        args = args[3:]
    elif args[0] == "--cap-max-version":
        cap = args[1]
        args = args[2:]
    else:
        sys.exit("serve.py: unknown argument %r" % args[0])

conf = os.path.join(conf_dir, "placement.conf")
with open(conf, "w") as f:
    f.write(
        "[api]\nauth_strategy = noauth2\n"
        "[placement_database]\nconnection = sqlite:///%s/placement.db\n" % conf_dir
    )
os.environ["OS_PLACEMENT_CONFIG_DIR"] = conf_dir
subprocess.run(
    [os.path.join(os.path.dirname(sys.executable), "placement-manage"), "--config-file", conf, "db", "sync"],
    check=True,
)


class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        sys.stderr.write("placement: %s\n" % (args[0] % args[1:]))


from placement.wsgi.api import application  # noqa: E402 (after the config dir is set)

requests_log = os.path.join(conf_dir, "requests.log")


def recorded(environ, start_response):
    with open(requests_log, "a") as f:
        f.write(json.dumps({
            "method": environ.get("REQUEST_METHOD"),
            "path": environ.get("PATH_INFO"),
            "query": environ.get("QUERY_STRING", ""),
            "version": environ.get("HTTP_OPENSTACK_API_VERSION"),
            "user_agent": environ.get("HTTP_USER_AGENT"),
            "request_id": environ.get("HTTP_X_OPENSTACK_REQUEST_ID"),
        }) + "\n")
    if cap is None or environ.get("PATH_INFO") not in ("", "/"):
        return application(environ, start_response)
    answer = {}

    def keep(status, headers, exc_info=None):
        answer["status"] = status
        answer["headers"] = [(k, v) for k, v in headers if k.lower() != "content-length"]

    body = b"".join(application(environ, keep))
    doc = json.loads(body)
    for v in doc["versions"]:
        v["max_version"] = cap
    # One body: wsgiref sets Content-Length itself.
    start_response(answer["status"], answer["headers"])
    return [json.dumps(doc).encode()]


server = make_server("127.0.0.1", 0, recorded, handler_class=Quiet)
if tls:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tls[0], tls[1])
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
with open(os.path.join(conf_dir, "port.new"), "w") as f:
    f.write("%d\n" % server.server_address[1])
os.rename(os.path.join(conf_dir, "port.new"), os.path.join(conf_dir, "port"))
server.serve_forever()
