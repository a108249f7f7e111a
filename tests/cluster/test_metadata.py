"""The metadata codecs (one JSON document per znode) and partition range text.

Round trips are checked with hypothesis over the whole value space of every
codec; decoding is checked to be strict: anything that is not exactly a
version-1 document of the right kind raises MetadataError naming the field.
"""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz_client.cluster.metadata import (
    CODEC_VERSION,
    NO_SESSION,
    UNRESOLVED,
    ClusterParams,
    MetadataError,
    Ownership,
    PartitionMetadata,
    ReplicaAssignment,
    ReplicaState,
    ServerRegistration,
    validate_storage_address,
)
from waltz_client.cluster.partition_ranges import format_partition_ranges, parse_partition_ranges

# --- strategies ----------------------------------------------------------------------------

ints = st.integers(min_value=0, max_value=2**63 - 1)
positive = st.integers(min_value=1, max_value=2**31 - 1)
session_ids = st.integers(min_value=NO_SESSION, max_value=2**63 - 1)
ports = st.integers(min_value=1, max_value=65535)
hosts = st.one_of(
    st.from_regex(r"[a-z][a-z0-9-]{0,15}(\.[a-z][a-z0-9-]{0,15}){0,3}", fullmatch=True),
    st.just("::1"),  # an IPv6 host: the port is after the last colon
    st.text(min_size=1, max_size=20),
)
addresses = st.builds(lambda h, p: f"{h}:{p}", hosts, ports)
partition_sets = st.frozensets(st.integers(min_value=0, max_value=10_000), max_size=40)

cluster_params = st.builds(ClusterParams, st.text(), st.uuids(), positive, positive)


@st.composite
def replica_assignments(draw) -> ReplicaAssignment:
    storages = draw(st.dictionaries(addresses, partition_sets, max_size=8))
    groups = {s: draw(st.integers(min_value=0, max_value=2**31)) for s in storages}
    return ReplicaAssignment(storages, groups)


replica_states = st.builds(
    ReplicaState, session_ids, st.integers(min_value=UNRESOLVED, max_value=2**63 - 1)
)
partition_metadata = st.builds(
    PartitionMetadata,
    ints,
    session_ids,
    st.dictionaries(addresses, replica_states, max_size=6),
)
server_registrations = st.builds(
    ServerRegistration,
    st.text(),
    st.text(),
    st.integers(0, 65535),
    st.integers(0, 65535),
    st.text(),
)
ownerships = st.builds(
    Ownership,
    st.dictionaries(
        st.integers(min_value=0, max_value=100_000),
        st.tuples(st.none() | st.text(), ints),
        max_size=40,
    ),
)


# --- round trips ---------------------------------------------------------------------------


def _check_document(data: bytes, kind: str) -> dict:
    """Every codec writes one UTF-8 JSON object carrying its kind and the codec version."""
    doc = json.loads(data.decode("utf-8"))
    assert isinstance(doc, dict)
    assert doc["kind"] == kind
    assert doc["version"] == CODEC_VERSION
    return doc


@given(cluster_params)
def test_cluster_params_round_trip(params: ClusterParams) -> None:
    data = params.encode()
    doc = _check_document(data, "cluster")
    assert doc["key"] == str(params.key)
    assert ClusterParams.decode(data) == params
    assert ClusterParams.decode(data).encode() == data  # canonical: encoding is stable


@given(replica_assignments())
def test_replica_assignment_round_trip(assignment: ReplicaAssignment) -> None:
    data = assignment.encode()
    doc = _check_document(data, "replica-assignment")
    for s, entry in doc["storages"].items():
        assert entry["partitions"] == sorted(assignment.storages[s])  # sorted list on disk
    assert ReplicaAssignment.decode(data) == assignment
    assert ReplicaAssignment.decode(data).encode() == data


@given(st.dictionaries(addresses, partition_sets, max_size=8))
def test_replica_assignment_without_groups_decodes_as_group_zero(storages) -> None:
    decoded = ReplicaAssignment.decode(ReplicaAssignment(storages).encode())
    assert decoded.storages == storages
    assert decoded.groups == dict.fromkeys(storages, 0)


@given(partition_metadata)
def test_partition_metadata_round_trip(meta: PartitionMetadata) -> None:
    data = meta.encode()
    _check_document(data, "partition")
    assert PartitionMetadata.decode(data) == meta
    assert PartitionMetadata.decode(data).encode() == data


