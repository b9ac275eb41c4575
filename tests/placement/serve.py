"""A real OpenStack Placement for tests/placement.rs (scripts/placement-venv builds its venv).

    serve.py CONFIG_DIR    # sqlite database and noauth2 in CONFIG_DIR/placement.conf

Creates the schema, binds an ephemeral loopback port, writes it to CONFIG_DIR/port, then
serves (one request at a time, as wsgiref does) until killed. Placement's own log lines go to
stdout and stderr.
"""
import os
import subprocess
import sys
from wsgiref.simple_server import WSGIRequestHandler, make_server

conf_dir = sys.argv[1]
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

server = make_server("127.0.0.1", 0, application, handler_class=Quiet)
with open(os.path.join(conf_dir, "port.new"), "w") as f:
    f.write("%d\n" % server.server_address[1])
os.rename(os.path.join(conf_dir, "port.new"), os.path.join(conf_dir, "port"))
server.serve_forever()
