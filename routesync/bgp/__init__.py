"""route-sync speaks BGP through ExaBGP: ``plan`` (pure), ``speaker`` (the child process and its
API), ``relay`` (ExaBGP's API process), ``status`` (what ``show`` and the metrics read)."""
