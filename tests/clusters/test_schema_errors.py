"""Bad cluster files: every problem is one line naming the file, line, field, allowed values and the fix."""

from __future__ import annotations


import pytest

import clusters
from clusters.errors import ConfigError
from tests.clusters.conftest import assert_rejected


def pool(data, i=0):
    return data["gpu_pools"][i]


CASES = [
    # (id, base, mutate, field path in the message, fragment of the fix)
    ("unknown-field", "prod-gke", lambda d: pool(d).update(maxnodes=3), "gpu_pools[0].maxnodes", "did you mean 'max_nodes'"),
    ("missing-required", "prod-gke", lambda d: d.pop("environment"), "environment", "required field is missing; add it"),
    ("bad-environment", "prod-gke", lambda d: d.update(environment="production"), "environment", "allowed: 'dev', 'staging' or 'prod'"),
    ("bad-scheduler", "prod-gke", lambda d: d.update(scheduler="slurm"), "scheduler", "allowed: 'gke' or 'nomad'"),
    ("name-not-dns", "prod-gke", lambda d: d.update(name="Prod_GKE"), "name", "not DNS-safe"),
    ("name-not-file", "prod-gke", lambda d: d.update(name="prod-gke-2"), "name", "must equal the file name 'prod-gke'"),
    ("bad-cidr", "prod-gke", lambda d: d["gcp"].update(subnet_cidr="10.10.0.1/20"), "gcp.subnet_cidr", "host bits zero"),
    ("overlap", "prod-gke", lambda d: d["gcp"].update(services_cidr="10.10.8.0/24"), "gcp.services_cidr", "overlaps subnet_cidr"),
    ("master-not-28", "prod-gke", lambda d: d["gcp"].update(master_cidr="172.16.0.0/24"), "gcp.master_cidr", "must be a /28"),
    ("gke-needs-master", "prod-gke", lambda d: d["gcp"].pop("master_cidr"), "gcp.master_cidr", "add it"),
    ("zone-outside-region", "prod-gke", lambda d: d["gcp"].update(zones=["us-east1-b"]), "gcp.zones[0]", "not in region 'us-central1'"),
    ("unknown-machine", "prod-gke", lambda d: pool(d).update(machine_type="a3-highgpu-9g"), "gpu_pools[0].machine_type", "did you mean 'a3-highgpu-8g'"),
    ("gpus-mismatch", "prod-gke", lambda d: pool(d).update(gpus_per_node=4), "gpu_pools[0].gpus_per_node", "set gpus_per_node: 8 or pick a3-highgpu-4g"),
    ("accelerator-mismatch", "prod-gke", lambda d: pool(d).update(accelerator="nvidia-l4"), "gpu_pools[0].accelerator", "set accelerator: nvidia-h100-80gb"),
    ("n1-needs-count", "dev-gke", lambda d: pool(d).pop("gpus_per_node"), "gpu_pools[0].gpus_per_node", "one of [1, 2, 4]"),
    ("n1-bad-count", "dev-gke", lambda d: pool(d).update(gpus_per_node=3), "gpu_pools[0].gpus_per_node", "allowed: [1, 2, 4]"),
    ("spot-and-reservation", "prod-gke", lambda d: pool(d).update(spot=True), "gpu_pools[0].reservation", "remove reservation or set spot: false"),
    ("compact-two-zones", "prod-gke", lambda d: pool(d, 1).update(placement="COMPACT"), "gpu_pools[1].placement", "needs exactly one zone"),
    ("static-and-autoscaling", "prod-gke", lambda d: pool(d, 1).update(node_count=2), "gpu_pools[1].node_count", "excludes autoscaling"),
    ("min-above-max", "prod-gke", lambda d: pool(d, 1).update(min_nodes=9), "gpu_pools[1].min_nodes", "lower min_nodes or raise max_nodes"),
    ("reservation-two-cluster-zones", "prod-gke", lambda d: pool(d).pop("zones"), "gpu_pools[0].reservation",
     "reservation h100-reservation-2026 is zonal but the pool spans 2 zones (us-central1-a, us-central1-b); set zones: [<the reservation's zone>]"),
    ("reservation-two-pool-zones", "prod-gke", lambda d: pool(d).update(zones=["us-central1-a", "us-central1-b"], placement=None),
     "gpu_pools[0].reservation", "is zonal but the pool spans 2 zones"),
    ("dws-with-reservation", "prod-gke", lambda d: pool(d).update(queued_provisioning=True), "gpu_pools[0].queued_provisioning", "cannot use a reservation"),
    ("duplicate-pool", "prod-gke", lambda d: pool(d, 1).update(name="h100"), "gpu_pools[1].name", "duplicate pool name 'h100'"),
    ("pool-zone-unknown", "prod-gke", lambda d: pool(d, 1).update(zones=["us-central1-f"]), "gpu_pools[1].zones[0]", "add it to gcp.zones"),
    ("user-member-prod", "prod-gke", lambda d: d["iam"]["grants"][0].update(members=["user:alice@example.com"]), "iam.grants[0].members[0]", "grant a group: or serviceAccount:"),
    ("bad-member", "prod-gke", lambda d: d["iam"]["grants"][0].update(members=["ml-platform@example.com"]), "iam.grants[0].members[0]", "write 'group:team@example.com'"),
    ("grant-no-reason", "prod-gke", lambda d: d["iam"]["grants"][0].update(reason="ok"), "iam.grants[0].reason", "at least 10 characters"),
    ("bad-bool", "prod-gke", lambda d: pool(d, 1).update(spot="treu"), "gpu_pools[1].spot", "write true or false"),
    ("bad-state-backend", "prod-gke", lambda d: d.update(state={"backend": "s3", "bucket": "x"}), "state", "'local', 'gcs', 'tfc'"),
    ("nomad-needs-section", "prod-nomad", lambda d: d.pop("nomad"), "nomad", "needs a nomad: section"),
    ("nomad-section-on-gke", "prod-gke", lambda d: d.update(nomad={"datacenter": "dc1", "vault_addr": "https://v:8200"}), "nomad", "only applies to scheduler: nomad"),
    ("no-pools", "prod-gke", lambda d: d.update(gpu_pools=[]), "gpu_pools", "too few entries; allowed: at least 1; add entries"),
    ("bad-project", "prod-gke", lambda d: d["gcp"].update(project="ML"), "gcp.project", "not a GCP project id"),
]


