"""The vendored ForceNew tables: pinned to the providers gpufleet synthesizes against, covering
every protected type, equal to the independent google 6.50.0 extract, and regenerable by the
checked-in script (run here on a real git repository of Go source written for the test)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from preview import regen
from preview.forcenew import TABLE_DIR, load_tables
from safety.plan_gate import DEFAULT_PROTECTED_TYPES
from tests.conftest import REPO_ROOT

REFERENCE = REPO_ROOT.parent.parent / "shared" / "data" / "forcenew-google-6.50.0.json"
VENDORED_REFERENCE = Path(__file__).parent / "data" / "forcenew-google-6.50.0.json"


def _tables() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(TABLE_DIR.glob("*.json"))}


def test_fails_when_a_pinned_provider_version_changes_and_the_table_was_not_regenerated(fleet_out):
    pinned: dict[str, str] = {}
    for path in sorted((fleet_out / "stacks").glob("*/cdk.tf.json")):
        for provider in json.loads(path.read_text())["terraform"].get("required_providers", {}).values():
            pinned[provider["source"]] = provider["version"]
    tables = {t["_meta"]["registry"]: t["_meta"]["version"] for t in _tables().values()}
    assert pinned == tables, "regenerate with `python -m preview.regen --mirror NAME=GIT_DIR` (see its docstring)"
    for name, table in _tables().items():
        assert table["_meta"]["tag"] == regen.PROVIDERS[name].tag and len(table["_meta"]["commit"]) == 40


def test_every_protected_type_and_every_synthesized_type_has_a_table(fleet_out):
    tables = load_tables()
    assert {t for t in DEFAULT_PROTECTED_TYPES if tables.rules(t) is None} == set()
    synthesized = {t for p in (fleet_out / "stacks").glob("*/cdk.tf.json") for t in json.loads(p.read_text()).get("resource", {})}
    unsupported = {t for table in _tables().values() for t in table["_meta"]["unsupported"]}
    assert {t for t in synthesized if tables.rules(t) is None} == unsupported, "a synthesized type is neither read nor explained"


def test_google_table_matches_the_independent_reference_extract():
    """The shared extract was made by a different parser; same paths, kinds and source lines.

    Differences would be explained here; there are none for the nine types it covers.
    """
    reference = json.loads(VENDORED_REFERENCE.read_text())
    assert reference["_meta"]["commit"] == json.loads((TABLE_DIR / "google.json").read_text())["_meta"]["commit"]
    ours = json.loads((TABLE_DIR / "google.json").read_text())["resources"]
    for rtype, paths in reference.items():
        if rtype.startswith("_"):
            continue
        provenance = reference["_provenance"][rtype]
        expected = {p: ("block" if provenance[p]["scope"].startswith("adding") else "attribute", provenance[p]["line"],
                        provenance[p]["computed_only"]) for p in paths}
        got = {p: (e["kind"], e["line"], e["computed_only"]) for p, e in ours[rtype].items()}
        assert got == expected, rtype


def git(repo: Path, *args: str) -> None:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com",
           "PATH": "/usr/bin:/bin:/usr/local/bin"}
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


NOMAD_PROVIDER = '''package nomad

func Provider() *schema.Provider {
	return &schema.Provider{
		DataSourcesMap: map[string]*schema.Resource{
			"nomad_node_pool": dataSourceNodePool(),
		},
		ResourcesMap: map[string]*schema.Resource{
			"nomad_node_pool": resourceNodePool(),
			"nomad_namespace": resourceNamespace(),
			"nomad_acl_policy": resourceACLPolicy(),
		},
	}
}
'''
NOMAD_POOL = '''package nomad

var (
	sharedMeta = map[string]*schema.Schema{
		"meta": {Type: schema.TypeMap, Optional: true, ForceNew: true, Elem: &schema.Schema{Type: schema.TypeString}},
	}
)

func schedulerConfig(forceNew bool) *schema.Schema {
	return &schema.Schema{
		Type:     schema.TypeList,
		Optional: true,
		ForceNew: forceNew,
		Elem: &schema.Resource{
			Schema: map[string]*schema.Schema{
				"algorithm": {Type: schema.TypeString, Optional: true, Computed: true, ForceNew: true},
				"memory":    {Type: schema.TypeInt, Optional: true},
			},
		},
	}
}

// resourceNodePool has a comment with "ForceNew: true" that must not count.
func resourceNodePool() *schema.Resource {
	return &schema.Resource{
		Create: nodePoolCreate,
		Schema: MergeSchemas(sharedMeta, map[string]*schema.Schema{
			"name": {
				Type:        schema.TypeString,
				Required:    true,
				ForceNew:    true,
				Description: `Unique name, ForceNew: false in this raw string is text`,
			},
			"description": {Type: schema.TypeString, Optional: true},
			"scheduler_config": schedulerConfig(true),
			"id_hash": {Type: schema.TypeString, Computed: true, ForceNew: true},
		}),
	}
}

func namespaceFields(generatable bool) map[string]*schema.Schema {
	s := map[string]*schema.Schema{"name": {Type: schema.TypeString, Required: true, ForceNew: true}}
	if generatable {
		s["generate_name"] = &schema.Schema{Type: schema.TypeString, Optional: true, ForceNew: true}
		s["name"].ConflictsWith = []string{"generate_name"}
	}
	if !generatable {
		s["never"] = &schema.Schema{Type: schema.TypeString, Optional: true, ForceNew: true}
	}
	return s
}

func resourceNamespace() *schema.Resource {
	return &schema.Resource{Schema: namespaceFields(true)}
}

func resourceACLPolicy() *schema.Resource {
	s := map[string]*schema.Schema{"name": {Type: schema.TypeString, Required: true}}
	s["name"].ForceNew = true
	return &schema.Resource{Schema: s}
}
'''


def test_regen_reads_go_schemas_from_a_tagged_provider_repository(tmp_path, monkeypatch):
    repo = tmp_path / "terraform-provider-nomad"
    (repo / "nomad").mkdir(parents=True)
    (repo / "nomad" / "provider.go").write_text(NOMAD_PROVIDER)
    (repo / "nomad" / "resource_node_pool.go").write_text(NOMAD_POOL)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "provider")
    git(repo, "tag", regen.PROVIDERS["nomad"].tag)
    out = tmp_path / "tables"
    assert regen.main(["--mirror", f"nomad={repo / '.git'}", "--out", str(out)]) == 1  # one type refused, loudly
    table = json.loads((out / "nomad.json").read_text())
    pool = table["resources"]["nomad_node_pool"]
    assert {p: (e["kind"], e["computed_only"]) for p, e in pool.items()} == {
        "id_hash": ("attribute", True),
        "meta": ("attribute", False),
        "name": ("attribute", False),
        "scheduler_config": ("block", False),
        "scheduler_config.algorithm": ("attribute", False),
    }
    line_of = {text: n for n, text in enumerate(NOMAD_POOL.splitlines(), 1)}
    assert pool["name"]["file"] == "nomad/resource_node_pool.go" and pool["name"]["line"] == line_of['\t\t\t"name": {']
    assert sorted(table["resources"]["nomad_namespace"]) == ["generate_name", "name"]  # an entry added under `if generatable`
    assert "mutates a schema after building it" in table["_meta"]["unsupported"]["nomad_acl_policy"]


@pytest.mark.parametrize("name", sorted(regen.PROVIDERS))
def test_each_table_names_its_provider_source(name):
    meta = json.loads((TABLE_DIR / f"{name}.json").read_text())["_meta"]
    assert meta["provider"] == regen.PROVIDERS[name].repo and meta["generated_by"] == "python -m preview.regen"
