"""Stand-ins for standard-library modules too costly for a process started once per Pod, each
checked against the module it replaces by property tests in tests/cni/lean: addr (ipaddress),
fastjson (json), record (dataclasses), spawn (subprocess). Imports nothing from cni."""
