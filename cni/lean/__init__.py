"""Stand-ins for standard-library modules too costly for a process started once per Pod, each
checked against the module it replaces by an equivalence test in tests/cni/lean: addr (ipaddress),
fastjson (json; and the typed field reader of decoded objects), record (dataclasses, also for
IPAM), spawn (subprocess), typecheck (typing's TYPE_CHECKING). Each module's docstring opens with
why it stands in, and names its test. Imports nothing from cni."""