def test_fresh_partition_metadata_is_generation_zero_without_session() -> None:
    doc = _check_document(PartitionMetadata().encode(), "partition")
    assert doc == {
        "version": 1,
        "kind": "partition",
        "generation": 0,
        "session_id": NO_SESSION,
        "replicas": {},
    }


@given(server_registrations)
def test_server_registration_round_trip(reg: ServerRegistration) -> None:
    data = reg.encode()
    _check_document(data, "server")
    assert ServerRegistration.decode(data) == reg
    assert reg.endpoint == f"{reg.host}:{reg.port}"


def test_a_registration_names_its_tls_name_only_when_it_has_one() -> None:
    """Without one the node is what it always was (and clients check the host); a
    reader that predates the field ignores it, as decoding ignores unknown fields."""
    plain = ServerRegistration("s0", "10.0.0.1", 9100, 9101)
    assert "tls_name" not in json.loads(plain.encode())
    assert plain.verified_name == "10.0.0.1"
    named = ServerRegistration("s0", "10.0.0.1", 9100, 9101, "waltz.prod.svc")
    assert json.loads(named.encode())["tls_name"] == "waltz.prod.svc"
    assert ServerRegistration.decode(named.encode()) == named
    assert (named.endpoint, named.verified_name) == ("10.0.0.1:9100", "waltz.prod.svc")
    doc = json.loads(named.encode())
    doc["tls_name"] = 5
    expect_error(ServerRegistration, doc, "'tls_name'", "str")


@given(ownerships)
def test_ownership_round_trip(ownership: Ownership) -> None:
    data = ownership.encode()
    doc = _check_document(data, "ownership")
    assert set(doc["partitions"]) == {str(p) for p in ownership.partitions}
    assert Ownership.decode(data) == ownership
    assert Ownership.decode(data).encode() == data


# --- strict decoding -----------------------------------------------------------------------

KEY = uuid.UUID("6d2f1a52-3c1e-4f7a-9b0e-7a3f5c2d9e10")
SAMPLES = {
    ClusterParams: ClusterParams("prod", KEY, 8, 3),
    ReplicaAssignment: ReplicaAssignment(
        {"s0:9000": frozenset({0, 1}), "s1:9000": frozenset({1})}, {"s0:9000": 0, "s1:9000": 1}
    ),
    PartitionMetadata: PartitionMetadata(
        2, 7, {"s0:9000": ReplicaState(7, UNRESOLVED), "s1:9000": ReplicaState(6, 120)}
    ),
    ServerRegistration: ServerRegistration("server-0", "10.0.0.1", 9100, 9101),
    Ownership: Ownership({0: ("server-0", 3), 1: (None, 0)}),
}
CODECS = list(SAMPLES)


def sample_doc(codec) -> dict:
    return json.loads(SAMPLES[codec].encode())


def decode_doc(codec, doc) -> object:
    return codec.decode(json.dumps(doc).encode())


def expect_error(codec, doc, *fragments: str) -> None:
    with pytest.raises(MetadataError) as info:
        decode_doc(codec, doc)
    message = str(info.value)
    assert message.startswith(f"{codec.KIND}:"), message  # names the node kind
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.__name__)
def test_samples_decode(codec) -> None:
    assert decode_doc(codec, sample_doc(codec)) == SAMPLES[codec]


@pytest.mark.parametrize(
    ("codec", "other"),
    [(c, o) for c in CODECS for o in CODECS if c is not o],
    ids=lambda c: c.__name__,
)
def test_wrong_kind_is_refused(codec, other) -> None:
    with pytest.raises(MetadataError) as info:
        codec.decode(SAMPLES[other].encode())
    assert str(info.value).startswith(f"{codec.KIND}:")
    assert repr(other.KIND) in str(info.value)  # says what the node really holds


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.__name__)
def test_missing_kind_is_refused(codec) -> None:
    doc = sample_doc(codec)
    del doc["kind"]
    expect_error(codec, doc, "None")


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    "version", [0, 2, 99, -1, "1", 1.5, None, [1]], ids=lambda v: f"version={v!r}"
)
def test_unknown_version_is_refused(codec, version) -> None:
    doc = sample_doc(codec)
    doc["version"] = version
    expect_error(codec, doc, "codec version", repr(version))


