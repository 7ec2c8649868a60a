"""wsfleet local runtime: embedded backend, upstream simulator, local fleet and the `wsfleet` CLI."""
