"""docs/messages.md is the messages table's contract for readers: it must match the code.

The items are built by ``wsfleet.messages`` (both writers: ``Message.to_wire`` and the
pre-serialised ``batch_write_body``) and the key schema by ``template.yaml``; every attribute
they write must be documented with its type, and nothing documented may be absent.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from wsfleet.messages import Message, batch_write_body, local_sk, seq_sk
from wsfleet.record import connection_pk
from wsfleet_local.backend import find_template, load_template

DOC = Path(__file__).resolve().parents[2] / "docs" / "messages.md"
ROW = re.compile(r"^\| `(?P<name>[a-z_0-9]+)`(?: \([a-z]+\))? \| (?P<types>[A-Z](?: or [A-Z])*) \|")


def documented(section: str) -> dict[str, set[str]]:
    """``{attribute: {types}}`` from the table under ``## <section>``."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    rows = [ROW.match(line) for line in text[start : end if end > 0 else None].splitlines()]
    return {m["name"]: set(m["types"].split(" or ")) for m in rows if m}


def written_items() -> list[dict[str, dict[str, object]]]:
    """Every item shape a worker writes: numbered text, unnumbered binary, a marker; with and
    without retention; through both serialisers."""
    pk = connection_pk("c1")
    numbered = Message(pk, seq_sk(42), '{"x": 1}', 1_700_000_000_123, "w1", 3, seq=42)
    unnumbered = Message(pk, local_sk(3, 1_700_000_000_123, 7), b"\x00\x01", 1, "w1", 3)
    marker = Message(pk, seq_sk(43), "x" * 10, 1, "w1", 3, seq=43).as_marker(500_000)
    messages = (numbered, unnumbered, marker)
    items = [m.to_wire(expires_at) for m in messages for expires_at in (None, 1_800_000_000)]
    for expires_at in (None, 1_800_000_000):
        body = json.loads(batch_write_body("t", [(m, expires_at) for m in messages]))
        items += [request["PutRequest"]["Item"] for request in body["RequestItems"]["t"]]
    return items


def test_every_attribute_written_is_documented_with_its_type_and_nothing_else():
    attributes = documented("Attributes")
    assert len(attributes) >= 10  # the table parsed (an empty match would prove nothing)
    seen: dict[str, set[str]] = {}
    for item in written_items():
        for name, value in item.items():
            seen.setdefault(name, set()).update(value)
    assert set(seen) == set(attributes)
    for name, types in seen.items():
        assert types <= attributes[name], name


def test_the_key_is_the_templates_key_schema_and_its_examples_are_the_codes():
    key = documented("Key")
    table = load_template(find_template())["Resources"]["MessagesTable"]["Properties"]
    schema = {k["AttributeName"]: k["KeyType"] for k in table["KeySchema"]}
    types = {d["AttributeName"]: d["AttributeType"] for d in table["AttributeDefinitions"]}
    assert schema == {"pk": "HASH", "sk": "RANGE"}
    assert {name: {types[name]} for name in schema} == key
    assert table["TimeToLiveSpecification"]["AttributeName"] == "expires_at"
    text = DOC.read_text(encoding="utf-8")
    assert connection_pk("<connection id>") in text
    assert f"`{seq_sk(42)}`" in text
    assert f"`{local_sk(3, 1_700_000_000_123, 7)}`" in text
