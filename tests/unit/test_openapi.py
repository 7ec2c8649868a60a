"""docs/openapi.json is the OpenAPI document the router's Powertools resolver builds.

Checked in so clients can generate code and reviewers see API changes in the diff; this test
fails when the router's routes or models change without it. Regenerate with `make openapi`.
(It is not yet the API Gateway definition: see docs/deploy.md, "API definition".)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from wsfleet_local.handler_loader import load_function

ROOT = Path(__file__).resolve().parents[2]
CHECKED_IN = ROOT / "docs" / "openapi.json"


def built() -> dict[str, object]:
    router = load_function("router")
    text = router.app.get_openapi_json_schema(
        title="wsfleet", version="0.1.0", description="Connections of the wsfleet fleet."
    )
    return dict(json.loads(text))


def test_checked_in_openapi_matches_the_router() -> None:
    document = built()
    if os.environ.get("WSFLEET_UPDATE_OPENAPI") == "1":
        CHECKED_IN.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    assert json.loads(CHECKED_IN.read_text()) == document, "run `make openapi`"


def test_openapi_covers_the_routes_readme_documents() -> None:
    paths = json.loads(CHECKED_IN.read_text())["paths"]
    assert set(paths["/events"]) == {"post"}
    assert set(paths["/connections"]) == {"get"}
    assert set(paths["/connections/{connection_id}"]) == {"get", "put", "delete"}
