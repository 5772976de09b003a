"""Open vSwitch for a Node without its own: what Ferry's ``openvswitch`` container runs (plan: the
database steps and the daemons' command lines, pure) and the supervisor that runs them
(supervise), or watches the host's daemons with ``ovsDaemons: host``."""