@pytest.mark.parametrize(("base", "mutate", "field", "fix"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_fails_when_cluster_file_is_wrong(write_cluster, base, mutate, field, fix):
    assert_rejected(write_cluster(base, mutate), field, fix)


def test_error_points_at_the_yaml_line_of_the_field(write_cluster):
    path = write_cluster("prod-gke", lambda d: d["gpu_pools"][0].update(gpus_per_node=4))
    with pytest.raises(ConfigError) as err:
        clusters.load(path)
    (problem,) = err.value.problems
    assert path.read_text().splitlines()[problem.line - 1].strip() == "gpus_per_node: 4"


def test_all_problems_of_all_files_are_reported_at_once(write_cluster):
    write_cluster("prod-gke", lambda d: d.update(environment="production"))
    bad = write_cluster("dev-gke", lambda d: d["gpu_pools"][0].update(gpus_per_node=3))
    with pytest.raises(ConfigError) as err:
        clusters.load_all(bad.parent)
    files = {p.file.rsplit("/", 1)[-1] for p in err.value.problems}
    assert files == {"prod-gke.yaml", "dev-gke.yaml"}


def test_fails_when_yaml_is_not_parseable(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\ngpu_pools: [\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml:\d+: invalid YAML"):
        clusters.load(path)


@pytest.mark.parametrize(("text", "message"), [
    ("name: x\nkey: # c\n  value\n\n", r"invalid YAML: a comment the reader cannot place .*; move the comment onto a line of its own"),
    ("name: x\nn: " + "1" * 5000 + "\n", r"invalid YAML value: an integer longer than 4,300 digits; quote the value"),
    ("name: x\nd: 2026-13-45\n", r"invalid YAML value: month must be in 1\.\.12; quote the value"),
    ("name: x\na: " + "[" * 400 + "]" * 400 + "\n", r"invalid YAML: nested too deeply to read; flatten the structure"),
    ("name: x\n" + "".join("  " * i + f"k{i}:\n" for i in range(400)) + "  " * 400 + "v: 1\n", r"invalid YAML: nested too deeply to read"),
], ids=["comment overlap", "huge integer", "bad timestamp", "deep flow", "deep block"])
def test_what_ruamel_raises_outside_its_error_classes_is_one_line(tmp_path, text, message):
    """ruamel.yaml 0.19.1 raised NotImplementedError, ValueError or RecursionError here: a traceback, not a line."""
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"odd\.yaml: " + message) as caught:
        clusters.load(path)
    assert len(caught.value.problems) == 1


def test_fails_when_directory_has_no_cluster_files(tmp_path):
    with pytest.raises(ConfigError, match="no cluster files"):
        clusters.load_all(tmp_path)


@pytest.mark.parametrize(("content", "message"), [
    (b"name: x\n\x01bad: 1\n", r"ctl\.yaml: invalid YAML: unacceptable character"),
    (b"name: \xff\xfe\n", r"ctl\.yaml: not UTF-8 text \(byte 6\); save the file as UTF-8"),
])
def test_fails_when_the_file_is_not_clean_text(tmp_path, content, message):
    path = tmp_path / "ctl.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        clusters.load(path)


_TOKEN = "ghp_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"  # GitHub's token shape (clusters/secrets.py SELF_IDENTIFYING)


@pytest.mark.parametrize("text", [
    f"name: x\nkey: !!int {_TOKEN}\n",  # int() echoes its input (ruamel/yaml/constructor.py:1006-1104)
    f"name: x\nkey: !!float {_TOKEN}\n",  # float() echoes it lower-cased
    f"name: x\nkey: !!timestamp {_TOKEN}\n",  # ConstructorError 'failed to construct timestamp from "..."' (:542)
    f"name: x\ntoken: {_TOKEN}\ntoken: {_TOKEN}\n",  # DuplicateKeyError names both values (:281)
    f"name: x\nk: *{_TOKEN}\n",  # ComposerError 'found undefined alias ...'
], ids=["int tag", "float tag", "timestamp tag", "duplicate key", "undefined alias"])
def test_an_unreadable_value_is_never_echoed_in_the_error(tmp_path, text):
    """The parse error is checked before the secret scan ever runs, and goes to the CLI, the API's response and
    its log: it must not carry a credential from the file, however ruamel.yaml's message spells it."""
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        clusters.load(path)
    message = str(caught.value)
    assert len(caught.value.problems) == 1, message
    assert "odd.yaml" in message
    squeezed = message.replace("_", "").lower()
    assert "abcdefghijklmnopqrstuvwxyz0123456789" not in squeezed, message


@pytest.mark.parametrize("text", ["name: x\nflag: !!bool maybe\n", "name: x\nmask: 0b_\n", "name: x\nmask: -0x_\n"],
                         ids=["bool tag", "empty binary", "empty hex"])
def test_the_constructors_key_and_index_errors_are_one_line(tmp_path, text):
    """ruamel.yaml 0.19.1 raises KeyError for a !!bool it has no word for (constructor.py:443-445) and IndexError
    for an integer that is only a base prefix and underscores (construct_yaml_int, constructor.py:1023): ValueError
    was not all it raises outside its error classes."""
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"odd\.yaml: invalid YAML value: .*; quote the value") as caught:
        clusters.load(path)
    assert len(caught.value.problems) == 1


def test_a_value_error_of_gpufleets_own_reading_is_not_called_invalid_yaml(tmp_path, monkeypatch):
    """Only what ruamel.yaml itself raises is the file's fault: a ValueError from gpufleet's own code on the way
    (clusters/yaml_fast.py here) is a bug to see as one, not a valid file refused as 'invalid YAML value'."""
    from clusters import yaml_fast

    def broken(text: str, max_nodes: int) -> None:
        raise ValueError("a bug in gpufleet")

    monkeypatch.setattr(yaml_fast, "load", broken)
    path = tmp_path / "fine.yaml"
    path.write_text("name: x\n")
    with pytest.raises(ValueError, match="a bug in gpufleet"):
        clusters.load(path)


@pytest.mark.parametrize("text", [f"name: x\nk: !custom {_TOKEN}\n", f"name: x\nk: !{_TOKEN} x\n", f"name: x\nk: [a, !custom {_TOKEN}]\n"],
                         ids=["tagged value", "tag itself", "tagged item"])
def test_a_credential_under_a_local_tag_is_found_by_the_secret_scan(tmp_path, text):
    """ruamel.yaml's round-trip loader keeps a scalar with a local tag (``!custom <value>``) as a TaggedScalar,
    not a str (ruamel/yaml/comments.py:1167): the secret scan walked past it, and the schema's error then quoted
    its repr, the token's first characters included."""
    path = tmp_path / "odd.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        clusters.load(path)
    message = str(caught.value)
    assert "looks like a credential" in message and "github-token" in message, message
    assert "AbCdEf" not in message, message