@pytest.mark.parametrize("version", [True, 1.0], ids=repr)
def test_version_must_be_the_integer_1(version) -> None:
    """Strict decoding: ``true`` and ``1.0`` are not the integer 1 (both equal 1 in Python),
    just as ``_field`` refuses a bool for an integer field."""
    for codec in CODECS:
        doc = sample_doc(codec)
        doc["version"] = version
        expect_error(codec, doc, "codec version")


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.__name__)
def test_missing_version_is_refused(codec) -> None:
    doc = sample_doc(codec)
    del doc["version"]
    expect_error(codec, doc, "codec version")


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    "data",
    [b"", b"not json", b"\xff\xfe", b"{", b"[1, 2]", b"null", b"42", b'"cluster"'],
    ids=repr,
)
def test_non_json_or_non_object_is_refused(codec, data) -> None:
    with pytest.raises(MetadataError) as info:
        codec.decode(data)
    assert str(info.value).startswith(f"{codec.KIND}:")


REQUIRED_FIELDS = [
    (ClusterParams, ["name", "key", "num_partitions", "num_replicas"]),
    (ReplicaAssignment, ["storages"]),
    (PartitionMetadata, ["generation", "session_id", "replicas"]),
    (ServerRegistration, ["server_id", "host", "port", "http_port"]),
    (Ownership, ["partitions"]),
]


@pytest.mark.parametrize(
    ("codec", "name"),
    [(c, f) for c, fields in REQUIRED_FIELDS for f in fields],
    ids=lambda x: getattr(x, "__name__", x),
)
def test_missing_field_is_refused(codec, name) -> None:
    doc = sample_doc(codec)
    del doc[name]
    expect_error(codec, doc, repr(name))


def _nested(codec):
    """(a path to a nested field, its name) for the codecs with nested entries."""
    return {
        ReplicaAssignment: [(("storages", "s0:9000"), "group")],
        PartitionMetadata: [
            (("replicas", "s0:9000"), "session_id"),
            (("replicas", "s0:9000"), "closing_high_water_mark"),
        ],
        Ownership: [(("partitions", "0"), "generation")],
    }.get(codec, [])


def _at(doc: dict, path: tuple[str, ...]) -> dict:
    for key in path:
        doc = doc[key]
    return doc


@pytest.mark.parametrize(
    ("codec", "path", "name"),
    [(c, p, n) for c in CODECS for p, n in _nested(c)],
    ids=lambda x: getattr(x, "__name__", str(x)),
)
def test_missing_nested_field_is_refused(codec, path, name) -> None:
    doc = sample_doc(codec)
    del _at(doc, path)[name]
    expect_error(codec, doc, repr(name))


INT_FIELDS = [
    (ClusterParams, (), "num_partitions"),
    (ClusterParams, (), "num_replicas"),
    (PartitionMetadata, (), "generation"),
    (PartitionMetadata, (), "session_id"),
    (PartitionMetadata, ("replicas", "s0:9000"), "session_id"),
    (PartitionMetadata, ("replicas", "s0:9000"), "closing_high_water_mark"),
    (ServerRegistration, (), "port"),
    (ServerRegistration, (), "http_port"),
    (ReplicaAssignment, ("storages", "s0:9000"), "group"),
    (Ownership, ("partitions", "0"), "generation"),
]


@pytest.mark.parametrize(
    ("codec", "path", "name"), INT_FIELDS, ids=lambda x: getattr(x, "__name__", str(x))
)
@pytest.mark.parametrize("value", [True, False, "3", 3.0, None, [3], {"n": 3}], ids=repr)
def test_integer_field_of_wrong_type_is_refused(codec, path, name, value) -> None:
    doc = sample_doc(codec)
    _at(doc, path)[name] = value
    expect_error(codec, doc, repr(name), "integer")


STR_FIELDS = [
    (ClusterParams, "name"),
    (ServerRegistration, "server_id"),
    (ServerRegistration, "host"),
]


@pytest.mark.parametrize(("codec", "name"), STR_FIELDS, ids=lambda x: getattr(x, "__name__", x))
@pytest.mark.parametrize("value", [5, True, None, ["a"], {"a": 1}], ids=repr)
def test_string_field_of_wrong_type_is_refused(codec, name, value) -> None:
    doc = sample_doc(codec)
    doc[name] = value
    expect_error(codec, doc, repr(name), "str")


