"""The CNI protocol: the environment and stdin in, one result or error JSON on stdout (protocol),
the request and result as plain data per spec version (request, result), the spec's error codes
(errors) and the per-call log (log). Imports only cni.lean."""
