"""wsfleet local runtime: embedded backend, upstream simulator, local fleet, the `wsfleet` CLI."""