@pytest.mark.parametrize(
    ("codec", "path", "name", "value"),
    [
        (ClusterParams, (), "num_partitions", 0),
        (ClusterParams, (), "num_partitions", -5),
        (ClusterParams, (), "num_replicas", 0),
        (PartitionMetadata, (), "generation", -1),
        (PartitionMetadata, (), "session_id", -2),
        (PartitionMetadata, ("replicas", "s0:9000"), "session_id", -2),
        (PartitionMetadata, ("replicas", "s0:9000"), "closing_high_water_mark", -3),
        (ServerRegistration, (), "port", -1),
        (ServerRegistration, (), "http_port", -1),
        (ReplicaAssignment, ("storages", "s0:9000"), "group", -1),
        (Ownership, ("partitions", "0"), "generation", -1),
    ],
    ids=lambda x: getattr(x, "__name__", str(x)),
)
def test_value_below_bound_is_refused(codec, path, name, value) -> None:
    doc = sample_doc(codec)
    _at(doc, path)[name] = value
    expect_error(codec, doc, repr(name), ">=", str(value))


def test_minimum_values_are_accepted() -> None:
    meta = PartitionMetadata(0, NO_SESSION, {"s:1": ReplicaState(NO_SESSION, UNRESOLVED)})
    assert PartitionMetadata.decode(meta.encode()) == meta
    params = ClusterParams("", KEY, 1, 1)
    assert ClusterParams.decode(params.encode()) == params


@pytest.mark.parametrize("value", ["not-a-uuid", "", KEY.hex[:-1], 5, None, True])
def test_cluster_key_must_be_a_uuid(value) -> None:
    doc = sample_doc(ClusterParams)
    doc["key"] = value
    expect_error(ClusterParams, doc, "'key'")


def test_cluster_key_accepts_any_uuid_spelling_and_normalises_it() -> None:
    doc = sample_doc(ClusterParams)
    doc["key"] = KEY.hex.upper()
    assert decode_doc(ClusterParams, doc).key == KEY


BAD_ADDRESSES = [
    "no-port",
    "host:",
    ":9000",
    "host:0",
    "host:65536",
    "host:http",
    "host:-1",
    "host:+80",
    "host: 80",
    "",
]


@pytest.mark.parametrize("address", BAD_ADDRESSES, ids=repr)
def test_assignment_with_bad_storage_address_is_refused(address) -> None:
    doc = sample_doc(ReplicaAssignment)
    doc["storages"][address] = {"group": 0, "partitions": [0]}
    expect_error(ReplicaAssignment, doc, repr(address), "host:port")


@pytest.mark.parametrize("address", BAD_ADDRESSES, ids=repr)
def test_validate_storage_address_refuses(address) -> None:
    with pytest.raises(ValueError, match="host:port"):
        validate_storage_address(address)


@pytest.mark.parametrize("address", ["a:1", "a:65535", "10.0.0.1:9000", "::1:9000", "h.x:80"])
def test_validate_storage_address_accepts(address) -> None:
    assert validate_storage_address(address) == address


@pytest.mark.parametrize(
    "partitions",
    [None, 5, "0-3", {"0": 1}, [-1], [0, True], [0, "1"], [1.5], [None], [[0]]],
    ids=repr,
)
def test_assignment_with_bad_partition_list_is_refused(partitions) -> None:
    doc = sample_doc(ReplicaAssignment)
    doc["storages"]["s0:9000"]["partitions"] = partitions
    expect_error(ReplicaAssignment, doc, "s0:9000.partitions", "list of partition IDs")


def test_assignment_with_missing_partition_list_is_refused() -> None:
    doc = sample_doc(ReplicaAssignment)
    del doc["storages"]["s1:9000"]["partitions"]
    expect_error(ReplicaAssignment, doc, "s1:9000.partitions")


@pytest.mark.parametrize("codec_path", [("storages",), ("replicas",), ("partitions",)])
@pytest.mark.parametrize("value", [[], "x", 3, None])
def test_top_level_maps_must_be_objects(codec_path, value) -> None:
    codec = {"storages": ReplicaAssignment, "replicas": PartitionMetadata}.get(
        codec_path[0], Ownership
    )
    doc = sample_doc(codec)
    doc[codec_path[0]] = value
    expect_error(codec, doc, repr(codec_path[0]))


@pytest.mark.parametrize(
    ("codec", "path", "key"),
    [
        (ReplicaAssignment, ("storages",), "s0:9000"),
        (PartitionMetadata, ("replicas",), "s0:9000"),
        (Ownership, ("partitions",), "0"),
    ],
    ids=lambda x: getattr(x, "__name__", str(x)),
)
@pytest.mark.parametrize("value", [5, "x", [1], None], ids=repr)
def test_entries_must_be_objects(codec, path, key, value) -> None:
    doc = sample_doc(codec)
    _at(doc, path)[key] = value
    expect_error(codec, doc, key)


@pytest.mark.parametrize("key", ["x", "-1", "1.0", "", " 1", "0x1", "\u00b2", "\u0661"], ids=repr)
def test_ownership_partition_keys_must_be_decimal_ids(key) -> None:
    """Only ASCII decimal IDs: superscript two (U+00B2) passes str.isdigit() but int() fails
    on it, and the Arabic-Indic digit one (U+0661) would silently alias partition 1."""
    doc = sample_doc(Ownership)
    doc["partitions"][key] = {"server": None, "generation": 0}
    expect_error(Ownership, doc, repr(key))


@pytest.mark.parametrize("server", [5, True, ["s"], {"id": "s"}], ids=repr)
def test_ownership_server_must_be_string_or_null(server) -> None:
    doc = sample_doc(Ownership)
    doc["partitions"]["0"]["server"] = server
    expect_error(Ownership, doc, "partition 0", "server")


def test_kind_is_case_sensitive() -> None:
    doc = sample_doc(ClusterParams)
    doc["kind"] = "Cluster"
    expect_error(ClusterParams, doc, "'Cluster'")


# --- partition ranges ----------------------------------------------------------------------


@given(st.sets(st.integers(min_value=0, max_value=300), min_size=1))
def test_partition_ranges_round_trip(ids: set[int]) -> None:
    text = format_partition_ranges(ids)
    assert parse_partition_ranges(text) == ids
    assert parse_partition_ranges(text, num_partitions=max(ids) + 1) == ids
    # shortest form: one item per maximal run of consecutive IDs
    runs = sum(1 for i in ids if i - 1 not in ids)
    assert len(text.split(",")) == runs
    assert format_partition_ranges(sorted(ids)) == text  # lists and sets alike


@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 20)), min_size=1, max_size=10))
def test_parse_any_range_list(items) -> None:
    text = ",".join(str(lo) if n == 0 else f"{lo}-{lo + n}" for lo, n in items)
    expected = {p for lo, n in items for p in range(lo, lo + n + 1)}
    assert parse_partition_ranges(text) == expected
    assert parse_partition_ranges(format_partition_ranges(expected)) == expected


@pytest.mark.parametrize(
    ("ids", "text"),
    [({0, 1, 2, 5}, "0-2,5"), ({3}, "3"), ({1, 3}, "1,3"), ({0, 1}, "0-1"), (set(), "")],
)
def test_format_partition_ranges_examples(ids, text) -> None:
    assert format_partition_ranges(ids) == text


def test_parse_examples() -> None:
    assert parse_partition_ranges("0-6,9") == {0, 1, 2, 3, 4, 5, 6, 9}
    assert parse_partition_ranges(" 3 , 1-2 ") == {1, 2, 3}
    assert parse_partition_ranges("2-2") == {2}
    assert parse_partition_ranges("1,1,0-1") == {0, 1}
    assert parse_partition_ranges("all", num_partitions=4) == {0, 1, 2, 3}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty item"),
        (",", "empty item"),
        ("1,,2", "empty item"),
        ("1,", "empty item"),
        ("x", "'x'"),
        ("1-x", "'1-x'"),
        ("-1", "'-1'"),
        ("1-", "'1-'"),
        ("-", "'-'"),
        ("1-2-3", "'1-2-3'"),
        ("1.5", "'1.5'"),
        ("5-2", "'5-2'"),
        ("all", "'all' needs"),
    ],
    ids=repr,
)
def test_parse_errors(text, fragment) -> None:
    with pytest.raises(ValueError) as info:
        parse_partition_ranges(text)
    assert fragment in str(info.value)


@pytest.mark.parametrize("text", ["8", "0-8", "3,9"])
def test_parse_refuses_ids_outside_the_cluster(text) -> None:
    with pytest.raises(ValueError, match=r"outside 0\.\.7"):
        parse_partition_ranges(text, num_partitions=8)


def test_a_later_cluster_node_is_this_cluster_grown_or_refused() -> None:
    key = uuid.uuid4()
    now = ClusterParams("c", key, 4, 3)
    assert now.grown_to(ClusterParams("c", key, 4, 3)) is None
    assert now.grown_to(ClusterParams("c", key, 6, 3)) == 6
    with pytest.raises(MetadataError, match="fewer than 4 \\(partitions are never removed\\)"):
        now.grown_to(ClusterParams("c", key, 2, 3))
    with pytest.raises(MetadataError, match="not this cluster"):
        now.grown_to(ClusterParams("c", uuid.uuid4(), 6, 3))
